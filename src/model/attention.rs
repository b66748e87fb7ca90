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
//! Query/key norms (`qk_norm`, Qwen3 and Gemma 3): before the rotation, each head's projected
//! query and key is RMS-normalised over its `d_k` columns, `q_h ← (g_q + o) ⊙ q_h / rms(q_h)`
//! (likewise `k_h` with `g_k`), one gain `[d_k]` shared by all heads ([`MultiHeadAttention::q_norm`],
//! [`MultiHeadAttention::k_norm`]). Every path (training, attention maps, each decoding layout,
//! cross-attention's cached keys) projects through the same two helpers, so none can skip it.
//!
//! Output gate (`output_gate`, Qwen3-Next and Qwen3.5's full-attention layers): the heads are
//! multiplied by `σ(x W_gᵀ)` of the layer's input before `W^O`,
//! `MultiHead = (Concat(head₁ … head_h) ⊙ σ(x W_gᵀ)) W^O`, `W_g [n_heads·d_k, d_model]` (the
//! second half of each head's rows of the checkpoint's query projection). Inference only.
//!
//! Partial rotation (`rotary_dim`, Qwen3.5: a quarter of each head): only each head's first
//! `rotary_dim` columns are rotated, as a head of that width (frequencies
//! `base^(−2i/rotary_dim)`); the rest pass unrotated.
//!
//! Attention sinks (`sinks`, gpt-oss; `super::attention_sinks`): a learned logit per head that
//! joins each of its softmaxes' denominators and carries no value, in every path.
//!
//! Relative positions (T5, `super::relative_bias`): a self-attention with a
//! [`relative_bias`](MultiHeadAttention::relative_bias) adds its learned bias of each key's
//! offset from the query to every score, in every path (through the key ranges the one
//! attention call reads).
//!
//! Entry points: [`forward`](MultiHeadAttention::forward) (training and teacher-forced
//! inference, saving what the backward needs) and its [`backward`](MultiHeadAttention::backward);
//! [`forward_weights`](MultiHeadAttention::forward_weights) (inference that returns the
//! attention weights, for attention maps); [`project_kv`](MultiHeadAttention::project_kv),
//! [`step`](MultiHeadAttention::step) and
//! [`cross_cached`](MultiHeadAttention::cross_cached) (incremental decoding over a [`KvCache`],
//! in `super::attention_step`). Every call attends through the backend's one attention call,
//! which chooses the kernel.

