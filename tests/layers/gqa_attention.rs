//! Grouped-query attention (`AttnDims::kv_heads` < `heads`) in the three attention kernels
//! (plain, tiled, decoding step): forward against the f64 reference loops run on keys and values
//! whose heads are repeated for their groups (what Hugging Face's `repeat_kv` does), backward
//! against central finite differences in f64, with padding and causal masks and
//! `kv_heads ∈ {1, 2, heads}`.

use crate::common;

use common::*;
use transformer::kernels::attention::{attention_backward, attention_forward, AttnDims, AttnMask};
use transformer::kernels::dropout::dropout_mask;
use transformer::kernels::flash_attention::{
    flash_attention_backward, flash_attention_forward, BLOCK_K, BLOCK_Q,
};
use transformer::kernels::step_attention::step_attention_forward;
use transformer::rng::Rng;
use transformer::Float;

const HEADS: usize = 4;

/// `[rows, kv_heads * d_head]` → `[rows, heads * d_head]`, query head `h` getting key/value head
/// `h / (heads / kv_heads)`.
fn repeat_kv(x: &[f64], kv_heads: usize, heads: usize, d_head: usize) -> Vec<f64> {
    let group = heads / kv_heads;
    let mut out = Vec::with_capacity(x.len() * group);
    for row in x.chunks_exact(kv_heads * d_head) {
        for h in 0..heads {
            let g = h / group;
            out.extend_from_slice(&row[g * d_head..(g + 1) * d_head]);
        }
    }
    out
}

/// One attention problem.
struct Case {
    dims: AttnDims,
    key_lens: Vec<usize>,
    causal: bool,
    q_offset: usize,
}

impl Case {
    fn new(kv_heads: usize, d_head: usize, q_len: usize, k_len: usize, causal: bool) -> Self {
        // batch 3: all keys, about half, one key (causal: the query offset keeps every row
        // seeing at least key 0)
        Case {
            dims: AttnDims {
                batch: 3,
                heads: HEADS,
                kv_heads,
                d_head,
                q_len,
                k_len,
                kv_stride: k_len,
                scores: Default::default(),
            },
            key_lens: vec![k_len, k_len.div_ceil(2), 1],
            causal,
            q_offset: if causal {
                k_len.saturating_sub(q_len)
            } else {
                0
            },
        }
    }
    fn mask(&self) -> AttnMask<'_> {
        AttnMask {
            key_lens: &self.key_lens,
            causal: self.causal,
            q_offset: self.q_offset,
        }
    }
    fn reference(&self) -> NaiveAttn<'_> {
        let d = self.dims;
        NaiveAttn {
            batch: d.batch,
            heads: d.heads,
            d_head: d.d_head,
            q_len: d.q_len,
            k_len: d.k_len,
            kv_stride: d.kv_stride,
            key_lens: &self.key_lens,
            causal: self.causal,
            q_offset: self.q_offset,
        }
    }
    /// `q`, `k`, `v` and an upstream gradient `dctx`.
    fn inputs<T: Float>(&self, seed: u64) -> [Vec<T>; 4] {
        let d = self.dims;
        let mut rng = Rng::new(seed);
        [
            randn(&mut rng, d.batch * d.q_len * d.d_model(), 1.0),
            randn(&mut rng, d.batch * d.kv_stride * d.d_kv(), 1.0),
            randn(&mut rng, d.batch * d.kv_stride * d.d_kv(), 1.0),
            randn(&mut rng, d.batch * d.q_len * d.d_model(), 1.0),
        ]
    }
    /// The reference on repeated keys and values: `(ctx, probs, lse)`, the log-sum-exp of each
    /// query row's visible scores (+∞ where none is visible).
    fn expected(&self, q: &[f64], k: &[f64], v: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let d = self.dims;
        let (kr, vr) = (
            repeat_kv(k, d.kv_heads, d.heads, d.d_head),
            repeat_kv(v, d.kv_heads, d.heads, d.d_head),
        );
        let (ctx, probs) = self.reference().run(q, &kr, &vr);
        let mut lse = vec![f64::INFINITY; d.batch * d.q_len * d.heads];
        for b in 0..d.batch {
            for h in 0..d.heads {
                for i in 0..d.q_len {
                    let qrow = &q[(b * d.q_len + i) * d.d_model() + h * d.d_head..][..d.d_head];
                    let mut total = 0.0;
                    for j in 0..d.k_len {
                        let (lens, c, o) = (&self.key_lens, self.causal, self.q_offset);
                        if is_visible(lens, c, o, b, i, j) {
                            let at = (b * d.kv_stride + j) * d.d_model() + h * d.d_head;
                            let s = dot(qrow, &kr[at..at + d.d_head]) * d.scale::<f64>();
                            total += s.exp();
                        }
                    }
                    if total > 0.0 {
                        lse[(b * d.q_len + i) * d.heads + h] = total.ln();
                    }
                }
            }
        }
        (ctx, probs, lse)
    }
}

