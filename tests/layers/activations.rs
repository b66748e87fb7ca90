//! The GELU activations (exact erf form, as in BERT; tanh form, as in GPT-2) and SiLU (Marian's
//! swish): values against
//! independent f64 formulas, derivatives and the GELU feed-forward network's hand-written
//! backward against central finite differences in f64, and its f32 forward against an f64 loop.

use crate::common;

use common::*;
use transformer::kernels::activations::{
    gelu_erf, gelu_erf_grad, gelu_tanh, gelu_tanh_grad, silu, silu_grad,
};
use transformer::model::feed_forward::FeedForward;
use transformer::model::Activation;
use transformer::rng::Rng;

const D: usize = 8;
const D_FF: usize = 12;

/// erf by its Maclaurin series `2/√π Σ (−1)ⁿ x^(2n+1) / (n! (2n+1))`, accurate to ~1e-13 for
/// |x| <= 3 (the test keeps to that range); written here, independent of the crate's `libm`.
fn series_erf(x: f64) -> f64 {
    assert!(x.abs() <= 3.0);
    let mut term = x; // (−1)ⁿ x^(2n+1) / n!
    let mut sum = x;
    for n in 1..200 {
        term *= -x * x / n as f64;
        sum += term / (2 * n + 1) as f64;
        if term.abs() < 1e-300 {
            break;
        }
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

/// `½ x (1 + erf(x/√2))` with the series erf.
fn naive_gelu_erf(x: f64) -> f64 {
    0.5 * x * (1.0 + series_erf(x / 2f64.sqrt()))
}

/// `½ x (1 + tanh(√(2/π)(x + 0.044715 x³)))`.
fn naive_gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
}

/// `x / (1 + e^(−x))`.
fn naive_silu(x: f64) -> f64 {
    x * (0.5 + 0.5 * (x / 2.0).tanh())
}

fn grid() -> impl Iterator<Item = f64> {
    (-400..=400).map(|i| i as f64 * 0.01 + 0.003) // −4 … 4, never exactly 0
}

#[test]
fn gelu_values_match_independent_formulas() {
    // Known values: GELU(1) = Φ(1), erf(1) = 0.8427007929497149.
    assert!((gelu_erf(1.0) - 0.841_344_746_068_542_9).abs() < 1e-15);
    assert!((series_erf(1.0) - 0.842_700_792_949_714_9).abs() < 1e-14);
    assert_eq!(gelu_erf(0.0), 0.0);
    let mut worst = (0.0f64, 0.0f64);
    for x in grid() {
        worst.0 = worst.0.max((gelu_erf(x) - naive_gelu_erf(x)).abs());
        worst.1 = worst.1.max((gelu_tanh(x) - naive_gelu_tanh(x)).abs());
    }
    assert!(worst.0 < 1e-12 && worst.1 < 1e-14, "worst {worst:?}");
    // SiLU through σ(x) = (1 + tanh(x/2)) / 2; silu(1) = 1 / (1 + 1/e).
    assert!((silu(1.0) - 0.731_058_578_630_004_9).abs() < 1e-15);
    for x in grid() {
        assert!((silu(x) - naive_silu(x)).abs() < 1e-14, "silu at {x}");
    }
    // Far tails: the identity for large x, zero for very negative x.
    assert_eq!(gelu_erf(40.0), 40.0);
    assert_eq!(gelu_erf(-40.0), 0.0);
    assert!(gelu_tanh(-40.0).abs() < 1e-300);
    // The two forms agree to ~1e-3 (the approximation's known accuracy).
    let gap = grid()
        .map(|x| (gelu_erf(x) - gelu_tanh(x)).abs())
        .fold(0.0, f64::max);
    assert!(gap < 1e-3, "tanh approximation off by {gap}");
}

#[test]
fn gelu_derivatives_match_finite_differences() {
    let h = 1e-5;
    for x in grid().chain([-12.0, -7.5, 7.5, 12.0]) {
        for (name, f, df) in [
            (
                "erf",
                gelu_erf as fn(f64) -> f64,
                gelu_erf_grad as fn(f64) -> f64,
            ),
            ("tanh", gelu_tanh, gelu_tanh_grad),
            ("silu", silu, silu_grad),
        ] {
            let numeric = (f(x + h) - f(x - h)) / (2.0 * h);
            let err = rel_err(df(x), numeric);
            assert!(
                err < 1e-8,
                "{name} at {x}: {} vs {numeric} ({err:e})",
                df(x)
            );
        }
    }
}

fn check_ffn_gradient(activation: Activation) {
    let mut rng = Rng::new(31);
    let mut ffn = FeedForward::<f64>::new(D, D_FF, activation, &mut rng);
    jitter_params(&mut ffn, &mut rng, 0.2);
    let rows = 7;
    let x: Vec<f64> = randn(&mut rng, rows * D, 1.0);
    let r: Vec<f64> = randn(&mut rng, rows * D, 1.0);
    let (_, cache) = ffn.forward(&x);
    // Both signs of the pre-activation are exercised (GELU's curve differs on each side).
    let neg = cache.pre_activation.iter().filter(|&&v| v < 0.0).count();
    assert!(neg > 0 && neg < cache.pre_activation.len());
    let dx = ffn.backward(&x, cache, &r);
    let mut gc = GradCheck::new(format!("feed-forward {activation:?}"));
    gc.wrt_input("x", &x, &dx, |x| dot(&ffn.forward(x).0, &r));
    gc.wrt_params(&ffn, |m| dot(&m.forward(&x).0, &r));
    gc.report();
}

#[test]
fn gelu_erf_feed_forward_gradient() {
    check_ffn_gradient(Activation::GeluErf);
}

#[test]
fn gelu_tanh_feed_forward_gradient() {
    check_ffn_gradient(Activation::GeluTanh);
}

#[test]
fn silu_feed_forward_gradient() {
    check_ffn_gradient(Activation::Silu);
}

/// `act(x W₁ᵀ + b₁) W₂ᵀ + b₂` as f64 loops with the weights of `m`.
fn naive_gelu_ffn(m: &FeedForward<f32>, x: &[f64], act: fn(f64) -> f64) -> Vec<f64> {
    let (l1, l2) = (&m.linear1, &m.linear2);
    let hidden: Vec<f64> = naive_linear(
        x,
        &to_f64(&l1.weight.value.data),
        &to_f64(&l1.bias.as_ref().unwrap().value.data),
        l1.d_in,
        l1.d_out,
    )
    .into_iter()
    .map(act)
    .collect();
    naive_linear(
        &hidden,
        &to_f64(&l2.weight.value.data),
        &to_f64(&l2.bias.as_ref().unwrap().value.data),
        l2.d_in,
        l2.d_out,
    )
}

#[test]
fn gelu_feed_forward_matches_f64_loops() {
    for (activation, act) in [
        (Activation::GeluErf, naive_gelu_erf as fn(f64) -> f64),
        (Activation::GeluTanh, naive_gelu_tanh),
        (Activation::Silu, naive_silu),
    ] {
        let mut rng = Rng::new(32);
        let mut ffn = FeedForward::<f32>::new(D, D_FF, activation, &mut rng);
        jitter_params(&mut ffn, &mut rng, 0.2);
        let x: Vec<f32> = randn(&mut rng, 5 * D, 1.0);
        let (y, cache) = ffn.forward(&x);
        assert_eq!(cache.hidden.len(), 5 * D_FF);
        let w = assert_close(
            &format!("ffn {activation:?}"),
            &y,
            &naive_gelu_ffn(&ffn, &to_f64(&x), act),
            1e-5,
            1e-6,
        );
        eprintln!("ffn {activation:?}: worst |diff| / allowance {w:.3}");
    }
}

#[test]
fn relu_feed_forward_is_unchanged() {
    // The default activation is still the paper's ReLU, and its cache keeps no extra buffer.
    let mut rng = Rng::new(33);
    let ffn = FeedForward::<f32>::new(D, D_FF, Activation::default(), &mut rng);
    assert_eq!(ffn.activation, Activation::Relu);
    let x: Vec<f32> = randn(&mut rng, 3 * D, 1.0);
    let (y, cache) = ffn.forward(&x);
    assert!(cache.pre_activation.is_empty());
    assert_close("ffn relu", &y, &naive_ffn(&ffn, &to_f64(&x)), 1e-5, 1e-6);
}
