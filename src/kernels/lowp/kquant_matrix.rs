//! The K-quants (`Q2_K` … `Q6_K`, super-blocks of 256, see [`super::kquants`]) and the other
//! ggml block types `Q5_0`, `Q5_1`, `IQ4_NL` and `MXFP4` (blocks of 32, see [`super::ggml`])
//! multiplied as stored, as llama.cpp's `ggml_vec_dot_*` do: the activations are quantised on the fly to
//! 8 bits, the products summed in integers per block, and the f32 scales applied once a block.
//!
//! ```text
//! activations, Q8_K (for the K-quants): per 256,  m = the x_j of largest |x_j|,
//!     p_j = min(127, round(-127 x_j / m)),  e = -m / 127  (f32),  bsums_g = Σ_{j∈g} p_j per 16
//! activations, Q8_0 (Q5_0, IQ4_NL, MXFP4) / Q8_1 (Q5_1): per 32,  a = max |x_j|,
//!     p_j = round(127 x_j / a),  e = f16(a / 127),  Q8_1 also s = f16((a / 127) Σ p_j)
//!     (rounding ties to even, as llama.cpp's AVX2 `quantize_row_q8_0` and the
//!     `nearest_int` of `quantize_row_q8_K_ref`)
//!
//! weight element of group g (16) of super-block b:  d_b sc_g q_j − dmin_b m_g
//!     (Q3_K: q_j = low − 4 (1 − h_j), Q6_K: q_j = value − 32, no minimum)
//!
//! y = Σ_b  (d_b e_b) I_b − (dmin_b e_b) M_b,   I_b = Σ_g sc_g Σ_{j∈g} q_j p_j,
//!                                              M_b = Σ_g m_g bsums_g
//! Q5_0 / IQ4_NL:  y = Σ_b (d_b e_b) Σ_j q_j p_j     (q_j = value − 16, or IQ4_NL's level)
//! MXFP4:          y = Σ_b (d_b e_b) Σ_j q_j p_j     (q_j twice the e2m1 value, d_b = 2^(e − 128):
//!                                                  ggml's `ggml_vec_dot_mxfp4_q8_0`)
//! Q5_1:           y = Σ_b (d_b e_b) Σ_j q_j p_j + m_b s_b
//! ```
//!
//! The integer sums are exact in i32 (at most 256 · 63 · 127 · 63 < 2^31), so two kernels that
//! apply the same f32 steps in the same block order agree bit for bit. The weights stay in the
//! file's bytes ([`RawBytes`]; `Q5_0` and `Q5_1` regrouped by eight blocks into a copy of the
//! same size, `q5_groups`); each block is unpacked into signed bytes and small integer
//! scales ([`Unpacked`]) once per tile of activation rows, and the inner loops are plain
//! `i8 × i8 → i32` sums over 16 or 32 elements that the compiler vectorises.

use super::ggml::{e8m0_half, f16_to_f32, five_bit_pair, GgmlType, IQ4_NL_LEVELS, MXFP4_LEVELS};
use super::kquants::{q3_k_scale, q4_k_scale_min, QK_K};
use super::{Kernel, PackedFormat, RawBytes};

mod activations;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod blocks32;
#[cfg(target_arch = "x86_64")]
pub(super) mod blocks32_gemm;
mod q5_groups;
pub(super) mod rows8;
#[cfg(target_arch = "x86_64")]
mod rows8_avx2;
#[cfg(target_arch = "x86_64")]
mod rows8_q6_k;
#[cfg(target_arch = "x86_64")]
mod superblocks;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(superblocks::OUTPUTS == blocks32::OUTPUTS);

/// A weight `[rows, cols]` of one of the types this module multiplies, as the file stores it.
#[derive(Clone, Debug)]
pub struct KQuantMatrix {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    /// Elements and bytes per block of `ty`.
    block: usize,
    block_bytes: usize,
    /// `[rows, cols / block, block_bytes]` as stored, `Q5_0` / `Q5_1` regrouped by eight
    /// blocks (`q5_groups`), `Q4_K` and `Q6_K` on AVX-512 VNNI and AVX2 CPUs with their rows
    /// interleaved by eight (`rows8`; the first `grouped_rows` rows).
    data: RawBytes,
    /// Rows held interleaved by eight (`rows8`); 0 when the file's layout is kept.
    grouped_rows: usize,
}

