//! The AVX-512 (VNNI) kernels of [`BlockMatrix`]: two blocks per step, 64 products per
//! `vpdpbusd`.
//!
//! ```text
//! for each pair of blocks (2p, 2p+1), alternately into accumulator set 0 and 1:
//!     I          16 i32 lanes: vpdpbusd of the 64 weight bytes and 64 activation bytes
//!     acc     += float(I) · (d spread over the lanes · e spread over the lanes)
//!     acc_c   += [c_2p c_2p+1] · [f_2p f_2p+1]
//! y = reduce(acc_0 + acc_1) + (acc_c,0 + acc_c,1)[0] + [1]
//! ```
//!
//! [`scaled_sums`] takes one weight row against up to four activation rows (prefill tiles);
//! [`outputs`] takes up to four weight rows against the one activation row of a decoding
//! step, sharing its loads, with each row's float steps those of `scaled_sums::<1>` (the same
//! bits).

use super::{BlockActs, BlockKind, BlockMatrix, BLOCK};
use std::arch::x86_64::*;

/// The weights of blocks `2p`, `2p + 1` of one stored row: the 64 bytes `vpdpbusd` takes
/// (4-bit: `[low 2p, low 2p+1, high 2p, high 2p+1]` nibbles; Q8_0: the two blocks' bytes),
/// `d` spread over the 16 lanes (`idx`, see `lane_block`), and `[c_2p c_2p+1 . .]` (lanes
/// 2, 3 meet `f`'s zeros).
///
/// Inlined into its callers, which enable the features (a `target_feature` function of its
/// own was not inlined: a call per pair of blocks and row, a third of a decoding step).
///
/// # Safety
/// AVX-512F/BW/VL; blocks `2p`, `2p + 1` of `row` (blocks of `kind`) and, for Q8_0, offsets
/// `2p`, `2p + 1` of `q8_offsets` readable.
#[inline(always)]
unsafe fn pair_weights(
    kind: BlockKind,
    row: *const u8,
    q8_offsets: *const f32,
    p: usize,
    idx: __m512i,
) -> (__m512i, __m512, __m128) {
    let (bb, q_at) = (kind.block_bytes(), kind.scale_bytes());
    // SAFETY (caller): blocks 2p and 2p+1 (bb bytes each from (2p)·bb) and Q8_0's two
    // offsets from 2p are inside their rows.
    unsafe {
        let b0 = row.add(2 * p * bb);
        let b1 = b0.add(bb);
        let wv = if kind.nibbles() {
            let raw = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128(b0.add(q_at) as *const __m128i)),
                _mm_loadu_si128(b1.add(q_at) as *const __m128i),
                1,
            );
            let mask = _mm256_set1_epi8(0x0f);
            let lo = _mm256_and_si256(raw, mask);
            let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
            _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
        } else {
            _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256(b0.add(q_at) as *const __m256i)),
                _mm256_loadu_si256(b1.add(q_at) as *const __m256i),
                1,
            )
        };
        let heads = _mm_setr_epi32(
            (b0 as *const i32).read_unaligned(),
            (b1 as *const i32).read_unaligned(),
            0,
            0,
        );
        // [d0 x0 d1 x1 0 ...] (x = m for Q4_1): f16 -> f32 is exact, as f16_to_f32.
        let dx = _mm512_cvtph_ps(_mm256_castsi128_si256(heads));
        let dw = _mm512_permutexvar_ps(idx, dx);
        let dx = _mm512_castps512_ps128(dx);
        let c2 = match kind {
            BlockKind::Q4_0 => {
                _mm_mul_ps(_mm_set1_ps(-8.0), _mm_shuffle_ps::<0b00_00_10_00>(dx, dx))
            }
            BlockKind::Q4_1 => _mm_shuffle_ps::<0b01_01_11_01>(dx, dx),
            BlockKind::Q8_0 => {
                _mm_castsi128_ps(_mm_loadl_epi64(q8_offsets.add(2 * p) as *const __m128i))
            }
        };
        (wv, dw, c2)
    }
}