use super::attention_approx::LayerRanges;
use super::head_gate::{gate_backward, gated};
use super::kv_cache::KvCache;
use super::linear::Linear;
use super::norm::RmsNorm;
use super::param::{Init, Module, Param, ParamVisitor};
use super::relative_bias::RelativeBias;
use crate::backend::{Attended, AttnDims, AttnMask, AttnWeights, Backend, KeyRanges, KvView, Pattern, Purpose, RmsNormStats, Rope, SavedRef, Scores, WithSinks, CPU};
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
    /// Width of each head, d_k: `d_model / n_heads` but where a checkpoint says otherwise
    /// (Qwen3, Gemma 3), the projections then `[n_heads · d_k, d_model]` and
    /// `W^O [d_model, n_heads · d_k]`.
    pub d_head: usize,
    /// Rotary positions on queries and keys (self-attention only).
    pub rotary: bool,
    /// The rotary base and pairing of columns (when rotary).
    pub rope: Rope,
    /// Per-frequency divisors of the rotary angles, `θᵢ = base^(−2i/d_k) / fᵢ`, `[d_k / 2]`
    /// (Llama 3.1's scaling, `kernels::rope`); empty: unscaled.
    pub rope_freq_factors: Vec<f64>,
    /// Attention dropout: the probability of dropping each attention weight during training
    /// (`softmax(Q Kᵀ / √d_k) ⊙ M`, then `· V`); 0 in the paper.
    pub dropout: f64,
    /// Sliding-window attention (causal self-attention only): the query at position `p` sees
    /// the keys `max(0, p + 1 − w) ..= p` (Mistral); `None`: the whole causal prefix. Applied
    /// to the key ranges of every call (training forward and backward, attention maps, each
    /// decoding step); a paged KV cache releases the blocks older than the window.
    pub window: Option<usize>,
    /// A sparse pattern over the keys (window, strided, global tokens; `super::attention_approx`)
    /// and whether the layer is causal (how a query's position is read); `None`: the mask's keys.
    pub pattern: Option<(Pattern, bool)>,
    /// Linear attention (`kernels::linear_attention`) instead of the softmax.
    pub linear: bool,
    /// How the dot products become scores: their scale (`None`: `1/√d_k`; Gemma's
    /// `query_pre_attn_scalar^(−1/2)`) and soft cap `c · tanh(s / c)` (Gemma 2), in every
    /// kernel and the backward.
    pub scores: Scores,
    /// RMSNorm of each head's queries before the rotation (`qk_norm`), gain `[d_k]` shared by
    /// the heads; `None`: the projection as is.
    pub q_norm: Option<RmsNorm<T>>,
    /// RMSNorm of each head's keys before the rotation (`qk_norm`), gain `[d_k]`.
    pub k_norm: Option<RmsNorm<T>>,
    /// Head gates ξ (Michel et al. 2019): head `h`'s output is multiplied by `ξ_h` before
    /// `W^O`, `MultiHead = Concat(ξ₁ head₁ … ξ_h head_h) W^O`, in every path (training,
    /// attention maps, decoding). Empty: every gate 1, nothing multiplied. Not a parameter.
    pub gates: Vec<f64>,
    /// `∂L/∂ξ_h` `[n_heads]` summed over every [`backward`](Self::backward) since it was set to
    /// `Some` (see [`gate_backward`]); `None`: not computed.
    pub gate_grads: Option<Vec<f64>>,
    /// T5's relative position bias added to the scores (self-attention of a model with
    /// relative positions); `None`: no bias.
    pub relative_bias: Option<RelativeBias<T>>,
    /// The output gate `W_g [n_heads·d_k, d_model]` (see the module docs); `None`: ungated.
    pub output_gate: Option<Linear<T>>,
    /// Rotary: the leading columns of each head that are rotated (see the module docs);
    /// `None`: all `d_k`.
    pub rotary_dim: Option<usize>,
    /// The attention sinks `[n_heads]`, one logit per head (see the module docs); `None`: no
    /// sink.
    pub sinks: Option<Param<T>>,
}

/// What a per-head norm's backward needs: its input (the projection) and statistics.
#[derive(Clone, Debug)]
pub struct HeadNormSaved<T> {
    /// The projection before the norm `[rows, heads·d_k]`.
    pub input: Vec<T>,
    /// One `1/rms` per head of each row.
    pub stats: RmsNormStats<T>,
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
    /// The query and key norms' inputs and statistics (when the layer has them).
    pub q_normed: Option<HeadNormSaved<T>>,
    pub k_normed: Option<HeadNormSaved<T>>,
}

impl<T> AttentionCache<T> {
    /// The weights `[batch, heads, q_len, k_len]` when the plain kernel kept them.
    pub fn probs(&self) -> Option<&[T]> {
        match &self.weights {
            SavedWeights::Probs { probs, .. } => Some(probs),
            SavedWeights::LogSumExp(_) | SavedWeights::Linear => None,
        }
    }
}

