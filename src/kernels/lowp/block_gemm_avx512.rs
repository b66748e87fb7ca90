//! The AVX-512 VNNI kernel of the block GEMM ([`super::block_gemm`]): panels of 16 outputs
//! (one i32 / f32 lane each), register tiles of up to 4 activation rows × 2 panels. Per block
//! and group of four elements, one `vpdpbusd` per (row, panel) adds the four products of each
//! output into its own lane: nibbles (unsigned) against the broadcast signed activations;
//! against signed `Q8_0` weights the activations are the unsigned side, shifted by 128
//! (`p ^ 0x80`), and the block's sum starts at `-128 Σ_j q_j` so that it ends at `Σ_j q_j p_j`.

use super::block_gemm::{with_panels, GemmActs, Layout, Panels, TASK_OUTPUTS};
use super::blocks::{BlockKind, BlockMatrix, BLOCK};
use super::PackedFormat;
use std::arch::x86_64::*;

/// Outputs per panel.
const L: usize = 16;
/// Activation rows per register tile.
const TILE_ROWS: usize = 4;
/// Panels per task (and per register tile).
const PANELS: usize = TASK_OUTPUTS / L;

/// `Q4_0`, `Q4_1`, `Q8_0` as a const parameter of the tile.
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q8_0: u8 = 2;

/// Writes outputs `o0 .. o0 + outputs` (at most [`TASK_OUTPUTS`]) of every row of `y`.
///
/// # Safety
/// The CPU has AVX-512F/BW/VL and VNNI; `y` points at `[rows, w.rows()]` floats of which no
/// other thread accesses these outputs meanwhile; `acts` holds `rows` rows quantised for `w`
/// (`block_gemm::quantize_with`); `layout` is `w`'s.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn fill(
    w: &BlockMatrix,
    layout: Layout,
    acts: &GemmActs,
    rows: usize,
    o0: usize,
    outputs: usize,
    y: *mut f32,
) {
    let nb = layout.nb;
    let panels = outputs.div_ceil(L);
    debug_assert!(panels <= PANELS);
    // q [P, nb, 8, L, 4], d, m, init [P, nb, L].
    with_panels(panels * nb * 8 * L * 4, panels * nb * L, |un| {
        for p in 0..panels {
            let valid = (outputs - p * L).min(L);
            // SAFETY: outputs o0 + p·L .. + valid exist in w (o0 + outputs <= w.rows(), the
            // caller's); the buffers hold `panels` whole panels.
            unsafe { unpack(w, layout, o0 + p * L, valid, un, p) };
        }
        let (cols, d_out) = (w.cols(), w.rows());
        let last_lanes = outputs - (panels - 1) * L;
        for r0 in (0..rows).step_by(TILE_ROWS) {
            let tile = Tile {
                panels: un,
                nb,
                p: acts.p[r0 * cols..].as_ptr(),
                cols,
                e: acts.e[r0 * nb..].as_ptr(),
                f: acts.f[r0 * nb..].as_ptr(),
                sum: acts.sum[r0 * nb..].as_ptr(),
                // SAFETY (caller): row r0, output o0 of y.
                y: unsafe { y.add(r0 * d_out + o0) },
                d_out,
                last_lanes,
            };
            macro_rules! by_kind {
                ($r:literal, $p:literal) => {
                    match layout.kind {
                        BlockKind::Q4_0 => tile.run::<$r, $p, Q4_0>(),
                        BlockKind::Q4_1 => tile.run::<$r, $p, Q4_1>(),
                        BlockKind::Q8_0 => tile.run::<$r, $p, Q8_0>(),
                    }
                };
            }
            macro_rules! by_panels {
                ($r:literal) => {
                    if panels == 1 {
                        by_kind!($r, 1)
                    } else {
                        by_kind!($r, 2)
                    }
                };
            }
            // SAFETY: rows r0 .. r0 + R of the activations and of y exist (R <= rows - r0); the
            // panels hold `panels` panels of nb blocks; the last panel's lanes past `outputs`
            // are masked off at the store.
            unsafe {
                match (rows - r0).min(TILE_ROWS) {
                    1 => by_panels!(1),
                    2 => by_panels!(2),
                    3 => by_panels!(3),
                    _ => by_panels!(4),
                }
            }
        }
    })
}

