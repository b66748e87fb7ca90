//! bf16 mixed-precision training (`--precision bf16`): each product of a linear layer against
//! a float64 loop over the bf16-rounded operands, the f64 reference path left alone, a step's
//! gradients against float32's, short runs of both model shapes against float32's, and the
//! precision kept by a checkpoint (a resumed bf16 run continues bit for bit).
use crate::common;

use transformer::batch::Batch;
use transformer::kernels::lowp::bf16_train::Bf16Kernel;
use transformer::kernels::lowp::round_to_bf16;
use transformer::model::linear::Linear;
use transformer::model::{ModelConfig, Module, NormPlacement, Seq2Seq};
use transformer::rng::Rng;
use transformer::train::pairs::TrainConfig;
use transformer::train::precision::TrainPrecision;
use transformer::train::trainer::{LmTrainer, PairTrainer};
use transformer::train::windows::LmTrainConfig;

fn r16(x: f32) -> f64 {
    f64::from(round_to_bf16(x))
}

/// Every way of multiplying this machine runs: the f32 gemm over rounded operands, the packed
/// portable kernel (forced, so it runs everywhere) and the AVX-512 BF16 one where the CPU has it.
fn kernels() -> Vec<Bf16Kernel> {
    let mut k = vec![Bf16Kernel::Gemm, Bf16Kernel::parse("portable").unwrap()];
    k.extend(Bf16Kernel::parse("avx512").ok());
    k
}

/// A layer with random weight and bias (in [-0.5, 0.5)), bf16 products with `kernel`.
fn layer(d_in: usize, d_out: usize, seed: u64, kernel: Bf16Kernel) -> Linear<f32> {
    let mut rng = Rng::new(seed);
    let mut l = Linear::<f32>::new(d_in, d_out, &mut rng);
    for (_, p) in l.params_mut() {
        for v in &mut p.value.data {
            *v = rng.uniform() as f32 - 0.5;
        }
    }
    l.set_bf16_products(Some(kernel));
    l
}

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| (rng.uniform() * 2.0 - 1.0) as f32).collect()
}

/// `got` against `Σ_k a(k) b(k)` (+ `base`) in f64, within f32 rounding of the `k`-term sum.
fn check_sum(what: &str, got: f32, base: f64, terms: impl Iterator<Item = f64>) {
    let (mut want, mut mag, mut n) = (base, base.abs(), 0usize);
    for t in terms {
        want += t;
        mag += t.abs();
        n += 1;
    }
    let tol = (n as f64 + 2.0) * f64::from(f32::EPSILON) * mag + 1e-30;
    assert!(
        (f64::from(got) - want).abs() <= tol,
        "{what}: {got} against f64 {want} (tol {tol:e})"
    );
}

