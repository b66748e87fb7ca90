//! The AVX2 and AVX-512 row kernels of the 32-element blocks `Q5_0`, `Q5_1`, `IQ4_NL` and
//! `MXFP4` ([`KQuantMatrix`]), eight blocks per step, the weights unpacked from the stored bytes
//! in registers as llama.cpp's `ggml_vec_dot_q5_0_q8_0`, `_q5_1_q8_1`, `_iq4_nl_q8_0` and
//! `_mxfp4_q8_0` do. A whole step of `Q5_0` / `Q5_1` is one of the groups [`q5_groups`] packs
//! at load (its values by [`q5_groups::unsigned_avx2`], its eight `d` and `m` by one load
//! each); the other steps read the file's blocks:
//!
//! ```text
//! per block: nibbles [low 16 | high 16]            (one 128-bit broadcast, a variable shift)
//!            Q5_0 / Q5_1: u_j = nibble_j + 16 h_j  (h_j bit j of qh: AVX2 spreads it to bytes
//!                         with a shuffle and a compare, AVX-512 adds 16 under the mask qh)
//!            IQ4_NL:      u_j = K[nibble_j]        (16-entry vpshufb table; AVX-512: K + 128)
//!            MXFP4:       u_j = F[nibble_j]        (its e2m1 levels, doubled; likewise)
//!            8 i32 partial sums of u_j p_j         (AVX2 vpmaddubsw + vpmaddwd, IQ4_NL and
//!                                                   MXFP4 by |K| × sign(p, K); AVX-512
//!                                                   vpdpbusd)
//! per step of 8 blocks b (lane b mod 8, horizontal adds across the blocks' vectors):
//!     I_b = Σ_j u_j p_j − c Σ_j p_j             c = 16 (Q5_0), 0 (Q5_1, IQ4_NL and MXFP4
//!                                                with AVX2), 128 (IQ4_NL and MXFP4 with
//!                                                AVX-512): exact in i32
//!     t_b = (d_b e_b) I_b,   Q5_1 also m_b s_b   (d, m widened from the 8 blocks' f16 heads;
//!                                                MXFP4's d_b = 2^(e_b − 128) from its byte)
//!     y  ← y + t_b (+ m_b s_b), block after block
//! ```
//!
//! The f32 steps are the portable kernel's (`tile_with`) in its order, so every kernel gives
//! the portable kernel's bits. The pair sums of `vpmaddubsw` stay below 2^15: `u_j <= 31`
//! against `|p_j| <= 127` (2 · 31 · 127), and `|K| <= 127` (2 · 127 · 127). A last step of
//! fewer than 8 blocks runs the same code with the missing blocks masked off.

use super::super::blocks::avx2::heads;
use super::{e8m0_half, q5_groups, GgmlType, KQuantActs, KQuantMatrix, IQ4_NL_LEVELS, MXFP4_LEVELS};
use std::arch::x86_64::*;

/// Blocks per step (one i32 / f32 lane each).
const STEP: usize = 8;

/// The block types, as a const parameter.
pub(super) const Q5_0: u8 = 0;
pub(super) const Q5_1: u8 = 1;
pub(super) const IQ4_NL: u8 = 2;
pub(super) const MXFP4: u8 = 3;

/// Whether the type's values are signed table levels (`IQ4_NL`, `MXFP4`).
const fn levels(t: u8) -> bool {
    t == IQ4_NL || t == MXFP4
}

/// One instruction set's per-block step: the 8 i32 partial sums of `u_j p_j` for `R` rows.
trait BlockDot {
    /// What the unsigned values of type `T` carry above `q_j` (`c` of the module's sums).
    fn offset(t: u8) -> i32;

    /// The 32 values `u_j` of the block at `block`, as the file stores it.
    ///
    /// # Safety
    /// The instruction set's features; `block` holds one whole stored block of type `T`.
    unsafe fn unsigned<const T: u8>(block: *const u8) -> __m256i;

