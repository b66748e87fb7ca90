//! The plain attention kernel: multi-head scaled dot-product attention,
//! `softmax(Q Kᵀ / √d_k) V`, over all heads of a batch, as matrix products. The scores may have
//! their own scale and a soft cap (`super::scores`): `softmax(c · tanh(Q Kᵀ · scale / c)) V`, and
//! a bias of their key ranges (`super::key_ranges`: T5's relative positions) added before the
//! softmax. The bias is a constant of the call: the backward passes no gradient to it.
//!
//! This is the plain path: the [query x key] probabilities are kept for the backward (and for
//! attention maps). Activations are row-major `[batch * len, heads * d_head]`; head `h` is the
//! column block `h*d_head .. (h+1)*d_head`, read through strided views without copies.
//!
//! Grouped-query attention (GQA, Ainslie et al. 2023; multi-query attention when
//! `kv_heads == 1`): keys and values have `kv_heads` heads, `[batch * len, kv_heads * d_head]`,
//! and query head `h` reads key/value head `h / (heads / kv_heads)`. With `kv_heads == heads`
//! this is plain multi-head attention, computed exactly as before.

use super::activations::mul_inplace;
use super::attention::AttnDims;
use super::key_ranges::{add_bias, clip, hide_holes, KeyRanges};
use super::matmul::{matmul, MatMut, MatRef};
use super::sinks::softmax_with_sink;
use super::softmax::{softmax_backward_inplace, softmax_inplace};
use crate::Float;
use rayon::prelude::*;

/// Forward. Writes `ctx [batch*q_len, d_model]` and `probs [batch, heads, q_len, k_len]` from
/// `q [batch*q_len, d_model]` and `k`, `v` `[batch*kv_stride, d_kv]`.
///
/// Attention dropout: with `drop` (a mask laid out like `probs`, each factor 0 or 1/(1 − p), see
/// `kernels::dropout`), the context is `(P ⊙ M) V`; `probs` still receives the undropped `P`,
/// which the backward needs for the softmax. Query `i` of batch element `b` sees the keys
/// `ranges.range(b, i)` (clipped to `k_len`) but its holes ([`KeyRanges::sees`]); the others get
/// weight exactly 0 (so the backward needs no mask: a zero weight passes no gradient).
#[allow(clippy::too_many_arguments)]
pub fn attention_forward<T: Float>(
    ctx: &mut [T],
    probs: &mut [T],
    q: &[T],
    k: &[T],
    v: &[T],
    dims: AttnDims,
    ranges: impl KeyRanges,
    drop: Option<&[T]>,
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
    assert_eq!(probs.len(), dims.batch * heads * q_len * k_len);
    if let Some(m) = drop {
        assert_eq!(m.len(), probs.len(), "attention dropout mask shape");
    }
    ctx.par_chunks_mut(q_len * d_model)
        .zip(probs.par_chunks_mut(heads * q_len * k_len))
        .enumerate()
        .for_each(|(b, (ctx_b, probs_b))| {
            let q_off = b * q_len * d_model;
            let kv_off = b * kv_stride * d_kv;
            // P ⊙ M of one head [q_len, k_len], when dropping
            let mut dropped = vec![T::zero(); if drop.is_some() { q_len * k_len } else { 0 }];
            for h in 0..heads {
                let p = &mut probs_b[h * q_len * k_len..(h + 1) * q_len * k_len];
                let q_h = MatRef::strided(q, q_off + h * d_head, q_len, d_head, d_model, 1);
                let kv_h = kv_off + (h / group) * d_head;
                let k_h = MatRef::strided(k, kv_h, k_len, d_head, d_kv, 1);
                let v_h = MatRef::strided(v, kv_h, k_len, d_head, d_kv, 1);
                // scores [q_len, k_len] = Q_h K_hᵀ / √d_k (capped when the scores are)
                matmul(MatMut::new(p, q_len, k_len), q_h, k_h.t(), scale, false);
                for (i, row) in p.chunks_exact_mut(k_len).enumerate() {
                    let seen = clip(ranges.range(b, i), k_len);
                    row[..seen.start].fill(T::zero());
                    dims.scores.cap(&mut row[seen.clone()]);
                    add_bias(&ranges, (h, b, i), seen.start, &mut row[seen.clone()]);
                    hide_holes(&ranges, b, i, seen.start, &mut row[seen.clone()]);
                    row[seen.end..].fill(T::zero());
                    softmax_with_sink(&ranges, h, &mut row[seen.clone()], |r| {
                        softmax_inplace(r, seen.len())
                    });
                }
                let p: &[T] = match drop {
                    Some(m) => {
                        let m_off = (b * heads + h) * q_len * k_len;
                        mul_into(&mut dropped, p, &m[m_off..m_off + q_len * k_len]);
                        &dropped
                    }
                    None => p,
                };
                // context [q_len, d_head] = P V_h (or (P ⊙ M) V_h), into head h's column block
                let c_h = MatMut::strided(ctx_b, h * d_head, q_len, d_head, d_model, 1);
                matmul(c_h, MatRef::new(p, q_len, k_len), v_h, T::one(), false);
            }
        });
}