#[test]
fn linear_products_match_f64_loops_over_bf16_rounded_operands() {
    // Rows: a decoding-sized product (the matrix-vector path) and gemm-sized ones.
    let shapes = [(1, 40, 7), (3, 33, 65), (70, 96, 130), (129, 257, 31)];
    let cases = kernels()
        .into_iter()
        .flat_map(|k| shapes.iter().map(move |s| (k, s)));
    for (kernel, &(rows, d_in, d_out)) in cases {
        let mut l = layer(d_in, d_out, rows as u64, kernel);
        let x = random(rows * d_in, 10 + rows as u64);
        let dy = random(rows * d_out, 20 + rows as u64);
        let w = l.weight.value.data.clone();
        let b = l.bias.as_ref().unwrap().value.data.clone();
        let grad0 = random(d_out * d_in, 30);
        l.weight.grad.data.copy_from_slice(&grad0);

        let y = l.forward(&x);
        for r in 0..rows {
            for o in 0..d_out {
                let terms = (0..d_in).map(|k| r16(x[r * d_in + k]) * r16(w[o * d_in + k]));
                check_sum(
                    &format!("{kernel:?}: y[{r},{o}] ({rows}x{d_in}x{d_out})"),
                    y[r * d_out + o],
                    f64::from(b[o]),
                    terms,
                );
            }
        }
        let dx = l.backward(&x, &dy);
        for r in 0..rows {
            for k in 0..d_in {
                let terms = (0..d_out).map(|o| r16(dy[r * d_out + o]) * r16(w[o * d_in + k]));
                check_sum(
                    &format!("{kernel:?}: dx[{r},{k}]"),
                    dx[r * d_in + k],
                    0.0,
                    terms,
                );
            }
        }
        for o in 0..d_out {
            for k in 0..d_in {
                let terms = (0..rows).map(|r| r16(dy[r * d_out + o]) * r16(x[r * d_in + k]));
                let base = f64::from(grad0[o * d_in + k]);
                check_sum(
                    &format!("{kernel:?}: dW[{o},{k}]"),
                    l.weight.grad.data[o * d_in + k],
                    base,
                    terms,
                );
            }
        }
        // The bias gradient is a sum of the f32 dy, not a product: no rounding.
        let db = &l.bias.as_ref().unwrap().grad.data;
        for o in 0..d_out {
            let terms = (0..rows).map(|r| f64::from(dy[r * d_out + o]));
            check_sum(&format!("db[{o}]"), db[o], 0.0, terms);
        }
    }
}

#[test]
fn the_rounded_weight_follows_every_change_of_the_weight() {
    let (rows, d_in, d_out) = (9, 20, 6);
    for kernel in kernels() {
        let mut l = layer(d_in, d_out, 1, kernel);
        let x = random(rows * d_in, 2);
        let before = l.forward(&x);
        // An optimizer step changes the weight through the parameter walk.
        for (_, p) in l.params_mut() {
            p.value.data.iter_mut().for_each(|v| *v *= -2.0);
        }
        let after = l.forward(&x);
        let w = &l.weight.value.data;
        let b = &l.bias.as_ref().unwrap().value.data;
        for r in 0..rows {
            for o in 0..d_out {
                let terms = (0..d_in).map(|k| r16(x[r * d_in + k]) * r16(w[o * d_in + k]));
                check_sum(
                    "y after the change",
                    after[r * d_out + o],
                    f64::from(b[o]),
                    terms,
                );
            }
        }
        assert_ne!(before, after);
    }
}

#[test]
fn f64_layers_stay_f64_with_bf16_products_on() {
    // The gradient checks run the f64 reference path: bf16 must not touch it.
    let (rows, d_in, d_out) = (5, 12, 7);
    let mut rng = Rng::new(3);
    let mut plain = Linear::<f64>::new(d_in, d_out, &mut rng);
    let mut bf16 = plain.clone();
    bf16.set_bf16_products(Some(Bf16Kernel::Gemm));
    let x: Vec<f64> = (0..rows * d_in).map(|i| (i as f64 * 0.37).sin()).collect();
    let dy: Vec<f64> = (0..rows * d_out).map(|i| (i as f64 * 0.11).cos()).collect();
    assert_eq!(plain.forward(&x), bf16.forward(&x));
    assert_eq!(plain.backward(&x, &dy), bf16.backward(&x, &dy));
    assert_eq!(plain.weight.grad.data, bf16.weight.grad.data);
}

fn tiny_model(vocab: usize) -> ModelConfig {
    let mut m = ModelConfig::preset("tiny", vocab).unwrap();
    (m.d_model, m.n_heads, m.d_ff) = (32, 4, 64);
    m
}

#[test]
fn a_bf16_steps_gradients_are_float32_s_within_bf16_rounding() {
    for kernel in kernels() {
        step_gradients_against_f32(kernel);
    }
}

