//! The register-tiled GEMM of the K-quants (`Q2_K` … `Q6_K`) with AVX-512 VNNI, for products
//! of many activation rows: the row kernel's sums in the row kernel's float order, so the two
//! give the same bits and a row's result does not depend on how many rows it is multiplied
//! with.
//!
//! ```text
//! I_rob = Σ_g sc_og Σ_{j∈g} q_oj p_rj      M_rob = Σ_g m_og bsums_rg        (exact i32)
//! y_ro ← 0;  for b { y ← y + (d_ob e_rb) I_rob;  minimum types: y ← y − (dmin_ob e_rb) M_rob }
//! ```
//!
//! Laid out as the blocks' GEMM ([`super::super::block_gemm`]): each task of 32 outputs unpacks
//! its super-blocks once (the row kernel's `unpack`) into two panels of 16 outputs, per group
//! of four elements the 16 outputs' bytes side by side (`q + offset`, unsigned), the 16 group
//! scales and the minima (as i16 pairs) in lanes; a tile of up to 4 rows × 2 panels then adds
//! each output's products in its own lane (`vpdpbusd` against four broadcast activation bytes,
//! the group's sum starting at `-offset · bsums_g`), scales the group sums by `vpmulld`, sums
//! the minima by `vpdpwssd`, and writes row-major `y`.

use super::{unpack, KQuantActs, KQuantMatrix, Unpacked, QK_K};
use crate::kernels::lowp::{check_operands, products_are_serial, Kernel};
use rayon::prelude::*;
use std::arch::x86_64::*;

#[path = "kquant_gemm_rows8.rs"]
mod from_rows8;

/// The fewest activation rows for which the GEMM is taken.
pub const MIN_ROWS: usize = 8;
/// Outputs per panel.
const L: usize = 16;
/// Outputs per parallel task: two panels.
const TASK_OUTPUTS: usize = 32;
/// Activation rows per register tile.
const TILE_ROWS: usize = 4;
/// Groups of four elements per super-block.
const QUADS: usize = QK_K / 4;

/// Whether the GEMM multiplies `w` on this CPU (super-blocks of 256, AVX-512 VNNI).
pub fn runs(w: &KQuantMatrix) -> bool {
    w.block == QK_K && crate::kernels::lowp::has_vnni()
}

