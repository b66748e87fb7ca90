//! The register-tiled GEMM of the 32-element blocks `Q5_0`, `Q5_1` and `IQ4_NL` (AVX2 and
//! AVX-512 VNNI), for products of many activation rows (prefill, batched decoding): the
//! portable row kernel's sums in its float order, so the three give the same bits and a row's
//! result does not depend on how many rows it is multiplied with.
//!
//! ```text
//! I_rob = Σ_j u_oj p_rj − c Σ_j p_rj        (exact i32; u = q + c unsigned: c = 16 for Q5_0,
//!                                            128 for IQ4_NL with VNNI, else 0)
//! y_ro ← 0;  for b { y ← y + (d_ob e_rb) I_rob;   Q5_1: y ← y + m_ob s_rb }
//! ```
//!
//! Laid out as the blocks' GEMM ([`super::super::block_gemm`]): each task of 32 outputs
//! unpacks its blocks (the row kernels' register unpacking: [`super::q5_groups`]'
//! `unsigned_avx2` for the groups of `Q5_0` / `Q5_1`, [`super::blocks32`]'s `unsigned_avx2` /
//! `unsigned_avx512` for the other blocks, whose `c` this module subtracts) into panels of `L`
//! outputs (8 for AVX2, 16 for AVX-512), per block and group of four elements the outputs'
//! four bytes side by side (`[nb, 8, L, 4]`), `d` and `m` widened to f32 (`[nb, L]`); a tile
//! of up to 4 rows then broadcasts four activation bytes against a group (`vpdpbusd`; AVX2
//! `vpmaddubsw` summed in i16 over 4 groups, at most 4 · 2 · 31 · 127 < 2^15, then
//! `vpmaddwd`; AVX2 `IQ4_NL` by `|K| × sign(p, K)`, widened per group), one i32 and one f32 sum
//! per (row, output) in registers, and writes row-major `y`.

use super::super::block_gemm::{with_panels, Panels};
use super::blocks32::{unsigned_offset, IQ4_NL, Q5_0, Q5_1};
use super::q5_groups::{grouped_blocks, head_bytes, scales, unsigned_avx2 as unsigned_group, GROUP};
use super::{half_at, GgmlType, KQuantActs, KQuantMatrix};
use crate::kernels::lowp::{check_operands, products_are_serial, Kernel};
use rayon::prelude::*;
use std::arch::x86_64::*;

/// The fewest activation rows for which the GEMM is taken (as the other block GEMMs).
pub const MIN_ROWS: usize = super::super::block_gemm::MIN_ROWS;
/// Outputs per parallel task.
const TASK_OUTPUTS: usize = 32;
/// Activation rows per register tile.
const TILE_ROWS: usize = 4;

/// Whether the GEMM multiplies `w` with `kernel` on this CPU (32-blocks but `MXFP4`, whose
/// products of many rows take the row kernels, a SIMD kernel).
pub fn runs(w: &KQuantMatrix, kernel: Kernel) -> bool {
    use crate::kernels::lowp::PackedFormat;
    w.block == 32 && w.ty != GgmlType::MXFP4 && kernel != Kernel::Portable && w.runs(kernel)
}

/// `y [rows, d_out] = x [rows, d_in] · Wᵀ` with `kernel` ([`runs`] must hold), bit for bit
/// the portable row kernel's product.
pub fn product(w: &KQuantMatrix, kernel: Kernel, y: &mut [f32], x: &[f32], rows: usize) {
    let (d_out, d_in) = (w.rows, w.cols);
    if !check_operands((d_out, d_in), y, x, rows, kernel, runs(w, kernel)) {
        return;
    }
    let acts = w.quantize(x, rows);
    let out = OutPtr(y.as_mut_ptr());
    let task = |t: usize| {
        let o0 = t * TASK_OUTPUTS;
        let outputs = TASK_OUTPUTS.min(d_out - o0);
        // SAFETY: runs(w, kernel) checked the kernel's features; this task writes
        // y[r · d_out + o] for r < rows and o in [o0, o0 + outputs) only, outputs no other
        // task has, of a y that is [rows, d_out] (checked above) and outlives the loop below.
        unsafe {
            match kernel {
                Kernel::Avx512 => fill_avx512(w, &acts, rows, o0, outputs, out.ptr()),
                _ => fill_avx2(w, &acts, rows, o0, outputs, out.ptr()),
            }
        }
    };
    let tasks = d_out.div_ceil(TASK_OUTPUTS);
    if products_are_serial() || tasks == 1 {
        (0..tasks).for_each(task);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
}

/// `y`'s first element, shared by the tasks of one product (each writes its own outputs).
struct OutPtr(*mut f32);
// SAFETY: written through only by the fills, each task at its own outputs of a `y` that
// outlives the parallel loop.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer (a method, so that closures capture the whole `Sync` wrapper).
    fn ptr(&self) -> *mut f32 {
        self.0
    }
}

