//! The one interface the model code computes through: every numeric operation of a forward,
//! a backward or a decoding step is a method of [`Backend`], and `src/model` imports from this
//! module only, never from `crate::kernels` (a test below keeps it so).
//!
//! The op set, by group (shapes are row-major; `rows` is `batch · len`):
//!
//! - **products**: [`weight_product`](Backend::weight_product) `y = x Wᵀ` and its backward
//!   [`weight_product_backward`](Backend::weight_product_backward), the general
//!   [`matmul`](Backend::matmul), [`transpose_weight`](Backend::transpose_weight),
//!   [`add_row_bias`](Backend::add_row_bias), [`add_column_sums`](Backend::add_column_sums);
//! - **attention**: [`attention`](Backend::attention) and its backward, linear attention
//!   ([`linear_attention`](Backend::linear_attention), its backward, its weights and its
//!   decoding [`linear_attention_step`](Backend::linear_attention_step));
//! - **norms and positions**: [`layer_norm`](Backend::layer_norm),
//!   [`rms_norm`](Backend::rms_norm), rotary positions [`rope`](Backend::rope), each with its
//!   backward, and the rotary frequency factors of Llama 3.1 and YaRN;
//! - **element-wise**: ReLU, GELU (erf and tanh), SwiGLU, tanh and the logits' soft cap with
//!   their backwards, `add`, `mul`, dropout ([`dropout_mask`](Backend::dropout_mask),
//!   [`dropout_add`](Backend::dropout_add));
//! - **losses**: [`softmax_rows`](Backend::softmax_rows) and its backward,
//!   [`log_softmax_rows`](Backend::log_softmax_rows), the label-smoothed
//!   [`cross_entropy`](Backend::cross_entropy) with its gradient;
//! - **block formats**: packing weights ([`pack_weight`](Backend::pack_weight),
//!   [`pack_blocks`](Backend::pack_blocks)), a GGUF table's rows
//!   ([`dequantise_ggml`](Backend::dequantise_ggml)), the KV cache's rows
//!   ([`kv_quantise_row`](Backend::kv_quantise_row) and back).
//!
//! [`Cpu`] is the one implementation today: host slices and the kernels of `crate::kernels`,
//! bit for bit, generic over [`Float`] so that the float64 reference path (the gradient and
//! layer checks) runs the same code as float32 inference. A device backend would implement the
//! same calls over its own buffers (the slices here become handles to device memory, uploaded
//! and read back at the model's edges). The types the calls take (masks, dimensions, stats,
//! packed weights, formats) are re-exported here.

mod cpu;
mod device;
#[cfg(feature = "gpu")]
mod gpu;
#[cfg_attr(not(any(test, feature = "internals")), allow(dead_code))]
mod host;
#[cfg(test)]
mod seam_tests;

pub use device::{
    AttnScores, Device, DeviceAct, DeviceError, KvShape, NormOf, StepRows, WeightSource,
};
#[cfg(feature = "gpu")]
pub use gpu::GpuDevice;
// The layer tests' GGUF-to-GPU format rule (feature `internals`).
#[cfg(all(feature = "gpu", feature = "internals"))]
pub use gpu::format_of as gpu_format;
// The host device runs the device step in the tests (and for library users, `internals`).
#[cfg_attr(not(any(test, feature = "internals")), allow(unused_imports))]
pub use host::Host;

// `Cpu` is named outside the library only (feature `internals`); the model uses `CPU`.
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use cpu::Cpu;
pub use cpu::CPU;

