//! ggml's block formats used as stored: `Q4_0`, `Q4_1` and `Q8_0` weights (32 per block, see
//! [`super::ggml`]) times activations quantised on the fly to `Q8_0`-style blocks, as
//! llama.cpp's `ggml_vec_dot_q4_1_q8_1` does:
//!
//! ```text
//! activations, block b of row r:  e_b = max_{j∈b} |x_j| / 127,  p_j = round(x_j / e_b)
//!                                  (ties to even, where ggml rounds them away from zero)
//! Q4_0 weight j of block b:       (n_j - 8) d_b          n_j ∈ [0, 15] the stored nibble
//! Q4_1:                           n_j d_b + m_b
//! Q8_0:                           q_j d_b                q_j ∈ [-127, 127]
//!
//! y = Σ_b d_b e_b I_b + Σ_b c_b f_b    with
//!   Q4_0: I_b = Σ n_j p_j,  c_b = -8 d_b,  f_b = e_b Σ p_j
//!   Q4_1: I_b = Σ n_j p_j,  c_b = m_b,     f_b = e_b Σ p_j
//!   Q8_0: I_b = Σ q_j p_j,  no offset term
//!         (AVX-512: I_b = Σ q_j (p_j + 128),  c_b = -128 d_b Σ q_j,  f_b = e_b)
//! ```
//!
//! `vpdpbusd` (AVX-512) and `vpmaddubsw` (AVX2) multiply unsigned by signed bytes: the 4-bit
//! nibbles are the unsigned side against signed activations. `Q8_0` activations are stored
//! shifted by 128, the unsigned side of AVX-512's products against signed `Q8_0` weights, the
//! shift taken back by `c_b f_b`; the portable and AVX2 kernels unshift them and sum `q_j p_j`
//! as llama.cpp does. The integer sums `I_b` are exact. The portable kernel sums the block
//! terms in 8 lanes (block `b` in lane `b mod 8`), the order the AVX2 kernel (`blocks/avx2.rs`) keeps,
//! so the two give the same bits; the AVX-512 kernel's order differs (16 lanes, two
//! accumulators, the offset terms apart).
//!
//! The weights are read in place, as the file stores them ([`RawBytes`], a range of the
//! file's memory map): per block the f16 scale `d_b` (and for `Q4_1` the f16 minimum `m_b`),
//! then 16 bytes of nibbles (low nibbles elements 0–15, high nibbles 16–31) or 32 bytes of
//! `Q8_0` weights; rows of blocks contiguous. Only `Q8_0`'s offset terms `c_b` (which need the
//! sum of a block's weights) are computed once at load, 4 bytes per 34-byte block; the scales
//! are widened from f16 as the blocks are read (exactly, as [`f16_to_f32`]). The AVX-512
//! kernel takes two blocks per step: for 4-bit weights it expands the 2 × 16 nibble bytes of
//! blocks `b, b+1` to `[low b, low b+1, high b, high b+1]`, so the activations of each pair of
//! blocks are stored in that order ([`pair_order`]). A decoding step (one activation row)
//! takes four weight rows per pass (`row_outputs`), prefetched `PREFETCH_ROWS` rows ahead,
//! each row with its one-row kernel's bits (`blocks/avx512.rs`, `blocks/avx2.rs`).

use super::ggml::{f16_to_f32, GgmlType};
use super::{act_quant, Kernel, PackedFormat, RawBytes};
use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

