//! Layer normalisation over the last dimension:
//! `y = γ ⊙ (x − μ) / √(σ² + ε) + β`, with μ and σ² the mean and (biased) variance of the row.

use super::reduce::{add_column_sums_with, lane_sum};
use crate::Float;
use rayon::prelude::*;

/// What the forward keeps for the backward: per-row mean and reciprocal standard deviation.
#[derive(Clone, Debug, Default)]
pub struct LayerNormStats<T> {
    /// `[rows]`
    pub mean: Vec<T>,
    /// `[rows]`, 1 / √(σ² + ε)
    pub rstd: Vec<T>,
}

/// Normalises each row of `x [rows, d]` into `y`.
pub fn layer_norm_forward<T: Float>(
    y: &mut [T],
    x: &[T],
    gamma: &[T],
    beta: &[T],
    d: usize,
    eps: f64,
) -> LayerNormStats<T> {
    let rows = x.len() / d;
    let mut mean = vec![T::zero(); rows];
    let mut rstd = vec![T::zero(); rows];
    let eps = T::of(eps);
    let inv_d = T::one() / T::of(d as f64);
    y.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .zip(mean.par_iter_mut().zip(rstd.par_iter_mut()))
        .for_each(|((yr, xr), (m, rs))| {
            let mu = lane_sum(xr, |v| v) * inv_d;
            let var = lane_sum(xr, |v| (v - mu) * (v - mu)) * inv_d;
            let r = T::one() / (var + eps).sqrt();
            for i in 0..d {
                yr[i] = (xr[i] - mu) * r * gamma[i] + beta[i];
            }
            *m = mu;
            *rs = r;
        });
    LayerNormStats { mean, rstd }
}

/// Backward: writes `dx` and accumulates `dgamma += Σ dy ⊙ x̂`, `dbeta += Σ dy`.
///
/// `dx = rstd · (g − mean(g) − x̂ · mean(g ⊙ x̂))` with `g = γ ⊙ dy`, `x̂ = (x − μ) · rstd`.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_backward<T: Float>(
    dx: &mut [T],
    dy: &[T],
    x: &[T],
    stats: &LayerNormStats<T>,
    gamma: &[T],
    dgamma: &mut [T],
    dbeta: &mut [T],
    d: usize,
) {
    let rows = x.len() / d;
    let inv_d = T::one() / T::of(d as f64);
    dx.par_chunks_mut(d)
        .zip(dy.par_chunks(d).zip(x.par_chunks(d)))
        .zip(stats.mean.par_iter().zip(stats.rstd.par_iter()))
        .for_each(|((dxr, (dyr, xr)), (&mu, &r))| {
            let mut mean_g = T::zero();
            let mut mean_gx = T::zero();
            for i in 0..d {
                let g = gamma[i] * dyr[i];
                mean_g += g;
                mean_gx += g * (xr[i] - mu) * r;
            }
            mean_g *= inv_d;
            mean_gx *= inv_d;
            for i in 0..d {
                let xhat = (xr[i] - mu) * r;
                dxr[i] = r * (gamma[i] * dyr[i] - mean_g - xhat * mean_gx);
            }
        });
    add_column_sums_with(dgamma, rows, |row, acc: &mut [T]| {
        let (mu, r) = (stats.mean[row], stats.rstd[row]);
        for i in 0..d {
            acc[i] += dy[row * d + i] * (x[row * d + i] - mu) * r;
        }
    });
    add_column_sums_with(dbeta, rows, |row, acc: &mut [T]| {
        for i in 0..d {
            acc[i] += dy[row * d + i];
        }
    });
}
