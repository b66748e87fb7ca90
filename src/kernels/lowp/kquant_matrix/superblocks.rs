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

/// The 16 activation sums at `bsums` added in pairs, `[p_0 … p_7]` with `p_s = bsums_2s +
/// bsums_2s+1` (the sums over `Q4_K`'s sub-blocks of 32).
///
/// # Safety
/// AVX2; 16 readable i32 at `bsums`.
#[inline(always)]
unsafe fn sub_block_sums(bsums: *const i32) -> __m256i {
    // SAFETY (caller): the 16 sums.
    unsafe {
        let (a, b) = (
            _mm256_loadu_si256(bsums as *const __m256i),
            _mm256_loadu_si256(bsums.add(8) as *const __m256i),
        );
        // [p0 p1 p4 p5 | p2 p3 p6 p7], put in order.
        let pairs = _mm256_hadd_epi32(a, b);
        _mm256_permutevar8x32_epi32(pairs, _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7))
    }
}

/// `m_s p_s` in lane `s`: a `Q4_K` block's 8 minima (`scales[8..16]`) times the sums of
/// [`sub_block_sums`]; the lanes add up to `M_b`, exact in i32.
#[inline(always)]
unsafe fn q4_k_min_lanes(scales: &[u8; 16], pairs: __m256i) -> __m256i {
    // SAFETY (caller: AVX2): 8 bytes at 8 of the 16.
    unsafe {
        let mins = _mm256_cvtepu8_epi32(_mm_loadl_epi64(scales.as_ptr().add(8) as *const __m128i));
        _mm256_mullo_epi32(mins, pairs)
    }
}

/// `sc_g bsums_g + sc_g+8 bsums_g+8` in lane `g`: a `Q6_K` block's 16 signed scales (at byte
/// 192) against the 16 activation sums at `bsums`; the lanes add up to `Σ_g sc_g bsums_g`,
/// exact in i32.
///
/// # Safety
/// AVX2; `block` is a whole `Q6_K` block, 16 readable i32 at `bsums`.
#[inline(always)]
unsafe fn q6_k_taken_lanes(block: *const u8, bsums: *const i32) -> __m256i {
    // SAFETY (caller): bytes 192..208 of the block, and the 16 sums.
    unsafe {
        let sc = _mm_loadu_si128(block.add(192) as *const __m128i);
        let lo = _mm256_mullo_epi32(_mm256_cvtepi8_epi32(sc), _mm256_loadu_si256(bsums as *const __m256i));
        let hi = _mm256_mullo_epi32(
            _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(sc)),
            _mm256_loadu_si256(bsums.add(8) as *const __m256i),
        );
        _mm256_add_epi32(lo, hi)
    }
}

/// 32 activations at `p`.
#[inline(always)]
unsafe fn load(p: *const i8) -> __m256i {
    // SAFETY (caller): 32 readable bytes.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// `[Σ a, Σ b, Σ c, Σ d]` of four vectors of 8 i32 lanes (exact).
#[inline(always)]
unsafe fn hsum4(v: [__m256i; 4]) -> __m128i {
    // SAFETY (caller): AVX2.
    unsafe {
        // Per 128-bit half: [a01 a23 b01 b23], then [a b c d] of that half's lanes.
        let ab = _mm256_hadd_epi32(v[0], v[1]);
        let cd = _mm256_hadd_epi32(v[2], v[3]);
        let abcd = _mm256_hadd_epi32(ab, cd);
        _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256::<1>(abcd))
    }
}

/// A block's 256 unsigned values, 32 a vector in the activations' order (vector `j`:
/// elements `32j .. 32j + 32`), and the i16 scale of each `vpmaddubsw` pair of each vector
/// (`Q4_K`: sub-block `j`'s; `Q6_K`: groups `2j` and `2j + 1`, a half each). `Q6_K`'s values
/// are `u = q + 32`.
struct Unpacked256 {
    values: [__m256i; 8],
    scales: [__m256i; 8],
}

