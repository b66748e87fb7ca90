//! Adam (Kingma & Ba), with the paper's β₁ = 0.9, β₂ = 0.98, ε = 10⁻⁹ (section 5.3):
//! `m ← β₁ m + (1 − β₁) g`, `v ← β₂ v + (1 − β₂) g²`,
//! `θ ← θ − lr · m̂ / (√v̂ + ε)` with `m̂ = m / (1 − β₁ᵗ)`, `v̂ = v / (1 − β₂ᵗ)`.

use crate::model::Param;
use crate::Float;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// Adam's hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdamConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
}

impl Default for AdamConfig {
    /// The paper's values.
    fn default() -> Self {
        AdamConfig {
            beta1: 0.9,
            beta2: 0.98,
            eps: 1e-9,
        }
    }
}

/// Adam's state: the step count and first/second moments, one buffer per parameter tensor in the
/// model's fixed parameter order.
#[derive(Clone, Debug)]
pub struct Adam<T> {
    pub config: AdamConfig,
    /// Updates applied so far (t).
    pub step: u64,
    pub m: Vec<Vec<T>>,
    pub v: Vec<Vec<T>>,
}

impl<T: Float> Adam<T> {
    /// Zero moments shaped like `params`.
    pub fn new(config: AdamConfig, params: &[(String, &mut Param<T>)]) -> Self {
        let zeros = || -> Vec<Vec<T>> {
            params
                .iter()
                .map(|(_, p)| vec![T::zero(); p.value.len()])
                .collect()
        };
        Adam {
            config,
            step: 0,
            m: zeros(),
            v: zeros(),
        }
    }

    /// One update of every parameter from its gradient, with learning rate `lr`.
    pub fn update(&mut self, params: &mut [(String, &mut Param<T>)], lr: f64) {
        assert_eq!(
            params.len(),
            self.m.len(),
            "optimizer/model parameter mismatch"
        );
        self.step += 1;
        let AdamConfig { beta1, beta2, eps } = self.config;
        let t = self.step as i32;
        let bias1 = 1.0 - beta1.powi(t);
        let bias2 = 1.0 - beta2.powi(t);
        // θ ← θ − (lr / bias1) · m / (√v / √bias2 + ε)
        let (beta1, beta2) = (T::of(beta1), T::of(beta2));
        let rule = AdamRule {
            step_size: T::of(lr / bias1),
            inv_sqrt_bias2: T::of(1.0 / bias2.sqrt()),
            beta1,
            beta2,
            one_minus_beta1: T::one() - beta1,
            one_minus_beta2: T::one() - beta2,
            eps: T::of(eps),
        };
        params
            .par_iter_mut()
            .zip(self.m.par_iter_mut().zip(self.v.par_iter_mut()))
            .for_each(|((_, p), (m, v))| {
                pulp::Arch::new().dispatch(AdamPass {
                    rule,
                    value: &mut p.value.data,
                    grad: &p.grad.data,
                    m,
                    v,
                })
            });
    }
}

/// The per-element constants of one update.
#[derive(Clone, Copy)]
struct AdamRule<T> {
    step_size: T,
    inv_sqrt_bias2: T,
    beta1: T,
    beta2: T,
    one_minus_beta1: T,
    one_minus_beta2: T,
    eps: T,
}

/// One tensor's update: a `WithSimd` type so that its `#[inline(always)]` body is compiled into
/// each of pulp's target-feature functions (the widest vectors the machine has), and written over
/// zipped slices so it has no bounds checks to keep it scalar. Each element sees the same
/// operations in the same order as the scalar formula, so the result is bit-identical to it.
struct AdamPass<'a, T> {
    rule: AdamRule<T>,
    value: &'a mut [T],
    grad: &'a [T],
    m: &'a mut [T],
    v: &'a mut [T],
}

impl<T: Float> pulp::WithSimd for AdamPass<'_, T> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        let r = self.rule;
        let n = self.value.len();
        assert!(self.grad.len() == n && self.m.len() == n && self.v.len() == n);
        for (((value, &g), m), v) in self
            .value
            .iter_mut()
            .zip(self.grad)
            .zip(self.m.iter_mut())
            .zip(self.v.iter_mut())
        {
            *m = r.beta1 * *m + r.one_minus_beta1 * g;
            *v = r.beta2 * *v + r.one_minus_beta2 * g * g;
            *value -= r.step_size * *m / (v.sqrt() * r.inv_sqrt_bias2 + r.eps);
        }
    }
}

/// The global L2 norm of all gradients, summed in a fixed order (deterministic).
pub fn global_grad_norm<T: Float>(params: &[(String, &mut Param<T>)]) -> f64 {
    let per_tensor: Vec<f64> = params
        .par_iter()
        .map(|(_, p)| p.grad.data.iter().map(|g| g.f64() * g.f64()).sum())
        .collect();
    per_tensor.iter().sum::<f64>().sqrt()
}

/// Scales all gradients so their global norm is at most `max_norm`; returns the norm before.
pub fn clip_grad_norm<T: Float>(params: &mut [(String, &mut Param<T>)], max_norm: f64) -> f64 {
    let norm = global_grad_norm(params);
    if norm > max_norm && norm.is_finite() {
        let s = T::of(max_norm / norm);
        params
            .par_iter_mut()
            .for_each(|(_, p)| p.grad.data.iter_mut().for_each(|g| *g *= s));
    }
    norm
}

