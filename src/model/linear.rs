//! A fully connected layer, `y = x Wᵀ + b` (or `x Wᵀ` without a bias, as in Llama), with
//! PyTorch's `[d_out, d_in]` weight layout.
//!
//! In bf16 training ([`Linear::set_bf16_products`], f32 layers) the three products `x Wᵀ`,
//! `dy W` and `dyᵀ x` take their operands rounded to bf16 and sum in float32
//! ([`Backend::weight_product_backward`]); the bias gradient (a sum) stays float32.

use super::param::{Init, Module, Param, ParamVisitor};
use crate::backend::{Backend, Bf16Kernel, Bf16Products, PackedWeight, Precision, WeightRef, CPU};
use crate::Float;

/// `y = x Wᵀ + b`.
#[derive(Clone, Debug)]
pub struct Linear<T> {
    /// [d_out, d_in]
    pub weight: Param<T>,
    /// `[d_out]`, absent for a layer without bias.
    pub bias: Option<Param<T>>,
    pub d_in: usize,
    pub d_out: usize,
    /// Inference only: `Wᵀ [d_in, d_out]`, the layout gemm multiplies without repacking the
    /// weight on every call (see [`Linear::prepare_inference`]). Any mutable access to the
    /// parameters through [`Module::visit`] drops it, so a stale copy is never used, unless it
    /// is the weight's only form ([`Linear::prepare_alone`]).
    transposed: Option<Vec<T>>,
    /// Inference only: the weight in a low-precision format (bf16, int8, or a GGUF file's
    /// blocks) that [`Linear::forward`] multiplies instead (f32 models only); dropped with
    /// `transposed`.
    packed: Option<PackedWeight>,
    /// Training in bf16 (f32 layers): the products' kernel and the weight's bf16 copy, dropped
    /// with `transposed`.
    bf16: Bf16Products,
}

impl<T: Float> Linear<T> {
    /// Xavier-uniform weight, zero bias.
    pub fn new(d_in: usize, d_out: usize, init: &mut impl Init) -> Self {
        Self::with_bias(d_in, d_out, true, init)
    }

    /// Xavier-uniform weight, and a zero bias when `bias`.
    pub fn with_bias(d_in: usize, d_out: usize, bias: bool, init: &mut impl Init) -> Self {
        Linear {
            weight: init.xavier(&[d_out, d_in], d_in, d_out),
            bias: bias.then(|| init.constant(&[d_out], 0.0)),
            d_in,
            d_out,
            transposed: None,
            packed: None,
            bf16: Bf16Products::default(),
        }
    }

    /// Training: multiply bf16-rounded operands with `kernel`, or float32 ones (`None`). Only
    /// f32 layers round; an f64 layer (the gradient checks) stays f64 either way.
    pub fn set_bf16_products(&mut self, kernel: Option<Bf16Kernel>) {
        self.bf16.set(kernel);
    }

    /// The bf16 kernel when the products take bf16-rounded operands.
    pub fn bf16_products(&self) -> Option<Bf16Kernel> {
        self.bf16.kernel()
    }

    /// Keeps a transposed copy of the weight for a run of forwards that do not change it
    /// (decoding), which gemm multiplies in place (see [`Backend::transpose_weight`]).
    pub fn prepare_inference(&mut self) {
        if self.packed.is_some() || self.weight.value.data.is_empty() {
            return;
        }
        let w = &self.weight.value.data;
        self.transposed = Some(CPU.transpose_weight(w, self.d_out, self.d_in));
    }

    /// Readies the layer for inference in `precision`: f32 keeps the transposed copy of
    /// [`prepare_inference`](Self::prepare_inference); bf16 and int8 pack the weight (f32
    /// layers only) unless it already holds packed blocks ([`set_packed`](Self::set_packed)).
    pub fn prepare_precision(&mut self, precision: Precision) -> Result<(), String> {
        // Packed already, or released (see `prepare_alone`): the form it holds stays.
        if self.packed.is_some() || self.weight.value.data.is_empty() {
            return Ok(());
        }
        let Some(w) = T::as_f32(&self.weight.value.data) else {
            return match precision {
                Precision::F32 => {
                    self.prepare_inference();
                    Ok(())
                }
                _ => Err("low-precision inference needs an f32 model".into()),
            };
        };
        match CPU.pack_weight(precision, w, self.d_out, self.d_in)? {
            Some(p) => {
                self.transposed = None;
                self.packed = Some(p);
            }
            None => self.prepare_inference(),
        }
        Ok(())
    }

