//! The AVX2 row kernels of `Q4_K` and `Q6_K` (the two types of a `Q4_K_M` file), the weights
//! unpacked from the stored bytes in registers, as llama.cpp's `ggml_vec_dot_q4_K_q8_K` and
//! `_q6_K_q8_K` do, instead of through the portable kernel's [`super::Unpacked`] copy:
//!
//! ```text
//! Q4_K, per super-block (d, dmin, 12 bytes of 6-bit scales/minima, 128 bytes of nibbles):
//!     sc_s, m_s (s < 8)        the 12 bytes spread to 16 with three masks (llama.cpp's utmp)
//!     for c < 4:  nibble bytes qs[32c ..]:  low  -> elements 64c + l,       sub-block 2c
//!                                           high -> elements 64c + 32 + l,  sub-block 2c + 1
//!                 vpmaddubsw(nibbles, p) then vpmaddwd by the sub-block's scale (-> i32)
//!     I_b = Σ_s sc_s Σ_{j∈s} q_j p_j,   M_b = Σ_s m_s (bsums_2s + bsums_2s+1)
//! Q6_K, per super-block (ql 128, qh 64, 16 signed scales, d):
//!     for n < 2: ql0 = ql[64n ..], ql1 = ql[64n + 32 ..], h = qh[32n ..]
//!                u = (ql0 & 15) | (h & 3) << 4,          elements 128n + l
//!                    (ql1 & 15) | (h >> 2 & 3) << 4,     128n + 32 + l
//!                    (ql0 >> 4) | (h >> 4 & 3) << 4,     128n + 64 + l
//!                    (ql1 >> 4) | (h >> 6 & 3) << 4,     128n + 96 + l      (u in [0, 63])
//!     I_b = Σ_g sc_g Σ_{j∈g} u_j p_j − 32 Σ_g sc_g bsums_g       (q_j = u_j − 32)
//! then, block after block, the portable kernel's f32 steps (`tile_with`):
//!     y ← y + (d_b e_b) I_b;   Q4_K also  y ← y − (dmin_b e_b) M_b
//! ```
//!
//! The sums are exact in i32 (pair sums of `vpmaddubsw` at most 2 · 63 · 128 < 2^15), so the
//! results are the portable kernel's bit for bit. A block's weights are unpacked once for all
//! the activation rows of a tile (up to [`super::super::ROW_TILE`]).

use super::{half_at, KQuantActs, KQuantMatrix, QK_K};
use crate::kernels::lowp::ggml::GgmlType;
use std::arch::x86_64::*;

/// Whether this module multiplies blocks of `ty`.
pub(super) fn handles(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K)
}

/// `Q4_K`'s 8 scales and 8 minima (each in [0, 63]) from the 12 bytes at `scales`, as
/// llama.cpp spreads them: bytes 0–7 the scales, 8–15 the minima.
#[inline(always)]
fn q4_k_scales_mins(scales: &[u8]) -> [u8; 16] {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let word = |k: usize| {
        u32::from_le_bytes([
            scales[4 * k],
            scales[4 * k + 1],
            scales[4 * k + 2],
            scales[4 * k + 3],
        ])
    };
    let (w0, w1, w2) = (word(0), word(1), word(2));
    let spread = [
        w0 & KMASK1,
        (w2 & KMASK2) | (((w0 >> 6) & KMASK3) << 4),
        w1 & KMASK1,
        ((w2 >> 4) & KMASK2) | (((w1 >> 6) & KMASK3) << 4),
    ];
    let mut out = [0u8; 16];
    for (k, w) in spread.iter().enumerate() {
        out[4 * k..4 * k + 4].copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// The i16 scale vector of two groups of 16 elements: lanes 0–7 `a`, lanes 8–15 `b` (the
/// `vpmaddubsw` pairs of a 32-byte vector's two halves).
#[inline(always)]
unsafe fn two_scales(a: i32, b: i32) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(b as i16), _mm_set1_epi16(a as i16))
}

/// `Σ` of the 8 i32 lanes of `v`.
#[inline(always)]
unsafe fn hsum(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// `Σ_g sc_g bsums_g` of a `Q6_K` block (its 16 signed scales at byte 192) against the 16
/// activation sums at `bsums`: the products and their sum in i32 lanes, exact as the scalar
/// sum.
///
/// # Safety
/// AVX2; `block` is a whole `Q6_K` block, 16 readable i32 at `bsums`.
#[inline(always)]
unsafe fn q6_k_taken(block: &[u8], bsums: *const i32) -> i32 {
    // SAFETY (caller): bytes 192..208 of the block, and the 16 sums.
    unsafe {
        let sc = _mm_loadu_si128(block.as_ptr().add(192) as *const __m128i);
        let lo = _mm256_mullo_epi32(_mm256_cvtepi8_epi32(sc), _mm256_loadu_si256(bsums as *const __m256i));
        let hi = _mm256_mullo_epi32(
            _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(sc)),
            _mm256_loadu_si256(bsums.add(8) as *const __m256i),
        );
        hsum(_mm256_add_epi32(lo, hi))
    }
}

