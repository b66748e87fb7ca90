//! The AVX2 (+ FMA, F16C) kernel of [`KQuantMatrix`]: the portable kernel's steps (the same
//! unpacking and the same f32 steps per block, compiled with AVX2), with the integer sum of
//! each block in 256-bit vectors:
//!
//! ```text
//! super-block:  Σ_g sc_g Σ_{j∈g} q_j p_j = Σ_g sc_g Σ_{j∈g} (q_j + c) p_j − c Σ_g sc_g bsums_g
//!               (q_j + c) ∈ [0, 63] the unsigned operand of vpmaddubsw (pairs -> i16, at most
//!               2 · 63 · 128), then vpmaddwd by the groups' scales (-> i32)
//! 32-block:     Σ_j q_j p_j = Σ_j |q_j| sign(p_j, q_j)   (vpmaddubsw, pairs at most 2 · 128 · 127;
//!               Q5_1's q_j ∈ [0, 31] unsigned as they are), the 32 values unpacked from the
//!               stored bytes in registers as llama.cpp's AVX2 `ggml_vec_dot_q5_0_q8_0` does:
//!               nibbles [low 16 | high 16], fifth bits spread to bytes (`bytes_from_bits_32`),
//!               IQ4_NL's levels looked up with vpshufb
//! ```
//!
//! The sums are exact in i32, so the results are the portable kernel's bit for bit.

use super::{block_sum, GgmlType, KQuantActs, KQuantMatrix, IQ4_NL_LEVELS, QK_K};
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
    let ty = w.ty;
    let values = w.block == QK_K;
    w.tile_with(acts, o, r0, out, values, |u, block, p, bsums| {
        match p.len() {
            QK_K => {
                let p: &[i8; QK_K] = p.try_into().expect("a super-block of activations");
                // SAFETY: the caller has AVX2; the unpacked K-quant values plus this type's
                // offset are in [0, 63].
                let shifted = unsafe { scaled_sum(&u.q, offset, &u.scale, p) };
                let taken: i32 = u.scale.iter().zip(bsums).map(|(&s, &b)| s * b).sum();
                shifted - i32::from(offset) * taken
            }
            32 => {
                let p: &[i8; 32] = p.try_into().expect("a block of 32 activations");
                // SAFETY: the caller has AVX2 (`block` is sliced with bounds checks).
                unsafe { stored_32_sum(ty, block, p) }
            }
            _ => block_sum(u, p),
        }
    })
}

/// `Σ_j q_j p_j` of one stored `Q5_0`, `Q5_1` or `IQ4_NL` block against 32 activations.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
unsafe fn stored_32_sum(ty: GgmlType, block: &[u8], p: &[i8; 32]) -> i32 {
    // SAFETY: 32 bytes (the array type).
    let pv = unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) };
    let (qh, qs) = match ty {
        GgmlType::Q5_0 => (&block[2..6], &block[6..22]),
        GgmlType::Q5_1 => (&block[4..8], &block[8..24]),
        _ => (&block[..0], &block[2..18]),
    };
    let qs: &[u8; 16] = qs.try_into().expect("16 bytes of nibbles");
    let nibbles = nibbles_32(qs);
    let signed = match ty {
        GgmlType::Q5_1 => {
            // q = nibble + 16 h, in [0, 31]: unsigned as it is.
            let q = _mm256_or_si256(
                nibbles,
                _mm256_and_si256(high_bits(qh), _mm256_set1_epi8(16)),
            );
            return hsum(_mm256_madd_epi16(
                _mm256_maddubs_epi16(q, pv),
                _mm256_set1_epi16(1),
            ));
        }
        // q = nibble + 16 h − 16: the nibble with 0xF0 above it where h = 0.
        GgmlType::Q5_0 => _mm256_or_si256(
            nibbles,
            _mm256_andnot_si256(high_bits(qh), _mm256_set1_epi8(-16)),
        ),
        _ => {
            // SAFETY: 16 bytes (the array type).
            let levels = unsafe { _mm_loadu_si128(IQ4_NL_LEVELS.as_ptr() as *const __m128i) };
            _mm256_shuffle_epi8(_mm256_set_m128i(levels, levels), nibbles)
        }
    };
    let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(signed), _mm256_sign_epi8(pv, signed));
    hsum(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

/// The 32 nibbles of 16 bytes: `[low nibbles | high nibbles]`, elements 0–31 in order.
#[inline]
#[target_feature(enable = "avx2")]
fn nibbles_32(qs: &[u8; 16]) -> __m256i {
    // SAFETY: 16 bytes (the array type).
    let raw = unsafe { _mm_loadu_si128(qs.as_ptr() as *const __m128i) };
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(raw), raw);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
}

/// Byte `j` is 0xFF where bit `j` of the little-endian u32 `qh` (4 bytes) is set, else 0
/// (llama.cpp's `bytes_from_bits_32`).
#[inline]
#[target_feature(enable = "avx2")]
fn high_bits(qh: &[u8]) -> __m256i {
    let bits = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]) as i32;
    // Byte j takes byte j / 8 of qh, then every bit but bit j % 8 is set.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1))
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
