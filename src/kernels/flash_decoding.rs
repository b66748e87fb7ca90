//! Flash-decoding (Dao et al., 2023): one decode step's attention for a long context split
//! across threads by key chunks as well as by (row, head), so that a single stream's step
//! keeps every thread busy however few heads it has. Chunk `c` of a query's keys gives a
//! partial result over its own keys only,
//!
//! ```text
//! m_c = max_{t∈c} s_t,   ℓ_c = Σ_{t∈c} e^{s_t − m_c},   o_c = Σ_{t∈c} e^{s_t − m_c} v_t
//! ```
//!
//! and the partials combine exactly (the log-sum-exp merge):
//!
//! ```text
//! m = max_c m_c,   ℓ = Σ_c e^{m_c − m} ℓ_c,   ctx = Σ_c e^{m_c − m} o_c / ℓ,
//! p_t = e^{s_t − m_c} · e^{m_c − m} / ℓ   (t ∈ c)
//! ```
//!
//! which is `softmax(s) · V` rearranged: the same value up to float rounding (not the same
//! bits as the one-pass kernel of `super::step_attention`, whose softmax normalises first).
//! Only f32, one query per row, and only where it pays ([`chunk_len`]): with fewer (row, head)
//! units than the pool has room for and at least [`MIN_KEYS`] keys. A chunk whose keys are all
//! hidden (`−∞`) contributes nothing.

use super::attention::{AttnDims, KvSlice};
use super::key_ranges::{add_bias, clip, hide_holes, KeyRanges};
use super::sinks::sink_factor;
use super::{kv_dots, step_dots, step_softmax};
use rayon::prelude::*;

/// A query sees at least this many keys before its step is split by keys (measured on
/// SmolLM2-135M: see BENCHMARKS.md; below it the one-pass kernel split by head is as fast).
pub const MIN_KEYS: usize = 1024;
/// Keys of one chunk at least (a chunk's scores, exponentials and value sum stay in L1/L2).
const MIN_CHUNK: usize = 256;
/// Units (row, head, chunk) per thread of the pool: enough that uneven units even out.
const UNITS_PER_THREAD: usize = 4;

/// The chunk length a step of `batch` rows of `heads` heads, `q_len` queries and `k_len` keys
/// is split by, on a pool of `threads`; `None`: not split (the one-pass kernel).
pub fn chunk_len(
    batch: usize,
    heads: usize,
    q_len: usize,
    k_len: usize,
    threads: usize,
) -> Option<usize> {
    if q_len != 1 || threads < 2 || k_len < MIN_KEYS {
        return None;
    }
    let units = batch * heads;
    let chunks = (UNITS_PER_THREAD * threads).div_ceil(units.max(1));
    if chunks < 2 {
        return None;
    }
    Some(k_len.div_ceil(chunks).max(MIN_CHUNK))
}