fn type_code(ty: GgmlType) -> u8 {
    match ty {
        GgmlType::Q5_0 => Q5_0,
        GgmlType::Q5_1 => Q5_1,
        _ => IQ4_NL,
    }
}

/// Unpacks outputs `o0 .. o0 + outputs` of `w` into `un`, panels of `L` outputs: `q [P, nb,
/// 8, L, 4]` (`u = q + c` as bytes, from the row kernels' [`super::blocks32`] unpacking of the
/// instruction set: `AVX512` or not), `d`, `m [P, nb, L]`. Lanes past the last output keep
/// what the buffer held (their sums are computed and never stored).
///
/// # Safety
/// AVX2 (and AVX-512F/BW/VL where `AVX512`); `w` holds 32-blocks of type `T`, outputs
/// `o0 .. o0 + outputs` exist; `un` holds `outputs.div_ceil(L)` panels of `w.cols / 32`
/// blocks.
#[inline(always)]
unsafe fn unpack<const L: usize, const T: u8, const AVX512: bool>(
    w: &KQuantMatrix,
    o0: usize,
    outputs: usize,
    un: &mut Panels,
) {
    let (nb, bb) = (w.cols / 32, w.block_bytes);
    for i in 0..outputs {
        let (p, lane) = (i / L, i % L);
        let o = o0 + i;
        let row = &w.data[o * nb * bb..(o + 1) * nb * bb];
        // Q5_0 / Q5_1: the row's whole groups of 8 blocks, then the blocks as stored.
        let grouped = grouped_blocks(w.ty, nb);
        for (g, group) in row[..grouped * bb].chunks_exact(GROUP * bb).enumerate() {
            let head = head_bytes(T == Q5_1);
            // SAFETY (caller): AVX2; a whole group, whose values start after its head.
            let u = unsafe { unsigned_group(group.as_ptr().add(head)) };
            for (k, &u_k) in u.iter().enumerate() {
                let (d, m) = scales(group, k, T == Q5_1);
                // SAFETY (caller): AVX2.
                unsafe { put::<L, T>(un, (p * nb + g * GROUP + k, lane), u_k, d, m) };
            }
        }
        for (b, block) in row.chunks_exact(bb).enumerate().skip(grouped) {
            // SAFETY (caller): one whole block of type T, and the instruction set.
            let u = unsafe {
                if AVX512 {
                    super::blocks32::unsigned_avx512::<T>(block.as_ptr())
                } else {
                    super::blocks32::unsigned_avx2::<T>(block.as_ptr())
                }
            };
            let m = if T == Q5_1 { half_at(block, 2) } else { 0.0 };
            // SAFETY (caller): AVX2.
            unsafe { put::<L, T>(un, (p * nb + b, lane), u, half_at(block, 0), m) };
        }
    }
}

/// Block `pb` of a panel's lane `lane` (`at`): its values `u` and its `d`, `m` (`Q5_1`).
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn put<const L: usize, const T: u8>(
    un: &mut Panels,
    (pb, lane): (usize, usize),
    u: __m256i,
    d: f32,
    m: f32,
) {
    let mut groups = [0u32; 8];
    // SAFETY: 32 bytes into a local array of 8 u32 (AVX2: the caller).
    unsafe { _mm256_storeu_si256(groups.as_mut_ptr() as *mut __m256i, u) };
    for (g, &four) in groups.iter().enumerate() {
        let at = ((pb * 8 + g) * L + lane) * 4;
        un.q[at..at + 4].copy_from_slice(&four.to_le_bytes());
    }
    un.d[pb * L + lane] = d;
    if T == Q5_1 {
        un.m[pb * L + lane] = m;
    }
}

