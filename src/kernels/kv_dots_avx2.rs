//! The AVX2 kernels of `kv_dots`: its AVX-512 ones (`x86`) eight values a register, for CPUs
//! without AVX-512.

use super::super::kv_blocks::{KvType, PackedRows};
use std::arch::x86_64::*;

/// Values `c .. c + 8` of a head whose bytes start at `h` (c a multiple of 8).
trait Unpack {
    /// # Safety
    /// AVX2 and F16C; the 8 values' bytes (and their block's scale) are readable.
    unsafe fn unpack8(h: *const u8, c: usize) -> __m256;
}
struct F16;
struct Bf16;
struct Q8;
struct Q4;

/// The f16 scale at `p`, in every lane.
#[inline(always)]
unsafe fn scale(p: *const u8) -> __m256 {
    // SAFETY (caller): two bytes at p; F16C.
    unsafe {
        let h = u16::from_le_bytes([*p, *p.add(1)]);
        _mm256_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h)))))
    }
}

impl Unpack for F16 {
    #[inline(always)]
    unsafe fn unpack8(h: *const u8, c: usize) -> __m256 {
        // SAFETY (caller): 16 bytes at h + 2c.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(h.add(2 * c) as *const __m128i)) }
    }
}
impl Unpack for Bf16 {
    #[inline(always)]
    unsafe fn unpack8(h: *const u8, c: usize) -> __m256 {
        // SAFETY (caller): 16 bytes at h + 2c; a bf16 is the top half of its f32.
        unsafe {
            let x = _mm256_cvtepu16_epi32(_mm_loadu_si128(h.add(2 * c) as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(x))
        }
    }
}
impl Unpack for Q8 {
    #[inline(always)]
    unsafe fn unpack8(h: *const u8, c: usize) -> __m256 {
        // SAFETY (caller): block c/32 (34 bytes) at h + 34·(c/32).
        unsafe {
            let blk = h.add(c / 32 * 34);
            let qs = _mm_loadl_epi64(blk.add(2 + c % 32) as *const __m128i);
            _mm256_mul_ps(scale(blk), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(qs)))
        }
    }
}
impl Unpack for Q4 {
    #[inline(always)]
    unsafe fn unpack8(h: *const u8, c: usize) -> __m256 {
        // SAFETY (caller): block c/32 (18 bytes) at h + 18·(c/32); values 0..16 of a block
        // are the low nibbles of its 16 bytes, 16..32 the high ones.
        unsafe {
            let blk = h.add(c / 32 * 18);
            let bytes = _mm_loadl_epi64(blk.add(2 + c % 16) as *const __m128i);
            let wide = _mm256_cvtepu8_epi32(bytes);
            let nibbles = if c % 32 < 16 {
                wide
            } else {
                _mm256_srli_epi32::<4>(wide)
            };
            let q = _mm256_and_si256(nibbles, _mm256_set1_epi32(15));
            let x = _mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(8)));
            _mm256_mul_ps(scale(blk), x)
        }
    }
}

/// # Safety
/// AVX2, FMA, F16C; every key's head inside `k`; `q.len()` a multiple of 8.
pub(super) unsafe fn scores(
    q: &[f32],
    k: PackedRows<'_>,
    rows: &[u32],
    at: usize,
    scale: f32,
    out: &mut [f32],
) {
    // SAFETY: passed on from the caller.
    unsafe {
        by_kv_type!(k.ty, scores_as(q, k, rows, at, scale, out))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_as<U: Unpack>(
    q: &[f32],
    k: PackedRows<'_>,
    rows: &[u32],
    at: usize,
    scale: f32,
    out: &mut [f32],
) {
    let d = q.len();
    for (s, &r) in out.iter_mut().zip(rows) {
        let h = k.head(r, at, d).as_ptr();
        let mut acc = _mm256_setzero_ps();
        for c in (0..d).step_by(8) {
            // SAFETY (caller): values c .. c + 8 are inside q and the key's head.
            unsafe {
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(c)), U::unpack8(h, c), acc)
            };
        }
        let half = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
        let pair = _mm_add_ps(half, _mm_movehl_ps(half, half));
        let one = _mm_add_ss(pair, _mm_shuffle_ps::<1>(pair, pair));
        *s = _mm_cvtss_f32(one) * scale;
    }
}

/// # Safety
/// As [`scores`], for `v` and `out.len()`.
pub(super) unsafe fn weighted_sum(
    p: &[f32],
    v: PackedRows<'_>,
    rows: &[u32],
    at: usize,
    out: &mut [f32],
) {
    // SAFETY: passed on from the caller.
    unsafe {
        by_kv_type!(v.ty, weighted_sum_as(p, v, rows, at, out))
    }
}

/// Four registers (32 columns) at a time over all keys, then one register at a time; the
/// accumulators stay in registers over the keys.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weighted_sum_as<U: Unpack>(
    p: &[f32],
    v: PackedRows<'_>,
    rows: &[u32],
    at: usize,
    out: &mut [f32],
) {
    let d = out.len();
    let mut c0 = 0;
    while c0 < d {
        let regs = if c0 + 32 <= d { 4 } else { 1 };
        let mut acc = [_mm256_setzero_ps(); 4];
        for (&w, &r) in p.iter().zip(rows) {
            let h = v.head(r, at, d).as_ptr();
            let wv = _mm256_set1_ps(w);
            for (j, a) in acc.iter_mut().enumerate().take(regs) {
                // SAFETY (caller): columns c0 + 8j .. + 8 are inside the value's head.
                *a = _mm256_fmadd_ps(wv, unsafe { U::unpack8(h, c0 + 8 * j) }, *a);
            }
        }
        for (j, a) in acc.iter().enumerate().take(regs) {
            // SAFETY: c0 + 8·regs <= d.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(c0 + 8 * j), *a) };
        }
        c0 += 8 * regs;
    }
}
