//! The encoder (section 3.1): a stack of N identical layers, each self-attention then a
//! position-wise FFN, each inside a residual connection. Padding keys are masked.

use super::attention::{AttentionCache, MultiHeadAttention};
use super::block::{Residual, ResidualCache};
use super::config::{ModelConfig, NormPlacement, Positions};
use super::feed_forward::{FeedForward, FeedForwardCache};
use super::layer_norm::LayerNorm;
use super::param::{Module, Param};
use crate::kernels::activations::add_inplace;
use crate::kernels::attention::AttnMask;
use crate::kernels::layer_norm::LayerNormStats;
use crate::rng::Rng;
use crate::Float;

/// One encoder layer: self-attention and FFN sublayers.
#[derive(Clone, Debug)]
pub struct EncoderLayer<T> {
    pub self_attn: MultiHeadAttention<T>,
    pub self_attn_res: Residual<T>,
    pub ffn: FeedForward<T>,
    pub ffn_res: Residual<T>,
}

/// What an encoder layer keeps for its backward.
#[derive(Clone, Debug)]
pub struct EncoderLayerCache<T> {
    pub self_attn: ResidualCache<T, AttentionCache<T>>,
    pub ffn: ResidualCache<T, FeedForwardCache<T>>,
}

impl<T: Float> EncoderLayer<T> {
    pub fn new(c: &ModelConfig, rng: &mut Rng) -> Self {
        EncoderLayer {
            self_attn: MultiHeadAttention::new(c.d_model, c.n_heads, rng)
                .with_dropout(c.attention_dropout)
                .with_rotary(c.positions == Positions::Rotary),
            self_attn_res: Residual::new(c.d_model, c.layer_norm_eps, c.norm, c.dropout),
            ffn: FeedForward::new(c.d_model, c.d_ff, c.activation, rng)
                .with_dropout(c.activation_dropout),
            ffn_res: Residual::new(c.d_model, c.layer_norm_eps, c.norm, c.dropout),
        }
    }

    /// `x [batch*src_len, d_model]` -> same shape; keys past `src_lens[b]` are padding.
    pub fn forward(
        &self,
        x: Vec<T>,
        batch: usize,
        src_lens: &[usize],
        mut rng: Option<&mut Rng>,
    ) -> (Vec<T>, EncoderLayerCache<T>) {
        let mask = AttnMask {
            key_lens: src_lens,
            causal: false,
            q_offset: 0,
        };
        let (x, self_attn) = self.self_attn_res.forward_inner(
            x,
            rng.as_deref_mut(),
            self.self_attn.dropout,
            |u, r| self.self_attn.forward_train(u, u, batch, mask, r),
        );
        let (x, ffn) = self
            .ffn_res
            .forward_inner(x, rng, self.ffn.dropout, |u, r| {
                self.ffn.forward_train(u, r)
            });
        (x, EncoderLayerCache { self_attn, ffn })
    }

    /// Accumulates gradients, returns dx.
    pub fn backward(&mut self, cache: EncoderLayerCache<T>, dy: &[T]) -> Vec<T> {
        let dx = self
            .ffn_res
            .backward(cache.ffn, dy, |u, c, d| self.ffn.backward(u, c, d));
        self.self_attn_res
            .backward(cache.self_attn, &dx, |u, c, d| {
                let (dq, mut dkv) = self.self_attn.backward(u, u, c, d);
                add_inplace(&mut dkv, &dq);
                dkv
            })
    }
}

impl<T> Module<T> for EncoderLayer<T> {
    fn collect_params<'a>(&'a mut self, prefix: &str, out: &mut Vec<(String, &'a mut Param<T>)>) {
        self.self_attn
            .collect_params(&format!("{prefix}.self_attn"), out);
        self.self_attn_res
            .collect_params(&format!("{prefix}.self_attn_norm"), out);
        self.ffn.collect_params(&format!("{prefix}.ffn"), out);
        self.ffn_res
            .collect_params(&format!("{prefix}.ffn_norm"), out);
    }
}

/// The encoder stack, with a final layer norm when the blocks are pre-LN.
#[derive(Clone, Debug)]
pub struct Encoder<T> {
    pub layers: Vec<EncoderLayer<T>>,
    pub final_norm: Option<LayerNorm<T>>,
}

/// What the encoder keeps for its backward.
#[derive(Clone, Debug)]
pub struct EncoderCache<T> {
    pub layers: Vec<EncoderLayerCache<T>>,
    /// Pre-LN: the final norm's input and statistics.
    pub final_norm: Option<(Vec<T>, LayerNormStats<T>)>,
}

impl<T: Float> Encoder<T> {
    pub fn new(c: &ModelConfig, rng: &mut Rng) -> Self {
        Encoder {
            layers: (0..c.n_encoder_layers)
                .map(|_| EncoderLayer::new(c, rng))
                .collect(),
            final_norm: (c.norm == NormPlacement::PreLn)
                .then(|| LayerNorm::new(c.d_model, c.layer_norm_eps)),
        }
    }

    /// Embedded source `x [batch*src_len, d_model]` -> memory, same shape.
    pub fn forward(
        &self,
        mut x: Vec<T>,
        batch: usize,
        src_lens: &[usize],
        mut rng: Option<&mut Rng>,
    ) -> (Vec<T>, EncoderCache<T>) {
        let mut layers = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let (y, c) = layer.forward(x, batch, src_lens, rng.as_deref_mut());
            x = y;
            layers.push(c);
        }
        let mut final_norm = None;
        if let Some(norm) = &self.final_norm {
            let (y, stats) = norm.forward(&x);
            final_norm = Some((x, stats));
            x = y;
        }
        (x, EncoderCache { layers, final_norm })
    }

    /// Accumulates gradients, returns the gradient of the embedded source.
    pub fn backward(&mut self, cache: EncoderCache<T>, dmemory: Vec<T>) -> Vec<T> {
        let mut dx = dmemory;
        if let (Some(norm), Some((x, stats))) = (&mut self.final_norm, &cache.final_norm) {
            dx = norm.backward(x, stats, &dx);
        }
        for (layer, c) in self.layers.iter_mut().zip(cache.layers).rev() {
            dx = layer.backward(c, &dx);
        }
        dx
    }
}

impl<T> Module<T> for Encoder<T> {
    fn collect_params<'a>(&'a mut self, prefix: &str, out: &mut Vec<(String, &'a mut Param<T>)>) {
        for (i, layer) in self.layers.iter_mut().enumerate() {
            layer.collect_params(&format!("{prefix}.layers.{i}"), out);
        }
        if let Some(norm) = &mut self.final_norm {
            norm.collect_params(&format!("{prefix}.final_norm"), out);
        }
    }
}