/// [`Unpacked256`] of the `Q4_K` or `Q6_K` (`q4` false) block at `block`; `scales` are
/// `Q4_K`'s from [`q4_k_scales_mins`].
///
/// # Safety
/// AVX2; `block` points at a whole block of the type.
#[inline(always)]
unsafe fn unpack256(q4: bool, block: *const u8, scales: &[u8; 16]) -> Unpacked256 {
    // SAFETY (caller): every load reads inside the block (its layout's offsets).
    unsafe {
        let low = _mm256_set1_epi8(0x0f);
        let mut values = [_mm256_setzero_si256(); 8];
        let mut sc = [_mm256_setzero_si256(); 8];
        if q4 {
            let qs = block.add(16);
            for c in 0..4 {
                let bytes = _mm256_loadu_si256(qs.add(32 * c) as *const __m256i);
                values[2 * c] = _mm256_and_si256(bytes, low);
                values[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(bytes), low);
                sc[2 * c] = _mm256_set1_epi16(i16::from(scales[2 * c]));
                sc[2 * c + 1] = _mm256_set1_epi16(i16::from(scales[2 * c + 1]));
            }
        } else {
            let (ql, qh) = (block, block.add(128));
            let sc_g = |g: usize| i32::from(*block.add(192 + g) as i8);
            let two = _mm256_set1_epi8(3);
            for half in 0..2 {
                let ql0 = _mm256_loadu_si256(ql.add(64 * half) as *const __m256i);
                let ql1 = _mm256_loadu_si256(ql.add(64 * half + 32) as *const __m256i);
                let h = _mm256_loadu_si256(qh.add(32 * half) as *const __m256i);
                let top = |bits: __m256i| _mm256_slli_epi16::<4>(_mm256_and_si256(bits, two));
                let hi0 = _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low);
                let hi1 = _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low);
                let u = [
                    _mm256_or_si256(_mm256_and_si256(ql0, low), top(h)),
                    _mm256_or_si256(_mm256_and_si256(ql1, low), top(_mm256_srli_epi16::<2>(h))),
                    _mm256_or_si256(hi0, top(_mm256_srli_epi16::<4>(h))),
                    _mm256_or_si256(hi1, top(_mm256_srli_epi16::<6>(h))),
                ];
                for (k, uk) in u.into_iter().enumerate() {
                    let j = 4 * half + k;
                    values[j] = uk;
                    sc[j] = two_scales(sc_g(2 * j), sc_g(2 * j + 1));
                }
            }
        }
        Unpacked256 { values, scales: sc }
    }
}

/// The shifted integer sum of an unpacked block against the 256 activations at `p`, in 8
/// i32 lanes (pair sums of `vpmaddubsw` at most 2 · 63 · 128 < 2^15, so exact).
#[inline(always)]
unsafe fn row_sum(u: &Unpacked256, p: *const i8) -> __m256i {
    // SAFETY (caller: AVX2): 256 readable activations at `p`.
    unsafe {
        let mut sum = _mm256_setzero_si256();
        for j in 0..8 {
            let pairs = _mm256_maddubs_epi16(u.values[j], load(p.add(32 * j)));
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, u.scales[j]));
        }
        sum
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

/// [`Unpacked256`] in 512-bit vectors: vector `j` holds elements `64j .. 64j + 64`. Each 32
/// stored nibble bytes of `Q4_K` broadcast to both halves of a vector, the low half's low
/// nibbles and the high half's high nibbles kept; `Q6_K`'s `ql[64n .. 64n + 64]` whole, its
/// two-bit tops `[h | h >> 2]` and `[h >> 4 | h >> 6]`; the scales in i16 lanes by a
/// permutation of the block's 16 (or 8).
struct Unpacked512 {
    values: [__m512i; 4],
    scales: [__m512i; 4],
}

/// [`Unpacked512`] of the `Q4_K` or `Q6_K` (`q4` false) block at `block`.
///
/// # Safety
/// AVX-512F/BW; `block` points at a whole block of the type.
#[inline(always)]
unsafe fn unpack512(q4: bool, block: *const u8, scales: &[u8; 16]) -> Unpacked512 {
    // SAFETY (caller): the loads read inside the block (its layout's offsets); `index` and
    // `scales` are arrays of the sizes read.
    unsafe {
        let index = if q4 { &Q4_K_SCALE_LANES } else { &Q6_K_SCALE_LANES };
        let widened = if q4 {
            _mm256_cvtepu8_epi16(_mm_loadu_si128(scales.as_ptr() as *const __m128i))
        } else {
            _mm256_cvtepi8_epi16(_mm_loadu_si128(block.add(192) as *const __m128i))
        };
        let widened = _mm512_castsi256_si512(widened);
        let sc: [__m512i; 4] = std::array::from_fn(|k| {
            let idx = _mm512_loadu_si512(index[k].as_ptr() as *const __m512i);
            _mm512_permutexvar_epi16(idx, widened)
        });
        let low = _mm512_set1_epi8(0x0f);
        let mut values = [_mm512_setzero_si512(); 4];
        if q4 {
            let shift = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(4));
            let qs = block.add(16);
            for (c, v) in values.iter_mut().enumerate() {
                let bytes =
                    _mm512_broadcast_i64x4(_mm256_loadu_si256(qs.add(32 * c) as *const __m256i));
                *v = _mm512_and_si512(_mm512_srlv_epi16(bytes, shift), low);
            }
        } else {
            let (ql, qh) = (block, block.add(128));
            let two = _mm512_set1_epi8(3);
            let shift_lo = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(2));
            let shift_hi = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_set1_epi16(4)),
                _mm256_set1_epi16(6),
            );
            for half in 0..2 {
                let bytes = _mm512_loadu_si512(ql.add(64 * half) as *const __m512i);
                let h =
                    _mm512_broadcast_i64x4(_mm256_loadu_si256(qh.add(32 * half) as *const __m256i));
                let top = |shift: __m512i| {
                    let bits = _mm512_and_si512(_mm512_srlv_epi16(h, shift), two);
                    _mm512_slli_epi16::<4>(bits)
                };
                values[2 * half] = _mm512_or_si512(_mm512_and_si512(bytes, low), top(shift_lo));
                values[2 * half + 1] = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16::<4>(bytes), low),
                    top(shift_hi),
                );
            }
        }
        Unpacked512 { values, scales: sc }
    }
}

