//! Inference on buffers a device owns: the operations of a decoder's step as methods of
//! [`Device`], each over the device's own handles (activations, weights, KV blocks), so that one
//! model step (`crate::model::device_lm`) runs on the host or on a GPU unchanged.
//!
//! The calls are *recorded*: a device may run each at once (the [`Host`](super::host::Host)
//! device) or queue them and run the whole step when a result is read back
//! ([`read`](Device::read), [`read_ids`](Device::read_ids): the GPU device submits once per
//! step). Outputs are `&mut` handles, inputs shared ones; every size is checked before anything
//! runs, and a failure (a shape, device memory, a lost device) is a [`DeviceError`] naming it.
//!
//! The op set of a pre-norm decoder step, in the order a layer calls them:
//!
//! ```text
//! x      = E[ids] · s                              gather, scale (when s ≠ 1)
//! h      ← h + y_prev;  u = Norm(h)                add_norm (norm for the first layer)
//! qkv    = u [W_q; W_k; W_v]ᵀ (+ b)                product (a stacked weight), add_bias
//! q, K, V ← RoPE(q), RoPE(k) → block slots, v      rope_kv_write
//! a      = softmax(q Kᵀ · scale) V                 paged_attention (each token its own row)
//! o      = a W_oᵀ                                  product
//! h      ← h + o;   u = Norm(h)                    add_norm
//! f      = act(u W_gateᵀ) ⊙ u W_upᵀ                glu_product (or product + activate)
//! y      = f W_downᵀ                               product
//! ```
//!
//! then the final norm, the rows that need outputs ([`copy_rows`](Device::copy_rows)), the
//! head's product, and [`argmax`](Device::argmax) or the logits read back.

use super::{GgmlType, PackedWeight, Rope, WeightRef};

/// What can go wrong on a device, naming the problem.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The device's own error (GPU: no adapter, out of memory, lost device, a shape).
    #[error("{0}")]
    Device(String),
    /// The model, or this step, needs something the device path does not do yet.
    #[error("--device {device}: {what}")]
    Unsupported {
        /// The device, as `--device` names it.
        device: String,
        /// What is not supported, by name.
        what: String,
    },
}

/// A weight matrix `W [d_out, d_in]` as the model holds it, handed to [`Device::weight`].
#[derive(Clone, Copy, Debug)]
pub enum WeightSource<'a> {
    /// A linear layer's (or the output head's) weight with the forms it keeps.
    Layer(WeightRef<'a, f32>),
    /// A table's rows in a GGUF file's stored blocks, `[d_out, row bytes]` (an embedding
    /// looked up in its blocks).
    Rows {
        ty: GgmlType,
        bytes: &'a [u8],
        d_out: usize,
        d_in: usize,
    },
}

impl<'a> WeightSource<'a> {
    /// A float table `values [rows, d]` (positions, BERT's tables).
    pub fn floats(values: &'a [f32], rows: usize, d: usize) -> Self {
        WeightSource::Layer(WeightRef {
            w: values,
            d_in: d,
            d_out: rows,
            transposed: None,
            packed: None,
            bf16: None,
        })
    }

    /// `(d_out, d_in)`.
    pub fn shape(&self) -> (usize, usize) {
        match self {
            WeightSource::Layer(w) => (w.d_out, w.d_in),
            WeightSource::Rows { d_out, d_in, .. } => (*d_out, *d_in),
        }
    }

    /// The weight as GGUF blocks of one type in the file's layout, where it is held so
    /// (`None`: float values only, or a format of this crate's own such as int8).
    pub fn ggml_blocks(&self) -> Option<(GgmlType, std::borrow::Cow<'_, [u8]>)> {
        match self {
            WeightSource::Layer(w) => w.packed.and_then(PackedWeight::ggml_blocks),
            WeightSource::Rows { ty, bytes, .. } => Some((*ty, std::borrow::Cow::Borrowed(bytes))),
        }
    }
}

/// Which norm a [`Device::norm`] applies, with its parameters on the device (`gain` already
/// holds any stored offset, `w + o`).
#[derive(Debug)]
pub enum NormOf<'a, D: Device + ?Sized> {
    /// `y = x / √(mean(x²) + eps) · gain`.
    Rms { gain: &'a D::Tensor, eps: f64 },
    /// `y = (x − μ) / √(σ² + eps) · gain + bias`.
    Layer {
        gain: &'a D::Tensor,
        bias: &'a D::Tensor,
        eps: f64,
    },
}