use activations::{quantize_q8_0, quantize_q8_k, ActFormat};
pub use activations::KQuantActs;

/// Whether [`KQuantMatrix::from_ggml`] holds its own copy of a tensor of `ty` (`Q5_0` /
/// `Q5_1` regrouped, `Q4_K` / `Q6_K` interleaved by eight on AVX-512 VNNI and AVX2 CPUs) rather than the
/// bytes it was given.
pub fn copies_blocks(ty: GgmlType) -> bool {
    q5_groups::regrouped(ty) || interleaves_here(ty)
}

/// Whether [`KQuantMatrix::from_ggml`] interleaves the rows of `ty` by eight on this CPU (into
/// a copy: `Q4_K` and `Q6_K` on AVX-512 VNNI or AVX2 CPUs).
fn interleaves_here(ty: GgmlType) -> bool {
    rows8::interleaves(ty) && (super::has_vnni() || super::has_avx2())
}

/// Whether [`KQuantMatrix`] multiplies blocks of `ty`.
pub fn is_kquant_product(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q5_0 | Q5_1 | IQ4_NL | MXFP4)
}

/// One weight block unpacked: signed values and, per group of 16, integer scale and minimum;
/// for the 32-blocks only `q[..32]`, `d` and `dmin` (Q5_1's `m`) are used.
struct Unpacked {
    q: [i8; QK_K],
    scale: [i32; 16],
    min: [i32; 16],
    d: f32,
    dmin: f32,
}

impl Unpacked {
    fn new() -> Unpacked {
        Unpacked {
            q: [0; QK_K],
            scale: [0; 16],
            min: [0; 16],
            d: 0.0,
            dmin: 0.0,
        }
    }
}

fn half_at(bytes: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([bytes[at], bytes[at + 1]]))
}

