//! Multi-head attention (section 3.2.2):
//! `MultiHead(Q, K, V) = Concat(head₁ … head_h) W^O`, `headᵢ = Attention(Q Wᵢ^Q, K Wᵢ^K, V Wᵢ^V)`,
//! `Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V`.
//!
//! The per-head projections Wᵢ^Q are the column blocks of one `d_model x d_model` projection, so
//! the heads come out of one matrix product and are split by strided views (see
//! `kernels::attention`). Incremental decoding reads the key/value caches of `super::kv_cache`.
//!
//! Rotary positions (`rotary: true`, set for self-attention when the config asks for
//! [`Positions::Rotary`](super::config::Positions)): the projected queries and keys are rotated
//! per head by their absolute positions (`kernels::rope`) before the scores; values are not.
//! Positions follow the mask's convention: query row `i` is at `mask.q_offset + i`, key row `j`
//! at `j` (plus a common shift, see [`MultiHeadAttention::forward_at`]). The [`KvCache`] of a
//! rotary layer stores its keys already rotated. Cross-attention is never rotary.
//!
//! Entry points: [`forward`](MultiHeadAttention::forward) (training and teacher-forced
//! inference, saving what the backward needs) and its [`backward`](MultiHeadAttention::backward);
//! [`forward_weights`](MultiHeadAttention::forward_weights) (inference that returns the
//! attention weights, for attention maps); [`project_kv`](MultiHeadAttention::project_kv),
//! [`step`](MultiHeadAttention::step) and
//! [`cross_cached`](MultiHeadAttention::cross_cached) (incremental decoding over a [`KvCache`],
//! in `super::attention_step`). Every call attends through the backend's one attention call,
//! which chooses the kernel.

use super::kv_cache::KvCache;
use super::linear::Linear;
use super::param::{Init, Module, ParamVisitor};
use crate::kernels::attention::{
    Attended, AttnDims, AttnMask, AttnWeights, KeyRanges, KvView, Purpose, SavedRef, Scores,
};
use crate::kernels::backend::{Backend, CPU};
use crate::kernels::dropout::dropout_mask;
use crate::kernels::rope::{rope_backward, rope_forward, Rope};
use crate::rng::Rng;
use crate::Float;

/// Multi-head attention with h heads of d_k = d_model / h (grouped-query: fewer key/value
/// heads, each shared by a group of query heads).
#[derive(Clone, Debug)]
pub struct MultiHeadAttention<T> {
    pub q_proj: Linear<T>,
    /// `[n_kv_heads · d_k, d_model]`
    pub k_proj: Linear<T>,
    /// `[n_kv_heads · d_k, d_model]`
    pub v_proj: Linear<T>,
    pub out_proj: Linear<T>,
    pub n_heads: usize,
    /// Key/value heads (`n_heads` for multi-head attention).
    pub n_kv_heads: usize,
    pub d_model: usize,
    /// Rotary positions on queries and keys (self-attention only).
    pub rotary: bool,
    /// The rotary base and pairing of columns (when rotary).
    pub rope: Rope,
    /// Attention dropout: the probability of dropping each attention weight during training
    /// (`softmax(Q Kᵀ / √d_k) ⊙ M`, then `· V`); 0 in the paper.
    pub dropout: f64,
    /// Sliding-window attention (causal self-attention only): the query at position `p` sees
    /// the keys `max(0, p + 1 − w) ..= p` (Mistral); `None`: the whole causal prefix. Applied
    /// to the key ranges of every call (training forward and backward, attention maps, each
    /// decoding step); the KV cache still keeps every position (releasing the rows older than
    /// the window is left for later).
    pub window: Option<usize>,
    /// How the dot products become scores: their scale (`None`: `1/√d_k`; Gemma's
    /// `query_pre_attn_scalar^(−1/2)`) and soft cap `c · tanh(s / c)` (Gemma 2), in every
    /// kernel and the backward.
    pub scores: Scores,
}

/// What the attention forward keeps for the backward.
#[derive(Clone, Debug)]
pub struct AttentionCache<T> {
    /// Projected queries [batch*q_len, d_model] (rotated when rotary).
    pub q: Vec<T>,
    /// Projected keys [batch*k_len, d_model] (rotated when rotary).
    pub k: Vec<T>,
    /// Projected values [batch*k_len, d_model].
    pub v: Vec<T>,
    /// What the kernel kept of the weights for its backward.
    pub weights: SavedWeights<T>,
    /// The mask the forward used (the tiled backward skips and zeroes what it hid).
    pub key_lens: Vec<usize>,
    pub causal: bool,
    pub q_offset: usize,
    /// The layer's sliding window when the forward ran (see [`MultiHeadAttention::window`]).
    pub window: Option<usize>,
    /// Concatenated heads before W^O [batch*q_len, d_model].
    pub ctx: Vec<T>,
    pub dims: AttnDims,
    /// Rotary: absolute positions of query row 0 and key row 0 (unused otherwise).
    pub q_pos: usize,
    pub k_pos: usize,
}

