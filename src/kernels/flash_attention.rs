//! Tiled exact attention (the FlashAttention algorithm): `softmax(Q Kᵀ / √d_k) V` computed one
//! [query block x key block] tile at a time with an online softmax, so no [query x key] matrix
//! is ever held for a whole sequence.
//!
//! Forward, per query row i and key block J (FlashAttention, Dao et al. 2022, algorithm 1):
//! `s_ij = q_i·k_j / √d_k`, `m_i' = max(m_i, max_J s_ij)`,
//! `ℓ_i' = e^(m_i − m_i') ℓ_i + Σ_J e^(s_ij − m_i')`, `o_i' = e^(m_i − m_i') o_i + Σ_J e^(s_ij − m_i') v_j`;
//! at the end `o_i / ℓ_i` is the context row and `L_i = m_i + ln ℓ_i` (the log-sum-exp) is saved.
//!
//! Backward recomputes each tile's probabilities from `L`: `p_ij = e^(s_ij − L_i)`, with
//! `D_i = do_i·o_i`, `ds_ij = p_ij (do_i·v_j − D_i)`, `dV = Pᵀ dO`, `dK = dSᵀ Q / √d_k`,
//! `dQ = dS K / √d_k`. It runs as two passes so that every output block has one writer and the
//! result does not depend on the thread count: one over key blocks (dK, dV), one over query
//! blocks (dQ). Tiles that the key ranges hide completely are skipped.
//!
//! Capped scores (Gemma 2, `super::scores`): `s_ij = c · tanh(q_i·k_j · scale / c)` in both
//! passes, and the score gradients go through the cap, `ds_ij ← ds_ij · (1 − (s_ij/c)²)`, before
//! `dK` and `dQ`. A bias of the key ranges (`super::key_ranges`, T5's relative positions) is
//! added to `s_ij` after the cap in the forward and in the backward's recomputed tiles alike (the
//! cap's derivative reads the capped score before it; the bias itself gets no gradient).
//!
//! Same layouts and key ranges ([`super::key_ranges`]) as [`super::plain_attention`]: activations `[batch * len, heads * d_head]`,
//! head `h` in column block `h`; keys and values `[batch * len, kv_heads * d_head]`, query head
//! `h` reading key/value head `h / (heads / kv_heads)` (grouped-query attention). The
//! log-sum-exp is `[batch * q_len, heads]`.

use super::attention::{AttnDims, Scores};
use super::key_ranges::{add_bias, hide_holes, span, tile_cols, KeyRanges};
use super::matmul::{matmul, MatMut, MatRef};
use crate::Float;
use rayon::prelude::*;

/// Query rows per tile.
pub const BLOCK_Q: usize = 64;
/// Key rows per tile.
pub const BLOCK_K: usize = 64;