/// `Σ_s m_s (bsums_2s + bsums_2s+1)` of a `Q4_K` block's 8 minima (`scales[8..16]`) against
/// the 16 activation sums at `bsums`, in i32 lanes, exact as the scalar sum.
///
/// # Safety
/// AVX2; 16 readable i32 at `bsums`.
#[inline(always)]
unsafe fn q4_k_min_sum(scales: &[u8; 16], bsums: *const i32) -> i32 {
    // SAFETY (caller): the 16 sums; `scales` holds 16 bytes.
    unsafe {
        let (a, b) = (
            _mm256_loadu_si256(bsums as *const __m256i),
            _mm256_loadu_si256(bsums.add(8) as *const __m256i),
        );
        // [p0 p1 p4 p5 | p2 p3 p6 p7], p_s = bsums_2s + bsums_2s+1.
        let pairs = _mm256_hadd_epi32(a, b);
        let mins = _mm256_cvtepu8_epi32(_mm_loadl_epi64(scales.as_ptr().add(8) as *const __m128i));
        let mins = _mm256_permutevar8x32_epi32(mins, _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
        hsum(_mm256_mullo_epi32(mins, pairs))
    }
}

/// 32 activations at `p`.
#[inline(always)]
unsafe fn load(p: *const i8) -> __m256i {
    // SAFETY (caller): 32 readable bytes.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// `out[i] = w_o · x_{r0+i}` for `i < out.len()` (at most `ROW_TILE`), `w` of type `Q4_K` or
/// `Q6_K`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `o < w.rows`, activation rows `r0 .. r0 + out.len()`
/// exist in `acts`, which came from `w.quantize`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile(
    w: &KQuantMatrix,
    acts: &KQuantActs,
    o: usize,
    r0: usize,
    out: &mut [f32],
) {
    const R: usize = crate::kernels::lowp::ROW_TILE;
    let nb = w.cols / QK_K;
    let row = &w.data[o * nb * w.block_bytes..(o + 1) * nb * w.block_bytes];
    let n = out.len().min(R);
    out.fill(0.0);
    let q4 = w.ty == GgmlType::Q4_K;
    for (b, block) in row.chunks_exact(w.block_bytes).enumerate() {
        // Q4_K: bytes 0–7 the sub-blocks' scales, 8–15 their minima.
        let scales = if q4 {
            q4_k_scales_mins(&block[4..16])
        } else {
            [0; 16]
        };
        // Per row: the shifted integer sum, before the correction.
        let mut sums = [_mm256_setzero_si256(); R];
        // SAFETY: the caller's features; every pointer below reads inside `block` (144 or
        // 210 bytes, its layout's offsets) or inside the 256 activations of block b of an
        // activation row that exists (the caller's bounds).
        unsafe {
            let p0 = |i: usize| acts.q.as_ptr().add((r0 + i) * w.cols + b * QK_K);
            if q4 {
                let qs = block.as_ptr().add(16);
                let low = _mm256_set1_epi8(0x0f);
                for c in 0..4 {
                    let bytes = _mm256_loadu_si256(qs.add(32 * c) as *const __m256i);
                    let lo = _mm256_and_si256(bytes, low);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bytes), low);
                    let sc_lo = _mm256_set1_epi16(i16::from(scales[2 * c]));
                    let sc_hi = _mm256_set1_epi16(i16::from(scales[2 * c + 1]));
                    for (i, sum) in sums.iter_mut().enumerate().take(n) {
                        let p = p0(i).add(64 * c);
                        let a = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load(p)), sc_lo);
                        let h = _mm256_maddubs_epi16(hi, load(p.add(32)));
                        let a = _mm256_add_epi32(a, _mm256_madd_epi16(h, sc_hi));
                        *sum = _mm256_add_epi32(*sum, a);
                    }
                }
            } else {
                let (ql, qh) = (block.as_ptr(), block.as_ptr().add(128));
                let sc = |g: usize| i32::from(block[192 + g] as i8);
                let (low, two) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(3));
                for half in 0..2 {
                    let ql0 = _mm256_loadu_si256(ql.add(64 * half) as *const __m256i);
                    let ql1 = _mm256_loadu_si256(ql.add(64 * half + 32) as *const __m256i);
                    let h = _mm256_loadu_si256(qh.add(32 * half) as *const __m256i);
                    let top0 = _mm256_slli_epi16::<4>(_mm256_and_si256(h, two));
                    let h2 = _mm256_srli_epi16::<2>(h);
                    let top1 = _mm256_slli_epi16::<4>(_mm256_and_si256(h2, two));
                    let h4 = _mm256_srli_epi16::<4>(h);
                    let top2 = _mm256_slli_epi16::<4>(_mm256_and_si256(h4, two));
                    let h6 = _mm256_srli_epi16::<6>(h);
                    let top3 = _mm256_slli_epi16::<4>(_mm256_and_si256(h6, two));
                    let hi0 = _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low);
                    let hi1 = _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low);
                    let u = [
                        _mm256_or_si256(_mm256_and_si256(ql0, low), top0),
                        _mm256_or_si256(_mm256_and_si256(ql1, low), top1),
                        _mm256_or_si256(hi0, top2),
                        _mm256_or_si256(hi1, top3),
                    ];
                    for (k, uk) in u.iter().enumerate() {
                        let g = 8 * half + 2 * k;
                        let scale = two_scales(sc(g), sc(g + 1));
                        for (i, sum) in sums.iter_mut().enumerate().take(n) {
                            let p = p0(i).add(128 * half + 32 * k);
                            let pairs = _mm256_maddubs_epi16(*uk, load(p));
                            *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(pairs, scale));
                        }
                    }
                }
            }
        }
        let d = half_at(block, if q4 { 0 } else { 208 });
        for (i, y) in out.iter_mut().enumerate() {
            let r = r0 + i;
            let e = acts.e[r * nb + b];
            let g0 = (r * w.cols + b * QK_K) / 16;
            let bsums = acts.bsums[g0..g0 + 16].as_ptr();
            // SAFETY: the caller's AVX2; `bsums` points at 16 sums (a checked slice).
            let shifted = unsafe { hsum(sums[i]) };
            if q4 {
                let msum = unsafe { q4_k_min_sum(&scales, bsums) };
                *y += (d * e) * shifted as f32;
                *y -= (half_at(block, 2) * e) * msum as f32;
            } else {
                let taken = unsafe { q6_k_taken(block, bsums) };
                *y += (d * e) * (shifted - 32 * taken) as f32;
            }
        }
    }
}

