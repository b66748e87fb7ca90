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

/// `y ← max(y + b, 0)` row by row for `y [rows, d]` and a bias `b [d]`: the FFN's first bias and
/// its ReLU in one pass over the hidden activations instead of two.
pub fn bias_relu_inplace<T: Float>(y: &mut [T], bias: &[T]) {
    let d = bias.len();
    let f = |row: &mut [T]| {
        for (v, &b) in row.iter_mut().zip(bias) {
            *v = (*v + b).max(T::zero());
        }
    };
    if y.len() < PAR_MIN {
        y.chunks_exact_mut(d).for_each(f);
    } else {
        y.par_chunks_mut(d).for_each(f);
    }
}

/// ReLU's backward through inverted dropout: for `y = max(z, 0) ⊙ m` (the mask `m` holding 0
/// or 1/(1 − p); all ones without a mask), `dz = dy ⊙ m ⊙ 1[y > 0]`. A kept unit has `m > 0`, so
/// `y > 0` exactly where the unit was both kept and active, and one pass does both factors.
pub fn relu_backward_inplace<T: Float>(dy: &mut [T], y: &[T], mask: Option<&[T]>) {
    assert_eq!(dy.len(), y.len());
    // Written as selects, not branches, so the loops vectorise.
    let plain = |(g, &v): (&mut T, &T)| *g = if v > T::zero() { *g } else { T::zero() };
    let masked =
        |((g, &v), &m): ((&mut T, &T), &T)| *g = if v > T::zero() { *g * m } else { T::zero() };
    match (mask, dy.len() < PAR_MIN) {
        (None, true) => dy.iter_mut().zip(y).for_each(plain),
        (None, false) => dy.par_iter_mut().zip(y.par_iter()).for_each(plain),
        (Some(m), true) => {
            assert_eq!(m.len(), dy.len());
            dy.iter_mut().zip(y).zip(m).for_each(masked)
        }
        (Some(m), false) => {
            assert_eq!(m.len(), dy.len());
            dy.par_iter_mut()
                .zip(y.par_iter())
                .zip(m.par_iter())
                .for_each(masked)
        }
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

/// SiLU (swish, Marian's `swish`) at one point, in f64: `x · σ(x)` (the tests' reference;
/// [`silu_forward`] computes it through the vectorised sigmoid).
// Used outside the library only (feature `internals`).
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// d/dx of [`silu`]: `σ(x) (1 + x (1 − σ(x)))`.
pub fn silu_grad(x: f64) -> f64 {
    let s = 1.0 / (1.0 + (-x).exp());
    s * (1.0 + x * (1.0 - s))
}

/// `y ← silu(x) = x · σ(x)` element-wise (an ungated FFN with swish, as Marian's), with the
/// sigmoid SwiGLU uses (`exp_vec`: vectorised in f32, the exact `exp` in f64).
pub fn silu_forward<T: Float>(y: &mut [T], x: &[T]) {
    assert_eq!(y.len(), x.len(), "silu: output and input differ in size");
    y.par_chunks_mut(PAR_MIN)
        .zip(x.par_chunks(PAR_MIN))
        .for_each(|(y, x)| pulp::Arch::new().dispatch(Silu { y, x }));
}

/// The loop of [`silu_forward`], compiled into each of pulp's target-feature functions (see
/// [`Swiglu`]).
struct Silu<'a, T> {
    y: &'a mut [T],
    x: &'a [T],
}

impl<T: Float> pulp::WithSimd for Silu<'_, T> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        for (o, &x) in self.y.iter_mut().zip(self.x) {
            *o = x * sigmoid(x);
        }
    }
}

/// `dy ← dy ⊙ silu'(x)`, given the pre-activation `x`.
pub fn silu_backward_inplace<T: Float>(dy: &mut [T], x: &[T]) {
    scale_by_grad(dy, x, silu_grad);
}

/// `y ← GELU(x)`, tanh approximation (GPT-2).
pub fn gelu_tanh_forward<T: Float>(y: &mut [T], x: &[T]) {
    map_into(y, x, gelu_tanh);
}

/// `dy ← dy ⊙ GELU'(x)` for the tanh approximation, given the pre-activation `x`.
pub fn gelu_tanh_backward_inplace<T: Float>(dy: &mut [T], x: &[T]) {
    scale_by_grad(dy, x, gelu_tanh_grad);
}

/// The logistic sigmoid `σ(x) = 1 / (1 + e^(−x))`: 0 for very negative `x` (`e^(−x)` = ∞, or the
/// f32 `exp_vec`'s largest value), 1 for very positive `x`, never NaN for finite `x`.
#[inline(always)]
fn sigmoid<T: Float>(x: T) -> T {
    T::one() / (T::one() + (-x).exp_vec())
}

