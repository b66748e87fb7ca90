//! Rotary position embedding (RoPE, Su et al. 2021, "RoFormer"), forward and backward.
//!
//! Within every head of `d_head` columns, the pair of columns `(2i, 2i+1)` of a row at absolute
//! position `pos` is rotated by the angle `pos · θᵢ`, `θᵢ = 10000^(−2i/d_head)`:
//!
//! ```text
//! y[2i]   = x[2i] · cos(pos·θᵢ) − x[2i+1] · sin(pos·θᵢ)
//! y[2i+1] = x[2i] · sin(pos·θᵢ) + x[2i+1] · cos(pos·θᵢ)
//! ```
//!
//! Pairing convention: adjacent (interleaved) columns, as in the RoFormer paper, GPT-J and the
//! original LLaMA code, not GPT-NeoX's half split (`i` with `i + d_head/2`); the two differ only
//! by a fixed permutation of the projection's columns. Since rotations compose,
//! `⟨R(m)q, R(n)k⟩ = ⟨q, R(n−m)k⟩`: attention scores depend on relative positions only.
//!
//! The backward of an orthogonal map is its transpose, i.e. the rotation by the opposite angle.
//! Angles are computed in f64 and rounded once, so f32 and f64 see the same rotation.
//!
//! Activations are row-major `[batch * seq_len, heads * d_head]`; row `r` is at position
//! `pos_offset + r % seq_len`.

use crate::Float;
use rayon::prelude::*;

/// `(cos, sin)` of `pos · θᵢ` for positions `pos_offset .. pos_offset + seq_len` and
/// `i < d_head / 2`: two `[seq_len, d_head / 2]` tables.
fn tables<T: Float>(seq_len: usize, d_head: usize, pos_offset: usize) -> (Vec<T>, Vec<T>) {
    let half = d_head / 2;
    let inv_freq: Vec<f64> = (0..half)
        .map(|i| 10000f64.powf(-((2 * i) as f64) / d_head as f64))
        .collect();
    let mut cos = Vec::with_capacity(seq_len * half);
    let mut sin = Vec::with_capacity(seq_len * half);
    for s in 0..seq_len {
        let pos = (pos_offset + s) as f64;
        for &f in &inv_freq {
            let (sn, cs) = (pos * f).sin_cos();
            cos.push(T::of(cs));
            sin.push(T::of(sn));
        }
    }
    (cos, sin)
}

/// Rotates in place by `+pos·θᵢ`, or by `−pos·θᵢ` when `inverse` (the backward).
fn rotate<T: Float>(
    x: &mut [T],
    seq_len: usize,
    heads: usize,
    d_head: usize,
    pos_offset: usize,
    inverse: bool,
) {
    assert!(
        d_head.is_multiple_of(2),
        "rotary positions need an even d_head, got {d_head}"
    );
    let d = heads * d_head;
    if x.is_empty() || seq_len == 0 {
        return;
    }
    assert!(
        x.len().is_multiple_of(seq_len * d),
        "rope: {} values are not rows of [*, {seq_len}, {d}]",
        x.len()
    );
    let half = d_head / 2;
    let (cos, sin) = tables::<T>(seq_len, d_head, pos_offset);
    x.par_chunks_mut(d).enumerate().for_each(|(r, row)| {
        let s = r % seq_len;
        let (c_row, s_row) = (
            &cos[s * half..(s + 1) * half],
            &sin[s * half..(s + 1) * half],
        );
        for head in row.chunks_exact_mut(d_head) {
            for ((pair, &c), &sn) in head.chunks_exact_mut(2).zip(c_row).zip(s_row) {
                let sn = if inverse { -sn } else { sn };
                let (a, b) = (pair[0], pair[1]);
                pair[0] = a * c - b * sn;
                pair[1] = a * sn + b * c;
            }
        }
    });
}

/// Forward: rotates every head of `x [batch*seq_len, heads*d_head]` in place, row `r` at
/// position `pos_offset + r % seq_len`.
pub fn rope_forward<T: Float>(
    x: &mut [T],
    seq_len: usize,
    heads: usize,
    d_head: usize,
    pos_offset: usize,
) {
    rotate(x, seq_len, heads, d_head, pos_offset, false);
}

/// Backward: turns `dy` (the gradient w.r.t. the rotated rows) into the gradient w.r.t. the
/// unrotated rows, in place, by the inverse rotation at the same positions.
pub fn rope_backward<T: Float>(
    dy: &mut [T],
    seq_len: usize,
    heads: usize,
    d_head: usize,
    pos_offset: usize,
) {
    rotate(dy, seq_len, heads, d_head, pos_offset, true);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_the_identity_and_backward_inverts_forward() {
        let x: Vec<f64> = (0..2 * 3 * 8).map(|i| (i as f64 * 0.37).sin()).collect();
        let mut y = x.clone();
        rope_forward(&mut y, 1, 2, 4, 0);
        assert_eq!(y[..8], x[..8]); // one row per sequence, all at position 0
        let mut y = x.clone();
        rope_forward(&mut y, 3, 2, 4, 5);
        assert!(y.iter().zip(&x).any(|(a, b)| (a - b).abs() > 1e-3));
        rope_backward(&mut y, 3, 2, 4, 5);
        for (a, b) in y.iter().zip(&x) {
            assert!((a - b).abs() < 1e-14);
        }
    }
}
