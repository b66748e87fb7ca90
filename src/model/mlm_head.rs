//! BERT's masked-LM head (Devlin et al., 2019; Hugging Face `BertLMPredictionHead`): for the
//! last hidden state `h` of a chosen position,
//!
//! `u = h W_dᵀ + b_d`, `g = GELU(u)`, `t = LayerNorm(g)`, `z = t Eᵀ + b_v`,
//!
//! where `E [vocab, d]` is the word-embedding table (the decoder is tied to it, as BERT's is) and
//! `b_v [vocab]` the head's own output bias. Forward and backward side by side; the backward
//! adds `∂L/∂E` into the embedding table's gradient. Parameters: `dense.{weight,bias}`,
//! `norm.{weight,bias}`, `bias`.

use super::layer_norm::LayerNorm;
use super::linear::Linear;
use super::param::{Init, Module, Param, ParamVisitor};
use crate::backend::{Backend, LayerNormStats, MatMut, MatRef, CPU};
use crate::Float;

/// Dense + GELU + LayerNorm, then the tied decoder and its bias.
#[derive(Clone, Debug)]
pub struct MlmHead<T> {
    /// `W_d [d, d]`, `b_d [d]`
    pub dense: Linear<T>,
    pub norm: LayerNorm<T>,
    /// `b_v [vocab]`
    pub bias: Param<T>,
}

/// What the head's forward keeps for its backward.
#[derive(Clone, Debug)]
pub struct MlmHeadCache<T> {
    /// The head's input `h [rows, d]`.
    hidden: Vec<T>,
    /// `u [rows, d]`, before GELU.
    pre_gelu: Vec<T>,
    /// `g [rows, d]`, the layer norm's input.
    gelu: Vec<T>,
    stats: LayerNormStats<T>,
    /// `t [rows, d]`, the decoder's input.
    normed: Vec<T>,
}

impl<T: Float> MlmHead<T> {
    /// A head for width `d` and `vocab` words: Xavier dense layer, unit layer norm, zero bias.
    pub fn new(d: usize, vocab: usize, eps: f64, init: &mut impl Init) -> Self {
        MlmHead {
            dense: Linear::new(d, d, init),
            norm: LayerNorm::with_init(d, eps, init),
            bias: init.constant(&[vocab], 0.0),
        }
    }

    fn vocab(&self) -> usize {
        self.bias.value.len()
    }

    /// `hidden [rows, d]` and the embedding table `E [vocab, d]` -> logits `[rows, vocab]`.
    pub fn forward(&self, embedding: &[T], hidden: Vec<T>) -> (Vec<T>, MlmHeadCache<T>) {
        let (d, v) = (self.dense.d_in, self.vocab());
        let rows = hidden.len() / d;
        let pre_gelu = self.dense.forward(&hidden);
        let mut gelu = vec![T::zero(); pre_gelu.len()];
        CPU.gelu_erf(&mut gelu, &pre_gelu);
        let (normed, stats) = self.norm.forward(&gelu);
        // logits [rows, vocab] = t Eᵀ + b_v
        let mut logits = vec![T::zero(); rows * v];
        CPU.matmul(
            MatMut::new(&mut logits, rows, v),
            MatRef::new(&normed, rows, d),
            MatRef::new(embedding, v, d).t(),
            T::one(),
            false,
        );
        CPU.add_row_bias(&mut logits, &self.bias.value.data);
        let cache = MlmHeadCache {
            hidden,
            pre_gelu,
            gelu,
            stats,
            normed,
        };
        (logits, cache)
    }

    /// From `dlogits [rows, vocab]`: accumulates the head's gradients and `dE` into
    /// `embedding_grad [vocab, d]`, returns `dhidden [rows, d]`.
    pub fn backward(
        &mut self,
        embedding: &[T],
        embedding_grad: &mut [T],
        cache: MlmHeadCache<T>,
        dlogits: &[T],
    ) -> Vec<T> {
        let (d, v) = (self.dense.d_in, self.vocab());
        let rows = cache.hidden.len() / d;
        for row in dlogits.chunks_exact(v) {
            for (g, &dz) in self.bias.grad.data.iter_mut().zip(row) {
                *g += dz;
            }
        }
        // dE [vocab, d] += dlogitsᵀ t
        CPU.matmul(
            MatMut::new(embedding_grad, v, d),
            MatRef::new(dlogits, rows, v).t(),
            MatRef::new(&cache.normed, rows, d),
            T::one(),
            true,
        );
        // dt [rows, d] = dlogits E
        let mut dnormed = vec![T::zero(); rows * d];
        CPU.matmul(
            MatMut::new(&mut dnormed, rows, d),
            MatRef::new(dlogits, rows, v),
            MatRef::new(embedding, v, d),
            T::one(),
            false,
        );
        let mut dgelu = self.norm.backward(&cache.gelu, &cache.stats, &dnormed);
        CPU.gelu_erf_backward(&mut dgelu, &cache.pre_gelu);
        self.dense.backward(&cache.hidden, &dgelu)
    }
}

impl<T> Module<T> for MlmHead<T> {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>) {
        v.module("dense", &mut self.dense);
        v.module("norm", &mut self.norm);
        v.param("bias", &mut self.bias);
    }
}