/// Lane patterns of `d0`, `d1` of a pair: `[d0 x0 d1 x1]` -> 16 lanes (see `lane_block`).
#[inline]
#[target_feature(enable = "avx512f")]
fn lane_index(nibbles: bool) -> __m512i {
    if nibbles {
        _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2)
    } else {
        _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2)
    }
}

/// `Σ_{b < 2·⌊nb/2⌋} (d_b e_b I_b + c_b f_b)` from the two sets of accumulators of a row.
#[inline]
#[target_feature(enable = "avx512f")]
fn finish(acc: [__m512; 2], acc_c: [__m128; 2]) -> f32 {
    let mut cf = [0f32; 4];
    // SAFETY: cf holds 4 floats.
    unsafe { _mm_storeu_ps(cf.as_mut_ptr(), _mm_add_ps(acc_c[0], acc_c[1])) };
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1])) + (cf[0] + cf[1])
}

/// `out[i] = Σ_{b < 2·⌊nb/2⌋} (d_b e_b I_b + c_b f_b)` for activation rows `r0 + i`,
/// `i < R`.
///
/// # Safety
/// The CPU must have AVX-512F/BW/VL and VNNI; `o < w.rows` and `r0 + R <=` the rows of
/// `acts`, which `w.quantize` made.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn scaled_sums<const R: usize>(
    w: &BlockMatrix,
    acts: &BlockActs,
    o: usize,
    r0: usize,
    out: &mut [f32],
) {
    let (nb, cols, kind) = (w.nb, w.cols, w.kind);
    let pairs = nb / 2;
    let nibbles = kind.nibbles();
    let idx = lane_index(nibbles);
    // SAFETY (all pointer arithmetic below, the caller's contract): row o's blocks and
    // offsets, and each activation row's cols bytes, nb / 2 lane patterns and nb terms f.
    let row = unsafe { w.blocks.as_ptr().add(o * nb * kind.block_bytes()) };
    let q8_offsets = unsafe { w.q8_offsets.as_ptr().add(o * nb * usize::from(!nibbles)) };
    let xq: [*const u8; R] = std::array::from_fn(|r| unsafe { acts.q.as_ptr().add((r0 + r) * cols) });
    let lanes: [*const f32; R] =
        std::array::from_fn(|r| unsafe { acts.lanes.as_ptr().add((r0 + r) * pairs * 16) });
    let f: [*const f32; R] = std::array::from_fn(|r| unsafe { acts.f.as_ptr().add((r0 + r) * nb) });
    // Two sets of accumulators, for even and odd pairs: one decoding row would otherwise
    // wait on the latency of a single chain of fused multiply-adds.
    let mut acc = [[_mm512_setzero_ps(); R]; 2];
    let mut acc_c = [[_mm_setzero_ps(); R]; 2];
    macro_rules! pair {
        ($p:expr, $set:expr) => {{
            let (p, set): (usize, usize) = ($p, $set);
        // SAFETY: p < nb / 2 (see above).
        let (wv, dw, c2) = unsafe { pair_weights(kind, row, q8_offsets, p, idx) };
        for r in 0..R {
            // SAFETY: the 2 terms f from 2p, 64 activation bytes from 64p and 16 lane
            // scales from 16p of row r0 + r.
            let (f2, xv, sl) = unsafe {
                (
                    _mm_castsi128_ps(_mm_loadl_epi64(f[r].add(2 * p) as *const __m128i)),
                    _mm512_loadu_si512(xq[r].add(p * 2 * BLOCK) as *const __m512i),
                    _mm512_loadu_ps(lanes[r].add(16 * p)),
                )
            };
            acc_c[set][r] = _mm_fmadd_ps(c2, f2, acc_c[set][r]);
            // Nibbles are the unsigned operand; against Q8_0 weights the shifted activations.
            let isum = if nibbles {
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, xv)
            } else {
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), xv, wv)
            };
            let scale = _mm512_mul_ps(dw, sl);
            acc[set][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[set][r]);
        }
        }};
    }
    let mut p = 0;
    while p + 1 < pairs {
        pair!(p, 0);
        pair!(p + 1, 1);
        p += 2;
    }
    if p < pairs {
        pair!(p, 0);
    }
    for r in 0..R {
        out[r] = finish([acc[0][r], acc[1][r]], [acc_c[0][r], acc_c[1][r]]);
    }
}

