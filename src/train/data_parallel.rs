//! Data parallelism over two threads: each batch is split in two halves (by sentence pairs for
//! the encoder-decoder, by windows for the language model); the model and a replica of it run
//! forward and backward on one half each, at the same time, with single-threaded matrix
//! products; the replica's gradients are added to the model's before the update, and the
//! model's weights are copied into the replica before the next step's passes.
//!
//! Why: gemm's own threads scale poorly at a small model's shapes (1.65x on two cores for the
//! De-En model, whose products are ~1,000 x 256 x 256), while two independent halves scale
//! almost perfectly. The sum over the batch is the same sum taken in two parts, so the result
//! differs from one whole-batch pass only by rounding (and by the dropout masks drawn), and it
//! does not depend on the timing of the threads. The price: one more copy of the parameters
//! and their gradients in memory, two passes over them per update, and twice gemm's packing of
//! the weights per token (each half's products pack a whole weight for half the rows). On the
//! De-En model that is small and the step gains 10%; on the base model at 1,024 tokens, where
//! gemm's own threads already scale 1.8x, it eats most of the gain (+2-4%). The README's
//! language model (2,048 tokens per step) runs as fast either way; with 512 tokens per step
//! it gains 3-20%.

use crate::kernels::activations::add_inplace;
use crate::kernels::matmul::serial_matmuls;
use crate::model::loss::LossStats;
use crate::model::Param;
use crate::rng::Rng;
use crate::train::model::Trainable;
use rayon::prelude::*;

/// The replica (when on) that trains on the second half of every batch.
pub struct DataParallel<M> {
    replica: Option<M>,
}

impl<M: Trainable> DataParallel<M> {
    /// On: a replica of `model` (same weights, zero gradients). Off: one pass per batch.
    pub fn new(model: &M, on: bool) -> Self {
        let replica = on.then(|| {
            let mut replica = model.clone();
            replica.zero_grads();
            replica
        });
        DataParallel { replica }
    }

    /// On when the thread pool has more than one thread.
    pub fn for_pool(model: &M) -> Self {
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

    /// `pass(model, part, rng)` (forward and backward of one part, gradients summed into the
    /// model it is given) over the parts of one batch, as split by [`parts`](Self::parts); the
    /// statistics summed. Two parts run concurrently, the first on `model` and the second on the
    /// replica, each with single-threaded products and dropout drawn from a generator forked
    /// from `rng`; otherwise the parts run one after the other on `model`, drawing from `rng`.
    pub fn run<P: Sync>(
        &mut self,
        model: &mut M,
        parts: &[P],
        rng: &mut Rng,
        pass: impl Fn(&mut M, &P, &mut Rng) -> LossStats + Sync,
    ) -> LossStats {
        match (parts, self.replica.is_some()) {
            ([_, _], true) => {
                let mut rngs = [rng.fork(), rng.fork()];
                self.run_forked(model, parts, &mut rngs, pass)
            }
            _ => {
                let mut stats = LossStats::default();
                for part in parts {
                    stats.add(pass(model, part, rng));
                }
                stats
            }
        }
    }

    /// `pass` over `parts` (at most two), each part drawing its dropout from its own generator
    /// in `rngs` (as many as parts): two parts run concurrently on the model and the replica
    /// when on, otherwise the parts run one after the other on `model`. Used by distributed
    /// training, where the forks are drawn for the parts of every rank.
    pub fn run_forked<P: Sync>(
        &mut self,
        model: &mut M,
        parts: &[P],
        rngs: &mut [Rng],
        pass: impl Fn(&mut M, &P, &mut Rng) -> LossStats + Sync,
    ) -> LossStats {
        let mut stats = LossStats::default();
        match (parts, rngs, self.replica.as_mut()) {
            ([first, second], [rng_first, rng_second], Some(replica)) => {
                let (a, b) = rayon::join(
                    || serial_matmuls(|| pass(model, first, rng_first)),
                    || serial_matmuls(|| pass(replica, second, rng_second)),
                );
                stats.add(a);
                stats.add(b);
            }
            (parts, rngs, _) => {
                for (part, rng) in parts.iter().zip(rngs) {
                    stats.add(pass(model, part, rng));
                }
            }
        }
        stats
    }

    /// Forward and backward of the model over the parts of one batch (see [`run`](Self::run)),
    /// gradients scaled by `grad_scale`; the loss sums over all parts.
    pub fn forward_backward(
        &mut self,
        model: &mut M,
        parts: &[M::Part],
        label_smoothing: f64,
        grad_scale: f64,
        rng: &mut Rng,
    ) -> LossStats {
        self.run(model, parts, rng, |m, part, rng| {
            m.forward_backward(part, label_smoothing, grad_scale, rng)
        })
    }

    /// Adds the replica's gradients to the model's (in parameter order) and zeroes the
    /// replica's: call before the update.
    pub fn gather_grads(&mut self, model: &mut M) {
        self.for_each_pair(model, |mine, other| {
            add_inplace(&mut mine.grad.data, &other.grad.data);
            other.grad.fill_zero();
        });
    }

    /// Calls `f` on the replica (nothing when off).
    pub fn for_replica(&mut self, f: impl FnOnce(&mut M)) {
        if let Some(r) = self.replica.as_mut() {
            f(r);
        }
    }

    /// Copies the model's weights into the replica: call before a step's passes.
    pub fn sync_weights(&mut self, model: &mut M) {
        self.for_each_pair(model, |mine, other| {
            other.value.data.copy_from_slice(&mine.value.data);
        });
    }

    /// Calls `f(model's, replica's)` for each pair of matching parameters, pairs in parallel
    /// (nothing when off).
    fn for_each_pair(
        &mut self,
        model: &mut M,
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