/// [`row_sum`] of an [`Unpacked512`], the two halves of the 512-bit sum added into 8 lanes.
#[inline(always)]
unsafe fn row_sum512(u: &Unpacked512, p: *const i8) -> __m256i {
    // SAFETY (caller: AVX-512F/BW): 256 readable activations at `p`.
    unsafe {
        let mut sum = _mm512_setzero_si512();
        for j in 0..4 {
            let pv = _mm512_loadu_si512(p.add(64 * j) as *const __m512i);
            let pairs = _mm512_maddubs_epi16(u.values[j], pv);
            sum = _mm512_add_epi32(sum, _mm512_madd_epi16(pairs, u.scales[j]));
        }
        _mm256_add_epi32(
            _mm512_castsi512_si256(sum),
            _mm512_extracti64x4_epi64::<1>(sum),
        )
    }
}

/// A block unpacked into registers of one width ([`Unpacked256`], [`Unpacked512`]), and its
/// shifted integer sum against 256 activations: what the kernels below do differently at
/// each width.
trait Unpack: Sized {
    /// The `Q4_K` or `Q6_K` (`q4` false) block at `block`; `scales` are `Q4_K`'s from
    /// [`q4_k_scales_mins`].
    ///
    /// # Safety
    /// The width's features (AVX2; AVX-512F/BW for [`Unpacked512`]); `block` points at a whole
    /// block of the type.
    unsafe fn unpack(q4: bool, block: *const u8, scales: &[u8; 16]) -> Self;

    /// The shifted integer sum against the 256 activations at `p`, in 8 i32 lanes.
    ///
    /// # Safety
    /// The width's features; 256 readable activations at `p`.
    unsafe fn row_sum(&self, p: *const i8) -> __m256i;
}

impl Unpack for Unpacked256 {
    #[inline(always)]
    unsafe fn unpack(q4: bool, block: *const u8, scales: &[u8; 16]) -> Self {
        // SAFETY: the caller's contract, passed on.
        unsafe { unpack256(q4, block, scales) }
    }

    #[inline(always)]
    unsafe fn row_sum(&self, p: *const i8) -> __m256i {
        // SAFETY: the caller's contract, passed on.
        unsafe { row_sum(self, p) }
    }
}

impl Unpack for Unpacked512 {
    #[inline(always)]
    unsafe fn unpack(q4: bool, block: *const u8, scales: &[u8; 16]) -> Self {
        // SAFETY: the caller's contract, passed on.
        unsafe { unpack512(q4, block, scales) }
    }

    #[inline(always)]
    unsafe fn row_sum(&self, p: *const i8) -> __m256i {
        // SAFETY: the caller's contract, passed on.
        unsafe { row_sum512(self, p) }
    }
}

/// `Q4_K`'s spread scales and minima of the block (see [`q4_k_scales_mins`]); nothing for
/// `Q6_K`, whose signed scales the unpacking reads in place.
#[inline(always)]
fn block_scales(q4: bool, block: &[u8]) -> [u8; 16] {
    if q4 {
        q4_k_scales_mins(&block[4..16])
    } else {
        [0; 16]
    }
}

