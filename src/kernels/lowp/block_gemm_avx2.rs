//! The AVX2 kernel of the block GEMM ([`super::block_gemm`]): panels of 8 outputs (one i32 /
//! f32 lane each), register tiles of up to 4 activation rows × 1 panel (16 registers). Per
//! block and group of four elements, `vpmaddubsw` multiplies each output's four unsigned
//! nibbles by the four broadcast signed activations and adds them in pairs (|pair| <= 2 · 15 ·
//! 127, so the 8 groups of a block sum exactly in i16), and one `vpmaddwd` per block widens
//! the pairs to i32. Signed `Q8_0` weights use ggml's sign trick (`|q|` against `p · sign q`,
//! |pair| <= 2 · 128 · 127), widened per group.

use super::block_gemm::{with_panels, GemmActs, Layout, Panels, TASK_OUTPUTS};
use super::blocks::{BlockKind, BlockMatrix, BLOCK};
use super::PackedFormat;
use std::arch::x86_64::*;

/// Outputs per panel.
const L: usize = 8;
/// Activation rows per register tile.
const TILE_ROWS: usize = 4;

const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q8_0: u8 = 2;

/// Writes outputs `o0 .. o0 + outputs` (at most [`TASK_OUTPUTS`]) of every row of `y`, one
/// panel of 8 outputs after the other.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `y` points at `[rows, w.rows()]` floats of which no other
/// thread accesses these outputs meanwhile; `acts` holds `rows` rows quantised for `w`
/// (`block_gemm::quantize_with`); `layout` is `w`'s.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn fill(
    w: &BlockMatrix,
    layout: Layout,
    acts: &GemmActs,
    rows: usize,
    o0: usize,
    outputs: usize,
    y: *mut f32,
) {
    debug_assert!(outputs <= TASK_OUTPUTS);
    let nb = layout.nb;
    // q [nb, 8, L, 4], d and m [nb, L]: one panel at a time.
    with_panels(nb * 8 * L * 4, nb * L, |panel| {
        let (cols, d_out) = (w.cols(), w.rows());
        for p0 in (0..outputs).step_by(L) {
            let lanes = (outputs - p0).min(L);
            // SAFETY: outputs o0 + p0 .. + lanes exist in w (o0 + outputs <= w.rows(), the
            // caller's); the panel holds nb blocks.
            unsafe { unpack(w, layout, o0 + p0, lanes, panel) };
            for r0 in (0..rows).step_by(TILE_ROWS) {
                let tile = Tile {
                    panel,
                    nb,
                    p: acts.p[r0 * cols..].as_ptr(),
                    cols,
                    e: acts.e[r0 * nb..].as_ptr(),
                    f: acts.f[r0 * nb..].as_ptr(),
                    sum: acts.sum[r0 * nb..].as_ptr(),
                    // SAFETY (caller): row r0, output o0 + p0 of y.
                    y: unsafe { y.add(r0 * d_out + o0 + p0) },
                    d_out,
                    lanes,
                };
                macro_rules! by_kind {
                    ($r:literal) => {
                        match layout.kind {
                            BlockKind::Q4_0 => tile.run::<$r, Q4_0>(),
                            BlockKind::Q4_1 => tile.run::<$r, Q4_1>(),
                            BlockKind::Q8_0 => tile.run::<$r, Q8_0>(),
                        }
                    };
                }
                // SAFETY: rows r0 .. r0 + R of the activations and of y exist; only the
                // panel's `lanes` outputs are written.
                unsafe {
                    match (rows - r0).min(TILE_ROWS) {
                        1 => by_kind!(1),
                        2 => by_kind!(2),
                        3 => by_kind!(3),
                        _ => by_kind!(4),
                    }
                }
            }
        }
    })
}