impl<D: Device + ?Sized> Clone for NormOf<'_, D> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<D: Device + ?Sized> Copy for NormOf<'_, D> {}

/// The activation of a feed-forward unit on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceAct {
    Relu,
    GeluErf,
    GeluTanh,
    Silu,
}

/// One step's tokens as the attention sees them, on the device: token `i` belongs to table
/// row `seq[i]` (the row of `table` it reads and writes) at position `pos[i]`, and attends to
/// `ctx[i] = pos[i] + 1` keys.
#[derive(Debug)]
pub struct StepRows<'a, D: Device + ?Sized> {
    pub seq: &'a D::Ids,
    pub pos: &'a D::Ids,
    pub ctx: &'a D::Ids,
    /// `[tokens, max_blocks]`: each token's row of block ids.
    pub table: &'a D::Ids,
    pub max_blocks: usize,
    /// The longest context of the step (`max ctx`).
    pub max_ctx: usize,
    pub tokens: usize,
}

/// How attention forms a query's scores and which keys it sees: `s = scale · q · k`, soft-capped
/// `c · tanh(s / c)` when `softcap` is set (Gemma 2), over the last `window` keys of the
/// context when set (sliding-window layers), else all of them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnScores {
    pub scale: f64,
    pub window: Option<usize>,
    pub softcap: Option<f64>,
}

/// One layer's keys and values in blocks of `block_size` positions, `[blocks, block_size,
/// n_kv_heads, d_head]` each, on the device ([`Device::kv_blocks`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    pub blocks: usize,
    pub block_size: usize,
    pub n_kv_heads: usize,
    pub d_head: usize,
}

/// The operations of an inference step over device-owned buffers (see the module docs).
pub trait Device {
    /// `f32` values in device memory.
    type Tensor;
    /// `u32` values in device memory (token ids, positions, block tables).
    type Ids;
    /// A weight matrix (or several stacked by rows) in a format the device multiplies.
    type Weight;
    /// One layer's KV blocks.
    type Kv;
    /// The rotary frequencies of a layer.
    type Rope;

    /// How `--device` names it (`cpu`, `gpu:0`).
    fn name(&self) -> String;

    // ---- memory ----