/// The activations of one tile: rows `r0 ..` of `p`, `e`, `s`, `Σ p`, and `y` at the tile's
/// first (row, output).
struct Rows {
    p: *const i8,
    e: *const f32,
    s: *const f32,
    psum: *const i32,
    cols: usize,
    nb: usize,
    y: *mut f32,
    d_out: usize,
}

impl Rows {
    /// # Safety
    /// Row `r0` exists in `acts` (with its `s` for `Q8_1`) and `y` points at `[.., d_out]`.
    unsafe fn at(acts: &KQuantActs, r0: usize, y: *mut f32, d_out: usize) -> Rows {
        let (nb, cols) = (acts.nb, acts.nb * 32);
        let s = if acts.s.is_empty() {
            acts.s.as_ptr()
        } else {
            acts.s[r0 * nb..].as_ptr()
        };
        Rows {
            p: acts.q[r0 * cols..].as_ptr(),
            e: acts.e[r0 * nb..].as_ptr(),
            s,
            psum: acts.psum[r0 * nb..].as_ptr(),
            cols,
            nb,
            // SAFETY (caller): row r0 of y.
            y: unsafe { y.add(r0 * d_out) },
            d_out,
        }
    }

    /// Four activation bytes of row `r`, block `b`, group `g`, in every i32 lane.
    ///
    /// # Safety
    /// Row `r` of the tile exists.
    #[inline(always)]
    unsafe fn four(&self, r: usize, b: usize, g: usize) -> i32 {
        // SAFETY (caller): 4 bytes at 32b + 4g < cols of row r.
        unsafe { (self.p.add(r * self.cols + b * 32 + 4 * g) as *const i32).read_unaligned() }
    }
}

/// The AVX2 fill: panels of 8 outputs one after the other, tiles of up to 4 rows × 1 panel.
///
/// # Safety
/// AVX2, FMA, F16C; `y` points at `[rows, w.rows]` floats of which no other thread accesses
/// outputs `o0 .. o0 + outputs` meanwhile; `acts` holds `rows` rows quantised for `w`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fill_avx2(
    w: &KQuantMatrix,
    acts: &KQuantActs,
    rows: usize,
    o0: usize,
    outputs: usize,
    y: *mut f32,
) {
    const L: usize = 8;
    let t = type_code(w.ty);
    let d_out = w.rows;
    let nb = w.cols / 32;
    with_panels(nb * 32 * L, nb * L, |panel| {
        for p0 in (0..outputs).step_by(L) {
            let lanes = (outputs - p0).min(L);
            // SAFETY: AVX2 (this function's); outputs o0 + p0 .. + lanes exist; the buffers
            // hold one panel of nb blocks.
            unsafe {
                match t {
                    Q5_0 => unpack::<L, Q5_0, false>(w, o0 + p0, lanes, panel),
                    Q5_1 => unpack::<L, Q5_1, false>(w, o0 + p0, lanes, panel),
                    _ => unpack::<L, IQ4_NL, false>(w, o0 + p0, lanes, panel),
                }
            }
            for r0 in (0..rows).step_by(TILE_ROWS) {
                // SAFETY: row r0 < rows; the tile writes outputs o0 + p0 .. + lanes only.
                let tile = unsafe { Rows::at(acts, r0, y.add(o0 + p0), d_out) };
                macro_rules! by_type {
                    ($r:literal) => {
                        match t {
                            Q5_0 => tile_avx2::<$r, Q5_0>(panel, &tile, lanes),
                            Q5_1 => tile_avx2::<$r, Q5_1>(panel, &tile, lanes),
                            _ => tile_avx2::<$r, IQ4_NL>(panel, &tile, lanes),
                        }
                    };
                }
                // SAFETY: rows r0 .. r0 + R exist.
                unsafe {
                    match (rows - r0).min(TILE_ROWS) {
                        1 => by_type!(1),
                        2 => by_type!(2),
                        3 => by_type!(3),
                        _ => by_type!(4),
                    }
                }
            }
        }
    })
}

