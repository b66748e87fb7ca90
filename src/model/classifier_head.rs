//! The sentence-classification head on a BERT encoder (Devlin et al., 2019, section 4.1 and
//! figure 4a; Hugging Face `BertPooler` + `BertForSequenceClassification`): for the last hidden
//! states `h [seq, d]` of a sentence of `n` real tokens,
//!
//! `u = h_[CLS]` (the first token, [`Pooling::Cls`]) or `u = (1/n) Σ_{i<n} h_i` (the mean over
//! the real tokens, [`Pooling::Mean`]), `p = tanh(u W_pᵀ + b_p)`, `z = Dropout(p) W_cᵀ + b_c`,
//!
//! the logits `z [labels]` of a softmax over the labels (the loss is their cross-entropy).
//!
//! Why both poolings: BERT pre-trains `[CLS]` for its next-sentence task and fine-tunes its
//! pooled state, which is what `Cls` does (the default); an encoder whose sentence vector was
//! trained as the mean of its states (sentence-transformers' all-MiniLM-L6-v2, and our
//! `train-mlm` encoders, which never train `[CLS]` for anything) carries its meaning in that
//! mean from the first update, which is what `Mean` reads. The pooler layer is there in both,
//! so the two differ in one line of the forward and one of the backward.
//!
//! Forward and backward side by side; the backward returns `∂L/∂h` for every row (zero on the
//! rows the pooling does not read: padding, and with `Cls` every row but the first).
//! Parameters: `pooler.{weight,bias}`, `classifier.{weight,bias}`.

use super::linear::Linear;
use super::param::{Init, Module, ParamVisitor};
use crate::backend::{Backend, CPU};
use crate::rng::Rng;
use crate::Float;
use serde::{Deserialize, Serialize};

/// Which sentence vector the head reads off the encoder's last hidden states.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pooling {
    /// The first token's (`[CLS]`) state, as BERT.
    #[default]
    Cls,
    /// The mean of the real tokens' states, as sentence-transformers.
    Mean,
}

/// Pooling, the pooler (dense + tanh), dropout and the linear layer to the labels.
#[derive(Clone, Debug)]
pub struct ClassifierHead<T> {
    pub pooling: Pooling,
    /// Dropout on the pooled vector `p` (BERT's 0.1).
    pub dropout: f64,
    /// `W_p [d, d]`, `b_p [d]`
    pub pooler: Linear<T>,
    /// `W_c [labels, d]`, `b_c [labels]`
    pub classifier: Linear<T>,
}

/// What the head's forward keeps for its backward.
#[derive(Clone, Debug)]
pub struct ClassifierHeadCache<T> {
    /// Tokens per sequence (padding included) and real tokens of each sequence.
    seq: usize,
    lens: Vec<usize>,
    /// `u [batch, d]`, the pooler's input.
    pooled: Vec<T>,
    /// `p [batch, d] = tanh(u W_pᵀ + b_p)`.
    tanh: Vec<T>,
    dropout: Option<Vec<T>>,
    /// `Dropout(p) [batch, d]`, the classifier's input.
    dropped: Vec<T>,
}

impl<T: Float> ClassifierHead<T> {
    /// A head for width `d` and `labels` labels: Xavier layers, zero biases.
    pub fn new(
        d: usize,
        labels: usize,
        pooling: Pooling,
        dropout: f64,
        init: &mut impl Init,
    ) -> Self {
        ClassifierHead {
            pooling,
            dropout,
            pooler: Linear::new(d, d, init),
            classifier: Linear::new(d, labels, init),
        }
    }

    /// `hidden [batch*seq, d]` (sequence `b` real for its first `lens[b]` rows) -> the logits
    /// `[batch, labels]` and the cache. Dropout when `rng` is given.
    pub fn forward(
        &self,
        hidden: &[T],
        seq: usize,
        lens: &[usize],
        rng: Option<&mut Rng>,
    ) -> (Vec<T>, ClassifierHeadCache<T>) {
        let d = self.pooler.d_in;
        assert_eq!(hidden.len(), lens.len() * seq * d, "hidden must be [batch*seq, d]");
        // u [batch, d]
        let mut pooled = vec![T::zero(); lens.len() * d];
        for (b, (u, &n)) in pooled.chunks_exact_mut(d).zip(lens).enumerate() {
            let rows = &hidden[b * seq * d..(b * seq + n) * d];
            match self.pooling {
                Pooling::Cls => u.copy_from_slice(&rows[..d]),
                Pooling::Mean => {
                    for row in rows.chunks_exact(d) {
                        u.iter_mut().zip(row).for_each(|(a, &h)| *a += h);
                    }
                    let inv = T::of(1.0 / n as f64);
                    u.iter_mut().for_each(|a| *a *= inv);
                }
            }
        }
        let mut tanh = self.pooler.forward(&pooled);
        CPU.tanh(&mut tanh);
        let dropout = rng.and_then(|r| CPU.dropout_mask::<T>(r, tanh.len(), self.dropout));
        let mut dropped = tanh.clone();
        if let Some(m) = &dropout {
            CPU.mul(&mut dropped, m);
        }
        let logits = self.classifier.forward(&dropped);
        let cache = ClassifierHeadCache {
            seq,
            lens: lens.to_vec(),
            pooled,
            tanh,
            dropout,
            dropped,
        };
        (logits, cache)
    }

    /// From `dlogits [batch, labels]`: accumulates the head's gradients, returns
    /// `dhidden [batch*seq, d]`.
    pub fn backward(&mut self, cache: ClassifierHeadCache<T>, dlogits: &[T]) -> Vec<T> {
        let d = self.pooler.d_in;
        let seq = cache.seq;
        let mut dp = self.classifier.backward(&cache.dropped, dlogits);
        if let Some(m) = &cache.dropout {
            CPU.mul(&mut dp, m);
        }
        // tanh' = 1 − p²
        CPU.tanh_backward(&mut dp, &cache.tanh);
        let du = self.pooler.backward(&cache.pooled, &dp);
        let mut dhidden = vec![T::zero(); cache.lens.len() * seq * d];
        for (b, (g, &n)) in du.chunks_exact(d).zip(&cache.lens).enumerate() {
            let rows = &mut dhidden[b * seq * d..(b * seq + n) * d];
            match self.pooling {
                Pooling::Cls => rows[..d].copy_from_slice(g),
                Pooling::Mean => {
                    let inv = T::of(1.0 / n as f64);
                    for row in rows.chunks_exact_mut(d) {
                        row.iter_mut().zip(g).for_each(|(a, &v)| *a = v * inv);
                    }
                }
            }
        }
        dhidden
    }
}

impl<T> Module<T> for ClassifierHead<T> {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>) {
        v.module("pooler", &mut self.pooler);
        v.module("classifier", &mut self.classifier);
    }
}
