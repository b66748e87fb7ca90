//! Attention of the few new queries of each batch row during incremental decoding,
//! `ctx_{b,i} = Σ_t softmax_t(q_{b,i} · k_{b,t} / √d_k) v_{b,t}` for each head, where the keys
//! and values of row `b` may lie anywhere in the stores: key `t` of row `b` is stored row
//! `key_rows[b * kv_stride + t]` (the per-position view of a paged cache's block tables, see
//! `model::kv_cache::KvCache::paged`). Scores may have their own scale and a soft cap
//! (`super::scores`) and a bias of the key ranges (`super::key_ranges`). Beam search reorders its hypotheses by rewriting block
//! tables, never the keys and values; its cross-attention passes the `k` beams of a sentence as
//! `k` queries against the sentence's encoder keys.
//!
//! The products are a handful of 64-wide dot products and `axpy`s per (row, head); a matrix
//! multiply call per (row, head) costs more to dispatch than to compute at these sizes, so the
//! loops are written out. In f32 the scores and the weighted sum of the values are
//! `step_dots`' and the softmax is `step_softmax`'s, with its vectorised exponential (AVX2 /
//! AVX-512 / portable by the low-precision kernel switch, the same bits in each); f64 keeps
//! plain loops compiled for the machine's widest vectors (`pulp`) and the library `exp`.
//! A long context of a few rows on several threads is split by keys as well
//! (`super::flash_decoding`).

use super::attention::{AttnDims, Scores};
use super::flash_decoding;
use super::key_ranges::{add_bias, clip, hide_holes, span, KeyRanges};
use super::kv_blocks::KvSlice;
use super::kv_dots;
use super::lowp::Kernel;
use super::reduce::lane_dot;
use super::step_dots;
use super::sinks::softmax_with_sink;
use super::softmax::softmax_inplace;
use super::step_softmax;
use crate::Float;
use rayon::prelude::*;
use std::ops::Range;

/// Forward for `q [batch * q_len, d_model]`: query `i` of row `b` sees its keys
/// `ranges.range(b, i)` (clipped to `dims.k_len`). Writes `ctx [batch * q_len, d_model]` and the
/// weights `probs [batch, heads, q_len, k_len]` (exactly 0 outside the range). `k`, `v`:
/// `[stored rows, d_kv]`, query head `h` reading key/value head `h / (heads / kv_heads)`, as
/// floats or packed (`super::kv_blocks`: a quantised cache, read through `super::kv_dots`);
/// `key_rows`: `[batch, dims.kv_stride]` stored-row indices, those of the visible keys read.
#[allow(clippy::too_many_arguments)]
pub fn step_attention_forward<'a, T: Float>(
    ctx: &mut [T],
    probs: &mut [T],
    q: &[T],
    k: impl Into<KvSlice<'a, T>>,
    v: impl Into<KvSlice<'a, T>>,
    key_rows: &[u32],
    ranges: impl KeyRanges,
    dims: AttnDims,
) {
    let (k, v) = (k.into(), v.into());
    let AttnDims {
        batch,
        heads,
        d_head,
        q_len,
        k_len,
        kv_stride,
        ..
    } = dims;
    let (d_model, group, scale) = (dims.d_model(), dims.group(), dims.scale::<T>());
    assert!(k_len <= kv_stride, "more keys than the table holds");
    assert_eq!(q.len(), batch * q_len * d_model);
    assert_eq!(ctx.len(), batch * q_len * d_model);
    assert_eq!(probs.len(), batch * heads * q_len * k_len);
    assert!(key_rows.len() >= batch * kv_stride, "key table too short");
    if batch == 0 || d_model == 0 || q_len == 0 {
        return;
    }
    // A long context of few rows: split by keys as well (flash-decoding), in f32.
    let threads = rayon::current_num_threads();
    if let Some(chunk) = flash_decoding::chunk_len(batch, heads, q_len, k_len, threads) {
        if let (Some(q), Some(k), Some(v)) = (T::as_f32(q), f32_view(k), f32_view(v)) {
            let ctx = T::as_f32_mut(ctx).expect("f32, as the queries");
            let probs = T::as_f32_mut(probs).expect("f32, as the queries");
            flash_decoding::forward(ctx, probs, q, (k, v), key_rows, &ranges, dims, chunk);
            return;
        }
    }
    let kernel = step_softmax::best_kernel();
    // Row b's heads `here`: its queries' columns of them in `ctx` and `q`, their `probs`.
    let unit = |b: usize, here: Range<usize>, ctx: &mut [T], probs: &mut [T], q: &[T]| {
        let seen = span(&ranges, b, 0, q_len, k_len);
        pulp::Arch::new().dispatch(OneRow {
            ctx_b: ctx,
            probs_b: probs,
            q_b: q,
            k,
            v,
            rows: &key_rows[b * kv_stride..b * kv_stride + seen.end],
            ranges: &ranges,
            b,
            heads,
            here,
            group,
            d_head,
            k_len,
            scale,
            scores: dims.scores,
            kernel,
        })
    };
    if split_by_head(batch, heads, q_len, d_head, k_len) {
        // One query per row: row b's head h is `ctx`/`q` columns h·d_head.. of row b (a
        // contiguous d_head) and `probs` row (b, h): each (row, head) a unit of its own.
        ctx.par_chunks_mut(d_head)
            .zip(probs.par_chunks_mut(k_len))
            .zip(q.par_chunks(d_head))
            .enumerate()
            .for_each(|(u, ((ctx_h, probs_h), q_h))| {
                let h = u % heads;
                unit(u / heads, h..h + 1, ctx_h, probs_h, q_h)
            });
    } else {
        ctx.par_chunks_mut(q_len * d_model)
            .zip(probs.par_chunks_mut(heads * q_len * k_len))
            .zip(q.par_chunks(q_len * d_model))
            .enumerate()
            .with_min_len(8)
            .for_each(|(b, ((ctx_b, probs_b), q_b))| unit(b, 0..heads, ctx_b, probs_b, q_b));
    }
}

