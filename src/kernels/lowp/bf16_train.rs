//! The three products of a linear layer in bf16 mixed-precision training, `W [d_out, d_in]`,
//! `x [rows, d_in]`, `dy [rows, d_out]`:
//!
//! `y = bf16(x) bf16(W)ᵀ`, `dx = bf16(dy) bf16(W)`, `dW += bf16(dy)ᵀ bf16(x)`,
//!
//! every sum in float32 (the training side is `train::precision`). The weight's bf16 copy is made once
//! per change of the weight (once per optimizer step) and reused by every pass until the next
//! change ([`Bf16Products::weight_changed`]).
//!
//! Two ways to multiply, equal up to the order of the f32 sums ([`Bf16Kernel`]):
//! - [`Bf16Kernel::Gemm`] rounds the operands to bf16 values held in f32 and multiplies them
//!   with the float32 gemm. A product of two bf16 numbers is exact in f32, so gemm's fused
//!   multiply-adds compute exactly "bf16 inputs, f32 accumulation".
//! - [`Bf16Kernel::Packed`] packs the operands into bf16 panels and multiplies them with
//!   [`super::bf16_gemm`] (`vdpbf16ps` or its portable twin).
//!
//! Which is faster depends on the CPU: where measured (BENCHMARKS.md, an Intel Xeon with
//! AVX-512 BF16), `vdpbf16ps` retires a quarter as often as an f32 FMA, so the packed kernel
//! runs at half gemm's speed and [`Bf16Kernel::Gemm`] is the default.

use super::bf16::rounded_to_bf16;
use super::bf16_gemm::{best_kernel, bf16_matmul, Bf16Panels};
use super::Kernel;
use crate::kernels::matmul::{matmul, weight_product, MatMut, MatRef};
use std::sync::OnceLock;

/// How bf16 training multiplies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Bf16Kernel {
    /// The float32 gemm over bf16-rounded operands (the default).
    #[default]
    Gemm,
    /// Packed bf16 panels through `bf16_matmul` with this kernel.
    Packed(Kernel),
}

impl Bf16Kernel {
    /// `gemm`, `avx512` (refused on a CPU without AVX-512 BF16), `portable`, or `packed` (the
    /// best packed kernel this CPU runs).
    pub fn parse(name: &str) -> Result<Bf16Kernel, String> {
        match name {
            "gemm" => Ok(Bf16Kernel::Gemm),
            "portable" => Ok(Bf16Kernel::Packed(Kernel::Portable)),
            "packed" => Ok(Bf16Kernel::Packed(best_kernel())),
            "avx512" if super::has_avx512_bf16() => Ok(Bf16Kernel::Packed(Kernel::Avx512)),
            "avx512" => Err("this CPU has no AVX-512 BF16 (try packed, portable or gemm)".into()),
            other => Err(format!(
                "unknown bf16 kernel {other:?} (gemm, packed, avx512 or portable)"
            )),
        }
    }
}

/// The weight in bf16, in the form the kernel reads.
#[derive(Clone, Debug)]
enum Bf16Weight {
    /// Rounded values in f32, `[d_out, d_in]`.
    Rounded(Vec<f32>),
    /// `Wᵀ` (for `y`) and `W` (for `dx`) packed.
    Packed { w_t: Bf16Panels, w: Bf16Panels },
}

/// One layer's bf16 products: off, or the kernel and the bf16 copy of the current weight.
#[derive(Clone, Debug, Default)]
pub struct Bf16Products {
    kernel: Option<Bf16Kernel>,
    weight: OnceLock<Bf16Weight>,
}

impl Bf16Products {
    /// bf16 products with `kernel`, or float32 ones (`None`).
    pub fn set(&mut self, kernel: Option<Bf16Kernel>) {
        self.kernel = kernel;
        self.weight = OnceLock::new();
    }

    /// The kernel when on.
    pub fn kernel(&self) -> Option<Bf16Kernel> {
        self.kernel
    }

    /// Drops the bf16 copy of the weight (call on every change of the weight).
    pub fn weight_changed(&mut self) {
        self.weight = OnceLock::new();
    }

    fn weight(&self, kernel: Bf16Kernel, w: &[f32], d_out: usize, d_in: usize) -> &Bf16Weight {
        self.weight.get_or_init(|| match kernel {
            Bf16Kernel::Gemm => Bf16Weight::Rounded(rounded_to_bf16(w)),
            Bf16Kernel::Packed(_) => {
                let wm = MatRef::new(w, d_out, d_in);
                Bf16Weight::Packed {
                    w_t: Bf16Panels::pack(wm.t()),
                    w: Bf16Panels::pack(wm),
                }
            }
        })
    }

    /// `y [rows, d_out] = bf16(x) bf16(W)ᵀ`; `false` (nothing done) when off.
    pub fn forward(&self, w: &[f32], y: &mut [f32], x: &[f32], d_in: usize, d_out: usize) -> bool {
        let Some(kernel) = self.kernel else {
            return false;
        };
        let rows = x.len() / d_in;
        match (kernel, self.weight(kernel, w, d_out, d_in)) {
            (Bf16Kernel::Packed(k), Bf16Weight::Packed { w_t, .. }) => {
                bf16_matmul(k, y, MatRef::new(x, rows, d_in), w_t, false)
            }
            (_, Bf16Weight::Rounded(w16)) => {
                weight_product(y, &rounded_to_bf16(x), w16, None, rows, d_in, d_out)
            }
            _ => unreachable!("the weight is made for the layer's kernel"),
        }
        true
    }

    /// `grad_w [d_out, d_in] += bf16(dy)ᵀ bf16(x)` (`W [d_out, d_in]`) and, when `dx` is given,
    /// `dx [rows, d_in] = bf16(dy) bf16(W)`; `false` (nothing done) when off.
    pub fn backward(
        &self,
        w: &[f32],
        grad_w: &mut [f32],
        dx: Option<&mut [f32]>,
        x: &[f32],
        dy: &[f32],
        d_in: usize,
    ) -> bool {
        let Some(kernel) = self.kernel else {
            return false;
        };
        let (rows, d_out) = (x.len() / d_in, w.len() / d_in);
        let weight = dx.as_ref().map(|_| self.weight(kernel, w, d_out, d_in));
        match kernel {
            Bf16Kernel::Packed(k) => {
                let dy_t = MatRef::new(dy, rows, d_out).t();
                let x_panels = Bf16Panels::pack(MatRef::new(x, rows, d_in));
                bf16_matmul(k, grad_w, dy_t, &x_panels, true);
                if let (Some(dx), Some(Bf16Weight::Packed { w, .. })) = (dx, weight) {
                    bf16_matmul(k, dx, MatRef::new(dy, rows, d_out), w, false);
                }
            }
            Bf16Kernel::Gemm => {
                let (x16, dy16) = (rounded_to_bf16(x), rounded_to_bf16(dy));
                matmul(
                    MatMut::new(grad_w, d_out, d_in),
                    MatRef::new(&dy16, rows, d_out).t(),
                    MatRef::new(&x16, rows, d_in),
                    1.0,
                    true,
                );
                if let (Some(dx), Some(Bf16Weight::Rounded(w16))) = (dx, weight) {
                    matmul(
                        MatMut::new(dx, rows, d_in),
                        MatRef::new(&dy16, rows, d_out),
                        MatRef::new(w16, d_out, d_in),
                        1.0,
                        false,
                    );
                }
            }
        }
        true
    }
}
