//! The host backend: every method is the kernel of `crate::kernels` the model called before the
//! interface existed, with the same arguments, so the numbers are the same bits.

use super::{
    Attended, AttnDims, AttnMask, Backend, DeltaState, GgmlType, KeyRanges, KvType, KvView, LayerNormStats,
    LinearState, Llama3Scaling, MatMut, MatRef, PackedWeight, Precision, Purpose, RawBytes,
    RmsNormStats, Rope, SavedRef, WeightRef, YarnScaling,
};
use crate::kernels::{
    activations as act, attention, dropout, hadamard, kv_blocks, layer_norm, linear_attention as lin,
    lowp, matmul, panels, reduce, rms_norm, rope as rot, softmax,
};
use crate::rng::Rng;
use crate::Float;

/// The host backend: this crate's kernels on the CPU's threads.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu;

/// The backend the models run on.
pub const CPU: Cpu = Cpu;

impl Backend for Cpu {
    /// The kernel rule, in order: a packed weight multiplies float32 operands with its own
    /// kernel; bf16 training products (float32 operands) with theirs; otherwise
    /// [`matmul::weight_product`] (a few rows: dot products along W's rows; more: gemm from
    /// `Wᵀ` when kept, from `W` otherwise).
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
        matmul::weight_product(y, x, w.w, w.transposed, rows, w.d_in, w.d_out);
    }

    /// bf16 training products (float32 operands) when `w.bf16` is on; otherwise two gemm calls
    /// from `W` as stored.
    fn weight_product_backward<T: Float>(
        &self,
        dw: &mut [T],
        mut dx: Option<&mut [T]>,
        x: &[T],
        dy: &[T],
        w: WeightRef<'_, T>,
    ) {
        if let Some(bf16) = w.bf16 {
            if let (Some(x32), Some(dy32), Some(w32)) = (T::as_f32(x), T::as_f32(dy), T::as_f32(w.w))
            {
                if let Some(dw32) = T::as_f32_mut(dw) {
                    let dx32 = dx.as_deref_mut().and_then(|d| T::as_f32_mut(d));
                    if bf16.backward(w32, dw32, dx32, x32, dy32, w.d_in) {
                        return;
                    }
                }
            }
        }
        let rows = x.len() / w.d_in;
        matmul::matmul(
            MatMut::new(dw, w.d_out, w.d_in),
            MatRef::new(dy, rows, w.d_out).t(),
            MatRef::new(x, rows, w.d_in),
            T::one(),
            true,
        );
        if let Some(dx) = dx {
            matmul::matmul(
                MatMut::new(dx, rows, w.d_in),
                MatRef::new(dy, rows, w.d_out),
                MatRef::new(w.w, w.d_out, w.d_in),
                T::one(),
                false,
            );
        }
    }

    #[inline]
    fn matmul<T: Float>(
        &self,
        dst: MatMut<'_, T>,
        lhs: MatRef<'_, T>,
        rhs: MatRef<'_, T>,
        alpha: T,
        accumulate: bool,
    ) {
        matmul::matmul(dst, lhs, rhs, alpha, accumulate)
    }

    #[inline]
    fn transpose_weight<T: Float>(&self, w: &[T], d_out: usize, d_in: usize) -> Vec<T> {
        matmul::transpose_weight(w, d_out, d_in)
    }

    #[inline]
    fn transpose_weight_owned<T: Float>(&self, w: Vec<T>, d_out: usize, d_in: usize) -> Vec<T> {
        panels::into_transposed(w, d_out, d_in)
    }

    fn weight_row<T: Float>(&self, w: WeightRef<'_, T>, o: usize, out: &mut [T]) -> Result<(), String> {
        let d = w.d_in;
        if o >= w.d_out || out.len() != d {
            return Err(format!("row {o} of a {}x{d} weight into {} values", w.d_out, out.len()));
        }
        if w.w.len() == w.d_out * d {
            out.copy_from_slice(&w.w[o * d..(o + 1) * d]);
            return Ok(());
        }
        if let Some(t) = w.transposed {
            panels::transposed_row(t, w.d_out, d, o, out);
            return Ok(());
        }
        let Some(p) = w.packed else {
            return Err(format!("a {}x{d} weight that holds no values", w.d_out));
        };
        match T::as_f32_mut(out) {
            Some(out) => p.row(o, out),
            None => {
                let mut row = vec![0f32; d];
                p.row(o, &mut row)?;
                out.iter_mut().zip(row).for_each(|(v, r)| *v = T::of(f64::from(r)));
                Ok(())
            }
        }
    }

    #[inline]
    fn add_row_bias<T: Float>(&self, y: &mut [T], b: &[T]) {
        matmul::add_row_bias(y, b)
    }

    #[inline]
    fn add_column_sums<T: Float>(&self, out: &mut [T], x: &[T], cols: usize) {
        reduce::add_column_sums(out, x, cols)
    }

    /// See [`attention::attend`] and [`attention::choose`] for the kernel rule.
    #[inline]
    fn attention<T: Float>(
        &self,
        q: &[T],
        kv: KvView<'_, T>,
        ranges: impl KeyRanges,
        dims: AttnDims,
        purpose: Purpose<'_, T>,
    ) -> Attended<T> {
        attention::attend(q, kv, ranges, dims, purpose)
    }

    #[inline]
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
        attention::attend_backward(grads, dctx, ctx, qkv, saved, ranges, dims)
    }

    #[inline]
    fn linear_attention<T: Float>(
        &self,
        ctx: &mut [T],
        q: &[T],
        k: &[T],
        v: &[T],
        dims: AttnDims,
        mask: AttnMask<'_>,
    ) {
        lin::linear_attention_forward(ctx, q, k, v, dims, mask)
    }

    #[inline]
    fn linear_attention_backward<T: Float>(
        &self,
        (dq, dk, dv): (&mut [T], &mut [T], &mut [T]),
        dctx: &[T],
        q: &[T],
        k: &[T],
        v: &[T],
        dims: AttnDims,
        mask: AttnMask<'_>,
    ) {
        lin::linear_attention_backward(dq, dk, dv, dctx, q, k, v, dims, mask)
    }

    #[inline]
    fn linear_attention_weights<T: Float>(
        &self,
        q: &[T],
        k: &[T],
        dims: AttnDims,
        mask: AttnMask<'_>,
    ) -> Vec<T> {
        lin::linear_attention_weights(q, k, dims, mask)
    }

    #[inline]
    fn linear_attention_step<T: Float>(
        &self,
        state: &mut LinearState<T>,
        b: usize,
        (q, k, v): (&[T], &[T], &[T]),
        out: &mut [T],
    ) {
        state.step(b, q, k, v, out)
    }

    #[inline]
    fn gated_delta_convolve<T: Float>(
        &self,
        state: &mut DeltaState<T>,
        b: usize,
        weight: &[T],
        x: &[T],
        y: &mut [T],
    ) {
        state.convolve(b, weight, x, y)
    }

    #[inline]
    fn gated_delta_step<T: Float>(
        &self,
        state: &mut DeltaState<T>,
        b: usize,
        qkv: (&[T], &[T], &[T]),
        gates: (&[T], &[T]),
        out: &mut [T],
    ) {
        state.step(b, qkv, gates, out)
    }

    #[inline]
    fn gated_delta_chunk<T: Float>(
        &self,
        state: &mut DeltaState<T>,
        b: usize,
        qkv: (&[T], &[T], &[T]),
        gates: (&[T], &[T]),
        out: &mut [T],
        chunk: usize,
    ) {
        state.chunk(b, qkv, gates, out, chunk)
    }

    #[inline]
    fn layer_norm<T: Float>(
        &self,
        y: &mut [T],
        x: &[T],
        (gamma, beta): (&[T], &[T]),
        d: usize,
        eps: f64,
    ) -> LayerNormStats<T> {
        layer_norm::layer_norm_forward(y, x, gamma, beta, d, eps)
    }

    #[inline]
    fn layer_norm_backward<T: Float>(
        &self,
        dx: &mut [T],
        dy: &[T],
        x: &[T],
        stats: &LayerNormStats<T>,
        gamma: &[T],
        (dgamma, dbeta): (&mut [T], &mut [T]),
        d: usize,
    ) {
        layer_norm::layer_norm_backward(dx, dy, x, stats, gamma, dgamma, dbeta, d)
    }

    #[inline]
    fn rms_norm<T: Float>(
        &self,
        y: &mut [T],
        x: &[T],
        gain: &[T],
        d: usize,
        eps: f64,
    ) -> RmsNormStats<T> {
        rms_norm::rms_norm_forward(y, x, gain, d, eps)
    }

    #[inline]
    fn rms_norm_backward<T: Float>(
        &self,
        dx: &mut [T],
        dy: &[T],
        x: &[T],
        stats: &RmsNormStats<T>,
        gain: &[T],
        dgain: &mut [T],
        d: usize,
    ) {
        rms_norm::rms_norm_backward(dx, dy, x, stats, gain, dgain, d)
    }

    #[inline]
    fn rope<T: Float>(
        &self,
        x: &mut [T],
        rope: Rope,
        freq_factors: &[f64],
        seq_len: usize,
        heads: usize,
        d_head_pos: (usize, usize),
    ) {
        rot::rope_forward_scaled(x, rope, freq_factors, seq_len, heads, d_head_pos)
    }

    #[inline]
    fn rope_backward<T: Float>(
        &self,
        dy: &mut [T],
        rope: Rope,
        freq_factors: &[f64],
        seq_len: usize,
        heads: usize,
        d_head_pos: (usize, usize),
    ) {
        rot::rope_backward_scaled(dy, rope, freq_factors, seq_len, heads, d_head_pos)
    }

    fn rope_llama3_factors(&self, base: f64, d_head: usize, s: Llama3Scaling) -> Vec<f64> {
        rot::llama3_freq_factors(base, d_head, s)
    }

    fn rope_yarn_factors(&self, base: f64, d_head: usize, y: YarnScaling) -> Vec<f64> {
        rot::yarn_freq_factors(base, d_head, y)
    }

    fn rope_yarn_attention_factor(&self, s: f64, mscale: Option<f64>, all: Option<f64>) -> f64 {
        rot::yarn_attention_factor(s, mscale, all)
    }

    #[inline]
    fn relu<T: Float>(&self, x: &mut [T]) {
        act::relu_inplace(x)
    }

    #[inline]
    fn bias_relu<T: Float>(&self, y: &mut [T], b: &[T]) {
        act::bias_relu_inplace(y, b)
    }

    #[inline]
    fn relu_backward<T: Float>(&self, dy: &mut [T], y: &[T], mask: Option<&[T]>) {
        act::relu_backward_inplace(dy, y, mask)
    }

    #[inline]
    fn gelu_erf<T: Float>(&self, y: &mut [T], x: &[T]) {
        act::gelu_erf_forward(y, x)
    }

    #[inline]
    fn gelu_erf_backward<T: Float>(&self, dy: &mut [T], x: &[T]) {
        act::gelu_erf_backward_inplace(dy, x)
    }

    #[inline]
    fn gelu_tanh<T: Float>(&self, y: &mut [T], x: &[T]) {
        act::gelu_tanh_forward(y, x)
    }

    #[inline]
    fn gelu_tanh_backward<T: Float>(&self, dy: &mut [T], x: &[T]) {
        act::gelu_tanh_backward_inplace(dy, x)
    }

    #[inline]
    fn silu<T: Float>(&self, y: &mut [T], x: &[T]) {
        act::silu_forward(y, x)
    }

    #[inline]
    fn silu_backward<T: Float>(&self, dy: &mut [T], x: &[T]) {
        act::silu_backward_inplace(dy, x)
    }

    #[inline]
    fn swiglu<T: Float>(&self, h: &mut [T], gate: &[T], up: &[T]) {
        act::swiglu_forward(h, gate, up)
    }

    #[inline]
    fn swiglu_backward<T: Float>(
        &self,
        (dgate, dup): (&mut [T], &mut [T]),
        dh: &[T],
        gate: &[T],
        up: &[T],
    ) {
        act::swiglu_backward(dgate, dup, dh, gate, up)
    }

    #[inline]
    fn swiglu_clamped<T: Float>(&self, h: &mut [T], gate: &[T], up: &[T], clamp: (f64, f64)) {
        crate::kernels::swiglu_clamped::forward(h, gate, up, clamp)
    }

    #[inline]
    fn swiglu_clamped_backward<T: Float>(
        &self,
        grads: (&mut [T], &mut [T]),
        dh: &[T],
        gate: &[T],
        up: &[T],
        clamp: (f64, f64),
    ) {
        crate::kernels::swiglu_clamped::backward(grads, dh, gate, up, clamp)
    }

    #[inline]
    fn add<T: Float>(&self, y: &mut [T], x: &[T]) {
        act::add_inplace(y, x)
    }

    #[inline]
    fn mul<T: Float>(&self, y: &mut [T], m: &[T]) {
        act::mul_inplace(y, m)
    }

    #[inline]
    fn dropout_add<T: Float>(&self, y: &mut [T], mask: Option<&[T]>, x: &[T]) {
        act::dropout_add_inplace(y, mask, x)
    }

    #[inline]
    fn dropout_mask<T: Float>(&self, rng: &mut Rng, n: usize, p: f64) -> Option<Vec<T>> {
        dropout::dropout_mask(rng, n, p)
    }

    #[inline]
    fn dropout_rng(&self, rng: Option<&mut Rng>, p: f64) -> Option<Rng> {
        dropout::fork_for(rng, p)
    }

    #[inline]
    fn softcap<T: Float>(&self, x: &mut [T], row_len: usize, c: f64) {
        act::softcap_inplace(x, row_len, c)
    }

    #[inline]
    fn softcap_backward<T: Float>(&self, dz: &mut [T], dy: &[T], z: &[T], c: f64) {
        act::softcap_backward(dz, dy, z, c)
    }

    #[inline]
    fn tanh<T: Float>(&self, x: &mut [T]) {
        act::tanh_inplace(x)
    }

    #[inline]
    fn tanh_backward<T: Float>(&self, dy: &mut [T], y: &[T]) {
        act::tanh_backward_inplace(dy, y)
    }

    fn softmax_rows<T: Float>(&self, x: &mut [T], row_len: usize) {
        for row in x.chunks_mut(row_len) {
            softmax::softmax_inplace(row, row_len);
        }
    }

    fn softmax_rows_backward<T: Float>(&self, dp: &mut [T], p: &[T], row_len: usize) {
        for (g, q) in dp.chunks_mut(row_len).zip(p.chunks(row_len)) {
            softmax::softmax_backward_inplace(g, q);
        }
    }

    #[inline]
    fn log_softmax_rows<T: Float>(&self, x: &mut [T], row_len: usize) {
        softmax::log_softmax_rows(x, row_len)
    }

    #[inline]
    fn cross_entropy<T: Float>(
        &self,
        logits: &mut [T],
        targets: &[u32],
        vocab: usize,
        epsilon: f64,
        grad_scale: Option<f64>,
        ignore: Option<u32>,
    ) -> (f64, f64) {
        softmax::cross_entropy_rows(logits, targets, vocab, epsilon, grad_scale, ignore)
    }

    fn pack_weight(
        &self,
        precision: Precision,
        w: &[f32],
        rows: usize,
        cols: usize,
    ) -> Result<Option<PackedWeight>, String> {
        precision.pack(w, rows, cols)
    }

    fn multiplies_blocks(&self, ty: GgmlType) -> bool {
        lowp::is_block_product(ty)
    }

    fn copies_blocks(&self, ty: GgmlType) -> bool {
        lowp::copies_blocks(ty)
    }

    fn pack_blocks(
        &self,
        ty: GgmlType,
        data: RawBytes,
        rows: usize,
        cols: usize,
    ) -> Result<Option<PackedWeight>, String> {
        lowp::pack_ggml(ty, data, rows, cols)
    }

    #[inline]
    fn dequantise_ggml(&self, ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), String> {
        lowp::ggml::dequantize_into(ty, data, out)
    }

    fn kv_quantise_row(&self, ty: KvType, rotation: Option<usize>, x: &[f32], out: &mut [u8]) {
        match rotation {
            None => kv_blocks::quantise_row(ty, x, out),
            Some(n) => {
                let mut rotated = x.to_vec();
                hadamard::rotate(&mut rotated, n);
                kv_blocks::quantise_row(ty, &rotated, out)
            }
        }
    }

    fn kv_dequantise_row(&self, ty: KvType, rotation: Option<usize>, bytes: &[u8], out: &mut [f32]) {
        kv_blocks::dequantise_row(ty, bytes, out);
        if let Some(n) = rotation {
            hadamard::rotate(out, n);
        }
    }
}