/// The scale of each i16 lane of a 64-element step `k` of the AVX-512 kernel: lane `l` takes
/// scale `(32 / per) k + l / per`, `per` elements (pairs of elements: 16 for `Q4_K`'s
/// sub-blocks of 32, 8 for `Q6_K`'s groups of 16) a scale.
const fn scale_lanes(per: usize) -> [[i16; 32]; 4] {
    let mut idx = [[0i16; 32]; 4];
    let mut k = 0;
    while k < 4 {
        let mut l = 0;
        while l < 32 {
            idx[k][l] = ((32 / per) * k + l / per) as i16;
            l += 1;
        }
        k += 1;
    }
    idx
}
const Q4_K_SCALE_LANES: [[i16; 32]; 4] = scale_lanes(16);
const Q6_K_SCALE_LANES: [[i16; 32]; 4] = scale_lanes(8);

/// The AVX-512 (F, BW) form of [`tile`], 64 elements a step: each 32 stored nibble bytes of
/// `Q4_K` broadcast to both halves of a vector, the low half's low nibbles and the high
/// half's high nibbles kept (elements `64c .. 64c + 64`, in the activations' order), and
/// `Q6_K`'s `ql[64n .. 64n + 64]` whole, its two-bit tops `[h | h >> 2]` and
/// `[h >> 4 | h >> 6]`; the scales in i16 lanes by a permutation of the block's 16 (or 8)
/// scales. The same integer sums and the same f32 steps as [`tile`].
///
/// # Safety
/// The CPU must have AVX-512F/BW, AVX2, FMA and F16C; the bounds of [`tile`].
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(super) unsafe fn tile_avx512(
    w: &KQuantMatrix,
    acts: &KQuantActs,
    o: usize,
    r0: usize,
    out: &mut [f32],
) {
    const R: usize = crate::kernels::lowp::ROW_TILE;
    let nb = w.cols / QK_K;
    let row = &w.data[o * nb * w.block_bytes..(o + 1) * nb * w.block_bytes];
    let n = out.len().min(R);
    out.fill(0.0);
    let q4 = w.ty == GgmlType::Q4_K;
    let index = if q4 { &Q4_K_SCALE_LANES } else { &Q6_K_SCALE_LANES };
    for (b, block) in row.chunks_exact(w.block_bytes).enumerate() {
        let scales = if q4 {
            q4_k_scales_mins(&block[4..16])
        } else {
            [0; 16]
        };
        let mut sums = [_mm512_setzero_si512(); R];
        // SAFETY: the caller's features; the loads read inside `block` (its layout's
        // offsets) and the 256 activations of block b of rows that exist (the caller's
        // bounds); `index` and `scales` are arrays of the sizes read.
        unsafe {
            let p0 = |i: usize| acts.q.as_ptr().add((r0 + i) * w.cols + b * QK_K);
            let widened = if q4 {
                _mm256_cvtepu8_epi16(_mm_loadu_si128(scales.as_ptr() as *const __m128i))
            } else {
                _mm256_cvtepi8_epi16(_mm_loadu_si128(block.as_ptr().add(192) as *const __m128i))
            };
            let widened = _mm512_castsi256_si512(widened);
            let scale = |k: usize| {
                let idx = _mm512_loadu_si512(index[k].as_ptr() as *const __m512i);
                _mm512_permutexvar_epi16(idx, widened)
            };
            let low = _mm512_set1_epi8(0x0f);
            if q4 {
                let shift = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(4));
                let qs = block.as_ptr().add(16);
                for c in 0..4 {
                    let bytes = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                        qs.add(32 * c) as *const __m256i
                    ));
                    let u = _mm512_and_si512(_mm512_srlv_epi16(bytes, shift), low);
                    let sc = scale(c);
                    for (i, sum) in sums.iter_mut().enumerate().take(n) {
                        let p = _mm512_loadu_si512(p0(i).add(64 * c) as *const __m512i);
                        let pairs = _mm512_maddubs_epi16(u, p);
                        *sum = _mm512_add_epi32(*sum, _mm512_madd_epi16(pairs, sc));
                    }
                }
            } else {
                let (ql, qh) = (block.as_ptr(), block.as_ptr().add(128));
                let two = _mm512_set1_epi8(3);
                let shift_lo =
                    _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(2));
                let shift_hi = _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_set1_epi16(4)),
                    _mm256_set1_epi16(6),
                );
                for half in 0..2 {
                    let bytes = _mm512_loadu_si512(ql.add(64 * half) as *const __m512i);
                    let h = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                        qh.add(32 * half) as *const __m256i
                    ));
                    let top = |shift: __m512i| {
                        let bits = _mm512_and_si512(_mm512_srlv_epi16(h, shift), two);
                        _mm512_slli_epi16::<4>(bits)
                    };
                    let u = [
                        _mm512_or_si512(_mm512_and_si512(bytes, low), top(shift_lo)),
                        _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16::<4>(bytes), low),
                            top(shift_hi),
                        ),
                    ];
                    for (k, uk) in u.iter().enumerate() {
                        let sc = scale(2 * half + k);
                        for (i, sum) in sums.iter_mut().enumerate().take(n) {
                            let p = p0(i).add(128 * half + 64 * k);
                            let pv = _mm512_loadu_si512(p as *const __m512i);
                            let pairs = _mm512_maddubs_epi16(*uk, pv);
                            *sum = _mm512_add_epi32(*sum, _mm512_madd_epi16(pairs, sc));
                        }
                    }
                }
            }
        }
        let d = half_at(block, if q4 { 0 } else { 208 });
        for (i, y) in out.iter_mut().enumerate() {
            let r = r0 + i;
            let e = acts.e[r * nb + b];
            let g0 = (r * w.cols + b * QK_K) / 16;
            let bsums = acts.bsums[g0..g0 + 16].as_ptr();
            let shifted = _mm512_reduce_add_epi32(sums[i]);
            // SAFETY: the caller's AVX2; `bsums` points at 16 sums (a checked slice).
            if q4 {
                let msum = unsafe { q4_k_min_sum(&scales, bsums) };
                *y += (d * e) * shifted as f32;
                *y -= (half_at(block, 2) * e) * msum as f32;
            } else {
                let taken = unsafe { q6_k_taken(block, bsums) };
                *y += (d * e) * (shifted - 32 * taken) as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::lowp::kquants::q4_k_scale_min;

    #[test]
    fn q4_k_scales_and_minima_spread_as_the_reference_reads_them() {
        let mut state = 0x9e37_79b9u32;
        for _ in 0..200 {
            let bytes: Vec<u8> = (0..12)
                .map(|_| {
                    state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (state >> 24) as u8
                })
                .collect();
            let spread = q4_k_scales_mins(&bytes);
            for s in 0..8 {
                assert_eq!(
                    (spread[s], spread[8 + s]),
                    q4_k_scale_min(&bytes, s),
                    "{bytes:?} s {s}"
                );
            }
        }
    }
}
