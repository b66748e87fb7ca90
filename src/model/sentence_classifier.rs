//! BERT fine-tuned for sentence classification (Devlin et al., 2019, section 4.1): the encoder
//! ([`super::bert_train`]) reads `[CLS] sentence [SEP]`, the [`ClassifierHead`] pools its last
//! hidden states into one vector and maps it to the labels' logits:
//!
//! `h = Encoder(ids)`, `z = ClassifierHead(h)`, `L = −log softmax(z)[y]` per sentence,
//!
//! and every weight (encoder and head) is trained. Sentences of a batch are padded to the
//! longest; padding keys are masked, and the head reads real rows only.
//!
//! The directory is ours: `config.json` holds a [`ClassifierConfig`] (the encoder's
//! [`ModelConfig`] — the masked-LM encoder's shape, [`super::masked_lm::check_mlm_config`] —
//! the number of labels, the pooling, the head's dropout and the truncation length), tensors
//! `bert.word_embeddings.weight`, …, `head.pooler.weight`, `head.classifier.weight`, …. The
//! labels' names are the caller's (`labels.json`, see `train::classify`).

use super::bert::{Bert, BertConfig};
use super::bert_train::{encoder_backward, encoder_forward, training_bert, EncoderCache};
use super::checkpoint::Model;
use super::classifier_head::{ClassifierHead, ClassifierHeadCache, Pooling};
use super::config::ModelConfig;
use super::loss::{cross_entropy_ignoring, LossStats};
use super::masked_lm::{argmax, check_mlm_config, mlm_config, TYPE_VOCAB};
use super::param::{Init, Module, ParamVisitor};
use crate::error::{Error, Result};
use crate::rng::Rng;
use crate::Float;
use serde::{Deserialize, Serialize};
use std::borrow::Borrow;

/// The most labels a classifier has.
pub const MAX_LABELS: usize = 1 << 16;

/// The shape of a sentence classifier (its `config.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassifierConfig {
    /// The encoder: a masked-LM encoder's config (see [`mlm_config`]).
    pub encoder: ModelConfig,
    /// Labels (at least two).
    pub n_labels: usize,
    /// Which sentence vector the head reads.
    pub pooling: Pooling,
    /// Dropout on the pooled vector.
    pub classifier_dropout: f64,
    /// Tokens kept per sentence, `[CLS]` and `[SEP]` included (at most the encoder's
    /// positions): training and `classify` truncate to it.
    pub max_tokens: usize,
}

impl Borrow<ModelConfig> for ClassifierConfig {
    fn borrow(&self) -> &ModelConfig {
        &self.encoder
    }
}

impl ClassifierConfig {
    /// Refuses what this model does not compute, naming the field.
    pub fn check(&self) -> std::result::Result<(), String> {
        check_mlm_config(&self.encoder).map_err(|e| format!("encoder: {e}"))?;
        if !(2..=MAX_LABELS).contains(&self.n_labels) {
            return Err(format!(
                "n_labels {} must be in 2..={MAX_LABELS}",
                self.n_labels
            ));
        }
        if !(0.0..1.0).contains(&self.classifier_dropout) {
            return Err(format!(
                "classifier_dropout {} must be in [0, 1)",
                self.classifier_dropout
            ));
        }
        if !(3..=self.encoder.max_len).contains(&self.max_tokens) {
            return Err(format!(
                "max_tokens {} must be in 3..={} (the encoder's positions)",
                self.max_tokens, self.encoder.max_len
            ));
        }
        Ok(())
    }
}

/// The masked-LM encoder config of a loaded BERT encoder's shape (a Hugging Face directory or
/// a `train-mlm` one), with dropout `dropout` for fine-tuning; refused when the shape is not
/// one a masked-LM encoder has (the message names the field).
pub fn encoder_config_of(b: &BertConfig, dropout: f64) -> std::result::Result<ModelConfig, String> {
    if b.type_vocab_size != TYPE_VOCAB {
        return Err(format!(
            "type_vocab_size {} (a fine-tuned encoder has {TYPE_VOCAB})",
            b.type_vocab_size
        ));
    }
    let mut c = mlm_config(
        b.vocab_size,
        (
            b.hidden_size,
            b.num_attention_heads,
            b.intermediate_size,
            b.num_hidden_layers,
        ),
        b.max_position_embeddings,
        dropout,
    );
    c.activation = b.activation()?;
    c.layer_norm_eps = b.layer_norm_eps;
    check_mlm_config(&c)?;
    Ok(c)
}

/// The encoder and its classification head.
#[derive(Clone, Debug)]
pub struct SentenceClassifier<T> {
    pub config: ClassifierConfig,
    pub bert: Bert<T>,
    pub head: ClassifierHead<T>,
}

/// What the forward keeps for the backward.
#[derive(Clone, Debug)]
pub struct SentenceClassifierCache<T> {
    encoder: EncoderCache<T>,
    head: ClassifierHeadCache<T>,
}

impl<T: Float> SentenceClassifier<T> {
    /// A fresh model of a (checked) `config`: the encoder's tables and blocks, then the head,
    /// drawn from `init` in that order.
    pub fn new(config: ClassifierConfig, init: &mut impl Init) -> Self {
        let bert = training_bert(&config.encoder, init);
        let head = ClassifierHead::new(
            config.encoder.d_model,
            config.n_labels,
            config.pooling,
            config.classifier_dropout,
            init,
        );
        SentenceClassifier { config, bert, head }
    }

