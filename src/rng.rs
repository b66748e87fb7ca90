//! The one seeded generator of a run: initialisation, dropout masks and shuffling all draw from
//! it, and its state is saved in checkpoints so a resumed run continues the same stream.

use rand_xoshiro::rand_core::{Rng as _, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use serde::{Deserialize, Serialize};

/// A seeded pseudo-random generator (xoshiro256++) whose state serialises.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rng {
    inner: Xoshiro256PlusPlus,
}

impl Rng {
    /// A generator fully determined by `seed`.
    pub fn new(seed: u64) -> Self {
        Rng {
            inner: Xoshiro256PlusPlus::seed_from_u64(seed),
        }
    }

    /// Whether the generator is stuck at zero (xoshiro's one invalid state, all words zero,
    /// which only a damaged checkpoint can hold): it would draw 0 forever.
    pub fn is_degenerate(&self) -> bool {
        let mut probe = self.clone();
        (0..4).all(|_| probe.next_u64() == 0)
    }

    /// 64 uniformly random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }

    /// Uniform in [0, 1) with 53 bits of precision.
    #[inline]
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [lo, hi).
    pub fn uniform_range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }

    /// Uniform integer in [0, n); `n` must be positive.
    pub fn below(&mut self, n: usize) -> usize {
        assert!(n > 0, "Rng::below(0)");
        // Multiply-shift (Lemire); bias is below 2^-64 * n, irrelevant here.
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    /// A standard normal sample (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform(); // (0, 1]
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<X>(&mut self, items: &mut [X]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }

    /// A new independent generator derived from this one (advances this one).
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next_u64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_state_round_trips() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..10 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let json = serde_json::to_string(&a).unwrap();
        let mut c: Rng = serde_json::from_str(&json).unwrap();
        assert_eq!(a.next_u64(), c.next_u64());
        assert_ne!(Rng::new(8).next_u64(), Rng::new(7).next_u64());
    }

    #[test]
    fn uniform_is_in_range_with_mean_one_half() {
        let mut r = Rng::new(1);
        let n = 100_000;
        let mut sum = 0.0;
        for _ in 0..n {
            let u = r.uniform();
            assert!((0.0..1.0).contains(&u));
            sum += u;
        }
        assert!((sum / n as f64 - 0.5).abs() < 0.01);
        let mut counts = [0usize; 3];
        for _ in 0..30_000 {
            counts[r.below(3)] += 1;
        }
        assert!(counts.iter().all(|&c| (9_000..11_000).contains(&c)));
    }
}
