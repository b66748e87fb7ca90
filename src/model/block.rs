//! The self-attention block (section 3.1): multi-head self-attention, then the position-wise
//! FFN, each inside a [`Residual`] connection (post-LN as in the paper, or pre-LN):
//!
//! `x' = Residual(x, SelfAttention(x; mask))`, `y = Residual(x', FFN(x'))`.
//!
//! One type for every shape that attends to itself: the paper's encoder layer (padding mask),
//! the decoder-only language model's block (causal mask) and BERT's encoder layer. Only the mask
//! differs, and it is an argument. The incremental form for decoding appends to a
//! [`KvCache`]. A hybrid stack's linear-attention layer (Qwen3.5) mixes the sequence with a
//! [`GatedDeltaNet`] instead ([`SelfAttentionBlock::linear_attn`]; parameters `linear_attn.*`),
//! its state kept in the same [`KvCache`]. Parameters: `self_attn.{q,k,v,out}_proj`, `self_attn_norm`, `ffn.linear{1,2}`
//! (a mixture of experts: `ffn.router`, `ffn.experts.{e}.linear{1,2}`), `ffn_norm` (and, with post-norms, `self_attn_post_norm`, `ffn_post_norm`).

use super::attention::{AttentionCache, MultiHeadAttention};
use super::config::BlockConfig;
use super::experts::{Ffn, FfnCache};
use super::gated_delta::GatedDeltaNet;
use super::kv_cache::KvCache;
use super::param::{Init, Module, ParamVisitor};
use super::residual::{Residual, ResidualCache};
use super::step_layout::StepLayout;
use crate::backend::{AttnMask, Backend, CPU};
use crate::rng::Rng;
use crate::Float;

/// Self-attention and FFN sublayers, each in a residual connection.
#[derive(Clone, Debug)]
pub struct SelfAttentionBlock<T> {
    /// The self-attention (without heads, and never called, in a Gated DeltaNet layer).
    pub self_attn: MultiHeadAttention<T>,
    /// A hybrid stack's linear-attention layer: the gated delta rule mixes the sequence in
    /// place of [`self_attn`](Self::self_attn). `None`: an attention layer.
    pub linear_attn: Option<GatedDeltaNet<T>>,
    pub self_attn_res: Residual<T>,
    /// The position-wise FFN, or a mixture of experts.
    pub ffn: Ffn<T>,
    pub ffn_res: Residual<T>,
}

/// What a block's forward keeps for its backward.
#[derive(Clone, Debug)]
pub struct SelfAttentionBlockCache<T> {
    pub self_attn: ResidualCache<T, AttentionCache<T>>,
    pub ffn: ResidualCache<T, FfnCache<T>>,
}

impl<T: Float> SelfAttentionBlock<T> {
    /// Parameters drawn from `init` in the order self-attention (Q, K, V, O), FFN.
    pub fn new(c: &BlockConfig, init: &mut impl Init) -> Self {
        SelfAttentionBlock {
            self_attn: c.attention(true, init),
            linear_attn: None,
            self_attn_res: c.residual(init),
            ffn: c.ffn(init),
            ffn_res: c.residual(init),
        }
    }

    /// `x [batch*len, d_model]` -> same shape; each row attends to its own row's keys as `mask`
    /// allows (padding: keys past `key_lens[b]`; causal: keys after the query). Dropout when
    /// `rng` is given.
    pub fn forward(
        &self,
        x: Vec<T>,
        batch: usize,
        mask: AttnMask<'_>,
        mut rng: Option<&mut Rng>,
    ) -> (Vec<T>, SelfAttentionBlockCache<T>) {
        let attn = &self.self_attn;
        let (x, self_attn) =
            self.self_attn_res
                .forward_inner(x, rng.as_deref_mut(), attn.dropout, |u, r| {
                    match &self.linear_attn {
                        // (no backward: what it saves is nothing; see `backward`)
                        Some(delta) => (delta.forward(u, batch), attn.forward_nothing_saved()),
                        None => attn.forward(u, u, batch, mask, r),
                    }
                });
        let (x, ffn) = self
            .ffn_res
            .forward_inner(x, rng, self.ffn.dropout(), |u, r| {
                self.ffn.forward_train(u, r)
            });
        (x, SelfAttentionBlockCache { self_attn, ffn })
    }