/// `x` as f32 keys or values, when the model's float is f32 (or `x` is packed).
fn f32_view<T: Float>(x: KvSlice<'_, T>) -> Option<KvSlice<'_, f32>> {
    match x {
        KvSlice::Float(x) => T::as_f32(x).map(KvSlice::Float),
        KvSlice::Packed(p) => Some(KvSlice::Packed(p)),
    }
}

/// Whether a step's attention runs one (row, head) per task rather than a whole row: with one
/// query per row, fewer rows than the pool has threads, and enough keys that a head's work
/// (about `k_len · d_head` multiply-adds, twice) outweighs handing it to another thread. A
/// single stream's long context then keeps every thread busy; a batch of rows already does.
fn split_by_head(batch: usize, heads: usize, q_len: usize, d_head: usize, k_len: usize) -> bool {
    /// Multiply-adds of a row's heads below which one thread does them all (tens of µs).
    const MIN_SPLIT_WORK: usize = 1 << 17;
    q_len == 1
        && heads > 1
        && batch < rayon::current_num_threads()
        && heads * k_len * d_head >= MIN_SPLIT_WORK
}

/// One batch row: its queries, all heads or (one query) the heads `here`. A `WithSimd` type
/// rather than a closure: its `#[inline(always)]` body is compiled into each of pulp's
/// target-feature functions (a closure would stay a separate function compiled for baseline
/// x86-64).
struct OneRow<'a, T, R> {
    /// `[q_len, d_model]`, or one query's heads `here` (`[here.len(), d_head]`)
    ctx_b: &'a mut [T],
    /// `[here.len(), q_len, k_len]`
    probs_b: &'a mut [T],
    /// As `ctx_b`.
    q_b: &'a [T],
    k: KvSlice<'a, T>,
    v: KvSlice<'a, T>,
    /// The stored rows of the keys up to the last one any query of the row sees.
    rows: &'a [u32],
    ranges: &'a R,
    /// The batch row.
    b: usize,
    /// The model's query heads.
    heads: usize,
    /// The heads `ctx_b`, `probs_b` and `q_b` hold.
    here: Range<usize>,
    /// Query heads per key/value head.
    group: usize,
    d_head: usize,
    k_len: usize,
    scale: T,
    /// The scores' soft cap, if any.
    scores: Scores,
    /// The kernel of the f32 products and softmax (`step_dots`, `step_softmax`).
    kernel: Kernel,
}

