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
//! attention weights, for attention maps); [`project_kv`](MultiHeadAttention::project_kv) and
//! [`forward_cached`](MultiHeadAttention::forward_cached) (incremental decoding over a
//! [`KvCache`]).

use super::kv_cache::KvCache;
use super::linear::Linear;
use super::param::{Init, Module, ParamVisitor};
use crate::kernels::attention::{attention_backward, attention_forward, AttnDims, AttnMask};
use crate::kernels::dropout::dropout_mask;
use crate::kernels::flash_attention::{flash_attention_backward, flash_attention_forward};
use crate::kernels::rope::{rope_backward, rope_forward, Rope};
use crate::kernels::step_attention::step_attention_forward;
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
    /// The tiled kernel (see [`TILED_FROM_KEYS`]): the log-sum-exp of each score row
    /// `[batch*q_len, heads]`, from which its backward recomputes the weights.
    LogSumExp(Vec<T>),
}

/// How [`MultiHeadAttention::forward_cached`] uses its cache.
#[derive(Clone, Copy, Debug)]
pub enum CachedAttention<'a> {
    /// Self-attention of one new position per row (the decoder fed one token per step): its key
    /// and value are appended, then the query attends to its row's keys wherever the cache's
    /// blocks hold them (`kernels::step_attention`).
    Step,
    /// Self-attention of `q_len` new positions per row (a prompt at once, or one token at a
    /// time): appended, then attended causally as matrix products over the dense cache.
    Prefill,
    /// Cross-attention: the cache (the encoder output's keys and values) is read as is, padding
    /// keys past `key_lens` masked. Up to [`STEP_KERNEL_MAX_QUERIES`] queries per row run the
    /// step kernel, more run as matrix products.
    Cross { key_lens: &'a [usize] },
}

/// The token rows of a continuous-batching step (see [`MultiHeadAttention::forward_ragged`]):
/// token `i` belongs to cache row `rows[i]` and sits at position `positions[i]` of it. The
/// tokens of one row are consecutive positions, in order, starting at the row's length.
#[derive(Clone, Copy, Debug)]
pub struct RaggedTokens<'a> {
    pub rows: &'a [usize],
    pub positions: &'a [usize],
}

impl RaggedTokens<'_> {
    /// Maximal runs `(start, len)` of tokens of one row at consecutive positions.
    pub fn runs(&self) -> Vec<(usize, usize)> {
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for i in 0..self.rows.len() {
            match runs.last_mut() {
                Some((s, n))
                    if self.rows[*s] == self.rows[i]
                        && self.positions[*s] + *n == self.positions[i] =>
                {
                    *n += 1
                }
                _ => runs.push((i, 1)),
            }
        }
        runs
    }
}

/// Training attends with the tiled (FlashAttention) kernel from this many keys on, so memory
/// stays linear in the sequence length; below it the plain kernel, which keeps the whole
/// [query x key] weight matrix, is as cheap and needs no recomputation in the backward.
/// Attention dropout needs the weight matrix (its mask has the same shape), so a layer with
/// dropout on its weights always trains with the plain kernel.
pub const TILED_FROM_KEYS: usize = 128;

