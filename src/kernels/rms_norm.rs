//! Root-mean-square layer normalisation (Zhang & Sennrich 2019), as in Llama-family decoders:
//! `y = x / √(mean(x²) + ε) ⊙ g` per row of the last dimension, with no mean subtraction and no
//! bias.

use super::reduce::{add_column_sums_with, lane_sum};
use crate::Float;
use rayon::prelude::*;

/// What the forward keeps for the backward: per-row reciprocal root mean square.
#[derive(Clone, Debug, Default)]
pub struct RmsNormStats<T> {
    /// `[rows]`, 1 / √(mean(x²) + ε)
    pub rstd: Vec<T>,
}

/// Normalises each row of `x [rows, d]` into `y`, scaled by the gain `g [d]`.
pub fn rms_norm_forward<T: Float>(
    y: &mut [T],
    x: &[T],
    gain: &[T],
    d: usize,
    eps: f64,
) -> RmsNormStats<T> {
    assert_eq!(gain.len(), d, "rms norm gain width");
    assert_eq!(y.len(), x.len());
    assert!(
        d > 0 && x.len().is_multiple_of(d),
        "rms norm: {} values are not rows of {d}",
        x.len()
    );
    let mut rstd = vec![T::zero(); x.len() / d];
    let eps = T::of(eps);
    let d_t = T::of(d as f64);
    y.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .zip(rstd.par_iter_mut())
        .for_each(|((yr, xr), rs)| {
            let mean_sq = lane_sum(xr, |v| v * v) / d_t;
            let r = T::one() / (mean_sq + eps).sqrt();
            for ((o, &v), &g) in yr.iter_mut().zip(xr).zip(gain) {
                *o = v * r * g;
            }
            *rs = r;
        });
    RmsNormStats { rstd }
}

/// Backward: writes `dx` and accumulates `dgain += Σ_rows dy ⊙ x̂`.
///
/// `dx = r · (g ⊙ dy − x̂ · mean(g ⊙ dy ⊙ x̂))` with `x̂ = x · r`, `r = 1/√(mean(x²) + ε)`.
pub fn rms_norm_backward<T: Float>(
    dx: &mut [T],
    dy: &[T],
    x: &[T],
    stats: &RmsNormStats<T>,
    gain: &[T],
    dgain: &mut [T],
    d: usize,
) {
    assert_eq!(gain.len(), d, "rms norm gain width");
    assert_eq!(dgain.len(), d, "rms norm gain gradient width");
    assert_eq!(dx.len(), x.len());
    assert_eq!(dy.len(), x.len());
    let rows = stats.rstd.len();
    assert_eq!(x.len(), rows * d, "rms norm: stats of another shape");
    let d_t = T::of(d as f64);
    dx.par_chunks_mut(d)
        .zip(dy.par_chunks(d).zip(x.par_chunks(d)))
        .zip(stats.rstd.par_iter())
        .for_each(|((dxr, (dyr, xr)), &r)| {
            let mut mean_gx = T::zero();
            for ((&g, &dyv), &v) in gain.iter().zip(dyr).zip(xr) {
                mean_gx += g * dyv * (v * r);
            }
            mean_gx /= d_t;
            for (((o, &g), &dyv), &v) in dxr.iter_mut().zip(gain).zip(dyr).zip(xr) {
                *o = r * (g * dyv - v * r * mean_gx);
            }
        });
    add_column_sums_with(dgain, rows, |row, acc: &mut [T]| {
        let r = stats.rstd[row];
        let (dyr, xr) = (&dy[row * d..(row + 1) * d], &x[row * d..(row + 1) * d]);
        for ((a, &dyv), &v) in acc.iter_mut().zip(dyr).zip(xr) {
            *a += dyv * (v * r);
        }
    });
}
