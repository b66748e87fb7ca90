//! Inverted dropout: keep each element with probability 1 − p and scale kept ones by 1/(1 − p),
//! so the expectation is unchanged and evaluation needs no rescaling.

use rayon::prelude::*;

use crate::rng::Rng;
use crate::Float;

/// Elements per block of a mask: each block draws from its own generator, so blocks fill in
/// parallel and the mask does not depend on the number of threads.
const MASK_BLOCK: usize = 1 << 13;

/// A mask of `n` factors, each 0 (dropped) or 1/(1 − p) (kept). It takes one 64-bit draw from
/// `rng`, from which block `b` of `MASK_BLOCK` (8,192) elements seeds a generator of its own, so one
/// seed gives one mask whatever the thread count. Returns `None` when `p == 0` (nothing to drop,
/// nothing to save).
pub fn dropout_mask<T: Float>(rng: &mut Rng, n: usize, p: f64) -> Option<Vec<T>> {
    if p <= 0.0 {
        return None;
    }
    assert!(p < 1.0, "dropout probability {p} must be below 1");
    let keep = T::of(1.0 / (1.0 - p));
    // Compare 24 random bits against the threshold: exact for the probabilities people use.
    let threshold = (p * (1u64 << 24) as f64).round() as u64;
    let mask_seed = rng.next_u64();
    let fill_block = |(b, block): (usize, &mut [T])| {
        // Golden-ratio multiples spread the block indices over the seed space; `Rng::new`
        // expands each seed through SplitMix64, so neighbouring blocks get unrelated streams.
        let mut stream = Rng::new(mask_seed ^ (b as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        for pair in block.chunks_mut(2) {
            let bits = stream.next_u64();
            for (half, m) in pair.iter_mut().enumerate() {
                let draw = (bits >> (32 * half)) & 0xFF_FFFF;
                *m = if draw < threshold { T::zero() } else { keep };
            }
        }
    };
    let mut mask = vec![T::zero(); n];
    if n <= MASK_BLOCK {
        mask.chunks_mut(MASK_BLOCK).enumerate().for_each(fill_block);
    } else {
        mask.par_chunks_mut(MASK_BLOCK)
            .enumerate()
            .for_each(fill_block);
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

    #[test]
    fn blocks_draw_independent_streams_and_one_seed_gives_one_mask() {
        let n = 5 * MASK_BLOCK + 123;
        let a: Vec<f32> = dropout_mask(&mut Rng::new(11), n, 0.3).unwrap();
        let b: Vec<f32> = dropout_mask(&mut Rng::new(11), n, 0.3).unwrap();
        assert_eq!(a, b);
        let blocks: Vec<&[f32]> = a.chunks_exact(MASK_BLOCK).collect();
        for (i, block) in blocks.iter().enumerate() {
            let dropped = block.iter().filter(|&&x| x == 0.0).count() as f64;
            let rate = dropped / MASK_BLOCK as f64;
            // 3.5 standard deviations of a binomial rate over a block are 0.018.
            assert!((rate - 0.3).abs() < 0.02, "block {i}: {rate}");
            for other in &blocks[..i] {
                let same = block
                    .iter()
                    .zip(other.iter())
                    .filter(|(x, y)| x == y)
                    .count();
                // Independent blocks agree where both keep or both drop: 0.7² + 0.3² = 58%.
                let agree = same as f64 / MASK_BLOCK as f64;
                assert!(
                    (agree - 0.58).abs() < 0.03,
                    "blocks {i} and another agree {agree}"
                );
            }
        }
        // Serial (small) masks come from the same block rule as parallel ones.
        let small: Vec<f32> = dropout_mask(&mut Rng::new(11), 100, 0.3).unwrap();
        assert_eq!(small[..], a[..100]);
    }
}
