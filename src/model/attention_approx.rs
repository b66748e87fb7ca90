//! A self-attention layer's approximation of `softmax(Q Kᵀ / √d_k) V` (config's
//! `layer_attention`, [`AttentionKind`]), in every path of [`MultiHeadAttention`]:
//!
//! - masked kinds (window, sparse, global tokens): the layer's key ranges ([`LayerRanges`]: the
//!   mask's, cut to the sliding window, then to the sparse pattern) given to the one attention
//!   call, so training (plain or tiled kernel), attention maps and every decoding step honour
//!   them; a causal window also bounds the paged KV cache (`super::attention_step`);
//! - linear attention (`kernels::linear_attention`): the running-sum kernel for training and
//!   teacher-forced forwards, its quadratic form's weights for attention maps, and in decoding a
//!   [`LinearState`] per layer kept in the layer's [`KvCache`] instead of keys and values.

use super::attention::MultiHeadAttention;
use super::attention_kind::AttentionKind;
use super::kv_cache::KvCache;
use crate::backend::{AttnDims, AttnMask, Backend, KeyRanges, LinearState, Pattern, CPU};
use crate::Float;
use std::ops::Range;

/// A layer's key ranges: `inner` (the mask or a step's ranges) cut to the last `window` keys
/// (a causal sliding window), then to the sparse `pattern` (with whether the layer is causal,
/// which says how a query's position is read, see `kernels::sparse_pattern`). With neither, the
/// same ranges as `inner`.
#[derive(Clone, Copy, Debug)]
pub struct LayerRanges<R> {
    pub inner: R,
    pub window: Option<usize>,
    pub pattern: Option<(Pattern, bool)>,
}

impl<R: KeyRanges> LayerRanges<R> {
    /// The inner range cut to the window (as `kernels::key_ranges::Windowed`).
    fn windowed(&self, b: usize, i: usize) -> Range<usize> {
        let r = self.inner.range(b, i);
        match self.window {
            Some(w) => r.start.max(r.end.saturating_sub(w))..r.end,
            None => r,
        }
    }
}

impl<R: KeyRanges> KeyRanges for LayerRanges<R> {
    fn range(&self, b: usize, i: usize) -> Range<usize> {
        let r = self.windowed(b, i);
        match self.pattern {
            Some((pattern, causal)) => {
                let p = Pattern::query_position(&r, i, causal);
                pattern.envelope(r, p)
            }
            None => r,
        }
    }

    fn sees(&self, b: usize, i: usize, j: usize) -> bool {
        let seen = match self.pattern {
            Some((pattern, causal)) => {
                let r = self.windowed(b, i);
                pattern.sees(Pattern::query_position(&r, i, causal), j)
            }
            None => true,
        };
        seen && self.inner.sees(b, i, j)
    }

    fn has_holes(&self) -> bool {
        self.pattern.is_some_and(|(p, _)| p.has_holes()) || self.inner.has_holes()
    }

    fn bias(&self, h: usize, b: usize, i: usize, j: usize) -> f64 {
        self.inner.bias(h, b, i, j)
    }

    fn has_bias(&self) -> bool {
        self.inner.has_bias()
    }

    fn sink(&self, h: usize) -> Option<f64> {
        self.inner.sink(h)
    }
}

impl<T: Float> MultiHeadAttention<T> {
    /// The same layer computing `kind` (`causal`: a decoder's self-attention, whose window is
    /// the sliding [`window`](Self::window); an encoder's window is a band `|p − j| < w`).
    pub fn with_kind(mut self, kind: AttentionKind, causal: bool) -> Self {
        self.set_kind(kind, causal);
        self
    }

    /// Makes this layer compute `kind` (see [`with_kind`](Self::with_kind)); exact leaves it
    /// as it is (a `layer_windows` window stays).
    pub fn set_kind(&mut self, kind: AttentionKind, causal: bool) {
        match kind {
            AttentionKind::Exact => {}
            AttentionKind::Linear => self.linear = true,
            AttentionKind::Window { window } if causal => self.window = Some(window),
            _ => self.pattern = kind.pattern().map(|p| (p, causal)),
        }
    }