/// Unpacks outputs `o .. o + valid` (`valid <= L`) of `w` into panel `p` of `un` (lanes past
/// `valid` repeat the last output), with no gathers: per block, each output's 16 weight bytes
/// are one load, and [`transpose`] turns the 16 outputs' loads into four vectors of one
/// four-byte group each.
///
/// # Safety
/// The CPU has AVX-512F/BW/VL and VNNI; `o + valid <= w.rows()`, `valid >= 1`, and `un` holds
/// panel `p`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn unpack(
    w: &BlockMatrix,
    layout: Layout,
    o: usize,
    valid: usize,
    un: &mut Panels,
    p: usize,
) {
    let (nb, bb, q_at) = (layout.nb, layout.block_bytes, layout.q_at);
    let row_bytes = nb * bb;
    let base = w.stored().as_ptr().wrapping_add(o * row_bytes);
    let rows: [*const u8; L] =
        std::array::from_fn(|l| base.wrapping_add(l.min(valid - 1) * row_bytes));
    let nibble = _mm512_set1_epi8(0x0f);
    let ones = _mm512_set1_epi8(1);
    let q = un.q.as_mut_ptr().wrapping_add(p * nb * 8 * L * 4);
    let (d, m, init) = (
        un.d.as_mut_ptr().wrapping_add(p * nb * L),
        un.m.as_mut_ptr().wrapping_add(p * nb * L),
        un.init.as_mut_ptr().wrapping_add(p * nb * L),
    );
    for b in 0..nb {
        let at = b * bb;
        // SAFETY (all loads): rows o .. o + valid of w, block b, bytes at .. at + 4 (the scales)
        // and q_at .. q_at + 16 (+ 16 for Q8_0) <= bb of it: inside the stored blocks (rows ·
        // nb · bb bytes, checked by BlockMatrix::in_place). The stores write block b of panel
        // p of buffers sized for the task's panels.
        unsafe {
            let heads: [i32; L] =
                std::array::from_fn(|l| (rows[l].add(at) as *const i32).read_unaligned());
            let heads = _mm512_loadu_si512(heads.as_ptr() as *const __m512i);
            _mm512_storeu_ps(d.add(b * L), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(heads)));
            if layout.kind == BlockKind::Q4_1 {
                let mins = _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(heads));
                _mm512_storeu_ps(m.add(b * L), _mm512_cvtph_ps(mins));
            }
            let qb = q.add(b * 8 * L * 4);
            let store = |g: usize, v: __m512i| {
                _mm512_storeu_si512(qb.add(g * L * 4) as *mut __m512i, v)
            };
            if layout.kind == BlockKind::Q8_0 {
                let mut sum = _mm512_setzero_si512();
                for half in 0..2 {
                    let groups = transpose(&rows, at + q_at + 16 * half);
                    for (g, v) in groups.into_iter().enumerate() {
                        store(4 * half + g, v);
                        sum = _mm512_dpbusd_epi32(sum, ones, v);
                    }
                }
                let shifted = _mm512_slli_epi32::<7>(sum);
                let neg = _mm512_sub_epi32(_mm512_setzero_si512(), shifted);
                _mm512_storeu_si512(init.add(b * L) as *mut __m512i, neg);
            } else {
                // Byte j of the 16: element j in its low nibble, element j + 16 in its high.
                for (g, v) in transpose(&rows, at + q_at).into_iter().enumerate() {
                    store(g, _mm512_and_si512(v, nibble));
                    store(g + 4, _mm512_and_si512(_mm512_srli_epi32::<4>(v), nibble));
                }
            }
        }
    }
}

/// The 16 bytes at `rows[l] + at` of each of the 16 outputs `l` as four vectors: vector `g`
/// holds output `l`'s bytes `4g .. 4g + 4` in lane `l`. Vector `k` of the loads holds outputs
/// `k, 4 + k, 8 + k, 12 + k` in its four 128-bit lanes; two rounds of interleaving within
/// the lanes (a 4 × 4 transpose of 32-bit elements per lane) put them in order.
///
/// # Safety
/// The CPU has AVX-512F; 16 bytes are readable at every `rows[l] + at`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn transpose(rows: &[*const u8; L], at: usize) -> [__m512i; 4] {
    // SAFETY (caller): 16 readable bytes at rows[l] + at.
    let load = |l: usize| unsafe { _mm_loadu_si128(rows[l].add(at) as *const __m128i) };
    let four = |k: usize| {
        let v = _mm512_castsi128_si512(load(k));
        let v = _mm512_inserti32x4::<1>(v, load(4 + k));
        let v = _mm512_inserti32x4::<2>(v, load(8 + k));
        _mm512_inserti32x4::<3>(v, load(12 + k))
    };
    let (a0, a1, a2, a3) = (four(0), four(1), four(2), four(3));
    // Per 128-bit lane: t01lo = [a0.0 a1.0 a0.1 a1.1], t01hi = [a0.2 a1.2 a0.3 a1.3], ...
    let (t01lo, t01hi) = (_mm512_unpacklo_epi32(a0, a1), _mm512_unpackhi_epi32(a0, a1));
    let (t23lo, t23hi) = (_mm512_unpacklo_epi32(a2, a3), _mm512_unpackhi_epi32(a2, a3));
    [
        _mm512_unpacklo_epi64(t01lo, t23lo),
        _mm512_unpackhi_epi64(t01lo, t23lo),
        _mm512_unpacklo_epi64(t01hi, t23hi),
        _mm512_unpackhi_epi64(t01hi, t23hi),
    ]
}