/// Elements per block.
pub const BLOCK: usize = 32;
/// Weight rows a decoding step's kernels take per pass (`row_outputs`).
#[cfg(target_arch = "x86_64")]
const OUTPUTS: usize = 4;
/// How far ahead (in weight rows) a decoding step's kernels prefetch the rows they will take
/// (four interleaved rows hide the stream from the hardware prefetcher). SmolLM2 Q4_1, one
/// thread, decode tokens per CPU-second on a loaded Zen 4: AVX-512 ~71 without, ~107 at 8
/// rows, ~115 at 16, ~120 at 32, ~103 at 64; AVX2 ~95 at 16 and 32. Both kernels ask for them
/// into L2 (`prefetcht1`; into L1 the requests hold the miss buffers the kernel's own loads
/// need), every line of them: Llama-3.2-1B `Q8_0` decode, one thread, quiet Zen 4, AVX-512
/// 8.5-9.0 -> 11.6-12.9 tokens/s (its pairs of 68 bytes span two lines one time in sixteen,
/// which one request a pair missed), AVX2 7.4-7.8 -> 14.6-15.4.
#[cfg(target_arch = "x86_64")]
const PREFETCH_ROWS: usize = 16;

/// The ggml block formats multiplied directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockKind {
    Q4_0,
    Q4_1,
    Q8_0,
}

impl BlockKind {
    /// The kind of a ggml type, if it is one of these.
    pub fn of(ty: GgmlType) -> Option<BlockKind> {
        match ty {
            GgmlType::Q4_0 => Some(BlockKind::Q4_0),
            GgmlType::Q4_1 => Some(BlockKind::Q4_1),
            GgmlType::Q8_0 => Some(BlockKind::Q8_0),
            _ => None,
        }
    }

    fn ggml(self) -> GgmlType {
        match self {
            BlockKind::Q4_0 => GgmlType::Q4_0,
            BlockKind::Q4_1 => GgmlType::Q4_1,
            BlockKind::Q8_0 => GgmlType::Q8_0,
        }
    }

    /// Bytes of weights per block (nibbles or bytes), without the scales.
    fn q_bytes(self) -> usize {
        match self {
            BlockKind::Q8_0 => 32,
            _ => 16,
        }
    }

    /// Bytes of one stored block: the scales, then the weights.
    fn block_bytes(self) -> usize {
        self.scale_bytes() + self.q_bytes()
    }

    /// Bytes of a stored block before its weights: `d_b` (f16), and `m_b` (f16) for `Q4_1`.
    fn scale_bytes(self) -> usize {
        match self {
            BlockKind::Q4_1 => 4,
            _ => 2,
        }
    }

    fn nibbles(self) -> bool {
        self != BlockKind::Q8_0
    }
}

/// `W [rows, cols]` of ggml blocks, `cols` a multiple of 32, read where they are stored.
#[derive(Clone, Debug)]
pub struct BlockMatrix {
    kind: BlockKind,
    rows: usize,
    cols: usize,
    /// Blocks per row.
    nb: usize,
    /// [rows, nb, block_bytes] as stored (a range of the file's map, or owned bytes).
    blocks: RawBytes,
    /// `Q8_0` only, [rows, nb]: `c_b = -128 d_b Σ_j q_j` (empty for the 4-bit kinds, whose
    /// `c_b` is `-8 d_b` or `m_b`, read from the block).
    q8_offsets: Vec<f32>,
}

/// Activations of one call: `[n, nb, 32]` bytes (`p` as i8 for 4-bit weights, in pair order;
/// `p + 128` for Q8_0 weights, in natural order), `e [n, nb]`, `f [n, nb]`, and `e` spread over
/// the 16 lanes of each pair of blocks as the AVX-512 kernel sums them `[n, nb / 2, 16]`.
pub struct BlockActs {
    nb: usize,
    q: Vec<u8>,
    e: Vec<f32>,
    f: Vec<f32>,
    lanes: Vec<f32>,
}