    /// `Σ u_j p_j` of the block of values `u` against the 32 activations at `p[r]`, in 8
    /// lanes.
    ///
    /// # Safety
    /// The instruction set's features; each `p[r]` 32 readable bytes.
    unsafe fn dot<const R: usize, const T: u8>(u: __m256i, p: &[*const i8; R]) -> [__m256i; R];
}

/// AVX2 (+ FMA, F16C).
struct Avx2;
/// AVX-512F/BW/VL and VNNI, on 256-bit vectors (a block is 32 bytes).
struct Avx512;

/// Where a block's fifth bits and nibbles start.
const fn parts(t: u8) -> (usize, usize) {
    match t {
        Q5_0 => (2, 6),
        Q5_1 => (4, 8),
        MXFP4 => (0, 1),
        _ => (0, 2),
    }
}

/// The 32 nibbles of the 16 bytes at `qs`: `[low nibbles | high nibbles]`, elements 0–31.
///
/// # Safety
/// AVX2; 16 bytes readable at `qs`.
#[inline(always)]
unsafe fn nibbles(qs: *const u8) -> __m256i {
    // SAFETY (caller): 16 bytes.
    let raw = unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(qs as *const __m128i)) };
    let shifted = _mm256_srlv_epi32(raw, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    _mm256_and_si256(shifted, _mm256_set1_epi8(0x0f))
}

impl BlockDot for Avx2 {
    fn offset(t: u8) -> i32 {
        if t == Q5_0 {
            16
        } else {
            0
        }
    }

    #[inline(always)]
    unsafe fn unsigned<const T: u8>(block: *const u8) -> __m256i {
        // SAFETY (caller): one whole block.
        unsafe { unsigned_avx2::<T>(block) }
    }

    #[inline(always)]
    unsafe fn dot<const R: usize, const T: u8>(u: __m256i, p: &[*const i8; R]) -> [__m256i; R] {
        // SAFETY (caller): the 32 activations of each row.
        unsafe {
            let ones = _mm256_set1_epi16(1);
            if levels(T) {
                let magnitude = _mm256_abs_epi8(u);
                std::array::from_fn(|r| {
                    let pv = _mm256_loadu_si256(p[r] as *const __m256i);
                    let pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(pv, u));
                    _mm256_madd_epi16(pairs, ones)
                })
            } else {
                std::array::from_fn(|r| {
                    let pv = _mm256_loadu_si256(p[r] as *const __m256i);
                    _mm256_madd_epi16(_mm256_maddubs_epi16(u, pv), ones)
                })
            }
        }
    }
}

/// `c` of the weights [`unsigned_avx512`] (`avx512`) or [`unsigned_avx2`] give for type `t`.
pub(super) fn unsigned_offset(t: u8, avx512: bool) -> i32 {
    if avx512 {
        Avx512::offset(t)
    } else {
        Avx2::offset(t)
    }
}

/// The 32 weights of the block at `block` as the AVX2 kernels multiply them, `u_j = q_j + c`
/// with `c` of [`BlockDot::offset`] (`Q5_0`: nibble + 16 h, `Q5_1` likewise, `IQ4_NL`: the
/// signed level `K`).
///
/// # Safety
/// AVX2; one whole stored block of type `T` at `block`.
#[inline(always)]
pub(super) unsafe fn unsigned_avx2<const T: u8>(block: *const u8) -> __m256i {
    let (qh_at, qs_at) = parts(T);
    // SAFETY (caller): the block's 16 nibble bytes and its 4 bytes of fifth bits.
    unsafe {
        let nib = nibbles(block.add(qs_at));
        if levels(T) {
            let table = match T {
                MXFP4 => MXFP4_LEVELS.as_ptr(),
                _ => IQ4_NL_LEVELS.as_ptr(),
            };
            let table = _mm_loadu_si128(table as *const __m128i);
            _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(table), nib)
        } else {
            // Byte j takes byte j / 8 of qh; with every other bit set it is all ones
            // exactly where bit j % 8 is set (llama.cpp's `bytes_from_bits_32`).
            let qh = _mm256_set1_epi32((block.add(qh_at) as *const i32).read_unaligned());
            let spread = _mm256_shuffle_epi8(
                qh,
                _mm256_set_epi64x(
                    0x0303_0303_0303_0303,
                    0x0202_0202_0202_0202,
                    0x0101_0101_0101_0101,
                    0,
                ),
            );
            let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
            let set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1));
            _mm256_or_si256(nib, _mm256_and_si256(set, _mm256_set1_epi8(16)))
        }
    }
}