    /// `len` zeros.
    fn zeros(&self, len: usize) -> Result<Self::Tensor, DeviceError>;
    /// `values`, copied to the device.
    fn upload(&self, values: &[f32]) -> Result<Self::Tensor, DeviceError>;
    /// `ids`, copied to the device.
    fn upload_ids(&self, ids: &[u32]) -> Result<Self::Ids, DeviceError>;
    /// The values of `t` (runs what is recorded first).
    fn read(&self, t: &Self::Tensor) -> Result<Vec<f32>, DeviceError>;
    /// The ids of `t` (runs what is recorded first).
    fn read_ids(&self, t: &Self::Ids) -> Result<Vec<u32>, DeviceError>;
    /// `parts` (one `d_in` each) as one weight, their rows one after another: a product then
    /// writes part `i`'s outputs in the columns after those of the parts before it.
    /// `what` names the weight in errors.
    fn weight(&self, what: &str, parts: &[WeightSource<'_>]) -> Result<Self::Weight, DeviceError>;
    /// Empty KV blocks of `shape`.
    fn kv_blocks(&self, shape: KvShape) -> Result<Self::Kv, DeviceError>;
    /// The rotary frequencies `θᵢ = base^(−2i/d_head) / fᵢ` and the factor of `rope`; `None`:
    /// no rotation (a layer without rotary positions: keys and values stored as they are).
    fn rope_table(
        &self,
        rope: Option<Rope>,
        freq_factors: &[f64],
        d_head: usize,
    ) -> Result<Self::Rope, DeviceError>;

    // ---- the step's operations ----

    /// `out [ids, d_in] = table[ids]` (rows decoded from the table's format).
    fn gather(
        &self,
        out: &mut Self::Tensor,
        ids: &Self::Ids,
        table: &Self::Weight,
    ) -> Result<(), DeviceError>;
    /// `y = a + b`, element by element.
    fn add(&self, y: &mut Self::Tensor, a: &Self::Tensor, b: &Self::Tensor) -> Result<(), DeviceError>;
    /// `y[r, :] += b` for every row of `y [rows, b.len()]` (a linear layer's bias).
    fn add_bias(&self, y: &mut Self::Tensor, b: &Self::Tensor) -> Result<(), DeviceError>;
    /// `x ← s · x` (the token embedding's factor).
    fn scale(&self, x: &mut Self::Tensor, s: f32) -> Result<(), DeviceError>;
    /// `y [rows, d_out] = x [rows, d_in] · Wᵀ`.
    fn product(
        &self,
        y: &mut Self::Tensor,
        x: &Self::Tensor,
        rows: usize,
        w: &Self::Weight,
    ) -> Result<(), DeviceError>;
    /// `y [rows, d_ff] = act(x W_gateᵀ) ⊙ x W_upᵀ` for `gate_up = [W_gate; W_up]`.
    fn glu_product(
        &self,
        act: DeviceAct,
        y: &mut Self::Tensor,
        x: &Self::Tensor,
        rows: usize,
        gate_up: &Self::Weight,
    ) -> Result<(), DeviceError>;
    /// `x ← act(x)`.
    fn activate(&self, act: DeviceAct, x: &mut Self::Tensor) -> Result<(), DeviceError>;
    /// `y = norm(x)` per row.
    fn norm(
        &self,
        norm: NormOf<'_, Self>,
        x: &Self::Tensor,
        y: &mut Self::Tensor,
    ) -> Result<(), DeviceError>;
    /// `h ← h + x`, then `y = norm(h)`, per row.
    fn add_norm(
        &self,
        norm: NormOf<'_, Self>,
        h: &mut Self::Tensor,
        x: &Self::Tensor,
        y: &mut Self::Tensor,
    ) -> Result<(), DeviceError>;
    /// From `qkv [tokens, (n_heads + 2 n_kv) d_head]`: `q_out [tokens, n_heads d_head]` the
    /// rotated queries; the rotated keys and the values stored in their rows' block slots.
    fn rope_kv_write(
        &self,
        qkv: &Self::Tensor,
        q_out: &mut Self::Tensor,
        rows: &StepRows<'_, Self>,
        rope: &Self::Rope,
        n_heads: usize,
        kv: &mut Self::Kv,
    ) -> Result<(), DeviceError>;
    /// Stores `k`, `v` `[tokens, n_kv_heads · d_head]` (as they are: keys already rotated, or
    /// unrotated keys of a source) in their rows' block slots (`rows.seq`, `rows.pos`).
    fn kv_write(
        &self,
        k: &Self::Tensor,
        v: &Self::Tensor,
        rows: &StepRows<'_, Self>,
        kv: &mut Self::Kv,
    ) -> Result<(), DeviceError>;
    /// `o = softmax(S) V` for each token over the keys of its row it sees (`0 .. ctx[i]`, or
    /// the window's last keys), `S` the scores of `scores` (`q`, `o` `[tokens, n_heads,
    /// d_head]`).
    fn paged_attention(
        &self,
        q: &Self::Tensor,
        kv: &Self::Kv,
        rows: &StepRows<'_, Self>,
        o: &mut Self::Tensor,
        n_heads: usize,
        scores: AttnScores,
    ) -> Result<(), DeviceError>;
    /// The RMSNorm of each of the `n_q` query heads (gain `q_gain`) and `n_k` key heads
    /// (`k_gain`) of every row of `qkv [rows, width]`, in place (query/key norms).
    #[allow(clippy::too_many_arguments)]
    fn head_norm(
        &self,
        qkv: &mut Self::Tensor,
        width: usize,
        heads: (usize, usize),
        q_gain: &Self::Tensor,
        k_gain: &Self::Tensor,
        eps: f64,
    ) -> Result<(), DeviceError>;
    /// `x ← c · tanh(x / c)` (the logits' soft cap).
    fn softcap(&self, x: &mut Self::Tensor, c: f64) -> Result<(), DeviceError>;
    /// `dst [rows.len(), width] = src[rows]`.
    fn copy_rows(
        &self,
        dst: &mut Self::Tensor,
        src: &Self::Tensor,
        rows: &[usize],
        width: usize,
    ) -> Result<(), DeviceError>;
    /// `y = log softmax(x)` per row of `x [rows, n]`.
    fn log_softmax(&self, x: &Self::Tensor, y: &mut Self::Tensor, n: usize) -> Result<(), DeviceError>;
    /// `ids[r] = argmax_j x[r, j]` for `x [rows, n]` (the lowest index on ties).
    fn argmax(&self, x: &Self::Tensor, ids: &mut Self::Ids, n: usize) -> Result<(), DeviceError>;
}