/// Unpacks one block of `ty` (see the layouts in [`super::kquants`] and [`super::ggml`]).
#[inline(always)]
fn unpack(ty: GgmlType, block: &[u8], u: &mut Unpacked) {
    match ty {
        GgmlType::Q2_K => {
            let (scales, qs) = (&block[0..16], &block[16..80]);
            (u.d, u.dmin) = (half_at(block, 80), half_at(block, 82));
            for n in 0..2 {
                for j in 0..4 {
                    let q = &mut u.q[128 * n + 32 * j..128 * n + 32 * j + 32];
                    for (q, &byte) in q.iter_mut().zip(&qs[32 * n..32 * n + 32]) {
                        *q = ((byte >> (2 * j)) & 3) as i8;
                    }
                }
            }
            for (g, &sc) in scales.iter().enumerate() {
                u.scale[g] = i32::from(sc & 0x0f);
                u.min[g] = i32::from(sc >> 4);
            }
        }
        GgmlType::Q3_K => {
            let (hmask, qs, scales) = (&block[0..32], &block[32..96], &block[96..108]);
            (u.d, u.dmin) = (half_at(block, 108), 0.0);
            for n in 0..2 {
                for j in 0..4 {
                    let q = &mut u.q[128 * n + 32 * j..128 * n + 32 * j + 32];
                    let bits = qs[32 * n..32 * n + 32].iter().zip(hmask);
                    for (q, (&byte, &h)) in q.iter_mut().zip(bits) {
                        let low = ((byte >> (2 * j)) & 3) as i8;
                        let high = ((h >> (4 * n + j)) & 1) as i8;
                        *q = low - 4 + 4 * high;
                    }
                }
            }
            for g in 0..16 {
                u.scale[g] = q3_k_scale(scales, g);
                u.min[g] = 0;
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            (u.d, u.dmin) = (half_at(block, 0), half_at(block, 2));
            let scales = &block[4..16];
            let (qh, qs) = match ty {
                GgmlType::Q5_K => (Some(&block[16..48]), &block[48..176]),
                _ => (None, &block[16..144]),
            };
            for c in 0..4 {
                let (lo, hi) = u.q[64 * c..64 * c + 64].split_at_mut(32);
                for (l, &byte) in qs[32 * c..32 * c + 32].iter().enumerate() {
                    lo[l] = (byte & 0x0f) as i8;
                    hi[l] = (byte >> 4) as i8;
                }
                if let Some(qh) = qh {
                    for (l, &h) in qh.iter().enumerate() {
                        lo[l] += 16 * ((h >> (2 * c)) & 1) as i8;
                        hi[l] += 16 * ((h >> (2 * c + 1)) & 1) as i8;
                    }
                }
            }
            for s in 0..8 {
                let (sc, m) = q4_k_scale_min(scales, s);
                u.scale[2 * s..2 * s + 2].fill(i32::from(sc));
                u.min[2 * s..2 * s + 2].fill(i32::from(m));
            }
        }
        GgmlType::Q6_K => {
            let (ql, qh, scales) = (&block[0..128], &block[128..192], &block[192..208]);
            (u.d, u.dmin) = (half_at(block, 208), 0.0);
            for n in 0..2 {
                let (ql, qh) = (&ql[64 * n..64 * n + 64], &qh[32 * n..32 * n + 32]);
                let q = &mut u.q[128 * n..128 * n + 128];
                for l in 0..32 {
                    let h = qh[l];
                    q[l] = ((ql[l] & 0x0f) | ((h & 3) << 4)) as i8 - 32;
                    q[l + 32] = ((ql[l + 32] & 0x0f) | (((h >> 2) & 3) << 4)) as i8 - 32;
                    q[l + 64] = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
                    q[l + 96] = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
                }
            }
            for (g, &sc) in scales.iter().enumerate() {
                u.scale[g] = i32::from(sc as i8);
                u.min[g] = 0;
            }
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let with_min = ty == GgmlType::Q5_1;
            let at = if with_min { 4 } else { 2 };
            u.d = half_at(block, 0);
            u.dmin = if with_min { half_at(block, 2) } else { 0.0 };
            let qh = u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]]);
            let offset = if with_min { 0 } else { 16 };
            for (j, &byte) in block[at + 4..at + 20].iter().enumerate() {
                let (lo, hi) = five_bit_pair(byte, qh, j);
                u.q[j] = (lo - offset) as i8;
                u.q[j + 16] = (hi - offset) as i8;
            }
        }
        GgmlType::IQ4_NL => {
            (u.d, u.dmin) = (half_at(block, 0), 0.0);
            for (j, &byte) in block[2..18].iter().enumerate() {
                u.q[j] = IQ4_NL_LEVELS[usize::from(byte & 0x0f)];
                u.q[j + 16] = IQ4_NL_LEVELS[usize::from(byte >> 4)];
            }
        }
        GgmlType::MXFP4 => {
            (u.d, u.dmin) = (e8m0_half(block[0]), 0.0);
            for (j, &byte) in block[1..17].iter().enumerate() {
                u.q[j] = MXFP4_LEVELS[usize::from(byte & 0x0f)];
                u.q[j + 16] = MXFP4_LEVELS[usize::from(byte >> 4)];
            }
        }
        _ => unreachable!("KQuantMatrix holds only the types of is_kquant_product"),
    }
}

/// `Σ_j a_j b_j` over equal-length i8 slices, in i32 (exact).
#[inline(always)]
fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| i32::from(x) * i32::from(y))
        .sum()
}

/// `I_b = Σ_g sc_g Σ_{j∈g} q_j p_j` of an unpacked super-block against 256 activations, or
/// `Σ_j q_j p_j` of a 32-block against 32.
#[inline(always)]
fn block_sum(u: &Unpacked, p: &[i8]) -> i32 {
    if p.len() != QK_K {
        return dot_i8(&u.q[..p.len()], p);
    }
    let mut total = 0i32;
    for g in 0..16 {
        total += u.scale[g] * dot_i8(&u.q[16 * g..16 * (g + 1)], &p[16 * g..16 * (g + 1)]);
    }
    total
}

