//! The decoder (section 3.1): N identical layers, each masked (causal) self-attention, then
//! attention over the encoder output (cross-attention), then a position-wise FFN, each inside a
//! residual connection. Also the incremental (KV-cached) step used for decoding.

use super::attention::{AttentionCache, MultiHeadAttention};
use super::block::{Residual, ResidualCache};
use super::config::{ModelConfig, NormPlacement, Positions};
use super::feed_forward::{FeedForward, FeedForwardCache};
use super::kv_cache::{KvCache, StepKvCache};
use super::layer_norm::LayerNorm;
use super::param::{Module, Param};
use crate::kernels::activations::add_inplace;
use crate::kernels::attention::AttnMask;
use crate::kernels::layer_norm::LayerNormStats;
use crate::rng::Rng;
use crate::Float;

/// One decoder layer.
#[derive(Clone, Debug)]
pub struct DecoderLayer<T> {
    pub self_attn: MultiHeadAttention<T>,
    pub self_attn_res: Residual<T>,
    pub cross_attn: MultiHeadAttention<T>,
    pub cross_attn_res: Residual<T>,
    pub ffn: FeedForward<T>,
    pub ffn_res: Residual<T>,
}

/// What a decoder layer keeps for its backward.
#[derive(Clone, Debug)]
pub struct DecoderLayerCache<T> {
    pub self_attn: ResidualCache<T, AttentionCache<T>>,
    pub cross_attn: ResidualCache<T, AttentionCache<T>>,
    pub ffn: ResidualCache<T, FeedForwardCache<T>>,
}

/// Masks of one decoder call: target lengths (causal + padding) and source lengths (padding of
/// the encoder memory).
#[derive(Clone, Copy, Debug)]
pub struct DecoderMasks<'a> {
    pub tgt_lens: &'a [usize],
    pub src_lens: &'a [usize],
}

/// Attention weights of one decoder step, for attention maps: `[batch, heads, q_len, k_len]`.
#[derive(Clone, Debug)]
pub struct StepAttention<T> {
    pub self_attn: Vec<T>,
    pub cross_attn: Vec<T>,
}

impl<T: Float> DecoderLayer<T> {
    pub fn new(c: &ModelConfig, rng: &mut Rng) -> Self {
        let res = || Residual::new(c.d_model, c.layer_norm_eps, c.norm, c.dropout);
        DecoderLayer {
            // Rotary positions rotate the self-attention only: the cross-attention's keys are
            // source positions, its queries target positions, and stay unrotated.
            self_attn: MultiHeadAttention::new(c.d_model, c.n_heads, rng)
                .with_dropout(c.attention_dropout)
                .with_rotary(c.positions == Positions::Rotary),
            self_attn_res: res(),
            cross_attn: MultiHeadAttention::new(c.d_model, c.n_heads, rng)
                .with_dropout(c.attention_dropout),
            cross_attn_res: res(),
            ffn: FeedForward::new(c.d_model, c.d_ff, c.activation, rng)
                .with_dropout(c.activation_dropout),
            ffn_res: res(),
        }
    }

    /// `x [batch*tgt_len, d_model]`, `memory [batch*src_len, d_model]` -> `[batch*tgt_len, d_model]`.
    pub fn forward(
        &self,
        x: Vec<T>,
        memory: &[T],
        batch: usize,
        masks: DecoderMasks<'_>,
        mut rng: Option<&mut Rng>,
    ) -> (Vec<T>, DecoderLayerCache<T>) {
        let causal = AttnMask {
            key_lens: masks.tgt_lens,
            causal: true,
            q_offset: 0,
        };
        let padding = AttnMask {
            key_lens: masks.src_lens,
            causal: false,
            q_offset: 0,
        };
        let (x, self_attn) = self.self_attn_res.forward_inner(
            x,
            rng.as_deref_mut(),
            self.self_attn.dropout,
            |u, r| self.self_attn.forward_train(u, u, batch, causal, r),
        );
        let (x, cross_attn) = self.cross_attn_res.forward_inner(
            x,
            rng.as_deref_mut(),
            self.cross_attn.dropout,
            |u, r| self.cross_attn.forward_train(u, memory, batch, padding, r),
        );
        let (x, ffn) = self
            .ffn_res
            .forward_inner(x, rng, self.ffn.dropout, |u, r| {
                self.ffn.forward_train(u, r)
            });
        let cache = DecoderLayerCache {
            self_attn,
            cross_attn,
            ffn,
        };
        (x, cache)
    }

    /// Accumulates gradients; adds this layer's gradient w.r.t. the memory into `dmemory`;
    /// returns dx.
    pub fn backward(
        &mut self,
        memory: &[T],
        cache: DecoderLayerCache<T>,
        dy: &[T],
        dmemory: &mut [T],
    ) -> Vec<T> {
        let dx = self
            .ffn_res
            .backward(cache.ffn, dy, |u, c, d| self.ffn.backward(u, c, d));
        let dx = self
            .cross_attn_res
            .backward(cache.cross_attn, &dx, |u, c, d| {
                let (dq, dmem) = self.cross_attn.backward(u, memory, c, d);
                add_inplace(dmemory, &dmem);
                dq
            });
        self.self_attn_res
            .backward(cache.self_attn, &dx, |u, c, d| {
                let (dq, mut dkv) = self.self_attn.backward(u, u, c, d);
                add_inplace(&mut dkv, &dq);
                dkv
            })
    }

    /// Incremental step: `x [batch*q_len, d_model]` are the next positions; their keys/values
    /// are appended to `self_cache`; `cross_cache` holds the memory's keys/values.
    /// Transposed weight copies of every projection, for decoding steps (see
    /// [`super::Seq2Seq::prepare_inference`]).
    pub fn prepare_inference(&mut self) {
        self.self_attn.prepare_inference();
        self.cross_attn.prepare_inference();
        self.ffn.prepare_inference();
    }

