//! The register-tiled GEMM of ggml's block formats (`Q4_0`, `Q4_1`, `Q8_0`), for products of
//! many activation rows (prefill, batched decoding) with a [`BlockMatrix`] read in place:
//!
//! ```text
//! y_ro = Σ_b ( d_ob e_rb I_rob + c_ob f_rb )        I_rob an exact i32 block sum:
//!   Q4_0: I = Σ_j (n_j - 8) p_j     c = 0
//!   Q4_1: I = Σ_j n_j p_j           c = m_ob (the block's minimum), f_rb = e_rb Σ_j p_j
//!   Q8_0: I = Σ_j q_j p_j           c = 0
//! float order of every output, in every kernel:
//!   y ← 0;  for b in 0..nb { y ← fma(I_rob, d_ob · e_rb, y);  Q4_1: y ← fma(m_ob, f_rb, y) }
//! ```
//!
//! with the activations quantised as [`BlockMatrix::quantize`] does (`e_rb = max |x| / 127`,
//! `p = round(x / e)`, ties to even). The row kernel of [`BlockMatrix`] sums the same terms in
//! another order, so the two differ by float32 rounding only.
//!
//! The kernels (AVX-512 VNNI in `block_gemm_avx512.rs`, AVX2 in `block_gemm_avx2.rs`) are laid
//! out as the int8 GEMM is ([`super::Int8Matrix`]): outputs in lanes, no horizontal sums. Each
//! parallel task takes [`TASK_OUTPUTS`] outputs and first unpacks their stored blocks into a
//! *panel* of `L` outputs (16 for AVX-512, 8 for AVX2): per block `b` and group `g` of four
//! elements, the `L` outputs' four weights side by side (`[nb, 8, L, 4]` bytes: nibbles as
//! `0..=15`, `Q8_0` bytes as they are), with the scales widened to f32 (`d [nb, L]`, `m [nb, L]`).
//! The panel lives only while the task runs (a few tens of KiB, in cache, in a buffer each
//! thread keeps for its next task), so the weights stay in the file's map and nothing is
//! repacked at load. The unpacking loads each output's 16 weight bytes of a block at once and
//! transposes four outputs' loads in registers (`vpunpck{l,h}{dq,qdq}`), with no gathers:
//! gathers made unpacking cost more than the products it feeds at 16 rows. A register tile of
//! `R` activation rows × `P` panels then broadcasts four activation bytes against a 4 × `L`
//! slice of the panel per instruction (`vpdpbusd`, or `vpmaddubsw` + `vpmaddwd`), keeps one i32
//! sum per (row, output) for the block and one f32 sum per (row, output) for the whole row, and
//! writes row-major `y`.
//!
//! [`product`] with [`Kernel::Portable`] is the reference the SIMD kernels equal bit for bit: the
//! same integer sums and the same float operations (`f32::mul_add`, a library call where the
//! target has no FMA, so it is not what portable products run: they use the row kernel).

use super::blocks::{BlockKind, BlockMatrix, BLOCK};
use super::ggml::f16_to_f32;
use super::{act_quant, Kernel, PackedFormat};
use rayon::prelude::*;
use std::cell::RefCell;

/// The fewest activation rows for which [`super::PackedWeight::product_with`] takes the GEMM
/// (below it, unpacking the panels costs more than the tiles save).
pub const MIN_ROWS: usize = 8;
/// Outputs per parallel task.
pub const TASK_OUTPUTS: usize = 32;

/// Whether `kernel` has a block GEMM on this CPU.
pub fn runs(kernel: Kernel) -> bool {
    match kernel {
        Kernel::Portable => true,
        Kernel::Avx2 | Kernel::Avx512 => super::cpu_has(kernel),
    }
}

/// The activations of one product, quantised per block of 32.
pub struct GemmActs {
    /// `p [n, cols]` in the natural order of the elements.
    pub(super) p: Vec<i8>,
    /// `e [n, nb]`.
    pub(super) e: Vec<f32>,
    /// `f [n, nb] = e Σ_j p_j` (the factor of `Q4_1`'s minimum).
    pub(super) f: Vec<f32>,
    /// `Σ_j p_j [n, nb]` (`Q4_0`'s offset of 8 is taken back as `-8 Σ_j p_j`).
    pub(super) sum: Vec<i32>,
}