/// `c_b = −128 · d_b · Σ_j q_bj` of every `Q8_0` block of `data` (34 bytes: the f16 scale
/// `d_b`, then 32 int8 `q_bj`): one pass over the weights, in runs of `Q8_RUN` blocks over the
/// thread pool (a 1B model's `Q8_0` file is 1.3 GB), each block's 32 bytes summed as one
/// fixed-size array, which the compiler vectorises.
fn q8_offsets(data: &[u8]) -> Vec<f32> {
    const BLOCK_BYTES: usize = 34;
    const Q8_RUN: usize = 4096;
    let mut offsets = vec![0.0f32; data.len() / BLOCK_BYTES];
    offsets
        .par_chunks_mut(Q8_RUN)
        .zip(data.par_chunks(Q8_RUN * BLOCK_BYTES))
        .for_each(|(offsets, blocks)| {
            for (c, block) in offsets.iter_mut().zip(blocks.chunks_exact(BLOCK_BYTES)) {
                let (scale, qs) = block.split_at(2);
                let scale = f16_to_f32(u16::from_le_bytes([scale[0], scale[1]]));
                let qs: &[u8; 32] = qs.try_into().unwrap_or(&[0; 32]);
                let sum: i32 = qs.iter().map(|&q| i32::from(q as i8)).sum();
                *c = -128.0 * scale * sum as f32;
            }
        });
    offsets
}

/// Where element `j` of block `b` of a row is stored among the activations of a 4-bit product:
/// blocks are taken in pairs `(2i, 2i+1)` stored as `[low 2i, low 2i+1, high 2i, high 2i+1]`
/// (16 elements each); a last unpaired block keeps its natural order.
pub fn pair_order(b: usize, j: usize, nb: usize) -> usize {
    if b / 2 * 2 + 1 >= nb {
        return b * BLOCK + j;
    }
    let base = (b / 2) * 2 * BLOCK;
    let (half, i) = (j / 16, j % 16);
    base + half * 32 + (b % 2) * 16 + i
}

/// The lane of an AVX-512 step (two blocks) that element `j` of block `b % 2` is summed in:
/// 4-bit: `[b0: 0-3, b1: 4-7, b0: 8-11, b1: 12-15]`; Q8_0: `[b0: 0-7, b1: 8-15]`.
fn lane_block(nibbles: bool, lane: usize) -> usize {
    if nibbles {
        (lane / 4) % 2
    } else {
        lane / 8
    }
}

