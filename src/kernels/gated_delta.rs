//! The gated delta rule (Yang, Kautz & Hatamizadeh 2024, "Gated Delta Networks"; Qwen3-Next,
//! Qwen3.5): a linear-attention layer whose state per value head is a matrix `S [d_k, d_v]`
//! written by the delta rule and decayed by a gate. For one head and position `t`, with the
//! key `k_t` and query `q_t` L2-normalised (`q_t` also scaled by `1/√d_k`), `β_t ∈ (0, 1)` the
//! write strength and `g_t ≤ 0` the log-decay:
//!
//! ```text
//! S'  = exp(g_t) · S_{t−1}                    (decay)
//! δ_t = β_t · (v_t − S'ᵀ k_t)                  (what the state mispredicts for k_t)
//! S_t = S' + k_t δ_tᵀ                          (delta-rule write)
//! o_t = S_tᵀ q_t
//! ```
//!
//! That is the **recurrent** form ([`DeltaState::step`]): O(d_k·d_v) per head and position,
//! the same at every length — a decoding step. The **chunked** form ([`DeltaState::chunk`])
//! computes the same outputs and final state over `C` positions at a time with products
//! (transformers' `torch_chunk_gated_delta_rule`, the WY representation): within a chunk, with
//! `γ_i = Σ_{s≤i} g_s` the cumulative log-decay,
//!
//! ```text
//! A_ij = β_i (k_i·k_j) exp(γ_i − γ_j)   (j < i)       strictly lower triangular
//! (I + A) U = diag(β) V                              the chunk's values, corrected within it
//! (I + A) W = diag(β exp(γ)) K                       what each row reads of the old state
//! V_new = U − W S                                    corrected by the state before the chunk
//! O_i = exp(γ_i) q_iᵀ S + Σ_{j≤i} (q_i·k_j) exp(γ_i − γ_j) V_new_j
//! S  ← exp(γ_C) S + Σ_j exp(γ_C − γ_j) k_j V_new_jᵀ
//! ```
//!
//! (both triangular systems solved by forward substitution). Before the rule, each of the
//! layer's `q`, `k`, `v` channels passes a causal depthwise convolution of `K` taps and SiLU,
//! `y_t[c] = silu(Σ_{j<K} w[c, j] · x_{t−K+1+j}[c])` (zeros before the first position), whose
//! last `K − 1` inputs the state keeps ([`DeltaState::convolve`]).
//!
//! Grouped heads: value head `h` reads key/query head `h / (value_heads / key_heads)`.
//!
//! Both forms compute in float64 and keep `S` in float64 whatever the model's float: the rule
//! subtracts the state's prediction from each value, and the gated norm after it rescales
//! what is left to unit size, so a float32 state's rounding reaches the logits at about 1e-4
//! (transformers in float32 is 1.9e-4 from its own float64 on `tests/fixtures/qwen35`). The
//! state is `value_heads · d_k · d_v` values a row whatever the length, so its width costs
//! little.

use crate::Float;

/// The heads and widths of one Gated DeltaNet layer's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaShape {
    /// Query/key heads.
    pub key_heads: usize,
    /// Value heads (a multiple of `key_heads`), each with its own state.
    pub value_heads: usize,
    /// Width of a query/key head, d_k.
    pub d_key: usize,
    /// Width of a value head, d_v.
    pub d_value: usize,
    /// Taps of the short convolution, K.
    pub conv_kernel: usize,
}

impl DeltaShape {
    /// Channels of the convolution: the queries, keys and values, `2·key_heads·d_k +
    /// value_heads·d_v`.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_heads * self.d_key + self.value_heads * self.d_value
    }

    /// Values of one row's recurrent state, `value_heads · d_k · d_v`.
    fn state_len(&self) -> usize {
        self.value_heads * self.d_key * self.d_value
    }

    /// Values of one row's convolution window, `(K − 1) · conv_dim`.
    fn window_len(&self) -> usize {
        self.conv_kernel.saturating_sub(1) * self.conv_dim()
    }

    /// The key head value head `h` reads.
    fn key_head(&self, h: usize) -> usize {
        h / (self.value_heads / self.key_heads).max(1)
    }
}

