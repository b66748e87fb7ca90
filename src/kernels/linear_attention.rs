//! Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"): the softmax's
//! `exp(q·k)` replaced by the kernel `φ(q)·φ(k)` with the feature map `φ(x) = elu(x) + 1`
//! (positive, so every weight is), which lets the sum over keys be taken once:
//!
//! `out_i = φ(q_i)ᵀ S_i / φ(q_i)ᵀ z_i`, `S_i = Σ_{j seen by i} φ(k_j) v_jᵀ` `[d_k, d_v]`,
//! `z_i = Σ_{j seen by i} φ(k_j)` `[d_k]`.
//!
//! It equals the quadratic form `out_i = Σ_j w_ij v_j` with `w_ij = φ(q_i)·φ(k_j) /
//! Σ_j' φ(q_i)·φ(k_j')` ([`linear_attention_weights`]): the softmax's normalisation kept,
//! its exponential gone. Query `i` of row `b` sees the keys `0 .. mask.visible(b, i)` (padding and
//! causality), a prefix growing with `i`, so `S` and `z` are running sums: O(N·d_k·d_v) time and
//! O(d_k·d_v) state per head instead of O(N²), no scale `1/√d_k` (φ is not scale-free but the
//! paper uses none). Decoding keeps only the running sums ([`LinearState`]): O(1) per token.
//!
//! Backward, with `n_i = φ(q_i)ᵀ S_i`, `m_i = φ(q_i)·z_i`, `out_i = n_i / m_i`:
//! `dn_i = dout_i / m_i`, `dm_i = −dout_i·out_i / m_i`;
//! `dφ(q_i) = S_i dn_i + z_i dm_i`;
//! `dφ(k_j) = R_j v_j + r_j`, `dv_j = R_jᵀ φ(k_j)` with the reverse running sums over the queries
//! that see key `j`: `R_j = Σ_i φ(q_i) dn_iᵀ`, `r_j = Σ_i φ(q_i) dm_i`;
//! and `dx = dφ(x) · φ'(x)`, `φ'(x) = 1` for `x > 0`, `eˣ` otherwise.
//!
//! Layouts as the other attention kernels: `q [batch * q_len, heads * d_head]`, `k`, `v`
//! `[batch * k_len, kv_heads * d_head]` (grouped-query: query head `h` reads key/value head
//! `h / (heads / kv_heads)`), `kv_stride == k_len`.

use super::attention::{AttnDims, AttnMask};
use crate::Float;
use rayon::prelude::*;

/// `φ(x) = elu(x) + 1`: `x + 1` for `x > 0`, `eˣ` otherwise.
pub fn feature<T: Float>(x: T) -> T {
    if x > T::zero() {
        x + T::one()
    } else {
        x.exp()
    }
}

/// `φ'(x)`: 1 for `x > 0`, `eˣ` otherwise.
pub fn feature_grad<T: Float>(x: T) -> T {
    if x > T::zero() {
        T::one()
    } else {
        x.exp()
    }
}

/// `φ` of each element.
fn features<T: Float>(x: &[T]) -> Vec<T> {
    x.iter().map(|&v| feature(v)).collect()
}

/// The keys query `i` of row `b` sees, `0 .. visible`, clipped to `k_len`; panics unless the
/// counts never shrink from one query to the next (what the running sums need).
fn visible_counts(mask: &AttnMask<'_>, b: usize, q_len: usize, k_len: usize) -> Vec<usize> {
    let seen: Vec<usize> = (0..q_len).map(|i| mask.visible(b, i).min(k_len)).collect();
    assert!(
        seen.windows(2).all(|w| w[0] <= w[1]),
        "linear attention needs each query to see a prefix at least as long as the one before"
    );
    seen
}