fn step_gradients_against_f32(kernel: Bf16Kernel) {
    let mut rng = Rng::new(7);
    let mut f32_model = Seq2Seq::<f32>::new(tiny_model(24), &mut rng);
    let mut bf16_model = f32_model.clone();
    bf16_model.set_bf16_products(Some(kernel));
    let examples = common::toy_examples(12);
    let pairs: Vec<(&[u32], &[u32])> = examples.iter().map(|e| (&e.src[..], &e.tgt[..])).collect();
    let batch = Batch::from_pairs(&pairs);
    let s32 = f32_model.forward_backward(&batch, 0.1, 1.0, None);
    let s16 = bf16_model.forward_backward(&batch, 0.1, 1.0, None);
    let rel_loss = (s16.loss() - s32.loss()).abs() / s32.loss();
    assert!(
        rel_loss < 5e-3,
        "loss {} against f32 {}",
        s16.loss(),
        s32.loss()
    );
    let (g32, g16): (Vec<_>, Vec<_>) = (
        f32_model
            .params_mut()
            .into_iter()
            .map(|(n, p)| (n, p.grad.data.clone()))
            .collect(),
        bf16_model
            .params_mut()
            .into_iter()
            .map(|(_, p)| p.grad.data.clone())
            .collect(),
    );
    let sq = |v: &[f32]| v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>();
    let sq_diff = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
            .sum::<f64>()
    };
    let norm = g32.iter().map(|(_, g)| sq(g)).sum::<f64>().sqrt();
    let diff = g32
        .iter()
        .zip(&g16)
        .map(|((_, a), b)| sq_diff(a, b))
        .sum::<f64>()
        .sqrt();
    let any_diff = g32.iter().zip(&g16).any(|((_, a), b)| a != b);
    for ((name, a), b) in g32.iter().zip(&g16) {
        // bf16 keeps 8 significant bits (relative rounding 2^-9 per operand): each tensor's
        // gradient stays within a few percent of float32's, or of the overall norm for the
        // ones that are zero up to rounding (the key projections' bias).
        let (d, n) = (sq_diff(a, b).sqrt(), sq(a).sqrt());
        assert!(
            d <= 0.05 * n + 1e-3 * norm,
            "{kernel:?} {name}: |g_bf16 - g_f32| = {d:e} against |g_f32| = {n:e}"
        );
    }
    assert!(
        diff <= 0.02 * norm,
        "{kernel:?}: overall {diff:e} / {norm:e}"
    );
    assert!(
        any_diff,
        "bf16 products changed nothing: the mode is not in effect"
    );
}

fn pair_recipe(precision: TrainPrecision) -> TrainConfig {
    TrainConfig {
        tokens_per_batch: 120,
        warmup: 10,
        accumulate: 2,
        clip_norm: Some(1.0),
        seed: 5,
        precision,
        ..TrainConfig::default()
    }
}

#[test]
fn a_short_bf16_run_on_a_toy_task_ends_near_the_float32_loss() {
    let run = |precision, kernel| {
        let mut t = PairTrainer::new(
            tiny_model(24),
            pair_recipe(precision),
            common::toy_examples(60),
        )
        .unwrap();
        t.set_bf16_kernel(kernel);
        let losses: Vec<f64> = (0..40).map(|_| t.step().unwrap().loss).collect();
        losses
    };
    let l32 = run(TrainPrecision::F32, Bf16Kernel::Gemm);
    let l16 = run(TrainPrecision::Bf16, Bf16Kernel::Gemm);
    // The packed portable kernel, forced: the same run up to the order of the f32 sums.
    let portable = run(TrainPrecision::Bf16, Bf16Kernel::parse("portable").unwrap());
    let tail = |l: &[f64]| l[l.len() - 5..].iter().sum::<f64>() / 5.0;
    let rel_portable = (tail(&portable) - tail(&l16)).abs() / tail(&l16);
    assert!(
        rel_portable < 0.03,
        "portable {} against gemm {}",
        tail(&portable),
        tail(&l16)
    );
    assert!(tail(&l32) < 0.85 * l32[0], "f32 did not learn: {l32:?}");
    assert_near_f32(&l32, &l16);
    assert_ne!(l16, l32, "bf16 products changed nothing");
}