/// `y [rows, d_out] = x [rows, d_in] · Wᵀ`, bit for bit the row kernel's product.
pub fn product(w: &KQuantMatrix, y: &mut [f32], x: &[f32], rows: usize) {
    let (d_out, d_in) = (w.rows, w.cols);
    if !check_operands((d_out, d_in), y, x, rows, Kernel::Avx512, runs(w)) {
        return;
    }
    let acts = w.quantize(x, rows);
    // The group sums of each super-block as i16 pairs: [rows, nb, 8].
    let pairs: Vec<i32> = acts
        .bsums
        .chunks_exact(2)
        .map(|g| (g[0] & 0xffff) | (g[1] << 16))
        .collect();
    let out = OutPtr(y.as_mut_ptr());
    let task = |t: usize| {
        let o0 = t * TASK_OUTPUTS;
        let outputs = TASK_OUTPUTS.min(d_out - o0);
        // SAFETY: runs(w) checked AVX-512 VNNI; this task writes y[r · d_out + o] for r < rows
        // and o in [o0, o0 + outputs) only, outputs no other task has, of a y that is
        // [rows, d_out] (checked above) and outlives the loop below.
        unsafe { fill(w, &acts, &pairs, rows, o0, outputs, out.ptr()) };
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
// SAFETY: written through only by `fill`, each task at its own outputs of a `y` that outlives
// the parallel loop.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer (a method, so that closures capture the whole `Sync` wrapper).
    fn ptr(&self) -> *mut f32 {
        self.0
    }
}

/// One super-block of up to two panels, unpacked: `q [P, 64, L, 4]` (`q + offset`),
/// `scale [P, 16, L]`, `min [P, 8, L]` (i16 pairs), `d`, `dmin [P, L]`; lanes past the last
/// output stay zero. A task refills it for each super-block in turn, so it stays in the L1
/// cache while every row tile reads it.
struct Panels {
    q: Vec<u8>,
    scale: Vec<i32>,
    min: Vec<i32>,
    d: Vec<f32>,
    dmin: Vec<f32>,
}

impl Panels {
    /// `panels` panels of zeros.
    fn zeroed(panels: usize) -> Panels {
        Panels {
            q: vec![0; panels * QUADS * L * 4],
            scale: vec![0; panels * 16 * L],
            min: vec![0; panels * 8 * L],
            d: vec![0.0; panels * L],
            dmin: vec![0.0; panels * L],
        }
    }

    /// Super-block `b` of outputs `o0 .. o0 + outputs` (into panels made for them, whose lanes
    /// past `outputs` are zero): read a vector at a time from rows interleaved by eight where
    /// they are whole groups (`from_rows8`), else [`Panels::unpack_block`].
    ///
    /// # Safety
    /// The CPU has AVX-512F/BW.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn load(&mut self, w: &KQuantMatrix, o0: usize, outputs: usize, b: usize) {
        if from_rows8::takes(w, o0, outputs) {
            // SAFETY: AVX-512F/BW (the caller's), `takes` holds, and these are its panels.
            unsafe { from_rows8::fill(w, self, o0, outputs, b) };
        } else {
            self.unpack_block(w, o0, outputs, b);
        }
    }

    /// Super-block `b` of each output as the file stores it (reassembled from interleaved
    /// rows where they are), unpacked one element at a time.
    fn unpack_block(&mut self, w: &KQuantMatrix, o0: usize, outputs: usize, b: usize) {
        let offset = w.unsigned_offset();
        let mut u = Unpacked::new();
        let mut buf = [0u8; 256];
        for i in 0..outputs {
            let (p, l) = (i / L, i % L);
            unpack(w.ty, w.block_at(o0 + i, b, &mut buf), &mut u);
            for (quad, v) in u.q.chunks_exact(4).enumerate() {
                let at = ((p * QUADS + quad) * L + l) * 4;
                for (dst, &q) in self.q[at..at + 4].iter_mut().zip(v) {
                    // In [0, 63]: the row kernel's unsigned operand.
                    *dst = q.wrapping_add(offset) as u8;
                }
            }
            for g in 0..16 {
                self.scale[(p * 16 + g) * L + l] = u.scale[g];
            }
            for i in 0..8 {
                let (lo, hi) = (u.min[2 * i], u.min[2 * i + 1]);
                self.min[(p * 8 + i) * L + l] = (lo & 0xffff) | (hi << 16);
            }
            self.d[p * L + l] = u.d;
            self.dmin[p * L + l] = u.dmin;
        }
    }
}