fn plain_forward<T: Float>(c: &Case, q: &[T], k: &[T], v: &[T], drop: Option<&[T]>) -> Vec<T> {
    let d = c.dims;
    let mut ctx = vec![T::zero(); q.len()];
    let mut probs = vec![T::zero(); d.batch * d.heads * d.q_len * d.k_len];
    attention_forward(&mut ctx, &mut probs, q, k, v, d, c.mask(), drop);
    ctx
}

/// Plain forward and backward: `[ctx, probs, dq, dk, dv]`.
fn plain<T: Float>(c: &Case, q: &[T], k: &[T], v: &[T], dctx: &[T]) -> [Vec<T>; 5] {
    let d = c.dims;
    let nan = T::of(f64::NAN);
    let mut ctx = vec![nan; q.len()];
    let mut probs = vec![nan; d.batch * d.heads * d.q_len * d.k_len];
    attention_forward(&mut ctx, &mut probs, q, k, v, d, c.mask(), None);
    let (mut dq, mut dk, mut dv) = (vec![nan; q.len()], vec![nan; k.len()], vec![nan; v.len()]);
    attention_backward(&mut dq, &mut dk, &mut dv, dctx, q, k, v, &probs, d, None);
    [ctx, probs, dq, dk, dv]
}

fn tiled_forward<T: Float>(c: &Case, q: &[T], k: &[T], v: &[T]) -> (Vec<T>, Vec<T>) {
    let d = c.dims;
    let nan = T::of(f64::NAN);
    let mut ctx = vec![nan; q.len()];
    let mut lse = vec![nan; d.batch * d.q_len * d.heads];
    flash_attention_forward(&mut ctx, &mut lse, q, k, v, d, c.mask());
    (ctx, lse)
}

/// Tiled forward and backward: `[ctx, lse, dq, dk, dv]`. Outputs start as NaN, so that an
/// element the kernel should write but does not shows up.
fn tiled<T: Float>(c: &Case, q: &[T], k: &[T], v: &[T], dctx: &[T]) -> [Vec<T>; 5] {
    let (ctx, lse) = tiled_forward(c, q, k, v);
    let nan = T::of(f64::NAN);
    let (mut dq, mut dk, mut dv) = (vec![nan; q.len()], vec![nan; k.len()], vec![nan; v.len()]);
    let d = c.dims;
    let m = c.mask();
    flash_attention_backward(&mut dq, &mut dk, &mut dv, dctx, &ctx, &lse, q, k, v, d, m);
    [ctx, lse, dq, dk, dv]
}

/// Small shapes for the exhaustive checks, and shapes across the tiles' edges.
fn small_cases() -> Vec<Case> {
    let mut out = Vec::new();
    for kv_heads in [1, 2, HEADS] {
        out.push(Case::new(kv_heads, 4, 5, 6, false));
        out.push(Case::new(kv_heads, 3, 6, 6, true));
        out.push(Case::new(kv_heads, 4, 2, 5, true)); // decoder-style queries at the end
    }
    out
}

