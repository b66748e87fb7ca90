//! Numerically stable softmax and log-softmax over rows (the max is subtracted first).

use super::reduce::{lane_max, lane_sum};
use crate::Float;
use rayon::prelude::*;

/// `x ← softmax(x)` over the first `valid` entries; entries at or past `valid` get exactly 0.
/// With `valid == 0` the whole row is 0 (a query that may attend to nothing).
pub fn softmax_inplace<T: Float>(row: &mut [T], valid: usize) {
    let valid = valid.min(row.len());
    let (live, masked) = row.split_at_mut(valid);
    masked.iter_mut().for_each(|x| *x = T::zero());
    if live.is_empty() {
        return;
    }
    let max = live.iter().fold(T::neg_infinity(), |m, &x| m.max(x));
    let mut sum = T::zero();
    for x in live.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    let inv = T::one() / sum;
    live.iter_mut().for_each(|x| *x *= inv);
}

/// `x ← log softmax(x)` over the whole row; returns the log-sum-exp that was subtracted.
/// The passes run with sixteen running maxima and sums and a vectorisable `exp`
/// ([`Float::exp_vec`]), compiled for the machine's widest vectors (`pulp`): over a
/// vocabulary-wide row this is the decoder's largest cost after the matrix products.
pub fn log_softmax_inplace<T: Float>(row: &mut [T]) -> T {
    pulp::Arch::new().dispatch(LogSoftmax(row))
}

/// The passes of [`log_softmax_inplace`]; a `WithSimd` type so that its `#[inline(always)]` body
/// is compiled into each of pulp's target-feature functions (a closure would not be).
struct LogSoftmax<'a, T>(&'a mut [T]);

impl<T: Float> pulp::WithSimd for LogSoftmax<'_, T> {
    type Output = T;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) -> T {
        let row = self.0;
        let max = lane_max(row);
        let lse = max + lane_sum(row, |x| (x - max).exp_vec()).ln();
        row.iter_mut().for_each(|x| *x -= lse);
        lse
    }
}

/// `eˣ` for f32 without a library call, so loops over it vectorise: `x = n ln 2 + r` with
/// `|r| ≤ ln 2 / 2`, `eʳ` from Cephes' degree-6 polynomial (`expf`), and `2ⁿ` written into the
/// exponent bits. `x` is clamped to `[-87.33, 88.37]` (so `n` stays a normal exponent): below,
/// the result is ~1.2e-38 instead of a subnormal or 0; above, ~2.7e38 instead of ∞. NaN stays
/// NaN. Within 2 ulp of the exact value elsewhere (tested).
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n · LN2_HI is exact for |n| ≤ 2^9
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 · 2^23: adding and subtracting it rounds to the nearest integer
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.336_55, 88.376_26);
    let n = (x * LOG2_E + ROUND) - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_1e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e_r = p * r * r + r + 1.0;
    let two_n = f32::from_bits(((n as i32 + 127) as u32) << 23);
    e_r * two_n
}

/// Backward of softmax for one row: `ds_j = p_j (dp_j − Σ_k p_k dp_k)`, written over `dp`.
pub fn softmax_backward_inplace<T: Float>(dp: &mut [T], p: &[T]) {
    let dot: T = dp.iter().zip(p).map(|(&g, &q)| g * q).sum();
    for (g, &q) in dp.iter_mut().zip(p) {
        *g = q * (*g - dot);
    }
}

/// [`log_softmax_inplace`] of every row of `x [rows, row_len]`, rows spread over the threads.
pub fn log_softmax_rows<T: Float>(x: &mut [T], row_len: usize) {
    x.par_chunks_mut(row_len).with_min_len(8).for_each(|row| {
        log_softmax_inplace(row);
    });
}