impl<T> AttentionCache<T> {
    /// The weights `[batch, heads, q_len, k_len]` when the plain kernel kept them.
    pub fn probs(&self) -> Option<&[T]> {
        match &self.weights {
            SavedWeights::Probs { probs, .. } => Some(probs),
            SavedWeights::LogSumExp(_) => None,
        }
    }
}

/// The attention weights as the forward's kernel kept them.
#[derive(Clone, Debug)]
pub enum SavedWeights<T> {
    /// The plain kernel: the weights `[batch, heads, q_len, k_len]` (rows sum to one over the
    /// visible keys), and the attention-dropout mask laid out like them when one was drawn.
    Probs {
        probs: Vec<T>,
        drop_mask: Option<Vec<T>>,
    },
    /// The tiled kernel (see [`crate::kernels::attention::choose`]): the log-sum-exp of each
    /// score row `[batch*q_len, heads]`, from which its backward recomputes the weights.
    LogSumExp(Vec<T>),
}

impl<T: Float> MultiHeadAttention<T> {
    pub fn new(d_model: usize, n_heads: usize, init: &mut impl Init) -> Self {
        Self::grouped(d_model, n_heads, n_heads, true, init)
    }

    /// Grouped-query attention: `n_kv_heads` key/value heads (dividing `n_heads`), each read by
    /// `n_heads / n_kv_heads` query heads, so the key and value projections are
    /// `[n_kv_heads · d_k, d_model]`; biases only when `bias`. Parameters drawn in the order
    /// Q, K, V, O.
    pub fn grouped(
        d_model: usize,
        n_heads: usize,
        n_kv_heads: usize,
        bias: bool,
        init: &mut impl Init,
    ) -> Self {
        let d_kv = n_kv_heads * (d_model / n_heads);
        MultiHeadAttention {
            q_proj: Linear::with_bias(d_model, d_model, bias, init),
            k_proj: Linear::with_bias(d_model, d_kv, bias, init),
            v_proj: Linear::with_bias(d_model, d_kv, bias, init),
            out_proj: Linear::with_bias(d_model, d_model, bias, init),
            n_heads,
            n_kv_heads,
            d_model,
            rotary: false,
            rope: Rope::default(),
            dropout: 0.0,
            window: None,
            scores: Scores::default(),
        }
    }

    /// Width of the keys and values, `n_kv_heads · d_k` (`d_model` without grouping).
    pub fn d_kv(&self) -> usize {
        self.n_kv_heads * (self.d_model / self.n_heads)
    }

    /// The same layer with attention dropout `p`.
    pub fn with_dropout(mut self, p: f64) -> Self {
        self.dropout = p;
        self
    }

    /// The same layer with rotary positions switched on or off.
    pub fn with_rotary(mut self, rotary: bool) -> Self {
        self.rotary = rotary;
        self
    }

    /// The same layer with the rotary base and pairing `rope` (when rotary).
    pub fn with_rope(mut self, rope: Rope) -> Self {
        self.rope = rope;
        self
    }

    /// The same layer with the sliding window `window` (see [`window`](Self::window)).
    pub fn with_window(mut self, window: Option<usize>) -> Self {
        self.window = window;
        self
    }

    /// The same layer with the score scale and soft cap `scores` (see [`scores`](Self::scores)).
    pub fn with_scores(mut self, scores: Scores) -> Self {
        self.scores = scores;
        self
    }

    /// The backend's attention call over `ranges`, cut to the layer's last `w` keys when it
    /// has a window (`ranges.windowed(w)`); without one, `ranges` as given (the same call).
    pub(super) fn attend(
        &self,
        q: &[T],
        kv: KvView<'_, T>,
        ranges: impl KeyRanges,
        dims: AttnDims,
        purpose: Purpose<'_, T>,
    ) -> Attended<T> {
        match self.window {
            None => CPU.attention(q, kv, ranges, dims, purpose),
            Some(w) => CPU.attention(q, kv, ranges.windowed(w), dims, purpose),
        }
    }