/// Forward: writes `ctx [batch * q_len, heads * d_head]`. A query that sees no key gets 0.
pub fn linear_attention_forward<T: Float>(
    ctx: &mut [T],
    q: &[T],
    k: &[T],
    v: &[T],
    dims: AttnDims,
    mask: AttnMask<'_>,
) {
    let AttnDims {
        heads,
        d_head: d,
        q_len,
        k_len,
        ..
    } = dims;
    assert_eq!(
        dims.kv_stride, k_len,
        "linear attention reads unstrided keys"
    );
    let (d_model, d_kv, group) = (dims.d_model(), dims.d_kv(), dims.group());
    assert_eq!(ctx.len(), dims.batch * q_len * d_model);
    if q_len == 0 || d_model == 0 {
        return;
    }
    ctx.par_chunks_mut(q_len * d_model)
        .enumerate()
        .for_each(|(b, ctx_b)| {
            let seen = visible_counts(&mask, b, q_len, k_len);
            let (mut s, mut z) = (vec![T::zero(); d * d], vec![T::zero(); d]);
            for h in 0..heads {
                let g = h / group;
                let key = |t: usize| (b * k_len + t) * d_kv + g * d;
                s.fill(T::zero());
                z.fill(T::zero());
                let mut t = 0;
                for (i, &end) in seen.iter().enumerate() {
                    while t < end {
                        add_outer(
                            &mut s,
                            &mut z,
                            &k[key(t)..key(t) + d],
                            &v[key(t)..key(t) + d],
                        );
                        t += 1;
                    }
                    let at = (b * q_len + i) * d_model + h * d;
                    let fq = features(&q[at..at + d]);
                    let out = &mut ctx_b[i * d_model + h * d..][..d];
                    read_out(out, &fq, &s, &z);
                }
            }
        });
}

/// `S += φ(k) vᵀ`, `z += φ(k)` (`S [d_k, d_v]`).
fn add_outer<T: Float>(s: &mut [T], z: &mut [T], k: &[T], v: &[T]) {
    let dv = v.len();
    for (a, &kx) in k.iter().enumerate() {
        let f = feature(kx);
        z[a] += f;
        for (sv, &vv) in s[a * dv..(a + 1) * dv].iter_mut().zip(v) {
            *sv += f * vv;
        }
    }
}

/// `out = φ(q)ᵀ S / φ(q)·z` (0 when no key was summed); returns the denominator.
fn read_out<T: Float>(out: &mut [T], fq: &[T], s: &[T], z: &[T]) -> T {
    let dv = out.len();
    let den: T = fq.iter().zip(z).map(|(&a, &b)| a * b).sum();
    out.fill(T::zero());
    if den <= T::zero() {
        return den;
    }
    for (a, &f) in fq.iter().enumerate() {
        for (o, &sv) in out.iter_mut().zip(&s[a * dv..(a + 1) * dv]) {
            *o += f * sv;
        }
    }
    let inv = T::one() / den;
    out.iter_mut().for_each(|o| *o *= inv);
    den
}

