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
//! at `j` (plus a common shift, see [`MultiHeadAttention::forward_at`]). A [`KvCache`] or
//! [`StepKvCache`] of a rotary layer stores its keys already rotated. Cross-attention is never
//! rotary.

use super::kv_cache::{KvCache, StepKvCache};
use super::linear::Linear;
use super::param::{Module, Param};
use crate::kernels::attention::{attention_backward, attention_forward, AttnDims, AttnMask};
use crate::kernels::dropout::dropout_mask;
use crate::kernels::flash_attention::{flash_attention_backward, flash_attention_forward};
use crate::kernels::rope::{rope_backward, rope_forward};
use crate::kernels::step_attention::step_attention_forward;
use crate::rng::Rng;
use crate::Float;

/// Multi-head attention with h heads of d_k = d_model / h.
#[derive(Clone, Debug)]
pub struct MultiHeadAttention<T> {
    pub q_proj: Linear<T>,
    pub k_proj: Linear<T>,
    pub v_proj: Linear<T>,
    pub out_proj: Linear<T>,
    pub n_heads: usize,
    pub d_model: usize,
    /// Rotary positions on queries and keys (self-attention only).
    pub rotary: bool,
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
    /// Attention weights [batch, heads, q_len, k_len] (rows sum to one over visible keys), kept
    /// by the plain kernel; empty when the tiled kernel ran (see [`TILED_FROM_KEYS`]).
    pub probs: Vec<T>,
    /// Log-sum-exp of each score row [batch*q_len, heads], kept by the tiled kernel instead of
    /// the weights (empty after the plain kernel).
    pub lse: Vec<T>,
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
    /// The attention-dropout mask [batch, heads, q_len, k_len] (plain kernel only).
    pub drop_mask: Option<Vec<T>>,
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
    pub fn new(d_model: usize, n_heads: usize, rng: &mut Rng) -> Self {
        MultiHeadAttention {
            q_proj: Linear::new(d_model, d_model, rng),
            k_proj: Linear::new(d_model, d_model, rng),
            v_proj: Linear::new(d_model, d_model, rng),
            out_proj: Linear::new(d_model, d_model, rng),
            n_heads,
            d_model,
            rotary: false,
            dropout: 0.0,
        }
    }

    /// The same layer with attention dropout `p`.
    pub fn with_dropout(mut self, p: f64) -> Self {
        self.dropout = p;
        self
    }

    /// Transposed weight copies of the four projections for inference
    /// (see [`Linear::prepare_inference`]).
    pub fn prepare_inference(&mut self) {
        for linear in [
            &mut self.q_proj,
            &mut self.k_proj,
            &mut self.v_proj,
            &mut self.out_proj,
        ] {
            linear.prepare_inference();
        }
    }

    /// The same layer with rotary positions switched on or off.
    pub fn with_rotary(mut self, rotary: bool) -> Self {
        self.rotary = rotary;
        self
    }

    /// Rotates `x [batch*len, d_model]` in place, rows at positions `pos ..` (when rotary).
    fn rotate(&self, x: &mut [T], len: usize, pos: usize) {
        if self.rotary {
            rope_forward(x, len, self.n_heads, self.d_model / self.n_heads, pos);
        }
    }

    fn dims(&self, batch: usize, q_len: usize, k_len: usize, kv_stride: usize) -> AttnDims {
        AttnDims {
            batch,
            heads: self.n_heads,
            d_head: self.d_model / self.n_heads,
            q_len,
            k_len,
            kv_stride,
        }
    }

    /// Queries from `x_q [batch*q_len, d_model]`, keys and values from `x_kv [batch*k_len,
    /// d_model]` (the same tensor for self-attention). Returns `[batch*q_len, d_model]`.
    /// Rotary: queries at positions `mask.q_offset ..`, keys at `0 ..`.
    pub fn forward(
        &self,
        x_q: &[T],
        x_kv: &[T],
        batch: usize,
        mask: AttnMask<'_>,
    ) -> (Vec<T>, AttentionCache<T>) {
        self.forward_with(x_q, x_kv, batch, mask, 0, None)
    }

    /// [`forward`](Self::forward) with attention dropout drawn from `rng` when it is given and
    /// the layer's [`dropout`](Self::dropout) is positive.
    pub fn forward_train(
        &self,
        x_q: &[T],
        x_kv: &[T],
        batch: usize,
        mask: AttnMask<'_>,
        rng: Option<&mut Rng>,
    ) -> (Vec<T>, AttentionCache<T>) {
        self.forward_with(x_q, x_kv, batch, mask, 0, rng)
    }