/// Quantises `x [n, cols]` into blocks of 32 as [`BlockMatrix::quantize`] does, with
/// `kernel`'s vector code where it has one ([`super::act_quant`]: the same bytes and bits);
/// `kernel` must run on this CPU.
pub fn quantize_with(kernel: Kernel, x: &[f32], n: usize, cols: usize) -> GemmActs {
    let nb = cols / BLOCK;
    let mut acts = GemmActs {
        p: vec![0i8; n * cols],
        e: Vec::with_capacity(n * nb),
        f: Vec::with_capacity(n * nb),
        sum: Vec::with_capacity(n * nb),
    };
    for (xb, pb) in x.chunks_exact(BLOCK).zip(acts.p.chunks_exact_mut(BLOCK)) {
        let xb: &[f32; BLOCK] = xb.try_into().expect("a block");
        let pb: &mut [i8; BLOCK] = pb.try_into().expect("a block");
        let (e, sum) = act_quant::by_scale(kernel, xb, pb);
        acts.e.push(e);
        acts.f.push(e * sum as f32);
        acts.sum.push(sum);
    }
    acts
}

/// The unpacked blocks of one task's panels (see the module doc), laid out by the kernel that
/// fills them: the 4-bit values or bytes `q`, the scales `d`, `Q4_1`'s minima `m`, `Q8_0`'s
/// starting sums `init`. Every element a task reads is written by its unpacking first, so a
/// buffer is reused as it is, only grown.
#[derive(Default)]
pub(super) struct Panels {
    pub q: Vec<u8>,
    pub d: Vec<f32>,
    pub m: Vec<f32>,
    pub init: Vec<i32>,
}

thread_local! {
    /// This thread's panels, kept between tasks (no allocation or zeroing per task).
    static PANELS: RefCell<Panels> = RefCell::default();
}

/// Runs `f` on this thread's panels, grown to at least `q` bytes and `scales` elements of `d`,
/// `m` and `init` each.
pub(super) fn with_panels<T>(q: usize, scales: usize, f: impl FnOnce(&mut Panels) -> T) -> T {
    fn at_least<E: Clone + Default>(v: &mut Vec<E>, n: usize) {
        if v.len() < n {
            v.resize(n, E::default());
        }
    }
    PANELS.with(|cell| {
        let mut panels = cell.borrow_mut();
        at_least(&mut panels.q, q);
        at_least(&mut panels.d, scales);
        at_least(&mut panels.m, scales);
        at_least(&mut panels.init, scales);
        f(&mut panels)
    })
}

/// Where a stored block's parts lie: its bytes, the offset of its weights, blocks per row.
#[derive(Clone, Copy)]
pub(super) struct Layout {
    pub kind: BlockKind,
    /// Bytes of one stored block.
    pub block_bytes: usize,
    /// Offset of the weights in a block (after `d`, and `m` for `Q4_1`).
    pub q_at: usize,
    pub nb: usize,
}

impl Layout {
    fn of(w: &BlockMatrix) -> Layout {
        let kind = w.kind();
        let (_, block_bytes) = w.ggml_type().block().expect("a block type");
        Layout {
            kind,
            block_bytes,
            q_at: if kind == BlockKind::Q4_1 { 4 } else { 2 },
            nb: w.cols() / BLOCK,
        }
    }
}

/// The integer sum `I` of weight block `wb` (as stored) and activation block `p`.
fn block_sum(kind: BlockKind, q: &[u8], p: &[i8]) -> i32 {
    let p = |j: usize| i32::from(p[j]);
    match kind {
        BlockKind::Q8_0 => (0..BLOCK).map(|j| i32::from(q[j] as i8) * p(j)).sum(),
        _ => {
            let offset = if kind == BlockKind::Q4_0 { 8 } else { 0 };
            (0..16)
                .map(|j| {
                    (i32::from(q[j] & 0x0f) - offset) * p(j)
                        + (i32::from(q[j] >> 4) - offset) * p(j + 16)
                })
                .sum()
        }
    }
}