pub use crate::kernels::attention::{
    Attended, AttnDims, AttnMask, AttnWeights, KeyRanges, KvSlice, KvStore, KvView, Purpose,
    SavedRef, Scores,
};
pub use crate::kernels::sinks::WithSinks;
// The model's tests only: the length from which training takes the tiled kernel, a GGUF
// file's K-quant matrices.
#[cfg(test)]
pub use crate::kernels::{attention::TILED_FROM_KEYS, lowp::KQuantMatrix};
pub use crate::kernels::gated_delta::{DeltaShape, DeltaState};
pub use crate::kernels::hadamard::{
    key_rotation as kv_key_rotation, value_rotation as kv_value_rotation,
};
pub use crate::kernels::kv_blocks::{KvType, PackedRows};
pub use crate::kernels::layer_norm::LayerNormStats;
pub use crate::kernels::linear_attention::LinearState;
pub use crate::kernels::lowp::bf16_train::{Bf16Kernel, Bf16Products};
pub use crate::kernels::lowp::ggml::GgmlType;
pub use crate::kernels::lowp::{Int8Matrix, PackedWeight, Precision, RawBytes};
pub use crate::kernels::matmul::{MatMut, MatRef};
pub use crate::kernels::rms_norm::RmsNormStats;
pub use crate::kernels::rope::{Llama3Scaling, Rope, RopeStyle, YarnScaling};
pub use crate::kernels::sparse_pattern::Pattern;

use crate::rng::Rng;
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

/// The numeric calls of a model (see the module docs for the op set).
pub trait Backend {
    // ---- products ----