/// `out[i] = Σ_{b < 2·⌊nb/2⌋} (d_b e_b I_b + c_b f_b)` of weight rows `o0 + i`, `i < O`,
/// against activation row 0: the float steps of [`scaled_sums::<1>`] for each row, the
/// activations of a pair loaded once for the `O` rows; the same blocks `ahead` bytes further
/// on prefetched into L2 (none when 0: four interleaved rows hide the stream from the hardware
/// prefetcher).
///
/// # Safety
/// The CPU must have AVX-512F/BW/VL and VNNI; `o0 + O <= w.rows`, `out.len() == O`, and
/// `acts` (one row at least) made by `w.quantize`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn outputs<const O: usize>(
    w: &BlockMatrix,
    acts: &BlockActs,
    o0: usize,
    out: &mut [f32],
    ahead: usize,
) {
    let (nb, kind) = (w.nb, w.kind);
    let pairs = nb / 2;
    let nibbles = kind.nibbles();
    let idx = lane_index(nibbles);
    // The stored bytes once: each dereference of `w.blocks` is a call through its owner.
    let stored: &[u8] = &w.blocks;
    // SAFETY (all pointer arithmetic below, the caller's contract): rows o0 .. o0 + O of
    // blocks and offsets; activation row 0's bytes, lane patterns and terms f.
    let rows: [*const u8; O] =
        std::array::from_fn(|i| unsafe { stored.as_ptr().add((o0 + i) * nb * kind.block_bytes()) });
    let offsets: [*const f32; O] = std::array::from_fn(|i| unsafe {
        w.q8_offsets.as_ptr().add((o0 + i) * nb * usize::from(!nibbles))
    });
    let (xq, lanes, f) = (acts.q.as_ptr(), acts.lanes.as_ptr(), acts.f.as_ptr());
    let mut acc = [[_mm512_setzero_ps(); O]; 2];
    let mut acc_c = [[_mm_setzero_ps(); O]; 2];
    macro_rules! pair {
        ($p:expr, $set:expr) => {{
            let (p, set): (usize, usize) = ($p, $set);
        // SAFETY: p < nb / 2: the 2 terms f from 2p, 64 activation bytes from 64p and 16
        // lane scales from 16p of activation row 0.
        let (f2, xv, sl) = unsafe {
            (
                _mm_castsi128_ps(_mm_loadl_epi64(f.add(2 * p) as *const __m128i)),
                _mm512_loadu_si512(xq.add(p * 2 * BLOCK) as *const __m512i),
                _mm512_loadu_ps(lanes.add(16 * p)),
            )
        };
        for i in 0..O {
            if ahead > 0 {
                let at = rows[i].wrapping_add(ahead + 2 * p * kind.block_bytes());
                // A hint only: it never faults and reads nothing into the program, whatever
                // the address (`wrapping_add` may point past the weights on the last rows).
                // The pair's first and last bytes: a Q8_0 pair (68 bytes) spans two lines
                // one time in sixteen, and a line never asked for is a wait for memory.
                _mm_prefetch::<_MM_HINT_T1>(at as *const i8);
                let last = at.wrapping_add(2 * kind.block_bytes() - 1);
                _mm_prefetch::<_MM_HINT_T1>(last as *const i8);
            }
            // SAFETY: p < nb / 2, row o0 + i < w.rows.
            let (wv, dw, c2) = unsafe { pair_weights(kind, rows[i], offsets[i], p, idx) };
            acc_c[set][i] = _mm_fmadd_ps(c2, f2, acc_c[set][i]);
            let isum = if nibbles {
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, xv)
            } else {
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), xv, wv)
            };
            let scale = _mm512_mul_ps(dw, sl);
            acc[set][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[set][i]);
        }
        }};
    }
    let mut p = 0;
    while p + 1 < pairs {
        pair!(p, 0);
        pair!(p + 1, 1);
        p += 2;
    }
    if p < pairs {
        pair!(p, 0);
    }
    for i in 0..O {
        out[i] = finish([acc[0][i], acc[1][i]], [acc_c[0][i], acc_c[1][i]]);
    }
}
