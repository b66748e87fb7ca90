//! Shared helpers of the per-layer tests: random data, a central finite-difference checker in
//! f64, and plain f64 loop implementations of every layer, written here from the paper's
//! formulas without calling the crate's kernels.
//!
//! Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use transformer::model::attention::MultiHeadAttention;
use transformer::model::feed_forward::FeedForward;
use transformer::model::param::{Module, Param};
use transformer::rng::Rng;
use transformer::train::pairs::Example;
use transformer::Float;

/// Finite-difference step.
pub const H: f64 = 1e-5;
/// Largest relative error tolerated between analytic and numeric gradients.
pub const GRAD_TOL: f64 = 1e-6;
/// Floor of the relative error's denominator (gradients that are exactly zero, e.g. key biases).
pub const GRAD_FLOOR: f64 = 1e-3;

// ---------------------------------------------------------------------------------------------
// Random data and small vector helpers.

/// `n` samples of N(0, scale²) as `T`.
pub fn randn<T: Float>(rng: &mut Rng, n: usize, scale: f64) -> Vec<T> {
    (0..n).map(|_| T::of(scale * rng.normal())).collect()
}

/// Widens to f64.
pub fn to_f64<T: Float>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.f64()).collect()
}

/// Σ a ⊙ b, in f64.
pub fn dot<T: Float>(a: &[T], b: &[T]) -> f64 {
    assert_eq!(a.len(), b.len(), "dot of different lengths");
    a.iter().zip(b).map(|(x, y)| x.f64() * y.f64()).sum()
}