    /// `y [rows, d_out] = x [rows, d_in] · Wᵀ`, no bias; the backend picks the kernel from the
    /// forms of `w` it is given.
    fn weight_product<T: Float>(&self, y: &mut [T], x: &[T], rows: usize, w: WeightRef<'_, T>);

    /// Backward of [`weight_product`](Self::weight_product): `dW [d_out, d_in] += dyᵀ x` and,
    /// when given, `dx [rows, d_in] = dy W` (`x [rows, d_in]`, `dy [rows, d_out]`).
    fn weight_product_backward<T: Float>(
        &self,
        dw: &mut [T],
        dx: Option<&mut [T]>,
        x: &[T],
        dy: &[T],
        w: WeightRef<'_, T>,
    );

    /// `dst = α · lhs · rhs`, or `dst += α · lhs · rhs` when `accumulate` (views may be
    /// transposed: [`MatRef::t`]).
    fn matmul<T: Float>(
        &self,
        dst: MatMut<'_, T>,
        lhs: MatRef<'_, T>,
        rhs: MatRef<'_, T>,
        alpha: T,
        accumulate: bool,
    );

    /// `Wᵀ [d_in, d_out]` of `w [d_out, d_in]` (the form a weight keeps for inference; for a
    /// vocabulary-sized `d_out`, in panels of outputs: `kernels::matmul::PANEL`), which
    /// [`weight_product`](Self::weight_product) reads.
    fn transpose_weight<T: Float>(&self, w: &[T], d_out: usize, d_in: usize) -> Vec<T>;

    /// [`transpose_weight`](Self::transpose_weight) of a weight given up: panels made in `w`'s
    /// own memory (a vocabulary-sized table never held twice), a plain `Wᵀ` in a new vector.
    fn transpose_weight_owned<T: Float>(&self, w: Vec<T>, d_out: usize, d_in: usize) -> Vec<T>;

    /// Row `o` of `W [d_out, d_in]` into `out [d_in]`, read from the form `w` holds: its values,
    /// else its `Wᵀ`, else its packed rows (int8 `s_o · q_ok`, bf16); an error where none can
    /// be read back (GGUF blocks).
    fn weight_row<T: Float>(&self, w: WeightRef<'_, T>, o: usize, out: &mut [T]) -> Result<(), String>;

    /// `y[r] += b` for every row `r` of `y [rows, b.len()]`.
    fn add_row_bias<T: Float>(&self, y: &mut [T], b: &[T]);

    /// `out[c] += Σ_r x[r, c]` for `x [rows, cols]` (bias gradients).
    fn add_column_sums<T: Float>(&self, out: &mut [T], x: &[T], cols: usize);

    // ---- attention ----

    /// `softmax(q kᵀ / √d_head) v` of `q [batch * q_len, d_model]` over `kv`, query `i` of row
    /// `b` seeing keys `ranges.range(b, i)`; the backend picks the kernel for `purpose`.
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

    /// Linear attention, `ctx_i = Σ_j φ(q_i)·φ(k_j) v_j / Σ_j φ(q_i)·φ(k_j)` over the keys
    /// `mask` lets query `i` see: `ctx [batch * q_len, heads * d_head]` (0 where none).
    #[allow(clippy::too_many_arguments)]
    fn linear_attention<T: Float>(
        &self,
        ctx: &mut [T],
        q: &[T],
        k: &[T],
        v: &[T],
        dims: AttnDims,
        mask: AttnMask<'_>,
    );

    /// Backward of [`linear_attention`](Self::linear_attention): writes `dq [batch * q_len,
    /// d_model]`, `dk`, `dv` `[batch * k_len, d_kv]` from `dctx`.
    #[allow(clippy::too_many_arguments)]
    fn linear_attention_backward<T: Float>(
        &self,
        grads: (&mut [T], &mut [T], &mut [T]),
        dctx: &[T],
        q: &[T],
        k: &[T],
        v: &[T],
        dims: AttnDims,
        mask: AttnMask<'_>,
    );

    /// The weights `w_ij = φ(q_i)·φ(k_j) / Σ_j' φ(q_i)·φ(k_j')` of linear attention,
    /// `[batch, heads, q_len, k_len]` (0 where masked).
    fn linear_attention_weights<T: Float>(
        &self,
        q: &[T],
        k: &[T],
        dims: AttnDims,
        mask: AttnMask<'_>,
    ) -> Vec<T>;

    /// One decoding position of row `b` through linear attention's running sums: `S += φ(k) vᵀ`,
    /// `z += φ(k)`, then `out = φ(q) S / φ(q)·z` (`q, out [heads * d_head]`, `k, v [kv_heads *
    /// d_head]`).
    fn linear_attention_step<T: Float>(
        &self,
        state: &mut LinearState<T>,
        b: usize,
        qkv: (&[T], &[T], &[T]),
        out: &mut [T],
    );

    /// One position of row `b` through a Gated DeltaNet layer's causal short convolution
    /// (`kernels::gated_delta`): `y [conv_dim] = silu(Σ_j w[c, j] · window_j[c])` over the row's
    /// last `K` inputs, `x [conv_dim]` the newest (`weight [conv_dim, K]`).
    fn gated_delta_convolve<T: Float>(
        &self,
        state: &mut DeltaState<T>,
        b: usize,
        weight: &[T],
        x: &[T],
        y: &mut [T],
    );

    /// The gated delta rule's recurrent form, one position of row `b`: `S ← exp(g) S`,
    /// `S += β k (v − Sᵀ k)ᵀ`, `out = Sᵀ q` per value head (`q, k [key_heads · d_k]`, `v, out
    /// [value_heads · d_v]`, `g, β [value_heads]`).
    fn gated_delta_step<T: Float>(
        &self,
        state: &mut DeltaState<T>,
        b: usize,
        qkv: (&[T], &[T], &[T]),
        gates: (&[T], &[T]),
        out: &mut [T],
    );

    /// The gated delta rule's chunked form over `len` positions of row `b` (`[len, …]` each),
    /// `chunk` positions at a time: the recurrent form's outputs and final state, with products.
    fn gated_delta_chunk<T: Float>(
        &self,
        state: &mut DeltaState<T>,
        b: usize,
        qkv: (&[T], &[T], &[T]),
        gates: (&[T], &[T]),
        out: &mut [T],
        chunk: usize,
    );

    // ---- norms and positions ----

    /// `y = γ ⊙ (x − μ) / √(σ² + ε) + β` per row of `x [rows, d]` (μ, σ² the row's mean and
    /// biased variance); returns the stats the backward needs.
    fn layer_norm<T: Float>(
        &self,
        y: &mut [T],
        x: &[T],
        gamma_beta: (&[T], &[T]),
        d: usize,
        eps: f64,
    ) -> LayerNormStats<T>;

    /// Backward of [`layer_norm`](Self::layer_norm): `dx = rstd · (g − mean(g) − x̂ ·
    /// mean(g ⊙ x̂))` with `g = γ ⊙ dy`, `x̂ = (x − μ) · rstd`; `dγ += Σ dy ⊙ x̂`, `dβ += Σ dy`.
    #[allow(clippy::too_many_arguments)]
    fn layer_norm_backward<T: Float>(
        &self,
        dx: &mut [T],
        dy: &[T],
        x: &[T],
        stats: &LayerNormStats<T>,
        gamma: &[T],
        dgamma_dbeta: (&mut [T], &mut [T]),
        d: usize,
    );

    /// `y = g ⊙ x / √(mean(x²) + ε)` per row of `x [rows, d]`, gain `g [d]`.
    fn rms_norm<T: Float>(
        &self,
        y: &mut [T],
        x: &[T],
        gain: &[T],
        d: usize,
        eps: f64,
    ) -> RmsNormStats<T>;

    /// Backward of [`rms_norm`](Self::rms_norm): `dx = r · (g ⊙ dy − x̂ · mean(g ⊙ dy ⊙ x̂))`
    /// with `x̂ = x · r`, `r = 1/√(mean(x²) + ε)`; `dg += Σ_rows dy ⊙ x̂`.
    #[allow(clippy::too_many_arguments)]
    fn rms_norm_backward<T: Float>(
        &self,
        dx: &mut [T],
        dy: &[T],
        x: &[T],
        stats: &RmsNormStats<T>,
        gain: &[T],
        dgain: &mut [T],
        d: usize,
    );

    /// Rotary positions in place: each pair `(a, b)` of every head of `x [batch * seq_len,
    /// heads * d_head]` at position `p = pos_offset + r % seq_len` becomes
    /// `(a cos pθᵢ − b sin pθᵢ, a sin pθᵢ + b cos pθᵢ)`, `θᵢ = base^(−2i/d_head) / fᵢ`
    /// (`freq_factors [d_head / 2]`; empty: all `fᵢ = 1`).
    fn rope<T: Float>(
        &self,
        x: &mut [T],
        rope: Rope,
        freq_factors: &[f64],
        seq_len: usize,
        heads: usize,
        d_head_pos: (usize, usize),
    );

    /// Backward of [`rope`](Self::rope): the inverse rotation of `dy` at the same positions.
    fn rope_backward<T: Float>(
        &self,
        dy: &mut [T],
        rope: Rope,
        freq_factors: &[f64],
        seq_len: usize,
        heads: usize,
        d_head_pos: (usize, usize),
    );

    /// Llama 3.1's divisors `fᵢ` (`i < d_head / 2`): 1 for wavelengths under `L/h`, `s` over
    /// `L/l`, `1 / ((1 − ρ)/s + ρ)` between, `ρ = (L/λ − l)/(h − l)`.
    fn rope_llama3_factors(&self, base: f64, d_head: usize, s: Llama3Scaling) -> Vec<f64>;

    /// YaRN's divisors `fᵢ = 1 / (ρᵢ/s + 1 − ρᵢ)`, `ρᵢ` the ramp between the dimensions of
    /// `β_fast` and `β_slow` rotations over `L`.
    fn rope_yarn_factors(&self, base: f64, d_head: usize, y: YarnScaling) -> Vec<f64>;

    /// YaRN's attention factor `0.1 · ln s + 1` (1 for `s ≤ 1`), or with both `mscale`s the
    /// ratio `(0.1 · m · ln s + 1) / (0.1 · m_all · ln s + 1)`.
    fn rope_yarn_attention_factor(&self, s: f64, mscale: Option<f64>, all: Option<f64>) -> f64;

    // ---- element-wise ----

    /// `x ← max(x, 0)`.
    fn relu<T: Float>(&self, x: &mut [T]);

    /// `y ← max(y + b, 0)` per row of `y [rows, b.len()]`.
    fn bias_relu<T: Float>(&self, y: &mut [T], b: &[T]);

    /// ReLU's backward through dropout: `dy ← dy ⊙ m ⊙ 1[y > 0]` (`m` all ones without a mask).
    fn relu_backward<T: Float>(&self, dy: &mut [T], y: &[T], mask: Option<&[T]>);

    /// `y = GELU(x) = x Φ(x)`, the exact (erf) form.
    fn gelu_erf<T: Float>(&self, y: &mut [T], x: &[T]);

    /// `dy ← dy ⊙ GELU'(x)`, erf form.
    fn gelu_erf_backward<T: Float>(&self, dy: &mut [T], x: &[T]);

    /// `y = x/2 · (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
    fn gelu_tanh<T: Float>(&self, y: &mut [T], x: &[T]);

    /// `dy ← dy ⊙ GELU'(x)`, tanh form.
    fn gelu_tanh_backward<T: Float>(&self, dy: &mut [T], x: &[T]);

    /// `y = silu(x) = x σ(x)` (swish).
    fn silu<T: Float>(&self, y: &mut [T], x: &[T]);

    /// `dy ← dy ⊙ silu'(x)`.
    fn silu_backward<T: Float>(&self, dy: &mut [T], x: &[T]);

    /// `h = silu(g) ⊙ u`, `silu(x) = x σ(x)` (all `[rows, d_ff]`).
    fn swiglu<T: Float>(&self, h: &mut [T], gate: &[T], up: &[T]);

    /// Backward of [`swiglu`](Self::swiglu): `dgate = dh ⊙ u ⊙ silu'(g)`, `dup = dh ⊙ silu(g)`.
    fn swiglu_backward<T: Float>(&self, grads: (&mut [T], &mut [T]), dh: &[T], gate: &[T], up: &[T]);

    /// gpt-oss's clamped SwiGLU (`kernels::swiglu_clamped`): `h = (clamp(u, −l, l) + 1) ⊙ g' σ(α
    /// g')`, `g' = min(g, l)`, `clamp = (α, l)` (all `[rows, d_ff]`).
    fn swiglu_clamped<T: Float>(&self, h: &mut [T], gate: &[T], up: &[T], clamp: (f64, f64));

    /// Backward of [`swiglu_clamped`](Self::swiglu_clamped): `(dgate, dup)`, zero where a clamp
    /// holds.
    fn swiglu_clamped_backward<T: Float>(
        &self,
        grads: (&mut [T], &mut [T]),
        dh: &[T],
        gate: &[T],
        up: &[T],
        clamp: (f64, f64),
    );

    /// `y += x`.
    fn add<T: Float>(&self, y: &mut [T], x: &[T]);

    /// `y ⊙= m`.
    fn mul<T: Float>(&self, y: &mut [T], m: &[T]);

    /// `y ← y ⊙ m + x` (a sublayer's dropout, then the residual); `y ← y + x` without a mask.
    fn dropout_add<T: Float>(&self, y: &mut [T], mask: Option<&[T]>, x: &[T]);

    /// An inverted-dropout mask of `n` factors, 0 with probability `p` and `1/(1 − p)`
    /// otherwise, from one draw of `rng`; `None` when `p = 0`.
    fn dropout_mask<T: Float>(&self, rng: &mut Rng, n: usize, p: f64) -> Option<Vec<T>>;

    /// A generator of its own for a sublayer's inner dropout, forked from `rng` only when
    /// `p > 0`.
    fn dropout_rng(&self, rng: Option<&mut Rng>, p: f64) -> Option<Rng>;

    /// `x ← c · tanh(x / c)` (a soft cap at ±c), rows of `row_len`.
    fn softcap<T: Float>(&self, x: &mut [T], row_len: usize, c: f64);

    /// Backward of [`softcap`](Self::softcap): `dz = dy ⊙ (1 − tanh²(z / c))`, `z` uncapped.
    fn softcap_backward<T: Float>(&self, dz: &mut [T], dy: &[T], z: &[T], c: f64);

    /// `x ← tanh(x)`.
    fn tanh<T: Float>(&self, x: &mut [T]);

    /// Backward of [`tanh`](Self::tanh): `dy ← dy ⊙ (1 − y²)` for `y = tanh(x)`.
    fn tanh_backward<T: Float>(&self, dy: &mut [T], y: &[T]);

    // ---- losses ----

    /// `x ← softmax(x)` over each row of `x [rows, row_len]` (a router's probabilities).
    fn softmax_rows<T: Float>(&self, x: &mut [T], row_len: usize);

    /// Backward of [`softmax_rows`](Self::softmax_rows): each row of `dp` becomes
    /// `p ⊙ (dp − p · dp)` for the probabilities `p [rows, row_len]`.
    fn softmax_rows_backward<T: Float>(&self, dp: &mut [T], p: &[T], row_len: usize);

    /// `x ← x − log Σ eˣ` over each row of `x [rows, row_len]` (log-probabilities).
    fn log_softmax_rows<T: Float>(&self, x: &mut [T], row_len: usize);

    /// Label-smoothed cross-entropy of `logits [rows, vocab]` against `targets [rows]`:
    /// per row `L = (1 − ε) · (−log p_y) + ε · mean_v(−log p_v)`, `p = softmax(z)`; returns
    /// `(Σ L, Σ −log p_y)` over the rows whose target is not `ignore`. With `grad_scale = s`
    /// each row becomes `s · ∂L/∂z = s · (p − q)`, `q = (1 − ε) · onehot(y) + ε / V` (zeros for
    /// an ignored row); without, its log-probabilities.
    fn cross_entropy<T: Float>(
        &self,
        logits: &mut [T],
        targets: &[u32],
        vocab: usize,
        epsilon: f64,
        grad_scale: Option<f64>,
        ignore: Option<u32>,
    ) -> (f64, f64);

    // ---- block formats ----

    /// `w [rows, cols]` packed for inference in `precision` (`None`: float32, nothing packed).
    fn pack_weight(
        &self,
        precision: Precision,
        w: &[f32],
        rows: usize,
        cols: usize,
    ) -> Result<Option<PackedWeight>, String>;

    /// Whether a ggml tensor of `ty` is multiplied in its stored blocks.
    fn multiplies_blocks(&self, ty: GgmlType) -> bool;

    /// Whether [`pack_blocks`](Self::pack_blocks) keeps its own copy of a tensor of `ty`
    /// rather than the bytes it was given.
    fn copies_blocks(&self, ty: GgmlType) -> bool;

    /// A ggml tensor `[rows, cols]` (`data` as the file stores it) packed for block products;
    /// `None` for a type that is not multiplied in blocks.
    fn pack_blocks(
        &self,
        ty: GgmlType,
        data: RawBytes,
        rows: usize,
        cols: usize,
    ) -> Result<Option<PackedWeight>, String>;

    /// `out` = the values of the ggml blocks `data` of `ty` (`out.len()` of them).
    fn dequantise_ggml(&self, ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), String>;

    /// Packs a KV cache row `x` (whole blocks of `ty`) into `out`, first rotated by `R_n` with
    /// `rotation` `Some(n)` ([`kv_key_rotation`], [`kv_value_rotation`]).
    fn kv_quantise_row(&self, ty: KvType, rotation: Option<usize>, x: &[f32], out: &mut [u8]);

    /// Unpacks a KV cache row `bytes` of `ty` into `out`, rotated back with `rotation`
    /// `Some(n)`.
    fn kv_dequantise_row(&self, ty: KvType, rotation: Option<usize>, bytes: &[u8], out: &mut [f32]);
}