/// The decoding state of one Gated DeltaNet layer: per row its convolution window and each
/// value head's `S`, whatever the number of positions fed (no keys or values are kept).
#[derive(Clone, Debug)]
pub struct DeltaState<T> {
    /// `[rows, K − 1, conv_dim]`: each row's last convolution inputs, oldest first (zeros
    /// before the first position).
    conv: Vec<T>,
    /// `[rows, value_heads, d_k, d_v]`: each head's `S`, in float64 whatever `T` (see the
    /// module docs).
    s: Vec<f64>,
    shape: DeltaShape,
}

impl<T: Float> DeltaState<T> {
    /// Empty states (zero windows, `S = 0`) for `rows` rows.
    pub fn new(rows: usize, shape: DeltaShape) -> Self {
        DeltaState {
            conv: vec![T::zero(); rows * shape.window_len()],
            s: vec![0.0; rows * shape.state_len()],
            shape,
        }
    }

    /// The heads and widths.
    pub fn shape(&self) -> DeltaShape {
        self.shape
    }

    /// Rows held.
    pub fn rows(&self) -> usize {
        self.s.len() / self.shape.state_len().max(1)
    }

    /// Values held (every row's window and states): the decoding state's size, independent of
    /// the number of positions.
    pub fn len_values(&self) -> usize {
        self.conv.len() + self.s.len()
    }

    /// Row `b`'s `S` of value head `h`, `[d_k, d_v]`.
    pub fn head_state(&self, b: usize, h: usize) -> &[f64] {
        let n = self.shape.d_key * self.shape.d_value;
        &self.s[(b * self.shape.value_heads + h) * n..][..n]
    }

    /// One position of row `b` through the short convolution: `x [conv_dim]` is appended to
    /// the row's window, `y [conv_dim] = silu(Σ_j w[c, j] · window_j[c])` over the last `K`
    /// inputs (`weight [conv_dim, K]`), and the oldest input leaves the window.
    pub fn convolve(&mut self, b: usize, weight: &[T], x: &[T], y: &mut [T]) {
        let (c_dim, k) = (self.shape.conv_dim(), self.shape.conv_kernel);
        assert_eq!(x.len(), c_dim, "x is [conv_dim]");
        assert_eq!(weight.len(), c_dim * k, "weight is [conv_dim, K]");
        let window = &mut self.conv[b * self.shape.window_len()..][..self.shape.window_len()];
        for c in 0..c_dim {
            let w = &weight[c * k..(c + 1) * k];
            let mut acc = w[k - 1] * x[c];
            for (j, &wj) in w[..k - 1].iter().enumerate() {
                acc += wj * window[j * c_dim + c];
            }
            y[c] = silu(acc);
        }
        if k > 1 {
            window.copy_within(c_dim.., 0);
            window[(k - 2) * c_dim..].copy_from_slice(x);
        }
    }

    /// The recurrent form: one position of row `b`, `q`, `k [key_heads · d_k]` (normalised,
    /// `q` scaled), `v [value_heads · d_v]`, per value head its log-decay `g` and strength
    /// `beta` `[value_heads]`; writes `out [value_heads · d_v]` (see the module docs).
    pub fn step(
        &mut self,
        b: usize,
        (q, k, v): (&[T], &[T], &[T]),
        (g, beta): (&[T], &[T]),
        out: &mut [T],
    ) {
        let sh = self.shape;
        let (dk, dv) = (sh.d_key, sh.d_value);
        let (q, k, v, g, beta) = (wide(q), wide(k), wide(v), wide(g), wide(beta));
        let mut o = vec![0.0f64; dv];
        for h in 0..sh.value_heads {
            let kh = sh.key_head(h);
            let (qh, kh) = (&q[kh * dk..(kh + 1) * dk], &k[kh * dk..(kh + 1) * dk]);
            let s = &mut self.s[(b * sh.value_heads + h) * dk * dv..][..dk * dv];
            let decay = g[h].exp();
            s.iter_mut().for_each(|x| *x *= decay);
            // δ = β (v − Sᵀ k), kept in `o` until the read-out.
            o.copy_from_slice(&v[h * dv..(h + 1) * dv]);
            for (i, &ki) in kh.iter().enumerate() {
                let row = &s[i * dv..(i + 1) * dv];
                o.iter_mut().zip(row).for_each(|(d, &sij)| *d -= sij * ki);
            }
            o.iter_mut().for_each(|d| *d *= beta[h]);
            for (i, &ki) in kh.iter().enumerate() {
                let row = &mut s[i * dv..(i + 1) * dv];
                row.iter_mut().zip(&o).for_each(|(sij, &d)| *sij += ki * d);
            }
            let read = &mut out[h * dv..(h + 1) * dv];
            for (j, r) in read.iter_mut().enumerate() {
                *r = T::of(
                    qh.iter()
                        .enumerate()
                        .map(|(i, &qi)| qi * s[i * dv + j])
                        .sum(),
                );
            }
        }
    }