impl BlockMatrix {
    /// A ggml tensor of `rows` rows of `cols` elements from a copy of `data` (as the GGUF file
    /// holds it), or why not; see [`BlockMatrix::in_place`].
    pub fn from_ggml(
        ty: GgmlType,
        data: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<BlockMatrix, String> {
        BlockMatrix::in_place(ty, RawBytes::owned(data.to_vec()), rows, cols)
    }

    /// A ggml tensor of `rows` rows of `cols` elements multiplied where `data` holds it (a
    /// range of a GGUF file's map, shared, not copied), or why not: the type must be one of
    /// [`BlockKind`] and `data` exactly its blocks.
    pub fn in_place(
        ty: GgmlType,
        data: RawBytes,
        rows: usize,
        cols: usize,
    ) -> Result<BlockMatrix, String> {
        let kind = BlockKind::of(ty).ok_or_else(|| {
            format!(
                "ggml type {} is not multiplied in blocks (Q4_0, Q4_1, Q8_0 are)",
                ty.name()
            )
        })?;
        if !cols.is_multiple_of(BLOCK) {
            return Err(format!(
                "rows of {cols} elements are not whole {BLOCK}-element blocks"
            ));
        }
        let nb = cols / BLOCK;
        let (_, block_bytes) = ty.block().expect("supported type");
        if rows
            .checked_mul(nb)
            .and_then(|n| n.checked_mul(block_bytes))
            != Some(data.len())
        {
            return Err(format!(
                "{rows} x {cols} {} needs {} bytes, the data has {}",
                ty.name(),
                rows * nb * block_bytes,
                data.len()
            ));
        }
        debug_assert_eq!(block_bytes, kind.block_bytes());
        let q8_offsets = match kind {
            BlockKind::Q8_0 => q8_offsets(&data),
            _ => Vec::new(),
        };
        Ok(BlockMatrix {
            kind,
            rows,
            cols,
            nb,
            blocks: data,
            q8_offsets,
        })
    }

    /// The stored block `b` of row `o`.
    fn block(&self, o: usize, b: usize) -> &[u8] {
        let bb = self.kind.block_bytes();
        let at = (o * self.nb + b) * bb;
        &self.blocks[at..at + bb]
    }

    /// The weights (nibbles or bytes) of block `b` of row `o`.
    fn qs(&self, o: usize, b: usize) -> &[u8] {
        &self.block(o, b)[self.kind.scale_bytes()..]
    }

    /// `d_b` of block `b` of row `o`.
    fn d(&self, o: usize, b: usize) -> f32 {
        let block = self.block(o, b);
        f16_to_f32(u16::from_le_bytes([block[0], block[1]]))
    }

    /// `c_b` of block `b` of row `o`.
    fn c(&self, o: usize, b: usize) -> f32 {
        match self.kind {
            BlockKind::Q4_0 => -8.0 * self.d(o, b),
            BlockKind::Q4_1 => {
                let block = self.block(o, b);
                f16_to_f32(u16::from_le_bytes([block[2], block[3]]))
            }
            BlockKind::Q8_0 => self.q8_offsets[o * self.nb + b],
        }
    }

    pub fn kind(&self) -> BlockKind {
        self.kind
    }

    /// The ggml type of the blocks.
    pub fn ggml_type(&self) -> GgmlType {
        self.kind.ggml()
    }

    /// Bytes of the weights (the stored blocks, mapped or owned) and of what was computed
    /// from them at load.
    pub fn bytes(&self) -> usize {
        self.blocks.len() + self.q8_offsets.len() * 4
    }

    /// The stored blocks this matrix reads.
    pub fn stored(&self) -> &RawBytes {
        &self.blocks
    }

    /// Quantises `x [n, cols]` into the activation blocks this weight multiplies.
    /// The widest vector code this CPU runs (at or below the kernel cap) rounds them: every
    /// version gives the same bytes ([`act_quant`]).
    pub fn quantize(&self, x: &[f32], n: usize) -> BlockActs {
        let kernel = super::widest_kernel(super::cpu_has);
        let (nb, nibbles) = (self.nb, self.kind.nibbles());
        let mut acts = BlockActs {
            nb,
            q: vec![0u8; n * self.cols],
            e: Vec::with_capacity(n * nb),
            f: Vec::with_capacity(n * nb),
            lanes: Vec::with_capacity(n * (nb / 2) * 16),
        };
        for (r, row) in x.chunks_exact(self.cols).enumerate() {
            let q_row = &mut acts.q[r * self.cols..(r + 1) * self.cols];
            for (b, xb) in row.chunks_exact(BLOCK).enumerate() {
                let xb: &[f32; BLOCK] = xb.try_into().expect("a block");
                let mut p = [0i8; BLOCK];
                let (e, sum) = act_quant::by_scale(kernel, xb, &mut p);
                if nibbles {
                    // Elements 0-15 and 16-31 each stay together in pair order.
                    for (half, p_half) in p.chunks_exact(16).enumerate() {
                        let at = pair_order(b, 16 * half, nb);
                        for (q, &v) in q_row[at..at + 16].iter_mut().zip(p_half) {
                            *q = v as u8;
                        }
                    }
                } else {
                    for (q, &v) in q_row[b * BLOCK..(b + 1) * BLOCK].iter_mut().zip(&p) {
                        *q = (v as u8) ^ 0x80; // p + 128
                    }
                }
                acts.e.push(e);
                acts.f.push(if nibbles { e * sum as f32 } else { e });
            }
            let e_row = &acts.e[r * nb..(r + 1) * nb];
            for pair in e_row.chunks_exact(2) {
                acts.lanes
                    .extend((0..16).map(|lane| pair[lane_block(nibbles, lane)]));
            }
        }
        acts
    }

    /// `y = Σ_b (d_b e_b) I_b + c_b f_b` of weight row `o` and activation row `r`, plain Rust
    /// (the reference of the SIMD kernels; Q8_0 has no offset term here: `I_b = Σ q_j p_j`).
    /// The block terms are summed in 8 lanes, block `b` into lane `b mod 8`, and the lanes
    /// added by [`sum_lanes`]: the order the AVX2 kernel keeps, so both give the same bits.
    fn row_product_portable(&self, acts: &BlockActs, o: usize, r: usize) -> f32 {
        let nb = self.nb;
        let xq = &acts.q[r * self.cols..(r + 1) * self.cols];
        let mut lanes = [0f32; 8];
        for b in 0..nb {
            let wb = self.qs(o, b);
            let de = self.d(o, b) * acts.e[r * nb + b];
            lanes[b % 8] += if self.kind.nibbles() {
                let isum: i32 = (0..16)
                    .map(|j| {
                        let lo = i32::from(wb[j] & 0x0f);
                        let hi = i32::from(wb[j] >> 4);
                        let p_lo = i32::from(xq[pair_order(b, j, nb)] as i8);
                        let p_hi = i32::from(xq[pair_order(b, j + 16, nb)] as i8);
                        lo * p_lo + hi * p_hi
                    })
                    .sum();
                de * isum as f32 + self.c(o, b) * acts.f[r * nb + b]
            } else {
                // The activations are stored as p + 128 (for the AVX-512 kernel).
                let isum: i32 = (0..BLOCK)
                    .map(|j| i32::from(wb[j] as i8) * i32::from((xq[b * BLOCK + j] ^ 0x80) as i8))
                    .sum();
                de * isum as f32
            };
        }
        sum_lanes(lanes)
    }
}

/// `Σ_l lanes_l` by halving: `(l_i + l_{i+4})`, then `(s_i + s_{i+2})`, then the two left
/// (how an 8-lane f32 vector is reduced).
pub(super) fn sum_lanes(lanes: [f32; 8]) -> f32 {
    let s4: [f32; 4] = std::array::from_fn(|i| lanes[i] + lanes[i + 4]);
    let s2: [f32; 2] = std::array::from_fn(|i| s4[i] + s4[i + 2]);
    s2[0] + s2[1]
}


impl BlockMatrix {
    /// The last, unpaired block (odd `nb`) of `o` against row `r` with its offset term, plain
    /// Rust; 0 for an even `nb` (inlined: the AVX-512 kernels add it to every output).
    #[inline(always)]
    fn tail_block(&self, acts: &BlockActs, o: usize, r: usize) -> f32 {
        if self.nb.is_multiple_of(2) {
            0.0
        } else {
            self.odd_tail_block(acts, o, r)
        }
    }