/// One AVX2 tile: `R` rows × the 8 outputs of `panel` (`lanes` of them written).
///
/// # Safety
/// AVX2, FMA, F16C; `R` rows of the tile exist; `panel` holds one panel of `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_avx2<const R: usize, const T: u8>(panel: &Panels, rows: &Rows, lanes: usize) {
    const L: usize = 8;
    let nb = rows.nb;
    let ones = _mm256_set1_epi16(1);
    let c = unsigned_offset(T, false);
    let mut y = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        // SAFETY (all loads): block b of the panel, rows r < R of the tile at block b.
        unsafe {
            let weights = |g: usize| {
                _mm256_loadu_si256(panel.q[(b * 8 + g) * L * 4..].as_ptr() as *const __m256i)
            };
            let mut acc: [__m256i; R] =
                std::array::from_fn(|r| _mm256_set1_epi32(-c * *rows.psum.add(r * nb + b)));
            if T == IQ4_NL {
                for g in 0..8 {
                    let wv = weights(g);
                    let magnitude = _mm256_abs_epi8(wv);
                    for (r, acc_r) in acc.iter_mut().enumerate() {
                        let a = _mm256_sign_epi8(_mm256_set1_epi32(rows.four(r, b, g)), wv);
                        let pairs = _mm256_maddubs_epi16(magnitude, a);
                        *acc_r = _mm256_add_epi32(*acc_r, _mm256_madd_epi16(pairs, ones));
                    }
                }
            } else {
                for half in 0..2 {
                    let mut pairs = [_mm256_setzero_si256(); R];
                    for g in 4 * half..4 * half + 4 {
                        let wv = weights(g);
                        for (r, pairs_r) in pairs.iter_mut().enumerate() {
                            let a = _mm256_set1_epi32(rows.four(r, b, g));
                            *pairs_r = _mm256_add_epi16(*pairs_r, _mm256_maddubs_epi16(wv, a));
                        }
                    }
                    for (acc_r, pairs_r) in acc.iter_mut().zip(pairs) {
                        *acc_r = _mm256_add_epi32(*acc_r, _mm256_madd_epi16(pairs_r, ones));
                    }
                }
            }
            let dv = _mm256_loadu_ps(panel.d[b * L..].as_ptr());
            let mv = _mm256_loadu_ps(panel.m[b * L..].as_ptr());
            for r in 0..R {
                let de = _mm256_mul_ps(dv, _mm256_set1_ps(*rows.e.add(r * nb + b)));
                y[r] = _mm256_add_ps(y[r], _mm256_mul_ps(de, _mm256_cvtepi32_ps(acc[r])));
                if T == Q5_1 {
                    let ms = _mm256_mul_ps(mv, _mm256_set1_ps(*rows.s.add(r * nb + b)));
                    y[r] = _mm256_add_ps(y[r], ms);
                }
            }
        }
    }
    for (r, y_r) in y.iter().enumerate() {
        let mut v = [0f32; L];
        // SAFETY: a local array of L floats.
        unsafe { _mm256_storeu_ps(v.as_mut_ptr(), *y_r) };
        for (l, &v) in v.iter().enumerate().take(lanes) {
            // SAFETY (caller): output l < lanes of the panel, row r of the tile.
            unsafe { *rows.y.add(r * rows.d_out + l) = v };
        }
    }
}