impl KQuantMatrix {
    /// Wraps a tensor of `rows` rows of `cols` elements of `ty` (`data` as the GGUF file holds
    /// it: not copied, except `Q5_0` and `Q5_1`, whose blocks are regrouped by eight into a
    /// copy of the same size, see `q5_groups`), or says why not.
    pub fn from_ggml(
        ty: GgmlType,
        data: RawBytes,
        rows: usize,
        cols: usize,
    ) -> Result<KQuantMatrix, String> {
        Self::from_ggml_laid_out(ty, data, rows, cols, interleaves_here(ty))
    }

    /// [`from_ggml`](Self::from_ggml), with `Q4_K`'s and `Q6_K`'s rows interleaved by eight
    /// (into a copy of the same size, whole groups of eight rows interleaved, the rows after
    /// them as stored; the interleaved kernels of AVX-512 VNNI and AVX2 CPUs read them so) when
    /// `interleave` is set; a copy even when there is no whole group, so that the caller
    /// knows from the type alone ([`copies_blocks`]) that the given bytes are let go.
    pub fn from_ggml_laid_out(
        ty: GgmlType,
        data: RawBytes,
        rows: usize,
        cols: usize,
        interleave: bool,
    ) -> Result<KQuantMatrix, String> {
        if !is_kquant_product(ty) {
            return Err(format!(
                "ggml type {} is not multiplied by KQuantMatrix (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, \
                 Q5_0, Q5_1, IQ4_NL, MXFP4 are)",
                ty.name()
            ));
        }
        let (block, block_bytes) = ty.block().expect("a decoded type");
        if cols == 0 || !cols.is_multiple_of(block) {
            return Err(format!(
                "rows of {cols} elements are not whole {block}-element {} blocks",
                ty.name()
            ));
        }
        let need = rows
            .checked_mul(cols / block)
            .and_then(|n| n.checked_mul(block_bytes));
        if need != Some(data.len()) {
            return Err(format!(
                "{rows} x {cols} {} needs {} bytes, the data has {}",
                ty.name(),
                need.map_or("too many".to_string(), |n| n.to_string()),
                data.len()
            ));
        }
        let interleave = interleave && rows8::interleaves(ty);
        let grouped_rows = match interleave {
            true => rows / rows8::GROUP * rows8::GROUP,
            false => 0,
        };
        let data = if q5_groups::regrouped(ty) {
            RawBytes::owned(q5_groups::regroup(ty, &data, cols / block))
        } else if interleave {
            rows8::interleave(ty, &data, rows, cols / block)
        } else {
            data
        };
        Ok(KQuantMatrix {
            ty,
            rows,
            cols,
            block,
            block_bytes,
            data,
            grouped_rows,
        })
    }

    /// Whether the rows are held interleaved by eight (see [`from_ggml_laid_out`](Self::from_ggml_laid_out)).
    pub fn is_interleaved(&self) -> bool {
        self.grouped_rows > 0
    }

    /// Block `b` of row `o` as the file stores it (`Q5_0` / `Q5_1`: as regrouped): a slice of
    /// the stored bytes, or reassembled into `buf` from interleaved rows.
    #[inline(always)]
    fn block_at<'a>(&'a self, o: usize, b: usize, buf: &'a mut [u8; 256]) -> &'a [u8] {
        let nb = self.cols / self.block;
        if self.grouped_rows == 0 {
            let at = (o * nb + b) * self.block_bytes;
            return &self.data[at..at + self.block_bytes];
        }
        rows8::file_block(self.ty, &self.data, (self.rows, nb), (o, b), buf)
    }

    /// The ggml type of the blocks.
    pub fn ggml_type(&self) -> GgmlType {
        self.ty
    }

    /// Bytes of the stored blocks.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// The blocks multiplied: the file's own bytes, or for `Q5_0` / `Q5_1` their regrouped
    /// copy ([`copies_blocks`]).
    pub fn stored(&self) -> &RawBytes {
        &self.data
    }

