//! What training needs of a model: initialise, load and save it, walk its parameters, clear
//! their gradients, copy it (for data parallelism) and run forward and backward on one part of
//! a batch. The encoder-decoder (`Seq2Seq<f32>`, parts: padded [`Batch`]es of sentence pairs)
//! and the decoder-only language model (`LanguageModel<f32>`, parts: [`Windows`] of a token
//! stream) have it; everything specific to one of them stays in its impl here.

use crate::batch::Batch;
use crate::error::Result;
use crate::model::checkpoint as model_checkpoint;
use crate::model::loss::LossStats;
use crate::model::{LanguageModel, ModelConfig, Param, Seq2Seq};
use crate::rng::Rng;
use crate::train::windows::Windows;
use std::path::Path;

/// A model the trainer and data parallelism can train.
pub trait Trainable: Clone + Send {
    /// One part of a batch, as [`forward_backward`](Self::forward_backward) takes it.
    type Part: Sync;

    /// A fresh model of shape `config`, its weights drawn from `rng`.
    fn init(config: ModelConfig, rng: &mut Rng) -> Self;
    /// The model saved in `dir` (config and weights).
    fn load(dir: &Path) -> Result<Self>;
    /// Writes config and weights into `dir`.
    fn save(&mut self, dir: &Path) -> Result<()>;
    /// The model's shape.
    fn config(&self) -> &ModelConfig;
    /// Every parameter with its name, in a fixed order (Adam's moments follow it).
    fn parameters(&mut self) -> Vec<(String, &mut Param<f32>)>;
    /// Zeroes every gradient.
    fn clear_grads(&mut self);
    /// Forward and backward over `part` with dropout drawn from `rng`: gradients of
    /// `grad_scale ·` the summed label-smoothed loss are added to the parameters'; returns the
    /// loss sums.
    fn forward_backward(
        &mut self,
        part: &Self::Part,
        label_smoothing: f64,
        grad_scale: f64,
        rng: &mut Rng,
    ) -> LossStats;
}

impl Trainable for Seq2Seq<f32> {
    type Part = Batch;

    fn init(config: ModelConfig, rng: &mut Rng) -> Self {
        Seq2Seq::new(config, rng)
    }
    fn load(dir: &Path) -> Result<Self> {
        model_checkpoint::load_model(dir)
    }
    fn save(&mut self, dir: &Path) -> Result<()> {
        model_checkpoint::save_model(dir, self)
    }
    fn config(&self) -> &ModelConfig {
        &self.config
    }
    fn parameters(&mut self) -> Vec<(String, &mut Param<f32>)> {
        self.params_mut()
    }
    fn clear_grads(&mut self) {
        self.zero_grads()
    }
    fn forward_backward(
        &mut self,
        batch: &Batch,
        label_smoothing: f64,
        grad_scale: f64,
        rng: &mut Rng,
    ) -> LossStats {
        Seq2Seq::forward_backward(self, batch, label_smoothing, grad_scale, Some(rng))
    }
}

impl Trainable for LanguageModel<f32> {
    type Part = Windows;

    fn init(config: ModelConfig, rng: &mut Rng) -> Self {
        LanguageModel::new(config, rng)
    }
    fn load(dir: &Path) -> Result<Self> {
        model_checkpoint::load_language_model(dir)
    }
    fn save(&mut self, dir: &Path) -> Result<()> {
        model_checkpoint::save_language_model(dir, self)
    }
    fn config(&self) -> &ModelConfig {
        &self.config
    }
    fn parameters(&mut self) -> Vec<(String, &mut Param<f32>)> {
        self.params_mut()
    }
    fn clear_grads(&mut self) {
        self.zero_grads()
    }
    fn forward_backward(
        &mut self,
        w: &Windows,
        label_smoothing: f64,
        grad_scale: f64,
        rng: &mut Rng,
    ) -> LossStats {
        LanguageModel::forward_backward(
            self,
            &w.inputs,
            &w.targets,
            w.count,
            label_smoothing,
            grad_scale,
            Some(rng),
        )
    }
}