/// One register tile: `R` activation rows from row `r0` × `P` panels.
struct Tile<'a> {
    panels: &'a Panels,
    nb: usize,
    /// `p`, `e`, `f`, `Σ p` of row `r0` (rows `cols` or `nb` apart).
    p: *const i8,
    cols: usize,
    e: *const f32,
    f: *const f32,
    sum: *const i32,
    /// `y` at (row `r0`, the task's first output).
    y: *mut f32,
    d_out: usize,
    /// Outputs of the last panel to write (1..=16).
    last_lanes: usize,
}

impl Tile<'_> {
    /// `y_ro` for the tile, in the float order of the parent module.
    ///
    /// # Safety
    /// The CPU has AVX-512F/BW/VL and VNNI; `R` rows of the activations and of `y` exist
    /// from the tile's pointers; `panels` holds at least `P` panels of `nb` blocks; no other
    /// thread accesses the tile's outputs.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn run<const R: usize, const P: usize, const K: u8>(&self) {
        let nb = self.nb;
        let un = self.panels;
        let shift = _mm512_set1_epi32(0x8080_8080u32 as i32);
        let mut y = [[_mm512_setzero_ps(); P]; R];
        for b in 0..nb {
            let mut acc = [[_mm512_setzero_si512(); P]; R];
            // SAFETY (all loads): block b of panels p < P (inside `panels`), rows r < R of
            // the activations: p at r·cols + 32b + 4g (+ 4 <= cols), e, f, sum at r·nb + b.
            unsafe {
                if K == Q4_0 {
                    for (r, acc_r) in acc.iter_mut().enumerate() {
                        let start = _mm512_set1_epi32(-8 * *self.sum.add(r * nb + b));
                        acc_r.iter_mut().for_each(|a| *a = start);
                    }
                } else if K == Q8_0 {
                    for p in 0..P {
                        let start = un.init.as_ptr().add((p * nb + b) * L);
                        let start = _mm512_loadu_si512(start as *const __m512i);
                        acc.iter_mut().for_each(|acc_r| acc_r[p] = start);
                    }
                }
                for g in 0..8 {
                    let mut wv = [_mm512_setzero_si512(); P];
                    for (p, wp) in wv.iter_mut().enumerate() {
                        let at = ((p * nb + b) * 8 + g) * L * 4;
                        *wp = _mm512_loadu_si512(un.q.as_ptr().add(at) as *const __m512i);
                    }
                    for (r, acc_r) in acc.iter_mut().enumerate() {
                        let at = r * self.cols + b * BLOCK + 4 * g;
                        let four = (self.p.add(at) as *const i32).read_unaligned();
                        let a = _mm512_set1_epi32(four);
                        if K == Q8_0 {
                            let u = _mm512_xor_si512(a, shift);
                            for (acc_rp, wp) in acc_r.iter_mut().zip(&wv) {
                                *acc_rp = _mm512_dpbusd_epi32(*acc_rp, u, *wp);
                            }
                        } else {
                            for (acc_rp, wp) in acc_r.iter_mut().zip(&wv) {
                                *acc_rp = _mm512_dpbusd_epi32(*acc_rp, *wp, a);
                            }
                        }
                    }
                }
                for p in 0..P {
                    let dv = _mm512_loadu_ps(un.d.as_ptr().add((p * nb + b) * L));
                    let mv = if K == Q4_1 {
                        _mm512_loadu_ps(un.m.as_ptr().add((p * nb + b) * L))
                    } else {
                        _mm512_setzero_ps()
                    };
                    for r in 0..R {
                        let s = _mm512_mul_ps(dv, _mm512_set1_ps(*self.e.add(r * nb + b)));
                        let i = _mm512_cvtepi32_ps(acc[r][p]);
                        y[r][p] = _mm512_fmadd_ps(i, s, y[r][p]);
                        if K == Q4_1 {
                            let f = _mm512_set1_ps(*self.f.add(r * nb + b));
                            y[r][p] = _mm512_fmadd_ps(mv, f, y[r][p]);
                        }
                    }
                }
            }
        }
        for p in 0..P {
            let lanes = if p + 1 == P { self.last_lanes } else { L };
            let mask: __mmask16 = if lanes == L {
                0xffff
            } else {
                (1u16 << lanes) - 1
            };
            for (r, y_r) in y.iter().enumerate() {
                // SAFETY (caller): the masked lanes are outputs of this tile.
                unsafe {
                    _mm512_mask_storeu_ps(self.y.add(r * self.d_out + p * L), mask, y_r[p]);
                }
            }
        }
    }
}
