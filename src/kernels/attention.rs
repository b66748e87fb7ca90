//! The attention call: `softmax(Q Kᵀ / √d_k) V` over all heads of a batch, each query seeing
//! the keys its [`KeyRanges`] allow, with the kernel chosen here ([`choose`]) from what the
//! caller needs ([`Purpose`]), how the keys and values are laid out ([`KvView`]) and the sizes:
//!
//! - the plain kernel ([`super::plain_attention`]): matrix products that keep the
//!   [query x key] weights (the backward and attention maps read them);
//! - the tiled kernel ([`super::flash_attention`], FlashAttention): memory linear in the length;
//! - the step kernel ([`super::step_attention`]): a few queries per row, reading keys through a
//!   table of stored rows (a paged KV cache).
//!
//! Activations are row-major `[batch * len, heads * d_head]`; head `h` is the column block
//! `h*d_head .. (h+1)*d_head`, read through strided views without copies. Grouped-query
//! attention (GQA, Ainslie et al. 2023; multi-query attention when `kv_heads == 1`): keys and
//! values have `kv_heads` heads, `[batch * len, kv_heads * d_head]`, and query head `h` reads
//! key/value head `h / (heads / kv_heads)`.

// Used outside the library only (feature `internals`).

#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use super::key_ranges::{AttnMask, KeyRanges, QueryRanges, Windowed};
pub use super::plain_attention::{attention_backward, attention_forward};
pub use super::scores::Scores;

use super::flash_attention::{flash_attention_backward, flash_attention_forward};
use super::sinks::sink_tiled;
pub use super::kv_blocks::KvSlice;
use super::step_attention::step_attention_forward;
use crate::Float;
use std::borrow::Cow;

/// Sizes of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnDims {
    pub batch: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads, dividing `heads`: query head `h` reads key/value head
    /// `h / (heads / kv_heads)`. Equal to `heads` for plain multi-head attention.
    pub kv_heads: usize,
    pub d_head: usize,
    /// Query rows per batch element.
    pub q_len: usize,
    /// Key/value rows per batch element that are scored.
    pub k_len: usize,
    /// Rows between consecutive batch elements in the key/value buffers (>= k_len; a KV cache
    /// has room for more rows than are filled yet).
    pub kv_stride: usize,
    /// How the dot products become scores: their scale and soft cap (default: `1/√d_k`,
    /// uncapped).
    pub scores: Scores,
}

impl AttnDims {
    /// Width of the queries and the context, `heads * d_head`.
    pub fn d_model(&self) -> usize {
        self.heads * self.d_head
    }

    /// Width of the keys and values (their row stride), `kv_heads * d_head`.
    pub fn d_kv(&self) -> usize {
        self.kv_heads * self.d_head
    }

    /// Query heads per key/value head, `heads / kv_heads`; panics unless `kv_heads` divides
    /// `heads`.
    pub fn group(&self) -> usize {
        assert!(
            self.kv_heads > 0 && self.heads.is_multiple_of(self.kv_heads),
            "{} query heads cannot share {} key/value heads",
            self.heads,
            self.kv_heads
        );
        self.heads / self.kv_heads
    }

    /// The score scale: `1 / √d_k` unless [`scores`](Self::scores) states one.
    pub fn scale<T: Float>(&self) -> T {
        self.scores.scale(self.d_head)
    }
}

/// Training attends with the tiled (FlashAttention) kernel from this many keys on, so memory
/// stays linear in the sequence length; below it the plain kernel, which keeps the whole
/// [query x key] weight matrix, is as cheap and needs no recomputation in the backward.
/// Attention dropout needs the weight matrix (its mask has the same shape), so a call with a
/// dropout mask always runs the plain kernel.
pub const TILED_FROM_KEYS: usize = 128;

/// Decoding with at most this many queries per row (greedy: 1, beam search's cross-attention:
/// the beam size) runs the written-out loops of the step kernel; more queries go through matrix
/// products.
pub const STEP_KERNEL_MAX_QUERIES: usize = 8;

