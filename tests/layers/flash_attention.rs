//! The tiled (FlashAttention) kernel against the plain kernel that keeps the whole probability
//! matrix, and its backward against central finite differences in f64.

use crate::common;

use common::{dot, randn};
use transformer::kernels::attention::{attention_backward, attention_forward, AttnDims, AttnMask};
use transformer::kernels::flash_attention::{
    flash_attention_backward, flash_attention_forward, BLOCK_K, BLOCK_Q,
};
use transformer::rng::Rng;
use transformer::Float;

/// One attention problem: dims, per-batch key lengths, causal flag and query offset.
struct Case {
    dims: AttnDims,
    key_lens: Vec<usize>,
    causal: bool,
    q_offset: usize,
}

impl Case {
    fn new(batch: usize, heads: usize, d_head: usize, q_len: usize, k_len: usize) -> Self {
        Case {
            dims: AttnDims {
                batch,
                heads,
                kv_heads: heads,
                d_head,
                q_len,
                k_len,
                kv_stride: k_len,
                scores: Default::default(),
            },
            key_lens: vec![k_len; batch],
            causal: false,
            q_offset: 0,
        }
    }
    fn mask(&self) -> AttnMask<'_> {
        AttnMask {
            key_lens: &self.key_lens,
            causal: self.causal,
            q_offset: self.q_offset,
        }
    }
    fn d_model(&self) -> usize {
        self.dims.heads * self.dims.d_head
    }
}

/// Plain-path forward and backward: (ctx, dq, dk, dv).
fn plain<T: Float>(c: &Case, q: &[T], k: &[T], v: &[T], dctx: &[T]) -> [Vec<T>; 4] {
    let d = c.dims;
    let mut ctx = vec![T::zero(); q.len()];
    let mut probs = vec![T::zero(); d.batch * d.heads * d.q_len * d.k_len];
    attention_forward(&mut ctx, &mut probs, q, k, v, d, c.mask(), None);
    let (mut dq, mut dk, mut dv) = (
        vec![T::zero(); q.len()],
        vec![T::zero(); k.len()],
        vec![T::zero(); v.len()],
    );
    attention_backward(&mut dq, &mut dk, &mut dv, dctx, q, k, v, &probs, d, None);
    [ctx, dq, dk, dv]
}

/// Tiled forward and backward: (ctx, dq, dk, dv). Buffers start as NaN so that every element
/// the kernel should write but does not shows up.
fn tiled<T: Float>(c: &Case, q: &[T], k: &[T], v: &[T], dctx: &[T]) -> [Vec<T>; 4] {
    let d = c.dims;
    let nan = T::of(f64::NAN);
    let mut ctx = vec![nan; q.len()];
    let mut lse = vec![nan; d.batch * d.q_len * d.heads];
    flash_attention_forward(&mut ctx, &mut lse, q, k, v, d, c.mask());
    let (mut dq, mut dk, mut dv) = (vec![nan; q.len()], vec![nan; k.len()], vec![nan; v.len()]);
    flash_attention_backward(
        &mut dq,
        &mut dk,
        &mut dv,
        dctx,
        &ctx,
        &lse,
        q,
        k,
        v,
        d,
        c.mask(),
    );
    [ctx, dq, dk, dv]
}

fn inputs<T: Float>(c: &Case, seed: u64) -> [Vec<T>; 4] {
    let mut rng = Rng::new(seed);
    let d = c.dims;
    let dm = c.d_model();
    [
        randn(&mut rng, d.batch * d.q_len * dm, 1.0),
        randn(&mut rng, d.batch * d.k_len * dm, 1.0),
        randn(&mut rng, d.batch * d.k_len * dm, 1.0),
        randn(&mut rng, d.batch * d.q_len * dm, 1.0),
    ]
}

/// Worst |a − b| / (atol + rtol |b|) over the four outputs.
fn worst<T: Float>(a: &[Vec<T>; 4], b: &[Vec<T>; 4], atol: f64, rtol: f64) -> f64 {
    let mut w = 0.0f64;
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.len(), y.len());
        for (&p, &r) in x.iter().zip(y) {
            let e = (p.f64() - r.f64()).abs() / (atol + rtol * r.f64().abs());
            assert!(
                e.is_finite(),
                "non-finite output {} vs {}",
                p.f64(),
                r.f64()
            );
            w = w.max(e);
        }
    }
    w
}