    /// The chunked form: `len` positions of row `b` at once, in chunks of `chunk` positions;
    /// `q`, `k [len, key_heads · d_k]`, `v [len, value_heads · d_v]`, `g`, `beta [len,
    /// value_heads]`; writes `out [len, value_heads · d_v]`. Equal to `len` calls of
    /// [`step`](Self::step) up to rounding (see the module docs).
    pub fn chunk(
        &mut self,
        b: usize,
        (q, k, v): (&[T], &[T], &[T]),
        (g, beta): (&[T], &[T]),
        out: &mut [T],
        chunk: usize,
    ) {
        let sh = self.shape;
        let (dk, dv, nv) = (sh.d_key, sh.d_value, sh.value_heads);
        let wk = sh.key_heads * dk;
        let len = g.len() / nv;
        let chunk = chunk.max(1);
        let (q, k, v, g, beta) = (wide(q), wide(k), wide(v), wide(g), wide(beta));
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
        for h in 0..nv {
            let kh = sh.key_head(h);
            let s = &mut self.s[(b * nv + h) * dk * dv..][..dk * dv];
            let mut start = 0;
            while start < len {
                let c = chunk.min(len - start);
                let key = |i: usize| &k[(start + i) * wk + kh * dk..][..dk];
                let query = |i: usize| &q[(start + i) * wk + kh * dk..][..dk];
                let value = |i: usize| &v[(start + i) * nv * dv + h * dv..][..dv];
                let strength = |i: usize| beta[(start + i) * nv + h];
                // γ: [c], the cumulative log-decay within the chunk.
                let mut gamma = vec![0.0f64; c];
                let mut acc = 0.0;
                for (i, gi) in gamma.iter_mut().enumerate() {
                    acc += g[(start + i) * nv + h];
                    *gi = acc;
                }
                let decay_between = |i: usize, j: usize| (gamma[i] - gamma[j]).exp();
                // U: [c, d_v] and W: [c, d_k] by forward substitution of (I + A), A_ij =
                // β_i (k_i·k_j) exp(γ_i − γ_j) for j < i.
                let mut u = vec![0.0f64; c * dv];
                let mut w = vec![0.0f64; c * dk];
                for i in 0..c {
                    let (bi, ei) = (strength(i), gamma[i].exp());
                    let (ui, rest) = u[..(i + 1) * dv].split_at_mut(i * dv);
                    rest.iter_mut()
                        .zip(value(i))
                        .for_each(|(x, &vx)| *x = bi * vx);
                    let (wi, wrest) = w[..(i + 1) * dk].split_at_mut(i * dk);
                    wrest
                        .iter_mut()
                        .zip(key(i))
                        .for_each(|(x, &kx)| *x = bi * ei * kx);
                    for j in 0..i {
                        let aij = bi * dot(key(i), key(j)) * decay_between(i, j);
                        let (uj, wj) = (&ui[j * dv..(j + 1) * dv], &wi[j * dk..(j + 1) * dk]);
                        rest.iter_mut().zip(uj).for_each(|(x, &y)| *x -= aij * y);
                        wrest.iter_mut().zip(wj).for_each(|(x, &y)| *x -= aij * y);
                    }
                }
                // V_new = U − W S: [c, d_v].
                for (ui, wi) in u.chunks_mut(dv).zip(w.chunks(dk)) {
                    for (row, &wx) in s.chunks(dv).zip(wi) {
                        ui.iter_mut().zip(row).for_each(|(y, &sxy)| *y -= wx * sxy);
                    }
                }
                // O_i = exp(γ_i) q_iᵀ S + Σ_{j≤i} (q_i·k_j) exp(γ_i − γ_j) V_new_j.
                let mut o = vec![0.0f64; dv];
                for i in 0..c {
                    o.iter_mut().for_each(|x| *x = 0.0);
                    let ei = gamma[i].exp();
                    for (row, &qx) in s.chunks(dv).zip(query(i)) {
                        o.iter_mut()
                            .zip(row)
                            .for_each(|(y, &sxy)| *y += qx * ei * sxy);
                    }
                    for j in 0..=i {
                        let weight = dot(query(i), key(j)) * decay_between(i, j);
                        o.iter_mut()
                            .zip(&u[j * dv..(j + 1) * dv])
                            .for_each(|(y, &x)| *y += weight * x);
                    }
                    let at = &mut out[(start + i) * nv * dv + h * dv..][..dv];
                    at.iter_mut().zip(&o).for_each(|(y, &x)| *y = T::of(x));
                }
                // S ← exp(γ_C) S + Σ_j exp(γ_C − γ_j) k_j V_new_jᵀ.
                let decay = gamma[c - 1].exp();
                s.iter_mut().for_each(|x| *x *= decay);
                for j in 0..c {
                    let f = decay_between(c - 1, j);
                    let vj = &u[j * dv..(j + 1) * dv];
                    for (row, &kx) in s.chunks_mut(dv).zip(key(j)) {
                        row.iter_mut()
                            .zip(vj)
                            .for_each(|(sxy, &y)| *sxy += f * kx * y);
                    }
                }
                start += c;
            }
        }
    }

