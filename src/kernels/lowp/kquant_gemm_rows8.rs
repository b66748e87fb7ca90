//! The GEMM's panels read straight from `Q4_K` / `Q6_K` rows interleaved by eight
//! ([`rows8`](super::super::rows8)), for prompts: the same bytes [`Panels::new`] makes by
//! reassembling each row's file block and unpacking it one element at a time, made here a
//! vector at a time.
//!
//! ```text
//! a panel of 16 outputs = groups g0 = o0/8 + 2p and g0 + 1 (rows 0..8 of each)
//! interleaved vector (chunk c, vector v) of a group: lane L = (row L mod 8, quad j = 2v + ⌊L/8⌋)
//! panel quad vector = 16 lanes × 4 bytes, lane l = output (g0 rows in 0..8, g0 + 1's in 8..16):
//!     even quad (j = 2v):      [g0 lanes 0..8  | g1 lanes 0..8 ]   (vshufi64x2 0x44)
//!     odd quad  (j = 2v + 1):  [g0 lanes 8..16 | g1 lanes 8..16]   (vshufi64x2 0xEE)
//! Q4_K: nibble h of chunk c, quad j  ->  quad 16c + 8h + j
//! Q6_K: low bits of chunk c = 2n + k, nibble h, top bits (qh of chunk n) >> 2(k + 2h)
//!       ->  quad 32n + 8k + 16h + j
//! ```
//!
//! Scales, minima and the two f16 factors are a few bytes per row and super-block, decoded one
//! lane at a time as `unpack` does.

use super::{Panels, L, QUADS};
use crate::kernels::lowp::ggml::{f16_to_f32, GgmlType};
use crate::kernels::lowp::kquant_matrix::rows8::{GROUP, Q4_K_QS, Q6_K_QH, Q6_K_QL};
use crate::kernels::lowp::kquant_matrix::{KQuantMatrix, QK_K};
use crate::kernels::lowp::kquants::q4_k_scale_min;
use std::arch::x86_64::*;

/// Whether outputs `o0 .. o0 + outputs` of `w` are whole interleaved groups starting at a
/// panel: then [`fill`] makes their panels.
pub(super) fn takes(w: &KQuantMatrix, o0: usize, outputs: usize) -> bool {
    matches!(w.ty, GgmlType::Q4_K | GgmlType::Q6_K)
        && o0.is_multiple_of(L)
        && outputs.is_multiple_of(GROUP)
        && o0 + outputs <= w.grouped_rows
}

/// Writes the panels of outputs `o0 .. o0 + outputs` into `un` (zeroed, `outputs.div_ceil(L)`
/// panels of `nb` super-blocks), exactly as [`Panels::new`] does from the file's blocks.
///
/// # Safety
/// The CPU has AVX-512F/BW; [`takes`]`(w, o0, outputs)`; `un` was allocated for these panels.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn fill(w: &KQuantMatrix, un: &mut Panels, o0: usize, outputs: usize) {
    let nb = w.cols / QK_K;
    let block_bytes = if w.ty == GgmlType::Q4_K { 144 } else { 210 };
    let group_bytes = GROUP * block_bytes;
    let data: &[u8] = &w.data;
    let groups = outputs / GROUP;
    // What the panels add to the stored values: Q4_K's nibbles are its values, Q6_K's six
    // bits are its values + 32.
    let shift = match w.ty {
        GgmlType::Q4_K => w.unsigned_offset(),
        _ => w.unsigned_offset().wrapping_sub(32),
    };
    for p in 0..groups.div_ceil(2) {
        let g0 = o0 / GROUP + 2 * p;
        let both = 2 * p + 1 < groups;
        for b in 0..nb {
            let pb = p * nb + b;
            let block = |g: usize| &data[(g * nb + b) * group_bytes..][..group_bytes];
            let first = block(g0);
            let second = if both { block(g0 + 1) } else { first };
            let q = QuadStore { un_q: un.q.as_mut_ptr(), pb, both, shift };
            // SAFETY: AVX-512F/BW (the caller's); the blocks are group_bytes long (sliced
            // above) and `q` writes inside panel p (allocated by the caller).
            unsafe {
                match w.ty {
                    GgmlType::Q4_K => q4_k_quads(first, second, &q),
                    _ => q6_k_quads(first, second, &q),
                }
            }
            let lanes = if both { L } else { GROUP };
            for l in 0..lanes {
                let (blk, r) = (if l < GROUP { first } else { second }, l % GROUP);
                let half = |at: usize| f16_to_f32(u16::from_le_bytes([blk[at], blk[at + 1]]));
                un.d[pb * L + l] = half(2 * r);
                if w.ty == GgmlType::Q4_K {
                    un.dmin[pb * L + l] = half(16 + 2 * r);
                    let mut scales = [0u8; 12];
                    for k in 0..3 {
                        let at = 32 + 32 * k + 4 * r;
                        scales[4 * k..4 * k + 4].copy_from_slice(&blk[at..at + 4]);
                    }
                    for s in 0..8 {
                        let (sc, m) = q4_k_scale_min(&scales, s);
                        un.scale[(pb * 16 + 2 * s) * L + l] = i32::from(sc);
                        un.scale[(pb * 16 + 2 * s + 1) * L + l] = i32::from(sc);
                        un.min[(pb * 8 + s) * L + l] = i32::from(m) | (i32::from(m) << 16);
                    }
                } else {
                    for g in 0..16 {
                        un.scale[(pb * 16 + g) * L + l] = i32::from(blk[16 + 8 * g + r] as i8);
                    }
                }
            }
        }
    }
}