    /// Rotates `x [batch*len, heads·d_k]` in place (queries: `n_heads`, keys: `n_kv_heads`),
    /// rows at positions `pos ..` (when rotary).
    pub(super) fn rotate(&self, x: &mut [T], len: usize, heads: usize, pos: usize) {
        if self.rotary {
            let d_head = self.d_model / self.n_heads;
            rope_forward(x, self.rope, len, heads, d_head, pos);
        }
    }

    pub(super) fn dims(
        &self,
        batch: usize,
        q_len: usize,
        k_len: usize,
        kv_stride: usize,
    ) -> AttnDims {
        AttnDims {
            batch,
            heads: self.n_heads,
            kv_heads: self.n_kv_heads,
            d_head: self.d_model / self.n_heads,
            q_len,
            k_len,
            kv_stride,
            scores: self.scores,
        }
    }

    /// Queries from `x_q [batch*q_len, d_model]`, keys and values from `x_kv [batch*k_len,
    /// d_model]` (the same tensor for self-attention). Returns `[batch*q_len, d_model]` and what
    /// the backward needs. Attention dropout is drawn from `rng` when it is given and the
    /// layer's [`dropout`](Self::dropout) is positive. Rotary: queries at positions
    /// `mask.q_offset ..`, keys at `0 ..`.
    pub fn forward(
        &self,
        x_q: &[T],
        x_kv: &[T],
        batch: usize,
        mask: AttnMask<'_>,
        rng: Option<&mut Rng>,
    ) -> (Vec<T>, AttentionCache<T>) {
        self.forward_shifted(x_q, x_kv, batch, mask, 0, rng)
    }

    /// [`forward`](Self::forward) without dropout, every rotary position shifted by `shift`:
    /// queries at `shift + mask.q_offset + i`, keys at `shift + j`. Without rotary, `shift` has
    /// no effect; with it, the result does not depend on `shift` either (up to rounding), since
    /// rotary scores see relative positions only.
    pub fn forward_at(
        &self,
        x_q: &[T],
        x_kv: &[T],
        batch: usize,
        mask: AttnMask<'_>,
        shift: usize,
    ) -> (Vec<T>, AttentionCache<T>) {
        self.forward_shifted(x_q, x_kv, batch, mask, shift, None)
    }

    /// The projections, rotated at `shift + ...` (see [`forward_at`](Self::forward_at)).
    fn project(
        &self,
        x_q: &[T],
        x_kv: &[T],
        batch: usize,
        q_pos: usize,
        k_pos: usize,
    ) -> (Vec<T>, Vec<T>, Vec<T>) {
        let q_len = x_q.len() / (batch * self.d_model);
        let k_len = x_kv.len() / (batch * self.d_model);
        let mut q = self.q_proj.forward(x_q);
        let mut k = self.k_proj.forward(x_kv);
        let v = self.v_proj.forward(x_kv);
        self.rotate(&mut q, q_len, self.n_heads, q_pos);
        self.rotate(&mut k, k_len, self.n_kv_heads, k_pos);
        (q, k, v)
    }

    fn forward_shifted(
        &self,
        x_q: &[T],
        x_kv: &[T],
        batch: usize,
        mask: AttnMask<'_>,
        shift: usize,
        rng: Option<&mut Rng>,
    ) -> (Vec<T>, AttentionCache<T>) {
        let q_len = x_q.len() / (batch * self.d_model);
        let k_len = x_kv.len() / (batch * self.d_model);
        let (q_pos, k_pos) = (shift + mask.q_offset, shift);
        let (q, k, v) = self.project(x_q, x_kv, batch, q_pos, k_pos);
        let dims = self.dims(batch, q_len, k_len, k_len);
        let n_weights = batch * self.n_heads * q_len * k_len;
        // drop_mask: [batch, heads, q_len, k_len]
        let drop_mask = rng.and_then(|r| dropout_mask(r, n_weights, self.dropout));
        let kv = KvView::Contiguous { k: &k, v: &v };
        let purpose = Purpose::Train {
            drop: drop_mask.as_deref(),
        };
        let attended = self.attend(&q, kv, mask, dims, purpose);
        // ctx: [batch*q_len, d_model]
        let ctx = attended.ctx;
        let weights = match attended.weights {
            AttnWeights::Probs(probs) => SavedWeights::Probs { probs, drop_mask },
            AttnWeights::LogSumExp(lse) => SavedWeights::LogSumExp(lse),
        };
        let y = self.out_proj.forward(&ctx);
        let cache = AttentionCache {
            q,
            k,
            v,
            weights,
            key_lens: mask.key_lens.to_vec(),
            causal: mask.causal,
            q_offset: mask.q_offset,
            window: self.window,
            ctx,
            dims,
            q_pos,
            k_pos,
        };
        (y, cache)
    }