/// Levels plus 128, as unsigned bytes (the `vpdpbusd` operand).
const fn unsigned_levels(levels: [i8; 16]) -> [u8; 16] {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (levels[i] as i16 + 128) as u8;
        i += 1;
    }
    t
}

/// `IQ4_NL`'s and `MXFP4`'s levels plus 128.
const IQ4_NL_UNSIGNED: [u8; 16] = unsigned_levels(IQ4_NL_LEVELS);
const MXFP4_UNSIGNED: [u8; 16] = unsigned_levels(MXFP4_LEVELS);

impl BlockDot for Avx512 {
    fn offset(t: u8) -> i32 {
        match t {
            Q5_0 => 16,
            Q5_1 => 0,
            _ => 128,
        }
    }

    #[inline(always)]
    unsafe fn unsigned<const T: u8>(block: *const u8) -> __m256i {
        // SAFETY (caller): one whole block.
        unsafe { unsigned_avx512::<T>(block) }
    }

    #[inline(always)]
    unsafe fn dot<const R: usize, const T: u8>(u: __m256i, p: &[*const i8; R]) -> [__m256i; R] {
        // SAFETY (caller): as for Avx2.
        unsafe {
            std::array::from_fn(|r| {
                let pv = _mm256_loadu_si256(p[r] as *const __m256i);
                _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, pv)
            })
        }
    }
}

/// The 32 weights of the block at `block` as the AVX-512 kernels multiply them, `u_j = q_j +
/// c` with `c` of [`BlockDot::offset`] (`IQ4_NL`, `MXFP4`: the level + 128, unsigned).
///
/// # Safety
/// AVX-512F/BW/VL; one whole stored block of type `T` at `block`.
#[inline(always)]
pub(super) unsafe fn unsigned_avx512<const T: u8>(block: *const u8) -> __m256i {
    let (qh_at, qs_at) = parts(T);
    // SAFETY (caller): the block's 16 nibble bytes and its 4 bytes of fifth bits.
    unsafe {
        let nib = nibbles(block.add(qs_at));
        if levels(T) {
            let table = match T {
                MXFP4 => MXFP4_UNSIGNED.as_ptr(),
                _ => IQ4_NL_UNSIGNED.as_ptr(),
            };
            let table = _mm_loadu_si128(table as *const __m128i);
            _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(table), nib)
        } else {
            let qh = (block.add(qh_at) as *const u32).read_unaligned();
            _mm256_mask_add_epi8(nib, _cvtu32_mask32(qh), nib, _mm256_set1_epi8(16))
        }
    }
}

/// Lane `k` = the sum of the 8 lanes of `v[k]`.
#[inline(always)]
fn across(v: &[__m256i; STEP]) -> __m256i {
    // SAFETY: AVX2, which every caller's target features include.
    unsafe {
        // [v0 v1 v2 v3 | v0 v1 v2 v3] of the low and high halves' sums, then blocks 4-7.
        let h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
        let h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(h0, h1),
            _mm256_permute2x128_si256::<0x31>(h0, h1),
        )
    }
}

/// Eight f16 in the low halves of eight i32 lanes, widened to f32 (exact, as `f16_to_f32`).
#[inline(always)]
fn widen(v: __m256i) -> __m256 {
    // SAFETY: AVX2 and F16C, which every caller's target features include.
    unsafe {
        let v = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
        let packed = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        _mm256_cvtph_ps(packed)
    }
}