    /// Accumulates gradients and returns dx.
    /// Panics on a Gated DeltaNet layer, which has no backward (training a hybrid stack is
    /// refused before it gets here).
    pub fn backward(&mut self, cache: SelfAttentionBlockCache<T>, dy: &[T]) -> Vec<T> {
        assert!(
            self.linear_attn.is_none(),
            "a Gated DeltaNet layer has no backward (training a hybrid model is not supported)"
        );
        let dx = self
            .ffn_res
            .backward(cache.ffn, dy, |u, c, d| self.ffn.backward(u, c, d));
        self.self_attn_res
            .backward(cache.self_attn, &dx, |u, c, d| {
                let (dq, mut dkv) = self.self_attn.backward(u, u, c, d);
                CPU.add(&mut dkv, &dq);
                dkv
            })
    }

    /// Inference returning the self-attention weights `[batch, heads, len, len]` too (attention
    /// maps; the plain kernel at any length).
    pub fn forward_weights(&self, x: Vec<T>, batch: usize, mask: AttnMask<'_>) -> (Vec<T>, Vec<T>) {
        let mut weights = Vec::new();
        let x = self.self_attn_res.apply(x, |u| {
            let (y, w) = match &self.linear_attn {
                Some(delta) => (delta.forward(u, batch), Vec::new()),
                None => self.self_attn.forward_weights(u, u, batch, mask),
            };
            weights = w;
            y
        });
        (self.ffn_res.apply(x, |u| self.ffn.forward(u)), weights)
    }

    /// Incremental, causal: `x [tokens, d_model]` are new positions laid out as `layout` says
    /// (see [`MultiHeadAttention::step`]); their keys and values are appended to `cache`.
    /// Returns the rows of the positions the layout's outputs ask for: with
    /// [`Outputs::Last`](super::step_layout::Outputs::Last) on a uniform feed of several tokens
    /// a row, `[rows, d_model]` (every position's keys and values are cached, the rest of the
    /// block runs on the last positions only); otherwise every token's.
    pub fn step(&self, x: Vec<T>, cache: &mut KvCache<T>, layout: &StepLayout<'_>) -> Vec<T> {
        let d = self.self_attn.d_model;
        let q_len = x.len().checked_div(cache.batch * d).unwrap_or(0);
        let attend = |u: &[T]| match &self.linear_attn {
            Some(delta) => delta.step(u, cache, layout),
            None => self.self_attn.step(u, cache, layout).0,
        };
        let x = if layout.last_of_several(q_len) {
            self.self_attn_res.apply_last(x, q_len, d, attend)
        } else {
            self.self_attn_res.apply(x, attend)
        };
        self.ffn_res.apply(x, |u| self.ffn.forward(u))
    }
}

impl<T> Module<T> for SelfAttentionBlock<T> {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>) {
        match &mut self.linear_attn {
            Some(delta) => v.module("linear_attn", delta),
            None => v.module("self_attn", &mut self.self_attn),
        }
        // The connection's parameters are its norm's (see `Residual`), borrowed apart from
        // its post-norm.
        v.module("self_attn_norm", &mut self.self_attn_res.norm);
        v.optional("self_attn_post_norm", self.self_attn_res.post_norm.as_mut());
        v.module("ffn", &mut self.ffn);
        v.module("ffn_norm", &mut self.ffn_res.norm);
        v.optional("ffn_post_norm", self.ffn_res.post_norm.as_mut());
    }
}