    /// The blocks in the file's layout (`[rows, cols / block, block_bytes]`): the stored bytes
    /// where they are kept so, else reassembled from the interleaved rows or the `Q5_0` /
    /// `Q5_1` groups.
    pub fn file_bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        let nb = self.cols / self.block;
        if q5_groups::regrouped(self.ty) {
            return std::borrow::Cow::Owned(q5_groups::ungroup(self.ty, &self.data, nb));
        }
        if self.grouped_rows == 0 {
            return std::borrow::Cow::Borrowed(&self.data[..]);
        }
        let mut out = Vec::with_capacity(self.data.len());
        let mut buf = [0u8; 256];
        for o in 0..self.rows {
            for b in 0..nb {
                out.extend_from_slice(self.block_at(o, b, &mut buf));
            }
        }
        std::borrow::Cow::Owned(out)
    }

    /// Whether the type has the `− dmin m` term.
    fn has_minimum(&self) -> bool {
        matches!(self.ty, GgmlType::Q2_K | GgmlType::Q4_K | GgmlType::Q5_K)
    }

    fn act_format(&self) -> ActFormat {
        match self.ty {
            GgmlType::Q5_0 | GgmlType::IQ4_NL | GgmlType::MXFP4 => ActFormat::Q80,
            GgmlType::Q5_1 => ActFormat::Q81,
            _ => ActFormat::Q8K,
        }
    }

    /// Quantises `x [n, cols]` into the activation blocks this weight multiplies, with the
    /// widest vector code this CPU runs (at or below the kernel cap; every version gives the
    /// same bytes).
    pub fn quantize(&self, x: &[f32], n: usize) -> KQuantActs {
        self.quantize_with(super::widest_kernel(super::cpu_has), x, n)
    }

    /// [`quantize`](Self::quantize) with `kernel`'s vector code (`kernel` must run on this CPU).
    pub fn quantize_with(&self, kernel: Kernel, x: &[f32], n: usize) -> KQuantActs {
        let format = self.act_format();
        let nb = self.cols / self.block;
        let mut acts = KQuantActs {
            format,
            block: self.block,
            nb,
            q: vec![0; n * self.cols],
            e: vec![0.0; n * nb],
            bsums: vec![
                0;
                if format == ActFormat::Q8K {
                    n * self.cols / 16
                } else {
                    0
                }
            ],
            s: vec![0.0; if format == ActFormat::Q81 { n * nb } else { 0 }],
            psum: vec![0; if format == ActFormat::Q8K { 0 } else { n * nb }],
        };
        for (r, row) in x.chunks_exact(self.cols).take(n).enumerate() {
            let q = &mut acts.q[r * self.cols..(r + 1) * self.cols];
            let e = &mut acts.e[r * nb..(r + 1) * nb];
            match format {
                ActFormat::Q8K => {
                    let g = self.cols / 16;
                    quantize_q8_k(kernel, row, q, e, &mut acts.bsums[r * g..(r + 1) * g]);
                }
                ActFormat::Q80 | ActFormat::Q81 => {
                    let s = match format {
                        ActFormat::Q81 => &mut acts.s[r * nb..(r + 1) * nb],
                        _ => &mut [],
                    };
                    quantize_q8_0(kernel, row, q, e, s, &mut acts.psum[r * nb..(r + 1) * nb]);
                }
            }
        }
        acts
    }

    /// `out[i] = w_o · x_{r0+i}`, each block unpacked once for the tile; `isum(u, p, bsums)`
    /// gives a block's integer sum from the unpacked block `u` (`I_b` of a super-block,
    /// `Σ q_j p_j` of a 32-block; the only step the kernels do differently). Inlined into each
    /// kernel, so that the SIMD ones compile it (and [`unpack`]) with their instructions. The
    /// 32-blocks' SIMD kernels (`blocks32.rs`) keep its f32 steps and their order.
    #[inline(always)]
    fn tile_with(
        &self,
        acts: &KQuantActs,
        o: usize,
        r0: usize,
        out: &mut [f32],
        isum: impl Fn(&Unpacked, &[i8], &[i32]) -> i32,
    ) {
        let nb = self.cols / self.block;
        let mut u = Unpacked::new();
        out.fill(0.0);
        for b in 0..nb {
            self.unpack_block(o, b, &mut u);
            for (i, y) in out.iter_mut().enumerate() {
                let r = r0 + i;
                let e = acts.e[r * nb + b];
                let at = r * self.cols + b * self.block;
                let p = &acts.q[at..at + self.block];
                match acts.format {
                    ActFormat::Q8K => {
                        let g0 = (r * self.cols + b * QK_K) / 16;
                        let bsums = &acts.bsums[g0..g0 + 16];
                        *y += (u.d * e) * isum(&u, p, bsums) as f32;
                        if self.has_minimum() {
                            let msum: i32 = u.min.iter().zip(bsums).map(|(&m, &s)| m * s).sum();
                            *y -= (u.dmin * e) * msum as f32;
                        }
                    }
                    ActFormat::Q80 => *y += (u.d * e) * isum(&u, p, &[]) as f32,
                    ActFormat::Q81 => {
                        *y += (u.d * e) * isum(&u, p, &[]) as f32;
                        *y += u.dmin * acts.s[r * nb + b];
                    }
                }
            }
        }
    }

    /// Unpacks block `b` of row `o`: as the file stores it, or from its group.
    #[inline(always)]
    fn unpack_block(&self, o: usize, b: usize, u: &mut Unpacked) {
        use q5_groups::{grouped_blocks, head_bytes, scales, values, GROUP};
        let (bb, nb) = (self.block_bytes, self.cols / self.block);
        if b >= grouped_blocks(self.ty, nb) {
            let mut buf = [0u8; 256];
            return unpack(self.ty, self.block_at(o, b, &mut buf), u);
        }
        let row = &self.data[o * nb * bb..(o + 1) * nb * bb];
        let (g, k) = (b / GROUP, b % GROUP);
        let group = &row[g * GROUP * bb..(g + 1) * GROUP * bb];
        let with_min = self.ty == GgmlType::Q5_1;
        let offset = if with_min { 0 } else { 16 };
        let stored = values(&group[head_bytes(with_min)..], k);
        for (q, v) in u.q.iter_mut().zip(stored) {
            *q = v as i8 - offset;
        }
        (u.d, u.dmin) = scales(group, k, with_min);
    }

    /// Whether output `o` and activation rows `r0 .. r0 + n` (`1 <= n <= ROW_TILE`) exist.
    #[cfg(target_arch = "x86_64")]
    fn rows_fit(&self, acts: &KQuantActs, o: usize, r0: usize, n: usize) -> bool {
        let acts_rows = acts.e.len() / acts.nb;
        o < self.rows && (1..=super::ROW_TILE).contains(&n) && r0 + n <= acts_rows
    }

    /// What to add to the unpacked values of this type to make them unsigned (for `vpdpbusd`
    /// and `vpmaddubsw`).
    #[cfg(target_arch = "x86_64")]
    fn unsigned_offset(&self) -> i8 {
        match self.ty {
            GgmlType::Q3_K => 4,
            GgmlType::Q6_K => 32,
            _ => 0,
        }
    }
}

