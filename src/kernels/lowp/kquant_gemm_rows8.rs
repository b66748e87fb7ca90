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
//! Scales and minima are spread from eight rows' packed bytes a vector at a time (`Q4_K`'s 12
//! bytes as the decoding kernel does), the f16 factors converted eight at a time.

use super::{Panels, L, QUADS};
use crate::kernels::lowp::ggml::GgmlType;
pub(super) use crate::kernels::lowp::kquant_matrix::rows8::GROUP;
use crate::kernels::lowp::kquant_matrix::rows8::{Q4_K_QS, Q6_K_QH, Q6_K_QL};
use crate::kernels::lowp::kquant_matrix::{KQuantMatrix, QK_K};
use std::arch::x86_64::*;

/// Whether outputs `o0 .. o0 + outputs` of `w` are whole interleaved groups starting at a
/// panel: then [`fill`] makes their panels.
pub(super) fn takes(w: &KQuantMatrix, o0: usize, outputs: usize) -> bool {
    matches!(w.ty, GgmlType::Q4_K | GgmlType::Q6_K)
        && o0.is_multiple_of(L)
        && outputs.is_multiple_of(GROUP)
        && o0 + outputs <= w.grouped_rows
}

/// Writes super-block `b` of outputs `o0 .. o0 + outputs` into `un` (made for
/// `outputs.div_ceil(L)` panels), exactly as [`Panels::unpack_block`] does from the file's
/// blocks.
///
/// # Safety
/// The CPU has AVX-512F/BW; [`takes`]`(w, o0, outputs)`; `un` was made for these panels.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn fill(w: &KQuantMatrix, un: &mut Panels, o0: usize, outputs: usize, b: usize) {
    let nb = w.cols / QK_K;
    let group_bytes = GROUP * w.block_bytes;
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
        let block = |g: usize| &data[(g * nb + b) * group_bytes..][..group_bytes];
        let first = block(g0);
        let second = if both { block(g0 + 1) } else { first };
        let q = QuadStore {
            un_q: un.q.as_mut_ptr(),
            p,
            both,
            shift,
        };
        // SAFETY: AVX-512F/BW (the caller's); the blocks are group_bytes long (sliced above)
        // and `q` writes inside panel p (made by the caller).
        unsafe {
            match w.ty {
                GgmlType::Q4_K => q4_k_quads(first, second, &q),
                _ => q6_k_quads(first, second, &q),
            }
        }
        // SAFETY: as above; `un`'s scales, minima and factors hold panel p.
        unsafe {
            match w.ty {
                GgmlType::Q4_K => q4_k_scales(first, second, both, un, p),
                _ => q6_k_scales(first, second, both, un, p),
            }
        }
    }
}

/// Eight f32 from the eight f16 at `at` of `blk` (a factor of each row of a group).
///
/// # Safety
/// AVX-512F (F16C); `at + 16 <= blk.len()`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,f16c")]
unsafe fn halves(blk: &[u8], at: usize) -> __m256 {
    debug_assert!(at + 16 <= blk.len());
    // SAFETY: the caller's contract.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(blk.as_ptr().add(at) as *const __m128i)) }
}

/// Stores `first`'s 8 lanes and (when `both`) `second`'s as the 16 lanes at `to`.
///
/// # Safety
/// AVX-512F; `to` holds 16 i32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn store16(to: *mut i32, first: __m256i, second: __m256i, both: bool) {
    let second = if both { second } else { _mm256_setzero_si256() };
    let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(first), second);
    // SAFETY: the caller's contract.
    unsafe { _mm512_storeu_si512(to as *mut __m512i, v) };
}