fn tiled_cases() -> Vec<Case> {
    let mut out = Vec::new();
    for kv_heads in [1, 2, HEADS] {
        out.push(Case::new(kv_heads, 4, BLOCK_Q + 3, 2 * BLOCK_K + 5, false));
        out.push(Case::new(kv_heads, 4, BLOCK_Q + 7, BLOCK_K + 7, true));
    }
    out
}

#[test]
fn forward_matches_the_reference_on_repeated_heads() {
    let mut worst = [0.0f64; 3];
    for (n, c) in small_cases().iter().chain(&tiled_cases()).enumerate() {
        let [q, k, v, _] = c.inputs::<f64>(10 + n as u64);
        let (want_ctx, want_p, want_lse) = c.expected(&q, &k, &v);
        let [ctx, probs, ..] = plain(c, &q, &k, &v, &q);
        let what = format!("plain {:?} causal {}", c.dims, c.causal);
        worst[0] = worst[0].max(max_abs_diff(&ctx, &want_ctx));
        worst[0] = worst[0].max(max_abs_diff(&probs, &want_p));
        assert_close(&what, &ctx, &want_ctx, 1e-12, 1e-12);
        assert_close(&what, &probs, &want_p, 1e-12, 1e-12);
        let (ctx, lse) = tiled_forward(c, &q, &k, &v);
        let what = format!("tiled {:?} causal {}", c.dims, c.causal);
        worst[1] = worst[1].max(max_abs_diff(&ctx, &want_ctx));
        assert_close(&what, &ctx, &want_ctx, 1e-12, 1e-12);
        assert!(
            lse.iter().all(|x| x.is_finite()),
            "{what}: every row sees a key"
        );
        worst[1] = worst[1].max(max_abs_diff(&lse, &want_lse));
        assert_close(&what, &lse, &want_lse, 1e-12, 1e-12);
        // f32 against the same reference
        let f = |x: &[f64]| x.iter().map(|&a| a as f32).collect::<Vec<f32>>();
        let (q32, k32, v32) = (f(&q), f(&k), f(&v));
        let ctx32 = plain_forward(c, &q32, &k32, &v32, None);
        worst[2] = worst[2].max(assert_close("plain f32", &ctx32, &want_ctx, 1e-4, 1e-5));
        let (ctx32, _) = tiled_forward(c, &q32, &k32, &v32);
        worst[2] = worst[2].max(assert_close("tiled f32", &ctx32, &want_ctx, 1e-4, 1e-5));
    }
    eprintln!(
        "GQA forward: max |diff| f64 plain {:e}, tiled {:e}; f32 worst diff/allowance {:.3}",
        worst[0], worst[1], worst[2]
    );
}

#[test]
fn plain_backward_matches_finite_differences() {
    // L = Σ dctx ⊙ ctx(q, k, v), every element of q, k and v.
    let mut gc = GradCheck::new("GQA plain attention");
    for (n, c) in small_cases().iter().enumerate() {
        let [q, k, v, g] = c.inputs::<f64>(30 + n as u64);
        let [_, _, dq, dk, dv] = plain(c, &q, &k, &v, &g);
        gc.wrt_input("q", &q, &dq, |q| {
            dot(&plain_forward(c, q, &k, &v, None), &g)
        });
        gc.wrt_input("k", &k, &dk, |k| {
            dot(&plain_forward(c, &q, k, &v, None), &g)
        });
        gc.wrt_input("v", &v, &dv, |v| {
            dot(&plain_forward(c, &q, &k, v, None), &g)
        });
    }
    gc.report();
}

