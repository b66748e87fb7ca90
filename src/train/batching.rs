//! Batches built by token count.
//!
//! As in the paper (section 5.1), sentence pairs are "batched together by approximate sequence
//! length": examples are sorted by length and cut greedily into batches under a token budget, so
//! little padding is wasted. [`BatchOrder`] then visits those batches in a seeded order that
//! changes every epoch and that resumes exactly from a checkpoint.

use serde::{Deserialize, Serialize};

use crate::rng::Rng;

/// Groups examples of similar length into batches of at most `tokens_per_batch` tokens.
///
/// `lengths[i]` is (source tokens, target tokens) of example `i`, each counting the EOS that
/// side gets (the lengths of [`crate::batch::Batch`]'s `src_lens` and `tgt_lens`).
///
/// The budget counts padded source tokens plus padded target tokens: a batch of `b` examples
/// whose longest source is `S` and longest target is `T` costs `b * (S + T)`, and stays
/// `<= tokens_per_batch`. (The paper's batches of about 25000 source and 25000 target tokens
/// correspond to `tokens_per_batch = 50000`.) An example that alone exceeds the budget forms a
/// batch of its own; no example is ever dropped.
///
/// Indices are sorted by `(max(src, tgt), src, tgt, index)`, so the result is deterministic.
/// Returns the example indices of each batch, shortest batches first; every index in
/// `0..lengths.len()` appears exactly once.
pub fn batch_by_tokens(lengths: &[(usize, usize)], tokens_per_batch: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&index| {
        let (source, target) = lengths[index];
        (source.max(target), source, target, index)
    });
    let mut batches = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let (mut longest_source, mut longest_target) = (0usize, 0usize);
    for index in order {
        let (source, target) = lengths[index];
        let grown_source = longest_source.max(source);
        let grown_target = longest_target.max(target);
        let grown_cost =
            (current.len() + 1).saturating_mul(grown_source.saturating_add(grown_target));
        if !current.is_empty() && grown_cost > tokens_per_batch {
            batches.push(std::mem::take(&mut current));
            longest_source = source;
            longest_target = target;
        } else {
            longest_source = grown_source;
            longest_target = grown_target;
        }
        current.push(index);
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

/// Where training stands in its walk over the batches: saved in checkpoints so that a resumed
/// run visits the same batches in the same order.
///
/// Epoch `e` visits the batches in a permutation drawn from `seed` and `e` (a new shuffle every
/// epoch, the same one every time for the same seed and epoch); `position` is how many batches
/// of the current epoch have been handed out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchOrder {
    /// Seed of the run.
    pub seed: u64,
    /// Current epoch, from 0.
    pub epoch: u64,
    /// Batches of the current epoch already handed out.
    pub position: usize,
}

impl BatchOrder {
    /// The start of training: epoch 0, position 0.
    pub fn new(seed: u64) -> BatchOrder {
        BatchOrder {
            seed,
            epoch: 0,
            position: 0,
        }
    }

    /// The current epoch's visiting order: a permutation of `0..n_batches`, shuffled by
    /// `Rng::new(seed ^ epoch * 0x9E37_79B9_7F4A_7C15)` (wrapping multiplication).
    pub fn order(&self, n_batches: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..n_batches).collect();
        let mut rng = Rng::new(self.seed ^ self.epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        rng.shuffle(&mut order);
        order
    }