/// Backward. Given `dctx`, writes `dq [batch*q_len, d_model]` and `dk`, `dv`
/// `[batch*k_len, d_kv]` (the forward's key buffers must have had `kv_stride == k_len`); a
/// key/value head's gradients sum the contributions of the query heads of its group.
/// `drop` is the forward's attention-dropout mask: `dV = (P ⊙ M)ᵀ dC` and `dP = M ⊙ (dC Vᵀ)`.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward<T: Float>(
    dq: &mut [T],
    dk: &mut [T],
    dv: &mut [T],
    dctx: &[T],
    q: &[T],
    k: &[T],
    v: &[T],
    probs: &[T],
    dims: AttnDims,
    drop: Option<&[T]>,
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
    // One task per batch element: it alone writes that element's dK and dV rows, so the query
    // heads of a group add into their key/value head in a fixed order.
    dq.par_chunks_mut(q_len * d_model)
        .zip(dk.par_chunks_mut(k_len * d_kv))
        .zip(dv.par_chunks_mut(k_len * d_kv))
        .enumerate()
        .for_each(|(b, ((dq_b, dk_b), dv_b))| {
            let q_off = b * q_len * d_model;
            let kv_off = b * k_len * d_kv;
            let mut ds = vec![T::zero(); q_len * k_len];
            // capped scores: the recomputed S of one head, whose cap's derivative dS passes
            let mut capped = vec![
                T::zero();
                if dims.scores.capped() {
                    q_len * k_len
                } else {
                    0
                }
            ];
            let mut dropped = vec![T::zero(); if drop.is_some() { q_len * k_len } else { 0 }];
            for h in 0..heads {
                let p_off = (b * heads + h) * q_len * k_len;
                let p_rows = &probs[p_off..p_off + q_len * k_len];
                let m_rows = drop.map(|m| &m[p_off..p_off + q_len * k_len]);
                // the weights the forward multiplied V with: P or P ⊙ M
                let p = match m_rows {
                    Some(m) => {
                        mul_into(&mut dropped, p_rows, m);
                        MatRef::new(&dropped, q_len, k_len)
                    }
                    None => MatRef::new(p_rows, q_len, k_len),
                };
                // key/value head g, which the first query head of its group overwrites and
                // the others add to
                let (g, add) = (h / group, h % group != 0);
                let q_h = MatRef::strided(q, q_off + h * d_head, q_len, d_head, d_model, 1);
                let k_h = MatRef::strided(k, kv_off + g * d_head, k_len, d_head, d_kv, 1);
                let v_h = MatRef::strided(v, kv_off + g * d_head, k_len, d_head, d_kv, 1);
                let dc_h = MatRef::strided(dctx, q_off + h * d_head, q_len, d_head, d_model, 1);
                // dV_g [k_len, d_head] (+)= Pᵀ dC_h
                let dv_g = MatMut::strided(dv_b, g * d_head, k_len, d_head, d_kv, 1);
                matmul(dv_g, p.t(), dc_h, T::one(), add);
                // dP [q_len, k_len] = dC_h V_hᵀ, then through the softmax: dS = P ⊙ (dP − rowsum)
                matmul(
                    MatMut::new(&mut ds, q_len, k_len),
                    dc_h,
                    v_h.t(),
                    T::one(),
                    false,
                );
                if let Some(m) = m_rows {
                    mul_inplace(&mut ds, m);
                }
                for (ds_row, p_row) in ds.chunks_exact_mut(k_len).zip(p_rows.chunks_exact(k_len)) {
                    softmax_backward_inplace(ds_row, p_row);
                }
                if dims.scores.capped() {
                    // through the cap: dS ⊙ (1 − (S/c)²), S recomputed (0 where P is 0 anyway)
                    let s = MatMut::new(&mut capped, q_len, k_len);
                    matmul(s, q_h, k_h.t(), scale, false);
                    dims.scores.cap(&mut capped);
                    dims.scores.cap_backward(&mut ds, &capped);
                }
                let ds_m = MatRef::new(&ds, q_len, k_len);
                // dQ_h = dS K_g / √d_k ;  dK_g (+)= dSᵀ Q_h / √d_k
                let dq_h = MatMut::strided(dq_b, h * d_head, q_len, d_head, d_model, 1);
                matmul(dq_h, ds_m, k_h, scale, false);
                let dk_g = MatMut::strided(dk_b, g * d_head, k_len, d_head, d_kv, 1);
                matmul(dk_g, ds_m.t(), q_h, scale, add);
            }
        });
}

/// `out = a ⊙ b`, elementwise.
fn mul_into<T: Float>(out: &mut [T], a: &[T], b: &[T]) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = x * y;
    }
}
