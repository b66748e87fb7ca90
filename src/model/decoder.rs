//! The decoder (section 3.1): a [`Stack`] of N identical layers, each masked (causal)
//! self-attention, then attention over the encoder output (cross-attention), then a
//! position-wise FFN, each inside a residual connection. Also the incremental (KV-cached)
//! [`step`](DecoderLayer::step) used for decoding, and the attention weights for attention maps.

use super::attention::{AttentionCache, MultiHeadAttention};
use super::config::BlockConfig;
use super::feed_forward::{FeedForward, FeedForwardCache};
use super::kv_cache::KvCache;
use super::param::{Init, Module, ParamVisitor};
use super::residual::{Residual, ResidualCache};
use super::stack::Stack;
use super::step_layout::StepLayout;
use crate::backend::{AttnMask, Backend, CPU};
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

impl<'a> DecoderMasks<'a> {
    /// The self-attention's causal mask and the cross-attention's padding mask.
    pub fn attention(&self) -> (AttnMask<'a>, AttnMask<'a>) {
        let causal = AttnMask {
            key_lens: self.tgt_lens,
            causal: true,
            q_offset: 0,
        };
        (causal, super::encoder::padding_mask(self.src_lens))
    }
}

/// Attention weights of one decoder step, for attention maps: `[batch, heads, q_len, k_len]`.
#[derive(Clone, Debug)]
pub struct StepAttention<T> {
    pub self_attn: Vec<T>,
    pub cross_attn: Vec<T>,
}

impl<T: Float> DecoderLayer<T> {
    /// Parameters drawn from `init` in the order self-attention, cross-attention, FFN.
    pub fn new(c: &BlockConfig, init: &mut impl Init) -> Self {
        Self::with_cross(c, c, init)
    }

    /// [`new`](Self::new) with the cross-attention's heads from `cross` (a pruned layer: the
    /// two attentions keep different heads); everything else from `c`.
    pub fn with_cross(c: &BlockConfig, cross: &BlockConfig, init: &mut impl Init) -> Self {
        // Rotary positions rotate the self-attention only: the cross-attention's keys are
        // source positions, its queries target positions, and stay unrotated.
        DecoderLayer {
            self_attn: c.attention(true, init),
            self_attn_res: c.residual(init),
            cross_attn: cross.attention(false, init),
            cross_attn_res: c.residual(init),
            ffn: c.feed_forward(init),
            ffn_res: c.residual(init),
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
        let (causal, padding) = masks.attention();
        let (x, self_attn) = self.self_attn_res.forward_inner(
            x,
            rng.as_deref_mut(),
            self.self_attn.dropout,
            |u, r| self.self_attn.forward(u, u, batch, causal, r),
        );
        let (x, cross_attn) = self.cross_attn_res.forward_inner(
            x,
            rng.as_deref_mut(),
            self.cross_attn.dropout,
            |u, r| self.cross_attn.forward(u, memory, batch, padding, r),
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
                CPU.add(dmemory, &dmem);
                dq
            });
        self.self_attn_res
            .backward(cache.self_attn, &dx, |u, c, d| {
                let (dq, mut dkv) = self.self_attn.backward(u, u, c, d);
                CPU.add(&mut dkv, &dq);
                dkv
            })
    }

    /// Incremental step: `x [tokens, d_model]` are new positions laid out as `layout` says
    /// (one per row: a uniform feed, or each row at its own position); their keys and values
    /// are appended to `self_cache` (see [`MultiHeadAttention::step`]); `cross_cache` holds the
    /// memory's keys and values (one row per decoder row, or per group of rows, see
    /// [`super::seq2seq::DecodeState`]), `src_lens` long. Returns `[tokens, d_model]`.
    pub fn step(
        &self,
        x: Vec<T>,
        self_cache: &mut KvCache<T>,
        cross_cache: &mut KvCache<T>,
        src_lens: &[usize],
        layout: &StepLayout<'_>,
    ) -> Vec<T> {
        let layout = layout.all_outputs();
        let x = self
            .self_attn_res
            .apply(x, |u| self.self_attn.step(u, self_cache, &layout).0);
        let x = self.cross_attn_res.apply(x, |u| {
            self.cross_attn.cross_cached(u, cross_cache, src_lens).0
        });
        self.ffn_res.apply(x, |u| self.ffn.forward(u).0)
    }

    /// Teacher-forced inference returning both attention weights (`[batch, heads, tgt_len,
    /// tgt_len]` and `[batch, heads, tgt_len, src_len]`; attention maps, the plain kernel).
    pub fn forward_weights(
        &self,
        x: Vec<T>,
        memory: &[T],
        batch: usize,
        masks: DecoderMasks<'_>,
    ) -> (Vec<T>, StepAttention<T>) {
        let (causal, padding) = masks.attention();
        let mut attn = StepAttention {
            self_attn: Vec::new(),
            cross_attn: Vec::new(),
        };
        let x = self.self_attn_res.apply(x, |u| {
            let (y, w) = self.self_attn.forward_weights(u, u, batch, causal);
            attn.self_attn = w;
            y
        });
        let x = self.cross_attn_res.apply(x, |u| {
            let (y, w) = self.cross_attn.forward_weights(u, memory, batch, padding);
            attn.cross_attn = w;
            y
        });
        (self.ffn_res.apply(x, |u| self.ffn.forward(u).0), attn)
    }
}

impl<T> Module<T> for DecoderLayer<T> {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>) {
        v.module("self_attn", &mut self.self_attn);
        // The connection's parameters are its norm's (see `Residual`), borrowed apart from
        // its post-norm.
        v.module("self_attn_norm", &mut self.self_attn_res.norm);
        v.optional("self_attn_post_norm", self.self_attn_res.post_norm.as_mut());
        v.module("cross_attn", &mut self.cross_attn);
        v.module("cross_attn_norm", &mut self.cross_attn_res.norm);
        v.optional(
            "cross_attn_post_norm",
            self.cross_attn_res.post_norm.as_mut(),
        );
        v.module("ffn", &mut self.ffn);
        v.module("ffn_norm", &mut self.ffn_res.norm);
        v.optional("ffn_post_norm", self.ffn_res.post_norm.as_mut());
    }
}

/// N decoder layers, with a final norm when pre-LN.
pub type Decoder<T> = Stack<DecoderLayer<T>, T>;