/// `out[i] = w_o · x_{r0+i}` for `i < out.len()` (at most `ROW_TILE`), `w` of type `Q4_K` or
/// `Q6_K`, unpacked at `U`'s width. Each block is unpacked once for the tile's rows; then,
/// block after block, the portable kernel's f32 steps (`tile_with`).
///
/// # Safety
/// `U`'s features, AVX2, FMA and F16C; `o < w.rows`, activation rows `r0 .. r0 + out.len()`
/// exist in `acts`, which came from `w.quantize`.
#[inline(always)]
unsafe fn tile_in<U: Unpack>(
    w: &KQuantMatrix,
    acts: &KQuantActs,
    o: usize,
    r0: usize,
    out: &mut [f32],
) {
    const R: usize = crate::kernels::lowp::ROW_TILE;
    let nb = w.cols / QK_K;
    out.fill(0.0);
    let q4 = w.ty == GgmlType::Q4_K;
    let mut buf = [0u8; 256];
    for b in 0..nb {
        let block = w.block_at(o, b, &mut buf);
        // Q4_K: bytes 0–7 the sub-blocks' scales, 8–15 their minima.
        let scales = block_scales(q4, block);
        let d = half_at(block, if q4 { 0 } else { 208 });
        let dmin = if q4 { half_at(block, 2) } else { 0.0 };
        // SAFETY: the caller's features; `block` is a whole block (a checked slice), and the
        // activations of block b of rows r0 + i exist (the caller's bounds), as do their 16
        // sums (a checked slice).
        unsafe {
            let unpacked = U::unpack(q4, block.as_ptr(), &scales);
            for (i, y) in out.iter_mut().enumerate().take(R) {
                let r = r0 + i;
                let sum = unpacked.row_sum(acts.q.as_ptr().add(r * w.cols + b * QK_K));
                let e = acts.e[r * nb + b];
                let g0 = (r * w.cols + b * QK_K) / 16;
                let bsums = acts.bsums[g0..g0 + 16].as_ptr();
                let shifted = hsum(sum);
                if q4 {
                    let msum = hsum(q4_k_min_lanes(&scales, sub_block_sums(bsums)));
                    *y += (d * e) * shifted as f32;
                    *y -= (dmin * e) * msum as f32;
                } else {
                    let taken = hsum(q6_k_taken_lanes(block.as_ptr(), bsums));
                    *y += (d * e) * (shifted - 32 * taken) as f32;
                }
            }
        }
    }
}

/// The AVX2 kernel of a tile (see [`tile_in`]).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; the bounds of [`tile_in`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile(
    w: &KQuantMatrix,
    acts: &KQuantActs,
    o: usize,
    r0: usize,
    out: &mut [f32],
) {
    // SAFETY: the caller's contract, passed on.
    unsafe { tile_in::<Unpacked256>(w, acts, o, r0, out) }
}

/// The AVX-512 (F, BW) kernel of a tile, 64 elements a step: the same integer sums and the
/// same f32 steps as [`tile`].
///
/// # Safety
/// The CPU must have AVX-512F/BW, AVX2, FMA and F16C; the bounds of [`tile_in`].
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(super) unsafe fn tile_avx512(
    w: &KQuantMatrix,
    acts: &KQuantActs,
    o: usize,
    r0: usize,
    out: &mut [f32],
) {
    // SAFETY: the caller's contract, passed on.
    unsafe { tile_in::<Unpacked512>(w, acts, o, r0, out) }
}

/// Weight rows the decoding kernels ([`outputs_avx2`], [`outputs_avx512`]) take per pass.
pub(super) const OUTPUTS: usize = 4;
// `outs` keeps the four rows' sums in the four lanes of one 128-bit vector.
const _: () = assert!(OUTPUTS == 4);
/// How far ahead (in weight rows) the decoding kernels prefetch the rows they will take.
const PREFETCH_ROWS: usize = 8;

