//! Data-parallel training (`train::data_parallel`): two halves of each batch on the model and a
//! replica train like the whole batch on one model, and the run stays deterministic; for the
//! encoder-decoder trainer and the language-model trainer.

use transformer::model::Module;
use transformer::model::{ModelConfig, Param};
use transformer::train::pairs::{Example, TrainConfig};
use transformer::train::trainer::{LmTrainer, PairTrainer};
use transformer::train::windows::LmTrainConfig;

fn examples() -> Vec<Example> {
    (0..48u32)
        .map(|i| Example {
            src: (0..(3 + i % 6)).map(|j| 4 + (i * 7 + j) % 25).collect(),
            tgt: (0..(2 + i % 5)).map(|j| 4 + (i * 3 + j * 5) % 25).collect(),
        })
        .collect()
}

fn configs(dropout: f64) -> (ModelConfig, TrainConfig) {
    let mut m = ModelConfig::preset("tiny", 30).unwrap();
    (m.d_model, m.n_heads, m.d_ff) = (32, 4, 64);
    (m.dropout, m.attention_dropout, m.activation_dropout) = (dropout, dropout, dropout);
    let t = TrainConfig {
        tokens_per_batch: 160,
        warmup: 10,
        accumulate: 2,
        word_dropout: dropout,
        seed: 9,
        ..TrainConfig::default()
    };
    (m, t)
}

/// What a run leaves: the losses of its updates, the weights after them, the last gradients.
type Outcome = (Vec<f64>, Vec<f32>, Vec<f32>);

/// `losses` with the model's weights and gradients, flattened in parameter order.
fn outcome(losses: Vec<f64>, params: Vec<(String, &mut Param<f32>)>) -> Outcome {
    let weights = params
        .iter()
        .flat_map(|(_, p)| p.value.data.clone())
        .collect();
    let grads = params
        .iter()
        .flat_map(|(_, p)| p.grad.data.clone())
        .collect();
    (losses, weights, grads)
}

/// The encoder-decoder trainer over `steps` updates.
fn run(parallel: bool, dropout: f64, steps: usize) -> Outcome {
    let (m, t) = configs(dropout);
    let mut trainer = PairTrainer::new(m, t, examples()).unwrap();
    trainer.set_data_parallel(parallel);
    let losses = (0..steps).map(|_| trainer.step().unwrap().loss).collect();
    outcome(losses, trainer.model.params_mut())
}

/// The language-model trainer over `steps` updates.
fn run_lm(parallel: bool, dropout: f64, steps: usize) -> Outcome {
    let (mut m, _) = configs(dropout);
    m.max_len = 16;
    let tokens: Vec<u32> = (0..600u32).map(|i| 4 + (i * 7 + i / 5) % 26).collect();
    let config = LmTrainConfig {
        context: 12,
        batch: 5, // odd: halves of 3 and 2 windows
        lr: 3e-3,
        warmup: 2,
        total_steps: 10,
        seed: 4,
        ..LmTrainConfig::default()
    };
    let mut trainer = LmTrainer::new(m, config, tokens).unwrap();
    trainer.set_data_parallel(parallel);
    let losses = (0..steps).map(|_| trainer.step().unwrap().loss).collect();
    outcome(losses, trainer.model.params_mut())
}

/// Without dropout the two ways differ only in how the batch's sums are split. The first
/// update's gradients (the whole model's, gathered from both halves) agree to rounding.
fn check_halves_train_like_the_whole_batch(run: fn(bool, f64, usize) -> Outcome) {
    let (_, _, whole_grads) = run(false, 0.0, 1);
    let (_, _, half_grads) = run(true, 0.0, 1);
    let largest = whole_grads.iter().fold(0f32, |m, g| m.max(g.abs()));
    let worst = whole_grads
        .iter()
        .zip(&half_grads)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        largest > 0.0 && worst < 1e-5 * largest,
        "{worst} of {largest}"
    );
    // ... and they really are two ways: the rounding differs somewhere.
    assert!(
        whole_grads != half_grads,
        "both runs took the single-model path"
    );
    // Over several updates the losses stay together (Adam's first steps move every weight by
    // about ±lr whatever its gradient's size, so tiny gradients' rounding can flip a step's
    // sign: the weights are not compared).
    let (whole_losses, _, _) = run(false, 0.0, 6);
    let (half_losses, _, _) = run(true, 0.0, 6);
    for (i, (a, b)) in whole_losses.iter().zip(&half_losses).enumerate() {
        assert!((a - b).abs() < 1e-4 * a.abs(), "step {}: {a} vs {b}", i + 1);
    }
    // The run trained: the loss fell.
    assert!(half_losses[5] < half_losses[0], "{half_losses:?}");
}

/// Two data-parallel runs with dropout are identical, and their dropout really differs from
/// the single-model run's draws.
fn check_runs_with_dropout_are_deterministic(run: fn(bool, f64, usize) -> Outcome) {
    let (losses_a, weights_a, _) = run(true, 0.2, 4);
    let (losses_b, weights_b, _) = run(true, 0.2, 4);
    assert_eq!(losses_a, losses_b);
    assert_eq!(weights_a, weights_b);
    let (losses_single, _, _) = run(false, 0.2, 4);
    assert_ne!(losses_a, losses_single);
}

#[test]
fn halves_on_a_replica_train_like_the_whole_batch() {
    check_halves_train_like_the_whole_batch(run);
}

#[test]
fn data_parallel_runs_with_dropout_are_deterministic() {
    check_runs_with_dropout_are_deterministic(run);
}

#[test]
fn language_model_halves_train_like_the_whole_batch() {
    check_halves_train_like_the_whole_batch(run_lm);
}

#[test]
fn language_model_data_parallel_runs_with_dropout_are_deterministic() {
    check_runs_with_dropout_are_deterministic(run_lm);
}
