//! A bias of the key ranges (`KeyRanges::bias`, T5's relative positions) through every kernel:
//! the plain, tiled and step kernels and flash-decoding against float64 loops written from
//!
//! `ctx_i = Σ_j softmax_j(cap(scale · q_i·k_j) + bias(h, b, i, j)) v_j`,
//!
//! the tiled backward against the plain one, and the plain backward against central
//! differences. The bias here is a random table of (row, head, query position, key), the query
//! position read from the range as the model reads it (causal: the range's last key; else `i`).

use super::attention::{
    attend, attend_backward, AttnDims, AttnMask, AttnWeights, KeyRanges, KvView, Purpose,
    SavedRef, Scores,
};
use super::key_ranges::clip;
use crate::rng::Rng;
use std::ops::Range;

fn uniform(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.uniform_range(-1.0, 1.0)).collect()
}

/// `inner`'s ranges with the bias `table [batch, heads, positions, positions]` of (row, head,
/// query position, key).
struct TableBias<R> {
    inner: R,
    causal: bool,
    heads: usize,
    positions: usize,
    table: Vec<f64>,
}

impl<R: KeyRanges> KeyRanges for TableBias<R> {
    fn range(&self, b: usize, i: usize) -> Range<usize> {
        self.inner.range(b, i)
    }

    fn bias(&self, h: usize, b: usize, i: usize, j: usize) -> f64 {
        let p = match self.causal {
            true => self.inner.range(b, i).end - 1,
            false => i,
        };
        let n = self.positions;
        self.table[((b * self.heads + h) * n + p) * n + j]
    }

    fn has_bias(&self) -> bool {
        true
    }
}

fn table_bias<R: KeyRanges>(inner: R, causal: bool, dims: AttnDims, seed: u64) -> TableBias<R> {
    let n = dims.k_len.max(dims.q_len);
    let table = uniform(dims.batch * dims.heads * n * n, seed);
    TableBias {
        inner,
        causal,
        heads: dims.heads,
        positions: n,
        table: table.into_iter().map(|x| 2.0 * x).collect(),
    }
}

/// The context `[batch * q_len, heads * d_head]` in float64 loops, keys and values
/// `[batch * kv_stride, d_kv]`.
fn reference(q: &[f64], k: &[f64], v: &[f64], dims: AttnDims, ranges: &impl KeyRanges) -> Vec<f64> {
    let (d, d_kv, dh) = (dims.d_model(), dims.d_kv(), dims.d_head);
    let group = dims.heads / dims.kv_heads;
    let scale = dims.scores.scale.unwrap_or(1.0 / (dh as f64).sqrt());
    let mut ctx = vec![0.0; dims.batch * dims.q_len * d];
    for b in 0..dims.batch {
        for h in 0..dims.heads {
            for i in 0..dims.q_len {
                let qi = &q[(b * dims.q_len + i) * d + h * dh..][..dh];
                let at = |j: usize| (b * dims.kv_stride + j) * d_kv + (h / group) * dh;
                let seen = clip(ranges.range(b, i), dims.k_len);
                let s: Vec<f64> = seen
                    .clone()
                    .map(|j| {
                        let dot: f64 = qi.iter().zip(&k[at(j)..][..dh]).map(|(a, b)| a * b).sum();
                        let capped = match dims.scores.softcap {
                            Some(c) => c * (scale * dot / c).tanh(),
                            None => scale * dot,
                        };
                        capped + ranges.bias(h, b, i, j)
                    })
                    .collect();
                let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - max).exp()).sum();
                let out = &mut ctx[(b * dims.q_len + i) * d + h * dh..][..dh];
                for (x, j) in s.iter().zip(seen) {
                    let w = (x - max).exp() / z;
                    for (o, &vj) in out.iter_mut().zip(&v[at(j)..][..dh]) {
                        *o += w * vj;
                    }
                }
            }
        }
    }
    ctx
}

fn close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() < tol, "{what} [{i}]: {a} vs {b}");
    }
}