/// `y [rows, d_out] = x [rows, d_in] · Wᵀ` by the GEMM with `kernel` ([`runs`] must hold),
/// parallel over groups of [`TASK_OUTPUTS`] outputs unless products are serial.
pub fn product(w: &BlockMatrix, kernel: Kernel, y: &mut [f32], x: &[f32], rows: usize) {
    let (d_out, d_in) = (w.rows(), w.cols());
    if !super::check_operands((d_out, d_in), y, x, rows, kernel, runs(kernel)) {
        return;
    }
    let acts = quantize_with(kernel, x, rows, d_in);
    let layout = Layout::of(w);
    let out = OutPtr(y.as_mut_ptr());
    let task = |t: usize| {
        let o0 = t * TASK_OUTPUTS;
        let outputs = TASK_OUTPUTS.min(d_out - o0);
        // SAFETY: this task writes y[r · d_out + o] for r < rows and o in [o0, o0 + outputs)
        // only, outputs no other task has; y is [rows, d_out] (checked above), exclusively
        // borrowed for this call, and the loop below joins before `product` returns.
        unsafe { fill(w, layout, kernel, &acts, rows, o0, outputs, &out) };
    };
    let tasks = d_out.div_ceil(TASK_OUTPUTS);
    if super::products_are_serial() || tasks == 1 {
        (0..tasks).for_each(task);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
}

/// Writes outputs `o0 .. o0 + outputs` of every row of `y`.
///
/// # Safety
/// `out` points at `y [rows, d_out]` and no other thread accesses these outputs meanwhile;
/// `runs(kernel)` holds; `acts` has `rows` rows quantised for `w`.
#[allow(clippy::too_many_arguments)]
unsafe fn fill(
    w: &BlockMatrix,
    layout: Layout,
    kernel: Kernel,
    acts: &GemmActs,
    rows: usize,
    o0: usize,
    outputs: usize,
    out: &OutPtr,
) {
    let (d_out, cols, nb) = (w.rows(), w.cols(), layout.nb);
    match kernel {
        Kernel::Portable => {
            let stored = w.stored();
            for r in 0..rows {
                for o in o0..o0 + outputs {
                    let mut acc = 0f32;
                    for b in 0..nb {
                        let at = (o * nb + b) * layout.block_bytes;
                        let block = &stored[at..at + layout.block_bytes];
                        let d = f16_to_f32(u16::from_le_bytes([block[0], block[1]]));
                        let p = &acts.p[r * cols + b * BLOCK..][..BLOCK];
                        let i = block_sum(layout.kind, &block[layout.q_at..], p);
                        acc = (i as f32).mul_add(d * acts.e[r * nb + b], acc);
                        if layout.kind == BlockKind::Q4_1 {
                            let m = f16_to_f32(u16::from_le_bytes([block[2], block[3]]));
                            acc = m.mul_add(acts.f[r * nb + b], acc);
                        }
                    }
                    // SAFETY (caller): r < rows and o an output of this task.
                    unsafe { *out.0.add(r * d_out + o) = acc };
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => {
            // SAFETY: the caller's guarantees, and runs(Avx512) (AVX-512F/BW/VL, VNNI).
            unsafe { super::block_gemm_avx512::fill(w, layout, acts, rows, o0, outputs, out.0) }
        }
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => {
            // SAFETY: the caller's guarantees, and runs(Avx2) (AVX2, FMA, F16C).
            unsafe { super::block_gemm_avx2::fill(w, layout, acts, rows, o0, outputs, out.0) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("runs({kernel:?}) is false off x86_64"),
    }
}

/// `y`'s first element, shared by the tasks of one product (each writes its own outputs).
struct OutPtr(*mut f32);
// SAFETY: written through only by `fill`, whose callers give each task a disjoint set of
// outputs of a `y` that outlives the parallel loop.
unsafe impl Sync for OutPtr {}

#[cfg(test)]
#[path = "block_gemm_tests.rs"]
mod tests;