#[test]
fn plain_backward_with_attention_dropout_matches_finite_differences() {
    let mut gc = GradCheck::new("GQA plain attention, dropout");
    let c = Case::new(2, 4, 5, 6, true);
    let [q, k, v, g] = c.inputs::<f64>(40);
    let d = c.dims;
    let n = d.batch * d.heads * d.q_len * d.k_len;
    let mut rng = Rng::new(41);
    let drop: Vec<f64> = dropout_mask(&mut rng, n, 0.3).unwrap();
    assert!(drop.contains(&0.0));
    let mut ctx = vec![0.0; q.len()];
    let mut probs = vec![0.0; n];
    attention_forward(&mut ctx, &mut probs, &q, &k, &v, d, c.mask(), Some(&drop));
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    attention_backward(
        &mut dq,
        &mut dk,
        &mut dv,
        &g,
        &q,
        &k,
        &v,
        &probs,
        d,
        Some(&drop),
    );
    let m = Some(drop.as_slice());
    gc.wrt_input("q", &q, &dq, |q| dot(&plain_forward(&c, q, &k, &v, m), &g));
    gc.wrt_input("k", &k, &dk, |k| dot(&plain_forward(&c, &q, k, &v, m), &g));
    gc.wrt_input("v", &v, &dv, |v| dot(&plain_forward(&c, &q, &k, v, m), &g));
    gc.report();
}

#[test]
fn tiled_backward_matches_finite_differences_and_the_plain_backward() {
    // Every element against the plain backward in f64; a sample of elements against central
    // differences of the tiled forward.
    let mut gc = GradCheck::new("GQA tiled attention");
    let mut worst_vs_plain = 0.0f64;
    for (n, c) in small_cases().iter().chain(&tiled_cases()).enumerate() {
        let [q, k, v, g] = c.inputs::<f64>(50 + n as u64);
        let [ctx, _, dq, dk, dv] = tiled(c, &q, &k, &v, &g);
        let [ctx_p, _, dq_p, dk_p, dv_p] = plain(c, &q, &k, &v, &g);
        for (a, b) in [(&ctx, &ctx_p), (&dq, &dq_p), (&dk, &dk_p), (&dv, &dv_p)] {
            worst_vs_plain = worst_vs_plain.max(max_abs_diff(a, b));
            assert_close("tiled vs plain", a, b, 1e-10, 1e-12);
        }
        let mut rng = Rng::new(60 + n as u64);
        for (which, grad) in [(0, &dq), (1, &dk), (2, &dv)] {
            for _ in 0..25 {
                let e = rng.below(grad.len());
                let x0 = [&q, &k, &v][which][e];
                // element e of input `which` as a one-element input of the loss
                let name = format!("{}[{e}] ", ["q", "k", "v"][which]);
                gc.wrt_input(&name, &[x0], &[grad[e]], |x| {
                    let mut xs = [q.clone(), k.clone(), v.clone()];
                    xs[which][e] = x[0];
                    dot(&tiled_forward(c, &xs[0], &xs[1], &xs[2]).0, &g)
                });
            }
        }
    }
    gc.report();
    eprintln!("GQA tiled vs plain backward (f64): max |diff| {worst_vs_plain:e}");
}

#[test]
fn tiled_equals_plain_within_f32_rounding() {
    let mut worst = 0.0f64;
    for (n, c) in tiled_cases().iter().enumerate() {
        let [q, k, v, g] = c.inputs::<f32>(70 + n as u64);
        let t = tiled(c, &q, &k, &v, &g);
        let p = plain(c, &q, &k, &v, &g);
        for i in [0, 2, 3, 4] {
            let want: Vec<f64> = p[i].iter().map(|x| x.f64()).collect();
            worst = worst.max(assert_close("tiled vs plain f32", &t[i], &want, 1e-3, 1e-4));
        }
    }
    eprintln!("GQA tiled vs plain f32: worst diff/allowance {worst:.3}");
}