impl<T: Float, R: KeyRanges> pulp::WithSimd for OneRow<'_, T, R> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        let OneRow {
            ctx_b,
            probs_b,
            q_b,
            k,
            v,
            rows,
            ranges,
            b,
            heads,
            here,
            group,
            d_head,
            k_len,
            scale,
            scores,
            kernel,
        } = self;
        let d_kv = heads / group * d_head;
        // A query's row in `ctx_b` and `q_b`: its heads here.
        let width = here.len() * d_head;
        let q_len = q_b.len() / width;
        for (hl, h) in here.enumerate() {
            let cols = hl * d_head..(hl + 1) * d_head;
            // the columns of its key/value head
            let kv_cols = (h / group) * d_head..(h / group + 1) * d_head;
            for i in 0..q_len {
                let q_i = &q_b[i * width + cols.start..i * width + cols.end];
                let p = &mut probs_b[(hl * q_len + i) * k_len..(hl * q_len + i + 1) * k_len];
                let seen = clip(ranges.range(b, i), rows.len());
                let (p_seen, rows_seen) = (&mut p[seen.clone()], &rows[seen.clone()]);
                let table = (rows_seen, d_kv, kv_cols.start);
                // f32: the vector kernels of `step_dots` (floats) or `kv_dots` (packed); f64
                // (reference checks): plain loops.
                match (T::as_f32(q_i), k) {
                    (Some(q_i), KvSlice::Float(k)) if T::as_f32(k).is_some() => {
                        let k = T::as_f32(k).expect("f32, as the queries");
                        let p_seen = T::as_f32_mut(p_seen).expect("f32, as the queries");
                        step_dots::scores(kernel, q_i, k, table, scale.f64() as f32, p_seen);
                    }
                    (Some(q_i), KvSlice::Packed(k)) => {
                        let p_seen = T::as_f32_mut(p_seen).expect("f32, as the queries");
                        let keys = (rows_seen, kv_cols.start);
                        kv_dots::scores(kernel, q_i, k, keys, scale.f64() as f32, p_seen);
                    }
                    (_, KvSlice::Float(k)) => {
                        for (s, &r) in p_seen.iter_mut().zip(rows_seen) {
                            let at = r as usize * d_kv;
                            *s = lane_dot(q_i, &k[at + kv_cols.start..at + kv_cols.end]) * scale;
                        }
                    }
                    (_, KvSlice::Packed(k)) => {
                        let mut key = vec![0f32; d_head];
                        for (s, &r) in p_seen.iter_mut().zip(rows_seen) {
                            kv_dots::head_values(k, r, kv_cols.start, &mut key);
                            let dot = q_i.iter().zip(&key).map(|(&a, &b)| a.f64() * b as f64);
                            *s = T::of(dot.sum::<f64>()) * scale;
                        }
                    }
                }
                p[..seen.start].fill(T::zero());
                scores.cap(&mut p[seen.clone()]);
                add_bias(ranges, (h, b, i), seen.start, &mut p[seen.clone()]);
                hide_holes(ranges, b, i, seen.start, &mut p[seen.clone()]);
                // f32: the vectorised softmax of `step_softmax`; f64 (reference checks): the
                // library exp of `softmax_inplace`.
                softmax_with_sink(ranges, h, &mut p[seen.clone()], |live| {
                    let n = live.len();
                    match T::as_f32_mut(live) {
                        Some(live) => step_softmax::softmax(kernel, live),
                        None => softmax_inplace(live, n),
                    }
                });
                p[seen.end..].fill(T::zero());
                let c_i = &mut ctx_b[i * width + cols.start..i * width + cols.end];
                let p_seen = &p[seen.clone()];
                match (T::as_f32(p_seen), v) {
                    (Some(p_seen), KvSlice::Float(v)) if T::as_f32(v).is_some() => {
                        let v = T::as_f32(v).expect("f32, as the weights");
                        let c_i = T::as_f32_mut(c_i).expect("f32, as the weights");
                        step_dots::weighted_sum(kernel, p_seen, v, table, c_i);
                    }
                    (Some(p_seen), KvSlice::Packed(v)) => {
                        let c_i = T::as_f32_mut(c_i).expect("f32, as the weights");
                        kv_dots::weighted_sum(kernel, p_seen, v, (rows_seen, kv_cols.start), c_i);
                    }
                    (_, KvSlice::Float(v)) => {
                        c_i.iter_mut().for_each(|c| *c = T::zero());
                        for (&w, &r) in p_seen.iter().zip(rows_seen) {
                            let at = r as usize * d_kv;
                            let v_r = &v[at + kv_cols.start..at + kv_cols.end];
                            for (c, &x) in c_i.iter_mut().zip(v_r) {
                                *c += w * x;
                            }
                        }
                    }
                    (_, KvSlice::Packed(v)) => {
                        c_i.iter_mut().for_each(|c| *c = T::zero());
                        let mut value = vec![0f32; d_head];
                        for (&w, &r) in p_seen.iter().zip(rows_seen) {
                            kv_dots::head_values(v, r, kv_cols.start, &mut value);
                            for (c, &x) in c_i.iter_mut().zip(&value) {
                                *c += w * T::of(x as f64);
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::key_ranges::AttnMask;
    use crate::kernels::plain_attention::attention_forward;
    use crate::rng::Rng;

    fn uniform(n: usize, seed: u64) -> Vec<f64> {
        let mut rng = Rng::new(seed);
        (0..n).map(|_| rng.uniform_range(-1.0, 1.0)).collect()
    }

    /// Row `b`'s keys scattered over the store in a shuffled order, one to three queries per
    /// row, rows seeing different numbers of keys: against plain f64 loops.
    #[test]
    fn matches_reference_loops_through_a_shuffled_table() {
        for &(batch, heads, d_head, q_len, k_len) in &[
            (1, 1, 4, 1, 1),
            (3, 2, 8, 1, 5),
            (4, 4, 17, 3, 9),
            (2, 3, 32, 2, 33),
        ] {
            let d = heads * d_head;
            let stride = k_len + 2;
            let stored = batch * k_len + 3;
            let q = uniform(batch * q_len * d, 1);
            let k: Vec<f64> = uniform(stored * d, 2).iter().map(|x| 3.0 * x).collect();
            let v = uniform(stored * d, 3);
            // a permutation of the stored rows, dealt out to the batch rows
            let mut perm: Vec<u32> = (0..stored as u32).collect();
            Rng::new(4).shuffle(&mut perm);
            let mut table = vec![u32::MAX; batch * stride];
            for b in 0..batch {
                table[b * stride..b * stride + k_len]
                    .copy_from_slice(&perm[b * k_len..(b + 1) * k_len]);
            }
            // row b sees k_len, k_len - 1, ... keys (at least one)
            let visible: Vec<usize> = (0..batch).map(|b| k_len - b.min(k_len - 1)).collect();
            let dims = AttnDims {
                batch,
                heads,
                kv_heads: heads,
                d_head,
                q_len,
                k_len,
                kv_stride: stride,
                scores: Default::default(),
            };
            let mut ctx = vec![0.0; batch * q_len * d];
            let mut probs = vec![f64::NAN; batch * heads * q_len * k_len];
            step_attention_forward(&mut ctx, &mut probs, &q, &k, &v, &table, &visible[..], dims);
            for b in 0..batch {
                let seen = visible[b];
                for h in 0..heads {
                    let row = |t: usize| table[b * stride + t] as usize * d + h * d_head;
                    for i in 0..q_len {
                        let q_at = (b * q_len + i) * d + h * d_head;
                        let scores: Vec<f64> = (0..seen)
                            .map(|t| {
                                (0..d_head)
                                    .map(|c| q[q_at + c] * k[row(t) + c])
                                    .sum::<f64>()
                                    / (d_head as f64).sqrt()
                            })
                            .collect();
                        let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                        let z: f64 = e.iter().sum();
                        for t in 0..k_len {
                            let got = probs[((b * heads + h) * q_len + i) * k_len + t];
                            let want = if t < seen { e[t] / z } else { 0.0 };
                            assert!((got - want).abs() < 1e-12, "p {got} vs {want}");
                        }
                        for c in 0..d_head {
                            let want: f64 = (0..seen).map(|t| e[t] / z * v[row(t) + c]).sum();
                            let got = ctx[q_at + c];
                            assert!((got - want).abs() < 1e-12, "ctx {got} vs {want}");
                        }
                    }
                }
            }
        }
    }

    /// With each row's keys stored contiguously and padded rows, the plain kernel gives the same
    /// result in f32 (four queries per row, as beam search's cross-attention asks).
    #[test]
    fn agrees_with_the_plain_kernel_in_f32() {
        let (batch, heads, d_head, q_len, k_len) = (5, 4, 64, 4, 23);
        let d = heads * d_head;
        let f = |x: Vec<f64>| x.into_iter().map(|x| x as f32).collect::<Vec<f32>>();
        let q = f(uniform(batch * q_len * d, 5));
        let k = f(uniform(batch * k_len * d, 6));
        let v = f(uniform(batch * k_len * d, 7));
        let table: Vec<u32> = (0..(batch * k_len) as u32).collect();
        let dims = AttnDims {
            batch,
            heads,
            kv_heads: heads,
            d_head,
            q_len,
            k_len,
            kv_stride: k_len,
            scores: Default::default(),
        };
        let n = (batch * q_len * d, batch * heads * q_len * k_len);
        let lens: Vec<usize> = (0..batch).map(|b| k_len - 3 * b).collect();
        let (mut ctx, mut probs) = (vec![0f32; n.0], vec![0f32; n.1]);
        step_attention_forward(&mut ctx, &mut probs, &q, &k, &v, &table, &lens[..], dims);
        let (mut ctx2, mut probs2) = (vec![0f32; n.0], vec![0f32; n.1]);
        let mask = AttnMask {
            key_lens: &lens,
            causal: false,
            q_offset: 0,
        };
        attention_forward(&mut ctx2, &mut probs2, &q, &k, &v, dims, mask, None);
        for (a, b) in ctx.iter().zip(&ctx2).chain(probs.iter().zip(&probs2)) {
            assert!((a - b).abs() < 2e-6, "{a} vs {b}");
        }
    }

    /// One stream with a long context on two threads runs a task per head (grouped-query
    /// heads, a shuffled table, some keys hidden): the same bits as one thread, in f32 and f64.
    #[test]
    fn one_row_split_by_head_equals_one_thread() {
        let (heads, kv_heads, d_head, k_len) = (8, 4, 64, 300);
        let (d, d_kv) = (heads * d_head, kv_heads * d_head);
        let stored = k_len + 7;
        let mut table: Vec<u32> = (0..stored as u32).collect();
        Rng::new(9).shuffle(&mut table);
        let dims = AttnDims {
            batch: 1,
            heads,
            kv_heads,
            d_head,
            q_len: 1,
            k_len,
            kv_stride: stored,
            scores: Default::default(),
        };
        let seen = [k_len - 5];
        let pool = |n| rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap();
        type Out<T> = (Vec<T>, Vec<T>);
        fn run<T: Float>(
            q: &[T],
            k: &[T],
            v: &[T],
            rows: &[u32],
            seen: &[usize],
            dims: AttnDims,
        ) -> Out<T> {
            let mut ctx = vec![T::zero(); dims.heads * dims.d_head];
            let mut probs = vec![T::zero(); dims.heads * dims.k_len];
            step_attention_forward(&mut ctx, &mut probs, q, k, v, rows, seen, dims);
            (ctx, probs)
        }
        let (q, k, v) = (uniform(d, 1), uniform(stored * d_kv, 2), uniform(stored * d_kv, 3));
        let f = |x: &[f64]| x.iter().map(|&x| x as f32).collect::<Vec<f32>>();
        let (qf, kf, vf) = (f(&q), f(&k), f(&v));
        assert!(pool(2).install(|| split_by_head(1, heads, 1, d_head, k_len)));
        assert!(!pool(1).install(|| split_by_head(1, heads, 1, d_head, k_len)));
        let one = pool(1).install(|| run(&q, &k, &v, &table, &seen, dims));
        let two = pool(2).install(|| run(&q, &k, &v, &table, &seen, dims));
        assert_eq!(one, two);
        let one = pool(1).install(|| run(&qf, &kf, &vf, &table, &seen, dims));
        let two = pool(2).install(|| run(&qf, &kf, &vf, &table, &seen, dims));
        assert_eq!(one, two);
        // The hidden keys have no weight; the seen ones sum to one in every head.
        for h in 0..heads {
            let p = &two.1[h * k_len..(h + 1) * k_len];
            assert!(p[seen[0]..].iter().all(|&x| x == 0.0));
            assert!((p.iter().map(|&x| x as f64).sum::<f64>() - 1.0).abs() < 1e-5);
        }
    }
}