/// Asks the CPU to bring `bytes` into its caches, a 64-byte line at a time: a hint for the
/// kernels that stream weights from memory, with no effect on any result.
#[cfg(target_arch = "x86_64")]
#[inline]
fn prefetch(bytes: &[u8]) {
    prefetch_with::<{ std::arch::x86_64::_MM_HINT_T0 }>(bytes)
}

/// [`prefetch`] into the L2 cache only (`prefetcht1`), for streams requested far ahead.
#[cfg(target_arch = "x86_64")]
#[inline]
fn prefetch_to_l2(bytes: &[u8]) {
    prefetch_with::<{ std::arch::x86_64::_MM_HINT_T1 }>(bytes)
}

/// Each 64-byte line of `bytes` requested with the hint `HINT`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_with<const HINT: i32>(bytes: &[u8]) {
    use std::arch::x86_64::_mm_prefetch;
    for line in bytes.chunks(64) {
        // SAFETY: a prefetch reads nothing architecturally; the address is inside `bytes`.
        unsafe { _mm_prefetch::<HINT>(line.as_ptr() as *const i8) };
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "kquant_gemm_avx512.rs"]
pub(super) mod gemm_avx512;

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// `Σ_g scale_g Σ_{j∈g} (q_j + offset) p_j` over one super-block: `vpdpbusd` sums four
    /// byte products per i32 lane, so lanes `4g'..4g'+4` of step `k` hold group `4k + g'`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F/BW and VNNI. `q_j + offset` must be in [0, 255] as u8 (the
    /// unsigned operand); the loads read 256 bytes of `q` and `p` and 16 scales, which the
    /// array types guarantee.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn shifted_sum(q: &[i8; 256], offset: i8, scale: &[i32; 16], p: &[i8; 256]) -> i32 {
        let idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
        let off = _mm512_set1_epi8(offset);
        let mut acc = _mm512_setzero_si512();
        for k in 0..4 {
            // SAFETY: 64 bytes from 64k < 256 of q and p, 4 scales from 4k < 16.
            let (qv, pv, sc4) = unsafe {
                (
                    _mm512_loadu_si512(q.as_ptr().add(64 * k) as *const __m512i),
                    _mm512_loadu_si512(p.as_ptr().add(64 * k) as *const __m512i),
                    _mm_loadu_si128(scale.as_ptr().add(4 * k) as *const __m128i),
                )
            };
            let dots = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_add_epi8(qv, off), pv);
            let sc = _mm512_permutexvar_epi32(idx, _mm512_castsi128_si512(sc4));
            acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(dots, sc));
        }
        _mm512_reduce_add_epi32(acc)
    }
}