/// The values `u` of the `n` blocks of a step at `blk` (blocks past `n` zero), and their `d`
/// and `m` (`Q5_1`; lanes past `n` and other types' `m` are not used): a whole step of
/// `Q5_0` / `Q5_1` is a group ([`q5_groups`]), any other step the file's blocks.
///
/// # Safety
/// `I`'s features; the step's `n` blocks (of `bb` bytes each) at `blk`.
#[inline(always)]
unsafe fn step<I: BlockDot, const T: u8>(
    blk: *const u8,
    bb: usize,
    n: usize,
) -> ([__m256i; STEP], __m256, __m256) {
    // SAFETY (caller): the step's bytes.
    unsafe {
        if (T == Q5_0 || T == Q5_1) && n == STEP {
            let d = _mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i));
            let m = match T == Q5_1 {
                true => {
                    _mm256_cvtph_ps(_mm_loadu_si128(blk.add(q5_groups::SCALES) as *const __m128i))
                }
                false => _mm256_setzero_ps(),
            };
            let u = q5_groups::unsigned_avx2(blk.add(q5_groups::head_bytes(T == Q5_1)));
            return (u, d, m);
        }
        let mut u = [_mm256_setzero_si256(); STEP];
        for (k, u_k) in u.iter_mut().enumerate().take(n) {
            *u_k = I::unsigned::<T>(blk.add(k * bb));
        }
        if T == MXFP4 {
            // Each block's e8m0 byte as its d (lanes past n 0, unused).
            let d: [f32; STEP] =
                std::array::from_fn(|k| if k < n { e8m0_half(*blk.add(k * bb)) } else { 0.0 });
            return (u, _mm256_loadu_ps(d.as_ptr()), _mm256_setzero_ps());
        }
        // The first 4 bytes of each block: d, then m (Q5_1) or other bytes of the block.
        let heads = heads(blk, bb, n);
        (u, widen(heads), widen(_mm256_srli_epi32::<16>(heads)))
    }
}

/// `out[i] = w_o · x_{r0+i}` for `i < R`, block after block as the portable kernel adds.
///
/// # Safety
/// `I`'s features; `w` holds 32-blocks of type `T`, `o < w.rows`, `r0 + R <=` the rows of
/// `acts`, which `w.quantize` made; `out.len() == R`.
#[inline(always)]
unsafe fn rows<I: BlockDot, const R: usize, const T: u8>(
    w: &KQuantMatrix,
    acts: &KQuantActs,
    o: usize,
    r0: usize,
    out: &mut [f32],
) {
    let (nb, cols, bb) = (w.cols / 32, w.cols, w.block_bytes);
    let offset = _mm256_set1_epi32(I::offset(T));
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    // SAFETY (all pointer arithmetic below): row o's nb blocks of bb bytes start at
    // o · nb · bb in the stored data (checked by from_ggml); each activation row has cols
    // bytes p and nb scales e, sums Σp and (Q8_1) s. A step reads blocks b0 .. b0 + n and
    // the activations of those blocks only (the masked lanes read nothing).
    let row = unsafe { w.data.as_ptr().add(o * nb * bb) };
    let mut y = [0f32; R];
    for b0 in (0..nb).step_by(STEP) {
        let n = STEP.min(nb - b0);
        let blk = unsafe { row.add(b0 * bb) };
        let mut v = [[_mm256_setzero_si256(); STEP]; R];
        let mut dots = |k: usize, u_k: __m256i| {
            let p: [*const i8; R] = std::array::from_fn(|r| unsafe {
                acts.q.as_ptr().add((r0 + r) * cols + (b0 + k) * 32)
            });
            let d = unsafe { I::dot::<R, T>(u_k, &p) };
            for (v_r, d_r) in v.iter_mut().zip(d) {
                v_r[k] = d_r;
            }
        };
        // A whole step (a group of Q5_0 / Q5_1) in straight-line code (n known), as in `outs`.
        let whole = n == STEP;
        let (u, d, m) = unsafe { step::<I, T>(blk, bb, if whole { STEP } else { n }) };
        match whole {
            true => (0..STEP).for_each(|k| dots(k, u[k])),
            false => (0..n).for_each(|k| dots(k, u[k])),
        }
        let live = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lane);
        for r in 0..R {
            let at = (r0 + r) * nb + b0;
            let mut sums = across(&v[r]);
            if I::offset(T) != 0 {
                let psum = unsafe { _mm256_maskload_epi32(acts.psum.as_ptr().add(at), live) };
                sums = _mm256_sub_epi32(sums, _mm256_mullo_epi32(psum, offset));
            }
            let e = unsafe { _mm256_maskload_ps(acts.e.as_ptr().add(at), live) };
            let mut terms = [0f32; STEP];
            let t = _mm256_mul_ps(_mm256_mul_ps(d, e), _mm256_cvtepi32_ps(sums));
            unsafe { _mm256_storeu_ps(terms.as_mut_ptr(), t) };
            if T == Q5_1 {
                let s = unsafe { _mm256_maskload_ps(acts.s.as_ptr().add(at), live) };
                let mut mins = [0f32; STEP];
                unsafe { _mm256_storeu_ps(mins.as_mut_ptr(), _mm256_mul_ps(m, s)) };
                for k in 0..n {
                    y[r] += terms[k];
                    y[r] += mins[k];
                }
            } else {
                for &t in &terms[..n] {
                    y[r] += t;
                }
            }
        }
    }
    out.copy_from_slice(&y);
}