/// Backward: given `dctx`, writes `dq [batch * q_len, d_model]` and `dk`, `dv` `[batch * k_len,
/// d_kv]` (a key/value head's gradients summed over the query heads of its group). Recomputes
/// the running sums; memory O(q_len · d_head) per task.
#[allow(clippy::too_many_arguments)]
pub fn linear_attention_backward<T: Float>(
    dq: &mut [T],
    dk: &mut [T],
    dv: &mut [T],
    dctx: &[T],
    q: &[T],
    k: &[T],
    v: &[T],
    dims: AttnDims,
    mask: AttnMask<'_>,
) {
    let AttnDims {
        heads,
        d_head: d,
        q_len,
        k_len,
        ..
    } = dims;
    assert_eq!(dims.kv_stride, k_len, "backward needs unstrided keys");
    let (d_model, d_kv, group) = (dims.d_model(), dims.d_kv(), dims.group());
    dk.fill(T::zero());
    dv.fill(T::zero());
    if q_len == 0 || d_model == 0 {
        dq.fill(T::zero());
        return;
    }
    dq.par_chunks_mut(q_len * d_model)
        .zip(dk.par_chunks_mut(k_len * d_kv))
        .zip(dv.par_chunks_mut(k_len * d_kv))
        .enumerate()
        .for_each(|(b, ((dq_b, dk_b), dv_b))| {
            let seen = visible_counts(&mask, b, q_len, k_len);
            let (mut s, mut z) = (vec![T::zero(); d * d], vec![T::zero(); d]);
            let mut out = vec![T::zero(); d];
            // per query: dn_i [q_len, d] and dm_i [q_len]
            let (mut dn, mut dm) = (vec![T::zero(); q_len * d], vec![T::zero(); q_len]);
            for h in 0..heads {
                let g = h / group;
                let key = |t: usize| (b * k_len + t) * d_kv + g * d;
                let query = |i: usize| (b * q_len + i) * d_model + h * d;
                // Forward order: S_i, z_i again, then dφ(q_i) = S_i dn_i + z_i dm_i.
                s.fill(T::zero());
                z.fill(T::zero());
                let mut t = 0;
                for (i, &end) in seen.iter().enumerate() {
                    while t < end {
                        add_outer(
                            &mut s,
                            &mut z,
                            &k[key(t)..key(t) + d],
                            &v[key(t)..key(t) + d],
                        );
                        t += 1;
                    }
                    let (qx, g_out) = (&q[query(i)..query(i) + d], &dctx[query(i)..query(i) + d]);
                    let fq = features(qx);
                    let den = read_out(&mut out, &fq, &s, &z);
                    let dq_i = &mut dq_b[i * d_model + h * d..][..d];
                    let dn_i = &mut dn[i * d..(i + 1) * d];
                    if den <= T::zero() {
                        dq_i.fill(T::zero());
                        dn_i.fill(T::zero());
                        dm[i] = T::zero();
                        continue;
                    }
                    let inv = T::one() / den;
                    let go: T = g_out.iter().zip(&out).map(|(&a, &o)| a * o).sum();
                    dm[i] = -go * inv;
                    dn_i.iter_mut().zip(g_out).for_each(|(n, &x)| *n = x * inv);
                    for (a, dqa) in dq_i.iter_mut().enumerate() {
                        let s_dn: T = s[a * d..(a + 1) * d]
                            .iter()
                            .zip(&*dn_i)
                            .map(|(&x, &y)| x * y)
                            .sum();
                        *dqa = (s_dn + z[a] * dm[i]) * feature_grad(qx[a]);
                    }
                }
                // Reverse order: R_j, r_j over the queries that see key j.
                let (r_mat, r_vec) = (&mut s, &mut z);
                r_mat.fill(T::zero());
                r_vec.fill(T::zero());
                let mut i_next = q_len; // queries i_next.. are summed
                for j in (0..k_len).rev() {
                    while i_next > 0 && seen[i_next - 1] > j {
                        i_next -= 1;
                        let i = i_next;
                        let fq = features(&q[query(i)..query(i) + d]);
                        for (a, &f) in fq.iter().enumerate() {
                            r_vec[a] += f * dm[i];
                            for (rv, &n) in r_mat[a * d..(a + 1) * d]
                                .iter_mut()
                                .zip(&dn[i * d..(i + 1) * d])
                            {
                                *rv += f * n;
                            }
                        }
                    }
                    let (kx, vx) = (&k[key(j)..key(j) + d], &v[key(j)..key(j) + d]);
                    let at = j * d_kv + g * d;
                    let (dk_j, dv_j) = (&mut dk_b[at..at + d], &mut dv_b[at..at + d]);
                    for a in 0..d {
                        let row = &r_mat[a * d..(a + 1) * d];
                        let r_v: T = row.iter().zip(vx).map(|(&x, &y)| x * y).sum();
                        dk_j[a] += (r_v + r_vec[a]) * feature_grad(kx[a]);
                        let f = feature(kx[a]);
                        for (dvc, &x) in dv_j.iter_mut().zip(row) {
                            *dvc += x * f;
                        }
                    }
                }
            }
        });
}

/// The quadratic form's weights `[batch, heads, q_len, k_len]`: `w_ij = φ(q_i)·φ(k_j) /
/// Σ_j' φ(q_i)·φ(k_j')` over the keys query `i` sees, 0 elsewhere (attention maps of a
/// linear-attention layer; `Σ_j w_ij v_j` is [`linear_attention_forward`]'s output).
pub fn linear_attention_weights<T: Float>(
    q: &[T],
    k: &[T],
    dims: AttnDims,
    mask: AttnMask<'_>,
) -> Vec<T> {
    let AttnDims {
        batch,
        heads,
        d_head: d,
        q_len,
        k_len,
        ..
    } = dims;
    let (d_model, d_kv, group) = (dims.d_model(), dims.d_kv(), dims.group());
    let mut w = vec![T::zero(); batch * heads * q_len * k_len];
    for b in 0..batch {
        let seen = visible_counts(&mask, b, q_len, k_len);
        for h in 0..heads {
            for (i, &end) in seen.iter().enumerate() {
                let at = (b * q_len + i) * d_model + h * d;
                let fq = features(&q[at..at + d]);
                let row = &mut w[((b * heads + h) * q_len + i) * k_len..][..k_len];
                for (j, x) in row[..end].iter_mut().enumerate() {
                    let kt = (b * dims.kv_stride + j) * d_kv + (h / group) * d;
                    *x = fq
                        .iter()
                        .zip(&k[kt..kt + d])
                        .map(|(&a, &kx)| a * feature(kx))
                        .sum();
                }
                let total: T = row.iter().copied().sum();
                if total > T::zero() {
                    row.iter_mut().for_each(|x| *x /= total);
                }
            }
        }
    }
    w
}

