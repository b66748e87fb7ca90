//! Ranks as threads of one process: a [`LocalGroup`] of N members, each a [`Communicator`]
//! for one thread, meeting at a barrier. Used to test the distributed trainer (sharding,
//! broadcasts, gradient all-reduce) in `cargo test`, where no MPI library is needed.
//!
//! Every collective is two phases around a barrier: each rank puts its buffer in its slot,
//! waits for all, reads the slots (a sum in rank order, so the result is the same on every
//! rank and from run to run), and waits again before a slot may be reused.

use crate::dist::Communicator;
use std::sync::{Arc, Barrier, Mutex};

/// What the members share.
struct Shared {
    barrier: Barrier,
    /// Each rank's contribution to the current collective, as f64 (f32 and f64 sums are
    /// accumulated in f64 and rounded once; bytes are stored one per value).
    slots: Vec<Mutex<Vec<f64>>>,
}

/// One rank of a group of threads.
#[derive(Clone)]
pub struct LocalGroup {
    rank: usize,
    shared: Arc<Shared>,
}

impl LocalGroup {
    /// The `n` members (rank 0 first) of a new group; hand one to each thread.
    pub fn new(n: usize) -> Vec<LocalGroup> {
        let n = n.max(1);
        let shared = Arc::new(Shared {
            barrier: Barrier::new(n),
            slots: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
        });
        (0..n)
            .map(|rank| LocalGroup {
                rank,
                shared: shared.clone(),
            })
            .collect()
    }

    fn slot(&self, rank: usize) -> std::sync::MutexGuard<'_, Vec<f64>> {
        // A poisoned slot means another rank panicked: the test fails anyway.
        self.shared.slots[rank]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Puts `values` in this rank's slot, waits for all, calls `read` with every slot (rank
    /// order), waits again.
    fn exchange(&self, values: Vec<f64>, read: impl FnOnce(&[Vec<f64>])) {
        *self.slot(self.rank) = values;
        self.shared.barrier.wait();
        let all: Vec<Vec<f64>> = (0..self.shared.slots.len())
            .map(|r| self.slot(r).clone())
            .collect();
        read(&all);
        self.shared.barrier.wait();
    }

    /// Σ over ranks of each element, in rank order.
    fn sum(&self, values: Vec<f64>) -> Vec<f64> {
        let mut out = vec![0.0; values.len()];
        self.exchange(values, |all| {
            for slot in all {
                out.iter_mut().zip(slot).for_each(|(o, x)| *o += x);
            }
        });
        out
    }

    /// Rank 0's values.
    fn root_values(&self, values: Vec<f64>) -> Vec<f64> {
        let mut out = Vec::new();
        self.exchange(values, |all| out = all[0].clone());
        out
    }
}

impl Communicator for LocalGroup {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.shared.slots.len()
    }
    fn all_reduce_sum(&self, buf: &mut [f32]) {
        let sum = self.sum(buf.iter().map(|&x| x as f64).collect());
        buf.iter_mut().zip(sum).for_each(|(b, s)| *b = s as f32);
    }
    fn all_reduce_sum_f64(&self, buf: &mut [f64]) {
        let sum = self.sum(buf.to_vec());
        buf.copy_from_slice(&sum);
    }
    fn broadcast(&self, buf: &mut [f32]) {
        let root = self.root_values(buf.iter().map(|&x| x as f64).collect());
        buf.iter_mut().zip(root).for_each(|(b, r)| *b = r as f32);
    }
    fn broadcast_bytes(&self, buf: &mut [u8]) {
        let root = self.root_values(buf.iter().map(|&x| x as f64).collect());
        buf.iter_mut().zip(root).for_each(|(b, r)| *b = r as u8);
    }
    fn barrier(&self) {
        self.shared.barrier.wait();
    }
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::{all_ok, broadcast_vec};

    /// Runs `f(rank's communicator)` on one thread per rank; the results in rank order.
    fn on_ranks<R: Send>(n: usize, f: impl Fn(LocalGroup) -> R + Sync) -> Vec<R> {
        std::thread::scope(|s| {
            let handles: Vec<_> = LocalGroup::new(n)
                .into_iter()
                .map(|c| s.spawn(|| f(c)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn sums_broadcasts_and_agreement_over_three_ranks() {
        let results = on_ranks(3, |c| {
            let r = c.rank() as f32;
            // Rank r holds [r, 10 r, 0.5]: the sums are [0+1+2, 0+10+20, 1.5].
            let mut x = [r, 10.0 * r, 0.5];
            c.all_reduce_sum(&mut x);
            let mut y = [c.rank() as f64 * 0.25];
            c.all_reduce_sum_f64(&mut y);
            // Rank 0's values reach everyone; the others' are overwritten.
            let mut b = [100.0 + r, -r];
            c.broadcast(&mut b);
            let mut bytes = vec![c.rank() as u8; 1 + c.rank()];
            if c.rank() == 0 {
                bytes = b"from rank 0".to_vec();
            }
            broadcast_vec(&c, &mut bytes);
            c.barrier();
            let everyone = all_ok(&c, true);
            let one_fails = all_ok(&c, c.rank() != 2);
            (c.size(), x, y, b, bytes, everyone, one_fails)
        });
        for (size, x, y, b, bytes, everyone, one_fails) in results {
            assert_eq!(size, 3);
            assert_eq!(x, [3.0, 30.0, 1.5]);
            assert_eq!(y, [0.75]);
            assert_eq!(b, [100.0, 0.0]);
            assert_eq!(bytes, b"from rank 0");
            assert!(everyone);
            assert!(!one_fails);
        }
    }
}