/// Cached cross-attention with at most this many queries per row (greedy: 1, beam search: the
/// beam size) runs the written-out loops of `kernels::step_attention`; more queries go through
/// matrix products.
pub const STEP_KERNEL_MAX_QUERIES: usize = 8;

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

    /// Rotates `x [batch*len, heads·d_k]` in place (queries: `n_heads`, keys: `n_kv_heads`),
    /// rows at positions `pos ..` (when rotary).
    fn rotate(&self, x: &mut [T], len: usize, heads: usize, pos: usize) {
        if self.rotary {
            let d_head = self.d_model / self.n_heads;
            rope_forward(x, self.rope, len, heads, d_head, pos);
        }
    }

    fn dims(&self, batch: usize, q_len: usize, k_len: usize, kv_stride: usize) -> AttnDims {
        AttnDims {
            batch,
            heads: self.n_heads,
            kv_heads: self.n_kv_heads,
            d_head: self.d_model / self.n_heads,
            q_len,
            k_len,
            kv_stride,
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
        // ctx: [batch*q_len, d_model]
        let mut ctx = vec![T::zero(); x_q.len()];
        let n_weights = batch * self.n_heads * q_len * k_len;
        // drop_mask: [batch, heads, q_len, k_len]
        let drop_mask = rng.and_then(|r| dropout_mask(r, n_weights, self.dropout));
        let weights = if k_len >= TILED_FROM_KEYS && drop_mask.is_none() {
            // lse: [batch*q_len, heads]
            let mut lse = vec![T::zero(); batch * q_len * self.n_heads];
            flash_attention_forward(&mut ctx, &mut lse, &q, &k, &v, dims, mask);
            SavedWeights::LogSumExp(lse)
        } else {
            // probs: [batch, heads, q_len, k_len]
            let mut probs = vec![T::zero(); n_weights];
            let drop = drop_mask.as_deref();
            attention_forward(&mut ctx, &mut probs, &q, &k, &v, dims, mask, drop);
            SavedWeights::Probs { probs, drop_mask }
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
        let mut ctx = vec![T::zero(); x_q.len()];
        let mut probs = vec![T::zero(); batch * self.n_heads * q_len * k_len];
        attention_forward(&mut ctx, &mut probs, &q, &k, &v, dims, mask, None);
        (self.out_proj.forward(&ctx), probs)
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
        let (q, k, v) = (&cache.q, &cache.k, &cache.v);
        match &cache.weights {
            SavedWeights::Probs { probs, drop_mask } => attention_backward(
                &mut dq,
                &mut dk,
                &mut dv,
                &dctx,
                q,
                k,
                v,
                probs,
                cache.dims,
                drop_mask.as_deref(),
            ),
            SavedWeights::LogSumExp(lse) => {
                let mask = AttnMask {
                    key_lens: &cache.key_lens,
                    causal: cache.causal,
                    q_offset: cache.q_offset,
                };
                flash_attention_backward(
                    &mut dq, &mut dk, &mut dv, &dctx, &cache.ctx, lse, q, k, v, cache.dims, mask,
                );
            }
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

    /// Inference with cached keys and values (see [`CachedAttention`]). Queries
    /// `x_q [batch*q_len, d_model]` at positions `cache.len ..` (`batch` is the cache's; beam
    /// search reads one cross-attention row per sentence with its beams as `q_len` queries).
    /// Returns the output and the attention weights `[batch, heads, q_len, k_len]`.
    /// Rotary (self-attention only): the new keys are stored rotated at their positions, and the
    /// queries rotated at the same positions.
    pub fn forward_cached(
        &self,
        x_q: &[T],
        cache: &mut KvCache<T>,
        mode: CachedAttention<'_>,
    ) -> (Vec<T>, Vec<T>) {
        let d = self.d_model;
        let batch = cache.batch;
        let q_len = x_q.len() / (batch * d);
        assert_eq!(
            x_q.len(),
            batch * q_len * d,
            "query rows are not a whole number per cached batch element"
        );
        let q_offset = cache.len;
        let appends = !matches!(mode, CachedAttention::Cross { .. });
        assert!(
            appends || !self.rotary,
            "rotary attention reads a KV cache only when appending (self-attention)"
        );
        if appends {
            let mut k_new = self.k_proj.forward(x_q);
            self.rotate(&mut k_new, q_len, self.n_kv_heads, q_offset);
            cache.append(&k_new, &self.v_proj.forward(x_q));
        }
        let k_len = cache.len;
        let mut q = self.q_proj.forward(x_q);
        self.rotate(&mut q, q_len, self.n_heads, q_offset);
        let mut ctx = vec![T::zero(); x_q.len()];
        let mut probs = vec![T::zero(); batch * self.n_heads * q_len * k_len];
        let paged = |ctx: &mut [T], probs: &mut [T], visible: &[usize]| {
            // A few queries per row: the written-out loops through the cache's table of rows.
            let dims = self.dims(batch, q_len, k_len, cache.capacity);
            let (k, v, rows) = cache.paged();
            step_attention_forward(ctx, probs, &q, k, v, &rows, visible, dims);
        };
        match mode {
            CachedAttention::Step => {
                assert_eq!(q_len, 1, "a step appends one position per row");
                paged(&mut ctx, &mut probs, &vec![k_len; batch]);
            }
            CachedAttention::Cross { key_lens } if q_len <= STEP_KERNEL_MAX_QUERIES => {
                paged(&mut ctx, &mut probs, key_lens);
            }
            CachedAttention::Prefill | CachedAttention::Cross { .. } => {
                let full = vec![k_len; batch];
                let mask = match mode {
                    CachedAttention::Cross { key_lens } => AttnMask {
                        key_lens,
                        causal: false,
                        q_offset: 0,
                    },
                    _ => AttnMask {
                        key_lens: &full,
                        causal: true,
                        q_offset,
                    },
                };
                let dims = self.dims(batch, q_len, k_len, cache.capacity);
                let (k, v) = cache.dense();
                attention_forward(&mut ctx, &mut probs, &q, k, v, dims, mask, None);
            }
        }
        (self.out_proj.forward(&ctx), probs)
    }
}

impl<T: Float> MultiHeadAttention<T> {
    /// A prompt's self-attention when only each row's last position is read further (the last
    /// block of a prefill whose other outputs nobody reads): the keys and values of every
    /// position of `x [batch*q_len, d_model]` are appended to `cache` as in
    /// [`forward_cached`](Self::forward_cached), but only the last position's query is
    /// projected and attends, to every key of its row. Returns `[batch, d_model]`.
    pub fn forward_cached_last(&self, x: &[T], cache: &mut KvCache<T>) -> Vec<T> {
        let d = self.d_model;
        let batch = cache.batch;
        let q_len = x.len() / (batch * d);
        assert!(
            q_len > 0 && x.len() == batch * q_len * d,
            "query rows are not a whole number per cached batch element"
        );
        let mut k_new = self.k_proj.forward(x);
        self.rotate(&mut k_new, q_len, self.n_kv_heads, cache.len);
        cache.append(&k_new, &self.v_proj.forward(x));
        let k_len = cache.len;
        // q: [batch, d_model], the last position of each row, at position k_len - 1
        let mut q = self
            .q_proj
            .forward(&super::residual::last_rows(x, q_len, d));
        self.rotate(&mut q, 1, self.n_heads, k_len - 1);
        let mut ctx = vec![T::zero(); batch * d];
        let mut probs = vec![T::zero(); batch * self.n_heads * k_len];
        let dims = self.dims(batch, 1, k_len, cache.capacity);
        let (k, v, rows) = cache.paged();
        step_attention_forward(
            &mut ctx,
            &mut probs,
            &q,
            k,
            v,
            &rows,
            &vec![k_len; batch],
            dims,
        );
        self.out_proj.forward(&ctx)
    }

    /// Causal self-attention of a continuous-batching step: `x [n, d_model]` are `n` tokens of
    /// any rows of `cache` (a prompt chunk of one sequence, the next token of others; see
    /// [`RaggedTokens`]). Their keys and values are appended to their rows (rotary: rotated at
    /// their own positions, like the queries); token `i` then attends to positions
    /// `0 ..= positions[i]` of its row through the block table, with the step kernel (one
    /// query per token, its own visible count). Returns `[n, d_model]`.
    pub fn forward_ragged(
        &self,
        x: &[T],
        cache: &mut KvCache<T>,
        tokens: RaggedTokens<'_>,
    ) -> Vec<T> {
        let n = tokens.rows.len();
        assert_eq!(x.len(), n * self.d_model, "x is [tokens, d_model]");
        assert_eq!(tokens.positions.len(), n, "one position per token");
        let runs = tokens.runs();
        let mut k_new = self.k_proj.forward(x);
        let mut q = self.q_proj.forward(x);
        let (d_kv, d) = (self.d_kv(), self.d_model);
        for &(s, len) in &runs {
            let pos = tokens.positions[s];
            assert_eq!(
                pos,
                cache.row_len(tokens.rows[s]),
                "tokens continue their row"
            );
            self.rotate(
                &mut k_new[s * d_kv..(s + len) * d_kv],
                len,
                self.n_kv_heads,
                pos,
            );
            self.rotate(&mut q[s * d..(s + len) * d], len, self.n_heads, pos);
        }
        cache.append_ragged(tokens.rows, &k_new, &self.v_proj.forward(x));
        // key_rows: [n, k_len], the stored rows of each token's visible keys.
        let k_len = tokens.positions.iter().max().map_or(0, |&p| p + 1);
        let mut key_rows = Vec::with_capacity(n * k_len);
        let mut visible = Vec::with_capacity(n);
        for i in 0..n {
            let seen = tokens.positions[i] + 1;
            cache.stored_rows_of(tokens.rows[i], seen, &mut key_rows);
            key_rows.resize((i + 1) * k_len, 0);
            visible.push(seen);
        }
        let mut ctx = vec![T::zero(); x.len()];
        let mut probs = vec![T::zero(); n * self.n_heads * k_len];
        let dims = self.dims(n, 1, k_len, k_len);
        let (k, v) = cache.storage();
        step_attention_forward(&mut ctx, &mut probs, &q, k, v, &key_rows, &visible, dims);
        self.out_proj.forward(&ctx)
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