/// What the caller needs from an attention call; with the key/value view and the sizes it
/// decides the kernel (see [`choose`]).
#[derive(Clone, Copy, Debug)]
pub enum Purpose<'a, T> {
    /// Training or a teacher-forced forward: what the backward needs is kept. `drop` is an
    /// attention-dropout mask laid out like the weights `[batch, heads, q_len, k_len]` (each
    /// factor 0 or 1/(1 − p)): the context is then `(P ⊙ M) V`.
    Train { drop: Option<&'a [T]> },
    /// The weights `[batch, heads, q_len, k_len]` are wanted (attention maps).
    Weights,
    /// Queries against a cache: a prompt's new positions, a decoder step, the cross-attention of
    /// a step, the last position of a prompt, a continuous batch's tokens.
    Decode,
}

/// The kernels [`attend`] chooses from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Plain,
    Tiled,
    Step,
}

/// Which kernel runs, the one rule for every caller:
/// - [`Purpose::Train`]: tiled from [`TILED_FROM_KEYS`] keys on unless a dropout mask is given,
///   plain otherwise;
/// - [`Purpose::Weights`]: plain (matrix products, whatever the number
///   of queries);
/// - [`Purpose::Decode`]: the step kernel when the keys are paged (`paged`: only it reads
///   through a table of stored rows) or at most [`STEP_KERNEL_MAX_QUERIES`] queries come per
///   row, or the call is row-exact ([`super::row_exact`]); plain otherwise.
///
/// A paged view given to the plain or tiled kernel is gathered into rows first.
pub fn choose<T>(purpose: &Purpose<'_, T>, paged: bool, q_per_row: usize, k_len: usize) -> Kernel {
    match purpose {
        Purpose::Train { drop } if k_len >= TILED_FROM_KEYS && drop.is_none() => Kernel::Tiled,
        Purpose::Train { .. } | Purpose::Weights => Kernel::Plain,
        Purpose::Decode
            if paged
                || q_per_row <= STEP_KERNEL_MAX_QUERIES
                || super::row_exact::products_are_row_exact() =>
        {
            Kernel::Step
        }
        Purpose::Decode => Kernel::Plain,
    }
}