    /// Keeps the rows `rows` in that order (beam search reordering, finished rows dropped).
    pub fn gather_rows(&mut self, rows: &[usize]) {
        let (nw, ns) = (self.shape.window_len(), self.shape.state_len());
        self.conv = rows
            .iter()
            .flat_map(|&r| self.conv[r * nw..(r + 1) * nw].to_vec())
            .collect();
        self.s = rows
            .iter()
            .flat_map(|&r| self.s[r * ns..(r + 1) * ns].to_vec())
            .collect();
    }

    /// Empty states of the same shape for `rows` rows.
    pub fn empty_like(&self, rows: usize) -> Self {
        Self::new(rows, self.shape)
    }

    /// Row `to` becomes a copy of row `from` of `other` (of the same shape).
    pub fn copy_row(&mut self, to: usize, other: &Self, from: usize) {
        assert_eq!(other.shape, self.shape, "states of different shapes");
        let (nw, ns) = (self.shape.window_len(), self.shape.state_len());
        self.conv[to * nw..(to + 1) * nw].copy_from_slice(&other.conv[from * nw..(from + 1) * nw]);
        self.s[to * ns..(to + 1) * ns].copy_from_slice(&other.s[from * ns..(from + 1) * ns]);
    }

    /// Adds an empty row at the end; returns its index.
    pub fn add_row(&mut self) -> usize {
        let (nw, ns) = (self.shape.window_len(), self.shape.state_len());
        self.conv.resize(self.conv.len() + nw, T::zero());
        self.s.resize(self.s.len() + ns, 0.0);
        self.rows() - 1
    }
}

/// `x` in float64.
fn wide<T: Float>(x: &[T]) -> Vec<f64> {
    x.iter().map(|a| a.f64()).collect()
}

/// `x · σ(x)`.
fn silu<T: Float>(x: T) -> T {
    x / (T::one() + (-x).exp())
}

#[cfg(test)]
#[path = "gated_delta_tests.rs"]
mod tests;