/// Forward. Writes `ctx [batch*q_len, d_model]` and `lse [batch*q_len, heads]` from
/// `q [batch*q_len, d_model]` and `k`, `v` `[batch*kv_stride, d_kv]` (rows that see no key get a
/// zero context and `lse = +∞`, so their recomputed probabilities are 0).
pub fn flash_attention_forward<T: Float>(
    ctx: &mut [T],
    lse: &mut [T],
    q: &[T],
    k: &[T],
    v: &[T],
    dims: AttnDims,
    ranges: impl KeyRanges,
) {
    let AttnDims {
        heads,
        d_head,
        q_len,
        k_len,
        kv_stride,
        ..
    } = dims;
    let (d_model, d_kv, group) = (dims.d_model(), dims.d_kv(), dims.group());
    let scale = dims.scale::<T>();
    assert_eq!(ctx.len(), dims.batch * q_len * d_model);
    assert_eq!(lse.len(), dims.batch * q_len * heads);
    ctx.par_chunks_mut(q_len * d_model)
        .zip(lse.par_chunks_mut(q_len * heads))
        .enumerate()
        .for_each(|(b, (ctx_b, lse_b))| {
            ctx_b
                .par_chunks_mut(BLOCK_Q * d_model)
                .zip(lse_b.par_chunks_mut(BLOCK_Q * heads))
                .enumerate()
                .for_each(|(qb, (ctx_blk, lse_blk))| {
                    let i0 = qb * BLOCK_Q;
                    let rows = ctx_blk.len() / d_model;
                    // The keys any row of the block sees (a causal mask: those of its last row).
                    let seen = span(&ranges, b, i0, rows, k_len);
                    let mut s = vec![T::zero(); rows * BLOCK_K];
                    let mut m = vec![T::neg_infinity(); rows];
                    let mut l = vec![T::zero(); rows];
                    let q_off = (b * q_len + i0) * d_model;
                    let kv_off = b * kv_stride * d_kv;
                    for h in 0..heads {
                        m.fill(T::neg_infinity());
                        l.fill(T::zero());
                        zero_head_rows(ctx_blk, rows, d_model, h, d_head);
                        let q_h = MatRef::strided(q, q_off + h * d_head, rows, d_head, d_model, 1);
                        for j0 in tiles(&seen) {
                            let cols = BLOCK_K.min(seen.end - j0);
                            let kv = kv_off + j0 * d_kv + (h / group) * d_head;
                            let k_j = MatRef::strided(k, kv, cols, d_head, d_kv, 1);
                            let v_j = MatRef::strided(v, kv, cols, d_head, d_kv, 1);
                            let s_blk = &mut s[..rows * cols];
                            // s [rows, cols] = Q_h K_jᵀ / √d_k
                            matmul(MatMut::new(s_blk, rows, cols), q_h, k_j.t(), scale, false);
                            for (r, s_row) in s_blk.chunks_exact_mut(cols).enumerate() {
                                let live = tile_cols(ranges.range(b, i0 + r), j0, cols);
                                s_row[..live.start].fill(T::zero());
                                let (on, hidden) = s_row[live.start..].split_at_mut(live.len());
                                hidden.iter_mut().for_each(|x| *x = T::zero());
                                dims.scores.cap(on);
                                add_bias(&ranges, (h, b, i0 + r), j0 + live.start, on);
                                hide_holes(&ranges, b, i0 + r, j0 + live.start, on);
                                let row_max = on.iter().fold(T::neg_infinity(), |a, &x| a.max(x));
                                let m_new = m[r].max(row_max);
                                if m_new == T::neg_infinity() {
                                    on.fill(T::zero()); // (holes' −∞ must not reach P V)
                                    continue; // nothing visible yet in this row
                                }
                                let mut sum = T::zero();
                                for x in on.iter_mut() {
                                    *x = (*x - m_new).exp();
                                    sum += *x;
                                }
                                // e^(m − m') rescales what was summed so far (0 the first time)
                                let decay = (m[r] - m_new).exp();
                                l[r] = l[r] * decay + sum;
                                m[r] = m_new;
                                let o = &mut ctx_blk[r * d_model + h * d_head..][..d_head];
                                o.iter_mut().for_each(|x| *x *= decay);
                            }
                            // o += P_j V_j
                            let o_h =
                                MatMut::strided(ctx_blk, h * d_head, rows, d_head, d_model, 1);
                            matmul(o_h, MatRef::new(s_blk, rows, cols), v_j, T::one(), true);
                        }
                        for r in 0..rows {
                            let o = &mut ctx_blk[r * d_model + h * d_head..][..d_head];
                            if l[r] > T::zero() {
                                let inv = T::one() / l[r];
                                o.iter_mut().for_each(|x| *x *= inv);
                                lse_blk[r * heads + h] = m[r] + l[r].ln();
                            } else {
                                o.fill(T::zero());
                                lse_blk[r * heads + h] = T::infinity();
                            }
                        }
                    }
                });
        });
}

/// The first keys of the key tiles that cover `seen`: multiples of [`BLOCK_K`] from the one
/// holding `seen.start` (0 when every range starts at 0) up to `seen.end`.
fn tiles(seen: &std::ops::Range<usize>) -> impl Iterator<Item = usize> {
    (seen.start / BLOCK_K * BLOCK_K..seen.end).step_by(BLOCK_K)
}

/// Zeroes head `h`'s column block in the first `rows` rows of `[rows, d_model]`.
fn zero_head_rows<T: Float>(buf: &mut [T], rows: usize, d_model: usize, h: usize, d_head: usize) {
    for r in 0..rows {
        buf[r * d_model + h * d_head..][..d_head].fill(T::zero());
    }
}

/// Recomputes one tile's probabilities into `s [rows, cols]`: `p = e^(s − L)` with the score
/// `s = q·k/√d_k` (capped when `scores` caps: then `capped [rows, cols]` receives the capped
/// scores, 0 where masked, for the cap's derivative; a bias of the ranges added after it), 0
/// where masked. `i0`/`j0` are the tile's first query and key rows within batch element `b`,
/// `h` the query head.
#[allow(clippy::too_many_arguments)]
fn tile_probs<T: Float>(
    s: &mut [T],
    capped: &mut [T],
    q_h: MatRef<'_, T>,
    k_j: MatRef<'_, T>,
    lse_rows: impl Fn(usize) -> T,
    (scale, scores): (T, Scores),
    ranges: &impl KeyRanges,
    (h, b): (usize, usize),
    i0: usize,
    j0: usize,
) {
    let (rows, cols) = (q_h.rows(), k_j.rows());
    matmul(MatMut::new(s, rows, cols), q_h, k_j.t(), scale, false);
    for (r, s_row) in s.chunks_exact_mut(cols).enumerate() {
        let live = tile_cols(ranges.range(b, i0 + r), j0, cols);
        let lse = lse_rows(r);
        s_row[..live.start].fill(T::zero());
        let (on, off) = s_row[live.start..].split_at_mut(live.len());
        off.iter_mut().for_each(|x| *x = T::zero());
        if scores.capped() {
            scores.cap(on);
            let c_row = &mut capped[r * cols..(r + 1) * cols];
            c_row.copy_from_slice(s_row);
        }
        let on = &mut s_row[live.clone()];
        add_bias(ranges, (h, b, i0 + r), j0 + live.start, on);
        // holes: e^(−∞ − L) = 0 (the capped copy above keeps finite scores for the cap's
        // derivative, which a zero dS multiplies)
        hide_holes(ranges, b, i0 + r, j0 + live.start, on);
        on.iter_mut().for_each(|x| *x = (*x - lse).exp());
    }
}