#[test]
fn kv_heads_equal_to_heads_changes_nothing() {
    // One query head per key/value head is plain multi-head attention: the reference loops on
    // the keys and values as they are, across the tiles' edges.
    let c = Case::new(HEADS, 4, BLOCK_Q + 1, BLOCK_K + 2, true);
    let [q, k, v, g] = c.inputs::<f64>(80);
    let (want, _) = c.reference().run(&q, &k, &v);
    let [ctx, ..] = plain(&c, &q, &k, &v, &g);
    assert_close("plain", &ctx, &want, 1e-12, 1e-12);
    let (ctx, _) = tiled_forward(&c, &q, &k, &v);
    assert_close("tiled", &ctx, &want, 1e-12, 1e-12);
}

#[test]
fn step_kernel_matches_the_reference_through_a_shuffled_table() {
    let mut worst = 0.0f64;
    for kv_heads in [1, 2, HEADS] {
        for (q_len, k_len) in [(1, 7), (3, 9), (1, 1)] {
            let (batch, d_head) = (3, 8);
            let stride = k_len + 2;
            let stored = batch * k_len + 3;
            let d_kv = kv_heads * d_head;
            let d = HEADS * d_head;
            let mut rng = Rng::new(90 + kv_heads as u64);
            let q: Vec<f64> = randn(&mut rng, batch * q_len * d, 1.0);
            let k: Vec<f64> = randn(&mut rng, stored * d_kv, 1.5);
            let v: Vec<f64> = randn(&mut rng, stored * d_kv, 1.0);
            let mut perm: Vec<u32> = (0..stored as u32).collect();
            rng.shuffle(&mut perm);
            let mut table = vec![u32::MAX; batch * stride];
            for b in 0..batch {
                table[b * stride..b * stride + k_len]
                    .copy_from_slice(&perm[b * k_len..(b + 1) * k_len]);
            }
            // padding: row b sees k_len, k_len − 1, ... keys (at least one)
            let visible: Vec<usize> = (0..batch).map(|b| k_len - b.min(k_len - 1)).collect();
            let dims = AttnDims {
                batch,
                heads: HEADS,
                kv_heads,
                d_head,
                q_len,
                k_len,
                kv_stride: stride,
                scores: Default::default(),
            };
            let mut ctx = vec![f64::NAN; batch * q_len * d];
            let mut probs = vec![f64::NAN; batch * HEADS * q_len * k_len];
            step_attention_forward(&mut ctx, &mut probs, &q, &k, &v, &table, &visible, dims);
            // The reference: gather each row's keys into a dense [batch * k_len, d_kv] buffer,
            // repeat the heads, and mask the unseen keys as padding.
            let gather = |x: &[f64]| {
                let mut out = Vec::with_capacity(batch * k_len * d_kv);
                for b in 0..batch {
                    for t in 0..k_len {
                        let r = table[b * stride + t] as usize;
                        out.extend_from_slice(&x[r * d_kv..(r + 1) * d_kv]);
                    }
                }
                repeat_kv(&out, kv_heads, HEADS, d_head)
            };
            let reference = NaiveAttn {
                batch,
                heads: HEADS,
                d_head,
                q_len,
                k_len,
                kv_stride: k_len,
                key_lens: &visible,
                causal: false,
                q_offset: 0,
            };
            let (want_ctx, want_p) = reference.run(&q, &gather(&k), &gather(&v));
            worst = worst.max(max_abs_diff(&ctx, &want_ctx));
            worst = worst.max(max_abs_diff(&probs, &want_p));
            assert_close("step ctx", &ctx, &want_ctx, 1e-12, 1e-12);
            assert_close("step probs", &probs, &want_p, 1e-12, 1e-12);
        }
    }
    eprintln!("GQA step kernel: max |diff| {worst:e}");
}

#[test]
#[should_panic(expected = "cannot share")]
fn kv_heads_must_divide_heads() {
    let c = Case::new(3, 4, 2, 2, false);
    let [q, k, v, _] = c.inputs::<f64>(1);
    plain_forward(&c, &q, &k, &v, None);
}
