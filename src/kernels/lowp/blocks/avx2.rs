//! The AVX2 (+ FMA, F16C) kernel of [`BlockMatrix`]: the portable kernel's sums, eight blocks
//! per step, one block per f32 lane.
//!
//! ```text
//! for each step of 8 blocks b = 8g .. 8g+7 (lane l = b mod 8):
//!     I_b     integer sums of the block (exact):  vpmaddubsw (u8 × i8 pairs -> i16),
//!             vpmaddwd by 1 (-> 8 i32), then vphaddd across the blocks' vectors
//!     lane_l += (d_b e_b) I_b + c_b f_b           (Q8_0: (d_b e_b) I_b)
//! the last nb mod 8 blocks one at a time into their lanes, then the lanes by halving
//! ```
//!
//! The f32 steps are those of `row_product_portable` in the same order, so the two kernels give
//! the same bits. 4-bit weights are the unsigned operand of `vpmaddubsw` against the signed
//! activations (pair sums at most 2 · 15 · 127); for `Q8_0` the stored activations `p + 128`
//! are turned back into `p` and multiplied as llama.cpp's AVX2 `ggml_vec_dot_q8_0_q8_0` does,
//! `|q| × sign(p, q)` (pair sums at most 2 · 128 · 127 < 2^15, so `vpmaddubsw` never saturates).

use super::{pair_order, sum_lanes, BlockActs, BlockKind, BlockMatrix, BLOCK};
use std::arch::x86_64::*;

/// Blocks per step: one f32 lane each.
const STEP: usize = 8;

/// `out[i] = w_o · x_{r0+i}` for `i < out.len() <= 4`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `o < w.rows`, `r0 + out.len() <=` the rows of
/// `acts`, which `w.quantize` made.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile(w: &BlockMatrix, acts: &BlockActs, o: usize, r0: usize, out: &mut [f32]) {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        match out.len() {
            1 => rows::<1>(w, acts, o, r0, out),
            2 => rows::<2>(w, acts, o, r0, out),
            3 => rows::<3>(w, acts, o, r0, out),
            _ => rows::<4>(w, acts, o, r0, out),
        }
    }
}

/// [`tile`] for `R` activation rows.
///
/// # Safety
/// As [`tile`], with `out.len() == R`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows<const R: usize>(
    w: &BlockMatrix,
    acts: &BlockActs,
    o: usize,
    r0: usize,
    out: &mut [f32],
) {
    let (nb, cols, kind) = (w.nb, w.cols, w.kind);
    let (bb, q_at) = (kind.block_bytes(), kind.scale_bytes());
    let nibbles = kind.nibbles();
    // SAFETY (all pointer arithmetic below): `w.blocks` holds rows · nb blocks of bb bytes
    // (checked by in_place), so row o's nb blocks start at o · nb · bb; each activation row
    // has `cols = 32 nb` bytes and nb scales e and f. A step g < nb / 8 reads blocks
    // 8g .. 8g+8 (`heads` 4 bytes from each block's start), bytes 256g .. 256g+256 of each
    // activation row and scales 8g .. 8g+8.
    let row = unsafe { w.blocks.as_ptr().add(o * nb * bb) };
    let xq: [*const u8; R] =
        std::array::from_fn(|i| unsafe { acts.q.as_ptr().add((r0 + i) * cols) });
    let e: [*const f32; R] = std::array::from_fn(|i| unsafe { acts.e.as_ptr().add((r0 + i) * nb) });
    let f: [*const f32; R] = std::array::from_fn(|i| unsafe { acts.f.as_ptr().add((r0 + i) * nb) });
    let mut lanes = [_mm256_setzero_ps(); R];
    let steps = nb / STEP;
    for g in 0..steps {
        let blk = unsafe { row.add(g * STEP * bb) };
        // The first 4 bytes of each of the 8 blocks: d (f16), then m (Q4_1) or weights.
        let heads = unsafe { heads(blk, bb, STEP) };
        let d = _mm256_cvtph_ps(halves::<0>(heads));
        let c = match kind {
            BlockKind::Q4_0 => _mm256_mul_ps(_mm256_set1_ps(-8.0), d),
            BlockKind::Q4_1 => _mm256_cvtph_ps(halves::<2>(heads)),
            BlockKind::Q8_0 => _mm256_setzero_ps(),
        };
        let at = g * STEP * BLOCK;
        let isums = if nibbles {
            unsafe { nibble_sums::<R>(blk, bb, q_at, &xq, at) }
        } else {
            unsafe { byte_sums::<R>(blk, bb, q_at, &xq, at) }
        };
        for r in 0..R {
            let de = _mm256_mul_ps(d, unsafe { _mm256_loadu_ps(e[r].add(g * STEP)) });
            let mut term = _mm256_mul_ps(de, _mm256_cvtepi32_ps(isums[r]));
            if nibbles {
                let cf = _mm256_mul_ps(c, unsafe { _mm256_loadu_ps(f[r].add(g * STEP)) });
                term = _mm256_add_ps(term, cf);
            }
            lanes[r] = _mm256_add_ps(lanes[r], term);
        }
    }
    for r in 0..R {
        let mut l = [0f32; 8];
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), lanes[r]) };
        let ar = (r0 + r) * nb;
        for b in steps * STEP..nb {
            // SAFETY: block b < nb of row o; its activation bytes lie in row r0 + r.
            let qs = unsafe { row.add(b * bb + q_at) };
            let de = w.d(o, b) * acts.e[ar + b];
            l[b % 8] += if nibbles {
                let (x_lo, x_hi) = (pair_order(b, 0, nb), pair_order(b, 16, nb));
                let isum = unsafe { nibble_block_sum(qs, xq[r].add(x_lo), xq[r].add(x_hi)) };
                de * isum as f32 + w.c(o, b) * acts.f[ar + b]
            } else {
                let isum = unsafe { byte_block_sum(qs, xq[r].add(b * BLOCK)) };
                de * isum as f32
            };
        }
        out[r] = sum_lanes(l);
    }
}

