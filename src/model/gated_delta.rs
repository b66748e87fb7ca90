//! Gated DeltaNet (Yang, Kautz & Hatamizadeh 2024), the linear-attention layer of Qwen3-Next
//! and Qwen3.5's hybrid stacks: a fixed-size state per sequence instead of a KV cache. For the
//! input rows `x [tokens, d_model]`, as transformers' `Qwen3_5GatedDeltaNet` computes it:
//!
//! ```text
//! [q; k; v] = silu(conv_K(x W_qkvᵀ))        causal depthwise convolution of K taps per channel
//! z = x W_zᵀ                                 the output gate  [tokens, value_heads · d_v]
//! β = σ(x W_bᵀ)                              write strength   [tokens, value_heads]
//! g = −exp(A_log) · softplus(x W_aᵀ + dt_bias)   log-decay (≤ 0) [tokens, value_heads]
//! q ← q / √(‖q‖² + 10⁻⁶) / √d_k,  k ← k / √(‖k‖² + 10⁻⁶)      per head
//! S_t = exp(g_t) S_{t−1} + β_t k_t (v_t − exp(g_t) S_{t−1}ᵀ k_t)ᵀ,  o_t = S_tᵀ q_t   per value head
//! y = (w ⊙ o / √(mean(o²) + ε) ⊙ silu(z)) W_outᵀ            gated RMSNorm per value head
//! ```
//!
//! (value head `h` reads query/key head `h / (value_heads / key_heads)`). The rule itself, its
//! recurrent and chunked forms, and the convolution's window are `kernels::gated_delta`,
//! reached through the backend: a prompt of several positions a row goes through the chunked
//! form ([`CHUNK`] positions at a time), a decoding step through the recurrent one. The state
//! per row — the convolution's last `K − 1` inputs and `S [d_k, d_v]` per value head — lives in
//! the layer's [`KvCache`] ([`KvCache::delta_state`]), which counts the positions fed.
//!
//! Inference only: the layer has no backward (training a hybrid is refused by name).
//! Parameters (transformers' names): `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`,
//! `conv1d.weight [conv_dim, K]`, `dt_bias`, `A_log`, `norm.weight [d_v]`, `out_proj`.

use super::kv_cache::KvCache;
use super::linear::Linear;
use super::norm::RmsNorm;
use super::param::{Init, Module, Param, ParamVisitor};
use super::step_layout::{runs, Feed, StepLayout};
use crate::backend::{Backend, DeltaShape, DeltaState, CPU};
use crate::Float;

/// Positions per chunk of the chunked form (transformers' default).
pub const CHUNK: usize = 64;

/// The ε of the query and key L2 norms (the FLA library's and transformers').
const L2_EPS: f64 = 1e-6;

/// One Gated DeltaNet layer (see the module docs).
#[derive(Clone, Debug)]
pub struct GatedDeltaNet<T> {
    /// `W_qkv [2·key_heads·d_k + value_heads·d_v, d_model]`
    pub in_proj_qkv: Linear<T>,
    /// `W_z [value_heads·d_v, d_model]`
    pub in_proj_z: Linear<T>,
    /// `W_b [value_heads, d_model]`
    pub in_proj_b: Linear<T>,
    /// `W_a [value_heads, d_model]`
    pub in_proj_a: Linear<T>,
    /// The convolution's taps `[conv_dim, K]`, oldest input first.
    pub conv: Param<T>,
    /// `dt_bias [value_heads]`
    pub dt_bias: Param<T>,
    /// `A_log [value_heads]`
    pub a_log: Param<T>,
    /// The gated RMSNorm's gain `w [d_v]` (applied as stored: no offset), shared by the heads.
    pub norm: RmsNorm<T>,
    /// `W_out [d_model, value_heads·d_v]`
    pub out_proj: Linear<T>,
    pub shape: DeltaShape,
    pub d_model: usize,
}