/// Label-smoothed cross-entropy of `logits [rows, vocab]` against `targets [rows]`: per row
/// `(1 − ε) · (−log p_y) + ε · mean_v(−log p_v)`, `p = softmax(z)`. Returns the sums over the
/// rows whose target is not `ignore` of that loss and of `−log p_y`, in row order. With
/// `grad_scale = s` each row becomes `s · (p − q)`, `q = (1 − ε) · onehot(y) + ε / V` (zeros for
/// an ignored row); without, the log-probabilities (an ignored row as it was).
pub fn cross_entropy_rows<T: Float>(
    logits: &mut [T],
    targets: &[u32],
    vocab: usize,
    epsilon: f64,
    grad_scale: Option<f64>,
    ignore: Option<u32>,
) -> (f64, f64) {
    assert_eq!(logits.len(), targets.len() * vocab);
    let per_row: Vec<(f64, f64)> = logits
        .par_chunks_mut(vocab)
        .zip(targets.par_iter())
        .map(|(row, &y)| {
            if Some(y) == ignore {
                if grad_scale.is_some() {
                    row.iter_mut().for_each(|v| *v = T::zero());
                }
                return (0.0, 0.0);
            }
            log_softmax_inplace(row);
            let nll = -row[y as usize].f64();
            let mean_neg_logp = -row.iter().map(|v| v.f64()).sum::<f64>() / vocab as f64;
            let loss = (1.0 - epsilon) * nll + epsilon * mean_neg_logp;
            if let Some(s) = grad_scale {
                let smooth = T::of(epsilon / vocab as f64);
                let scale = T::of(s);
                for v in row.iter_mut() {
                    *v = (v.exp() - smooth) * scale;
                }
                row[y as usize] -= T::of((1.0 - epsilon) * s);
            }
            (loss, nll)
        })
        .collect();
    let (mut loss_sum, mut nll_sum) = (0.0, 0.0);
    for (loss, nll) in per_row {
        loss_sum += loss;
        nll_sum += nll;
    }
    (loss_sum, nll_sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `exp_f32` against the exact exponential on a dense grid and at the clamps.
    #[test]
    fn exp_f32_is_within_two_ulp() {
        let mut worst = 0.0f64;
        for i in 0..=200_000 {
            let x = -87.0 + 175.0 * i as f64 / 200_000.0;
            let got = exp_f32(x as f32) as f64;
            let want = (x as f32 as f64).exp();
            let ulp = (want as f32).abs() as f64 * f32::EPSILON as f64;
            worst = worst.max((got - want).abs() / ulp);
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert_eq!(exp_f32(0.0), 1.0);
        assert!(exp_f32(-1000.0) > 0.0 && exp_f32(-1000.0) < 1.3e-38);
        assert!(exp_f32(1000.0).is_finite() && exp_f32(1000.0) > 2.0e38);
        assert!(exp_f32(f32::NAN).is_nan());
    }

    /// The f32 log-softmax (vector passes, `exp_f32`) against f64 on rows of every length
    /// around the lane width, and a row with a NaN stays NaN.
    #[test]
    fn log_softmax_f32_matches_f64() {
        for len in [1, 2, 15, 16, 17, 33, 4000] {
            let row: Vec<f64> = (0..len)
                .map(|i| ((i * 7919) % 1000) as f64 / 50.0 - 10.0)
                .collect();
            let mut want = row.clone();
            let lse64 = log_softmax_inplace(&mut want);
            let mut got: Vec<f32> = row.iter().map(|&x| x as f32).collect();
            let lse32 = log_softmax_inplace(&mut got);
            assert!(
                (lse32 as f64 - lse64).abs() < 1e-5,
                "{len}: {lse32} vs {lse64}"
            );
            for (g, w) in got.iter().zip(&want) {
                assert!((*g as f64 - w).abs() < 1e-5, "{len}: {g} vs {w}");
            }
        }
        let mut nan = vec![0.0f32, f32::NAN, 1.0];
        assert!(log_softmax_inplace(&mut nan).is_nan());
    }

    #[test]
    fn softmax_is_stable_and_masks_exactly() {
        let mut row = vec![1000.0f32, 1001.0, 999.0, 5.0];
        softmax_inplace(&mut row, 3);
        assert_eq!(row[3], 0.0);
        let e = [(-1.0f64).exp(), 1.0, (-2.0f64).exp()];
        let s: f64 = e.iter().sum();
        for i in 0..3 {
            assert!((row[i] as f64 - e[i] / s).abs() < 1e-6);
        }
        let mut lrow = vec![1000.0f64, 1001.0, 999.0];
        let lse = log_softmax_inplace(&mut lrow);
        assert!((lse - (1001.0 + s.ln())).abs() < 1e-9);
        assert!((lrow[1] - (-s.ln())).abs() < 1e-12);
        let mut none = vec![3.0f64; 2];
        softmax_inplace(&mut none, 0);
        assert_eq!(none, vec![0.0, 0.0]);
    }
}