    /// Readies the layer for inference in `precision` holding its weight in one form only:
    /// f32 `Wᵀ` (made in `W`'s own memory where it is panelled), bf16 or int8 the packed rows
    /// (or the packed weight already set); `W`'s float32 values and gradient are released. The
    /// layer multiplies as before but can no longer train (its backward refuses) or be saved
    /// (its parameter holds no values: `checkpoint::write_model` names it).
    pub fn prepare_alone(&mut self, precision: Precision) -> Result<(), String> {
        if self.weight.value.data.is_empty() {
            return Ok(());
        }
        if self.packed.is_none() && self.transposed.is_none() {
            match precision {
                Precision::F32 => {
                    let w = std::mem::take(&mut self.weight.value.data);
                    self.transposed = Some(CPU.transpose_weight_owned(w, self.d_out, self.d_in));
                }
                _ => self.prepare_precision(precision)?,
            }
        }
        self.weight.value.data = Vec::new();
        self.weight.grad.data = Vec::new();
        self.bf16.weight_changed();
        Ok(())
    }

    /// Whether the weight's float32 values were released ([`prepare_alone`](Self::prepare_alone)),
    /// or never held (a GGUF file's blocks): only its packed or transposed form multiplies.
    pub fn is_released(&self) -> bool {
        self.weight.value.data.is_empty() && self.d_in * self.d_out > 0
    }

    /// Multiplies by `packed` (`[d_out, d_in]`, e.g. a GGUF file's own blocks) from now on,
    /// until the next mutable visit.
    pub fn set_packed(&mut self, packed: PackedWeight) -> Result<(), String> {
        if (packed.rows(), packed.cols()) != (self.d_out, self.d_in) {
            return Err(format!(
                "packed weight {}x{} for a {}x{} linear layer",
                packed.rows(),
                packed.cols(),
                self.d_out,
                self.d_in
            ));
        }
        self.transposed = None;
        self.packed = Some(packed);
        Ok(())
    }

    /// The packed weight in use, if any.
    pub fn packed(&self) -> Option<&PackedWeight> {
        self.packed.as_ref()
    }

    /// `y = x Wᵀ`, without the bias, into `y [rows, d_out]`: the backend's weight product
    /// chooses the kernel from the forms of the weight this layer holds.
    fn product(&self, y: &mut [T], x: &[T], rows: usize) {
        CPU.weight_product(y, x, rows, self.weight_ref());
    }