impl<T: Float> GatedDeltaNet<T> {
    /// A layer of `shape` over `d_model`, the norm's ε `eps`; parameters drawn from `init` in
    /// the order of the module docs (`dt_bias` 1, `A_log` 0: a decay of `−softplus`).
    pub fn new(d_model: usize, shape: DeltaShape, eps: f64, init: &mut impl Init) -> Self {
        let (nv, dv) = (shape.value_heads, shape.d_value);
        let conv_dim = shape.conv_dim();
        let k = shape.conv_kernel;
        GatedDeltaNet {
            in_proj_qkv: Linear::with_bias(d_model, conv_dim, false, init),
            in_proj_z: Linear::with_bias(d_model, nv * dv, false, init),
            in_proj_b: Linear::with_bias(d_model, nv, false, init),
            in_proj_a: Linear::with_bias(d_model, nv, false, init),
            conv: init.xavier(&[conv_dim, k], k, k),
            dt_bias: init.constant(&[nv], 1.0),
            a_log: init.constant(&[nv], 0.0),
            norm: RmsNorm::new(dv, eps, init),
            out_proj: Linear::with_bias(nv * dv, d_model, false, init),
            shape,
            d_model,
        }
    }

    /// Empty states for `rows` rows.
    fn empty_state(&self, rows: usize) -> DeltaState<T> {
        DeltaState::new(rows, self.shape)
    }

    /// `x [batch·len, d_model]`, `batch` sequences from their first position → `[batch·len,
    /// d_model]` (fresh states; the chunked form over each sequence).
    pub fn forward(&self, x: &[T], batch: usize) -> Vec<T> {
        let len = x.len().checked_div(batch * self.d_model).unwrap_or(0);
        let mut state = self.empty_state(batch);
        let spans: Vec<(usize, usize, usize)> = (0..batch).map(|b| (b, b * len, len)).collect();
        self.mix(x, &mut state, &spans)
    }

    /// Incremental: the new positions `x [tokens, d_model]` laid out as `layout` says go
    /// through the rows' states in `cache` (which counts them); returns the rows the layout's
    /// outputs ask for, as [`MultiHeadAttention::step`](super::attention::MultiHeadAttention::step)
    /// does (a uniform feed with [`Outputs::Last`](super::step_layout::Outputs::Last) and several
    /// tokens a row: each row's last).
    pub fn step(&self, x: &[T], cache: &mut KvCache<T>, layout: &StepLayout<'_>) -> Vec<T> {
        let d = self.d_model;
        // spans: (row, first token, tokens), each row's tokens in order.
        let (spans, rows): (Vec<(usize, usize, usize)>, Vec<usize>) = match layout.feed {
            Feed::Ragged { rows, positions } => {
                for (s, _) in runs(rows, positions) {
                    assert_eq!(
                        positions[s],
                        cache.row_len(rows[s]),
                        "tokens continue their row"
                    );
                }
                let spans = runs(rows, positions)
                    .into_iter()
                    .map(|(s, n)| (rows[s], s, n))
                    .collect();
                (spans, rows.to_vec())
            }
            Feed::OnePerRow => {
                let rows: Vec<usize> = (0..cache.batch).collect();
                (rows.iter().map(|&b| (b, b, 1)).collect(), rows)
            }
            Feed::Uniform => {
                let batch = cache.batch;
                let q_len = x.len().checked_div(batch * d).unwrap_or(0);
                assert_eq!(
                    x.len(),
                    batch * q_len * d,
                    "query rows are not a whole number per row"
                );
                let spans = (0..batch).map(|b| (b, b * q_len, q_len)).collect();
                let rows = (0..batch)
                    .flat_map(|b| std::iter::repeat_n(b, q_len))
                    .collect();
                (spans, rows)
            }
        };
        let state = cache.delta_state(|rows| DeltaState::new(rows, self.shape));
        let y = self.mix(x, state, &spans);
        cache.advance_ragged(&rows);
        match layout.feed {
            Feed::Uniform if !spans.is_empty() && layout.last_of_several(spans[0].2) => {
                super::residual::last_rows(&y, spans[0].2, d)
            }
            _ => y,
        }
    }

