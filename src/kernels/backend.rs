//! The two calls a model makes of its numeric backend, behind one interface: the attention call
//! ([`Backend::attention`] and its backward) and the weight product `y = x Wᵀ` of every linear
//! layer and the output head ([`Backend::weight_product`]). Each implementation chooses its own
//! kernels; the model only says what it needs.
//!
//! [`Cpu`] is the one implementation today: host slices, the kernels of this crate, generic over
//! [`Float`] so that the float64 reference path (the gradient and layer checks) runs the same
//! code as float32 inference. A device backend would implement the same calls over its own
//! buffers (the slices here become handles to device memory, uploaded and read back at the
//! model's edges).

use super::attention::SavedRef;
use super::attention::{attend, attend_backward, Attended, AttnDims, KeyRanges, KvView, Purpose};
use super::lowp::bf16_train::Bf16Products;
use super::lowp::PackedWeight;
use super::matmul::weight_product;
use crate::Float;

/// A weight `W [d_out, d_in]` as a layer holds it for `y = x Wᵀ`: its values and whatever
/// prepared forms it keeps.
#[derive(Clone, Copy, Debug)]
pub struct WeightRef<'a, T> {
    /// `[d_out, d_in]` (may be empty when only `packed` holds the weight).
    pub w: &'a [T],
    pub d_in: usize,
    pub d_out: usize,
    /// Inference: `Wᵀ [d_in, d_out]`, which gemm multiplies without repacking.
    pub transposed: Option<&'a [T]>,
    /// Inference: the weight in a low-precision format (bf16, int8, GGUF blocks).
    pub packed: Option<&'a PackedWeight>,
    /// Training in bf16: the products' kernel and the weight's bf16 copy.
    pub bf16: Option<&'a Bf16Products>,
}

/// The numeric calls of a model (see the module docs).
pub trait Backend {
    /// The attention of `q [batch * q_len, d_model]` over `kv`, query `i` of row `b` seeing keys
    /// `ranges.range(b, i)`; the backend picks the kernel for `purpose`.
    fn attention<T: Float>(
        &self,
        q: &[T],
        kv: KvView<'_, T>,
        ranges: impl KeyRanges,
        dims: AttnDims,
        purpose: Purpose<'_, T>,
    ) -> Attended<T>;

    /// Backward of a training [`attention`](Self::attention) call: `(dq, dk, dv)` from `dctx`.
    #[allow(clippy::too_many_arguments)]
    fn attention_backward<T: Float>(
        &self,
        grads: (&mut [T], &mut [T], &mut [T]),
        dctx: &[T],
        ctx: &[T],
        qkv: (&[T], &[T], &[T]),
        saved: SavedRef<'_, T>,
        ranges: impl KeyRanges,
        dims: AttnDims,
    );

    /// `y [rows, d_out] = x [rows, d_in] · Wᵀ`, no bias.
    fn weight_product<T: Float>(&self, y: &mut [T], x: &[T], rows: usize, w: WeightRef<'_, T>);
}

/// The host backend: this crate's kernels on the CPU's threads.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu;

/// The backend the models run on.
pub const CPU: Cpu = Cpu;

impl Backend for Cpu {
    /// See [`attend`] and [`super::attention::choose`] for the kernel rule.
    fn attention<T: Float>(
        &self,
        q: &[T],
        kv: KvView<'_, T>,
        ranges: impl KeyRanges,
        dims: AttnDims,
        purpose: Purpose<'_, T>,
    ) -> Attended<T> {
        attend(q, kv, ranges, dims, purpose)
    }

    fn attention_backward<T: Float>(
        &self,
        grads: (&mut [T], &mut [T], &mut [T]),
        dctx: &[T],
        ctx: &[T],
        qkv: (&[T], &[T], &[T]),
        saved: SavedRef<'_, T>,
        ranges: impl KeyRanges,
        dims: AttnDims,
    ) {
        attend_backward(grads, dctx, ctx, qkv, saved, ranges, dims)
    }

    /// The kernel rule, in order: a packed weight multiplies float32 operands with its own
    /// kernel; bf16 training products (float32 operands) with theirs; otherwise
    /// [`weight_product`] (a few rows: dot products along W's rows; more: gemm from `Wᵀ` when
    /// kept, from `W` otherwise).
    fn weight_product<T: Float>(&self, y: &mut [T], x: &[T], rows: usize, w: WeightRef<'_, T>) {
        if let Some(p) = w.packed {
            if let (Some(x32), Some(y32)) = (T::as_f32(x), T::as_f32_mut(y)) {
                return p.product(y32, x32, rows);
            }
        }
        if let Some(bf16) = w.bf16 {
            if let (Some(w32), Some(x32), Some(y32)) =
                (T::as_f32(w.w), T::as_f32(x), T::as_f32_mut(y))
            {
                if bf16.forward(w32, y32, x32, w.d_in, w.d_out) {
                    return;
                }
            }
        }
        weight_product(y, x, w.w, w.transposed, rows, w.d_in, w.d_out);
    }
}