    /// Hands out the next batch index and advances.
    ///
    /// Returns `(batch index, epoch finished)`: the flag is true when the returned batch was the
    /// last of its epoch, in which case the order has moved on to the start of the next epoch.
    /// A `position` at or past `n_batches` (say, a checkpoint resumed on a smaller corpus)
    /// starts the next epoch first. This recomputes the epoch's permutation, O(`n_batches`),
    /// which is negligible next to a training step.
    ///
    /// # Panics
    ///
    /// If `n_batches` is 0: there is nothing to hand out (corpus readers reject empty corpora).
    pub fn next(&mut self, n_batches: usize) -> (usize, bool) {
        assert!(n_batches > 0, "BatchOrder::next with no batches");
        if self.position >= n_batches {
            self.epoch += 1;
            self.position = 0;
        }
        let batch = self.order(n_batches)[self.position];
        self.position += 1;
        let epoch_finished = self.position == n_batches;
        if epoch_finished {
            self.epoch += 1;
            self.position = 0;
        }
        (batch, epoch_finished)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Example lengths that vary: 1..=40 source tokens and a different pattern for targets.
    fn varied_lengths(n: usize) -> Vec<(usize, usize)> {
        let mut rng = Rng::new(3);
        (0..n)
            .map(|_| (1 + rng.below(40), 1 + rng.below(45)))
            .collect()
    }

    fn batch_cost(lengths: &[(usize, usize)], batch: &[usize]) -> usize {
        let longest_source = batch.iter().map(|&i| lengths[i].0).max().unwrap();
        let longest_target = batch.iter().map(|&i| lengths[i].1).max().unwrap();
        batch.len() * (longest_source + longest_target)
    }

    #[test]
    fn every_example_once_and_budget_respected() {
        let mut lengths = varied_lengths(500);
        lengths.push((300, 10)); // alone over the budget
        lengths.push((5, 250)); // alone over the budget
        let budget = 200;
        let batches = batch_by_tokens(&lengths, budget);
        let mut seen: Vec<usize> = batches.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..lengths.len()).collect::<Vec<_>>());
        for batch in &batches {
            assert!(!batch.is_empty());
            let cost = batch_cost(&lengths, batch);
            assert!(cost <= budget || batch.len() == 1, "{batch:?} costs {cost}");
        }
        let singletons: Vec<&Vec<usize>> = batches.iter().filter(|b| b.contains(&500)).collect();
        assert_eq!(singletons, vec![&vec![500]]);
        assert!(batches.contains(&vec![501]));
        // Length grouping: batches are full, not one example each.
        assert!(
            batches.len() < lengths.len() / 2,
            "{} batches",
            batches.len()
        );
    }

    #[test]
    fn known_small_case_and_degenerate_inputs() {
        // Sorted by (max, src, tgt, index): 3 (1,1), 1 (2,2), 0 (3,2), 2 (2,4).
        let lengths = [(3, 2), (2, 2), (2, 4), (1, 1)];
        assert_eq!(
            batch_by_tokens(&lengths, 10),
            vec![vec![3, 1], vec![0], vec![2]]
        );
        assert_eq!(batch_by_tokens(&lengths, 100), vec![vec![3, 1, 0, 2]]);
        assert_eq!(batch_by_tokens(&lengths, 0).len(), 4);
        assert!(batch_by_tokens(&[], 100).is_empty());
    }

    #[test]
    fn deterministic() {
        let lengths = varied_lengths(300);
        assert_eq!(
            batch_by_tokens(&lengths, 150),
            batch_by_tokens(&lengths, 150)
        );
        let order = BatchOrder::new(11);
        assert_eq!(order.order(50), order.order(50));
        assert_ne!(BatchOrder::new(12).order(50), order.order(50));
    }

    #[test]
    fn each_epoch_is_a_new_permutation() {
        let n_batches = 40;
        let mut order = BatchOrder::new(5);
        let mut epochs = Vec::new();
        for _ in 0..3 {
            let mut visited = Vec::new();
            for step in 0..n_batches {
                let (batch, finished) = order.next(n_batches);
                visited.push(batch);
                assert_eq!(finished, step == n_batches - 1);
            }
            let mut sorted = visited.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n_batches).collect::<Vec<_>>());
            epochs.push(visited);
        }
        assert_eq!(
            order,
            BatchOrder {
                seed: 5,
                epoch: 3,
                position: 0
            }
        );
        assert_ne!(epochs[0], epochs[1]);
        assert_ne!(epochs[1], epochs[2]);
        assert_eq!(
            epochs[1],
            BatchOrder {
                seed: 5,
                epoch: 1,
                position: 0
            }
            .order(n_batches)
        );
    }

    #[test]
    fn resuming_from_a_saved_order_continues_identically() {
        let n_batches = 17;
        let mut original = BatchOrder::new(9);
        for _ in 0..30 {
            original.next(n_batches);
        }
        let json = serde_json::to_string(&original).unwrap();
        let mut resumed: BatchOrder = serde_json::from_str(&json).unwrap();
        let mut cloned = original.clone();
        for _ in 0..50 {
            let expected = original.next(n_batches);
            assert_eq!(resumed.next(n_batches), expected);
            assert_eq!(cloned.next(n_batches), expected);
        }
        // A position past the end (smaller corpus on resume) starts the next epoch.
        let mut stale = BatchOrder {
            seed: 9,
            epoch: 2,
            position: 99,
        };
        let first = stale.next(n_batches).0;
        assert_eq!(
            first,
            BatchOrder {
                seed: 9,
                epoch: 3,
                position: 0
            }
            .order(n_batches)[0]
        );
        assert_eq!((stale.epoch, stale.position), (3, 1));
    }
}