    /// [`tail_block`](Self::tail_block) of an odd `nb`.
    fn odd_tail_block(&self, acts: &BlockActs, o: usize, r: usize) -> f32 {
        let nb = self.nb;
        let b = nb - 1;
        let wb = self.qs(o, b);
        let xb = &acts.q[r * self.cols + b * BLOCK..r * self.cols + (b + 1) * BLOCK];
        let isum: i32 = if self.kind.nibbles() {
            (0..16)
                .map(|j| {
                    i32::from(wb[j] & 0x0f) * i32::from(xb[j] as i8)
                        + i32::from(wb[j] >> 4) * i32::from(xb[j + 16] as i8)
                })
                .sum()
        } else {
            (0..BLOCK)
                .map(|j| i32::from(wb[j] as i8) * i32::from(xb[j]))
                .sum()
        };
        self.d(o, b) * acts.e[r * nb + b] * isum as f32 + self.c(o, b) * acts.f[r * nb + b]
    }
}

impl PackedFormat for BlockMatrix {
    type Acts = BlockActs;

    fn rows(&self) -> usize {
        self.rows
    }

    fn cols(&self) -> usize {
        self.cols
    }

    fn runs(&self, kernel: Kernel) -> bool {
        match kernel {
            Kernel::Portable => true,
            Kernel::Avx2 => super::has_avx2(),
            Kernel::Avx512 => super::has_vnni(),
        }
    }

