//! A short fine-tune after pruning (Michel et al. 2019 retrain the pruned model; issue 28's
//! "train --resume-style"): Adam from fresh moments (the paper's β₁ = 0.9, β₂ = 0.98, ε = 10⁻⁹)
//! at a constant learning rate, the global gradient norm clipped to 1, on windows of a text
//! visited in an order drawn from a seed, without dropout. A pruned model has no optimizer
//! state of its own (its matrices changed shape), so there is nothing to resume from: this is
//! `train-lm`'s update on the pruned weights.

use crate::error::{Error, Result};
use crate::model::{LanguageModel, Module};
use crate::rng::Rng;
use crate::train::adam::{guarded_update, Adam, AdamConfig};

/// How the fine-tune runs.
#[derive(Clone, Copy, Debug)]
pub struct FineTune {
    /// Updates.
    pub steps: usize,
    /// Windows per update.
    pub batch: usize,
    /// Adam's learning rate (constant).
    pub lr: f64,
    /// The order the windows are visited in.
    pub seed: u64,
}

/// Fine-tunes `model` on `windows` (each `seq + 1` tokens: inputs and next tokens, all of one
/// length); returns the mean loss per token of each update's batch, before the update.
pub fn fine_tune_lm(
    model: &mut LanguageModel<f32>,
    windows: &[Vec<u32>],
    plan: FineTune,
) -> Result<Vec<f64>> {
    if windows.is_empty() || plan.batch == 0 {
        return Err(Error::Input(
            "fine-tuning needs at least one window of text and a positive batch".into(),
        ));
    }
    if !(plan.lr.is_finite() && plan.lr > 0.0) {
        return Err(Error::Input(format!(
            "--lr {}: the learning rate must be positive",
            plan.lr
        )));
    }
    model.zero_grads();
    let mut adam = Adam::new(AdamConfig::default(), &model.params_mut());
    let mut rng = Rng::new(plan.seed);
    let mut order: Vec<usize> = Vec::new();
    let mut losses = Vec::with_capacity(plan.steps);
    for step in 0..plan.steps {
        let (mut tokens, mut targets) = (Vec::new(), Vec::new());
        for _ in 0..plan.batch {
            if order.is_empty() {
                order = (0..windows.len()).collect();
                rng.shuffle(&mut order);
            }
            let w = &windows[order.pop().expect("refilled when empty")];
            tokens.extend_from_slice(&w[..w.len() - 1]);
            targets.extend_from_slice(&w[1..]);
        }
        let scale = 1.0 / targets.len() as f64;
        let stats = model.forward_backward(&tokens, &targets, plan.batch, 0.0, scale, None);
        let loss = stats.loss_sum * scale;
        let mut params = model.params_mut();
        guarded_update(&mut adam, &mut params, Some(1.0), plan.lr, step as u64, loss)?;
        drop(params);
        model.zero_grads();
        losses.push(loss);
    }
    Ok(losses)
}