    /// [`forward`](Self::forward) with every rotary position shifted by `shift`: queries at
    /// `shift + mask.q_offset + i`, keys at `shift + j`. Without rotary, `shift` has no effect;
    /// with it, the result does not depend on `shift` either (up to rounding), since rotary
    /// scores see relative positions only.
    pub fn forward_at(
        &self,
        x_q: &[T],
        x_kv: &[T],
        batch: usize,
        mask: AttnMask<'_>,
        shift: usize,
    ) -> (Vec<T>, AttentionCache<T>) {
        self.forward_with(x_q, x_kv, batch, mask, shift, None)
    }

    fn forward_with(
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
        let mut q = self.q_proj.forward(x_q);
        let mut k = self.k_proj.forward(x_kv);
        let v = self.v_proj.forward(x_kv);
        let (q_pos, k_pos) = (shift + mask.q_offset, shift);
        self.rotate(&mut q, q_len, q_pos);
        self.rotate(&mut k, k_len, k_pos);
        let dims = self.dims(batch, q_len, k_len, k_len);
        // ctx: [batch*q_len, d_model]; probs: [batch, heads, q_len, k_len] or lse: [batch*q_len, heads]
        let mut ctx = vec![T::zero(); x_q.len()];
        let (mut probs, mut lse) = (Vec::new(), Vec::new());
        let n_weights = batch * self.n_heads * q_len * k_len;
        // drop_mask: [batch, heads, q_len, k_len]
        let drop_mask = rng.and_then(|r| dropout_mask(r, n_weights, self.dropout));
        if k_len >= TILED_FROM_KEYS && drop_mask.is_none() {
            lse = vec![T::zero(); batch * q_len * self.n_heads];
            flash_attention_forward(&mut ctx, &mut lse, &q, &k, &v, dims, mask);
        } else {
            probs = vec![T::zero(); n_weights];
            let drop = drop_mask.as_deref();
            attention_forward(&mut ctx, &mut probs, &q, &k, &v, dims, mask, drop);
        }
        let y = self.out_proj.forward(&ctx);
        let cache = AttentionCache {
            q,
            k,
            v,
            probs,
            lse,
            key_lens: mask.key_lens.to_vec(),
            causal: mask.causal,
            q_offset: mask.q_offset,
            ctx,
            dims,
            q_pos,
            k_pos,
            drop_mask,
        };
        (y, cache)
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
        if cache.lse.is_empty() {
            let (q, k, v) = (&cache.q, &cache.k, &cache.v);
            attention_backward(
                &mut dq,
                &mut dk,
                &mut dv,
                &dctx,
                q,
                k,
                v,
                &cache.probs,
                cache.dims,
                cache.drop_mask.as_deref(),
            );
        } else {
            let mask = AttnMask {
                key_lens: &cache.key_lens,
                causal: cache.causal,
                q_offset: cache.q_offset,
            };
            flash_attention_backward(
                &mut dq, &mut dk, &mut dv, &dctx, &cache.ctx, &cache.lse, &cache.q, &cache.k,
                &cache.v, cache.dims, mask,
            );
        }
        if self.rotary {
            let (heads, d_head) = (self.n_heads, self.d_model / self.n_heads);
            rope_backward(&mut dq, cache.dims.q_len, heads, d_head, cache.q_pos);
            rope_backward(&mut dk, cache.dims.k_len, heads, d_head, cache.k_pos);
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
        self.rotate(&mut k, k_len, 0);
        KvCache {
            k,
            v: self.v_proj.forward(x_kv),
            batch,
            capacity: k_len,
            len: k_len,
        }
    }

    /// Inference with cached keys/values. Queries `x_q [batch*q_len, d_model]` at positions
    /// `cache.len ..` (`batch` is the cache's; beam search reads one cross-attention cache row
    /// per sentence with its beams as `q_len` queries); when `append` is true their own keys/values are first written into the
    /// cache (self-attention), otherwise the cache is read as is (cross-attention). Masking:
    /// `key_lens` (padding, for cross-attention) or causal within the appended block.
    /// Returns the output and the attention weights `[batch, heads, q_len, k_len]`.
    /// Rotary (self-attention, `append` only): the new keys are stored rotated at positions
    /// `cache.len ..`, and the queries rotated at the same positions.
    pub fn forward_cached(
        &self,
        x_q: &[T],
        cache: &mut KvCache<T>,
        append: bool,
        key_lens: Option<&[usize]>,
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
        assert!(
            append || !self.rotary,
            "rotary attention reads a KV cache only when appending (self-attention)"
        );
        if append {
            assert!(
                cache.len + q_len <= cache.capacity,
                "KV cache capacity exceeded"
            );
            let mut k_new = self.k_proj.forward(x_q);
            self.rotate(&mut k_new, q_len, q_offset);
            let v_new = self.v_proj.forward(x_q);
            for b in 0..batch {
                let dst = (b * cache.capacity + cache.len) * d;
                let src = b * q_len * d;
                cache.k[dst..dst + q_len * d].copy_from_slice(&k_new[src..src + q_len * d]);
                cache.v[dst..dst + q_len * d].copy_from_slice(&v_new[src..src + q_len * d]);
            }
            cache.len += q_len;
        }
        let k_len = cache.len;
        let mut q = self.q_proj.forward(x_q);
        self.rotate(&mut q, q_len, q_offset);
        let dims = self.dims(batch, q_len, k_len, cache.capacity);
        let full = vec![k_len; batch];
        let mask = AttnMask {
            key_lens: key_lens.unwrap_or(&full),
            causal: append,
            q_offset: if append { q_offset } else { 0 },
        };
        let mut ctx = vec![T::zero(); x_q.len()];
        let mut probs = vec![T::zero(); batch * self.n_heads * q_len * k_len];
        let (k, v) = (&cache.k, &cache.v);
        if !append && q_len <= STEP_KERNEL_MAX_QUERIES {
            // Decoding's cross-attention: a few queries per row, written-out loops (see
            // `kernels::step_attention`) through the trivial table of the cache's rows.
            let cap = cache.capacity;
            assert!(batch * cap <= u32::MAX as usize, "KV cache too large");
            let table: Vec<u32> = (0..batch)
                .flat_map(|b| (0..k_len).map(move |t| (b * cap + t) as u32))
                .collect();
            let dims = AttnDims {
                kv_stride: k_len,
                ..dims
            };
            step_attention_forward(&mut ctx, &mut probs, &q, k, v, &table, mask.key_lens, dims);
        } else {
            attention_forward(&mut ctx, &mut probs, &q, k, v, dims, mask, None);
        }
        (self.out_proj.forward(&ctx), probs)
    }
}

impl<T: Float> MultiHeadAttention<T> {
    /// One decoding step of self-attention: the queries `x_q [batch, d_model]` are the tokens at
    /// position `cache.len`; their keys and values are appended to the cache first, then each
    /// query attends to its row's keys `0 ..= cache.len` wherever they are stored
    /// (`kernels::step_attention`). Returns the output `[batch, d_model]` and the attention
    /// weights `[batch, heads, 1, len]`. Rotary: keys and queries rotated at their position.
    pub fn forward_step(&self, x_q: &[T], cache: &mut StepKvCache<T>) -> (Vec<T>, Vec<T>) {
        let (d, batch, pos) = (self.d_model, cache.batch, cache.len);
        assert_eq!(x_q.len(), batch * d, "one query row per cached batch row");
        let mut k_new = self.k_proj.forward(x_q);
        self.rotate(&mut k_new, 1, pos);
        cache.push(&k_new, &self.v_proj.forward(x_q));
        let mut q = self.q_proj.forward(x_q);
        self.rotate(&mut q, 1, pos);
        let dims = self.dims(batch, 1, cache.len, cache.capacity);
        let mut ctx = vec![T::zero(); x_q.len()];
        let mut probs = vec![T::zero(); batch * self.n_heads * cache.len];
        let (k, v, rows) = (&cache.k, &cache.v, &cache.rows);
        let visible = vec![cache.len; batch];
        step_attention_forward(&mut ctx, &mut probs, &q, k, v, rows, &visible, dims);
        (self.out_proj.forward(&ctx), probs)
    }
}

impl<T> Module<T> for MultiHeadAttention<T> {
    fn collect_params<'a>(&'a mut self, prefix: &str, out: &mut Vec<(String, &'a mut Param<T>)>) {
        self.q_proj.collect_params(&format!("{prefix}.q_proj"), out);
        self.k_proj.collect_params(&format!("{prefix}.k_proj"), out);
        self.v_proj.collect_params(&format!("{prefix}.v_proj"), out);
        self.out_proj
            .collect_params(&format!("{prefix}.out_proj"), out);
    }
}
