//! Attention sinks (gpt-oss): head `h` has a learned logit `s_h` that joins the denominator of
//! each of its softmaxes and carries no value,
//!
//! `p_j = e^{x_j} / (Σ_t e^{x_t} + e^{s_h})`,   `ctx = Σ_j p_j v_j`,
//!
//! so a query may attend to almost nothing: its weights sum to `1 − p_sink`, `p_sink =
//! e^{s_h} / (Σ_t e^{x_t} + e^{s_h})`. With `lse = ln Σ_t e^{x_t}` (the scores' log-sum-exp), the
//! weights are the plain softmax's times one factor per query and head,
//!
//! `p_j = softmax(x)_j · σ(lse − s_h)`,   `σ(z) = 1 / (1 + e^{−z})`,
//!
//! and the log-sum-exp with the sink is `lse' = lse + ln(1 + e^{s_h − lse})`. Every kernel
//! computes its softmax as before and then applies the factor: the plain and step kernels through
//! [`softmax_with_sink`] (`lse = m − ln p_max`, read back from the row's largest score `m` and
//! its weight `p_max = 1 / Σ_t e^{x_t − m}`), flash-decoding from its merged `m` and `ℓ`, the
//! tiled kernel from its saved log-sum-exps ([`sink_tiled`], which also stores `lse'`).
//!
//! The backward of the scores needs nothing more: `ds = p ⊙ (dp − Σ_j p_j dp_j)` holds with the
//! sinked weights (the sink is one more entry of the same softmax), and the tiled backward
//! recomputes them from `lse'`. The sink's own gradient, `−Σ_rows p_sink · (dctx_h · ctx_h)`,
//! is the attention layer's (`model::attention`), from the weights or `lse'` kept here.
//!
//! The sinks reach the kernels with the key ranges ([`WithSinks`], [`KeyRanges::sink`]), as the
//! other per-head additions to the scores do.

use super::key_ranges::KeyRanges;
use crate::Float;
use std::ops::Range;

/// `inner`'s ranges with one sink logit per query head, `sinks [heads]`.
#[derive(Clone, Copy, Debug)]
pub struct WithSinks<'a, R> {
    pub inner: R,
    pub sinks: &'a [f64],
}

impl<R: KeyRanges> KeyRanges for WithSinks<'_, R> {
    fn range(&self, b: usize, i: usize) -> Range<usize> {
        self.inner.range(b, i)
    }

    fn sees(&self, b: usize, i: usize, j: usize) -> bool {
        self.inner.sees(b, i, j)
    }

    fn has_holes(&self) -> bool {
        self.inner.has_holes()
    }

    fn bias(&self, h: usize, b: usize, i: usize, j: usize) -> f64 {
        self.inner.bias(h, b, i, j)
    }

    fn has_bias(&self) -> bool {
        self.inner.has_bias()
    }

    fn sink(&self, h: usize) -> Option<f64> {
        Some(self.sinks[h])
    }
}

/// The factor `σ(lse − s)` of the plain softmax's weights under a sink `s` (module docs); 1
/// when no key is seen (`lse = −∞` leaves nothing to scale).
pub fn sink_factor(lse: f64, sink: f64) -> f64 {
    if lse == f64::NEG_INFINITY {
        return 1.0;
    }
    1.0 / (1.0 + (sink - lse).exp())
}

/// The log-sum-exp with the sink, `lse' = ln(e^{lse} + e^{s})`.
pub fn sinked_lse(lse: f64, sink: f64) -> f64 {
    let m = lse.max(sink);
    m + ((lse - m).exp() + (sink - m).exp()).ln()
}

/// One query's softmax over its scores of head `h` (`row`: the keys in its range, hidden ones
/// −∞) computed by `softmax`, then scaled by the head's sink factor when `ranges` has a sink.
pub fn softmax_with_sink<T: Float>(
    ranges: &impl KeyRanges,
    h: usize,
    row: &mut [T],
    softmax: impl FnOnce(&mut [T]),
) {
    let Some(sink) = ranges.sink(h) else {
        softmax(row);
        return;
    };
    // (the largest score and where it is)
    let (mut at, mut m) = (None, f64::NEG_INFINITY);
    for (j, &x) in row.iter().enumerate() {
        if x.f64() > m {
            (at, m) = (Some(j), x.f64());
        }
    }
    softmax(row);
    let Some(at) = at else {
        return;
    };
    let lse = m - row[at].f64().ln();
    let f = T::of(sink_factor(lse, sink));
    row.iter_mut().for_each(|p| *p *= f);
}