impl PackedFormat for KQuantMatrix {
    type Acts = KQuantActs;

    fn rows(&self) -> usize {
        self.rows
    }

    fn cols(&self) -> usize {
        self.cols
    }

    /// The AVX2 and AVX-512 VNNI kernels multiply every type here (the 32-blocks' AVX-512
    /// kernel also uses AVX2, FMA and F16C).
    fn runs(&self, kernel: Kernel) -> bool {
        match kernel {
            Kernel::Portable => true,
            Kernel::Avx2 => super::has_avx2(),
            Kernel::Avx512 => super::has_vnni() && (self.block == QK_K || super::has_avx2()),
        }
    }

    fn quantize_acts(&self, x: &[f32], n: usize) -> KQuantActs {
        self.quantize(x, n)
    }

    fn tile(&self, kernel: Kernel, acts: &KQuantActs, o: usize, r0: usize, out: &mut [f32]) {
        match kernel {
            Kernel::Portable => self.tile_with(acts, o, r0, out, |u, p, _| block_sum(u, p)),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 if self.block == 32 => {
                assert!(
                    self.runs(Kernel::Avx512) && self.rows_fit(acts, o, r0, out.len()),
                    "the AVX-512 kernel needs AVX-512 VNNI and AVX2, and rows of this product"
                );
                // SAFETY: runs(Avx512) checked the features; the assertion bounds o and the
                // activation rows, and `acts` came from self.quantize.
                unsafe { blocks32::tile_avx512(self, acts, o, r0, out) }
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 if self.block == 32 => {
                assert!(
                    self.runs(Kernel::Avx2) && self.rows_fit(acts, o, r0, out.len()),
                    "the AVX2 kernel needs AVX2, FMA and F16C, and rows of this product"
                );
                // SAFETY: as above, for AVX2, FMA and F16C.
                unsafe { blocks32::tile_avx2(self, acts, o, r0, out) }
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 if superblocks::handles(self.ty) && super::has_avx2() => {
                assert!(
                    self.runs(kernel) && self.rows_fit(acts, o, r0, out.len()),
                    "the AVX-512 kernel does not run here, or the rows are not those of this \
                     product"
                );
                // SAFETY: runs(Avx512) checked AVX-512F/BW, has_avx2 AVX2, FMA and F16C; the
                // assertion bounds o and the activation rows, and `acts` came from
                // self.quantize.
                unsafe { superblocks::tile_avx512(self, acts, o, r0, out) }
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 if superblocks::handles(self.ty) => {
                assert!(
                    self.runs(Kernel::Avx2) && self.rows_fit(acts, o, r0, out.len()),
                    "the AVX2 kernel needs AVX2, FMA and F16C, and rows of this product"
                );
                // SAFETY: runs(Avx2) checked AVX2, FMA and F16C; the assertion bounds o and
                // the activation rows, and `acts` came from self.quantize.
                unsafe { superblocks::tile(self, acts, o, r0, out) }
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => {
                assert!(
                    self.runs(Kernel::Avx512),
                    "the AVX-512 kernel needs VNNI and K-quants"
                );
                let offset = self.unsigned_offset();
                self.tile_with(acts, o, r0, out, |u, p, bsums| {
                    let p: &[i8; QK_K] = p.try_into().expect("a super-block of activations");
                    // SAFETY: runs(Avx512) checked AVX-512F/BW/VNNI; the unpacked values
                    // plus this type's offset are in [0, 63] (Q2_K..Q6_K), so unsigned bytes.
                    let shifted = unsafe { avx512::shifted_sum(&u.q, offset, &u.scale, p) };
                    let taken: i32 = u.scale.iter().zip(bsums).map(|(&s, &b)| s * b).sum();
                    shifted - i32::from(offset) * taken
                })
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                assert!(
                    self.runs(Kernel::Avx2),
                    "the AVX2 kernel needs AVX2, FMA and F16C"
                );
                // SAFETY: runs(Avx2) checked AVX2, FMA and F16C.
                unsafe { avx2::tile(self, acts, o, r0, out) }
            }
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Avx2 => unreachable!("runs(Avx2) is false off x86_64"),
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Avx512 => unreachable!("runs(Avx512) is false off x86_64"),
        }
    }

    /// The SIMD kernels of the 32-blocks, and of `Q4_K` / `Q6_K`, take four weight rows per
    /// pass ([`blocks32::OUTPUTS`], [`superblocks::OUTPUTS`]; their bits); the rest runs
    /// [`tile`](PackedFormat::tile) row by row.
    fn row_outputs(&self, kernel: Kernel, acts: &KQuantActs, o0: usize, out: &mut [f32]) {
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if kernel != Kernel::Portable
            && self.grouped_rows == 0
            && (self.block == 32 || superblocks::handles(self.ty) && super::has_avx2())
        {
            let n = blocks32::OUTPUTS;
            assert!(
                self.runs(kernel) && o0 + out.len() <= self.rows && acts.e.len() >= acts.nb,
                "the {} kernel does not run here, or the rows are not those of this product",
                kernel.name()
            );
            let runs = out.chunks_exact_mut(n).enumerate();
            for (k, run) in runs {
                let o = o0 + k * n;
                // SAFETY: runs(kernel) checked its features (and has_avx2 AVX2, FMA and F16C
                // for the super-blocks' AVX-512 kernel); the assertion bounds the weight rows
                // o .. o + n and activation row 0, and `acts` came from self.quantize.
                unsafe {
                    match (kernel, self.block) {
                        (Kernel::Avx512, 32) => blocks32::outputs_avx512(self, acts, o, run),
                        (_, 32) => blocks32::outputs_avx2(self, acts, o, run),
                        (Kernel::Avx512, _) => superblocks::outputs_avx512(self, acts, o, run),
                        _ => superblocks::outputs_avx2(self, acts, o, run),
                    }
                }
            }
            done = out.len() / n * n;
        }
        for (i, v) in out[done..].iter_mut().enumerate() {
            self.tile(kernel, acts, o0 + done + i, 0, std::slice::from_mut(v));
        }
    }
}
