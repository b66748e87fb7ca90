//! Attention sinks (gpt-oss): head `h` of a self-attention has a learned logit `s_h` that joins
//! the denominator of each of its softmaxes and carries no value,
//!
//! `head_h = Σ_j p_j v_j`,   `p_j = e^{x_j} / (Σ_t e^{x_t} + e^{s_h})`,
//!
//! the scores `x` as `super::attention` computes them (scale, window, mask). The kernels apply it
//! through the key ranges of the one attention call (`kernels::sinks`: the plain softmax's
//! weights times `σ(lse − s_h)`), so every path (training, attention maps, each decoding layout)
//! has it. Backward: the scores' gradient is the softmax's with these weights (the sink is one
//! more entry of the same softmax), and the sink's own is
//!
//! `∂L/∂s_h = −Σ_rows p_sink · (dctx_h · ctx_h)`,   `p_sink = 1 − Σ_j p_j = e^{s_h − lse'}`,
//!
//! since `∂p_j/∂s_h = −p_j p_sink`, so `∂ctx_h/∂s_h = −p_sink ctx_h`.

use super::attention::{AttentionCache, MultiHeadAttention, SavedWeights};
use crate::Float;

impl<T: Float> MultiHeadAttention<T> {
    /// Accumulates the sinks' gradient from the context's `dctx` and what the forward kept
    /// (see the module docs): `p_sink` from the kept weights (`1 − Σ_j p_j`) or log-sum-exps
    /// (`e^{s_h − lse'}`); nothing without sinks.
    pub(super) fn sinks_backward(&mut self, cache: &AttentionCache<T>, dctx: &[T]) {
        let Some(sinks) = &mut self.sinks else {
            return;
        };
        let (heads, d_head, dims) = (self.n_heads, self.d_head, cache.dims);
        let d = heads * d_head;
        for (r, (dc, c)) in dctx.chunks(d).zip(cache.ctx.chunks(d)).enumerate() {
            let (b, i) = (r / dims.q_len, r % dims.q_len);
            for h in 0..heads {
                let p_sink = match &cache.weights {
                    SavedWeights::Probs { probs, .. } => {
                        let at = ((b * heads + h) * dims.q_len + i) * dims.k_len;
                        let seen: f64 = probs[at..at + dims.k_len].iter().map(|p| p.f64()).sum();
                        1.0 - seen
                    }
                    SavedWeights::LogSumExp(lse) => {
                        (sinks.value.data[h].f64() - lse[r * heads + h].f64()).exp()
                    }
                    SavedWeights::Linear => return,
                };
                let cols = h * d_head..(h + 1) * d_head;
                let dot: f64 = dc[cols.clone()]
                    .iter()
                    .zip(&c[cols])
                    .map(|(a, b)| a.f64() * b.f64())
                    .sum();
                sinks.grad.data[h] += T::of(-p_sink * dot);
            }
        }
    }
}
