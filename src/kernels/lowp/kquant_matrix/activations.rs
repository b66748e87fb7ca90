//! The 8-bit activation blocks the K-quants and the other ggml block types of
//! [`super::KQuantMatrix`] meet (llama.cpp's `Q8_K`, `Q8_0` and `Q8_1`), and the quantisers that
//! make them from float32 rows, ties rounded to even as llama.cpp's x86 code does (the formulas
//! are in the parent module's description).

use super::super::ggml::{f16_to_f32, f32_to_f16};
use super::super::kquants::QK_K;
use super::super::{act_quant, Kernel};

/// Which 8-bit activation blocks a weight type meets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ActFormat {
    /// ggml `Q8_K`: 256 per block, f32 scale, sums per 16.
    Q8K,
    /// ggml `Q8_0`: 32 per block, f16 scale.
    Q80,
    /// ggml `Q8_1`: `Q8_0` plus `s = e Σ p` in f16.
    Q81,
}

/// Activations `[n, cols]` quantised for one call.
pub struct KQuantActs {
    pub(super) format: ActFormat,
    /// Elements per block (256 or 32) and blocks per row.
    pub(in crate::kernels::lowp) block: usize,
    pub(in crate::kernels::lowp) nb: usize,
    /// `[n, cols]`: `p`.
    pub(in crate::kernels::lowp) q: Vec<i8>,
    /// `[n, nb]`: `e` (f16-rounded for Q8_0 / Q8_1).
    pub(in crate::kernels::lowp) e: Vec<f32>,
    /// `[n, cols / 16]`: `bsums` (Q8_K only).
    pub(in crate::kernels::lowp) bsums: Vec<i32>,
    /// `[n, nb]`: `s` (Q8_1 only).
    pub(in crate::kernels::lowp) s: Vec<f32>,
    /// `[n, nb]`: `Σ_j p_j` per block (Q8_0 and Q8_1).
    pub(in crate::kernels::lowp) psum: Vec<i32>,
}

impl KQuantActs {
    /// Row `r`'s activations as they are multiplied: `e_b p_j`, in f64.
    pub fn values(&self, r: usize) -> Vec<f64> {
        let cols = self.nb * self.block;
        (0..cols)
            .map(|j| {
                f64::from(self.e[r * self.nb + j / self.block]) * f64::from(self.q[r * cols + j])
            })
            .collect()
    }

    /// Row `r`'s `s_b` of `Q8_1` blocks (empty for the other formats).
    pub fn block_sums(&self, r: usize) -> &[f32] {
        match self.format {
            ActFormat::Q81 => &self.s[r * self.nb..(r + 1) * self.nb],
            _ => &[],
        }
    }
}

/// Quantises one row `x` to `Q8_K` blocks (ggml's `quantize_row_q8_K_ref`) with `kernel`'s
/// vector code ([`act_quant`]: the same bytes), which must run on this CPU.
pub(super) fn quantize_q8_k(
    kernel: Kernel,
    x: &[f32],
    q: &mut [i8],
    e: &mut [f32],
    bsums: &mut [i32],
) {
    for (b, xb) in x.chunks_exact(QK_K).enumerate() {
        // The element of largest magnitude, the first of equals (NaN skipped).
        let amax = xb
            .chunks_exact(act_quant::N)
            .map(|x| act_quant::amax(kernel, x.try_into().expect("32 elements")))
            .fold(0f32, f32::max);
        let qb = &mut q[b * QK_K..(b + 1) * QK_K];
        if amax == 0.0 {
            qb.fill(0);
            e[b] = 0.0;
            bsums[b * 16..(b + 1) * 16].fill(0);
            continue;
        }
        let max = *xb.iter().find(|v| v.abs() == amax).expect("amax is an element's");
        let iscale = -127.0 / max;
        for (x, p) in xb.chunks_exact(act_quant::N).zip(qb.chunks_exact_mut(act_quant::N)) {
            let (x, p) = (x.try_into().expect("32"), p.try_into().expect("32"));
            act_quant::round::<true>(kernel, x, iscale, p);
        }
        for (g, sum) in bsums[b * 16..(b + 1) * 16].iter_mut().enumerate() {
            *sum = qb[g * 16..(g + 1) * 16].iter().map(|&p| i32::from(p)).sum();
        }
        e[b] = 1.0 / iscale;
    }
}

/// Quantises one row `x` to `Q8_0` blocks, with `Q8_1`'s `s` when `s` is not empty (ggml's
/// x86 `quantize_row_q8_0` / `quantize_row_q8_1`), and each block's `Σ_j p_j` in `psum`, with
/// `kernel`'s vector code ([`act_quant`]: the same bytes), which must run on this CPU.
pub(super) fn quantize_q8_0(
    kernel: Kernel,
    x: &[f32],
    q: &mut [i8],
    e: &mut [f32],
    s: &mut [f32],
    psum: &mut [i32],
) {
    for (b, (xb, qb)) in x.chunks_exact(32).zip(q.chunks_exact_mut(32)).enumerate() {
        let (xb, qb) = (xb.try_into().expect("32"), qb.try_into().expect("32"));
        let amax = act_quant::amax(kernel, xb);
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let sum = act_quant::round::<false>(kernel, xb, id, qb);
        e[b] = f16_to_f32(f32_to_f16(d));
        psum[b] = sum;
        if !s.is_empty() {
            s[b] = f16_to_f32(f32_to_f16(d * sum as f32));
        }
    }
}