/// Writes outputs `o0 .. o0 + outputs` (at most 32) of every row of `y`: super-block by
/// super-block, each unpacked once into [`Panels`] and multiplied by every tile of rows, whose
/// sums wait in `acc [rows, P, L]` between super-blocks (added in the same order as in
/// registers, so the same bits).
///
/// # Safety
/// The CPU has AVX-512F/BW and VNNI; `y` points at `[rows, w.rows]` floats of which no other
/// thread accesses these outputs meanwhile; `acts` and `pairs` hold `rows` rows for `w`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn fill(
    w: &KQuantMatrix,
    acts: &KQuantActs,
    pairs: &[i32],
    rows: usize,
    o0: usize,
    outputs: usize,
    y: *mut f32,
) {
    let nb = w.cols / QK_K;
    let panels = outputs.div_ceil(L);
    let mut un = Panels::zeroed(panels);
    let mut acc = vec![0f32; rows * panels * L];
    for b in 0..nb {
        // SAFETY: AVX-512F/BW (this function's features).
        unsafe { un.load(w, o0, outputs, b) };
        if b + 1 < nb {
            // The next super-block's bytes start coming from memory while this one is
            // multiplied.
            prefetch_block(w, o0, outputs, b + 1);
        }
        for r0 in (0..rows).step_by(TILE_ROWS) {
            let tile = Tile {
                un: &un,
                nb,
                b,
                p: acts.q[r0 * w.cols..].as_ptr(),
                cols: w.cols,
                e: acts.e[r0 * nb..].as_ptr(),
                bsums: acts.bsums[r0 * nb * 16..].as_ptr(),
                pairs: pairs[r0 * nb * 8..].as_ptr(),
                offset: i32::from(w.unsigned_offset()),
                acc: acc[r0 * panels * L..].as_mut_ptr(),
            };
            macro_rules! by_minimum {
                ($r:literal, $p:literal) => {
                    if w.has_minimum() {
                        tile.run::<$r, $p, true>()
                    } else {
                        tile.run::<$r, $p, false>()
                    }
                };
            }
            macro_rules! by_panels {
                ($r:literal) => {
                    if panels == 1 {
                        by_minimum!($r, 1)
                    } else {
                        by_minimum!($r, 2)
                    }
                };
            }
            // SAFETY: rows r0 .. r0 + R of the activations and of acc exist; the panels hold
            // `panels` panels of super-block b.
            unsafe {
                match (rows - r0).min(TILE_ROWS) {
                    1 => by_panels!(1),
                    2 => by_panels!(2),
                    3 => by_panels!(3),
                    _ => by_panels!(4),
                }
            }
        }
    }
    let last_lanes = outputs - (panels - 1) * L;
    for (r, sums) in acc.chunks_exact(panels * L).enumerate() {
        for p in 0..panels {
            let lanes = if p + 1 == panels { last_lanes } else { L };
            // SAFETY (caller): outputs o0 + p·L .. + lanes of row r are this task's; `sums`
            // holds them.
            unsafe {
                std::ptr::copy_nonoverlapping(sums[p * L..].as_ptr(), y.add(r * w.rows + o0 + p * L), lanes)
            };
        }
    }
}

/// Asks the CPU to bring super-block `b` of outputs `o0 .. o0 + outputs` into its caches (a
/// hint: no effect on results).
fn prefetch_block(w: &KQuantMatrix, o0: usize, outputs: usize, b: usize) {
    let nb = w.cols / QK_K;
    let data: &[u8] = &w.data;
    if from_rows8::takes(w, o0, outputs) {
        let group_bytes = from_rows8::GROUP * w.block_bytes;
        for g in o0 / from_rows8::GROUP..(o0 + outputs) / from_rows8::GROUP {
            super::prefetch(&data[(g * nb + b) * group_bytes..][..group_bytes]);
        }
    } else if w.grouped_rows == 0 {
        for o in o0..o0 + outputs {
            super::prefetch(&data[(o * nb + b) * w.block_bytes..][..w.block_bytes]);
        }
    }
}

/// One register tile: `R` activation rows from row `r0` × `P` panels, one super-block.
struct Tile<'a> {
    un: &'a Panels,
    nb: usize,
    /// The super-block.
    b: usize,
    /// `p [.., cols]`, `e [.., nb]`, `bsums [.., nb, 16]`, `pairs [.., nb, 8]` from row `r0`.
    p: *const i8,
    cols: usize,
    e: *const f32,
    bsums: *const i32,
    pairs: *const i32,
    offset: i32,
    /// The sums so far, `[R, P, L]` from row `r0`.
    acc: *mut f32,
}