/// The first 4 bytes of blocks `k < n` of the blocks of `bb` bytes at `blk` (d, then m or
/// weights), one i32 lane each, 0 in lanes `n ..`: plain loads, where a gather costs more
/// (AMD Zen: 16% of the Q5_0 decoding kernel) than the blocks' sums. Shared with the
/// `Q5_0`/`Q5_1`/`IQ4_NL` row kernels.
///
/// # Safety
/// AVX2; `n <= 8` whole blocks at `blk`.
#[inline]
#[target_feature(enable = "avx2")]
pub(in crate::kernels::lowp) unsafe fn heads(blk: *const u8, bb: usize, n: usize) -> __m256i {
    debug_assert!(n <= STEP);
    // SAFETY (caller): block k < n starts at k · bb and holds at least 4 bytes.
    let head = |k: usize| unsafe { (blk.add(k * bb) as *const i32).read_unaligned() };
    if n == STEP {
        // The common step, without a test per lane.
        return _mm256_setr_epi32(
            head(0),
            head(1),
            head(2),
            head(3),
            head(4),
            head(5),
            head(6),
            head(7),
        );
    }
    let mut lanes = [0i32; STEP];
    for (k, lane) in lanes.iter_mut().enumerate().take(n) {
        *lane = head(k);
    }
    // SAFETY: `lanes` holds 8 i32.
    unsafe { _mm256_loadu_si256(lanes.as_ptr() as *const __m256i) }
}