/// Picks the const parameters of [`rows`].
macro_rules! dispatch {
    ($isa:ty, $w:expr, $acts:expr, $o:expr, $r0:expr, $out:expr) => {{
        macro_rules! by_type {
            ($r:literal) => {
                match $w.ty {
                    GgmlType::Q5_0 => rows::<$isa, $r, Q5_0>($w, $acts, $o, $r0, $out),
                    GgmlType::Q5_1 => rows::<$isa, $r, Q5_1>($w, $acts, $o, $r0, $out),
                    GgmlType::MXFP4 => rows::<$isa, $r, MXFP4>($w, $acts, $o, $r0, $out),
                    _ => rows::<$isa, $r, IQ4_NL>($w, $acts, $o, $r0, $out),
                }
            };
        }
        match $out.len() {
            1 => by_type!(1),
            2 => by_type!(2),
            3 => by_type!(3),
            _ => by_type!(4),
        }
    }};
}

/// The AVX2 row kernel: `out[i] = w_o · x_{r0+i}` for `i < out.len() <= 4`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `w` holds `Q5_0`, `Q5_1`, `IQ4_NL` or `MXFP4` blocks, `o <
/// w.rows`, `r0 + out.len() <=` the rows of `acts`, which `w.quantize` made.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile_avx2(
    w: &KQuantMatrix,
    acts: &KQuantActs,
    o: usize,
    r0: usize,
    out: &mut [f32],
) {
    // SAFETY: the caller's contract, passed on.
    unsafe { dispatch!(Avx2, w, acts, o, r0, out) }
}

/// The AVX-512 row kernel, as [`tile_avx2`].
///
/// # Safety
/// As [`tile_avx2`], and the CPU must have AVX-512F/BW/VL and VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn tile_avx512(
    w: &KQuantMatrix,
    acts: &KQuantActs,
    o: usize,
    r0: usize,
    out: &mut [f32],
) {
    // SAFETY: the caller's contract, passed on.
    unsafe { dispatch!(Avx512, w, acts, o, r0, out) }
}

/// Weight rows the decoding kernels ([`outputs_avx2`], [`outputs_avx512`]) take per pass.
pub(super) const OUTPUTS: usize = 4;
// `outs` keeps the four rows' sums in the four lanes of one 128-bit vector.
const _: () = assert!(OUTPUTS == 4);
/// How far ahead (in weight rows) the decoding kernels prefetch the rows they will take.
const PREFETCH_ROWS: usize = 16;