    pub fn forward_step(
        &self,
        x: Vec<T>,
        self_cache: &mut StepKvCache<T>,
        cross_cache: &mut KvCache<T>,
        src_lens: &[usize],
    ) -> (Vec<T>, StepAttention<T>) {
        let mut self_probs = Vec::new();
        let mut cross_probs = Vec::new();
        let x = self.self_attn_res.apply(x, |u| {
            let (y, p) = self.self_attn.forward_step(u, self_cache);
            self_probs = p;
            y
        });
        let x = self.cross_attn_res.apply(x, |u| {
            let (y, p) = self
                .cross_attn
                .forward_cached(u, cross_cache, false, Some(src_lens));
            cross_probs = p;
            y
        });
        let x = self.ffn_res.apply(x, |u| self.ffn.forward(u).0);
        let attn = StepAttention {
            self_attn: self_probs,
            cross_attn: cross_probs,
        };
        (x, attn)
    }
}

impl<T> Module<T> for DecoderLayer<T> {
    fn collect_params<'a>(&'a mut self, prefix: &str, out: &mut Vec<(String, &'a mut Param<T>)>) {
        self.self_attn
            .collect_params(&format!("{prefix}.self_attn"), out);
        self.self_attn_res
            .collect_params(&format!("{prefix}.self_attn_norm"), out);
        self.cross_attn
            .collect_params(&format!("{prefix}.cross_attn"), out);
        self.cross_attn_res
            .collect_params(&format!("{prefix}.cross_attn_norm"), out);
        self.ffn.collect_params(&format!("{prefix}.ffn"), out);
        self.ffn_res
            .collect_params(&format!("{prefix}.ffn_norm"), out);
    }
}

/// The decoder stack, with a final layer norm when the blocks are pre-LN.
#[derive(Clone, Debug)]
pub struct Decoder<T> {
    pub layers: Vec<DecoderLayer<T>>,
    pub final_norm: Option<LayerNorm<T>>,
}

/// What the decoder keeps for its backward.
#[derive(Clone, Debug)]
pub struct DecoderCache<T> {
    pub layers: Vec<DecoderLayerCache<T>>,
    pub final_norm: Option<(Vec<T>, LayerNormStats<T>)>,
}

impl<T: Float> Decoder<T> {
    pub fn new(c: &ModelConfig, rng: &mut Rng) -> Self {
        Decoder {
            layers: (0..c.n_decoder_layers)
                .map(|_| DecoderLayer::new(c, rng))
                .collect(),
            final_norm: (c.norm == NormPlacement::PreLn)
                .then(|| LayerNorm::new(c.d_model, c.layer_norm_eps)),
        }
    }

    /// Embedded target `x [batch*tgt_len, d_model]` -> hidden states, same shape.
    pub fn forward(
        &self,
        mut x: Vec<T>,
        memory: &[T],
        batch: usize,
        masks: DecoderMasks<'_>,
        mut rng: Option<&mut Rng>,
    ) -> (Vec<T>, DecoderCache<T>) {
        let mut layers = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let (y, c) = layer.forward(x, memory, batch, masks, rng.as_deref_mut());
            x = y;
            layers.push(c);
        }
        let mut final_norm = None;
        if let Some(norm) = &self.final_norm {
            let (y, stats) = norm.forward(&x);
            final_norm = Some((x, stats));
            x = y;
        }
        (x, DecoderCache { layers, final_norm })
    }

    /// Accumulates gradients; returns (d embedded target, d memory).
    pub fn backward(
        &mut self,
        memory: &[T],
        cache: DecoderCache<T>,
        dh: Vec<T>,
    ) -> (Vec<T>, Vec<T>) {
        let mut dx = dh;
        if let (Some(norm), Some((x, stats))) = (&mut self.final_norm, &cache.final_norm) {
            dx = norm.backward(x, stats, &dx);
        }
        let mut dmemory = vec![T::zero(); memory.len()];
        for (layer, c) in self.layers.iter_mut().zip(cache.layers).rev() {
            dx = layer.backward(memory, c, &dx, &mut dmemory);
        }
        (dx, dmemory)
    }

    /// Incremental step through every layer (and the final norm).
    /// See [`DecoderLayer::prepare_inference`].
    pub fn prepare_inference(&mut self) {
        self.layers
            .iter_mut()
            .for_each(DecoderLayer::prepare_inference);
    }

    pub fn forward_step(
        &self,
        mut x: Vec<T>,
        self_caches: &mut [StepKvCache<T>],
        cross_caches: &mut [KvCache<T>],
        src_lens: &[usize],
    ) -> (Vec<T>, Vec<StepAttention<T>>) {
        let mut attn = Vec::with_capacity(self.layers.len());
        for ((layer, sc), cc) in self.layers.iter().zip(self_caches).zip(cross_caches) {
            let (y, a) = layer.forward_step(x, sc, cc, src_lens);
            x = y;
            attn.push(a);
        }
        if let Some(norm) = &self.final_norm {
            x = norm.forward(&x).0;
        }
        (x, attn)
    }
}

impl<T> Module<T> for Decoder<T> {
    fn collect_params<'a>(&'a mut self, prefix: &str, out: &mut Vec<(String, &'a mut Param<T>)>) {
        for (i, layer) in self.layers.iter_mut().enumerate() {
            layer.collect_params(&format!("{prefix}.layers.{i}"), out);
        }
        if let Some(norm) = &mut self.final_norm {
            norm.collect_params(&format!("{prefix}.final_norm"), out);
        }
    }
}