/// The attention weights as the forward's kernel kept them.
#[derive(Clone, Debug)]
pub enum SavedWeights<T> {
    /// The plain kernel: the weights `[batch, heads, q_len, k_len]` (rows sum to one, less a
    /// sink's share, over the visible keys), and the attention-dropout mask laid out like them
    /// when one was drawn.
    Probs {
        probs: Vec<T>,
        drop_mask: Option<Vec<T>>,
    },
    /// The tiled kernel (the backend's choice, see [`Backend::attention`]): the log-sum-exp of each
    /// score row `[batch*q_len, heads]`, from which its backward recomputes the weights.
    LogSumExp(Vec<T>),
    /// Linear attention: nothing (its backward recomputes the running sums).
    Linear,
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
        Self::with_head_width(
            d_model,
            (n_heads, n_kv_heads, d_model / n_heads),
            bias,
            init,
        )
    }

    /// [`grouped`](Self::grouped) with heads of `d_head` columns whatever `d_model` is:
    /// `(n_heads, n_kv_heads, d_head)`; the query projection is `[n_heads · d_head, d_model]`,
    /// the output projection `[d_model, n_heads · d_head]`.
    pub fn with_head_width(
        d_model: usize,
        (n_heads, n_kv_heads, d_head): (usize, usize, usize),
        bias: bool,
        init: &mut impl Init,
    ) -> Self {
        let (d_q, d_kv) = (n_heads * d_head, n_kv_heads * d_head);
        MultiHeadAttention {
            q_proj: Linear::with_bias(d_model, d_q, bias, init),
            k_proj: Linear::with_bias(d_model, d_kv, bias, init),
            v_proj: Linear::with_bias(d_model, d_kv, bias, init),
            out_proj: Linear::with_bias(d_q, d_model, bias, init),
            n_heads,
            n_kv_heads,
            d_model,
            d_head,
            rotary: false,
            rope: Rope::default(),
            rope_freq_factors: Vec::new(),
            dropout: 0.0,
            window: None,
            pattern: None,
            linear: false,
            scores: Scores::default(),
            q_norm: None,
            k_norm: None,
            gates: Vec::new(),
            gate_grads: None,
            relative_bias: None,
            output_gate: None,
            rotary_dim: None,
            sinks: None,
        }
    }

    /// Width of the keys and values, `n_kv_heads · d_k` (`d_model` without grouping).
    pub fn d_kv(&self) -> usize {
        self.n_kv_heads * self.d_head
    }

    /// Width of the queries and of the concatenated heads, `n_heads · d_k` (`d_model` unless
    /// the heads are of their own width).
    pub fn d_q(&self) -> usize {
        self.n_heads * self.d_head
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

    /// The same layer with per-head query and key RMSNorms (`qk_norm`) of gain `1` (from
    /// `init`), ε `eps` and gain offset `offset` (see [`RmsNorm`]).
    pub fn with_qk_norm(self, eps: f64, offset: f64, init: &mut impl Init) -> Self {
        let d_head = self.d_head;
        self.with_qk_norm_widths((d_head, d_head), eps, offset, init)
    }

    /// The same with query and key norms of gains `[q_width]`, `[k_width]`: `d_k` normalises
    /// each head, the projection's width (`heads·d_k`, `kv_heads·d_k`) each row's heads at
    /// once (OLMo 2, OLMoE; a norm's rows are its gain's width).
    pub fn with_qk_norm_widths(
        mut self,
        (q_width, k_width): (usize, usize),
        eps: f64,
        offset: f64,
        init: &mut impl Init,
    ) -> Self {
        self.q_norm = Some(RmsNorm::new(q_width, eps, init).with_offset(offset));
        self.k_norm = Some(RmsNorm::new(k_width, eps, init).with_offset(offset));
        self
    }

    /// The queries of `x [rows, d_model]`: `x W^Qᵀ (+ b)`, each head normalised when the layer
    /// has a [`q_norm`](Self::q_norm); not rotated. `[rows, d_model]`.
    pub(super) fn queries(&self, x: &[T]) -> Vec<T> {
        head_normed(&self.q_norm, self.q_proj.forward(x))
    }

    /// The keys of `x [rows, d_model]`: `x W^Kᵀ (+ b)`, each head normalised when the layer has
    /// a [`k_norm`](Self::k_norm); not rotated. `[rows, n_kv_heads·d_k]`.
    pub(super) fn keys(&self, x: &[T]) -> Vec<T> {
        head_normed(&self.k_norm, self.k_proj.forward(x))
    }

    /// The backend's attention call over `ranges` (their scores biased by the layer's
    /// [`relative_bias`](Self::relative_bias) when it has one), cut to the layer's last `w` keys
    /// when it has a window and to its sparse pattern when it has one ([`Self::layer_ranges`]);
    /// without any, `ranges` as given.
    pub(super) fn attend(
        &self,
        q: &[T],
        kv: KvView<'_, T>,
        ranges: impl KeyRanges,
        dims: AttnDims,
        purpose: Purpose<'_, T>,
    ) -> Attended<T> {
        match &self.relative_bias {
            Some(bias) => self.attend_windowed(q, kv, bias.over(ranges), dims, purpose),
            None => self.attend_windowed(q, kv, ranges, dims, purpose),
        }
    }

    /// [`attend`](Self::attend) after the bias: the window and the pattern.
    fn attend_windowed(
        &self,
        q: &[T],
        kv: KvView<'_, T>,
        ranges: impl KeyRanges,
        dims: AttnDims,
        purpose: Purpose<'_, T>,
    ) -> Attended<T> {
        let Some(sinks) = &self.sinks else {
            return match (self.window, self.pattern) {
                (None, None) => CPU.attention(q, kv, ranges, dims, purpose),
                _ => CPU.attention(q, kv, self.layer_ranges(ranges), dims, purpose),
            };
        };
        // [n_heads], the sinks as the kernels read them
        let sinks: Vec<f64> = sinks.value.data.iter().map(|s| s.f64()).collect();
        let sinks = &sinks[..];
        match (self.window, self.pattern) {
            (None, None) => CPU.attention(q, kv, WithSinks { inner: ranges, sinks }, dims, purpose),
            _ => {
                let inner = self.layer_ranges(ranges);
                CPU.attention(q, kv, WithSinks { inner, sinks }, dims, purpose)
            }
        }
    }

    /// Rotates `x [batch*len, heads·d_k]` in place (queries: `n_heads`, keys: `n_kv_heads`),
    /// rows at positions `pos ..` (when rotary).
    pub(super) fn rotate(&self, x: &mut [T], len: usize, heads: usize, pos: usize) {
        if !self.rotary {
            return;
        }
        let (d_head, factors) = (self.d_head, &self.rope_freq_factors);
        match self.rotary_dim.filter(|&r| r < d_head) {
            None => CPU.rope(x, self.rope, factors, len, heads, (d_head, pos)),
            Some(r) => {
                // part: [rows, heads·r], each head's leading `r` columns, rotated as heads of
                // width `r` and put back.
                let mut part: Vec<T> = x.chunks(d_head).flat_map(|h| h[..r].to_vec()).collect();
                CPU.rope(&mut part, self.rope, factors, len, heads, (r, pos));
                for (h, p) in x.chunks_mut(d_head).zip(part.chunks(r)) {
                    h[..r].copy_from_slice(p);
                }
            }
        }
    }

    /// An empty [`AttentionCache`]: what a layer that has no backward keeps (a hybrid stack's
    /// Gated DeltaNet layer, whose block panics on a backward).
    pub(super) fn forward_nothing_saved(&self) -> AttentionCache<T> {
        AttentionCache {
            q: Vec::new(),
            k: Vec::new(),
            v: Vec::new(),
            weights: SavedWeights::Linear,
            key_lens: Vec::new(),
            causal: true,
            q_offset: 0,
            window: None,
            ctx: Vec::new(),
            dims: self.dims(0, 0, 0, 0),
            q_pos: 0,
            k_pos: 0,
            q_normed: None,
            k_normed: None,
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
            d_head: self.d_head,
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

    /// The projections, normalised per head (when the layer has query/key norms) and rotated
    /// at `shift + ...` (see [`forward_at`](Self::forward_at)), with what the norms' backward
    /// needs.
    #[allow(clippy::type_complexity)]
    fn project(
        &self,
        x_q: &[T],
        x_kv: &[T],
        batch: usize,
        q_pos: usize,
        k_pos: usize,
    ) -> (
        [Vec<T>; 3],
        Option<HeadNormSaved<T>>,
        Option<HeadNormSaved<T>>,
    ) {
        let q_len = x_q.len() / (batch * self.d_model);
        let k_len = x_kv.len() / (batch * self.d_model);
        let (mut q, q_normed) = head_norm_saving(&self.q_norm, self.q_proj.forward(x_q));
        let (mut k, k_normed) = head_norm_saving(&self.k_norm, self.k_proj.forward(x_kv));
        let v = self.v_proj.forward(x_kv);
        self.rotate(&mut q, q_len, self.n_heads, q_pos);
        self.rotate(&mut k, k_len, self.n_kv_heads, k_pos);
        ([q, k, v], q_normed, k_normed)
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
        let ([q, k, v], q_normed, k_normed) = self.project(x_q, x_kv, batch, q_pos, k_pos);
        let dims = self.dims(batch, q_len, k_len, k_len);
        if self.linear {
            let ctx = self.linear_context((&q, &k, &v), dims, mask);
            let y = self.output(x_q, &ctx);
            let cache = AttentionCache {
                q,
                k,
                v,
                weights: SavedWeights::Linear,
                key_lens: mask.key_lens.to_vec(),
                causal: mask.causal,
                q_offset: mask.q_offset,
                window: self.window,
                ctx,
                dims,
                q_pos,
                k_pos,
                q_normed,
                k_normed,
            };
            return (y, cache);
        }
        let n_weights = batch * self.n_heads * q_len * k_len;
        // drop_mask: [batch, heads, q_len, k_len]
        let drop_mask = rng.and_then(|r| CPU.dropout_mask(r, n_weights, self.dropout));
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
        let y = self.output(x_q, &ctx);
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
            q_normed,
            k_normed,
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
        let ([q, k, v], _, _) = self.project(x_q, x_kv, batch, mask.q_offset, 0);
        let dims = self.dims(batch, q_len, k_len, k_len);
        if self.linear {
            let (ctx, weights) = self.linear_context_weights((&q, &k, &v), dims, mask);
            return (self.output(x_q, &ctx), weights);
        }
        let kv = KvView::Contiguous { k: &k, v: &v };
        let attended = self.attend(&q, kv, mask, dims, Purpose::Weights);
        (self.output(x_q, &attended.ctx), probs(attended.weights))
    }

    /// The concatenated heads `ctx [rows, n_heads·d_k]` of the input rows `x [rows, d_model]`
    /// through the gates and `W^O`: `Concat(ξ_h head_h) W^Oᵀ (+ b)`, `[rows, d_model]`; with an
    /// [`output_gate`](Self::output_gate), `ctx ⊙ σ(x W_gᵀ)` first.
    pub(super) fn output(&self, x: &[T], ctx: &[T]) -> Vec<T> {
        let gated_heads = gated(&self.gates, ctx, self.d_head);
        match &self.output_gate {
            None => self.out_proj.forward(&gated_heads),
            Some(w_g) => {
                let mut heads = gated_heads.into_owned();
                let gate = w_g.forward(x);
                for (h, &g) in heads.iter_mut().zip(&gate) {
                    *h *= T::one() / (T::one() + (-g).exp());
                }
                self.out_proj.forward(&heads)
            }
        }
    }

    /// Accumulates the four projections' gradients; returns `(dx_q, dx_kv)`.
    pub fn backward(
        &mut self,
        x_q: &[T],
        x_kv: &[T],
        cache: AttentionCache<T>,
        dy: &[T],
    ) -> (Vec<T>, Vec<T>) {
        assert!(
            self.output_gate.is_none() && self.rotary_dim.is_none(),
            "an output gate or a partial rotation has no backward (inference only)"
        );
        let mut dctx = self
            .out_proj
            .backward(&gated(&self.gates, &cache.ctx, self.d_head), dy);
        gate_backward(
            (&self.gates, self.gate_grads.as_mut()),
            &cache.ctx,
            &mut dctx,
            self.d_head,
        );
        self.sinks_backward(&cache, &dctx);
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
            SavedWeights::Linear => SavedRef::LogSumExp(&[]),
        };
        let mask = AttnMask {
            key_lens: &cache.key_lens,
            causal: cache.causal,
            q_offset: cache.q_offset,
        };
        let grads = (&mut dq[..], &mut dk[..], &mut dv[..]);
        let (dctx, ctx, dims) = (&dctx[..], &cache.ctx[..], cache.dims);
        let ranges = LayerRanges {
            inner: mask,
            window: cache.window,
            pattern: self.pattern,
        };
        // (The bias's table gets no gradient: see `super::relative_bias`.)
        match (&cache.weights, cache.window, self.pattern, &self.relative_bias) {
            (SavedWeights::Linear, ..) => self.linear_backward(grads, dctx, qkv, dims, mask),
            (_, _, _, Some(bias)) => {
                let ranges = LayerRanges {
                    inner: bias.over(mask),
                    window: cache.window,
                    pattern: self.pattern,
                };
                CPU.attention_backward(grads, dctx, ctx, qkv, saved, ranges, dims)
            }
            (_, None, None, None) => {
                CPU.attention_backward(grads, dctx, ctx, qkv, saved, mask, dims)
            }
            _ => CPU.attention_backward(grads, dctx, ctx, qkv, saved, ranges, dims),
        }
        if self.rotary {
            let (heads, d_head) = (self.n_heads, self.d_head);
            let (rope, kv_heads, factors) = (self.rope, self.n_kv_heads, &self.rope_freq_factors);
            let (q_len, k_len) = (cache.dims.q_len, cache.dims.k_len);
            CPU.rope_backward(&mut dq, rope, factors, q_len, heads, (d_head, cache.q_pos));
            CPU.rope_backward(
                &mut dk,
                rope,
                factors,
                k_len,
                kv_heads,
                (d_head, cache.k_pos),
            );
        }
        // The per-head norms' backward (gain gradients accumulated), back to the projections.
        if let (Some(norm), Some(saved)) = (&mut self.q_norm, &cache.q_normed) {
            dq = norm.backward(&saved.input, &saved.stats, &dq);
        }
        if let (Some(norm), Some(saved)) = (&mut self.k_norm, &cache.k_normed) {
            dk = norm.backward(&saved.input, &saved.stats, &dk);
        }
        let dx_q = self.q_proj.backward(x_q, &dq);
        let mut dx_kv = self.k_proj.backward(x_kv, &dk);
        let dx_v = self.v_proj.backward(x_kv, &dv);
        CPU.add(&mut dx_kv, &dx_v);
        (dx_q, dx_kv)
    }

    /// Keys and values of `x_kv [batch*k_len, d_model]`, computed once per source for
    /// cross-attention during decoding (rotary: keys rotated at positions `0 .. k_len`, a full
    /// self-attention cache).
    pub fn project_kv(&self, x_kv: &[T], batch: usize) -> KvCache<T> {
        let k_len = x_kv.len() / (batch * self.d_model);
        let mut k = self.keys(x_kv);
        self.rotate(&mut k, k_len, self.n_kv_heads, 0);
        let v = self.v_proj.forward(x_kv);
        KvCache::from_dense(k, v, batch, k_len, self.d_kv())
    }
}

/// `x [rows, heads·d_k]` with each head's `d_k` columns normalised by `norm` (the rows of
/// `[rows·heads, d_k]`); `x` itself without one.
fn head_normed<T: Float>(norm: &Option<RmsNorm<T>>, x: Vec<T>) -> Vec<T> {
    match norm {
        Some(n) => n.forward(&x).0,
        None => x,
    }
}

/// [`head_normed`], keeping the norm's input and statistics for its backward.
fn head_norm_saving<T: Float>(
    norm: &Option<RmsNorm<T>>,
    x: Vec<T>,
) -> (Vec<T>, Option<HeadNormSaved<T>>) {
    match norm {
        Some(n) => {
            let (y, stats) = n.forward(&x);
            (y, Some(HeadNormSaved { input: x, stats }))
        }
        None => (x, None),
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
        if let Some(n) = &mut self.q_norm {
            v.module("q_norm", n);
        }
        if let Some(n) = &mut self.k_norm {
            v.module("k_norm", n);
        }
        v.optional("relative_bias", self.relative_bias.as_mut());
        v.optional("gate_proj", self.output_gate.as_mut());
        if let Some(sinks) = &mut self.sinks {
            v.param("sinks", sinks);
        }
    }
}