/// Shapes around the block sizes, with padding and causal masks.
fn cases() -> Vec<Case> {
    let (bq, bk) = (BLOCK_Q, BLOCK_K);
    let mut out = Vec::new();
    for &(q_len, k_len) in &[
        (1, 1),
        (3, 7),
        (bq, bk),
        (bq + 1, bk - 1),
        (2 * bq + 5, 3 * bk + 2),
        (37, 2 * bk + 9),
        (3 * bq - 1, 1),
    ] {
        out.push(Case::new(2, 3, 8, q_len, k_len));
        let mut padded = Case::new(3, 2, 4, q_len, k_len);
        padded.key_lens = vec![k_len, k_len.div_ceil(2), 1];
        out.push(padded);
        if q_len <= k_len {
            let mut causal = Case::new(2, 2, 8, q_len, k_len);
            causal.causal = true;
            causal.q_offset = k_len - q_len;
            causal.key_lens = vec![k_len, k_len.div_ceil(3)];
            out.push(causal);
        }
    }
    out
}

#[test]
fn tiled_equals_plain_in_f64() {
    for (n, c) in cases().iter().enumerate() {
        let [q, k, v, g] = inputs::<f64>(c, 10 + n as u64);
        let w = worst(
            &tiled(c, &q, &k, &v, &g),
            &plain(c, &q, &k, &v, &g),
            1e-12,
            1e-10,
        );
        assert!(w <= 1.0, "case {n} {:?}: worst {w}", c.dims);
    }
}

#[test]
fn tiled_equals_plain_within_f32_rounding() {
    let mut w = 0.0f64;
    for (n, c) in cases().iter().enumerate() {
        let [q, k, v, g] = inputs::<f32>(c, 100 + n as u64);
        w = w.max(worst(
            &tiled(c, &q, &k, &v, &g),
            &plain(c, &q, &k, &v, &g),
            1e-5,
            1e-4,
        ));
    }
    assert!(w <= 1.0, "worst {w}");
}

#[test]
fn forward_reads_a_strided_key_cache() {
    // Keys in a cache with room for more rows than are scored, as in incremental decoding.
    let mut c = Case::new(2, 2, 8, 1, BLOCK_K + 3);
    c.causal = true;
    c.q_offset = c.dims.k_len - 1;
    let stride = c.dims.k_len + 5;
    let dm = c.d_model();
    let mut rng = Rng::new(7);
    let q: Vec<f64> = randn(&mut rng, 2 * dm, 1.0);
    let k: Vec<f64> = randn(&mut rng, 2 * stride * dm, 1.0);
    let v: Vec<f64> = randn(&mut rng, 2 * stride * dm, 1.0);
    let dims = AttnDims {
        kv_stride: stride,
        ..c.dims
    };
    let mut want = vec![0.0; q.len()];
    let mut probs = vec![0.0; 2 * 2 * c.dims.k_len];
    attention_forward(&mut want, &mut probs, &q, &k, &v, dims, c.mask(), None);
    let mut got = vec![f64::NAN; q.len()];
    let mut lse = vec![f64::NAN; 2 * 2];
    flash_attention_forward(&mut got, &mut lse, &q, &k, &v, dims, c.mask());
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    }
}

#[test]
fn backward_matches_finite_differences() {
    // L = Σ dctx ⊙ ctx(q, k, v); its gradient is what the backward returns.
    let mut c = Case::new(2, 2, 4, BLOCK_Q + 2, BLOCK_K + 3);
    c.causal = true;
    c.q_offset = c.dims.k_len - c.dims.q_len;
    c.key_lens = vec![c.dims.k_len, 5];
    let [q, k, v, g] = inputs::<f64>(&c, 3);
    let loss = |q: &[f64], k: &[f64], v: &[f64]| {
        let mut ctx = vec![0.0; q.len()];
        let mut lse = vec![0.0; c.dims.batch * c.dims.q_len * c.dims.heads];
        flash_attention_forward(&mut ctx, &mut lse, q, k, v, c.dims, c.mask());
        dot(&ctx, &g)
    };
    let [_, dq, dk, dv] = tiled(&c, &q, &k, &v, &g);
    let h = common::H;
    let mut rng = Rng::new(5);
    for (which, grad) in [(0, &dq), (1, &dk), (2, &dv)] {
        for _ in 0..40 {
            let len = grad.len();
            let i = (rng.uniform_range(0.0, len as f64) as usize).min(len - 1);
            let mut xs = [q.clone(), k.clone(), v.clone()];
            xs[which][i] += h;
            let up = loss(&xs[0], &xs[1], &xs[2]);
            xs[which][i] -= 2.0 * h;
            let down = loss(&xs[0], &xs[1], &xs[2]);
            let numeric = (up - down) / (2.0 * h);
            let err = (grad[i] - numeric).abs() / numeric.abs().max(common::GRAD_FLOOR);
            assert!(
                err < common::GRAD_TOL,
                "input {which} index {i}: {} vs {numeric}",
                grad[i]
            );
        }
    }
}
