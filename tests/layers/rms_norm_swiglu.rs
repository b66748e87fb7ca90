//! The Llama-family feed-forward and normalisation kernels: RMSNorm and SwiGLU, forward against
//! f64 loops written here from their formulas (f64 and f32), backward against central finite
//! differences in f64 (relative error below 1e-6 with the 1e-3 floor).

use crate::common;

use common::*;
use transformer::kernels::activations::{swiglu_backward, swiglu_forward};
use transformer::kernels::rms_norm::{rms_norm_backward, rms_norm_forward};
use transformer::rng::Rng;

// ---------------------------------------------------------------------------------------------
// RMSNorm

/// `y = g ⊙ x / √(Σx²/d + ε)` per row; also returns `1/√(Σx²/d + ε)` per row.
fn naive_rms_norm(x: &[f64], gain: &[f64], eps: f64) -> (Vec<f64>, Vec<f64>) {
    let d = gain.len();
    let mut y = vec![0.0; x.len()];
    let mut rstd = Vec::new();
    for (r, row) in x.chunks_exact(d).enumerate() {
        let mut sq = 0.0;
        for &v in row {
            sq += v * v;
        }
        let rms = (sq / d as f64 + eps).sqrt();
        for i in 0..d {
            y[r * d + i] = gain[i] * row[i] / rms;
        }
        rstd.push(1.0 / rms);
    }
    (y, rstd)
}

/// Rows of the given scales in turn, the gain jittered around 1.
fn rms_inputs(rows: usize, d: usize, scales: &[f64], seed: u64) -> (Vec<f64>, Vec<f64>) {
    let mut rng = Rng::new(seed);
    let mut x: Vec<f64> = randn(&mut rng, rows * d, 1.0);
    for (r, row) in x.chunks_exact_mut(d).enumerate() {
        let scale = scales[r % scales.len()];
        row.iter_mut().for_each(|v| *v *= scale);
    }
    let gain = (0..d).map(|_| 1.0 + rng.uniform_range(-0.5, 0.5)).collect();
    (x, gain)
}

const RMS_EPS: f64 = 1e-5;
/// Rows of very different scales, the smallest so small that ε dominates.
const SCALES: [f64; 4] = [1.0, 30.0, 0.01, 1e-3];

#[test]
fn rms_norm_forward_matches_f64_loop() {
    // shapes around the lane width (16) and the column sums' chunk of 64 rows
    let mut worst = (0.0f64, 0.0f64);
    for (rows, d) in [(1, 1), (3, 16), (5, 17), (70, 33), (130, 64)] {
        let (x, gain) = rms_inputs(rows, d, &SCALES, 1 + d as u64);
        let (want, want_rstd) = naive_rms_norm(&x, &gain, RMS_EPS);
        let mut y = vec![f64::NAN; x.len()];
        let stats = rms_norm_forward(&mut y, &x, &gain, d, RMS_EPS);
        worst.0 = worst
            .0
            .max(assert_close("rms f64", &y, &want, 1e-13, 1e-14));
        assert_close("rms f64 rstd", &stats.rstd, &want_rstd, 1e-13, 0.0);
        let f = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<f32>>();
        let mut y32 = vec![f32::NAN; x.len()];
        let stats32 = rms_norm_forward(&mut y32, &f(&x), &f(&gain), d, RMS_EPS);
        worst.1 = worst
            .1
            .max(assert_close("rms f32", &y32, &want, 1e-5, 1e-6));
        assert_close("rms f32 rstd", &stats32.rstd, &want_rstd, 1e-5, 0.0);
    }
    eprintln!(
        "rms norm forward: worst diff/allowance f64 {:.3} (1e-13 rel), f32 {:.3} (1e-5 rel)",
        worst.0, worst.1
    );
}