/// `Q4_K`'s scales, minima (as `m | m << 16`), `d` and `dmin` of panel `p`: the 12 packed
/// scale bytes of 8 rows a vector at a time, as the decoding kernel spreads them.
///
/// # Safety
/// AVX-512F/BW, F16C; `first` and `second` are a group's 1,152 bytes; `un` holds panel `p`.
#[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
unsafe fn q4_k_scales(first: &[u8], second: &[u8], both: bool, un: &mut Panels, p: usize) {
    assert!(first.len() >= GROUP * 144 && second.len() >= GROUP * 144);
    assert!(un.scale.len() >= (p + 1) * 16 * L && un.min.len() >= (p + 1) * 8 * L);
    assert!(un.d.len() >= (p + 1) * L && un.dmin.len() >= (p + 1) * L);
    // [sc0..3], [sc4..7], [m0..3], [m4..7] of each row, a byte each, lane r.
    let spread = |blk: &[u8]| {
        let (k1, k2, k3) = (
            _mm256_set1_epi32(0x3f3f_3f3f),
            _mm256_set1_epi32(0x0f0f_0f0f),
            _mm256_set1_epi32(0x0303_0303),
        );
        // SAFETY: 32 bytes at 32, 64 and 96, inside the asserted 1,152.
        let word = |k: usize| unsafe { _mm256_loadu_si256(blk.as_ptr().add(32 + 32 * k) as *const __m256i) };
        let (w0, w1, w2) = (word(0), word(1), word(2));
        let top = |x: __m256i| _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(x), k3));
        [
            _mm256_and_si256(w0, k1),
            _mm256_or_si256(_mm256_and_si256(w2, k2), top(w0)),
            _mm256_and_si256(w1, k1),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32::<4>(w2), k2), top(w1)),
        ]
    };
    let (a, b) = (spread(first), spread(second));
    let byte = |x: __m256i, k: usize| {
        let shifted = _mm256_srlv_epi32(x, _mm256_set1_epi32(8 * k as i32));
        _mm256_and_si256(shifted, _mm256_set1_epi32(0xff))
    };
    for s in 0..8 {
        let (sc, m) = (s / 4, 2 + s / 4);
        let (sa, sb) = (byte(a[sc], s % 4), byte(b[sc], s % 4));
        let pair = |x: __m256i| _mm256_or_si256(x, _mm256_slli_epi32::<16>(x));
        let (ma, mb) = (pair(byte(a[m], s % 4)), pair(byte(b[m], s % 4)));
        // SAFETY: scales (p·16 + 2s + 1)·L + 16 and minima (p·8 + s)·L + 16 are inside
        // (asserted).
        unsafe {
            store16(un.scale.as_mut_ptr().add((p * 16 + 2 * s) * L), sa, sb, both);
            store16(un.scale.as_mut_ptr().add((p * 16 + 2 * s + 1) * L), sa, sb, both);
            store16(un.min.as_mut_ptr().add((p * 8 + s) * L), ma, mb, both);
        }
    }
    // SAFETY: the factors at 0 and 16 of each group; d and dmin hold panel p (asserted).
    unsafe {
        factors(un.d.as_mut_ptr().add(p * L), halves(first, 0), halves(second, 0), both);
        factors(un.dmin.as_mut_ptr().add(p * L), halves(first, 16), halves(second, 16), both);
    }
}

/// `Q6_K`'s signed scales and `d` of panel `p` (its `dmin` and minima stay zero).
///
/// # Safety
/// AVX-512F/BW, F16C; `first` and `second` are a group's 1,680 bytes; `un` holds panel `p`.
#[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
unsafe fn q6_k_scales(first: &[u8], second: &[u8], both: bool, un: &mut Panels, p: usize) {
    assert!(first.len() >= GROUP * 210 && second.len() >= GROUP * 210);
    assert!(un.scale.len() >= (p + 1) * 16 * L && un.d.len() >= (p + 1) * L);
    for g in 0..16 {
        // SAFETY: 8 bytes at 16 + 8g < 144 of each group (asserted lengths); scales
        // (p·16 + g)·L + 16 are inside (asserted).
        unsafe {
            let eight = |blk: &[u8]| _mm_loadl_epi64(blk.as_ptr().add(16 + 8 * g) as *const __m128i);
            let (sa, sb) = (_mm256_cvtepi8_epi32(eight(first)), _mm256_cvtepi8_epi32(eight(second)));
            store16(un.scale.as_mut_ptr().add((p * 16 + g) * L), sa, sb, both);
        }
    }
    // SAFETY: d at 0 of each group; d holds panel p (asserted).
    unsafe { factors(un.d.as_mut_ptr().add(p * L), halves(first, 0), halves(second, 0), both) };
}

/// Stores the 8 factors of each group as a panel's 16 lanes at `to` (zeros for a missing
/// second group).
///
/// # Safety
/// AVX-512F; `to` holds 16 f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn factors(to: *mut f32, first: __m256, second: __m256, both: bool) {
    // SAFETY: the caller's contract (the same bits as 16 i32).
    unsafe {
        store16(
            to as *mut i32,
            _mm256_castps_si256(first),
            _mm256_castps_si256(second),
            both,
        )
    };
}

/// Where the quad vectors of one panel and super-block go.
struct QuadStore {
    un_q: *mut u8,
    /// The panel.
    p: usize,
    /// Whether the panel has its second group (else its lanes 8..16 stay zero).
    both: bool,
    shift: i8,
}

impl QuadStore {
    /// Stores quads `quad` (from lanes 0..8 of `first` and `second`) and `quad + 1` (lanes
    /// 8..16), each plus the shift.
    ///
    /// # Safety
    /// AVX-512F/BW; quad + 1 < QUADS and `un_q` holds panel `p`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn pair(&self, quad: usize, first: __m512i, second: __m512i) {
        let shift = _mm512_set1_epi8(self.shift);
        let lanes: __mmask16 = if self.both { 0xffff } else { 0x00ff };
        let even = _mm512_shuffle_i64x2::<0x44>(first, second);
        let odd = _mm512_shuffle_i64x2::<0xEE>(first, second);
        for (k, v) in [(0, even), (1, odd)] {
            let v = _mm512_maskz_mov_epi32(lanes, _mm512_add_epi8(v, shift));
            // SAFETY: the caller's contract: 64 bytes of quad + k of panel p.
            unsafe {
                let at = ((self.p * QUADS + quad + k) * L) * 4;
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