/// `a + b` element-wise.
pub fn add(a: &[f64], b: &[f64]) -> Vec<f64> {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

/// All parameters of a module, in its fixed order.
pub fn params_of<T, M: Module<T>>(m: &mut M) -> Vec<(String, &mut Param<T>)> {
    m.named_params("")
}

/// Adds U(−scale, scale) to every parameter, so that zero biases, unit gains and zero layer-norm
/// biases become generic values and a forgotten term cannot hide.
pub fn jitter_params<T: Float, M: Module<T>>(m: &mut M, rng: &mut Rng, scale: f64) {
    for (_, p) in params_of(m) {
        for v in p.value.data.iter_mut() {
            *v = T::of(v.f64() + rng.uniform_range(-scale, scale));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The finite-difference checker.

/// `|a − n| / max(|a| + |n|, floor)`.
pub fn rel_err(analytic: f64, numeric: f64) -> f64 {
    (analytic - numeric).abs() / (analytic.abs() + numeric.abs()).max(GRAD_FLOOR)
}

/// Compares analytic gradients with central differences element by element, panicking on the
/// first relative error at or above [`GRAD_TOL`], and remembers the worst one.
pub struct GradCheck {
    label: String,
    pub worst: f64,
    pub worst_at: String,
    pub count: usize,
}

impl GradCheck {
    pub fn new(label: impl Into<String>) -> Self {
        GradCheck {
            label: label.into(),
            worst: 0.0,
            worst_at: String::new(),
            count: 0,
        }
    }

    fn compare(&mut self, at: String, analytic: f64, numeric: f64) {
        assert!(
            analytic.is_finite() && numeric.is_finite(),
            "{}: {at}: non-finite gradient (analytic {analytic:e}, numeric {numeric:e})",
            self.label
        );
        let err = rel_err(analytic, numeric);
        assert!(
            err < GRAD_TOL,
            "{}: {at}: analytic {analytic:e} numeric {numeric:e} (rel err {err:e})",
            self.label
        );
        if err >= self.worst {
            self.worst = err;
            self.worst_at = at;
        }
        self.count += 1;
    }

    /// Checks `analytic = ∂f/∂x` at `x`, every element.
    pub fn wrt_input(
        &mut self,
        name: &str,
        x: &[f64],
        analytic: &[f64],
        f: impl Fn(&[f64]) -> f64,
    ) {
        assert_eq!(
            x.len(),
            analytic.len(),
            "{name}: gradient has the wrong size"
        );
        let mut xp = x.to_vec();
        for e in 0..x.len() {
            xp[e] = x[e] + H;
            let plus = f(&xp);
            xp[e] = x[e] - H;
            let minus = f(&xp);
            xp[e] = x[e];
            self.compare(
                format!("d{name}[{e}]"),
                analytic[e],
                (plus - minus) / (2.0 * H),
            );
        }
    }

    /// Checks the gradients accumulated in `m`'s parameters against `∂f/∂θ` at `m`, every
    /// element of every parameter.
    pub fn wrt_params<M: Module<f64> + Clone>(&mut self, m: &M, f: impl Fn(&M) -> f64) {
        let mut probe = m.clone();
        let grads: Vec<(String, Vec<f64>)> = params_of(&mut probe)
            .into_iter()
            .map(|(n, p)| (n, p.grad.data.clone()))
            .collect();
        assert!(
            !grads.is_empty(),
            "{}: module has no parameters",
            self.label
        );
        for (pi, (name, grad)) in grads.iter().enumerate() {
            for (e, &analytic) in grad.iter().enumerate() {
                let mut plus = m.clone();
                params_of(&mut plus)[pi].1.value.data[e] += H;
                let mut minus = m.clone();
                params_of(&mut minus)[pi].1.value.data[e] -= H;
                let numeric = (f(&plus) - f(&minus)) / (2.0 * H);
                self.compare(format!("d{name}[{e}]"), analytic, numeric);
            }
        }
    }

    /// Prints the worst error (visible with `--nocapture`).
    pub fn report(&self) {
        assert!(self.count > 0, "{}: nothing was checked", self.label);
        eprintln!(
            "{}: {} gradient elements, worst rel err {:e} at {}",
            self.label, self.count, self.worst, self.worst_at
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Comparison of an f32 forward with an f64 reference.

/// Asserts `|got − want| <= abs + rel·|want|` element-wise; returns the worst `|got − want|`
/// relative to that allowance (< 1 when passing).
pub fn assert_close<T: Float>(what: &str, got: &[T], want: &[f64], rel: f64, abs: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = 0.0f64;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = g.f64();
        let allowed = abs + rel * w.abs();
        let diff = (g - w).abs();
        assert!(
            diff <= allowed,
            "{what}[{i}]: got {g:e}, reference {w:e} (diff {diff:e} > {allowed:e})"
        );
        worst = worst.max(diff / allowed);
    }
    worst
}

/// The largest absolute difference.
pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

// ---------------------------------------------------------------------------------------------
// Plain f64 loop references.

/// `y[r, o] = b[o] + Σ_i x[r, i] · w[o, i]` with `w [d_out, d_in]`.
pub fn naive_linear(x: &[f64], w: &[f64], b: &[f64], d_in: usize, d_out: usize) -> Vec<f64> {
    let rows = x.len() / d_in;
    let mut y = vec![0.0; rows * d_out];
    for r in 0..rows {
        for o in 0..d_out {
            let mut s = b[o];
            for i in 0..d_in {
                s += x[r * d_in + i] * w[o * d_in + i];
            }
            y[r * d_out + o] = s;
        }
    }
    y
}

/// `γ ⊙ (x − μ) / √(σ² + ε) + β` per row, with the biased variance; also returns μ and
/// 1/√(σ² + ε) per row.
pub fn naive_layer_norm(
    x: &[f64],
    gamma: &[f64],
    beta: &[f64],
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let d = gamma.len();
    let rows = x.len() / d;
    let mut y = vec![0.0; x.len()];
    let (mut means, mut rstds) = (Vec::new(), Vec::new());
    for r in 0..rows {
        let row = &x[r * d..(r + 1) * d];
        let mut mean = 0.0;
        for &v in row {
            mean += v;
        }
        mean /= d as f64;
        let mut var = 0.0;
        for &v in row {
            var += (v - mean) * (v - mean);
        }
        var /= d as f64;
        let std = (var + eps).sqrt();
        for i in 0..d {
            y[r * d + i] = gamma[i] * (row[i] - mean) / std + beta[i];
        }
        means.push(mean);
        rstds.push(1.0 / std);
    }
    (y, means, rstds)
}

/// May query `i` of batch element `b` see key `j`?
pub fn is_visible(
    key_lens: &[usize],
    causal: bool,
    q_offset: usize,
    b: usize,
    i: usize,
    j: usize,
) -> bool {
    j < key_lens[b] && (!causal || j <= i + q_offset)
}

/// Sizes and mask of a reference attention call.
#[derive(Clone, Copy, Debug)]
pub struct NaiveAttn<'a> {
    pub batch: usize,
    pub heads: usize,
    pub d_head: usize,
    pub q_len: usize,
    pub k_len: usize,
    /// Rows between batch elements in `k` and `v`.
    pub kv_stride: usize,
    pub key_lens: &'a [usize],
    pub causal: bool,
    pub q_offset: usize,
}

impl NaiveAttn<'_> {
    /// `softmax(Q Kᵀ / √d_k) V` per batch element and head, masked scores set to −∞ before an
    /// explicit softmax. Returns `ctx [batch*q_len, heads*d_head]` and
    /// `probs [batch, heads, q_len, k_len]`.
    pub fn run(&self, q: &[f64], k: &[f64], v: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let (hs, dh, ql, kl) = (self.heads, self.d_head, self.q_len, self.k_len);
        let d = hs * dh;
        let mut ctx = vec![0.0; self.batch * ql * d];
        let mut probs = vec![0.0; self.batch * hs * ql * kl];
        for b in 0..self.batch {
            for h in 0..hs {
                for i in 0..ql {
                    let qrow = (b * ql + i) * d + h * dh;
                    let mut scores = vec![f64::NEG_INFINITY; kl];
                    for (j, s) in scores.iter_mut().enumerate() {
                        if is_visible(self.key_lens, self.causal, self.q_offset, b, i, j) {
                            let krow = (b * self.kv_stride + j) * d + h * dh;
                            let mut acc = 0.0;
                            for c in 0..dh {
                                acc += q[qrow + c] * k[krow + c];
                            }
                            *s = acc / (dh as f64).sqrt();
                        }
                    }
                    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let p_off = ((b * hs + h) * ql + i) * kl;
                    if max == f64::NEG_INFINITY {
                        continue; // nothing visible: all weights stay 0
                    }
                    let mut total = 0.0;
                    for j in 0..kl {
                        let e = (scores[j] - max).exp(); // exp(−∞) = 0
                        probs[p_off + j] = e;
                        total += e;
                    }
                    for j in 0..kl {
                        probs[p_off + j] /= total;
                    }
                    for c in 0..dh {
                        let mut acc = 0.0;
                        for j in 0..kl {
                            let vrow = (b * self.kv_stride + j) * d + h * dh;
                            acc += probs[p_off + j] * v[vrow + c];
                        }
                        ctx[qrow + c] = acc;
                    }
                }
            }
        }
        (ctx, probs)
    }
}

/// The four projections of a multi-head attention layer, widened to f64.
pub struct NaiveMha {
    pub wq: Vec<f64>,
    pub bq: Vec<f64>,
    pub wk: Vec<f64>,
    pub bk: Vec<f64>,
    pub wv: Vec<f64>,
    pub bv: Vec<f64>,
    pub wo: Vec<f64>,
    pub bo: Vec<f64>,
    pub d: usize,
    pub heads: usize,
}

impl NaiveMha {
    pub fn of<T: Float>(m: &MultiHeadAttention<T>) -> Self {
        NaiveMha {
            wq: to_f64(&m.q_proj.weight.value.data),
            bq: to_f64(&m.q_proj.bias.as_ref().unwrap().value.data),
            wk: to_f64(&m.k_proj.weight.value.data),
            bk: to_f64(&m.k_proj.bias.as_ref().unwrap().value.data),
            wv: to_f64(&m.v_proj.weight.value.data),
            bv: to_f64(&m.v_proj.bias.as_ref().unwrap().value.data),
            wo: to_f64(&m.out_proj.weight.value.data),
            bo: to_f64(&m.out_proj.bias.as_ref().unwrap().value.data),
            d: m.d_model,
            heads: m.n_heads,
        }
    }

    /// Output `[batch*q_len, d]` and attention weights of `x_q` attending to `x_kv`.
    pub fn forward(
        &self,
        x_q: &[f64],
        x_kv: &[f64],
        batch: usize,
        key_lens: &[usize],
        causal: bool,
    ) -> (Vec<f64>, Vec<f64>) {
        let d = self.d;
        let q = naive_linear(x_q, &self.wq, &self.bq, d, d);
        let k = naive_linear(x_kv, &self.wk, &self.bk, d, d);
        let v = naive_linear(x_kv, &self.wv, &self.bv, d, d);
        let k_len = x_kv.len() / (batch * d);
        let attn = NaiveAttn {
            batch,
            heads: self.heads,
            d_head: d / self.heads,
            q_len: x_q.len() / (batch * d),
            k_len,
            kv_stride: k_len,
            key_lens,
            causal,
            q_offset: 0,
        };
        let (ctx, probs) = attn.run(&q, &k, &v);
        (naive_linear(&ctx, &self.wo, &self.bo, d, d), probs)
    }
}

/// `max(0, x W₁ᵀ + b₁) W₂ᵀ + b₂` with the weights of `m`.
pub fn naive_ffn<T: Float>(m: &FeedForward<T>, x: &[f64]) -> Vec<f64> {
    let (l1, l2) = (&m.linear1, &m.linear2);
    let mut hidden = naive_linear(
        x,
        &to_f64(&l1.weight.value.data),
        &to_f64(&l1.bias.as_ref().unwrap().value.data),
        l1.d_in,
        l1.d_out,
    );
    for v in hidden.iter_mut() {
        if *v < 0.0 {
            *v = 0.0;
        }
    }
    naive_linear(
        &hidden,
        &to_f64(&l2.weight.value.data),
        &to_f64(&l2.bias.as_ref().unwrap().value.data),
        l2.d_in,
        l2.d_out,
    )
}

/// The paper's sinusoid: dimension `2i` is `sin(pos / 10000^(2i/d))`, `2i+1` the cosine.
pub fn naive_position(pos: usize, dim: usize, d: usize) -> f64 {
    let i = dim / 2;
    let angle = pos as f64 / 10000f64.powf((2 * i) as f64 / d as f64);
    if dim.is_multiple_of(2) {
        angle.sin()
    } else {
        angle.cos()
    }
}

/// `E[token] · √d + PE(pos)` for `tokens [batch, seq_len]`, positions from `pos_offset`.
pub fn naive_embedding(
    table: &[f64],
    d: usize,
    tokens: &[u32],
    seq_len: usize,
    pos_offset: usize,
) -> Vec<f64> {
    let mut x = vec![0.0; tokens.len() * d];
    for (r, &t) in tokens.iter().enumerate() {
        let pos = pos_offset + r % seq_len;
        for j in 0..d {
            x[r * d + j] =
                table[t as usize * d + j] * (d as f64).sqrt() + naive_position(pos, j, d);
        }
    }
    x
}

/// What [`naive_label_smoothed`] computes.
pub struct NaiveLoss {
    pub loss_sum: f64,
    pub nll_sum: f64,
    pub n_tokens: usize,
    pub log_probs: Vec<f64>,
    pub grad: Vec<f64>,
}

/// Label-smoothed cross-entropy the long way: `q = (1 − ε)·onehot(y) + ε/V`,
/// `loss = −Σ_v q_v log p_v`, `∂loss/∂z = p − q`; rows whose target is `pad` are skipped
/// (zero log-probabilities and gradient there).
pub fn naive_label_smoothed(
    logits: &[f64],
    targets: &[u32],
    vocab: usize,
    eps: f64,
    pad: u32,
) -> NaiveLoss {
    let mut out = NaiveLoss {
        loss_sum: 0.0,
        nll_sum: 0.0,
        n_tokens: 0,
        log_probs: vec![0.0; logits.len()],
        grad: vec![0.0; logits.len()],
    };
    for (r, &y) in targets.iter().enumerate() {
        if y == pad {
            continue;
        }
        let z = &logits[r * vocab..(r + 1) * vocab];
        let max = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut total = 0.0;
        for &v in z {
            total += (v - max).exp();
        }
        let log_z = max + total.ln();
        for (v, &zv) in z.iter().enumerate() {
            let logp = zv - log_z;
            let q = if v == y as usize { 1.0 - eps } else { 0.0 } + eps / vocab as f64;
            out.log_probs[r * vocab + v] = logp;
            out.loss_sum -= q * logp;
            out.grad[r * vocab + v] = logp.exp() - q;
        }
        out.nll_sum -= z[y as usize] - log_z;
        out.n_tokens += 1;
    }
    out
}

/// `n` short sentence pairs of ids 4..24 (lengths 3-7 and 2-5): the toy corpus of the
/// training-loop tests.
pub fn toy_examples(n: u32) -> Vec<Example> {
    (0..n)
        .map(|i| Example {
            src: (0..(3 + i % 5)).map(|j| 4 + (i * 7 + j) % 20).collect(),
            tgt: (0..(2 + i % 4)).map(|j| 4 + (i * 3 + j * 5) % 20).collect(),
        })
        .collect()
}