/// `out[i] = w_{o0+i} · x_0` for `i <` [`OUTPUTS`]: four weight rows against the one activation
/// row of a decoding step, each row's f32 steps those of [`rows`] (so the same bits); the rows'
/// chains of block-after-block additions run side by side, one lane each, instead of each
/// waiting on its own latency.
///
/// # Safety
/// `I`'s features; `w` holds 32-blocks of type `T`, `o0 + OUTPUTS <= w.rows`, `acts` (one row
/// at least) made by `w.quantize`; `out.len() == OUTPUTS`.
#[inline(always)]
unsafe fn outs<I: BlockDot, const T: u8>(
    w: &KQuantMatrix,
    acts: &KQuantActs,
    o0: usize,
    out: &mut [f32],
) {
    let (nb, bb) = (w.cols / 32, w.block_bytes);
    // The rows PREFETCH_ROWS further on: four interleaved rows hide the stream from the
    // hardware prefetcher.
    let ahead = PREFETCH_ROWS * nb * bb;
    let offset = _mm256_set1_epi32(I::offset(T));
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    // SAFETY (all pointer arithmetic below): rows o0 .. o0 + O of nb blocks of bb bytes
    // (checked by from_ggml); activation row 0 has 32 nb bytes p and nb scales e, sums Σp
    // and (Q8_1) s. A step reads blocks b0 .. b0 + n and those blocks' activations only.
    // The stored bytes once: each dereference of `w.data` is a call through its owner.
    let stored: &[u8] = &w.data;
    let row: [*const u8; OUTPUTS] =
        std::array::from_fn(|i| unsafe { stored.as_ptr().add((o0 + i) * nb * bb) });
    // Lane i: row i's sum.
    let mut y = _mm_setzero_ps();
    for b0 in (0..nb).step_by(STEP) {
        let n = STEP.min(nb - b0);
        let live = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lane);
        let e = unsafe { _mm256_maskload_ps(acts.e.as_ptr().add(b0), live) };
        let psum = unsafe { _mm256_maskload_epi32(acts.psum.as_ptr().add(b0), live) };
        // s is only kept (and read) for Q5_1's Q8_1 activations.
        let s = if T == Q5_1 {
            unsafe { _mm256_maskload_ps(acts.s.as_ptr().add(b0), live) }
        } else {
            _mm256_setzero_ps()
        };
        let mut terms = [_mm256_setzero_ps(); OUTPUTS];
        let mut mins = [_mm256_setzero_ps(); OUTPUTS];
        for i in 0..OUTPUTS {
            let blk = unsafe { row[i].add(b0 * bb) };
            for line in (0..n * bb).step_by(64) {
                // A hint only: it never faults, whatever the address (past the weights on
                // the last rows, which `wrapping_add` allows).
                _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(ahead + line) as *const i8);
            }
            let p0 = unsafe { acts.q.as_ptr().add(b0 * 32) };
            let (v, d, m) = if n == STEP {
                // A whole step (a group of Q5_0 / Q5_1): eight blocks' values and dots in
                // straight-line code (n known; a loop to n kept the values in memory, 9% slower).
                let (u, d, m) = unsafe { step::<I, T>(blk, bb, STEP) };
                let dot = |k: usize| unsafe { I::dot::<1, T>(u[k], &[p0.add(32 * k)]) }[0];
                (std::array::from_fn(dot), d, m)
            } else {
                let (u, d, m) = unsafe { step::<I, T>(blk, bb, n) };
                let mut v = [_mm256_setzero_si256(); STEP];
                for (k, v_k) in v.iter_mut().enumerate().take(n) {
                    *v_k = unsafe { I::dot::<1, T>(u[k], &[p0.add(32 * k)]) }[0];
                }
                (v, d, m)
            };
            let mut sums = across(&v);
            if I::offset(T) != 0 {
                sums = _mm256_sub_epi32(sums, _mm256_mullo_epi32(psum, offset));
            }
            terms[i] = _mm256_mul_ps(_mm256_mul_ps(d, e), _mm256_cvtepi32_ps(sums));
            if T == Q5_1 {
                mins[i] = _mm256_mul_ps(m, s);
            }
        }
        // The same additions in the same order as one row at a time (y_i += t_ik, then
        // Q5_1's y_i += m_ik, block after block), the terms transposed in registers.
        let (t, m) = (by_block(terms), by_block(mins));
        for k in 0..n {
            y = _mm_add_ps(y, t[k]);
            if T == Q5_1 {
                y = _mm_add_ps(y, m[k]);
            }
        }
    }
    let out: &mut [f32; OUTPUTS] = out.try_into().expect("four outputs a pass");
    // SAFETY: `out` holds OUTPUTS = 4 floats.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), y) };
}