    fn quantize_acts(&self, x: &[f32], n: usize) -> BlockActs {
        self.quantize(x, n)
    }

    fn tile(&self, kernel: Kernel, acts: &BlockActs, o: usize, r0: usize, out: &mut [f32]) {
        match kernel {
            Kernel::Portable => {
                for (i, v) in out.iter_mut().enumerate() {
                    *v = self.row_product_portable(acts, o, r0 + i);
                }
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => {
                assert!(o < self.rows && (r0 + out.len()) * acts.nb <= acts.e.len());
                // SAFETY: Avx512 is only passed after runs(Avx512) (AVX-512F/BW/VL and
                // VNNI present); the assertion above bounds o and the activation rows;
                // `self.blocks` holds rows · nb whole blocks (checked by in_place) and
                // `q8_offsets` (Q8_0) one offset per block; `acts` came from self.quantize,
                // so its rows have self.cols bytes and nb / 2 lane patterns each.
                unsafe {
                    match out.len() {
                        1 => avx512::scaled_sums::<1>(self, acts, o, r0, out),
                        2 => avx512::scaled_sums::<2>(self, acts, o, r0, out),
                        3 => avx512::scaled_sums::<3>(self, acts, o, r0, out),
                        _ => avx512::scaled_sums::<4>(self, acts, o, r0, out),
                    }
                }
                for (i, v) in out.iter_mut().enumerate() {
                    *v += self.tail_block(acts, o, r0 + i);
                }
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                assert!(o < self.rows && (r0 + out.len()) * acts.nb <= acts.e.len());
                // SAFETY: Avx2 is only passed after runs(Avx2) (AVX2, FMA and F16C present);
                // the assertion bounds o and the activation rows, and `acts` came from
                // self.quantize (rows of self.cols bytes, nb scales each).
                unsafe { avx2::tile(self, acts, o, r0, out) }
            }
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Avx2 => unreachable!("runs(Avx2) is false off x86_64"),
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Avx512 => unreachable!("runs(Avx512) is false off x86_64"),
        }
    }

    fn row_outputs(&self, kernel: Kernel, acts: &BlockActs, o0: usize, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if kernel != Kernel::Portable {
            assert!(o0 + out.len() <= self.rows && self.nb <= acts.e.len());
            let done = out.len() / OUTPUTS * OUTPUTS;
            let ahead = PREFETCH_ROWS * self.nb * self.kind.block_bytes();
            let mut pad = (kernel == Kernel::Avx2).then(|| avx2::Padded::new(self, acts));
            let mut runs = out.chunks_exact_mut(OUTPUTS);
            for (k, run) in runs.by_ref().enumerate() {
                let o = o0 + k * OUTPUTS;
                // SAFETY: kernel is only passed after runs(kernel) (its CPU features
                // present); the assertion bounds the weight rows o .. o + OUTPUTS and
                // activation row 0 of `acts`, which self.quantize made (and `pad` from it).
                unsafe {
                    match pad.as_mut() {
                        None => avx512::outputs::<OUTPUTS>(self, acts, o, run, ahead),
                        Some(pad) => avx2::outputs::<OUTPUTS>(self, acts, pad, o, run, ahead),
                    }
                }
            }
            for (i, v) in runs.into_remainder().iter_mut().enumerate() {
                self.tile(kernel, acts, o0 + done + i, 0, std::slice::from_mut(v));
            }
            if kernel == Kernel::Avx512 {
                for (i, v) in out[..done].iter_mut().enumerate() {
                    *v += self.tail_block(acts, o0 + i, 0);
                }
            }
            return;
        }
        for (i, v) in out.iter_mut().enumerate() {
            self.tile(kernel, acts, o0 + i, 0, std::slice::from_mut(v));
        }
    }
}
