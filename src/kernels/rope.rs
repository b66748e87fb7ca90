//! Rotary position embedding (RoPE, Su et al. 2021, "RoFormer"), forward and backward.
//!
//! Within every head of `d_head` columns, pair `i < d_head/2` of columns `(a, b)` of a row at
//! absolute position `pos` is rotated by the angle `pos · θᵢ`, `θᵢ = base^(−2i/d_head)`:
//!
//! ```text
//! y[a] = x[a] · cos(pos·θᵢ) − x[b] · sin(pos·θᵢ)
//! y[b] = x[a] · sin(pos·θᵢ) + x[b] · cos(pos·θᵢ)
//! ```
//!
//! Pairing conventions ([`RopeStyle`]): `Interleaved` pairs adjacent columns `(2i, 2i+1)`, as in
//! the RoFormer paper, GPT-J and the original LLaMA code (the default, with base 10000);
//! `HalfSplit` pairs `(i, i + d_head/2)`, as GPT-NeoX and Hugging Face's Llama-family
//! checkpoints do (`q·cos + rotate_half(q)·sin`). The two differ only by a fixed permutation of
//! the projection's columns. Since rotations compose, `⟨R(m)q, R(n)k⟩ = ⟨q, R(n−m)k⟩`: attention
//! scores depend on relative positions only.
//!
//! Frequency scaling (long-context checkpoints): each frequency may be divided by a factor,
//! `θᵢ = base^(−2i/d_head) / fᵢ` (llama.cpp's `rope_freqs` tensor, the `freq_factors` of
//! [`rope_forward_scaled`]). Llama 3.1's factors ([`llama3_freq_factors`], transformers'
//! `_compute_llama3_parameters`): with wavelength `λᵢ = 2π / θᵢ`, original context `L`, factor
//! `s`, low/high frequency factors `l < h`,
//!
//! ```text
//! fᵢ = 1                              when λᵢ < L / h   (high frequencies kept)
//! fᵢ = s                              when λᵢ > L / l   (low frequencies slowed by s)
//! 1/fᵢ = (1 − κᵢ)/s + κᵢ,  κᵢ = (L/λᵢ − l) / (h − l)    in between (interpolated)
//! ```
//!
//! YaRN (Peng et al. 2023, transformers' `_compute_yarn_parameters`, [`yarn_freq_factors`]):
//! with `d = d_head`, factor `s`, original context `L` and rotation counts `β_fast > β_slow`,
//! the pairs are split at the dimensions that turn `β` times over `L`,
//!
//! ```text
//! dim(β) = d · ln(L / (2π β)) / (2 ln base)
//! lo = max(⌊dim(β_fast)⌋, 0),  hi = min(⌈dim(β_slow)⌉, d − 1)     (no ⌊⌋ ⌈⌉ without `truncate`)
//! ρᵢ = clamp((i − lo) / (hi − lo), 0, 1)       (hi − lo = 0.001 when lo = hi)
//! θᵢ' = θᵢ / s · ρᵢ + θᵢ · (1 − ρᵢ)             so  fᵢ = θᵢ / θᵢ' = 1 / (ρᵢ / s + 1 − ρᵢ)
//! ```
//!
//! and `cos` and `sin` are both multiplied by the attention factor `m` ([`Rope::attention_factor`],
//! default `0.1 · ln s + 1`): queries and keys are scaled by `m`, the scores by `m²`.
//!
//! The backward of an orthogonal map is its transpose, i.e. the rotation by the opposite angle
//! (with `m`: `m` times it). Angles are computed in f64 and rounded once, so f32 and f64 see
//! the same rotation. Nothing is sized by the model's context: the tables of a call cover the
//! positions it rotates.
//!
//! Activations are row-major `[batch * seq_len, heads * d_head]`; row `r` is at position
//! `pos_offset + r % seq_len`.

use crate::Float;
use rayon::prelude::*;

/// Which columns of a head form the rotated pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pair `i` is columns `(2i, 2i+1)` (RoFormer, GPT-J, the original LLaMA code).
    Interleaved,
    /// Pair `i` is columns `(i, i + d_head/2)` (GPT-NeoX, Hugging Face `rotate_half`).
    HalfSplit,
}