/// Unpacks outputs `o .. o + valid` (`1 <= valid <= L`) of `w` into `panel` (lanes past
/// `valid` repeat the last output), with no gathers: per block, each output's 16 weight bytes
/// are one load, and [`transpose`] turns the 8 outputs' loads into four vectors of one
/// four-byte group each.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `o + valid <= w.rows()`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack(w: &BlockMatrix, layout: Layout, o: usize, valid: usize, panel: &mut Panels) {
    let (nb, bb, q_at) = (layout.nb, layout.block_bytes, layout.q_at);
    let row_bytes = nb * bb;
    let base = w.stored().as_ptr().wrapping_add(o * row_bytes);
    let rows: [*const u8; L] =
        std::array::from_fn(|l| base.wrapping_add(l.min(valid - 1) * row_bytes));
    let nibble = _mm256_set1_epi8(0x0f);
    let low16 = _mm256_set1_epi32(0xffff);
    // Eight f16 in the low halves of eight i32 lanes, widened to f32.
    let widen = |v: __m256i| {
        let v = _mm256_and_si256(v, low16);
        let packed = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        _mm256_cvtph_ps(packed)
    };
    for b in 0..nb {
        let at = b * bb;
        // SAFETY (all loads): rows o .. o + valid of w, block b, bytes at .. at + 4 (the
        // scales) and q_at .. q_at + 16 (+ 16 for Q8_0) <= bb of it: inside the stored blocks
        // (checked by BlockMatrix::in_place). The stores write block b of buffers sized for
        // nb blocks.
        unsafe {
            let heads: [i32; L] =
                std::array::from_fn(|l| (rows[l].add(at) as *const i32).read_unaligned());
            let heads = _mm256_loadu_si256(heads.as_ptr() as *const __m256i);
            _mm256_storeu_ps(panel.d.as_mut_ptr().add(b * L), widen(heads));
            if layout.kind == BlockKind::Q4_1 {
                let mins = widen(_mm256_srli_epi32::<16>(heads));
                _mm256_storeu_ps(panel.m.as_mut_ptr().add(b * L), mins);
            }
            let qb = panel.q.as_mut_ptr().add(b * 8 * L * 4);
            let store = |g: usize, v: __m256i| {
                _mm256_storeu_si256(qb.add(g * L * 4) as *mut __m256i, v)
            };
            if layout.kind == BlockKind::Q8_0 {
                for half in 0..2 {
                    let groups = transpose(&rows, at + q_at + 16 * half);
                    for (g, v) in groups.into_iter().enumerate() {
                        store(4 * half + g, v);
                    }
                }
            } else {
                // Byte j of the 16: element j in its low nibble, element j + 16 in its high.
                for (g, v) in transpose(&rows, at + q_at).into_iter().enumerate() {
                    store(g, _mm256_and_si256(v, nibble));
                    store(g + 4, _mm256_and_si256(_mm256_srli_epi32::<4>(v), nibble));
                }
            }
        }
    }
}

/// The 16 bytes at `rows[l] + at` of each of the 8 outputs `l` as four vectors: vector `g`
/// holds output `l`'s bytes `4g .. 4g + 4` in lane `l`. Vector `k` of the loads holds outputs
/// `k` and `4 + k` in its two 128-bit lanes; two rounds of interleaving within the lanes (a
/// 4 × 4 transpose of 32-bit elements per lane) put them in order.
///
/// # Safety
/// The CPU has AVX2; 16 bytes are readable at every `rows[l] + at`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn transpose(rows: &[*const u8; L], at: usize) -> [__m256i; 4] {
    // SAFETY (caller): 16 readable bytes at rows[l] + at.
    let load = |l: usize| unsafe { _mm_loadu_si128(rows[l].add(at) as *const __m128i) };
    let two = |k: usize| _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(load(k)), load(4 + k));
    let (a0, a1, a2, a3) = (two(0), two(1), two(2), two(3));
    // Per 128-bit lane: t01lo = [a0.0 a1.0 a0.1 a1.1], t01hi = [a0.2 a1.2 a0.3 a1.3], ...
    let (t01lo, t01hi) = (_mm256_unpacklo_epi32(a0, a1), _mm256_unpackhi_epi32(a0, a1));
    let (t23lo, t23hi) = (_mm256_unpacklo_epi32(a2, a3), _mm256_unpackhi_epi32(a2, a3));
    [
        _mm256_unpacklo_epi64(t01lo, t23lo),
        _mm256_unpackhi_epi64(t01lo, t23lo),
        _mm256_unpacklo_epi64(t01hi, t23hi),
        _mm256_unpackhi_epi64(t01hi, t23hi),
    ]
}