/// SwiGLU (Shazeer 2020, the Llama feed-forward network's activation): `h = silu(g) ⊙ u` with
/// `silu(x) = x · σ(x)`, for the gate `g` and the up projection `u` in two buffers of the
/// same shape (`[rows, d_ff]`).
pub fn swiglu_forward<T: Float>(h: &mut [T], gate: &[T], up: &[T]) {
    assert_eq!(
        h.len(),
        gate.len(),
        "swiglu: output and gate differ in size"
    );
    assert_eq!(
        h.len(),
        up.len(),
        "swiglu: output and up projection differ in size"
    );
    // Fixed chunks on the pool's threads, each a loop compiled for the machine's widest vectors
    // (`pulp`): the sigmoid's `exp_vec` is straight-line arithmetic that vectorises.
    h.par_chunks_mut(PAR_MIN)
        .zip(gate.par_chunks(PAR_MIN))
        .zip(up.par_chunks(PAR_MIN))
        .for_each(|((h, gate), up)| pulp::Arch::new().dispatch(Swiglu { h, gate, up }));
}

/// The loop of [`swiglu_forward`]; a `WithSimd` type so that its `#[inline(always)]` body is
/// compiled into each of pulp's target-feature functions.
struct Swiglu<'a, T> {
    h: &'a mut [T],
    gate: &'a [T],
    up: &'a [T],
}

impl<T: Float> pulp::WithSimd for Swiglu<'_, T> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        for ((o, &g), &u) in self.h.iter_mut().zip(self.gate).zip(self.up) {
            *o = g * sigmoid(g) * u;
        }
    }
}

/// SwiGLU's backward: given `dh`, writes `dgate = dh ⊙ u ⊙ silu'(g)` and `dup = dh ⊙ silu(g)`,
/// with `silu'(x) = σ(x) (1 + x (1 − σ(x)))`.
pub fn swiglu_backward<T: Float>(dgate: &mut [T], dup: &mut [T], dh: &[T], gate: &[T], up: &[T]) {
    gated_backward_each((dgate, dup), dh, gate, up, "swiglu", swiglu_grads);
}

/// The backward of a gated activation `h = f(g, u)`, element by element:
/// `(dgate_k, dup_k) = grads(dh_k, g_k, u_k)`, over the thread pool from `PAR_MIN` elements
/// (SwiGLU's here, gpt-oss's clamped one in `swiglu_clamped`). `what` names the activation
/// when the buffers differ in size.
pub fn gated_backward_each<T: Float>(
    (dgate, dup): (&mut [T], &mut [T]),
    dh: &[T],
    gate: &[T],
    up: &[T],
    what: &str,
    grads: impl Fn(T, T, T) -> (T, T) + Sync,
) {
    let n = dh.len();
    assert!(
        dgate.len() == n && dup.len() == n && gate.len() == n && up.len() == n,
        "{what} backward: buffers differ in size"
    );
    if n < PAR_MIN {
        dgate
            .iter_mut()
            .zip(dup.iter_mut())
            .zip(dh)
            .zip(gate.iter().zip(up))
            .for_each(|(((dg, du), &d), (&g, &u))| (*dg, *du) = grads(d, g, u));
    } else {
        dgate
            .par_iter_mut()
            .zip(dup.par_iter_mut())
            .zip(dh.par_iter())
            .zip(gate.par_iter().zip(up.par_iter()))
            .for_each(|(((dg, du), &d), (&g, &u))| (*dg, *du) = grads(d, g, u));
    }
}