    /// `ids [batch, seq]` (sentence `b` padded after `lens[b]` tokens) -> the logits
    /// `[batch, labels]` and the cache. Dropout when `rng` is given.
    pub fn forward(
        &self,
        ids: &[u32],
        lens: &[usize],
        mut rng: Option<&mut Rng>,
    ) -> (Vec<T>, SentenceClassifierCache<T>) {
        let dropout = self.config.encoder.dropout;
        let (hidden, encoder) =
            encoder_forward(&self.bert, dropout, ids, lens, rng.as_deref_mut());
        let seq = ids.len() / lens.len();
        let (logits, head) = self.head.forward(&hidden, seq, lens, rng);
        (logits, SentenceClassifierCache { encoder, head })
    }

    /// Backward from `dlogits [batch, labels]`; accumulates every parameter gradient.
    pub fn backward(&mut self, cache: SentenceClassifierCache<T>, dlogits: &[T]) {
        let dhidden = self.head.backward(cache.head, dlogits);
        encoder_backward(&mut self.bert, cache.encoder, dhidden);
    }

    /// One forward and backward: the cross-entropy of `labels` (one per sentence);
    /// accumulates `grad_scale · ∂(Σ loss)/∂θ` and returns the loss sums.
    pub fn forward_backward(
        &mut self,
        ids: &[u32],
        lens: &[usize],
        labels: &[u32],
        label_smoothing: f64,
        grad_scale: f64,
        rng: Option<&mut Rng>,
    ) -> LossStats {
        assert_eq!(lens.len(), labels.len(), "one label per sentence");
        let (mut logits, cache) = self.forward(ids, lens, rng);
        let stats = cross_entropy_ignoring(
            &mut logits,
            labels,
            self.config.n_labels,
            label_smoothing,
            Some(grad_scale),
            None,
        );
        self.backward(cache, &logits);
        stats
    }

    /// Without dropout or gradients: the loss sums (plain cross-entropy) and how many
    /// sentences' most probable label is theirs.
    pub fn evaluate(&self, ids: &[u32], lens: &[usize], labels: &[u32]) -> (LossStats, usize) {
        let (mut logits, _) = self.forward(ids, lens, None);
        let n = self.config.n_labels;
        let correct = logits
            .chunks_exact(n)
            .zip(labels)
            .filter(|(row, &y)| argmax(row) == y as usize)
            .count();
        let stats = cross_entropy_ignoring(&mut logits, labels, n, 0.0, None, None);
        (stats, correct)
    }

    /// Without dropout: each sentence's probabilities of the labels, `[batch, labels]`.
    pub fn probabilities(&self, ids: &[u32], lens: &[usize]) -> Vec<f64> {
        let (logits, _) = self.forward(ids, lens, None);
        let mut probs: Vec<f64> = logits.iter().map(|v| v.f64()).collect();
        for row in probs.chunks_exact_mut(self.config.n_labels) {
            let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            row.iter_mut().for_each(|v| *v = (*v - max).exp());
            let sum: f64 = row.iter().sum();
            row.iter_mut().for_each(|v| *v /= sum);
        }
        probs
    }
}

impl SentenceClassifier<f32> {
    /// Replaces the encoder's weights by `pretrained`'s (the same shape: every tensor's name
    /// and shape checked), keeping the head: fine-tuning starts from a pre-trained encoder.
    pub fn load_encoder(&mut self, mut pretrained: Bert<f32>) -> Result<()> {
        let theirs = pretrained.named_params("");
        let mine = self.bert.named_params("");
        if theirs.len() != mine.len() {
            return Err(Error::Input(format!(
                "the pre-trained encoder has {} tensors, the classifier's {}",
                theirs.len(),
                mine.len()
            )));
        }
        for ((name, p), (their_name, q)) in mine.into_iter().zip(theirs) {
            if name != their_name || p.value.shape != q.value.shape {
                return Err(Error::Input(format!(
                    "the pre-trained encoder's {their_name} {:?} does not fit the classifier's {name} {:?}",
                    q.value.shape, p.value.shape
                )));
            }
            p.value.data.copy_from_slice(&q.value.data);
        }
        Ok(())
    }
}

impl<T> Module<T> for SentenceClassifier<T> {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>) {
        v.module("bert", &mut self.bert);
        v.module("head", &mut self.head);
    }
}

impl Model for SentenceClassifier<f32> {
    type Config = ClassifierConfig;
    fn config(&self) -> &ClassifierConfig {
        &self.config
    }
    fn check_config(config: &ClassifierConfig) -> std::result::Result<(), String> {
        config.check()
    }
    fn foreign_config(json: &serde_json::Value) -> Option<String> {
        if json.get("d_model").is_some() {
            return Some(
                "a model of this project that is not a sentence classifier (train, train-lm \
                 or train-mlm); train-classifier --init takes a train-mlm directory"
                    .into(),
            );
        }
        json.get("model_type").map(|_| {
            "a Hugging Face model, not a sentence classifier of train-classifier (a BERT \
             encoder is taken by train-classifier --init)"
                .into()
        })
    }
    fn build(config: ClassifierConfig, init: &mut impl Init) -> Self {
        SentenceClassifier::new(config, init)
    }
}