/// A cache that can lay its keys and values out for either kind of kernel (a KV cache, see
/// `model::kv_cache`). Both views have `dims.kv_stride` positions per row.
pub trait KvStore<T: Clone> {
    /// Keys and values as rows `[batch * kv_stride, d_kv]` (position `t` of row `b` at row
    /// `b * kv_stride + t`); may first reorder the storage (and unpack a packed one).
    fn contiguous(&mut self) -> (Cow<'_, [T]>, Cow<'_, [T]>);
    /// Keys and values as stored, `[stored rows, d_kv]` (floats or packed), and the table
    /// `[batch, kv_stride]` of the stored row of each position.
    fn paged(&self) -> (KvSlice<'_, T>, KvSlice<'_, T>, Cow<'_, [u32]>);
}

/// Where the keys and values of an attention call are.
pub enum KvView<'a, T: Clone> {
    /// `[batch * kv_stride, d_kv]` each: position `t` of row `b` at row `b * kv_stride + t`.
    Contiguous { k: &'a [T], v: &'a [T] },
    /// Stored rows `[n, d_kv]` each (floats or packed), read through `rows [batch, kv_stride]`:
    /// position `t` of row `b` is stored row `rows[b * kv_stride + t]`.
    Paged {
        k: KvSlice<'a, T>,
        v: KvSlice<'a, T>,
        rows: &'a [u32],
    },
    /// A cache giving the layout the chosen kernel reads (not paged for [`choose`]).
    Store(&'a mut dyn KvStore<T>),
}

/// The output of [`attend`]: the context `[batch * q_len, d_model]` and the weights as the
/// kernel kept them.
#[derive(Clone, Debug)]
pub struct Attended<T> {
    pub ctx: Vec<T>,
    pub weights: AttnWeights<T>,
}

/// The attention weights as a kernel kept them.
#[derive(Clone, Debug)]
pub enum AttnWeights<T> {
    /// Plain and step kernels: `[batch, heads, q_len, k_len]`, rows summing to one (less a
    /// sink's share, `super::sinks`) over the visible keys (undropped), exactly 0 elsewhere.
    Probs(Vec<T>),
    /// Tiled kernel: the log-sum-exp of each score row `[batch * q_len, heads]`, from which its
    /// backward recomputes the weights.
    LogSumExp(Vec<T>),
}

/// The attention of `q [batch * q_len, d_model]` over `kv`, query `i` of row `b` seeing the keys
/// `ranges.range(b, i)` of its row, with the kernel of [`choose`].
pub fn attend<T: Float>(
    q: &[T],
    kv: KvView<'_, T>,
    ranges: impl KeyRanges,
    dims: AttnDims,
    purpose: Purpose<'_, T>,
) -> Attended<T> {
    let paged = matches!(kv, KvView::Paged { .. });
    let kernel = choose(&purpose, paged, dims.q_len, dims.k_len);
    let drop = match purpose {
        Purpose::Train { drop } => drop,
        _ => None,
    };
    // ctx: [batch*q_len, d_model]
    let mut ctx = vec![T::zero(); dims.batch * dims.q_len * dims.d_model()];
    let n_weights = dims.batch * dims.heads * dims.q_len * dims.k_len;
    if kernel == Kernel::Step {
        // probs: [batch, heads, q_len, k_len]
        let mut probs = vec![T::zero(); n_weights];
        let step = |ctx: &mut [T], probs: &mut [T], k: KvSlice<T>, v: KvSlice<T>, rows: &[u32]| {
            step_attention_forward(ctx, probs, q, k, v, rows, &ranges, dims);
        };
        match kv {
            KvView::Paged { k, v, rows } => step(&mut ctx, &mut probs, k, v, rows),
            KvView::Store(store) => {
                let (k, v, rows) = store.paged();
                step(&mut ctx, &mut probs, k, v, &rows);
            }
            KvView::Contiguous { k, v } => {
                let rows: Vec<u32> = (0..(dims.batch * dims.kv_stride) as u32).collect();
                step(&mut ctx, &mut probs, k.into(), v.into(), &rows);
            }
        }
        return Attended {
            ctx,
            weights: AttnWeights::Probs(probs),
        };
    }
    let (k, v): (Cow<[T]>, Cow<[T]>) = match kv {
        KvView::Contiguous { k, v } => (Cow::Borrowed(k), Cow::Borrowed(v)),
        KvView::Store(store) => store.contiguous(),
        KvView::Paged { k, v, rows } => {
            let (k, v) = (gather_rows(k, rows, dims), gather_rows(v, rows, dims));
            (Cow::Owned(k), Cow::Owned(v))
        }
    };
    let (k, v) = (&k[..], &v[..]);
    let weights = if kernel == Kernel::Tiled {
        // lse: [batch*q_len, heads]
        let mut lse = vec![T::zero(); dims.batch * dims.q_len * dims.heads];
        flash_attention_forward(&mut ctx, &mut lse, q, k, v, dims, &ranges);
        sink_tiled(&mut ctx, &mut lse, &ranges, (dims.heads, dims.d_head));
        AttnWeights::LogSumExp(lse)
    } else {
        // probs: [batch, heads, q_len, k_len]
        let mut probs = vec![T::zero(); n_weights];
        attention_forward(&mut ctx, &mut probs, q, k, v, dims, ranges, drop);
        AttnWeights::Probs(probs)
    };
    Attended { ctx, weights }
}

/// The rows `rows [batch, kv_stride]` of `x` in order (unpacked if packed),
/// `[batch * kv_stride, d_kv]`.
fn gather_rows<T: Float>(x: KvSlice<'_, T>, rows: &[u32], dims: AttnDims) -> Vec<T> {
    let d_kv = dims.d_kv();
    let n = dims.batch * dims.kv_stride;
    let mut out = vec![T::zero(); n * d_kv];
    let mut unpacked = vec![0f32; d_kv];
    for b in 0..dims.batch {
        for t in 0..dims.k_len {
            let (r, to) = (rows[b * dims.kv_stride + t], (b * dims.kv_stride + t) * d_kv);
            match x {
                KvSlice::Float(x) => {
                    let from = r as usize * d_kv;
                    out[to..to + d_kv].copy_from_slice(&x[from..from + d_kv]);
                }
                KvSlice::Packed(p) => {
                    super::kv_dots::head_values(p, r, 0, &mut unpacked);
                    for (o, &u) in out[to..to + d_kv].iter_mut().zip(&unpacked) {
                        *o = T::of(u as f64);
                    }
                }
            }
        }
    }
    out
}

/// The forward's weights as [`attend_backward`] reads them.
#[derive(Clone, Copy, Debug)]
pub enum SavedRef<'a, T> {
    /// The plain kernel's weights and its dropout mask, if one was drawn.
    Probs {
        probs: &'a [T],
        drop: Option<&'a [T]>,
    },
    /// The tiled kernel's log-sum-exps.
    LogSumExp(&'a [T]),
}

/// Backward of a [`Purpose::Train`] call with contiguous, unstrided keys (`kv_stride ==
/// k_len`): given `dctx` and the forward's `ctx`, writes `dq [batch*q_len, d_model]` and `dk`,
/// `dv` `[batch*k_len, d_kv]` with the kernel that ran forward (its saved weights say which),
/// over the same key ranges.
#[allow(clippy::too_many_arguments)]
pub fn attend_backward<T: Float>(
    grads: (&mut [T], &mut [T], &mut [T]),
    dctx: &[T],
    ctx: &[T],
    (q, k, v): (&[T], &[T], &[T]),
    saved: SavedRef<'_, T>,
    ranges: impl KeyRanges,
    dims: AttnDims,
) {
    let (dq, dk, dv) = grads;
    match saved {
        // The weights are exactly 0 outside the ranges: no mask to re-apply.
        SavedRef::Probs { probs, drop } => {
            attention_backward(dq, dk, dv, dctx, q, k, v, probs, dims, drop)
        }
        SavedRef::LogSumExp(lse) => {
            flash_attention_backward(dq, dk, dv, dctx, ctx, lse, q, k, v, dims, ranges)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::key_ranges::clip;
    use super::*;
    use crate::rng::Rng;

    fn uniform(n: usize, seed: u64) -> Vec<f64> {
        let mut rng = Rng::new(seed);
        (0..n).map(|_| rng.uniform_range(-1.0, 1.0)).collect()
    }

    #[test]
    fn chooser_follows_its_documented_rule() {
        let drop = [1.0f32];
        let train: Purpose<f32> = Purpose::Train { drop: None };
        let dropped = Purpose::Train { drop: Some(&drop) };
        assert_eq!(choose(&train, false, 4, TILED_FROM_KEYS - 1), Kernel::Plain);
        assert_eq!(choose(&train, false, 4, TILED_FROM_KEYS), Kernel::Tiled);
        assert_eq!(choose(&dropped, false, 4, 10_000), Kernel::Plain);
        assert_eq!(
            choose(&Purpose::<f32>::Weights, false, 1, 10_000),
            Kernel::Plain
        );
        let decode = Purpose::<f32>::Decode;
        assert_eq!(
            choose(&decode, false, STEP_KERNEL_MAX_QUERIES, 5),
            Kernel::Step
        );
        assert_eq!(
            choose(&decode, false, STEP_KERNEL_MAX_QUERIES + 1, 5),
            Kernel::Plain
        );
        assert_eq!(choose(&decode, true, 100, 5), Kernel::Step);
    }

    /// `ctx` of attention with `ranges` in plain float64 loops.
    fn naive(q: &[f64], k: &[f64], v: &[f64], dims: AttnDims, ranges: &impl KeyRanges) -> Vec<f64> {
        let (d, d_kv, group) = (dims.d_model(), dims.d_kv(), dims.group());
        let mut ctx = vec![0.0; dims.batch * dims.q_len * d];
        for b in 0..dims.batch {
            for h in 0..dims.heads {
                for i in 0..dims.q_len {
                    let qi = &q[(b * dims.q_len + i) * d + h * dims.d_head..][..dims.d_head];
                    let key =
                        |t: usize| (b * dims.kv_stride + t) * d_kv + (h / group) * dims.d_head;
                    let seen = clip(ranges.range(b, i), dims.k_len);
                    let s: Vec<f64> = seen
                        .clone()
                        .map(|t| {
                            let kt = &k[key(t)..][..dims.d_head];
                            let dot = qi.iter().zip(kt).map(|(a, b)| a * b).sum::<f64>();
                            let scale = match dims.scores.scale {
                                Some(s) => s,
                                None => 1.0 / (dims.d_head as f64).sqrt(),
                            };
                            match dims.scores.softcap {
                                Some(c) => c * (dot * scale / c).tanh(),
                                None => dot * scale,
                            }
                        })
                        .collect();
                    let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let z: f64 = s.iter().map(|x| (x - max).exp()).sum();
                    let out = &mut ctx[(b * dims.q_len + i) * d + h * dims.d_head..][..dims.d_head];
                    for (x, t) in s.iter().zip(seen) {
                        let w = (x - max).exp() / z;
                        for (o, &vt) in out.iter_mut().zip(&v[key(t)..][..dims.d_head]) {
                            *o += w * vt;
                        }
                    }
                }
            }
        }
        ctx
    }

    fn close(a: &[f64], b: &[f64], what: &str) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-10, "{what}: {x} vs {y}");
        }
    }