/// The AVX-512 fill: two panels of 16 outputs, tiles of up to 4 rows × 2 panels.
///
/// # Safety
/// As [`fill_avx2`], with AVX-512F/BW/VL and VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn fill_avx512(
    w: &KQuantMatrix,
    acts: &KQuantActs,
    rows: usize,
    o0: usize,
    outputs: usize,
    y: *mut f32,
) {
    const L: usize = 16;
    let t = type_code(w.ty);
    let nb = w.cols / 32;
    let panels = outputs.div_ceil(L);
    with_panels(panels * nb * 32 * L, panels * nb * L, |un| {
        // SAFETY: AVX-512F/BW/VL (this function's); outputs o0 .. o0 + outputs exist; the
        // buffers hold `panels` panels of nb blocks.
        unsafe {
            match t {
                Q5_0 => unpack::<L, Q5_0, true>(w, o0, outputs, un),
                Q5_1 => unpack::<L, Q5_1, true>(w, o0, outputs, un),
                _ => unpack::<L, IQ4_NL, true>(w, o0, outputs, un),
            }
        }
        let two = outputs > L;
        let last_lanes = outputs - if two { L } else { 0 };
        for r0 in (0..rows).step_by(TILE_ROWS) {
            // SAFETY: row r0 < rows; the tile writes outputs o0 .. o0 + outputs only.
            let tile = unsafe { Rows::at(acts, r0, y.add(o0), w.rows) };
            macro_rules! by_type {
                ($r:literal, $p:literal) => {
                    match t {
                        Q5_0 => tile_avx512::<$r, $p, Q5_0>(un, &tile, last_lanes),
                        Q5_1 => tile_avx512::<$r, $p, Q5_1>(un, &tile, last_lanes),
                        _ => tile_avx512::<$r, $p, IQ4_NL>(un, &tile, last_lanes),
                    }
                };
            }
            macro_rules! by_panels {
                ($r:literal) => {
                    if two {
                        by_type!($r, 2)
                    } else {
                        by_type!($r, 1)
                    }
                };
            }
            // SAFETY: rows r0 .. r0 + R exist; the panels hold P panels.
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

/// One AVX-512 tile: `R` rows × `P` panels of 16 outputs (`last_lanes` of the last written).
///
/// # Safety
/// AVX-512F/BW/VL and VNNI; `R` rows of the tile exist; `panels` holds `P` panels.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile_avx512<const R: usize, const P: usize, const T: u8>(
    panels: &Panels,
    rows: &Rows,
    last_lanes: usize,
) {
    const L: usize = 16;
    let nb = rows.nb;
    let c = unsigned_offset(T, true);
    let mut y = [[_mm512_setzero_ps(); P]; R];
    for b in 0..nb {
        // SAFETY (all loads): block b of panels p < P, rows r < R of the tile at block b.
        unsafe {
            let mut acc: [[__m512i; P]; R] =
                std::array::from_fn(|r| [_mm512_set1_epi32(-c * *rows.psum.add(r * nb + b)); P]);
            for g in 0..8 {
                let wv: [__m512i; P] = std::array::from_fn(|p| {
                    let at = ((p * nb + b) * 8 + g) * L * 4;
                    _mm512_loadu_si512(panels.q[at..].as_ptr() as *const __m512i)
                });
                for (r, acc_r) in acc.iter_mut().enumerate() {
                    let a = _mm512_set1_epi32(rows.four(r, b, g));
                    for (acc_rp, wp) in acc_r.iter_mut().zip(&wv) {
                        *acc_rp = _mm512_dpbusd_epi32(*acc_rp, *wp, a);
                    }
                }
            }
            for p in 0..P {
                let dv = _mm512_loadu_ps(panels.d[(p * nb + b) * L..].as_ptr());
                let mv = _mm512_loadu_ps(panels.m[(p * nb + b) * L..].as_ptr());
                for r in 0..R {
                    let de = _mm512_mul_ps(dv, _mm512_set1_ps(*rows.e.add(r * nb + b)));
                    let i = _mm512_cvtepi32_ps(acc[r][p]);
                    y[r][p] = _mm512_add_ps(y[r][p], _mm512_mul_ps(de, i));
                    if T == Q5_1 {
                        let ms = _mm512_mul_ps(mv, _mm512_set1_ps(*rows.s.add(r * nb + b)));
                        y[r][p] = _mm512_add_ps(y[r][p], ms);
                    }
                }
            }
        }
    }
    for p in 0..P {
        let lanes = if p + 1 == P { last_lanes } else { L };
        let mask: __mmask16 = if lanes == L {
            0xffff
        } else {
            (1u16 << lanes) - 1
        };
        for (r, y_r) in y.iter().enumerate() {
            // SAFETY (caller): the masked lanes are outputs of this tile.
            unsafe { _mm512_mask_storeu_ps(rows.y.add(r * rows.d_out + p * L), mask, y_r[p]) };
        }
    }
}
