//! Data parallelism across processes (ranks of a [`Communicator`]): what each rank trains on,
//! and the collectives that keep the ranks' models identical.
//!
//! Every rank draws the same global update from the same generator (the batches, their order,
//! word dropout: the data do not depend on the number of ranks), split into `P = size × L`
//! parts (`L`: the rank's own parts, 2 with in-process data parallelism, else 1); each part
//! gets a dropout generator forked from the run's in part order, and rank `r` trains on parts
//! `r·L .. (r+1)·L` ([`shard`]). The gradients (each rank's sum over its parts, already scaled
//! by 1 / the update's target tokens) are summed over the ranks in one all-reduce of a flat
//! buffer ([`all_reduce_grads`]), so every rank holds the gradient of the whole update and
//! makes the same Adam step; the loss sums too ([`all_reduce_stats`]). Rank 0's parameters,
//! Adam moments and trainer state are broadcast when training starts or resumes.
//!
//! The result is that of one process whose batches are split into the same `P` parts, up to
//! the order of the float sums; without dropout it does not depend on `P` at all.

use crate::dist::Communicator;
use crate::model::loss::LossStats;
use crate::model::Param;
use std::ops::Range;

/// The parts (of a batch split into at most `size × local` parts, `n_parts` of them) that
/// rank `rank` trains on: `rank·local .. (rank+1)·local`, cut to `n_parts` (empty when the
/// batch had fewer parts than ranks).
pub fn shard(n_parts: usize, rank: usize, local: usize) -> Range<usize> {
    let start = (rank * local).min(n_parts);
    start..((rank + 1) * local).min(n_parts)
}

/// The scalars all-reduced per update: every parameter's gradient (f32) plus the three loss
/// sums (f64).
// Used outside the library only (feature `internals`).
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub fn bytes_per_update(n_params: usize) -> usize {
    n_params * std::mem::size_of::<f32>() + 3 * std::mem::size_of::<f64>()
}

/// Sums every parameter's gradient over the ranks: gathered into `flat` (resized to the
/// parameter count), all-reduced in one call, scattered back.
pub fn all_reduce_grads(
    comm: &dyn Communicator,
    params: &mut [(String, &mut Param<f32>)],
    flat: &mut Vec<f32>,
) {
    flat.clear();
    for (_, p) in params.iter() {
        flat.extend_from_slice(&p.grad.data);
    }
    comm.all_reduce_sum(flat);
    scatter(flat, params.iter_mut().map(|(_, p)| &mut p.grad.data[..]));
}

/// Rank 0's parameter values on every rank (one broadcast of a flat buffer).
pub fn broadcast_values(comm: &dyn Communicator, params: &mut [(String, &mut Param<f32>)]) {
    let mut flat: Vec<f32> = params
        .iter()
        .flat_map(|(_, p)| p.value.data.iter().copied())
        .collect();
    comm.broadcast(&mut flat);
    scatter(&flat, params.iter_mut().map(|(_, p)| &mut p.value.data[..]));
}

/// Rank 0's vectors (Adam's moments) on every rank.
pub fn broadcast_vecs(comm: &dyn Communicator, vecs: &mut [Vec<f32>]) {
    let mut flat: Vec<f32> = vecs.concat();
    comm.broadcast(&mut flat);
    scatter(&flat, vecs.iter_mut().map(|v| &mut v[..]));
}

/// The loss sums over all ranks.
pub fn all_reduce_stats(comm: &dyn Communicator, stats: LossStats) -> LossStats {
    let mut sums = [stats.loss_sum, stats.nll_sum, stats.n_tokens as f64];
    comm.all_reduce_sum_f64(&mut sums);
    LossStats {
        loss_sum: sums[0],
        nll_sum: sums[1],
        n_tokens: sums[2] as usize,
    }
}

/// Copies `flat` into the slices in order (their lengths sum to `flat.len()`).
fn scatter<'a>(flat: &[f32], slices: impl Iterator<Item = &'a mut [f32]>) {
    let mut at = 0;
    for s in slices {
        s.copy_from_slice(&flat[at..at + s.len()]);
        at += s.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::local::LocalGroup;
    use crate::tensor::Tensor;
    use crate::train::data_parallel::split;

    #[test]
    fn every_part_trained_once_by_one_rank_in_order() {
        for items in 0..12usize {
            for size in 1..5 {
                for local in 1..3 {
                    let batch: Vec<usize> = (0..items).collect();
                    let parts: Vec<&[usize]> = split(&batch, size * local).collect();
                    assert!(parts.len() <= size * local);
                    // The ranks' shards, concatenated in rank order, are the whole batch.
                    let mut seen = Vec::new();
                    for rank in 0..size {
                        let mine = shard(parts.len(), rank, local);
                        assert!(mine.len() <= local);
                        for p in &parts[mine] {
                            seen.extend_from_slice(p);
                        }
                    }
                    assert_eq!(seen, batch, "{items} items, {size} ranks x {local}");
                }
            }
        }
        // 5 windows over 2 ranks x 2 halves: parts of 2, 2, 1; rank 1 gets the last one only.
        assert_eq!(shard(3, 0, 2), 0..2);
        assert_eq!(shard(3, 1, 2), 2..3);
        assert_eq!(shard(3, 2, 2), 3..3);
    }

    fn param(values: &[f32], grads: &[f32]) -> Param<f32> {
        let mut p = Param::new(Tensor::from_vec(values.to_vec(), &[values.len()]));
        p.grad.data.copy_from_slice(grads);
        p
    }

    #[test]
    fn gradients_summed_and_root_values_broadcast_over_two_ranks() {
        let results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = LocalGroup::new(2)
                .into_iter()
                .map(|comm| {
                    s.spawn(move || {
                        let r = comm.rank() as f32;
                        // Rank r: values r + [1, 2 | 3], gradients (r + 1) · [1, -1 | 0.5].
                        let mut a = param(&[1.0 + r, 2.0 + r], &[r + 1.0, -(r + 1.0)]);
                        let mut b = param(&[3.0 + r], &[0.5 * (r + 1.0)]);
                        let mut params = vec![("a".to_string(), &mut a), ("b".to_string(), &mut b)];
                        let mut flat = Vec::new();
                        all_reduce_grads(&comm, &mut params, &mut flat);
                        broadcast_values(&comm, &mut params);
                        let mut moments = vec![vec![r; 2], vec![10.0 * r + 1.0]];
                        broadcast_vecs(&comm, &mut moments);
                        let stats = all_reduce_stats(
                            &comm,
                            LossStats {
                                loss_sum: 1.5 + r as f64,
                                nll_sum: 1.0,
                                n_tokens: 7 + comm.rank(),
                            },
                        );
                        (a, b, moments, stats, flat.len())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (a, b, moments, stats, flat_len) in results {
            assert_eq!(a.grad.data, [3.0, -3.0]);
            assert_eq!(b.grad.data, [1.5]);
            assert_eq!(a.value.data, [1.0, 2.0]);
            assert_eq!(b.value.data, [3.0]);
            assert_eq!(moments, vec![vec![0.0, 0.0], vec![1.0]]);
            assert_eq!(stats.loss_sum, 4.0);
            assert_eq!(stats.nll_sum, 2.0);
            assert_eq!(stats.n_tokens, 15);
            assert_eq!(flat_len, 3);
        }
        assert_eq!(bytes_per_update(1000), 4024);
    }
}
