//! Inverted dropout: keep each element with probability 1 − p and scale kept ones by 1/(1 − p),
//! so the expectation is unchanged and evaluation needs no rescaling.

use crate::rng::Rng;
use crate::Float;

/// A mask of `n` factors, each 0 (dropped) or 1/(1 − p) (kept), drawn from `rng` in order, so
/// one seed gives one mask. Returns `None` when `p == 0` (nothing to drop, nothing to save).
pub fn dropout_mask<T: Float>(rng: &mut Rng, n: usize, p: f64) -> Option<Vec<T>> {
    if p <= 0.0 {
        return None;
    }
    assert!(p < 1.0, "dropout probability {p} must be below 1");
    let keep = T::of(1.0 / (1.0 - p));
    // Compare 24 random bits against the threshold: exact for the probabilities people use.
    let threshold = (p * (1u64 << 24) as f64).round() as u64;
    let mut mask = Vec::with_capacity(n);
    let mut bits = 0u64;
    for i in 0..n {
        if i % 2 == 0 {
            bits = rng.next_u64();
        }
        let draw = (bits >> (32 * (i % 2))) & 0xFF_FFFF;
        mask.push(if draw < threshold { T::zero() } else { keep });
    }
    Some(mask)
}

/// A generator of its own for a sublayer's inner dropout (attention weights, FFN activations),
/// forked from the run's `rng` only when there is something to drop, so a model without inner
/// dropout draws exactly the masks it drew before the option existed.
pub fn fork_for(rng: Option<&mut Rng>, p: f64) -> Option<Rng> {
    rng.filter(|_| p > 0.0).map(|r| r.fork())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_about_p_and_scales_kept() {
        let mut rng = Rng::new(3);
        let m: Vec<f64> = dropout_mask(&mut rng, 100_000, 0.1).unwrap();
        let dropped = m.iter().filter(|&&x| x == 0.0).count();
        assert!((9_000..11_000).contains(&dropped), "{dropped}");
        assert!(m.iter().all(|&x| x == 0.0 || (x - 1.0 / 0.9).abs() < 1e-15));
        assert!(dropout_mask::<f32>(&mut rng, 10, 0.0).is_none());
    }
}
