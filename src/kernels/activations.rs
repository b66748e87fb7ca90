//! Element-wise activations and their derivatives.

use crate::Float;
use rayon::prelude::*;

/// Below this many elements the loops stay on one thread.
const PAR_MIN: usize = 1 << 14;

/// `x ← max(x, 0)` (the paper's FFN activation).
pub fn relu_inplace<T: Float>(x: &mut [T]) {
    if x.len() < PAR_MIN {
        x.iter_mut().for_each(|v| *v = v.max(T::zero()));
    } else {
        x.par_iter_mut().for_each(|v| *v = v.max(T::zero()));
    }
}

/// `dy ← dy ⊙ 1[y > 0]`, given the ReLU output `y`.
pub fn relu_backward_inplace<T: Float>(dy: &mut [T], y: &[T]) {
    let f = |(g, &v): (&mut T, &T)| {
        if v <= T::zero() {
            *g = T::zero();
        }
    };
    if dy.len() < PAR_MIN {
        dy.iter_mut().zip(y).for_each(f);
    } else {
        dy.par_iter_mut().zip(y.par_iter()).for_each(f);
    }
}

/// √(2/π), the GELU tanh approximation's scale.
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of the GELU tanh approximation.
const GELU_TANH_C: f64 = 0.044_715;

/// Exact GELU at one point, in f64: `x·Φ(x) = ½ x (1 + erf(x / √2))`.
pub fn gelu_erf(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2))
}

/// d/dx of [`gelu_erf`]: `Φ(x) + x φ(x)`, with φ the standard normal density.
pub fn gelu_erf_grad(x: f64) -> f64 {
    let cdf = 0.5 * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2));
    let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
    cdf + x * pdf
}

/// GPT-2's tanh approximation: `½ x (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
pub fn gelu_tanh(x: f64) -> f64 {
    let u = SQRT_2_OVER_PI * (x + GELU_TANH_C * x * x * x);
    0.5 * x * (1.0 + u.tanh())
}

/// d/dx of [`gelu_tanh`]: `½ (1 + t) + ½ x (1 − t²) √(2/π) (1 + 3·0.044715 x²)`, `t = tanh(u)`.
pub fn gelu_tanh_grad(x: f64) -> f64 {
    let u = SQRT_2_OVER_PI * (x + GELU_TANH_C * x * x * x);
    let t = u.tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_TANH_C * x * x)
}

/// `y ← f(x)` element-wise, evaluated in f64 and rounded once.
fn map_into<T: Float>(y: &mut [T], x: &[T], f: fn(f64) -> f64) {
    assert_eq!(y.len(), x.len());
    let g = |(o, &v): (&mut T, &T)| *o = T::of(f(v.f64()));
    if y.len() < PAR_MIN {
        y.iter_mut().zip(x).for_each(g);
    } else {
        y.par_iter_mut().zip(x.par_iter()).for_each(g);
    }
}

/// `dy ← dy ⊙ f'(x)` element-wise, the derivative evaluated in f64.
fn scale_by_grad<T: Float>(dy: &mut [T], x: &[T], df: fn(f64) -> f64) {
    assert_eq!(dy.len(), x.len());
    let g = |(d, &v): (&mut T, &T)| *d = T::of(d.f64() * df(v.f64()));
    if dy.len() < PAR_MIN {
        dy.iter_mut().zip(x).for_each(g);
    } else {
        dy.par_iter_mut().zip(x.par_iter()).for_each(g);
    }
}

/// `y ← GELU(x)`, exact (erf) form, as in BERT.
pub fn gelu_erf_forward<T: Float>(y: &mut [T], x: &[T]) {
    map_into(y, x, gelu_erf);
}

/// `dy ← dy ⊙ GELU'(x)` for the erf form, given the pre-activation `x`.
pub fn gelu_erf_backward_inplace<T: Float>(dy: &mut [T], x: &[T]) {
    scale_by_grad(dy, x, gelu_erf_grad);
}

/// `y ← GELU(x)`, tanh approximation (GPT-2).
pub fn gelu_tanh_forward<T: Float>(y: &mut [T], x: &[T]) {
    map_into(y, x, gelu_tanh);
}

/// `dy ← dy ⊙ GELU'(x)` for the tanh approximation, given the pre-activation `x`.
pub fn gelu_tanh_backward_inplace<T: Float>(dy: &mut [T], x: &[T]) {
    scale_by_grad(dy, x, gelu_tanh_grad);
}

/// `y += x` element-wise (residual connections).
pub fn add_inplace<T: Float>(y: &mut [T], x: &[T]) {
    assert_eq!(y.len(), x.len());
    if y.len() < PAR_MIN {
        y.iter_mut().zip(x).for_each(|(a, &b)| *a += b);
    } else {
        y.par_iter_mut()
            .zip(x.par_iter())
            .for_each(|(a, &b)| *a += b);
    }
}

/// `y *= m` element-wise (dropout masks).
pub fn mul_inplace<T: Float>(y: &mut [T], m: &[T]) {
    assert_eq!(y.len(), m.len());
    if y.len() < PAR_MIN {
        y.iter_mut().zip(m).for_each(|(a, &b)| *a *= b);
    } else {
        y.par_iter_mut()
            .zip(m.par_iter())
            .for_each(|(a, &b)| *a *= b);
    }
}