/// One guarded update, shared by the trainers: refuses a non-finite `loss` (or gradient norm)
/// before anything changes, clips to `clip_norm` when given, then applies Adam with `lr`.
/// Returns the gradient norm before clipping (when clipping is on).
pub fn guarded_update<T: Float>(
    adam: &mut Adam<T>,
    params: &mut [(String, &mut Param<T>)],
    clip_norm: Option<f64>,
    lr: f64,
    step: u64,
    loss: f64,
) -> crate::error::Result<Option<f64>> {
    use crate::error::Error;
    if !loss.is_finite() {
        return Err(Error::NonFiniteLoss { step, loss });
    }
    let grad_norm = clip_norm.map(|max| clip_grad_norm(params, max));
    if let Some(n) = grad_norm.filter(|n| !n.is_finite()) {
        return Err(Error::NonFiniteLoss { step, loss: n });
    }
    adam.update(params, lr);
    Ok(grad_norm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tensor;

    #[test]
    fn matches_a_hand_computed_adam_trajectory() {
        let mut p = Param::new(Tensor::from_vec(vec![1.0f64, -2.0], &[2]));
        let cfg = AdamConfig::default();
        let grads = [[0.5, -1.0], [0.1, 0.3], [-0.2, 0.0]];
        let (mut m, mut v, mut theta) = ([0.0; 2], [0.0; 2], [1.0, -2.0]);
        let mut adam = {
            let params = vec![("p".to_string(), &mut p)];
            Adam::new(cfg, &params)
        };
        for (t, g) in grads.iter().enumerate() {
            p.grad.data.copy_from_slice(g);
            let mut params = vec![("p".to_string(), &mut p)];
            adam.update(&mut params, 0.01);
            for i in 0..2 {
                m[i] = 0.9 * m[i] + 0.1 * g[i];
                v[i] = 0.98 * v[i] + 0.02 * g[i] * g[i];
                let mh = m[i] / (1.0 - 0.9f64.powi(t as i32 + 1));
                let vh = v[i] / (1.0 - 0.98f64.powi(t as i32 + 1));
                theta[i] -= 0.01 * mh / (vh.sqrt() + 1e-9);
            }
            for (got, want) in p.value.data.iter().zip(&theta) {
                assert!((got - want).abs() < 1e-12, "step {t}");
            }
        }
    }

    /// The vectorised pass against the scalar formula written out here, bit for bit, in f32 over
    /// a length that is no multiple of any vector width and values spanning magnitudes.
    #[test]
    fn vectorised_update_equals_the_scalar_formula_bit_for_bit() {
        let n = 1_037;
        let mut rng = crate::rng::Rng::new(7);
        let mut draw = |scale: f64| -> Vec<f32> {
            (0..n)
                .map(|_| (rng.normal() * scale * 10f64.powf(rng.uniform_range(-3.0, 1.0))) as f32)
                .collect()
        };
        let mut p = Param::new(Tensor::from_vec(draw(1.0), &[n]));
        let mut theta = p.value.data.clone();
        let (mut m, mut v) = (vec![0f32; n], vec![0f32; n]);
        let cfg = AdamConfig::default();
        let mut adam = {
            let params = vec![("p".to_string(), &mut p)];
            Adam::new(cfg, &params)
        };
        for t in 1..=4 {
            let g = draw(0.1);
            p.grad.data.copy_from_slice(&g);
            let lr = 1e-3 * t as f64;
            adam.update(&mut [("p".to_string(), &mut p)], lr);
            let step_size = (lr / (1.0 - 0.9f64.powi(t))) as f32;
            let inv_sqrt_bias2 = (1.0 / (1.0 - 0.98f64.powi(t)).sqrt()) as f32;
            let (b1, b2, eps) = (0.9f32, 0.98f32, 1e-9f32);
            for i in 0..n {
                m[i] = b1 * m[i] + (1.0 - b1) * g[i];
                v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
                theta[i] -= step_size * m[i] / (v[i].sqrt() * inv_sqrt_bias2 + eps);
            }
            for i in 0..n {
                assert_eq!(
                    p.value.data[i].to_bits(),
                    theta[i].to_bits(),
                    "step {t}, {i}"
                );
                assert_eq!(adam.m[0][i].to_bits(), m[i].to_bits(), "m, step {t}, {i}");
                assert_eq!(adam.v[0][i].to_bits(), v[i].to_bits(), "v, step {t}, {i}");
            }
        }
    }

    #[test]
    fn clipping_scales_to_the_max_norm() {
        let mut p = Param::new(Tensor::from_vec(vec![0.0f64; 2], &[2]));
        p.grad.data.copy_from_slice(&[3.0, 4.0]);
        let mut params = vec![("p".to_string(), &mut p)];
        assert_eq!(clip_grad_norm(&mut params, 1.0), 5.0);
        assert!((global_grad_norm(&params) - 1.0).abs() < 1e-12);
    }
}