    /// `ranges` as this layer sees them: cut to its window and pattern ([`LayerRanges`]).
    pub fn layer_ranges<R: KeyRanges>(&self, ranges: R) -> LayerRanges<R> {
        LayerRanges {
            inner: ranges,
            window: self.window,
            pattern: self.pattern,
        }
    }

    /// Linear attention's context `[batch*q_len, d_q]` of projected `q`, `k`, `v` under `mask`.
    pub(super) fn linear_context(
        &self,
        (q, k, v): (&[T], &[T], &[T]),
        dims: AttnDims,
        mask: AttnMask<'_>,
    ) -> Vec<T> {
        let mut ctx = vec![T::zero(); dims.batch * dims.q_len * dims.d_model()];
        CPU.linear_attention(&mut ctx, q, k, v, dims, mask);
        ctx
    }

    /// Linear attention's context and its quadratic form's weights `[batch, heads, q_len,
    /// k_len]` (attention maps).
    pub(super) fn linear_context_weights(
        &self,
        qkv: (&[T], &[T], &[T]),
        dims: AttnDims,
        mask: AttnMask<'_>,
    ) -> (Vec<T>, Vec<T>) {
        let weights = CPU.linear_attention_weights(qkv.0, qkv.1, dims, mask);
        (self.linear_context(qkv, dims, mask), weights)
    }

    /// Backward of [`linear_context`](Self::linear_context): `(dq, dk, dv)` into `grads`.
    pub(super) fn linear_backward(
        &self,
        grads: (&mut [T], &mut [T], &mut [T]),
        dctx: &[T],
        (q, k, v): (&[T], &[T], &[T]),
        dims: AttnDims,
        mask: AttnMask<'_>,
    ) {
        let (dq, dk, dv) = grads;
        CPU.linear_attention_backward((dq, dk, dv), dctx, q, k, v, dims, mask);
    }

    /// A decoding step of a linear-attention layer: token `i` of `x [n, d_model]` belongs to
    /// row `rows[i]` (in order within a row); its key and value are summed into the row's
    /// running state (kept in `cache`, which then holds no keys or values) and its query reads
    /// it. Returns the output `[n, d_model]`; the cache's positions advance by the tokens.
    pub(super) fn linear_step(&self, x: &[T], cache: &mut KvCache<T>, rows: &[usize]) -> Vec<T> {
        let n = rows.len();
        let (d_q, d_kv) = (self.d_q(), self.d_kv());
        let mut k = self.keys(x);
        let mut q = self.queries(x);
        let v = self.v_proj.forward(x);
        for (i, &r) in rows.iter().enumerate() {
            let pos = cache.row_len(r) + rows[..i].iter().filter(|&&o| o == r).count();
            self.rotate(&mut k[i * d_kv..(i + 1) * d_kv], 1, self.n_kv_heads, pos);
            self.rotate(&mut q[i * d_q..(i + 1) * d_q], 1, self.n_heads, pos);
        }
        let (kv_heads, d_head) = (self.n_kv_heads, self.d_head);
        let state = cache.linear_state(|rows| LinearState::new(rows, kv_heads, d_head));
        let mut ctx = vec![T::zero(); n * d_q];
        for (i, &r) in rows.iter().enumerate() {
            let (qi, ki) = (&q[i * d_q..(i + 1) * d_q], &k[i * d_kv..(i + 1) * d_kv]);
            let vi = &v[i * d_kv..(i + 1) * d_kv];
            CPU.linear_attention_step(state, r, (qi, ki, vi), &mut ctx[i * d_q..(i + 1) * d_q]);
        }
        cache.advance_ragged(rows);
        self.output(x, &ctx)
    }
}