/// `(dh · u · silu'(g), dh · silu(g))` at one element.
#[inline(always)]
fn swiglu_grads<T: Float>(dh: T, g: T, u: T) -> (T, T) {
    let s = sigmoid(g);
    (dh * u * (s * (T::one() + g * (T::one() - s))), dh * (g * s))
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

/// `y ← y ⊙ m + x` (dropout of a sublayer output, then the residual) in one pass; without a
/// mask `y ← y + x`.
pub fn dropout_add_inplace<T: Float>(y: &mut [T], mask: Option<&[T]>, x: &[T]) {
    assert_eq!(y.len(), x.len());
    let Some(m) = mask else {
        return add_inplace(y, x);
    };
    assert_eq!(y.len(), m.len());
    let f = |((a, &mv), &xv): ((&mut T, &T), &T)| *a = *a * mv + xv;
    if y.len() < PAR_MIN {
        y.iter_mut().zip(m).zip(x).for_each(f);
    } else {
        y.par_iter_mut()
            .zip(m.par_iter())
            .zip(x.par_iter())
            .for_each(f);
    }
}

/// `x ← c · tanh(x / c)` (a soft cap at ±c, Gemma 2's final logits), evaluated in f64, rows
/// of `row_len` spread over the threads.
pub fn softcap_inplace<T: Float>(x: &mut [T], row_len: usize, c: f64) {
    x.par_chunks_mut(row_len).with_min_len(8).for_each(|row| {
        for z in row {
            *z = T::of(c * (z.f64() / c).tanh());
        }
    });
}

/// The soft cap's backward: `dz = dy ⊙ (1 − tanh²(z / c))` for the uncapped `z`, in f64.
pub fn softcap_backward<T: Float>(dz: &mut [T], dy: &[T], z: &[T], c: f64) {
    assert_eq!(dz.len(), dy.len());
    assert_eq!(dz.len(), z.len());
    for ((o, &g), &z) in dz.iter_mut().zip(dy).zip(z) {
        let t = (z.f64() / c).tanh();
        *o = T::of(g.f64() * (1.0 - t * t));
    }
}

/// `x ← tanh(x)`, evaluated in f64.
pub fn tanh_inplace<T: Float>(x: &mut [T]) {
    x.iter_mut().for_each(|v| *v = T::of(v.f64().tanh()));
}

/// `dy ← dy ⊙ (1 − y²)` for `y = tanh(x)`.
pub fn tanh_backward_inplace<T: Float>(dy: &mut [T], y: &[T]) {
    assert_eq!(dy.len(), y.len());
    for (g, &p) in dy.iter_mut().zip(y) {
        *g *= T::one() - p * p;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relu_backward_through_dropout_equals_mask_then_relu_on_both_paths() {
        for n in [37usize, 3 * PAR_MIN + 5] {
            let z: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect();
            let dy: Vec<f32> = (0..n)
                .map(|i| ((i * 13 % 29) as f32 - 14.0) / 3.0)
                .collect();
            let m: Vec<f32> = (0..n)
                .map(|i| if i % 5 == 2 { 0.0 } else { 1.25 })
                .collect();
            // y = relu(z) ⊙ m; the reference: dy ⊙ m, then zero where relu(z) was 0.
            let y: Vec<f32> = z.iter().zip(&m).map(|(&a, &b)| a.max(0.0) * b).collect();
            let want: Vec<f32> = dy
                .iter()
                .zip(&z)
                .zip(&m)
                .map(|((&g, &a), &b)| if a > 0.0 { g * b } else { 0.0 })
                .collect();
            let mut got = dy.clone();
            relu_backward_inplace(&mut got, &y, Some(&m));
            assert_eq!(got, want, "n = {n}");
            let want_plain: Vec<f32> = dy
                .iter()
                .zip(&z)
                .map(|(&g, &a)| if a > 0.0 { g } else { 0.0 })
                .collect();
            let relu: Vec<f32> = z.iter().map(|a| a.max(0.0)).collect();
            let mut got = dy.clone();
            relu_backward_inplace(&mut got, &relu, None);
            assert_eq!(got, want_plain, "n = {n}");
        }
    }

    #[test]
    fn bias_relu_equals_bias_then_relu_on_both_paths() {
        // Small (serial) and large (parallel) inputs; results are bit-identical to two passes.
        for &(rows, d) in &[(3usize, 5usize), (300, 97)] {
            let y: Vec<f32> = (0..rows * d)
                .map(|i| ((i * 7919 % 101) as f32 - 50.0) * 0.1)
                .collect();
            let b: Vec<f32> = (0..d).map(|j| (j as f32 - 40.0) * 0.05).collect();
            let mut want = y.clone();
            for row in want.chunks_exact_mut(d) {
                row.iter_mut().zip(&b).for_each(|(v, &bv)| *v += bv);
            }
            relu_inplace(&mut want);
            let mut got = y;
            bias_relu_inplace(&mut got, &b);
            assert_eq!(got, want);
            assert!(got.contains(&0.0) && got.iter().any(|&v| v > 0.0));
        }
    }

    #[test]
    fn dropout_add_equals_mask_then_add() {
        for &n in &[7usize, 3 * PAR_MIN + 5] {
            let y: Vec<f64> = (0..n).map(|i| (i % 13) as f64 * 0.3 - 1.0).collect();
            let x: Vec<f64> = (0..n).map(|i| (i % 7) as f64 * 0.1).collect();
            let m: Vec<f64> = (0..n)
                .map(|i| if i % 3 == 0 { 0.0 } else { 1.25 })
                .collect();
            let mut want = y.clone();
            mul_inplace(&mut want, &m);
            add_inplace(&mut want, &x);
            let mut got = y.clone();
            dropout_add_inplace(&mut got, Some(&m), &x);
            assert_eq!(got, want);
            let mut plain = y.clone();
            dropout_add_inplace(&mut plain, None, &x);
            assert!(plain.iter().zip(&y).zip(&x).all(|((p, a), b)| *p == a + b));
        }
    }
}