/// The running sums of causal linear attention for incremental decoding: per row and key/value
/// head `S [d_k, d_v]` and `z [d_k]`, whatever the number of positions fed (O(1) per token).
#[derive(Clone, Debug)]
pub struct LinearState<T> {
    /// `[rows, kv_heads, d_head, d_head]`
    s: Vec<T>,
    /// `[rows, kv_heads, d_head]`
    z: Vec<T>,
    kv_heads: usize,
    d_head: usize,
}

impl<T: Float> LinearState<T> {
    /// Empty sums for `rows` rows.
    pub fn new(rows: usize, kv_heads: usize, d_head: usize) -> Self {
        LinearState {
            s: vec![T::zero(); rows * kv_heads * d_head * d_head],
            z: vec![T::zero(); rows * kv_heads * d_head],
            kv_heads,
            d_head,
        }
    }

    /// Rows held.
    pub fn rows(&self) -> usize {
        self.z.len() / (self.kv_heads * self.d_head).max(1)
    }

    /// Values held (`S` and `z` of every row): the decoding state's size, independent of the
    /// number of positions.
    pub fn len_values(&self) -> usize {
        self.s.len() + self.z.len()
    }

    /// Feeds one position of row `b`: its key and value `[kv_heads * d_head]` are summed in,
    /// then its query `[heads * d_head]` reads `out [heads * d_head]` (a causal query sees its own
    /// key).
    pub fn step(&mut self, b: usize, q: &[T], k: &[T], v: &[T], out: &mut [T]) {
        let (d, kv) = (self.d_head, self.kv_heads);
        let heads = q.len() / d;
        let group = heads / kv;
        for g in 0..kv {
            let s = &mut self.s[(b * kv + g) * d * d..][..d * d];
            let z = &mut self.z[(b * kv + g) * d..][..d];
            add_outer(s, z, &k[g * d..(g + 1) * d], &v[g * d..(g + 1) * d]);
        }
        for h in 0..heads {
            let g = h / group;
            let fq = features(&q[h * d..(h + 1) * d]);
            let s = &self.s[(b * kv + g) * d * d..][..d * d];
            let z = &self.z[(b * kv + g) * d..][..d];
            read_out(&mut out[h * d..(h + 1) * d], &fq, s, z);
        }
    }

    /// Keeps the rows `rows` in that order (beam search reordering, finished rows dropped).
    pub fn gather_rows(&mut self, rows: &[usize]) {
        let (ns, nz) = (
            self.kv_heads * self.d_head * self.d_head,
            self.kv_heads * self.d_head,
        );
        self.s = rows
            .iter()
            .flat_map(|&r| self.s[r * ns..(r + 1) * ns].to_vec())
            .collect();
        self.z = rows
            .iter()
            .flat_map(|&r| self.z[r * nz..(r + 1) * nz].to_vec())
            .collect();
    }

    /// Empty sums of the same heads for `rows` rows.
    pub fn empty_like(&self, rows: usize) -> Self {
        Self::new(rows, self.kv_heads, self.d_head)
    }

    /// Row `to` becomes a copy of row `from` of `other` (of the same heads).
    pub fn copy_row(&mut self, to: usize, other: &Self, from: usize) {
        let (ns, nz) = (
            self.kv_heads * self.d_head * self.d_head,
            self.kv_heads * self.d_head,
        );
        assert_eq!((other.kv_heads, other.d_head), (self.kv_heads, self.d_head));
        self.s[to * ns..(to + 1) * ns].copy_from_slice(&other.s[from * ns..(from + 1) * ns]);
        self.z[to * nz..(to + 1) * nz].copy_from_slice(&other.z[from * nz..(from + 1) * nz]);
    }

    /// Adds an empty row at the end; returns its index.
    pub fn add_row(&mut self) -> usize {
        let (ns, nz) = (
            self.kv_heads * self.d_head * self.d_head,
            self.kv_heads * self.d_head,
        );
        self.s.resize(self.s.len() + ns, T::zero());
        self.z.resize(self.z.len() + nz, T::zero());
        self.rows() - 1
    }
}

#[cfg(test)]
#[path = "linear_attention_tests.rs"]
mod tests;