/// The f16 at byte `AT` (0 or 2) of each of the 8 i32 lanes of `heads`, as 8 u16.
#[inline]
#[target_feature(enable = "avx2")]
fn halves<const AT: i8>(heads: __m256i) -> __m128i {
    let a = AT;
    let pick = _mm256_setr_epi8(
        a,
        a + 1,
        a + 4,
        a + 5,
        a + 8,
        a + 9,
        a + 12,
        a + 13,
        -1,
        -1,
        -1,
        -1,
        -1,
        -1,
        -1,
        -1,
        a,
        a + 1,
        a + 4,
        a + 5,
        a + 8,
        a + 9,
        a + 12,
        a + 13,
        -1,
        -1,
        -1,
        -1,
        -1,
        -1,
        -1,
        -1,
    );
    let packed = _mm256_shuffle_epi8(heads, pick);
    _mm256_castsi256_si128(_mm256_permute4x64_epi64::<0b00_00_10_00>(packed))
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

/// `I_b` of 8 blocks of 4-bit weights (pairs stored `[low b, low b+1, high b, high b+1]`
/// among the activations, see `pair_order`), lane `l` for block `8g + l`.
///
/// # Safety
/// AVX2; the 8 blocks from `blk` (stride `bb`, weights at `q_at`) and 256 activation bytes
/// from `at` of each row must be readable.
// k numbers the blocks in the address arithmetic as well as in `v`.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn nibble_sums<const R: usize>(
    blk: *const u8,
    bb: usize,
    q_at: usize,
    xq: &[*const u8; R],
    at: usize,
) -> [__m256i; R] {
    let mask = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    let mut v = [[_mm256_setzero_si256(); 4]; R];
    for k in 0..4 {
        // SAFETY (caller): blocks 2k, 2k+1 and activation bytes at + 64k .. at + 64k + 64.
        let raw = unsafe {
            let b0 = blk.add(2 * k * bb + q_at);
            _mm256_loadu2_m128i(b0.add(bb) as *const __m128i, b0 as *const __m128i)
        };
        let lo = _mm256_and_si256(raw, mask);
        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), mask);
        for r in 0..R {
            let (x0, x1) = unsafe {
                let x = xq[r].add(at + 64 * k);
                (
                    _mm256_loadu_si256(x as *const __m256i),
                    _mm256_loadu_si256(x.add(32) as *const __m256i),
                )
            };
            let pairs =
                _mm256_add_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_maddubs_epi16(hi, x1));
            // Lanes 0-3: block 2k, lanes 4-7: block 2k+1.
            v[r][k] = _mm256_madd_epi16(pairs, ones);
        }
    }
    // hadd(hadd(v0, v1), hadd(v2, v3)) holds blocks [0 2 4 6 | 1 3 5 7].
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    std::array::from_fn(|r| {
        let [v0, v1, v2, v3] = v[r];
        let h = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
        _mm256_permutevar8x32_epi32(h, order)
    })
}

/// `Σ q_j p_j` of one `Q8_0` block's 32 signed weights against 32 activation bytes `p + 128`:
/// 8 i32 partial sums.
#[inline]
#[target_feature(enable = "avx2")]
fn byte_products(wq: __m256i, shifted: __m256i) -> __m256i {
    let p = _mm256_xor_si256(shifted, _mm256_set1_epi8(-128));
    let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(wq), _mm256_sign_epi8(p, wq));
    _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
}

/// `I_b` of 8 `Q8_0` blocks, lane `l` for block `8g + l`.
///
/// # Safety
/// As [`nibble_sums`].
// k numbers the blocks in the address arithmetic as well as in `v`.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn byte_sums<const R: usize>(
    blk: *const u8,
    bb: usize,
    q_at: usize,
    xq: &[*const u8; R],
    at: usize,
) -> [__m256i; R] {
    let mut v = [[_mm256_setzero_si256(); 8]; R];
    for k in 0..8 {
        // SAFETY (caller): block k and activation bytes at + 32k .. at + 32k + 32.
        let wq = unsafe { _mm256_loadu_si256(blk.add(k * bb + q_at) as *const __m256i) };
        for r in 0..R {
            let x = unsafe { _mm256_loadu_si256(xq[r].add(at + 32 * k) as *const __m256i) };
            v[r][k] = byte_products(wq, x);
        }
    }
    std::array::from_fn(|r| {
        let v = &v[r];
        // Lanes [b0 b1 b2 b3 | b0 b1 b2 b3] of partial sums, for blocks 0-3 and 4-7.
        let h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
        let h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(h0, h1),
            _mm256_permute2x128_si256::<0x31>(h0, h1),
        )
    })
}