/// A rotary embedding: the frequencies' base, the pairing of columns and the factor of the
/// rotated values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    /// `θᵢ = base^(−2i/d_head)`: 10000 in RoFormer and Llama, 100000 in SmolLM2.
    pub base: f64,
    pub style: RopeStyle,
    /// `m`: `cos` and `sin` are multiplied by it (YaRN's attention factor); 1 otherwise.
    pub attention_factor: f64,
}

impl Default for Rope {
    /// Interleaved pairs, base 10000 (this crate's rotary models).
    fn default() -> Self {
        Rope {
            base: 10000.0,
            style: RopeStyle::Interleaved,
            attention_factor: 1.0,
        }
    }
}

impl Rope {
    /// Hugging Face's convention (`rotate_half`) with the given base.
    pub fn half_split(base: f64) -> Self {
        Rope {
            base,
            style: RopeStyle::HalfSplit,
            attention_factor: 1.0,
        }
    }

    /// `θᵢ = base^(−2i/d_head)` for `i < d_head / 2`, in f64.
    pub fn inv_freq(&self, d_head: usize) -> Vec<f64> {
        (0..d_head / 2)
            .map(|i| self.base.powf(-((2 * i) as f64) / d_head as f64))
            .collect()
    }

    /// `θᵢ = base^(−2i/d_head) / fᵢ` for `i < d_head / 2` (`freq_factors` empty: all `fᵢ = 1`).
    pub fn inv_freq_scaled(&self, d_head: usize, freq_factors: &[f64]) -> Vec<f64> {
        let mut inv_freq = self.inv_freq(d_head);
        if !freq_factors.is_empty() {
            assert_eq!(
                freq_factors.len(),
                inv_freq.len(),
                "one frequency factor per rotated pair"
            );
            for (f, &factor) in inv_freq.iter_mut().zip(freq_factors) {
                *f /= factor;
            }
        }
        inv_freq
    }
}

/// Llama 3.1's rotary scaling: the factor `s`, the low and high frequency factors `l < h`, and
/// the original context `L` (see the module's equations).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3Scaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: f64,
}

/// The per-frequency divisors `fᵢ` of Llama 3.1's scaling for `i < d_head / 2` (the module's
/// equations, as transformers' `_compute_llama3_parameters` and llama.cpp's converter compute
/// them), so that [`rope_forward_scaled`] rotates by `base^(−2i/d_head) / fᵢ`.
pub fn llama3_freq_factors(base: f64, d_head: usize, s: Llama3Scaling) -> Vec<f64> {
    let l = s.original_max_position_embeddings;
    let (low_wavelen, high_wavelen) = (l / s.low_freq_factor, l / s.high_freq_factor);
    Rope {
        base,
        ..Rope::default()
    }
    .inv_freq(d_head)
    .into_iter()
    .map(|inv_freq| {
        let wavelen = 2.0 * std::f64::consts::PI / inv_freq;
        if wavelen < high_wavelen {
            1.0
        } else if wavelen > low_wavelen {
            s.factor
        } else {
            let smooth =
                (l / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
            1.0 / ((1.0 - smooth) / s.factor + smooth)
        }
    })
    .collect()
}

/// YaRN's parameters (see the module's equations; transformers' `rope_parameters` of
/// `rope_type: "yarn"`, llama.cpp's `rope.scaling.*` keys).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct YarnScaling {
    /// `s`: how much the low frequencies are slowed (4 in Qwen2.5's 128k configs).
    pub factor: f64,
    /// `L`: the context the model was first trained with.
    pub original_max_position_embeddings: f64,
    /// `β_fast`: rotations over `L` above which a pair is kept (32).
    pub beta_fast: f64,
    /// `β_slow`: rotations over `L` below which a pair is slowed by `s` (1).
    pub beta_slow: f64,
    /// Whether the ramp's ends are rounded to whole dimensions (transformers' `truncate`,
    /// default true).
    pub truncate: bool,
}

