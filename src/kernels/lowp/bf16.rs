//! bf16 weights and activations, f32 accumulation: `y_ro = Σ_k bf16(x_rk) · bf16(w_ok)`.
//!
//! bf16 is the top half of an f32 (8 exponent, 7 mantissa bits); [`f32_to_bf16`] rounds to the
//! nearest, ties to even, as `vcvtneps2bf16` does. A product of two bf16 numbers has at most
//! 16 significant bits, so it is exact in f32; the sum is in f32 lanes, 2 products per lane
//! per step of 32 elements (`vdpbf16ps`, two chains of lanes for even and odd steps; the
//! portable kernel sums in one chain of the same lanes, so the two differ by f32 rounding of
//! the sums and where the hardware flushes subnormals to zero). Rows are padded with zeros to a multiple of 32 elements.

use super::{Kernel, PackedFormat};

/// Elements per step of the kernels (one 512-bit register of bf16).
const STEP: usize = 32;

/// f32 -> bf16, round to nearest even; NaN stays a (quiet) NaN.
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) as u16) | 0x0040;
    }
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1));
    (rounded >> 16) as u16
}

/// bf16 -> f32 (exact).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// `x` rounded to the nearest bf16 value (ties to even), kept in an f32: the same as
/// `bf16_to_f32(f32_to_bf16(x))`, branch-free so that a loop of it vectorises.
#[inline(always)]
pub fn round_to_bf16(x: f32) -> f32 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) & 0xffff_0000;
    let nan = (b | 0x0040_0000) & 0xffff_0000;
    f32::from_bits(if x.is_nan() { nan } else { rounded })
}

/// Every element of `x` rounded to bf16 ([`round_to_bf16`]), as f32 values.
pub fn rounded_to_bf16(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| round_to_bf16(v)).collect()
}

/// `W [rows, cols]` in bf16, each row padded with zeros to `stride` (a multiple of 32).
#[derive(Clone, Debug)]
pub struct Bf16Matrix {
    rows: usize,
    cols: usize,
    stride: usize,
    /// [rows, stride]
    data: Vec<u16>,
}

/// Activations `[n, stride]` in bf16, zero-padded like the weight rows.
pub struct Bf16Acts {
    stride: usize,
    data: Vec<u16>,
}

fn to_padded_bf16(x: &[f32], n: usize, cols: usize, stride: usize) -> Vec<u16> {
    let mut data = vec![0u16; n * stride];
    for (dst, src) in data.chunks_exact_mut(stride).zip(x.chunks_exact(cols)) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = f32_to_bf16(s);
        }
    }
    data
}

impl Bf16Matrix {
    /// Rounds `w [rows, cols]` to bf16.
    pub fn from_f32(w: &[f32], rows: usize, cols: usize) -> Bf16Matrix {
        assert_eq!(w.len(), rows * cols, "bf16 weight is not [rows, cols]");
        let stride = cols.div_ceil(STEP).max(1) * STEP;
        Bf16Matrix {
            rows,
            cols,
            stride,
            data: to_padded_bf16(w, rows, cols, stride),
        }
    }

    /// Weight `(o, k)` as f32.
    pub fn get(&self, o: usize, k: usize) -> f32 {
        bf16_to_f32(self.data[o * self.stride + k])
    }

    pub fn bytes(&self) -> usize {
        self.data.len() * 2
    }

    fn row(&self, o: usize) -> &[u16] {
        &self.data[o * self.stride..(o + 1) * self.stride]
    }
}

/// The portable kernel: 16 f32 lanes, each adding the odd then the even product of its pair.
fn dot_portable(w: &[u16], x: &[u16]) -> f32 {
    let mut lanes = [0f32; 16];
    for (wc, xc) in w.chunks_exact(STEP).zip(x.chunks_exact(STEP)) {
        for (l, lane) in lanes.iter_mut().enumerate() {
            *lane += bf16_to_f32(wc[2 * l + 1]) * bf16_to_f32(xc[2 * l + 1]);
            *lane += bf16_to_f32(wc[2 * l]) * bf16_to_f32(xc[2 * l]);
        }
    }
    lanes.iter().sum()
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// `out[i] = Σ_k w_k x_{i,k}` for `R` activation rows.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX-512 BF16, and `w` and every `xs[i]` must hold the same
    /// multiple of 32 elements.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn dot_rows<const R: usize>(w: &[u16], xs: [&[u16]; R], out: &mut [f32]) {
        // Two chains per row (even and odd steps), so one row does not wait on the latency
        // of a single chain.
        let mut acc = [[_mm512_setzero_ps(); R]; 2];
        let n = w.len() / 32;
        macro_rules! step {
            ($c:expr, $set:expr) => {{
                let c = $c;
                // SAFETY (caller): 32 u16 from element 32c lie inside `w` and each `xs[r]`;
                // loadu has no alignment requirement; __m512i and __m512bh are both 64 plain
                // bytes.
                let wv: __m512bh = std::mem::transmute(_mm512_loadu_si512(
                    w.as_ptr().add(32 * c) as *const __m512i
                ));
                for r in 0..R {
                    let xv: __m512bh = std::mem::transmute(_mm512_loadu_si512(
                        xs[r].as_ptr().add(32 * c) as *const __m512i,
                    ));
                    acc[$set][r] = _mm512_dpbf16_ps(acc[$set][r], wv, xv);
                }
            }};
        }
        let mut c = 0;
        while c + 1 < n {
            step!(c, 0);
            step!(c + 1, 1);
            c += 2;
        }
        if c < n {
            step!(c, 0);
        }
        for r in 0..R {
            out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][r], acc[1][r]));
        }
    }
}

impl PackedFormat for Bf16Matrix {
    type Acts = Bf16Acts;

    fn rows(&self) -> usize {
        self.rows
    }

    fn cols(&self) -> usize {
        self.cols
    }

    fn runs(&self, kernel: Kernel) -> bool {
        match kernel {
            Kernel::Portable => true,
            Kernel::Avx2 => false,
            Kernel::Avx512 => super::has_avx512_bf16(),
        }
    }

    fn quantize_acts(&self, x: &[f32], n: usize) -> Bf16Acts {
        Bf16Acts {
            stride: self.stride,
            data: to_padded_bf16(x, n, self.cols, self.stride),
        }
    }

    fn tile(&self, kernel: Kernel, acts: &Bf16Acts, o: usize, r0: usize, out: &mut [f32]) {
        let w = self.row(o);
        let x = |i: usize| &acts.data[(r0 + i) * acts.stride..(r0 + i + 1) * acts.stride];
        match kernel {
            Kernel::Portable => {
                for (i, v) in out.iter_mut().enumerate() {
                    *v = dot_portable(w, x(i));
                }
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => {
                // SAFETY: product_with only passes Avx512 after runs(Avx512) (the CPU has
                // AVX-512F and BF16); every row here is `stride` long, a multiple of 32.
                unsafe {
                    match out.len() {
                        1 => avx512::dot_rows(w, [x(0)], out),
                        2 => avx512::dot_rows(w, [x(0), x(1)], out),
                        3 => avx512::dot_rows(w, [x(0), x(1), x(2)], out),
                        _ => avx512::dot_rows(w, [x(0), x(1), x(2), x(3)], out),
                    }
                }
            }
            Kernel::Avx2 => unreachable!("no AVX2 kernel for bf16 yet (runs is false)"),
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Avx512 => unreachable!("runs(Avx512) is false off x86_64"),
        }
    }
}