/// `I_b` of one block of 4-bit weights (16 bytes at `qs`) against its 16 low-nibble
/// activations at `x_lo` and 16 high-nibble ones at `x_hi`.
///
/// # Safety
/// AVX2; 16 bytes readable at each pointer.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn nibble_block_sum(qs: *const u8, x_lo: *const u8, x_hi: *const u8) -> i32 {
    let mask = _mm_set1_epi8(0x0f);
    let (raw, xl, xh) = unsafe {
        (
            _mm_loadu_si128(qs as *const __m128i),
            _mm_loadu_si128(x_lo as *const __m128i),
            _mm_loadu_si128(x_hi as *const __m128i),
        )
    };
    let lo = _mm_and_si128(raw, mask);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(raw), mask);
    let pairs = _mm_add_epi16(_mm_maddubs_epi16(lo, xl), _mm_maddubs_epi16(hi, xh));
    let s = _mm_madd_epi16(pairs, _mm_set1_epi16(1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// `I_b` of one `Q8_0` block (32 bytes at `qs`) against 32 activation bytes at `x`.
///
/// # Safety
/// AVX2; 32 bytes readable at each pointer.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn byte_block_sum(qs: *const u8, x: *const u8) -> i32 {
    let (wq, xv) = unsafe {
        (
            _mm256_loadu_si256(qs as *const __m256i),
            _mm256_loadu_si256(x as *const __m256i),
        )
    };
    hsum(byte_products(wq, xv))
}

/// The last `nb mod 8` blocks of a decoding step's activations padded with zeros to a step
/// of 8, and room for as many last blocks of `O` weight rows (see [`outputs`]). Activations
/// of 4-bit weights stay in pair order: a last unpaired block (odd nb), stored naturally,
/// goes to the pair layout with a zero partner.
pub(super) struct Padded<const O: usize> {
    x: [u8; STEP * BLOCK],
    e: [f32; STEP],
    f: [f32; STEP],
    /// At most 8 blocks of 34 bytes (Q8_0, the largest) per row; zeros past the copied ones.
    w: [[u8; STEP * 34]; O],
}

impl<const O: usize> Padded<O> {
    /// The padded tail of activation row 0 of `acts` (made by `w.quantize`).
    pub(super) fn new(w: &BlockMatrix, acts: &BlockActs) -> Self {
        let (nb, kind) = (w.nb, w.kind);
        let b0 = nb / STEP * STEP;
        let mut pad = Padded {
            x: [0u8; STEP * BLOCK],
            e: [0f32; STEP],
            f: [0f32; STEP],
            w: [[0u8; STEP * 34]; O],
        };
        for b in b0..nb {
            for j in 0..BLOCK {
                let (from, to) = if kind.nibbles() {
                    (pair_order(b, j, nb), pair_order(b - b0, j, STEP))
                } else {
                    (b * BLOCK + j, (b - b0) * BLOCK + j)
                };
                pad.x[to] = acts.q[from];
            }
        }
        pad.e[..nb - b0].copy_from_slice(&acts.e[b0..nb]);
        pad.f[..nb - b0].copy_from_slice(&acts.f[b0..nb]);
        pad
    }
}

/// `out[i] = w_{o0+i} · x_0` for `i < O`: weight rows `o0 .. o0 + O` against activation row
/// 0 (a decoding step), each row's f32 steps those of `row_product_portable` (the same bits):
/// the activations of a step are loaded once for the `O` rows, the last `nb mod 8` blocks run
/// as one more step over zero-padded copies (`pad`; a padded block adds `+0` to its lane,
/// which leaves it as it is), and four rows' lanes are reduced together in `sum_lanes`'
/// order. The rows `ahead` bytes further on are prefetched.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `o0 + O <= w.rows`, `out.len() == O`, and `acts`
/// (one row at least) made by `w.quantize`, `pad` from them.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn outputs<const O: usize>(
    w: &BlockMatrix,
    acts: &BlockActs,
    pad: &mut Padded<O>,
    o0: usize,
    out: &mut [f32],
    ahead: usize,
) {
    let (nb, kind) = (w.nb, w.kind);
    let bb = kind.block_bytes();
    // SAFETY (pointer arithmetic): rows o0 .. o0 + O hold nb blocks of bb bytes each; step g
    // of the full steps reads blocks 8g .. 8g + 8 of each, bytes 256g .. 256g + 256 and
    // terms 8g .. 8g + 8 of activation row 0.
    // The stored bytes once: each dereference of `w.blocks` is a call through its owner.
    let stored: &[u8] = &w.blocks;
    let rows: [*const u8; O] =
        std::array::from_fn(|i| unsafe { stored.as_ptr().add((o0 + i) * nb * bb) });
    let (xq, e, f) = (acts.q.as_ptr(), acts.e.as_ptr(), acts.f.as_ptr());
    let mut lanes = [_mm256_setzero_ps(); O];
    let steps = nb / STEP;
    for g in 0..steps {
        let blks: [*const u8; O] = std::array::from_fn(|i| unsafe { rows[i].add(g * STEP * bb) });
        let at = g * STEP * BLOCK;
        // SAFETY: as above.
        unsafe {
            step::<O>(
                kind,
                &blks,
                xq.add(at),
                e.add(g * STEP),
                f.add(g * STEP),
                &mut lanes,
                ahead,
            )
        };
    }
    let tail = nb - steps * STEP;
    if tail > 0 {
        let b0 = steps * STEP;
        for (i, padded) in pad.w.iter_mut().enumerate() {
            let from = ((o0 + i) * nb + b0) * bb;
            padded[..tail * bb].copy_from_slice(&stored[from..from + tail * bb]);
        }
        let blks: [*const u8; O] = std::array::from_fn(|i| pad.w[i].as_ptr());
        // SAFETY: the padded copies hold 8 blocks and 256 activation bytes, 8 terms each.
        unsafe {
            step::<O>(
                kind,
                &blks,
                pad.x.as_ptr(),
                pad.e.as_ptr(),
                pad.f.as_ptr(),
                &mut lanes,
                0,
            )
        };
    }
    if O == 4 {
        let sums = sum_lanes4([lanes[0], lanes[1], lanes[2], lanes[3]]);
        // SAFETY: out holds O = 4 floats.
        unsafe { _mm_storeu_ps(out.as_mut_ptr(), sums) };
    } else {
        for (v, lane) in out.iter_mut().zip(lanes) {
            let mut l = [0f32; 8];
            // SAFETY: l holds 8 floats.
            unsafe { _mm256_storeu_ps(l.as_mut_ptr(), lane) };
            *v = sum_lanes(l);
        }
    }
}

