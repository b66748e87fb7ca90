//! Data parallelism over two threads: each batch is split in two halves by sentence pairs; the
//! model and a replica of it run forward and backward on one half each, at the same time, with
//! single-threaded matrix products; the replica's gradients are added to the model's before the
//! update, and the updated weights are copied into the replica after it.
//!
//! Why: gemm's own threads scale poorly at a small model's shapes (1.65x on two cores for the
//! De-En model, whose products are ~1,000 x 256 x 256), while two independent halves scale
//! almost perfectly. The sum over the batch is the same sum taken in two parts, so the result
//! differs from one whole-batch pass only by rounding (and by the dropout masks drawn), and it
//! does not depend on the timing of the threads. The price: one more copy of the parameters
//! and their gradients in memory, two passes over them per update, and twice gemm's packing of
//! the weights per token (each half's products pack a whole weight for half the rows). On the
//! De-En model that is small and the step gains 10%; on the base model at 1,024 tokens, where
//! gemm's own threads already scale 1.8x, it eats most of the gain (+2-4%).

use crate::batch::Batch;
use crate::kernels::activations::add_inplace;
use crate::kernels::matmul::serial_matmuls;
use crate::model::{Param, Seq2Seq};
use crate::rng::Rng;
use crate::train::loss::LossStats;
use rayon::prelude::*;

/// The replica (when on) that trains on the second half of every batch.
pub struct DataParallel {
    replica: Option<Seq2Seq<f32>>,
}

impl DataParallel {
    /// On: a replica of `model` (same weights, zero gradients). Off: one pass per batch.
    pub fn new(model: &Seq2Seq<f32>, on: bool) -> Self {
        let replica = on.then(|| {
            let mut replica = model.clone();
            replica.zero_grads();
            replica
        });
        DataParallel { replica }
    }

    /// On when the thread pool has more than one thread.
    pub fn for_pool(model: &Seq2Seq<f32>) -> Self {
        Self::new(model, rayon::current_num_threads() > 1)
    }

    /// Into how many parts each batch should be split: 2 when on, else 1.
    pub fn parts(&self) -> usize {
        if self.replica.is_some() {
            2
        } else {
            1
        }
    }

    /// Forward and backward over the parts of one batch (as split by [`parts`](Self::parts)),
    /// gradients scaled by `grad_scale` and summed into `model` (and the replica). Two parts
    /// run concurrently, each with dropout drawn from a generator forked from `rng`; otherwise
    /// the parts run one after the other on the model, drawing from `rng` itself.
    pub fn forward_backward(
        &mut self,
        model: &mut Seq2Seq<f32>,
        parts: &[Batch],
        label_smoothing: f64,
        grad_scale: f64,
        rng: &mut Rng,
    ) -> LossStats {
        let mut stats = LossStats::default();
        match (parts, self.replica.as_mut()) {
            ([first, second], Some(replica)) => {
                let (mut rng_first, mut rng_second) = (rng.fork(), rng.fork());
                let (a, b) = rayon::join(
                    || {
                        serial_matmuls(|| {
                            let rng = Some(&mut rng_first);
                            model.forward_backward(first, label_smoothing, grad_scale, rng)
                        })
                    },
                    || {
                        serial_matmuls(|| {
                            let rng = Some(&mut rng_second);
                            replica.forward_backward(second, label_smoothing, grad_scale, rng)
                        })
                    },
                );
                stats.add(a);
                stats.add(b);
            }
            _ => {
                for batch in parts {
                    let s = model.forward_backward(batch, label_smoothing, grad_scale, Some(rng));
                    stats.add(s);
                }
            }
        }
        stats
    }

    /// Adds the replica's gradients to the model's (in parameter order) and zeroes the
    /// replica's: call before the update.
    pub fn gather_grads(&mut self, model: &mut Seq2Seq<f32>) {
        self.for_each_pair(model, |mine, other| {
            add_inplace(&mut mine.grad.data, &other.grad.data);
            other.grad.fill_zero();
        });
    }

    /// Copies the model's weights into the replica: call after the update.
    pub fn sync_weights(&mut self, model: &mut Seq2Seq<f32>) {
        self.for_each_pair(model, |mine, other| {
            other.value.data.copy_from_slice(&mine.value.data);
        });
    }

    /// Calls `f(model's, replica's)` for each pair of matching parameters, pairs in parallel
    /// (nothing when off).
    fn for_each_pair(
        &mut self,
        model: &mut Seq2Seq<f32>,
        f: impl Fn(&mut Param<f32>, &mut Param<f32>) + Sync,
    ) {
        if let Some(replica) = self.replica.as_mut() {
            let mut theirs = replica.params_mut();
            model
                .params_mut()
                .par_iter_mut()
                .zip(theirs.par_iter_mut())
                .for_each(|((_, mine), (_, other))| f(mine, other));
        }
    }
}

/// `items` in `parts` consecutive chunks of (nearly) equal length; fewer when there are fewer
/// items than parts.
pub fn split<T>(items: &[T], parts: usize) -> impl Iterator<Item = &[T]> {
    items.chunks(items.len().div_ceil(parts.max(1)).max(1))
}