#[test]
fn rms_norm_backward_matches_finite_differences() {
    // ε = 0.01 with rows of scale 0.1 keeps ε's part visible while the curvature stays small
    // enough for central differences with h = 1e-5 (with ε = 1e-5 and rows of scale 1e-3 their
    // truncation error alone is ~1e-6 relative).
    let mut gc = GradCheck::new("rms norm");
    let eps = 0.01;
    for (rows, d) in [(3, 5), (70, 19)] {
        let (x, gain) = rms_inputs(rows, d, &[1.0, 3.0, 0.1], 20 + d as u64);
        let mut rng = Rng::new(21);
        let r: Vec<f64> = randn(&mut rng, x.len(), 1.0);
        let loss = |x: &[f64], gain: &[f64]| {
            let mut y = vec![0.0; x.len()];
            rms_norm_forward(&mut y, x, gain, d, eps);
            dot(&y, &r)
        };
        let mut y = vec![0.0; x.len()];
        let stats = rms_norm_forward(&mut y, &x, &gain, d, eps);
        let mut dx = vec![f64::NAN; x.len()];
        // dgain accumulates: start from a nonzero value and take it off again
        let start: Vec<f64> = (0..d).map(|i| i as f64 * 0.5).collect();
        let mut dgain = start.clone();
        rms_norm_backward(&mut dx, &r, &x, &stats, &gain, &mut dgain, d);
        let dgain: Vec<f64> = dgain.iter().zip(&start).map(|(a, b)| a - b).collect();
        gc.wrt_input("x", &x, &dx, |x| loss(x, &gain));
        gc.wrt_input("gain", &gain, &dgain, |g| loss(&x, g));
    }
    gc.report();
}

#[test]
fn rms_norm_gain_gradient_does_not_depend_on_the_thread_count() {
    let (rows, d) = (300, 40);
    let (x, gain) = rms_inputs(rows, d, &SCALES, 30);
    let x: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let gain: Vec<f32> = gain.iter().map(|&v| v as f32).collect();
    let dy: Vec<f32> = randn(&mut Rng::new(31), x.len(), 1.0);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let mut y = vec![0f32; x.len()];
            let stats = rms_norm_forward(&mut y, &x, &gain, d, RMS_EPS);
            let (mut dx, mut dg) = (vec![0f32; x.len()], vec![0f32; d]);
            rms_norm_backward(&mut dx, &dy, &x, &stats, &gain, &mut dg, d);
            (y, dx, dg)
        })
    };
    assert_eq!(run(1), run(3));
}

// ---------------------------------------------------------------------------------------------
// SwiGLU

/// `silu(g) · u`, with the sigmoid written in the form that cannot overflow: `1 / (1 + e^(−x))`
/// for `x >= 0`, `eˣ / (1 + eˣ)` below (the kernel uses the first form everywhere).
fn naive_swiglu(g: f64, u: f64) -> f64 {
    let sigmoid = if g >= 0.0 {
        1.0 / (1.0 + (-g).exp())
    } else {
        g.exp() / (1.0 + g.exp())
    };
    g * sigmoid * u
}

/// Gates of ordinary size, and far tails where `e^(−x)` overflows or vanishes.
fn swiglu_inputs(n: usize, seed: u64) -> (Vec<f64>, Vec<f64>) {
    let mut rng = Rng::new(seed);
    let mut g: Vec<f64> = randn(&mut rng, n, 2.0);
    let tails = [-1000.0, -88.5, -40.0, -17.0, 17.0, 40.0, 90.0, 1000.0];
    for (v, t) in g.iter_mut().step_by(7).zip(tails.iter().cycle()) {
        *v = *t;
    }
    (g, randn(&mut rng, n, 1.0))
}