/// The 4 × 8 terms `t[i]` (row i, block k in lane k) by block: `[t_0k, t_1k, t_2k, t_3k]` for
/// k < 8 (a transpose in registers).
#[inline(always)]
fn by_block(t: [__m256; OUTPUTS]) -> [__m128; STEP] {
    // SAFETY: AVX, which every caller's target features include.
    unsafe {
        // [t0k0 t1k0 t0k1 t1k1 | k4 k5], [k2 k3 | k6 k7] of rows 0, 1; the same of rows 2, 3.
        let (a, b) = (_mm256_unpacklo_ps(t[0], t[1]), _mm256_unpackhi_ps(t[0], t[1]));
        let (c, d) = (_mm256_unpacklo_ps(t[2], t[3]), _mm256_unpackhi_ps(t[2], t[3]));
        let k04 = _mm256_shuffle_ps::<0b01_00_01_00>(a, c);
        let k15 = _mm256_shuffle_ps::<0b11_10_11_10>(a, c);
        let k26 = _mm256_shuffle_ps::<0b01_00_01_00>(b, d);
        let k37 = _mm256_shuffle_ps::<0b11_10_11_10>(b, d);
        [
            _mm256_castps256_ps128(k04),
            _mm256_castps256_ps128(k15),
            _mm256_castps256_ps128(k26),
            _mm256_castps256_ps128(k37),
            _mm256_extractf128_ps::<1>(k04),
            _mm256_extractf128_ps::<1>(k15),
            _mm256_extractf128_ps::<1>(k26),
            _mm256_extractf128_ps::<1>(k37),
        ]
    }
}

/// Picks the block type of [`outs`].
macro_rules! dispatch_outputs {
    ($isa:ty, $w:expr, $acts:expr, $o0:expr, $out:expr) => {{
        match $w.ty {
            GgmlType::Q5_0 => outs::<$isa, Q5_0>($w, $acts, $o0, $out),
            GgmlType::Q5_1 => outs::<$isa, Q5_1>($w, $acts, $o0, $out),
            GgmlType::MXFP4 => outs::<$isa, MXFP4>($w, $acts, $o0, $out),
            _ => outs::<$isa, IQ4_NL>($w, $acts, $o0, $out),
        }
    }};
}

/// The AVX2 decoding kernel: `out[i] = w_{o0+i} · x_0` for `i < OUTPUTS`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `w` holds `Q5_0`, `Q5_1`, `IQ4_NL` or `MXFP4`
/// blocks, `o0 + OUTPUTS <= w.rows`, `out.len() == OUTPUTS`, `acts` (a row at least) made by
/// `w.quantize`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn outputs_avx2(w: &KQuantMatrix, acts: &KQuantActs, o0: usize, out: &mut [f32]) {
    // SAFETY: the caller's contract, passed on.
    unsafe { dispatch_outputs!(Avx2, w, acts, o0, out) }
}

/// The AVX-512 decoding kernel, as [`outputs_avx2`].
///
/// # Safety
/// As [`outputs_avx2`], and the CPU must have AVX-512F/BW/VL and VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn outputs_avx512(
    w: &KQuantMatrix,
    acts: &KQuantActs,
    o0: usize,
    out: &mut [f32],
) {
    // SAFETY: the caller's contract, passed on.
    unsafe { dispatch_outputs!(Avx512, w, acts, o0, out) }
}