/// An encoder's bias (not causal, padded rows) and a decoder's (causal, queries from position
/// 3 on): plain, tiled and step kernels against the loops (plain and step with a soft cap too),
/// grouped heads; the bias moves the result.
#[test]
fn every_kernel_adds_the_bias_as_the_loops_do() {
    for (causal, q_len, k_len, q_offset, cap) in [
        (false, 140, 140, 0, None),
        (true, 137, 140, 3, None),
        (true, 9, 12, 3, Some(1.5)),
        (false, 10, 10, 0, Some(2.0)),
    ] {
        let dims = AttnDims {
            batch: 2,
            heads: 4,
            kv_heads: 2,
            d_head: 8,
            q_len,
            k_len,
            kv_stride: k_len,
            scores: Scores {
                scale: Some(1.0),
                softcap: cap,
            },
        };
        let lens = [k_len, k_len - 5];
        let mask = AttnMask {
            key_lens: &lens,
            causal,
            q_offset,
        };
        let ranges = table_bias(mask, causal, dims, 7);
        let (n_q, n_kv) = (2 * q_len * dims.d_model(), 2 * k_len * dims.d_kv());
        let (q, k, v) = (uniform(n_q, 1), uniform(n_kv, 2), uniform(n_kv, 3));
        let want = reference(&q, &k, &v, dims, &ranges);
        let unbiased = reference(&q, &k, &v, dims, &mask);
        assert!(want.iter().zip(&unbiased).any(|(a, b)| (a - b).abs() > 1e-2));
        let kv = || KvView::Contiguous { k: &k, v: &v };
        let plain = attend(&q, kv(), &ranges, dims, Purpose::Weights);
        close(&plain.ctx, &want, 1e-12, "plain");
        let train = attend(&q, kv(), &ranges, dims, Purpose::Train { drop: None });
        let tiled = matches!(train.weights, AttnWeights::LogSumExp(_));
        assert_eq!(tiled, k_len >= 128, "the tiled kernel ran from 128 keys");
        close(&train.ctx, &want, 1e-12, "train");
        // The keys stored in a shuffled order, read through the table.
        let mut order: Vec<u32> = (0..(2 * k_len) as u32).collect();
        Rng::new(9).shuffle(&mut order);
        let mut k_rows = vec![0.0; n_kv];
        let mut v_rows = vec![0.0; n_kv];
        let d_kv = dims.d_kv();
        for (at, &r) in order.iter().enumerate() {
            let (to, from) = (r as usize * d_kv, at * d_kv);
            k_rows[to..to + d_kv].copy_from_slice(&k[from..from + d_kv]);
            v_rows[to..to + d_kv].copy_from_slice(&v[from..from + d_kv]);
        }
        let paged = KvView::Paged {
            k: (&k_rows).into(),
            v: (&v_rows).into(),
            rows: &order,
        };
        let step = attend(&q, paged, &ranges, dims, Purpose::Decode);
        close(&step.ctx, &want, 1e-12, "step");
        // Backward: the tiled kernel's against the plain one's, which holds the weights.
        let dctx = uniform(n_q, 5);
        let grads = |a: &super::attention::Attended<f64>| {
            let saved = match &a.weights {
                AttnWeights::Probs(p) => SavedRef::Probs {
                    probs: p,
                    drop: None,
                },
                AttnWeights::LogSumExp(lse) => SavedRef::LogSumExp(lse),
            };
            let (mut dq, mut dk, mut dv) = (vec![0.0; n_q], vec![0.0; n_kv], vec![0.0; n_kv]);
            let g = (&mut dq[..], &mut dk[..], &mut dv[..]);
            attend_backward(g, &dctx, &a.ctx, (&q, &k, &v), saved, &ranges, dims);
            (dq, dk)
        };
        let (dq, dk) = grads(&plain);
        let (tq, tk) = grads(&train);
        close(&tq, &dq, 1e-11, "tiled dq");
        close(&tk, &dk, 1e-11, "tiled dk");
        // The plain backward against central differences of L = Σ dctx ⊙ ctx.
        let loss = |q: &[f64], k: &[f64]| -> f64 {
            let ctx = reference(q, k, &v, dims, &ranges);
            ctx.iter().zip(&dctx).map(|(a, b)| a * b).sum()
        };
        let h = 1e-5;
        for i in (0..n_q).step_by(n_q / 17) {
            let (mut up, mut down) = (q.clone(), q.clone());
            (up[i], down[i]) = (up[i] + h, down[i] - h);
            let numeric = (loss(&up, &k) - loss(&down, &k)) / (2.0 * h);
            assert!((dq[i] - numeric).abs() < 1e-7, "dq {i}: {} {numeric}", dq[i]);
        }
        for i in (0..n_kv).step_by(n_kv / 17) {
            let (mut up, mut down) = (k.clone(), k.clone());
            (up[i], down[i]) = (up[i] + h, down[i] - h);
            let numeric = (loss(&q, &up) - loss(&q, &down)) / (2.0 * h);
            assert!((dk[i] - numeric).abs() < 1e-7, "dk {i}: {} {numeric}", dk[i]);
        }
    }
}

/// One query a row over a long context (flash-decoding: split by keys, f32), rows of different
/// lengths whose query stands at their last key (a ragged step's ranges): against the loops
/// and the one-pass step kernel.
#[test]
fn flash_decoding_adds_the_bias_as_the_loops_do() {
    let (batch, heads, kv_heads, d_head, k_len) = (2, 4, 2, 16, 1500);
    let dims = AttnDims {
        batch,
        heads,
        kv_heads,
        d_head,
        q_len: 1,
        k_len,
        kv_stride: k_len,
        scores: Scores {
            scale: Some(1.0),
            softcap: None,
        },
    };
    let lens = vec![k_len, k_len - 333];
    let ranges = table_bias(lens.clone(), true, dims, 11);
    let n_kv = batch * k_len * dims.d_kv();
    let (q, k, v) = (
        uniform(batch * dims.d_model(), 1),
        uniform(n_kv, 2),
        uniform(n_kv, 3),
    );
    let want = reference(&q, &k, &v, dims, &ranges);
    let f = |x: &[f64]| x.iter().map(|&x| x as f32).collect::<Vec<f32>>();
    let (qf, kf, vf) = (f(&q), f(&k), f(&v));
    let rows: Vec<u32> = (0..(batch * k_len) as u32).collect();
    let mut ctx = vec![0f32; q.len()];
    let mut probs = vec![0f32; batch * heads * k_len];
    let kv = ((&kf[..]).into(), (&vf[..]).into());
    super::flash_decoding::forward(&mut ctx, &mut probs, &qf, kv, &rows, &ranges, dims, 400);
    let got: Vec<f64> = ctx.iter().map(|&x| x as f64).collect();
    close(&got, &want, 2e-5, "flash-decoding");
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let mut one = vec![0f32; q.len()];
    let mut one_probs = vec![0f32; probs.len()];
    pool.install(|| {
        super::step_attention::step_attention_forward(
            &mut one,
            &mut one_probs,
            &qf,
            &kf,
            &vf,
            &rows,
            &ranges,
            dims,
        )
    });
    let one: Vec<f64> = one.iter().map(|&x| x as f64).collect();
    close(&one, &want, 2e-5, "one pass");
}