#[test]
fn swiglu_forward_matches_f64_formula() {
    let mut worst = (0.0f64, 0.0f64);
    // a serial-sized and a parallel-sized buffer
    for n in [61, 40_000] {
        let (g, u) = swiglu_inputs(n, 40 + n as u64);
        let want: Vec<f64> = g
            .iter()
            .zip(&u)
            .map(|(&a, &b)| naive_swiglu(a, b))
            .collect();
        let mut h = vec![f64::NAN; n];
        swiglu_forward(&mut h, &g, &u);
        worst.0 = worst
            .0
            .max(assert_close("swiglu f64", &h, &want, 1e-14, 1e-300));
        let f = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<f32>>();
        let (g32, u32) = (f(&g), f(&u));
        let mut h32 = vec![f32::NAN; n];
        swiglu_forward(&mut h32, &g32, &u32);
        // the reference on the f32-rounded inputs: what f32 arithmetic can reach
        let want32: Vec<f64> = g32
            .iter()
            .zip(&u32)
            .map(|(&a, &b)| naive_swiglu(a as f64, b as f64))
            .collect();
        worst.1 = worst
            .1
            .max(assert_close("swiglu f32", &h32, &want32, 1e-6, 1e-30));
    }
    // far tails exactly: silu(x) = x for large x, 0 for very negative x
    let mut h = [f64::NAN; 4];
    swiglu_forward(&mut h, &[1000.0, -1000.0, 40.0, 0.0], &[2.0, 2.0, 1.0, 3.0]);
    assert_eq!(h[..2], [2000.0, 0.0]);
    assert!((h[2] - 40.0).abs() < 1e-15 && h[3] == 0.0);
    let mut h32 = [f32::NAN; 2];
    swiglu_forward(&mut h32, &[1000.0f32, -1000.0], &[2.0, 2.0]);
    assert!(h32[0] == 2000.0 && h32[1].abs() < 1e-30, "{h32:?}");
    eprintln!(
        "swiglu forward: worst diff/allowance f64 {:.3} (1e-14 rel), f32 {:.3} (1e-6 rel)",
        worst.0, worst.1
    );
}

#[test]
fn swiglu_backward_matches_finite_differences() {
    // The whole buffer's gradients from one backward call, each element checked against the
    // central difference of its own term `r_e · h_e` (the tails' terms, up to ~1000, would
    // swamp a summed loss's differences in rounding).
    let mut gc = GradCheck::new("swiglu");
    let n = 300;
    let (g, u) = swiglu_inputs(n, 50);
    let r: Vec<f64> = randn(&mut Rng::new(51), n, 1.0);
    let (mut dg, mut du) = (vec![f64::NAN; n], vec![f64::NAN; n]);
    swiglu_backward(&mut dg, &mut du, &r, &g, &u);
    let term = |g: f64, u: f64, r: f64| {
        let mut h = [0.0];
        swiglu_forward(&mut h, &[g], &[u]);
        h[0] * r
    };
    for e in 0..n {
        gc.wrt_input(&format!("gate[{e}] "), &[g[e]], &[dg[e]], |x| {
            term(x[0], u[e], r[e])
        });
        gc.wrt_input(&format!("up[{e}] "), &[u[e]], &[du[e]], |x| {
            term(g[e], x[0], r[e])
        });
    }
    gc.report();
}

#[test]
fn swiglu_backward_is_finite_and_matches_f64_in_f32() {
    // f32 gradients (serial and parallel paths) against the f64 kernel, whose backward the
    // finite differences checked; the tails give exact limits: silu' → 1 and → 0.
    for n in [61, 40_000] {
        let (g, u) = swiglu_inputs(n, 60 + n as u64);
        let dh: Vec<f64> = randn(&mut Rng::new(61), n, 1.0);
        let f = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<f32>>();
        let (g32, u32, dh32) = (f(&g), f(&u), f(&dh));
        let wide = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<f64>>();
        let (mut dg, mut du) = (vec![0.0; n], vec![0.0; n]);
        swiglu_backward(&mut dg, &mut du, &wide(&dh32), &wide(&g32), &wide(&u32));
        let (mut dg32, mut du32) = (vec![f32::NAN; n], vec![f32::NAN; n]);
        swiglu_backward(&mut dg32, &mut du32, &dh32, &g32, &u32);
        assert!(dg32.iter().chain(&du32).all(|x| x.is_finite()));
        let w = assert_close("dgate f32", &dg32, &dg, 1e-5, 1e-6)
            .max(assert_close("dup f32", &du32, &du, 1e-5, 1e-6));
        eprintln!("swiglu backward f32 vs f64, n = {n}: worst diff/allowance {w:.3}");
    }
    let (mut dg, mut du) = ([f64::NAN; 2], [f64::NAN; 2]);
    swiglu_backward(
        &mut dg,
        &mut du,
        &[1.0, 1.0],
        &[1000.0, -1000.0],
        &[3.0, 3.0],
    );
    assert_eq!((dg, du), ([3.0, 0.0], [1000.0, 0.0]));
}