    /// The weight with every form this layer keeps (what a backend multiplies, or a device
    /// uploads).
    pub fn weight_ref(&self) -> WeightRef<'_, T> {
        WeightRef {
            w: &self.weight.value.data,
            d_in: self.d_in,
            d_out: self.d_out,
            transposed: self.transposed.as_deref(),
            packed: self.packed.as_ref(),
            bf16: Some(&self.bf16),
        }
    }

    /// `x [rows, d_in]` -> `y [rows, d_out]`. The caller keeps `x` for the backward.
    pub fn forward(&self, x: &[T]) -> Vec<T> {
        let rows = x.len() / self.d_in;
        // y: [rows, d_out]
        let mut y = vec![T::zero(); rows * self.d_out];
        self.product(&mut y, x, rows);
        if let Some(b) = &self.bias {
            CPU.add_row_bias(&mut y, &b.value.data);
        }
        y
    }

    /// `max(0, x Wᵀ + b)`: the product, then bias and ReLU fused in one pass
    /// (the FFN's first layer).
    pub fn forward_relu(&self, x: &[T]) -> Vec<T> {
        let rows = x.len() / self.d_in;
        // y: [rows, d_out]
        let mut y = vec![T::zero(); rows * self.d_out];
        self.product(&mut y, x, rows);
        match &self.bias {
            Some(b) => CPU.bias_relu(&mut y, &b.value.data),
            None => CPU.relu(&mut y),
        }
        y
    }

    /// Accumulates `dW += dyᵀ x`, `db += Σ dy` and returns `dx = dy W`.
    pub fn backward(&mut self, x: &[T], dy: &[T]) -> Vec<T> {
        let rows = x.len() / self.d_in;
        // dx: [rows, d_in]
        let mut dx = vec![T::zero(); rows * self.d_in];
        self.grads(x, dy, Some(&mut dx));
        dx
    }

    /// Accumulates the parameter gradients only (when `dx` is not needed).
    pub fn accumulate_grads(&mut self, x: &[T], dy: &[T]) {
        self.grads(x, dy, None);
    }

    /// `dW += dyᵀ x` and, when given, `dx = dy W` through the backend (bf16 products when the
    /// layer trains in bf16: `bf16(dy)ᵀ bf16(x)`, `bf16(dy) bf16(W)`), then `db += Σ dy` (a
    /// sum, from the f32 `dy`).
    fn grads(&mut self, x: &[T], dy: &[T], dx: Option<&mut [T]>) {
        assert!(
            !self.is_released(),
            "the backward of a {}x{} linear layer whose float32 weight was released for \
             inference (Linear::prepare_alone): such a model cannot train",
            self.d_out,
            self.d_in
        );
        let w = WeightRef {
            w: &self.weight.value.data,
            d_in: self.d_in,
            d_out: self.d_out,
            transposed: None,
            packed: None,
            bf16: Some(&self.bf16),
        };
        CPU.weight_product_backward(&mut self.weight.grad.data, dx, x, dy, w);
        if let Some(b) = &mut self.bias {
            CPU.add_column_sums(&mut b.grad.data, dy, self.d_out);
        }
    }
}

/// Calls `f(path, layer)` on every linear layer of `module` reached by its parameter walk
/// ([`Module::visit`]), in that order, without touching anything else: the one walk behind
/// every operation on all of a model's linear layers (the functions below, a GGUF file's
/// blocks).
pub fn for_each_linear<'m, T, M: Module<T>>(
    module: &'m mut M,
    f: impl FnMut(&str, &mut Linear<T>) + 'm,
) {
    module.visit(&mut ParamVisitor::linears(f));
}

/// [`Linear::prepare_inference`] on every linear layer of `module`.
pub fn prepare_inference_all<T: Float>(module: &mut impl Module<T>) {
    for_each_linear(module, |_, l| l.prepare_inference());
}

/// [`Linear::prepare_alone`] on every linear layer of `module`, in order, stopping at the first
/// error; the released values' pages go back to the system layer by layer (the allocator
/// would keep them for reuse), so that a model never holds its float32 weights and their
/// new forms all at once.
pub fn prepare_alone_all<T: Float>(
    module: &mut impl Module<T>,
    precision: Precision,
) -> Result<(), String> {
    let mut result = Ok(());
    for_each_linear(module, |_, l| {
        if result.is_ok() {
            result = l.prepare_alone(precision);
            crate::alloc::give_back_free_memory();
        }
    });
    result
}

/// [`Linear::set_bf16_products`] on every linear layer of `module`.
pub fn set_bf16_products_all<T: Float>(module: &mut impl Module<T>, kernel: Option<Bf16Kernel>) {
    for_each_linear(module, |_, l| l.set_bf16_products(kernel));
}

/// [`Linear::prepare_precision`] on every linear layer of `module`, in order, stopping at the
/// first error.
pub fn prepare_precision_all<T: Float>(
    module: &mut impl Module<T>,
    precision: Precision,
) -> Result<(), String> {
    let mut result = Ok(());
    for_each_linear(module, |_, l| {
        if result.is_ok() {
            result = l.prepare_precision(precision);
        }
    });
    result
}

impl<T> Module<T> for Linear<T> {
    fn as_linear(&mut self) -> Option<&mut Linear<T>> {
        Some(self)
    }

    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>) {
        // The caller may change the weight. A weight held only in its packed or transposed
        // form (a GGUF file's blocks, a released weight: no float32 values) keeps it: there is
        // nothing else to multiply.
        if !self.weight.value.data.is_empty() {
            self.transposed = None;
            self.packed = None;
        }
        self.bf16.weight_changed();
        v.param("weight", &mut self.weight);
        if let Some(b) = &mut self.bias {
            v.param("bias", b);
        }
    }
}