/// One register tile: `R` activation rows from row `r0` × one panel.
struct Tile<'a> {
    panel: &'a Panels,
    nb: usize,
    /// `p`, `e`, `f`, `Σ p` of row `r0` (rows `cols` or `nb` apart).
    p: *const i8,
    cols: usize,
    e: *const f32,
    f: *const f32,
    sum: *const i32,
    /// `y` at (row `r0`, the panel's first output).
    y: *mut f32,
    d_out: usize,
    /// Outputs of the panel to write (1..=8).
    lanes: usize,
}

impl Tile<'_> {
    /// `y_ro` for the tile, in the float order of the parent module.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `R` rows of the activations and of `y` exist from the
    /// tile's pointers; no other thread accesses the tile's outputs.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn run<const R: usize, const K: u8>(&self) {
        let nb = self.nb;
        let panel = self.panel;
        let ones = _mm256_set1_epi16(1);
        let mut y = [_mm256_setzero_ps(); R];
        for b in 0..nb {
            let mut acc = [_mm256_setzero_si256(); R];
            // SAFETY (all loads): block b of the panel; rows r < R of the activations: p at
            // r·cols + 32b + 4g (+ 4 <= cols), e, f, sum at r·nb + b.
            unsafe {
                let four = |r: usize, g: usize| {
                    let at = r * self.cols + b * BLOCK + 4 * g;
                    _mm256_set1_epi32((self.p.add(at) as *const i32).read_unaligned())
                };
                let weights = |g: usize| {
                    let at = (b * 8 + g) * L * 4;
                    _mm256_loadu_si256(panel.q.as_ptr().add(at) as *const __m256i)
                };
                if K == Q8_0 {
                    for g in 0..8 {
                        let wv = weights(g);
                        let magnitude = _mm256_abs_epi8(wv);
                        for (r, acc_r) in acc.iter_mut().enumerate() {
                            let signed = _mm256_sign_epi8(four(r, g), wv);
                            let pairs = _mm256_maddubs_epi16(magnitude, signed);
                            *acc_r = _mm256_add_epi32(*acc_r, _mm256_madd_epi16(pairs, ones));
                        }
                    }
                } else {
                    let mut pairs = [_mm256_setzero_si256(); R];
                    for g in 0..8 {
                        let wv = weights(g);
                        for (r, pairs_r) in pairs.iter_mut().enumerate() {
                            let t = _mm256_maddubs_epi16(wv, four(r, g));
                            *pairs_r = _mm256_add_epi16(*pairs_r, t);
                        }
                    }
                    for (r, acc_r) in acc.iter_mut().enumerate() {
                        *acc_r = _mm256_madd_epi16(pairs[r], ones);
                        if K == Q4_0 {
                            let offset = _mm256_set1_epi32(-8 * *self.sum.add(r * nb + b));
                            *acc_r = _mm256_add_epi32(*acc_r, offset);
                        }
                    }
                }
                let dv = _mm256_loadu_ps(panel.d.as_ptr().add(b * L));
                let mv = if K == Q4_1 {
                    _mm256_loadu_ps(panel.m.as_ptr().add(b * L))
                } else {
                    _mm256_setzero_ps()
                };
                for r in 0..R {
                    let s = _mm256_mul_ps(dv, _mm256_set1_ps(*self.e.add(r * nb + b)));
                    y[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r]), s, y[r]);
                    if K == Q4_1 {
                        let f = _mm256_set1_ps(*self.f.add(r * nb + b));
                        y[r] = _mm256_fmadd_ps(mv, f, y[r]);
                    }
                }
            }
        }
        for (r, y_r) in y.iter().enumerate() {
            let mut lanes = [0f32; L];
            // SAFETY: a local array of L floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), *y_r) };
            for (l, &v) in lanes.iter().enumerate().take(self.lanes) {
                // SAFETY (caller): output l < lanes of the panel, row r of the tile.
                unsafe { *self.y.add(r * self.d_out + l) = v };
            }
        }
    }
}