impl Tile<'_> {
    /// Adds super-block `b`'s terms to the tile's sums, in the row kernel's float order.
    ///
    /// # Safety
    /// The CPU has AVX-512F/BW and VNNI; `R` rows of the activations and of `acc` exist from
    /// the tile's pointers; the panels hold `P` panels; no other thread accesses `acc`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn run<const R: usize, const P: usize, const MIN: bool>(&self) {
        let (nb, b, un) = (self.nb, self.b, self.un);
        let mut y = [[_mm512_setzero_ps(); P]; R];
        for (r, y_r) in y.iter_mut().enumerate() {
            for (p, y_rp) in y_r.iter_mut().enumerate() {
                // SAFETY (caller): acc holds R rows of P panels.
                *y_rp = unsafe { _mm512_loadu_ps(self.acc.add((r * P + p) * L)) };
            }
        }
        let mut isum = [[_mm512_setzero_si512(); P]; R];
        // SAFETY (all loads): panels p < P of the super-block, rows r < R of the activations
        // (p at r·cols + 256b + 4·quad, bsums at (r·nb + b)·16 + g, pairs at (r·nb + b)·8 + i,
        // e at r·nb + b).
        unsafe {
            for g in 0..16 {
                let mut t = [[_mm512_setzero_si512(); P]; R];
                for (r, t_r) in t.iter_mut().enumerate() {
                    let bs = *self.bsums.add((r * nb + b) * 16 + g);
                    let start = _mm512_set1_epi32(-self.offset * bs);
                    t_r.iter_mut().for_each(|v| *v = start);
                }
                for quad in 4 * g..4 * g + 4 {
                    let mut wv = [_mm512_setzero_si512(); P];
                    for (p, wp) in wv.iter_mut().enumerate() {
                        let at = ((p * QUADS + quad) * L) * 4;
                        *wp = _mm512_loadu_si512(un.q.as_ptr().add(at) as *const __m512i);
                    }
                    for (r, t_r) in t.iter_mut().enumerate() {
                        let at = r * self.cols + b * QK_K + 4 * quad;
                        let a = _mm512_set1_epi32((self.p.add(at) as *const i32).read_unaligned());
                        for (t_rp, wp) in t_r.iter_mut().zip(&wv) {
                            *t_rp = _mm512_dpbusd_epi32(*t_rp, *wp, a);
                        }
                    }
                }
                for p in 0..P {
                    let at = (p * 16 + g) * L;
                    let sc = _mm512_loadu_si512(un.scale.as_ptr().add(at) as *const __m512i);
                    for r in 0..R {
                        isum[r][p] = _mm512_add_epi32(isum[r][p], _mm512_mullo_epi32(t[r][p], sc));
                    }
                }
            }
            let mut msum = [[_mm512_setzero_si512(); P]; R];
            if MIN {
                for i in 0..8 {
                    let mut mn = [_mm512_setzero_si512(); P];
                    for (p, mn_p) in mn.iter_mut().enumerate() {
                        let at = (p * 8 + i) * L;
                        *mn_p = _mm512_loadu_si512(un.min.as_ptr().add(at) as *const __m512i);
                    }
                    for (r, msum_r) in msum.iter_mut().enumerate() {
                        let bs = _mm512_set1_epi32(*self.pairs.add((r * nb + b) * 8 + i));
                        for (m_rp, mn_p) in msum_r.iter_mut().zip(&mn) {
                            *m_rp = _mm512_dpwssd_epi32(*m_rp, *mn_p, bs);
                        }
                    }
                }
            }
            for p in 0..P {
                let dv = _mm512_loadu_ps(un.d.as_ptr().add(p * L));
                let dm = _mm512_loadu_ps(un.dmin.as_ptr().add(p * L));
                for r in 0..R {
                    let e = _mm512_set1_ps(*self.e.add(r * nb + b));
                    let term = _mm512_mul_ps(_mm512_mul_ps(dv, e), _mm512_cvtepi32_ps(isum[r][p]));
                    y[r][p] = _mm512_add_ps(y[r][p], term);
                    if MIN {
                        let m = _mm512_cvtepi32_ps(msum[r][p]);
                        let term = _mm512_mul_ps(_mm512_mul_ps(dm, e), m);
                        y[r][p] = _mm512_sub_ps(y[r][p], term);
                    }
                }
            }
        }
        for (r, y_r) in y.iter().enumerate() {
            for (p, y_rp) in y_r.iter().enumerate() {
                // SAFETY (caller): acc holds R rows of P panels.
                unsafe { _mm512_storeu_ps(self.acc.add((r * P + p) * L), *y_rp) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::ggml::GgmlType;
    use super::*;
    use crate::kernels::lowp::RawBytes;

    /// Random super-blocks of `ty`: random bytes (every quant and sub-scale pattern) with
    /// normal f16 scales 2^-8 .. 2^-3 of either sign at the type's scale offsets.
    fn random_blocks(seed: &mut u64, ty: GgmlType, n_blocks: usize) -> Vec<u8> {
        let mut next = || {
            *seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            *seed >> 33
        };
        let (_, size) = ty.block().unwrap();
        let scales: &[usize] = match ty {
            GgmlType::Q2_K => &[80, 82],
            GgmlType::Q3_K => &[108],
            GgmlType::Q6_K => &[208],
            _ => &[0, 2],
        };
        let mut data: Vec<u8> = (0..n_blocks * size).map(|_| next() as u8).collect();
        for block in data.chunks_exact_mut(size) {
            for &at in scales {
                let h = ((next() % 2) << 15) | ((7 + next() % 6) << 10) | (next() % 1024);
                block[at..at + 2].copy_from_slice(&(h as u16).to_le_bytes());
            }
        }
        data
    }

    /// The GEMM gives the portable row kernel's bits on every K-quant, for tile remainders
    /// (rows 1..=9, 17, 64), outputs not a multiple of a panel or a task, 1 and 3 super-blocks.
    #[test]
    fn the_gemm_gives_the_row_kernels_bits() {
        if !crate::kernels::lowp::has_vnni() {
            eprintln!("skipped: no AVX-512 VNNI on this CPU");
            return;
        }
        let mut seed = 53u64;
        for ty in [
            GgmlType::Q2_K,
            GgmlType::Q3_K,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ] {
            // Interleaved by eight (on this CPU): panels of two groups, of one (24, 40), and
            // rows after the groups (17, 33, 70).
            for (d_out, cols) in [(1, 256), (17, 768), (24, 512), (33, 256), (40, 256), (70, 512)] {
                let data = random_blocks(&mut seed, ty, d_out * cols / QK_K);
                let w = KQuantMatrix::from_ggml(ty, RawBytes::owned(data), d_out, cols).unwrap();
                assert!(runs(&w));
                for rows in [1, 2, 3, 4, 5, 7, 8, 9, 17, 64] {
                    let x: Vec<f32> = (0..rows * cols)
                        .map(|_| {
                            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                            ((seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * 3.0
                        })
                        .collect();
                    let mut want = vec![f32::NAN; rows * d_out];
                    crate::kernels::lowp::product_with(&w, Kernel::Portable, &mut want, &x, rows);
                    let mut got = vec![f32::NAN; rows * d_out];
                    product(&w, &mut got, &x, rows);
                    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            a.to_bits(),
                            b.to_bits(),
                            "{ty} {d_out}x{cols} rows {rows}: y[{}][{}] {a} vs {b}",
                            i / d_out,
                            i % d_out
                        );
                    }
                }
            }
        }
    }

    /// The panels read from interleaved rows are the unpacked file blocks', byte for byte, for
    /// both interleaved types, a panel of two groups and one of one.
    #[test]
    fn panels_from_interleaved_rows_are_the_unpacked_ones() {
        if !crate::kernels::lowp::has_vnni() {
            eprintln!("skipped: no AVX-512 VNNI on this CPU");
            return;
        }
        let mut seed = 7u64;
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            let (d_out, cols) = (56, 768);
            let data = random_blocks(&mut seed, ty, d_out * cols / QK_K);
            let w = KQuantMatrix::from_ggml(ty, RawBytes::owned(data), d_out, cols).unwrap();
            assert!(w.is_interleaved());
            for (o0, outputs) in [(0, 32), (32, 24), (48, 8)] {
                assert!(from_rows8::takes(&w, o0, outputs));
                let panels = outputs.div_ceil(L);
                let (mut want, mut got) = (Panels::zeroed(panels), Panels::zeroed(panels));
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                for b in 0..cols / QK_K {
                    want.unpack_block(&w, o0, outputs, b);
                    // SAFETY: AVX-512 VNNI (checked above) includes F/BW; `takes` holds.
                    unsafe { from_rows8::fill(&w, &mut got, o0, outputs, b) };
                    let what = format!("{ty} outputs {o0}..{}, super-block {b}", o0 + outputs);
                    assert_eq!(got.q, want.q, "{what}: values");
                    assert_eq!(got.scale, want.scale, "{what}: scales");
                    assert_eq!(got.min, want.min, "{what}: minima");
                    assert_eq!(bits(&got.d), bits(&want.d), "{what}: d");
                    assert_eq!(bits(&got.dmin), bits(&want.dmin), "{what}: dmin");
                }
            }
        }
    }
}
