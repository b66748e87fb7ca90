//! The AVX2 (+ FMA, F16C) kernel of [`KQuantMatrix`]: the portable kernel's steps (the same
//! unpacking and the same f32 steps per block, compiled with AVX2), with the integer sum of
//! each block in 256-bit vectors:
//!
//! ```text
//! super-block:  Σ_g sc_g Σ_{j∈g} q_j p_j = Σ_g sc_g Σ_{j∈g} (q_j + c) p_j − c Σ_g sc_g bsums_g
//!               (q_j + c) ∈ [0, 63] the unsigned operand of vpmaddubsw (pairs -> i16, at most
//!               2 · 63 · 128), then vpmaddwd by the groups' scales (-> i32)
//! ```
//!
//! (The 32-blocks `Q5_0`, `Q5_1`, `IQ4_NL` have their own kernel, eight blocks a step:
//! `blocks32.rs`.)
//!
//! The sums are exact in i32, so the results are the portable kernel's bit for bit.

use super::{block_sum, KQuantActs, KQuantMatrix, QK_K};
use std::arch::x86_64::*;

/// `out[i] = w_o · x_{r0+i}` for `i < out.len()`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile(
    w: &KQuantMatrix,
    acts: &KQuantActs,
    o: usize,
    r0: usize,
    out: &mut [f32],
) {
    let offset = w.unsigned_offset();
    w.tile_with(acts, o, r0, out, |u, p, bsums| match p.len() {
        QK_K => {
            let p: &[i8; QK_K] = p.try_into().expect("a super-block of activations");
            // SAFETY: the caller has AVX2; the unpacked K-quant values plus this type's
            // offset are in [0, 63].
            let shifted = unsafe { scaled_sum(&u.q, offset, &u.scale, p) };
            let taken: i32 = u.scale.iter().zip(bsums).map(|(&s, &b)| s * b).sum();
            shifted - i32::from(offset) * taken
        }
        _ => block_sum(u, p),
    })
}

/// `Σ_g scale_g Σ_{j∈g} (q_j + offset) p_j` over one super-block (groups of 16).
///
/// # Safety
/// The CPU must have AVX2; `q_j + offset` must be in [0, 127] (the unsigned operand, so that
/// the pair sums stay below 2^15: at most 2 · 127 · 128 = 32512).
#[target_feature(enable = "avx2")]
unsafe fn scaled_sum(q: &[i8; QK_K], offset: i8, scale: &[i32; 16], p: &[i8; QK_K]) -> i32 {
    let off = _mm256_set1_epi8(offset);
    let mut acc = _mm256_setzero_si256();
    for k in 0..8 {
        // SAFETY: 32 bytes from 32k < 256 of q and p (the array types).
        let (qv, pv) = unsafe {
            (
                _mm256_loadu_si256(q.as_ptr().add(32 * k) as *const __m256i),
                _mm256_loadu_si256(p.as_ptr().add(32 * k) as *const __m256i),
            )
        };
        let pairs = _mm256_maddubs_epi16(_mm256_add_epi8(qv, off), pv);
        // Lanes 0-3 hold group 2k, lanes 4-7 group 2k+1 (scales of K-quants fit in i16).
        let sc = _mm256_set_m128i(
            _mm_set1_epi16(scale[2 * k + 1] as i16),
            _mm_set1_epi16(scale[2 * k] as i16),
        );
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, sc));
    }
    hsum(acc)
}

/// `Σ` of the 8 i32 lanes of `v`.
#[inline]
#[target_feature(enable = "avx2")]
fn hsum(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}