/// The step's attention for `q [batch, d_model]` (one query a row) in chunks of `chunk` keys:
/// writes `ctx [batch, d_model]` and `probs [batch, heads, 1, k_len]` as
/// `super::step_attention::step_attention_forward` does (same arguments).
#[allow(clippy::too_many_arguments)]
pub fn forward(
    ctx: &mut [f32],
    probs: &mut [f32],
    q: &[f32],
    (k, v): (KvSlice<'_, f32>, KvSlice<'_, f32>),
    key_rows: &[u32],
    ranges: &impl KeyRanges,
    dims: AttnDims,
    chunk: usize,
) {
    let (heads, d_head, k_len, stride) = (dims.heads, dims.d_head, dims.k_len, dims.kv_stride);
    let (group, d_kv, scale) = (dims.group(), dims.d_kv(), dims.scale::<f32>());
    assert_eq!(dims.q_len, 1, "one query a row");
    let kernel = step_softmax::best_kernel();
    // One (row, head): its context columns, its weights row, its query.
    ctx.par_chunks_mut(d_head)
        .zip(probs.par_chunks_mut(k_len))
        .zip(q.par_chunks(d_head))
        .enumerate()
        .for_each(|(u, ((ctx_h, p_h), q_h))| {
            let (b, h) = (u / heads, u % heads);
            let seen = clip(ranges.range(b, 0), k_len);
            let rows = &key_rows[b * stride..b * stride + seen.end];
            let at = (h / group) * d_head;
            p_h[..seen.start].fill(0.0);
            p_h[seen.end..].fill(0.0);
            // partials: [chunks, 2 + d_head] = (m_c, ℓ_c, o_c)
            let n_chunks = seen.len().div_ceil(chunk);
            let mut partials = vec![0f32; n_chunks * (2 + d_head)];
            p_h[seen.clone()]
                .par_chunks_mut(chunk)
                .zip(partials.par_chunks_mut(2 + d_head))
                .enumerate()
                .for_each(|(c, (p_c, part))| {
                    let j0 = seen.start + c * chunk;
                    let rows_c = &rows[j0..j0 + p_c.len()];
                    match k {
                        KvSlice::Float(k) => {
                            let table = (rows_c, d_kv, at);
                            step_dots::scores(kernel, q_h, k, table, scale, p_c)
                        }
                        KvSlice::Packed(k) => {
                            kv_dots::scores(kernel, q_h, k, (rows_c, at), scale, p_c)
                        }
                    }
                    dims.scores.cap(p_c);
                    add_bias(ranges, (h, b, 0), j0, p_c);
                    hide_holes(ranges, b, 0, j0, p_c);
                    let m = p_c.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
                    let (head, o) = part.split_at_mut(2);
                    if m == f32::NEG_INFINITY {
                        p_c.fill(0.0);
                        (head[0], head[1]) = (m, 0.0);
                        return;
                    }
                    p_c.iter_mut().for_each(|s| *s -= m);
                    step_softmax::exp_inplace(kernel, p_c);
                    (head[0], head[1]) = (m, p_c.iter().sum());
                    match v {
                        KvSlice::Float(v) => {
                            step_dots::weighted_sum(kernel, p_c, v, (rows_c, d_kv, at), o)
                        }
                        KvSlice::Packed(v) => kv_dots::weighted_sum(kernel, p_c, v, (rows_c, at), o),
                    }
                });
            // The merge (module docs).
            let m = partials
                .chunks(2 + d_head)
                .fold(f32::NEG_INFINITY, |m, p| m.max(p[0]));
            ctx_h.fill(0.0);
            if m == f32::NEG_INFINITY {
                return;
            }
            let mut l = 0f32;
            for part in partials.chunks_mut(2 + d_head) {
                // e^{m_c − m}, kept in place of m_c
                part[0] = match part[0] {
                    f32::NEG_INFINITY => 0.0,
                    m_c => step_softmax::exp(m_c - m),
                };
                l += part[0] * part[1];
                for (c, &o) in ctx_h.iter_mut().zip(&part[2..]) {
                    *c += part[0] * o;
                }
            }
            // With a sink (`super::sinks`): everything times σ(lse − s_h), lse = m + ln ℓ.
            let sink = ranges
                .sink(h)
                .map_or(1.0, |s| sink_factor(m as f64 + (l as f64).ln(), s) as f32);
            ctx_h.iter_mut().for_each(|c| *c = *c / l * sink);
            for (p_c, part) in p_h[seen].chunks_mut(chunk).zip(partials.chunks(2 + d_head)) {
                let f = part[0] / l * sink;
                p_c.iter_mut().for_each(|p| *p *= f);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::attention::Scores;
    use crate::kernels::kv_blocks::{quantise_row, KvType, PackedRows};
    use crate::kernels::step_attention::step_attention_forward;
    use crate::rng::Rng;

    /// Long contexts split in chunks (grouped heads, a shuffled table, rows seeing different
    /// numbers of keys, a soft cap, f32 and packed q8_0 keys and values): the context and the
    /// weights against float64 loops, and the split chosen on two threads, not on one. The
    /// packed rows are read as rotated ones (`kernels::hadamard`).
    #[test]
    fn split_steps_match_float64_loops() {
        let (batch, heads, kv_heads, d_head, k_len) = (2, 4, 2, 64, 3000);
        let d_kv = kv_heads * d_head;
        let stored = batch * k_len + 5;
        let mut rng = Rng::new(5);
        let mut draw = |n: usize, a: f64| -> Vec<f32> {
            (0..n).map(|_| rng.uniform_range(-a, a) as f32).collect()
        };
        let (q, k, v) = (
            draw(batch * heads * d_head, 1.0),
            draw(stored * d_kv, 2.0),
            draw(stored * d_kv, 1.0),
        );
        let mut table: Vec<u32> = (0..stored as u32).collect();
        Rng::new(6).shuffle(&mut table);
        let lens = [k_len, k_len - 999];
        let pool = |n| rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap();
        assert_eq!(pool(1).install(|| chunk_len(1, heads, 1, k_len, 1)), None);
        assert_eq!(chunk_len(1, heads, 1, MIN_KEYS - 1, 2), None);
        // Two rows of four heads on eight threads: four chunks a (row, head).
        let chunk = chunk_len(batch, heads, 1, k_len, 8).unwrap();
        assert_eq!(chunk, 750);
        assert_eq!(chunk_len(1, heads, 1, k_len, 2), Some(1500));
        assert!(chunk < k_len);
        let rb = KvType::Q8_0.row_bytes(d_kv).unwrap();
        let pack = |x: &[f32]| {
            let mut out = vec![0u8; stored * rb];
            for (r, row) in x.chunks(d_kv).enumerate() {
                quantise_row(KvType::Q8_0, row, &mut out[r * rb..(r + 1) * rb]);
            }
            out
        };
        let (kq, vq) = (pack(&k), pack(&v));
        let packed = |bytes| {
            KvSlice::Packed(PackedRows {
                ty: KvType::Q8_0,
                bytes,
                row_bytes: rb,
                // Read as stored rotated (a row of random values either way): each chunk's
                // partial sum is rotated back before the chunks combine.
                rotation: Some(64),
            })
        };
        for softcap in [None, Some(3.0)] {
            let dims = AttnDims {
                batch,
                heads,
                kv_heads,
                d_head,
                q_len: 1,
                k_len,
                kv_stride: k_len,
                scores: Scores {
                    softcap,
                    ..Default::default()
                },
            };
            for (kk, vv) in [
                (KvSlice::Float(&k[..]), KvSlice::Float(&v[..])),
                (packed(&kq[..]), packed(&vq[..])),
            ] {
                let mut ctx = vec![0f32; batch * heads * d_head];
                let mut probs = vec![f32::NAN; batch * heads * k_len];
                forward(&mut ctx, &mut probs, &q, (kk, vv), &table, &&lens[..], dims, chunk);
                // The one-pass kernel on the same inputs; both against float64 below.
                let mut ctx1 = vec![0f32; ctx.len()];
                let mut probs1 = vec![0f32; probs.len()];
                let one = &lens[..];
                pool(1).install(|| {
                    step_attention_forward(&mut ctx1, &mut probs1, &q, kk, vv, &table, one, dims)
                });
                let value = |x: KvSlice<f32>, r: u32, c: usize| -> f64 {
                    match x {
                        KvSlice::Float(x) => x[r as usize * d_kv + c] as f64,
                        KvSlice::Packed(p) => {
                            let mut h = vec![0f32; d_kv];
                            kv_dots::head_values(p, r, 0, &mut h);
                            h[c] as f64
                        }
                    }
                };
                for b in 0..batch {
                    for h in 0..heads {
                        let at = (h / (heads / kv_heads)) * d_head;
                        let row = |t: usize| table[b * k_len + t];
                        let s: Vec<f64> = (0..lens[b])
                            .map(|t| {
                                let r = row(t);
                                let dot: f64 = (0..d_head)
                                    .map(|c| q[(b * heads + h) * d_head + c] as f64 * value(kk, r, at + c))
                                    .sum();
                                let x = dot / 8.0;
                                softcap.map_or(x, |c| c * (x / c).tanh())
                            })
                            .collect();
                        let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let z: f64 = s.iter().map(|x| (x - max).exp()).sum();
                        let u = b * heads + h;
                        for t in 0..k_len {
                            let want = if t < lens[b] { (s[t] - max).exp() / z } else { 0.0 };
                            let got = probs[u * k_len + t] as f64;
                            assert!((got - want).abs() < 1e-6, "p {got} vs {want}");
                            assert!((probs1[u * k_len + t] as f64 - want).abs() < 1e-6);
                        }
                        for c in 0..d_head {
                            let want: f64 = (0..lens[b])
                                .map(|t| (s[t] - max).exp() / z * value(vv, row(t), at + c))
                                .sum();
                            let got = ctx[u * d_head + c] as f64;
                            assert!((got - want).abs() < 2e-6, "ctx {got} vs {want}");
                        }
                    }
                }
            }
        }
    }
}