#[test]
fn a_short_bf16_language_model_run_ends_near_the_float32_loss() {
    let mut m = ModelConfig::preset("tiny", 30).unwrap();
    (m.d_model, m.n_heads, m.d_ff) = (32, 2, 64);
    (m.n_encoder_layers, m.n_decoder_layers, m.max_len) = (0, 2, 16);
    m.norm = NormPlacement::PreLn;
    let stream: Vec<u32> = (0..600u32).map(|i| 4 + (i * 7 + i / 5) % 26).collect();
    let run = |precision| {
        let recipe = LmTrainConfig {
            context: 12,
            batch: 4,
            lr: 3e-3,
            warmup: 5,
            total_steps: 40,
            precision,
            ..LmTrainConfig::default()
        };
        let mut t = LmTrainer::new(m.clone(), recipe, stream.clone()).unwrap();
        (0..40)
            .map(|_| t.step().unwrap().loss)
            .collect::<Vec<f64>>()
    };
    let (l32, l16) = (run(TrainPrecision::F32), run(TrainPrecision::Bf16));
    let tail = |l: &[f64]| l[l.len() - 5..].iter().sum::<f64>() / 5.0;
    assert!(tail(&l32) < 0.7 * l32[0], "f32 did not learn: {l32:?}");
    assert_near_f32(&l32, &l16);
}

#[test]
fn a_resumed_bf16_run_keeps_its_precision_and_continues_bit_for_bit() {
    let (m, t) = (tiny_model(24), pair_recipe(TrainPrecision::Bf16));
    let examples = || common::toy_examples(60);
    let mut straight = PairTrainer::new(m.clone(), t.clone(), examples()).unwrap();
    let losses: Vec<f64> = (0..10).map(|_| straight.step().unwrap().loss).collect();
    // Same seed, same run (determinism), then through a checkpoint.
    let dir = tempfile::tempdir().unwrap();
    let mut first = PairTrainer::new(m.clone(), t, examples()).unwrap();
    for want in &losses[..4] {
        assert_eq!(first.step().unwrap().loss.to_bits(), want.to_bits());
    }
    first.save(dir.path()).unwrap();
    drop(first);
    let state = std::fs::read_to_string(dir.path().join("trainer_state.json")).unwrap();
    assert!(state.contains("\"precision\": \"bf16\""), "{state}");
    let mut resumed = PairTrainer::resume(dir.path(), examples()).unwrap();
    assert_eq!(resumed.state.config.precision, TrainPrecision::Bf16);
    for (i, want) in losses[4..].iter().enumerate() {
        let got = resumed.step().unwrap().loss;
        assert_eq!(got.to_bits(), want.to_bits(), "step {}", i + 5);
    }
    // And an f32 recipe's file has no precision field (its layout as before the option).
    let mut f32_run = PairTrainer::new(m, pair_recipe(TrainPrecision::F32), examples()).unwrap();
    let f32_first = f32_run.step().unwrap().loss;
    assert_ne!(
        f32_first.to_bits(),
        losses[0].to_bits(),
        "bf16 changed nothing"
    );
    let dir32 = tempfile::tempdir().unwrap();
    f32_run.save(dir32.path()).unwrap();
    let state32 = std::fs::read_to_string(dir32.path().join("trainer_state.json")).unwrap();
    assert!(!state32.contains("precision"), "{state32}");
}

/// The mean of the last 5 losses of the bf16 run within 3% of the f32 run's.
fn assert_near_f32(l32: &[f64], l16: &[f64]) {
    let tail = |l: &[f64]| l[l.len() - 5..].iter().sum::<f64>() / 5.0;
    let rel = (tail(l16) - tail(l32)).abs() / tail(l32);
    eprintln!(
        "last 5 of 40 updates, mean loss: f32 {:.4}, bf16 {:.4}",
        tail(l32),
        tail(l16)
    );
    assert!(
        rel < 0.03,
        "bf16 {} against f32 {} ({l16:?})",
        tail(l16),
        tail(l32)
    );
}