    /// The layer over `x [tokens, d_model]`: span `(b, s, n)` is tokens `s .. s + n`, the next
    /// `n` positions of row `b` of `state`. Returns `[tokens, d_model]`.
    fn mix(&self, x: &[T], state: &mut DeltaState<T>, spans: &[(usize, usize, usize)]) -> Vec<T> {
        let sh = self.shape;
        let (nv, dk, dv) = (sh.value_heads, sh.d_key, sh.d_value);
        let (wk, wv, c_dim) = (sh.key_heads * dk, nv * dv, sh.conv_dim());
        let tokens = x.len() / self.d_model;
        // mixed: [tokens, conv_dim], z: [tokens, value_heads·d_v], b, a: [tokens, value_heads]
        let mixed = self.in_proj_qkv.forward(x);
        let z = self.in_proj_z.forward(x);
        let beta: Vec<T> = self.in_proj_b.forward(x).into_iter().map(sigmoid).collect();
        let g = self.log_decay(&self.in_proj_a.forward(x));
        // qkv: [tokens, conv_dim], the convolution's outputs.
        let mut qkv = vec![T::zero(); tokens * c_dim];
        let taps = &self.conv.value.data;
        for &(b, s, n) in spans {
            for t in s..s + n {
                let (x_t, y_t) = (&mixed[t * c_dim..][..c_dim], &mut qkv[t * c_dim..][..c_dim]);
                CPU.gated_delta_convolve(state, b, taps, x_t, y_t);
            }
        }
        // q, k: [tokens, key_heads·d_k] normalised (q scaled); v: [tokens, value_heads·d_v].
        let mut q = Vec::with_capacity(tokens * wk);
        let mut k = Vec::with_capacity(tokens * wk);
        let mut v = Vec::with_capacity(tokens * wv);
        for row in qkv.chunks(c_dim) {
            q.extend_from_slice(&row[..wk]);
            k.extend_from_slice(&row[wk..2 * wk]);
            v.extend_from_slice(&row[2 * wk..]);
        }
        l2_normalise(&mut q, dk, 1.0 / (dk as f64).sqrt());
        l2_normalise(&mut k, dk, 1.0);
        // o: [tokens, value_heads·d_v]
        let mut o = vec![T::zero(); tokens * wv];
        for &(b, s, n) in spans {
            let qkv = (
                &q[s * wk..(s + n) * wk],
                &k[s * wk..(s + n) * wk],
                &v[s * wv..(s + n) * wv],
            );
            let gates = (&g[s * nv..(s + n) * nv], &beta[s * nv..(s + n) * nv]);
            let out = &mut o[s * wv..(s + n) * wv];
            match n {
                1 => CPU.gated_delta_step(state, b, qkv, gates, out),
                _ => CPU.gated_delta_chunk(state, b, qkv, gates, out, CHUNK),
            }
        }
        // The gated RMSNorm per value head: w ⊙ o / rms(o) ⊙ silu(z).
        let (mut normed, _) = self.norm.forward(&o);
        normed
            .iter_mut()
            .zip(&z)
            .for_each(|(y, &zi)| *y *= zi * sigmoid(zi));
        self.out_proj.forward(&normed)
    }

    /// `g = −exp(A_log) · softplus(a + dt_bias)` of `a [tokens, value_heads]` (softplus as
    /// torch's: `x` itself above 20).
    fn log_decay(&self, a: &[T]) -> Vec<T> {
        let nv = self.shape.value_heads;
        let (a_log, dt_bias) = (&self.a_log.value.data, &self.dt_bias.value.data);
        a.iter()
            .enumerate()
            .map(|(i, &ai)| {
                let x = ai + dt_bias[i % nv];
                let softplus = if x.f64() > 20.0 { x } else { x.exp().ln_1p() };
                -(a_log[i % nv].exp()) * softplus
            })
            .collect()
    }
}

/// `σ(x) = 1 / (1 + e^{−x})`.
fn sigmoid<T: Float>(x: T) -> T {
    T::one() / (T::one() + (-x).exp())
}

/// Each `d`-wide head of `x` divided by `√(‖x_h‖² + 10⁻⁶)`, times `scale`.
fn l2_normalise<T: Float>(x: &mut [T], d: usize, scale: f64) {
    for head in x.chunks_mut(d) {
        let sum = head.iter().fold(T::zero(), |acc, &a| acc + a * a);
        let f = (sum + T::of(L2_EPS)).sqrt().recip() * T::of(scale);
        head.iter_mut().for_each(|a| *a *= f);
    }
}

impl<T> Module<T> for GatedDeltaNet<T> {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>) {
        v.module("in_proj_qkv", &mut self.in_proj_qkv);
        v.module("in_proj_z", &mut self.in_proj_z);
        v.module("in_proj_b", &mut self.in_proj_b);
        v.module("in_proj_a", &mut self.in_proj_a);
        v.param("conv1d.weight", &mut self.conv);
        v.param("dt_bias", &mut self.dt_bias);
        v.param("A_log", &mut self.a_log);
        v.module("norm", &mut self.norm);
        v.module("out_proj", &mut self.out_proj);
    }
}