    /// Ranges that start past 0 (explicit per query, and a causal sliding window) through the
    /// plain, tiled and step kernels against float64 loops; the tiled backward against the plain
    /// one over the same ranges.
    #[test]
    fn late_starts_and_windows_match_reference_loops() {
        let dims = AttnDims {
            batch: 2,
            heads: 4,
            kv_heads: 2,
            d_head: 8,
            q_len: 70,
            k_len: 150,
            kv_stride: 150,
            scores: Scores::default(),
        };
        let (n_q, n_kv) = (
            dims.batch * dims.q_len * dims.d_model(),
            dims.batch * 150 * dims.d_kv(),
        );
        let (q, k, v) = (uniform(n_q, 1), uniform(n_kv, 2), uniform(n_kv, 3));
        let mut rng = Rng::new(4);
        let explicit = QueryRanges {
            q_len: dims.q_len,
            ranges: (0..dims.batch * dims.q_len)
                .map(|_| {
                    let a = (rng.uniform() * 150.0) as usize;
                    let b = (rng.uniform() * 150.0) as usize;
                    a.min(b)..a.max(b) + 1
                })
                .collect(),
        };
        let lens = [150, 131];
        let mask = AttnMask {
            key_lens: &lens,
            causal: true,
            q_offset: 75,
        };
        let table: Vec<u32> = (0..(dims.batch * 150) as u32).collect();
        let ranges: [&dyn KeyRanges; 2] = [&explicit, &mask.windowed(40)];
        for (r, ranges) in ranges.into_iter().enumerate() {
            let want = naive(&q, &k, &v, dims, &ranges);
            let contiguous = || KvView::Contiguous { k: &k, v: &v };
            let plain = attend(&q, contiguous(), ranges, dims, Purpose::Weights);
            close(&plain.ctx, &want, &format!("plain {r}"));
            let tiled = attend(
                &q,
                contiguous(),
                ranges,
                dims,
                Purpose::Train { drop: None },
            );
            assert!(matches!(tiled.weights, AttnWeights::LogSumExp(_)));
            close(&tiled.ctx, &want, &format!("tiled {r}"));
            let paged = KvView::Paged {
                k: (&k).into(),
                v: (&v).into(),
                rows: &table,
            };
            let step = attend(&q, paged, ranges, dims, Purpose::Decode);
            close(&step.ctx, &want, &format!("step {r}"));
            // Backward: the tiled kernel's against the plain one's.
            let dctx = uniform(n_q, 5);
            let grads = |saved: SavedRef<'_, f64>, ctx: &[f64]| {
                let (mut dq, mut dk, mut dv) = (vec![0.0; n_q], vec![0.0; n_kv], vec![0.0; n_kv]);
                let g = (&mut dq[..], &mut dk[..], &mut dv[..]);
                attend_backward(g, &dctx, ctx, (&q, &k, &v), saved, ranges, dims);
                [dq, dk, dv].concat()
            };
            let (AttnWeights::Probs(p), AttnWeights::LogSumExp(lse)) =
                (&plain.weights, &tiled.weights)
            else {
                unreachable!()
            };
            let from_probs = SavedRef::Probs {
                probs: p,
                drop: None,
            };
            let want = grads(from_probs, &plain.ctx);
            close(
                &grads(SavedRef::LogSumExp(lse), &tiled.ctx),
                &want,
                &format!("grads {r}"),
            );
        }
    }

    /// Scores with their own scale and a soft cap (Gemma 2): the plain, tiled and step kernels
    /// against float64 loops; the plain backward against central differences of
    /// `L = Σ dctx ⊙ ctx` in q and k, the tiled backward against the plain one.
    #[test]
    fn capped_scores_match_reference_loops_and_central_differences() {
        let scores = Scores {
            scale: Some(0.3),
            softcap: Some(1.5),
        };
        let lens = [130, 129];
        let mask = AttnMask {
            key_lens: &lens,
            causal: true,
            q_offset: 0,
        };
        for (k_len, ranges) in [
            (130, mask),
            (
                9,
                AttnMask {
                    key_lens: &[9, 7],
                    ..mask
                },
            ),
        ] {
            let dims = AttnDims {
                batch: 2,
                heads: 2,
                kv_heads: 1,
                d_head: 4,
                q_len: k_len,
                k_len,
                kv_stride: k_len,
                scores,
            };
            let (n_q, n_kv) = (2 * k_len * dims.d_model(), 2 * k_len * dims.d_kv());
            // large enough that the cap bites: |q·k · 0.3| reaches past 1.5
            let big = |x: Vec<f64>| x.into_iter().map(|v| 3.0 * v).collect::<Vec<_>>();
            let (q, k, v) = (
                big(uniform(n_q, 11)),
                big(uniform(n_kv, 12)),
                uniform(n_kv, 13),
            );
            let want = naive(&q, &k, &v, dims, &ranges);
            let uncapped = AttnDims {
                scores: Scores::default(),
                ..dims
            };
            let differs = naive(&q, &k, &v, uncapped, &ranges);
            assert!(want.iter().zip(&differs).any(|(a, b)| (a - b).abs() > 1e-3));
            let kv = || KvView::Contiguous { k: &k, v: &v };
            let plain = attend(&q, kv(), ranges, dims, Purpose::Weights);
            close(&plain.ctx, &want, "plain");
            let train = attend(&q, kv(), ranges, dims, Purpose::Train { drop: None });
            close(&train.ctx, &want, "train");
            let table: Vec<u32> = (0..(2 * k_len) as u32).collect();
            let paged = KvView::Paged {
                k: (&k).into(),
                v: (&v).into(),
                rows: &table,
            };
            let decode = attend(&q, paged, ranges, dims, Purpose::Decode);
            close(&decode.ctx, &want, "step");
            let dctx = uniform(n_q, 14);
            let grads = |attended: &Attended<f64>| {
                let saved = match &attended.weights {
                    AttnWeights::Probs(p) => SavedRef::Probs {
                        probs: p,
                        drop: None,
                    },
                    AttnWeights::LogSumExp(lse) => SavedRef::LogSumExp(lse),
                };
                let (mut dq, mut dk, mut dv) = (vec![0.0; n_q], vec![0.0; n_kv], vec![0.0; n_kv]);
                let g = (&mut dq[..], &mut dk[..], &mut dv[..]);
                attend_backward(g, &dctx, &attended.ctx, (&q, &k, &v), saved, ranges, dims);
                (dq, dk, dv)
            };
            let (dq, dk, dv) = grads(&plain);
            let (tq, tk, tv) = grads(&train);
            close(
                &[tq, tk, tv].concat(),
                &[dq.clone(), dk.clone(), dv].concat(),
                "tiled grads",
            );
            let loss = |q: &[f64], k: &[f64]| -> f64 {
                let ctx = naive(q, k, &v, dims, &ranges);
                ctx.iter().zip(&dctx).map(|(a, b)| a * b).sum()
            };
            let h = 1e-5;
            for i in (0..n_q).step_by(n_q / 23) {
                let (mut up, mut down) = (q.clone(), q.clone());
                up[i] += h;
                down[i] -= h;
                let numeric = (loss(&up, &k) - loss(&down, &k)) / (2.0 * h);
                assert!(
                    (dq[i] - numeric).abs() < 1e-7,
                    "dq {i}: {} {numeric}",
                    dq[i]
                );
            }
            for i in (0..n_kv).step_by(n_kv / 23) {
                let (mut up, mut down) = (k.clone(), k.clone());
                up[i] += h;
                down[i] -= h;
                let numeric = (loss(&q, &up) - loss(&q, &down)) / (2.0 * h);
                assert!(
                    (dk[i] - numeric).abs() < 1e-7,
                    "dk {i}: {} {numeric}",
                    dk[i]
                );
            }
        }
    }
}