/// One step of 8 blocks of `O` weight rows (`blks[i]`, stride `kind.block_bytes()`) against
/// the 256 activation bytes at `x` and the 8 scales `e`, `f`: `lanes[i] += (d e) I + c f`
/// (Q8_0: `(d e) I`), the order of `rows`; the same blocks `ahead` bytes further on are
/// prefetched (none when 0).
///
/// # Safety
/// AVX2, FMA and F16C; 8 whole blocks at each `blks[i]`, 256 bytes at `x`, 8 floats at `e`
/// and `f`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn step<const O: usize>(
    kind: BlockKind,
    blks: &[*const u8; O],
    x: *const u8,
    e: *const f32,
    f: *const f32,
    lanes: &mut [__m256; O],
    ahead: usize,
) {
    let (bb, q_at) = (kind.block_bytes(), kind.scale_bytes());
    if ahead > 0 {
        for blk in blks {
            for line in (0..STEP * bb).step_by(64) {
                // A hint only: it never faults and reads nothing into the program, whatever
                // the address (`wrapping_add` may point past the weights on the last rows).
                _mm_prefetch::<_MM_HINT_T1>(blk.wrapping_add(ahead + line) as *const i8);
            }
        }
    }
    let nibbles = kind.nibbles();
    // SAFETY (caller): the blocks, activation bytes and scales of the step.
    unsafe {
        let isums = if nibbles {
            nibble_sums_rows::<O>(blks, bb, q_at, x)
        } else {
            byte_sums_rows::<O>(blks, bb, q_at, x)
        };
        let (ev, fv) = (_mm256_loadu_ps(e), _mm256_loadu_ps(f));
        for i in 0..O {
            let heads = heads(blks[i], bb, STEP);
            let d = _mm256_cvtph_ps(halves::<0>(heads));
            let de = _mm256_mul_ps(d, ev);
            let mut term = _mm256_mul_ps(de, _mm256_cvtepi32_ps(isums[i]));
            if nibbles {
                let c = match kind {
                    BlockKind::Q4_0 => _mm256_mul_ps(_mm256_set1_ps(-8.0), d),
                    _ => _mm256_cvtph_ps(halves::<2>(heads)),
                };
                term = _mm256_add_ps(term, _mm256_mul_ps(c, fv));
            }
            lanes[i] = _mm256_add_ps(lanes[i], term);
        }
    }
}