/// Where the quad vectors of one panel and super-block go.
struct QuadStore {
    un_q: *mut u8,
    pb: usize,
    /// Whether the panel has its second group (else its lanes 8..16 stay zero).
    both: bool,
    shift: i8,
}

impl QuadStore {
    /// Stores quads `quad` (from lanes 0..8 of `first` and `second`) and `quad + 1` (lanes
    /// 8..16), each plus the shift.
    ///
    /// # Safety
    /// AVX-512F/BW; quad + 1 < QUADS and `un_q` holds panel-super-block `pb`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn pair(&self, quad: usize, first: __m512i, second: __m512i) {
        let shift = _mm512_set1_epi8(self.shift);
        let lanes: __mmask16 = if self.both { 0xffff } else { 0x00ff };
        let even = _mm512_shuffle_i64x2::<0x44>(first, second);
        let odd = _mm512_shuffle_i64x2::<0xEE>(first, second);
        for (k, v) in [(0, even), (1, odd)] {
            let v = _mm512_maskz_mov_epi32(lanes, _mm512_add_epi8(v, shift));
            // SAFETY: the caller's contract: 64 bytes of quad + k of panel-super-block pb.
            unsafe {
                let at = ((self.pb * QUADS + quad + k) * L) * 4;
                _mm512_storeu_si512(self.un_q.add(at) as *mut __m512i, v);
            }
        }
    }
}

/// The 64 quads of a `Q4_K` super-block of two groups.
///
/// # Safety
/// AVX-512F/BW; `first` and `second` are a group's 1,152 bytes.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn q4_k_quads(first: &[u8], second: &[u8], q: &QuadStore) {
    assert!(first.len() >= GROUP * 144 && second.len() >= GROUP * 144);
    let low = _mm512_set1_epi8(0x0f);
    for c in 0..4 {
        for v in 0..4 {
            let at = Q4_K_QS + 256 * c + 64 * v;
            // SAFETY: at + 64 <= 1,152 (asserted lengths).
            let (a, b) = unsafe {
                (
                    _mm512_loadu_si512(first.as_ptr().add(at) as *const __m512i),
                    _mm512_loadu_si512(second.as_ptr().add(at) as *const __m512i),
                )
            };
            let high = |x: __m512i| _mm512_and_si512(_mm512_srli_epi16::<4>(x), low);
            // SAFETY: quads 16c + 8h + 2v + 1 < 64.
            unsafe {
                q.pair(16 * c + 2 * v, _mm512_and_si512(a, low), _mm512_and_si512(b, low));
                q.pair(16 * c + 8 + 2 * v, high(a), high(b));
            }
        }
    }
}

/// The 64 quads of a `Q6_K` super-block of two groups (values + 32, before the shift).
///
/// # Safety
/// AVX-512F/BW; `first` and `second` are a group's 1,680 bytes.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn q6_k_quads(first: &[u8], second: &[u8], q: &QuadStore) {
    assert!(first.len() >= GROUP * 210 && second.len() >= GROUP * 210);
    let (low, two) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(3));
    let load = |bytes: &[u8], at: usize| {
        // SAFETY: every `at` below is at most 1,616 (Q6_K_QH + 256 + 192), 64 bytes inside
        // the asserted 1,680.
        unsafe { _mm512_loadu_si512(bytes.as_ptr().add(at) as *const __m512i) }
    };
    for n in 0..2 {
        for v in 0..4 {
            let top = [load(first, Q6_K_QH + 256 * n + 64 * v), load(second, Q6_K_QH + 256 * n + 64 * v)];
            for k in 0..2 {
                let c = 2 * n + k;
                let bits = [load(first, Q6_K_QL + 256 * c + 64 * v), load(second, Q6_K_QL + 256 * c + 64 * v)];
                for h in 0..2 {
                    let value = |i: usize| {
                        let nibble = match h {
                            0 => _mm512_and_si512(bits[i], low),
                            _ => _mm512_and_si512(_mm512_srli_epi16::<4>(bits[i]), low),
                        };
                        let count = _mm_cvtsi32_si128((2 * (k + 2 * h)) as i32);
                        let hi2 = _mm512_and_si512(_mm512_srl_epi16(top[i], count), two);
                        _mm512_or_si512(nibble, _mm512_slli_epi16::<4>(hi2))
                    };
                    // SAFETY: quads 32n + 8k + 16h + 2v + 1 < 64.
                    unsafe { q.pair(32 * n + 8 * k + 16 * h + 2 * v, value(0), value(1)) };
                }
            }
        }
    }
}
