//! What training needs of a model beyond what every model has (construction, checkpoint
//! directory and parameter walk: [`Model`] and [`Module`](crate::model::Module)): a copy of it
//! (for data parallelism) and forward and backward on one part of a batch. The encoder-decoder (`Seq2Seq<f32>`, parts: padded [`Batch`]es of sentence pairs)
//! and the decoder-only language model (`LanguageModel<f32>`, parts: [`Windows`] of a token
//! stream) have it; everything specific to one of them stays in its impl here.

use crate::batch::Batch;
use crate::kernels::lowp::bf16_train::Bf16Kernel;
use crate::model::loss::LossStats;
use crate::model::{LanguageModel, Model, ModelConfig, Seq2Seq};
use crate::rng::Rng;
use crate::train::windows::Windows;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::borrow::Borrow;

/// A model the trainer and data parallelism can train: a [`Model`] (config, construction,
/// checkpoint directory; its parameters through [`Module`](crate::model::Module)) that can be
/// copied and runs forward and backward on one part of a batch. Its config is a
/// [`ModelConfig`], or holds one (the shape the data sources check against, whose `d_model`
/// the schedule reads): a sentence classifier's is its encoder's plus its labels.
pub trait Trainable:
    Model<Config: Borrow<ModelConfig> + Serialize + DeserializeOwned> + Clone + Send
{
    /// One part of a batch, as [`forward_backward`](Self::forward_backward) takes it.
    type Part: Sync;

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

    /// The linear layers multiply bf16-rounded operands with `kernel`, or float32 ones (`None`;
    /// see [`crate::train::precision`]).
    fn set_bf16_products(&mut self, kernel: Option<Bf16Kernel>);
}

impl Trainable for Seq2Seq<f32> {
    type Part = Batch;

    fn forward_backward(
        &mut self,
        batch: &Batch,
        label_smoothing: f64,
        grad_scale: f64,
        rng: &mut Rng,
    ) -> LossStats {
        Seq2Seq::forward_backward(self, batch, label_smoothing, grad_scale, Some(rng))
    }

    fn set_bf16_products(&mut self, kernel: Option<Bf16Kernel>) {
        Seq2Seq::set_bf16_products(self, kernel)
    }
}

impl Trainable for LanguageModel<f32> {
    type Part = Windows;

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

    fn set_bf16_products(&mut self, kernel: Option<Bf16Kernel>) {
        LanguageModel::set_bf16_products(self, kernel)
    }
}

impl Trainable for crate::model::masked_lm::MaskedLm<f32> {
    type Part = crate::train::mlm::MlmBatch;

    fn forward_backward(
        &mut self,
        b: &crate::train::mlm::MlmBatch,
        label_smoothing: f64,
        grad_scale: f64,
        rng: &mut Rng,
    ) -> LossStats {
        crate::model::masked_lm::MaskedLm::forward_backward(
            self,
            &b.inputs,
            b.count,
            &b.positions,
            &b.labels,
            label_smoothing,
            grad_scale,
            Some(rng),
        )
    }

    fn set_bf16_products(&mut self, kernel: Option<Bf16Kernel>) {
        crate::model::linear::set_bf16_products_all(self, kernel)
    }
}

impl Trainable for crate::model::sentence_classifier::SentenceClassifier<f32> {
    type Part = crate::train::classify::ClassifyBatch;

    fn forward_backward(
        &mut self,
        b: &crate::train::classify::ClassifyBatch,
        label_smoothing: f64,
        grad_scale: f64,
        rng: &mut Rng,
    ) -> LossStats {
        crate::model::sentence_classifier::SentenceClassifier::forward_backward(
            self,
            &b.ids,
            &b.lens,
            &b.labels,
            label_smoothing,
            grad_scale,
            Some(rng),
        )
    }

    fn set_bf16_products(&mut self, kernel: Option<Bf16Kernel>) {
        crate::model::linear::set_bf16_products_all(self, kernel)
    }
}