    /// Inference that returns the attention weights `[batch, heads, q_len, k_len]` with the
    /// output: always the plain kernel, whatever the length (attention maps).
    pub fn forward_weights(
        &self,
        x_q: &[T],
        x_kv: &[T],
        batch: usize,
        mask: AttnMask<'_>,
    ) -> (Vec<T>, Vec<T>) {
        let q_len = x_q.len() / (batch * self.d_model);
        let k_len = x_kv.len() / (batch * self.d_model);
        let (q, k, v) = self.project(x_q, x_kv, batch, mask.q_offset, 0);
        let dims = self.dims(batch, q_len, k_len, k_len);
        let kv = KvView::Contiguous { k: &k, v: &v };
        let attended = self.attend(&q, kv, mask, dims, Purpose::Weights);
        (
            self.out_proj.forward(&attended.ctx),
            probs(attended.weights),
        )
    }

    /// Accumulates the four projections' gradients; returns `(dx_q, dx_kv)`.
    pub fn backward(
        &mut self,
        x_q: &[T],
        x_kv: &[T],
        cache: AttentionCache<T>,
        dy: &[T],
    ) -> (Vec<T>, Vec<T>) {
        let dctx = self.out_proj.backward(&cache.ctx, dy);
        let mut dq = vec![T::zero(); cache.q.len()];
        let mut dk = vec![T::zero(); cache.k.len()];
        let mut dv = vec![T::zero(); cache.v.len()];
        let qkv = (&cache.q[..], &cache.k[..], &cache.v[..]);
        let saved = match &cache.weights {
            SavedWeights::Probs { probs, drop_mask } => SavedRef::Probs {
                probs,
                drop: drop_mask.as_deref(),
            },
            SavedWeights::LogSumExp(lse) => SavedRef::LogSumExp(lse),
        };
        let mask = AttnMask {
            key_lens: &cache.key_lens,
            causal: cache.causal,
            q_offset: cache.q_offset,
        };
        let grads = (&mut dq[..], &mut dk[..], &mut dv[..]);
        let (dctx, ctx, dims) = (&dctx[..], &cache.ctx[..], cache.dims);
        match cache.window {
            None => CPU.attention_backward(grads, dctx, ctx, qkv, saved, mask, dims),
            Some(w) => CPU.attention_backward(grads, dctx, ctx, qkv, saved, mask.windowed(w), dims),
        }
        if self.rotary {
            let (heads, d_head) = (self.n_heads, self.d_model / self.n_heads);
            let (rope, kv_heads) = (self.rope, self.n_kv_heads);
            rope_backward(&mut dq, rope, cache.dims.q_len, heads, d_head, cache.q_pos);
            rope_backward(
                &mut dk,
                rope,
                cache.dims.k_len,
                kv_heads,
                d_head,
                cache.k_pos,
            );
        }
        let dx_q = self.q_proj.backward(x_q, &dq);
        let mut dx_kv = self.k_proj.backward(x_kv, &dk);
        let dx_v = self.v_proj.backward(x_kv, &dv);
        crate::kernels::activations::add_inplace(&mut dx_kv, &dx_v);
        (dx_q, dx_kv)
    }

    /// Keys and values of `x_kv [batch*k_len, d_model]`, computed once per source for
    /// cross-attention during decoding (rotary: keys rotated at positions `0 .. k_len`, a full
    /// self-attention cache).
    pub fn project_kv(&self, x_kv: &[T], batch: usize) -> KvCache<T> {
        let k_len = x_kv.len() / (batch * self.d_model);
        let mut k = self.k_proj.forward(x_kv);
        self.rotate(&mut k, k_len, self.n_kv_heads, 0);
        let v = self.v_proj.forward(x_kv);
        KvCache::from_dense(k, v, batch, k_len, self.d_kv())
    }
}

/// The weights `[batch, heads, q_len, k_len]` of an inference call (which keeps them).
pub(super) fn probs<T>(weights: AttnWeights<T>) -> Vec<T> {
    match weights {
        AttnWeights::Probs(p) => p,
        AttnWeights::LogSumExp(_) => unreachable!("inference kernels keep the weights"),
    }
}

impl<T> Module<T> for MultiHeadAttention<T> {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>) {
        v.module("q_proj", &mut self.q_proj);
        v.module("k_proj", &mut self.k_proj);
        v.module("v_proj", &mut self.v_proj);
        v.module("out_proj", &mut self.out_proj);
    }
}