/// `out[i] = w_{o0+i} · x_0` for `i <` [`OUTPUTS`]: four weight rows against the one activation
/// row of a decoding step. The activations and their sums are read once for the four rows,
/// the rows' integer sums reduced together ([`hsum4`]), and each row's f32 steps are
/// [`tile_in`]'s in one lane of a vector (multiplications and additions, no FMA: the same
/// bits).
///
/// # Safety
/// `U`'s features, AVX2, FMA and F16C; `w` holds `Q4_K` or `Q6_K` blocks,
/// `o0 + OUTPUTS <= w.rows`, `acts` (one row at least) made by `w.quantize`;
/// `out.len() == OUTPUTS`.
#[inline(always)]
unsafe fn outs<U: Unpack>(w: &KQuantMatrix, acts: &KQuantActs, o0: usize, out: &mut [f32]) {
    let (nb, bb) = (w.cols / QK_K, w.block_bytes);
    let q4 = w.ty == GgmlType::Q4_K;
    // The rows PREFETCH_ROWS further on: four interleaved rows hide the stream from the
    // hardware prefetcher.
    let ahead = PREFETCH_ROWS * nb * bb;
    // The stored bytes once: each dereference of `w.data` is a call through its owner.
    let stored: &[u8] = &w.data;
    assert!((o0 + OUTPUTS) * nb * bb <= stored.len(), "rows of this product");
    // Lane i: row i's sum.
    let mut y = _mm_setzero_ps();
    for b in 0..nb {
        let blocks: [&[u8]; OUTPUTS] = std::array::from_fn(|i| {
            let at = ((o0 + i) * nb + b) * bb;
            &stored[at..at + bb]
        });
        // SAFETY: the caller's features; every block is a checked slice of one whole block,
        // and activation row 0 holds block b's 256 values, scale and 16 sums (the caller's
        // contract: `acts` came from `w.quantize`, so it has `nb` blocks a row).
        unsafe {
            let p = acts.q.as_ptr().add(b * QK_K);
            let bsums = acts.bsums.as_ptr().add(b * 16);
            let pairs = sub_block_sums(bsums);
            let mut sums = [_mm256_setzero_si256(); OUTPUTS];
            let mut fixes = [_mm256_setzero_si256(); OUTPUTS];
            for i in 0..OUTPUTS {
                for line in (0..bb).step_by(64) {
                    // A hint only: it never faults, whatever the address (past the weights
                    // on the last rows, which `wrapping_add` allows).
                    let ahead_at = blocks[i].as_ptr().wrapping_add(ahead + line);
                    _mm_prefetch::<_MM_HINT_T0>(ahead_at as *const i8);
                }
                let scales = block_scales(q4, blocks[i]);
                sums[i] = U::unpack(q4, blocks[i].as_ptr(), &scales).row_sum(p);
                fixes[i] = if q4 {
                    q4_k_min_lanes(&scales, pairs)
                } else {
                    q6_k_taken_lanes(blocks[i].as_ptr(), bsums)
                };
            }
            // The four blocks' f16 at byte `at`: Q4_K's d at 0 and dmin at 2, Q6_K's d at 208.
            let halves = |at: usize| {
                let h = blocks.map(|blk| i16::from_le_bytes([blk[at], blk[at + 1]]));
                _mm_cvtph_ps(_mm_setr_epi16(h[0], h[1], h[2], h[3], 0, 0, 0, 0))
            };
            let e = _mm_set1_ps(acts.e[b]);
            let (shifted, fix) = (hsum4(sums), hsum4(fixes));
            if q4 {
                let t = _mm_mul_ps(_mm_mul_ps(halves(0), e), _mm_cvtepi32_ps(shifted));
                y = _mm_add_ps(y, t);
                let m = _mm_mul_ps(_mm_mul_ps(halves(2), e), _mm_cvtepi32_ps(fix));
                y = _mm_sub_ps(y, m);
            } else {
                let isum = _mm_sub_epi32(shifted, _mm_slli_epi32::<5>(fix));
                let t = _mm_mul_ps(_mm_mul_ps(halves(208), e), _mm_cvtepi32_ps(isum));
                y = _mm_add_ps(y, t);
            }
        }
    }
    let out: &mut [f32; OUTPUTS] = out.try_into().expect("four outputs a pass");
    // SAFETY: `out` holds OUTPUTS = 4 floats.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), y) };
}

/// The AVX2 decoding kernel: `out[i] = w_{o0+i} · x_0` for `i < OUTPUTS` (see [`outs`]).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; the bounds of [`outs`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn outputs_avx2(w: &KQuantMatrix, acts: &KQuantActs, o0: usize, out: &mut [f32]) {
    // SAFETY: the caller's contract, passed on.
    unsafe { outs::<Unpacked256>(w, acts, o0, out) }
}

/// The AVX-512 decoding kernel, as [`outputs_avx2`] with 512-bit steps.
///
/// # Safety
/// As [`outputs_avx2`], and the CPU must have AVX-512F/BW.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(super) unsafe fn outputs_avx512(
    w: &KQuantMatrix,
    acts: &KQuantActs,
    o0: usize,
    out: &mut [f32],
) {
    // SAFETY: the caller's contract, passed on.
    unsafe { outs::<Unpacked512>(w, acts, o0, out) }
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