/// The tiled kernel's output under sinks: each head's context columns of `ctx [rows,
/// heads·d_head]` scaled by `σ(lse − s_h)` and `lse [rows, heads]` replaced by `lse'` (module
/// docs); nothing without sinks.
pub fn sink_tiled<T: Float>(
    ctx: &mut [T],
    lse: &mut [T],
    ranges: &impl KeyRanges,
    (heads, d_head): (usize, usize),
) {
    if ranges.sink(0).is_none() {
        return;
    }
    for (c_row, l_row) in ctx.chunks_mut(heads * d_head).zip(lse.chunks_mut(heads)) {
        for (h, (c_h, l)) in c_row.chunks_mut(d_head).zip(l_row.iter_mut()).enumerate() {
            let Some(sink) = ranges.sink(h) else { continue };
            let f = T::of(sink_factor(l.f64(), sink));
            c_h.iter_mut().for_each(|c| *c *= f);
            *l = T::of(sinked_lse(l.f64(), sink));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::attention::{attend, AttnDims, AttnWeights, KvView, Purpose, Scores};
    use super::super::key_ranges::{clip, AttnMask};
    use super::*;
    use crate::rng::Rng;

    fn uniform(n: usize, seed: u64, scale: f64) -> Vec<f64> {
        let mut rng = Rng::new(seed);
        (0..n).map(|_| scale * rng.uniform_range(-1.0, 1.0)).collect()
    }

    /// Attention with sinks written out in float64 as transformers' eager gpt-oss attention
    /// computes it: the sink appended to each row of scores, the softmax over all, the sink's
    /// column dropped. Returns the context and the weights `[batch, heads, q_len, k_len]`.
    fn naive(
        (q, k, v): (&[f64], &[f64], &[f64]),
        dims: AttnDims,
        ranges: &impl KeyRanges,
        sinks: &[f64],
    ) -> (Vec<f64>, Vec<f64>) {
        let (d, d_kv, group, dh) = (dims.d_model(), dims.d_kv(), dims.group(), dims.d_head);
        let mut ctx = vec![0.0; dims.batch * dims.q_len * d];
        let mut probs = vec![0.0; dims.batch * dims.heads * dims.q_len * dims.k_len];
        for b in 0..dims.batch {
            for h in 0..dims.heads {
                for i in 0..dims.q_len {
                    let qi = &q[(b * dims.q_len + i) * d + h * dh..][..dh];
                    let key = |t: usize| (b * dims.kv_stride + t) * d_kv + (h / group) * dh;
                    let seen = clip(ranges.range(b, i), dims.k_len);
                    let mut s: Vec<f64> = seen
                        .clone()
                        .map(|t| {
                            let dot: f64 = qi.iter().zip(&k[key(t)..][..dh]).map(|(a, b)| a * b).sum();
                            dot / (dh as f64).sqrt()
                        })
                        .collect();
                    s.push(sinks[h]);
                    let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let z: f64 = s.iter().map(|x| (x - max).exp()).sum();
                    let out = &mut ctx[(b * dims.q_len + i) * d + h * dh..][..dh];
                    for (x, t) in s.iter().zip(seen) {
                        let w = (x - max).exp() / z;
                        probs[((b * dims.heads + h) * dims.q_len + i) * dims.k_len + t] = w;
                        for (o, &vt) in out.iter_mut().zip(&v[key(t)..][..dh]) {
                            *o += w * vt;
                        }
                    }
                }
            }
        }
        (ctx, probs)
    }

    fn close(a: &[f64], b: &[f64], tol: f64, what: &str) {
        assert_eq!(a.len(), b.len(), "{what}");
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        assert!(worst < tol, "{what}: {worst}");
    }

    /// The plain, tiled and step kernels (and a sliding window) with sinks against the float64
    /// loops of the concatenated softmax; sinks large enough to take most of the weight of some
    /// heads and none of others. The weights of a query then sum to less than one.
    #[test]
    fn every_kernel_matches_the_concatenated_softmax() {
        let dims = AttnDims {
            batch: 2,
            heads: 4,
            kv_heads: 2,
            d_head: 8,
            q_len: 130,
            k_len: 130,
            kv_stride: 130,
            scores: Scores::default(),
        };
        let n_q = dims.batch * dims.q_len * dims.d_model();
        let n_kv = dims.batch * dims.kv_stride * dims.d_kv();
        let (q, k, v) = (uniform(n_q, 1, 2.0), uniform(n_kv, 2, 2.0), uniform(n_kv, 3, 1.0));
        let sinks = [3.0, -20.0, 0.5, 1.5];
        let lens = [130, 97];
        let mask = AttnMask {
            key_lens: &lens,
            causal: true,
            q_offset: 0,
        };
        let table: Vec<u32> = (0..(dims.batch * dims.kv_stride) as u32).collect();
        for window in [None, Some(7)] {
            let check = |ranges: &dyn KeyRanges| {
                let sinked = WithSinks {
                    inner: ranges,
                    sinks: &sinks,
                };
                let (want, want_probs) = naive((&q, &k, &v), dims, &ranges, &sinks);
                let contiguous = || KvView::Contiguous { k: &k, v: &v };
                let plain = attend(&q, contiguous(), sinked, dims, Purpose::Weights);
                close(&plain.ctx, &want, 1e-12, "plain");
                let AttnWeights::Probs(p) = &plain.weights else {
                    unreachable!()
                };
                close(p, &want_probs, 1e-12, "plain weights");
                let train = Purpose::Train { drop: None };
                let tiled = attend(&q, contiguous(), sinked, dims, train);
                close(&tiled.ctx, &want, 1e-12, "tiled");
                let AttnWeights::LogSumExp(lse) = &tiled.weights else {
                    unreachable!()
                };
                // lse' read back: every weight is e^{x_j − lse'}, the sink's e^{s − lse'}.
                for (r, l) in lse.chunks(dims.heads).enumerate() {
                    let (b, i) = (r / dims.q_len, r % dims.q_len);
                    for (h, &l) in l.iter().enumerate() {
                        let at = ((b * dims.heads + h) * dims.q_len + i) * dims.k_len;
                        let total: f64 = want_probs[at..at + dims.k_len].iter().sum();
                        let p_sink = (sinks[h] - l).exp();
                        assert!((total + p_sink - 1.0).abs() < 1e-12, "lse' of {r}, {h}");
                    }
                }
                let paged = KvView::Paged {
                    k: (&k).into(),
                    v: (&v).into(),
                    rows: &table,
                };
                let step = attend(&q, paged, sinked, dims, Purpose::Decode);
                close(&step.ctx, &want, 1e-12, "step");
                let AttnWeights::Probs(p) = &step.weights else {
                    unreachable!()
                };
                close(p, &want_probs, 1e-12, "step weights");
                // A large sink takes weight: some query's weights sum well below one.
                assert!(want_probs
                    .chunks(dims.k_len)
                    .any(|row| row.iter().sum::<f64>() < 0.5));
            };
            match window {
                None => check(&mask),
                Some(w) => check(&mask.windowed(w)),
            }
        }
    }

    /// The f32 step kernel (vectorised softmax) and flash-decoding (a long context split in
    /// chunks) with sinks against the float64 loops.
    #[test]
    fn f32_steps_and_flash_decoding_apply_the_sink() {
        let (batch, heads, kv_heads, d_head) = (2, 4, 2, 16);
        for k_len in [40, 3000] {
            let dims = AttnDims {
                batch,
                heads,
                kv_heads,
                d_head,
                q_len: 1,
                k_len,
                kv_stride: k_len,
                scores: Scores::default(),
            };
            let n_q = batch * dims.d_model();
            let n_kv = batch * k_len * dims.d_kv();
            let (q, k, v) = (uniform(n_q, 4, 2.0), uniform(n_kv, 5, 2.0), uniform(n_kv, 6, 1.0));
            let sinks = [2.0, -3.0, 6.0, 0.0];
            let lens = vec![k_len, k_len - 3];
            let (want, _) = naive((&q, &k, &v), dims, &lens, &sinks);
            let f = |x: &[f64]| x.iter().map(|&y| y as f32).collect::<Vec<f32>>();
            let (qf, kf, vf) = (f(&q), f(&k), f(&v));
            let table: Vec<u32> = (0..(batch * k_len) as u32).collect();
            let sinked = WithSinks {
                inner: &lens,
                sinks: &sinks,
            };
            let run = || {
                let kv = KvView::Paged {
                    k: (&kf).into(),
                    v: (&vf).into(),
                    rows: &table,
                };
                attend(&qf, kv, sinked, dims, Purpose::Decode).ctx
            };
            // flash-decoding splits a long step only on a pool of several threads
            let pool = rayon::ThreadPoolBuilder::new().num_threads(4).build().unwrap();
            let got: Vec<f64> = pool.install(run).iter().map(|&x| x as f64).collect();
            close(&got, &want, 2e-5, &format!("f32 step of {k_len} keys"));
        }
    }

    #[test]
    fn the_factor_and_the_sinked_log_sum_exp() {
        let (lse, s) = (1.25f64, 0.5f64);
        let f = sink_factor(lse, s);
        assert!((f - lse.exp() / (lse.exp() + s.exp())).abs() < 1e-15);
        assert!((sinked_lse(lse, s) - (lse.exp() + s.exp()).ln()).abs() < 1e-15);
        assert_eq!(sink_factor(f64::NEG_INFINITY, s), 1.0);
        assert!((sinked_lse(f64::NEG_INFINITY, s) - s).abs() < 1e-15);
    }
}