/// The per-frequency divisors `fᵢ` of YaRN for `i < d_head / 2` (the module's equations, as
/// transformers' `_compute_yarn_parameters` computes `inv_freq`), so that
/// [`rope_forward_scaled`] rotates by `θᵢ / fᵢ`.
pub fn yarn_freq_factors(base: f64, d_head: usize, y: YarnScaling) -> Vec<f64> {
    let d = d_head as f64;
    let correction_dim = |rotations: f64| {
        d * (y.original_max_position_embeddings / (rotations * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * base.ln())
    };
    let (mut lo, mut hi) = (correction_dim(y.beta_fast), correction_dim(y.beta_slow));
    if y.truncate {
        (lo, hi) = (lo.floor(), hi.ceil());
    }
    let (lo, mut hi) = (lo.max(0.0), hi.min(d - 1.0));
    if lo == hi {
        hi += 0.001;
    }
    (0..d_head / 2)
        .map(|i| {
            // ρ: 0 keeps the frequency (extrapolation), 1 divides it by s (interpolation).
            let ramp = ((i as f64 - lo) / (hi - lo)).clamp(0.0, 1.0);
            1.0 / (ramp / y.factor + (1.0 - ramp))
        })
        .collect()
}

/// YaRN's default attention factor, `0.1 · ln s + 1` (1 for `s ≤ 1`; transformers'
/// `get_mscale`), or with `mscale` and `mscale_all_dim` both set the ratio
/// `(0.1 · mscale · ln s + 1) / (0.1 · mscale_all_dim · ln s + 1)`.
pub fn yarn_attention_factor(factor: f64, mscale: Option<f64>, mscale_all_dim: Option<f64>) -> f64 {
    let get_mscale = |m: f64| {
        if factor <= 1.0 {
            1.0
        } else {
            0.1 * m * factor.ln() + 1.0
        }
    };
    match (mscale, mscale_all_dim) {
        (Some(m), Some(all)) if m != 0.0 && all != 0.0 => get_mscale(m) / get_mscale(all),
        _ => get_mscale(1.0),
    }
}

/// `(cos, sin)` of `pos · θᵢ` for positions `pos_offset .. pos_offset + seq_len` and
/// `i < d_head / 2`: two `[seq_len, d_head / 2]` tables. Computed in f64 and kept per thread
/// for the next call with the same arguments (every layer of a forward rotates its queries and
/// keys at the same positions: one computation instead of two per layer).
fn tables<T: Float>(
    rope: Rope,
    freq_factors: &[f64],
    seq_len: usize,
    d_head: usize,
    pos_offset: usize,
) -> (Vec<T>, Vec<T>) {
    /// (base bits, attention factor bits, style, seq_len, d_head, pos_offset, factors' bits),
    /// then the cos and sin tables.
    type Key = (u64, u64, RopeStyle, usize, usize, usize, Vec<u64>);
    type Tables = (Key, Vec<f64>, Vec<f64>);
    thread_local! {
        static LAST: std::cell::RefCell<Option<Tables>> =
            const { std::cell::RefCell::new(None) };
    }
    let factor_bits = freq_factors.iter().map(|f| f.to_bits()).collect();
    let key: Key = (
        rope.base.to_bits(),
        rope.attention_factor.to_bits(),
        rope.style,
        seq_len,
        d_head,
        pos_offset,
        factor_bits,
    );
    let convert = |xs: &[f64]| xs.iter().map(|&v| T::of(v)).collect::<Vec<T>>();
    LAST.with_borrow_mut(|last| {
        if let Some((k, cos, sin)) = last.as_ref() {
            if *k == key {
                return (convert(cos), convert(sin));
            }
        }
        let half = d_head / 2;
        let inv_freq = rope.inv_freq_scaled(d_head, freq_factors);
        let m = rope.attention_factor;
        let mut cos = Vec::with_capacity(seq_len * half);
        let mut sin = Vec::with_capacity(seq_len * half);
        for s in 0..seq_len {
            let pos = (pos_offset + s) as f64;
            for &f in &inv_freq {
                let (sn, cs) = (pos * f).sin_cos();
                cos.push(m * cs);
                sin.push(m * sn);
            }
        }
        let tables = (convert(&cos), convert(&sin));
        *last = Some((key, cos, sin));
        tables
    })
}

/// Rotates in place by `+pos·θᵢ`, or by `−pos·θᵢ` when `inverse` (the backward).
#[allow(clippy::too_many_arguments)]
fn rotate<T: Float>(
    x: &mut [T],
    rope: Rope,
    freq_factors: &[f64],
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
    let (cos, sin) = tables::<T>(rope, freq_factors, seq_len, d_head, pos_offset);
    let style = rope.style;
    x.par_chunks_mut(d).enumerate().for_each(|(r, row)| {
        let s = r % seq_len;
        let (c_row, s_row) = (
            &cos[s * half..(s + 1) * half],
            &sin[s * half..(s + 1) * half],
        );
        for head in row.chunks_exact_mut(d_head) {
            match style {
                RopeStyle::Interleaved => {
                    for ((pair, &c), &sn) in head.chunks_exact_mut(2).zip(c_row).zip(s_row) {
                        let sn = if inverse { -sn } else { sn };
                        let (a, b) = (pair[0], pair[1]);
                        pair[0] = a * c - b * sn;
                        pair[1] = a * sn + b * c;
                    }
                }
                RopeStyle::HalfSplit => {
                    let (lo, hi) = head.split_at_mut(half);
                    for (((a, b), &c), &sn) in lo.iter_mut().zip(hi).zip(c_row).zip(s_row) {
                        let sn = if inverse { -sn } else { sn };
                        let (x0, x1) = (*a, *b);
                        *a = x0 * c - x1 * sn;
                        *b = x0 * sn + x1 * c;
                    }
                }
            }
        }
    });
}

/// Forward: rotates every head of `x [batch*seq_len, heads*d_head]` in place, row `r` at
/// position `pos_offset + r % seq_len` (keys of grouped-query attention: `heads = kv_heads`).
// Used outside the library only (feature `internals`).
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub fn rope_forward<T: Float>(
    x: &mut [T],
    rope: Rope,
    seq_len: usize,
    heads: usize,
    d_head: usize,
    pos_offset: usize,
) {
    rotate(x, rope, &[], seq_len, heads, d_head, pos_offset, false);
}

/// [`rope_forward`] with each frequency divided by its factor, `θᵢ = base^(−2i/d_head) / fᵢ`
/// (`freq_factors [d_head / 2]`; empty: unscaled).
pub fn rope_forward_scaled<T: Float>(
    x: &mut [T],
    rope: Rope,
    freq_factors: &[f64],
    seq_len: usize,
    heads: usize,
    (d_head, pos_offset): (usize, usize),
) {
    rotate(
        x,
        rope,
        freq_factors,
        seq_len,
        heads,
        d_head,
        pos_offset,
        false,
    );
}

/// The backward of [`rope_forward_scaled`].
pub fn rope_backward_scaled<T: Float>(
    dy: &mut [T],
    rope: Rope,
    freq_factors: &[f64],
    seq_len: usize,
    heads: usize,
    (d_head, pos_offset): (usize, usize),
) {
    rotate(
        dy,
        rope,
        freq_factors,
        seq_len,
        heads,
        d_head,
        pos_offset,
        true,
    );
}

/// Backward: turns `dy` (the gradient w.r.t. the rotated rows) into the gradient w.r.t. the
/// unrotated rows, in place, by the inverse rotation at the same positions.
// Used outside the library only (feature `internals`).
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub fn rope_backward<T: Float>(
    dy: &mut [T],
    rope: Rope,
    seq_len: usize,
    heads: usize,
    d_head: usize,
    pos_offset: usize,
) {
    rotate(dy, rope, &[], seq_len, heads, d_head, pos_offset, true);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_the_identity_and_backward_inverts_forward() {
        let x: Vec<f64> = (0..2 * 3 * 8).map(|i| (i as f64 * 0.37).sin()).collect();
        for rope in [Rope::default(), Rope::half_split(100000.0)] {
            let mut y = x.clone();
            rope_forward(&mut y, rope, 1, 2, 4, 0);
            assert_eq!(y[..8], x[..8]); // one row per sequence, all at position 0
            let mut y = x.clone();
            rope_forward(&mut y, rope, 3, 2, 4, 5);
            assert!(y.iter().zip(&x).any(|(a, b)| (a - b).abs() > 1e-3));
            rope_backward(&mut y, rope, 3, 2, 4, 5);
            for (a, b) in y.iter().zip(&x) {
                assert!((a - b).abs() < 1e-14);
            }
        }
    }
}
