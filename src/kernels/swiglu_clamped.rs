//! gpt-oss's clamped SwiGLU, the activation of its experts: for the gate `g` and the up
//! projection `u` of a gated FFN,
//!
//! `g' = min(g, limit)`,   `u' = clamp(u, −limit, limit)`,   `h = (u' + 1) ⊙ g' σ(α g')`,
//!
//! with `σ(z) = 1 / (1 + e^{−z})`, `α = 1.702` and `limit = 7` in gpt-oss (transformers'
//! `GptOssExperts._apply_gate`, ggml's `swiglu_oai`). Its derivatives, zero where a clamp holds
//! (`g > limit`, `|u| > limit`), as PyTorch's `clamp` passes them:
//!
//! `∂h/∂g = (u' + 1) · σ(α g') (1 + α g' (1 − σ(α g')))`,   `∂h/∂u = g' σ(α g')`.

use crate::Float;
use rayon::prelude::*;

/// Elements from which the loops run on the pool's threads.
const PAR_MIN: usize = 1 << 14;

/// `h = (u' + 1) ⊙ g' σ(α g')` (module docs), all `[rows, d_ff]`.
pub fn forward<T: Float>(h: &mut [T], gate: &[T], up: &[T], (alpha, limit): (f64, f64)) {
    assert!(
        h.len() == gate.len() && h.len() == up.len(),
        "clamped swiglu: buffers differ in size"
    );
    let (alpha, limit) = (T::of(alpha), T::of(limit));
    let one = |h: &mut T, g: T, u: T| {
        let g = if g > limit { limit } else { g };
        let u = u.max(-limit).min(limit);
        *h = (u + T::one()) * g * sigmoid(alpha * g);
    };
    if h.len() < PAR_MIN {
        h.iter_mut()
            .zip(gate.iter().zip(up))
            .for_each(|(h, (&g, &u))| one(h, g, u));
    } else {
        h.par_iter_mut()
            .zip(gate.par_iter().zip(up.par_iter()))
            .for_each(|(h, (&g, &u))| one(h, g, u));
    }
}

/// Backward of [`forward`]: `dgate = dh ⊙ ∂h/∂g`, `dup = dh ⊙ ∂h/∂u` (module docs).
pub fn backward<T: Float>(
    (dgate, dup): (&mut [T], &mut [T]),
    dh: &[T],
    gate: &[T],
    up: &[T],
    (alpha, limit): (f64, f64),
) {
    let (alpha, limit) = (T::of(alpha), T::of(limit));
    let grads = |d: T, g: T, u: T| {
        let (g_in, u_in) = (g <= limit, u >= -limit && u <= limit);
        let g = if g_in { g } else { limit };
        let u = u.max(-limit).min(limit);
        let s = sigmoid(alpha * g);
        let dglu = s * (T::one() + alpha * g * (T::one() - s));
        let dg = if g_in { d * (u + T::one()) * dglu } else { T::zero() };
        let du = if u_in { d * g * s } else { T::zero() };
        (dg, du)
    };
    super::activations::gated_backward_each((dgate, dup), dh, gate, up, "clamped swiglu", grads);
}

/// `σ(x)` with the library exponential.
#[inline(always)]
fn sigmoid<T: Float>(x: T) -> T {
    T::one() / (T::one() + (-x).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPT_OSS: (f64, f64) = (1.702, 7.0);

    /// transformers' `_apply_gate` written out in float64.
    fn reference(g: f64, u: f64) -> f64 {
        let (alpha, limit) = GPT_OSS;
        let g = g.min(limit);
        let u = u.clamp(-limit, limit);
        (u + 1.0) * g / (1.0 + (-alpha * g).exp())
    }

    /// The forward against the written-out formula on both sides of each clamp, the backward
    /// against central differences away from the clamps' kinks (zero past them).
    #[test]
    fn forward_and_backward_against_float64() {
        let gate: Vec<f64> = (0..41).map(|i| -10.0 + 0.5 * i as f64 + 0.013).collect();
        let up: Vec<f64> = gate.iter().rev().map(|g| 0.9 * g - 0.3).collect();
        let mut h = vec![0.0; gate.len()];
        forward(&mut h, &gate, &up, GPT_OSS);
        for ((&h, &g), &u) in h.iter().zip(&gate).zip(&up) {
            assert!((h - reference(g, u)).abs() < 1e-12, "{g} {u}: {h}");
        }
        // Past the limit the gate is 7 and the up projection ±7.
        assert!((h[40] - reference(7.0, -7.0)).abs() < 1e-12 && gate[40] > 7.0 && up[40] < -7.0);
        let dh: Vec<f64> = (0..gate.len()).map(|i| 0.5 + 0.1 * i as f64).collect();
        let (mut dg, mut du) = (vec![0.0; h.len()], vec![0.0; h.len()]);
        backward((&mut dg, &mut du), &dh, &gate, &up, GPT_OSS);
        let e = 1e-6;
        for (((&g, &u), &d), (&dg, &du)) in gate.iter().zip(&up).zip(&dh).zip(dg.iter().zip(&du)) {
            let num_g = (reference(g + e, u) - reference(g - e, u)) / (2.0 * e) * d;
            let num_u = (reference(g, u + e) - reference(g, u - e)) / (2.0 * e) * d;
            assert!((dg - num_g).abs() < 1e-7, "dgate at {g}: {dg} vs {num_g}");
            assert!((du - num_u).abs() < 1e-7, "dup at {u}: {du} vs {num_u}");
        }
        assert!(dg.iter().zip(&gate).any(|(&d, &g)| g > 7.0 && d == 0.0));
        assert!(du.iter().zip(&up).any(|(&d, &u)| u.abs() > 7.0 && d == 0.0));
    }
}
