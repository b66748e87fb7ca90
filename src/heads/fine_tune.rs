//! A short fine-tune after pruning (Michel et al. 2019 retrain the pruned model; issue 28's
//! "train --resume-style"): Adam from fresh moments (the paper's β₁ = 0.9, β₂ = 0.98, ε = 10⁻⁹)
//! at a constant learning rate, the global gradient norm clipped to 1, on examples of a data
//! set visited in an order drawn from a seed, without dropout. A pruned model has no optimizer
//! state of its own (its matrices changed shape), so there is nothing to resume from: this is
//! the training update on the pruned weights, for a language model (windows of text, the
//! next-token loss) or a translation model (sentence pairs, the label-smoothed loss of
//! section 5.4).

use crate::batch::Batch;
use crate::error::{Error, Result};
use crate::model::{LanguageModel, Module, Seq2Seq};
use crate::rng::Rng;
use crate::train::adam::{guarded_update, Adam, AdamConfig};

/// How the fine-tune runs.
#[derive(Clone, Copy, Debug)]
pub struct FineTune {
    /// Updates.
    pub steps: usize,
    /// Examples (windows or sentence pairs) per update.
    pub batch: usize,
    /// Adam's learning rate (constant).
    pub lr: f64,
    /// The order the examples are visited in.
    pub seed: u64,
}

/// Fine-tunes `model` on `windows` (each `seq + 1` tokens: inputs and next tokens, all of one
/// length); returns the mean loss per token of each update's batch, before the update.
pub fn fine_tune_lm(
    model: &mut LanguageModel<f32>,
    windows: &[Vec<u32>],
    plan: FineTune,
) -> Result<Vec<f64>> {
    model.config.check_trainable().map_err(Error::Input)?;
    fine_tune(model, windows, plan, |model, group| {
        let (mut tokens, mut targets) = (Vec::new(), Vec::new());
        for w in group {
            tokens.extend_from_slice(&w[..w.len() - 1]);
            targets.extend_from_slice(&w[1..]);
        }
        let scale = 1.0 / targets.len() as f64;
        let stats = model.forward_backward(&tokens, &targets, group.len(), 0.0, scale, None);
        stats.loss_sum * scale
    })
}

/// Fine-tunes the translation model `model` on `pairs` (source ids, target ids, without the
/// end token) with the loss smoothed by `label_smoothing` (ε_ls); returns the mean smoothed
/// loss per target token of each update's batch, before the update.
pub fn fine_tune_seq2seq(
    model: &mut Seq2Seq<f32>,
    pairs: &[(Vec<u32>, Vec<u32>)],
    plan: FineTune,
    label_smoothing: f64,
) -> Result<Vec<f64>> {
    if !(0.0..1.0).contains(&label_smoothing) {
        return Err(Error::Input(format!(
            "--label-smoothing {label_smoothing}: must be in [0, 1)"
        )));
    }
    model.config.check_trainable().map_err(Error::Input)?;
    fine_tune(model, pairs, plan, |model, group| {
        let refs: Vec<(&[u32], &[u32])> = group.iter().map(|(s, t)| (&s[..], &t[..])).collect();
        let batch = Batch::from_pairs(&refs);
        let tokens: usize = batch.tgt_lens.iter().sum();
        let scale = 1.0 / tokens.max(1) as f64;
        let stats = model.forward_backward(&batch, label_smoothing, scale, None);
        stats.loss_sum * scale
    })
}

/// The update loop both shapes share: `plan.steps` updates, each on `plan.batch` examples drawn
/// from `examples` in a seeded order that is reshuffled whenever it runs out;
/// `forward_backward(model, batch)` accumulates the gradients of the batch's mean loss and
/// returns that loss.
fn fine_tune<M: Module<f32>, E>(
    model: &mut M,
    examples: &[E],
    plan: FineTune,
    mut forward_backward: impl FnMut(&mut M, &[&E]) -> f64,
) -> Result<Vec<f64>> {
    if examples.is_empty() || plan.batch == 0 {
        return Err(Error::Input(
            "fine-tuning needs at least one example and a positive batch".into(),
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
        let mut group = Vec::with_capacity(plan.batch);
        for _ in 0..plan.batch {
            if order.is_empty() {
                order = (0..examples.len()).collect();
                rng.shuffle(&mut order);
            }
            group.push(&examples[order.pop().expect("refilled when empty")]);
        }
        let loss = forward_backward(model, &group);
        let mut params = model.params_mut();
        guarded_update(&mut adam, &mut params, Some(1.0), plan.lr, step as u64, loss)?;
        drop(params);
        model.zero_grads();
        losses.push(loss);
    }
    Ok(losses)
}