/// [`sum_lanes`] of four rows' 8 lanes at once, in its order: `(l_i + l_{i+4})`, then
/// `(s_0 + s_2) + (s_1 + s_3)`.
#[inline]
#[target_feature(enable = "avx2")]
fn sum_lanes4(v: [__m256; 4]) -> __m128 {
    let s: [__m128; 4] =
        std::array::from_fn(|i| _mm_add_ps(_mm256_castps256_ps128(v[i]), _mm256_extractf128_ps::<1>(v[i])));
    // [a0 b0 a1 b1] + [a2 b2 a3 b3] = [a: s0+s2, b: s0+s2, a: s1+s3, b: s1+s3]; c, d alike.
    let ab = _mm_add_ps(_mm_unpacklo_ps(s[0], s[1]), _mm_unpackhi_ps(s[0], s[1]));
    let cd = _mm_add_ps(_mm_unpacklo_ps(s[2], s[3]), _mm_unpackhi_ps(s[2], s[3]));
    _mm_add_ps(_mm_movelh_ps(ab, cd), _mm_movehl_ps(cd, ab))
}

/// [`nibble_sums`] of `O` weight rows against one activation row: `I_b` of 8 blocks of 4-bit
/// weights at each `blks[i]`, the 256 activation bytes at `x` (pair order) loaded once.
///
/// # Safety
/// AVX2; 8 blocks from each `blks[i]` (stride `bb`, weights at `q_at`), 256 bytes at `x`.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn nibble_sums_rows<const O: usize>(
    blks: &[*const u8; O],
    bb: usize,
    q_at: usize,
    x: *const u8,
) -> [__m256i; O] {
    let mask = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    let mut v = [[_mm256_setzero_si256(); 4]; O];
    for k in 0..4 {
        // SAFETY (caller): activation bytes 64k .. 64k + 64, blocks 2k, 2k+1 of each row.
        let (x0, x1) = unsafe {
            (
                _mm256_loadu_si256(x.add(64 * k) as *const __m256i),
                _mm256_loadu_si256(x.add(64 * k + 32) as *const __m256i),
            )
        };
        for i in 0..O {
            let raw = unsafe {
                let b0 = blks[i].add(2 * k * bb + q_at);
                _mm256_loadu2_m128i(b0.add(bb) as *const __m128i, b0 as *const __m128i)
            };
            let lo = _mm256_and_si256(raw, mask);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), mask);
            let pairs =
                _mm256_add_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_maddubs_epi16(hi, x1));
            v[i][k] = _mm256_madd_epi16(pairs, ones);
        }
    }
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    std::array::from_fn(|i| {
        let [v0, v1, v2, v3] = v[i];
        let h = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
        _mm256_permutevar8x32_epi32(h, order)
    })
}

/// [`byte_sums`] of `O` weight rows against one activation row (256 bytes at `x`, loaded
/// once).
///
/// # Safety
/// As [`nibble_sums_rows`].
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn byte_sums_rows<const O: usize>(
    blks: &[*const u8; O],
    bb: usize,
    q_at: usize,
    x: *const u8,
) -> [__m256i; O] {
    let mut v = [[_mm256_setzero_si256(); 8]; O];
    for k in 0..8 {
        // SAFETY (caller): activation bytes 32k .. 32k + 32, block k of each row.
        let xv = unsafe { _mm256_loadu_si256(x.add(32 * k) as *const __m256i) };
        for i in 0..O {
            let wq = unsafe { _mm256_loadu_si256(blks[i].add(k * bb + q_at) as *const __m256i) };
            v[i][k] = byte_products(wq, xv);
        }
    }
    std::array::from_fn(|i| {
        let v = &v[i];
        let h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
        let h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(h0, h1),
            _mm256_permute2x128_si256::<0x31>(h0, h1),
        )
    })
}