/// `ds ← p ⊙ (dp − D_i)` for one tile, where `dp` already holds `dO_i·v_j`.
fn tile_score_grads<T: Float>(dp: &mut [T], p: &[T], cols: usize, delta_rows: impl Fn(usize) -> T) {
    for (r, (dp_row, p_row)) in dp
        .chunks_exact_mut(cols)
        .zip(p.chunks_exact(cols))
        .enumerate()
    {
        let d = delta_rows(r);
        for (g, &pv) in dp_row.iter_mut().zip(p_row) {
            *g = pv * (*g - d);
        }
    }
}

/// Backward. Given `dctx` and the forward's `ctx` and `lse`, writes `dq [batch*q_len, d_model]`
/// and `dk`, `dv` `[batch*k_len, d_kv]` (keys must be unstrided: `kv_stride == k_len`); a
/// key/value head's gradients sum over the query heads of its group, in head order.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_backward<T: Float>(
    dq: &mut [T],
    dk: &mut [T],
    dv: &mut [T],
    dctx: &[T],
    ctx: &[T],
    lse: &[T],
    q: &[T],
    k: &[T],
    v: &[T],
    dims: AttnDims,
    ranges: impl KeyRanges,
) {
    let AttnDims {
        heads,
        d_head,
        q_len,
        k_len,
        ..
    } = dims;
    assert_eq!(dims.kv_stride, k_len, "backward needs unstrided keys");
    let (d_model, d_kv, group) = (dims.d_model(), dims.d_kv(), dims.group());
    let scale = dims.scale::<T>();
    let capping = dims.scores.capped();
    // D [batch*q_len, heads]: D_i = dO_i · O_i per head.
    let mut delta = vec![T::zero(); dims.batch * q_len * heads];
    delta
        .par_chunks_mut(heads)
        .zip(dctx.par_chunks(d_model).zip(ctx.par_chunks(d_model)))
        .for_each(|(d_row, (g, o))| {
            for (h, d) in d_row.iter_mut().enumerate() {
                let span = h * d_head..(h + 1) * d_head;
                *d = g[span.clone()]
                    .iter()
                    .zip(&o[span])
                    .map(|(&a, &b)| a * b)
                    .sum();
            }
        });
    let delta = &delta;

    // Pass 1: dK, dV, one key block per task (all key/value heads of it, so every query head of
    // a group adds into its key/value head from one task, in a fixed order), looping over the
    // query blocks that see it.
    dk.par_chunks_mut(k_len * d_kv)
        .zip(dv.par_chunks_mut(k_len * d_kv))
        .enumerate()
        .for_each(|(b, (dk_b, dv_b))| {
            dk_b.par_chunks_mut(BLOCK_K * d_kv)
                .zip(dv_b.par_chunks_mut(BLOCK_K * d_kv))
                .enumerate()
                .for_each(|(kb, (dk_blk, dv_blk))| {
                    let j0 = kb * BLOCK_K;
                    let cols = dk_blk.len() / d_kv;
                    let mut p = vec![T::zero(); BLOCK_Q * cols];
                    let mut dp = vec![T::zero(); BLOCK_Q * cols];
                    let mut capped = vec![T::zero(); if capping { BLOCK_Q * cols } else { 0 }];
                    let kv_off = (b * k_len + j0) * d_kv;
                    for g in 0..dims.kv_heads {
                        let k_j = MatRef::strided(k, kv_off + g * d_head, cols, d_head, d_kv, 1);
                        let v_j = MatRef::strided(v, kv_off + g * d_head, cols, d_head, d_kv, 1);
                        // the first tile that reaches key/value head g overwrites its gradients
                        let mut first = true;
                        for (h, i0) in (g * group..(g + 1) * group)
                            .flat_map(|h| (0..q_len).step_by(BLOCK_Q).map(move |i0| (h, i0)))
                        {
                            let rows = BLOCK_Q.min(q_len - i0);
                            let seen = span(&ranges, b, i0, rows, k_len);
                            if seen.end <= j0 || seen.start >= j0 + cols {
                                continue; // no row of this query block sees this key block
                            }
                            let row0 = b * q_len + i0;
                            let q_off = row0 * d_model + h * d_head;
                            let q_i = MatRef::strided(q, q_off, rows, d_head, d_model, 1);
                            let do_i = MatRef::strided(dctx, q_off, rows, d_head, d_model, 1);
                            let (p_t, dp_t) = (&mut p[..rows * cols], &mut dp[..rows * cols]);
                            let s_t = &mut capped[..if capping { rows * cols } else { 0 }];
                            let lse_r = |r: usize| lse[(row0 + r) * heads + h];
                            let sc = (scale, dims.scores);
                            tile_probs(p_t, s_t, q_i, k_j, lse_r, sc, &ranges, (h, b), i0, j0);
                            // dV_j += Pᵀ dO_i
                            let dv_g = MatMut::strided(dv_blk, g * d_head, cols, d_head, d_kv, 1);
                            matmul(
                                dv_g,
                                MatRef::new(p_t, rows, cols).t(),
                                do_i,
                                T::one(),
                                !first,
                            );
                            // dP = dO_i V_jᵀ, dS = P ⊙ (dP − D)
                            matmul(
                                MatMut::new(dp_t, rows, cols),
                                do_i,
                                v_j.t(),
                                T::one(),
                                false,
                            );
                            let delta_r = |r: usize| delta[(row0 + r) * heads + h];
                            tile_score_grads(dp_t, p_t, cols, delta_r);
                            dims.scores.cap_backward(dp_t, s_t);
                            // dK_j += dSᵀ Q_i / √d_k
                            let dk_g = MatMut::strided(dk_blk, g * d_head, cols, d_head, d_kv, 1);
                            matmul(dk_g, MatRef::new(dp_t, rows, cols).t(), q_i, scale, !first);
                            first = false;
                        }
                        if first {
                            // No query sees these keys: their gradients are zero.
                            zero_head_rows(dk_blk, cols, d_kv, g, d_head);
                            zero_head_rows(dv_blk, cols, d_kv, g, d_head);
                        }
                    }
                });
        });

    // Pass 2: dQ, one query block per task, looping over the key blocks it sees.
    dq.par_chunks_mut(q_len * d_model)
        .enumerate()
        .for_each(|(b, dq_b)| {
            dq_b.par_chunks_mut(BLOCK_Q * d_model)
                .enumerate()
                .for_each(|(qb, dq_blk)| {
                    let i0 = qb * BLOCK_Q;
                    let rows = dq_blk.len() / d_model;
                    let seen = span(&ranges, b, i0, rows, k_len);
                    let mut p = vec![T::zero(); rows * BLOCK_K];
                    let mut dp = vec![T::zero(); rows * BLOCK_K];
                    let mut capped = vec![T::zero(); if capping { rows * BLOCK_K } else { 0 }];
                    let row0 = b * q_len + i0;
                    for h in 0..heads {
                        let q_off = row0 * d_model + h * d_head;
                        let q_i = MatRef::strided(q, q_off, rows, d_head, d_model, 1);
                        let do_i = MatRef::strided(dctx, q_off, rows, d_head, d_model, 1);
                        zero_head_rows(dq_blk, rows, d_model, h, d_head);
                        for j0 in tiles(&seen) {
                            let cols = BLOCK_K.min(seen.end - j0);
                            let kv = (b * k_len + j0) * d_kv + (h / group) * d_head;
                            let k_j = MatRef::strided(k, kv, cols, d_head, d_kv, 1);
                            let v_j = MatRef::strided(v, kv, cols, d_head, d_kv, 1);
                            let (p_t, dp_t) = (&mut p[..rows * cols], &mut dp[..rows * cols]);
                            let s_t = &mut capped[..if capping { rows * cols } else { 0 }];
                            let lse_r = |r: usize| lse[(row0 + r) * heads + h];
                            let sc = (scale, dims.scores);
                            tile_probs(p_t, s_t, q_i, k_j, lse_r, sc, &ranges, (h, b), i0, j0);
                            matmul(
                                MatMut::new(dp_t, rows, cols),
                                do_i,
                                v_j.t(),
                                T::one(),
                                false,
                            );
                            let delta_r = |r: usize| delta[(row0 + r) * heads + h];
                            tile_score_grads(dp_t, p_t, cols, delta_r);
                            dims.scores.cap_backward(dp_t, s_t);
                            // dQ_i += dS K_j / √d_k
                            let out = MatMut::strided(dq_blk, h * d_head, rows, d_head, d_model, 1);
                            matmul(out, MatRef::new(dp_t, rows, cols), k_j, scale, true);
                        }
                    }
                });
        });
}
