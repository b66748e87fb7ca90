// Activation functions (prepended to the kernels that use them). Kinds:
// 0 silu, 1 GELU (tanh approximation), 2 GELU (erf, exact), 3 relu.

// erfc(z) for z ≥ 0: Numerical Recipes' Chebyshev fit, fractional error below 1.2e-7 for
// every z ≥ 0 (so also in the tail, where 1 − erf would lose it all).
fn erfc_pos(z: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418
        + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587
        + t * (-0.82215223 + t * 0.17087277))))))));
    return t * exp(-z * z + poly);
}

// erfc(z) = 1 − erf(z) on all of f32.
fn erfc_f32(z: f32) -> f32 {
    if (z >= 0.0) {
        return erfc_pos(z);
    }
    return 2.0 - erfc_pos(-z);
}

// erf(z), absolute error about 1e-7 (WGSL has no erf).
fn erf_f32(z: f32) -> f32 {
    let e = 1.0 - erfc_pos(abs(z));
    return select(e, -e, z < 0.0);
}

// x · σ(x); exp overflow for very negative x gives −0, not NaN.
fn silu(x: f32) -> f32 {
    return x / (1.0 + exp(-x));
}

// ½ x (1 + tanh(u)) with u = √(2/π) (x + 0.044715 x³), as x / (1 + e^(−2u)): no tanh
// overflow, and relative accuracy in the negative tail.
fn gelu_tanh(x: f32) -> f32 {
    let u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    return x / (1.0 + exp(-2.0 * u));
}

// x Φ(x) = ½ x erfc(−x / √2): relative accuracy also in the negative tail.
fn gelu_erf(x: f32) -> f32 {
    return 0.5 * x * erfc_f32(-x * 0.7071067811865476);
}

fn activate(kind: u32, x: f32) -> f32 {
    switch kind {
        case 0u: { return silu(x); }
        case 1u: { return gelu_tanh(x); }
        case 2u: { return gelu_erf(x); }
        default: { return max(x, 0.0); }
    }
}
