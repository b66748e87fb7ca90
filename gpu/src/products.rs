//! The weight products `y = x · Wᵀ` and the embedding lookup, for weights stored as f32, f16,
//! bf16 or one of ggml's block formats (the bytes of a GGUF file's tensor, uploaded as they
//! are and decoded in the shader).
//!
//! `y [rows, d_out] = x [rows, d_in] · Wᵀ`, that is `y[r, o] = Σ_k x[r, k] · W[o, k]`, with `x`
//! and `y` f32 row-major and `W [d_out, d_in]` row-major in its format: each row of `W` is
//! `d_in / block_values` blocks of `block_bytes` bytes, rows one after another with no
//! padding (so a row may start at any byte offset: a `Q4_0` row of one block is 18 bytes).
//! The layouts (little-endian; `f16` IEEE half precision; ggml's `ggml-common.h`, decoded as
//! its `dequantize_row_*` in `ggml-quants.c`):
//!
//! | format | values / block | bytes / block | layout | value `j` |
//! |---|---|---|---|---|
//! | `F32` | 1 | 4 | `f32` | the value |
//! | `F16` | 1 | 2 | `f16` | the value |
//! | `Bf16` | 1 | 2 | the top 16 bits of an `f32` | the value |
//! | `Q4_0` | 32 | 18 | `d: f16, qs: [u8; 16]` | `(q_j − 8) · d` |
//! | `Q4_1` | 32 | 20 | `d: f16, m: f16, qs: [u8; 16]` | `q_j · d + m` |
//! | `Q5_0` | 32 | 22 | `d: f16, qh: u32, qs: [u8; 16]` | `(q_j + 16 h_j − 16) · d` |
//! | `Q5_1` | 32 | 24 | `d: f16, m: f16, qh: u32, qs: [u8; 16]` | `(q_j + 16 h_j) · d + m` |
//! | `Q8_0` | 32 | 34 | `d: f16, qs: [i8; 32]` | `qs[j] · d` |
//! | `Q4K` | 256 | 144 | `d, dmin: f16, scales: [u8; 12], qs: [u8; 128]` | `d · sc_s · q_j − dmin · m_s` |
//! | `Q5K` | 256 | 176 | `d, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]` | `d · sc_s · (q_j + 16 h_j) − dmin · m_s` |
//! | `Q6K` | 256 | 210 | `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16` | `d · scales[j / 16] · (q_j − 32)` |
//!
//! In the 32-value blocks, `q_j` is the low nibble of `qs[j]` for `j < 16` and the high
//! nibble of `qs[j − 16]` otherwise; `h_j` is bit `j` of `qh`. `Q4K` and `Q5K` split the
//! super-block into 8 sub-blocks `s` of 32: sub-block `s` reads `qs[32⌊s/2⌋ ..][..32]`, low
//! nibbles for even `s`, high for odd; its 6-bit scale `sc_s` and minimum `m_s` are packed
//! in `scales` (for `s < 4` the low 6 bits of bytes `s` and `s + 4`; for `s ≥ 4` the nibbles
//! of byte `s + 4` under the top 2 bits of bytes `s − 4` and `s`); `Q5K`'s fifth bit of
//! element `l` of sub-block `s` is bit `s` of `qh[l]`. `Q6K` takes two halves of 128: in half
//! `n`, element `32t + l` (`t < 4`, `l < 32`) is the low (`t < 2`) or high nibble of
//! `ql[64n + 32(t mod 2) + l]` with bits `2t, 2t + 1` of `qh[32n + l]` above it.
//!
//! The shaders read the weights as `array<u32>` and take bytes and halves out with shifts
//! (no 8- or 16-bit storage, no `shader-f16` needed). Every kernel walks a row in *units* of
//! 32 values (a block, a K-quant sub-block, or 32 floats, the last partial for floats) and
//! decodes 4 values at a time: each format's WGSL file (`src/shaders/products/`) says how.
//! Two kernel shapes: [`weight_product`] takes the matrix-vector kernel for up to
//! [`MATVEC_ROWS`] activation rows (decode: one workgroup per output, each weight byte read
//! once for all the rows, a tree sum in workgroup memory, no subgroup operations) and the
//! tiled matrix-matrix kernel above (prefill: 64 × 64 tiles of `y`, the `x` tile and the
//! decoded `W` tile in workgroup memory). [`gather_rows`] is the embedding lookup.
//!
//! Fewer dispatches per layer: [`StackedWeight`] (or [`GpuWeight::concat_rows`]) holds
//! matrices of one `d_in` stacked by rows, so [`stacked_product`] computes Q, K and V in one
//! dispatch into one `[rows, d_q + d_k + d_v]` buffer (one per run of a format when they
//! differ); [`glu_product`] fuses the gated unit into the gate‖up product's output,
//! `y = act(x · W_gateᵀ) ⊙ (x · W_upᵀ)`.

mod kernels;
#[cfg(test)]
pub(crate) mod reference;
mod stacked;
#[cfg(test)]
mod tests;

use crate::activations::{act_kind, Activation};
use crate::buffer::GpuBuffer;
use crate::device::Gpu;
use crate::error::GpuError;

pub use stacked::{gather_stacked, glu_product, stacked_product, StackedWeight};

/// Up to this many activation rows, [`weight_product`] runs the matrix-vector kernel; above,
/// the tiled matrix-matrix kernel.
pub const MATVEC_ROWS: usize = 8;

/// How a weight matrix is stored: see the module's table.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    F32,
    F16,
    Bf16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
}

impl WeightFormat {
    /// Every format.
    pub const ALL: [WeightFormat; 11] = [
        WeightFormat::F32,
        WeightFormat::F16,
        WeightFormat::Bf16,
        WeightFormat::Q4_0,
        WeightFormat::Q4_1,
        WeightFormat::Q5_0,
        WeightFormat::Q5_1,
        WeightFormat::Q8_0,
        WeightFormat::Q4K,
        WeightFormat::Q5K,
        WeightFormat::Q6K,
    ];

    /// Values per block (a row's length is a multiple of it).
    pub fn block_values(self) -> usize {
        match self {
            WeightFormat::F32 | WeightFormat::F16 | WeightFormat::Bf16 => 1,
            WeightFormat::Q4_0
            | WeightFormat::Q4_1
            | WeightFormat::Q5_0
            | WeightFormat::Q5_1
            | WeightFormat::Q8_0 => 32,
            WeightFormat::Q4K | WeightFormat::Q5K | WeightFormat::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            WeightFormat::F32 => 4,
            WeightFormat::F16 | WeightFormat::Bf16 => 2,
            WeightFormat::Q4_0 => 18,
            WeightFormat::Q4_1 => 20,
            WeightFormat::Q5_0 => 22,
            WeightFormat::Q5_1 => 24,
            WeightFormat::Q8_0 => 34,
            WeightFormat::Q4K => 144,
            WeightFormat::Q5K => 176,
            WeightFormat::Q6K => 210,
        }
    }

    /// Bytes of one row of `d_in` values (a multiple of [`Self::block_values`]).
    pub fn row_bytes(self, d_in: usize) -> usize {
        d_in / self.block_values() * self.block_bytes()
    }

    /// ggml's name of the format (`Q4_K`, `BF16`).
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::F32 => "F32",
            WeightFormat::F16 => "F16",
            WeightFormat::Bf16 => "BF16",
            WeightFormat::Q4_0 => "Q4_0",
            WeightFormat::Q4_1 => "Q4_1",
            WeightFormat::Q5_0 => "Q5_0",
            WeightFormat::Q5_1 => "Q5_1",
            WeightFormat::Q8_0 => "Q8_0",
            WeightFormat::Q4K => "Q4_K",
            WeightFormat::Q5K => "Q5_K",
            WeightFormat::Q6K => "Q6_K",
        }
    }
}

impl std::fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A weight matrix `W [d_out, d_in]` in device memory, its bytes as stored (see the module's
/// table), in 32-bit words (the last one padded with zeros).
#[derive(Debug)]
pub struct GpuWeight {
    format: WeightFormat,
    d_in: usize,
    d_out: usize,
    data: GpuBuffer<u32>,
}

impl GpuWeight {
    /// Uploads the `d_out` rows of `d_in` values stored in `bytes`, after checking that
    /// `d_in` is a positive multiple of the format's block and `bytes` exactly
    /// `d_out · row_bytes` long. The bytes go straight into the mapped device buffer.
    pub fn upload(
        gpu: &Gpu,
        format: WeightFormat,
        d_in: usize,
        d_out: usize,
        bytes: &[u8],
    ) -> Result<GpuWeight, GpuError> {
        let shape = |problem: String| GpuError::Shape {
            op: "weight upload",
            problem,
        };
        check_row_length(format, d_in, d_out)?;
        let row_bytes = format.row_bytes(d_in);
        let want = d_out.checked_mul(row_bytes);
        if want != Some(bytes.len()) {
            return Err(shape(format!(
                "a {format} matrix of {d_out} rows of {d_in} values is {d_out} × {row_bytes} \
                 bytes, not the {} given",
                bytes.len()
            )));
        }
        GpuWeight::concat_rows(gpu, format, d_in, &[bytes])
    }

    /// Uploads several matrices of one format and row length as one, their rows one after
    /// another (`[W_0; W_1; …]`, as Q‖K‖V or gate‖up), each part copied straight into the
    /// mapped device buffer: one product then computes all of them,
    /// `y[r, off_i + o] = Σ_k x[r, k] · W_i[o, k]`, `off_i` the rows of the parts before `i`.
    /// Each part must be whole rows of `format.row_bytes(d_in)` bytes. Matrices of different
    /// formats cannot share a buffer: [`StackedWeight`] groups them.
    pub fn concat_rows(
        gpu: &Gpu,
        format: WeightFormat,
        d_in: usize,
        parts: &[&[u8]],
    ) -> Result<GpuWeight, GpuError> {
        let row_bytes = format.row_bytes(d_in.max(1));
        let mut d_out = 0;
        for (i, p) in parts.iter().enumerate() {
            if row_bytes == 0 || p.is_empty() || !p.len().is_multiple_of(row_bytes) {
                return Err(GpuError::Shape {
                    op: "weight upload",
                    problem: format!(
                        "part {i} of {} bytes is not whole {format} rows of {d_in} values \
                         ({row_bytes} bytes each)",
                        p.len()
                    ),
                });
            }
            d_out += p.len() / row_bytes;
        }
        check_row_length(format, d_in, d_out)?;
        let total = d_out * row_bytes;
        // The shaders address the weights in bytes, in u32.
        if total > u32::MAX as usize {
            return Err(GpuError::TooLarge {
                what: format!("a {format} weight matrix (byte offsets are 32-bit)"),
                bytes: total as u64,
                limit: u64::from(u32::MAX),
            });
        }
        let what = format!("a {format} weight matrix [{d_out}, {d_in}]");
        Ok(GpuWeight {
            format,
            d_in,
            d_out,
            data: gpu.upload_parts(&what, parts)?,
        })
    }

    /// How it is stored.
    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// Values per row (the product's input width).
    pub fn d_in(&self) -> usize {
        self.d_in
    }

    /// Rows (the product's output width).
    pub fn d_out(&self) -> usize {
        self.d_out
    }

    /// The stored bytes, as 32-bit words.
    pub fn data(&self) -> &GpuBuffer<u32> {
        &self.data
    }

    /// The kernels' uniform parameters: rows (or ids), d_in, d_out, row bytes, units of 32
    /// per row, output tiles along d_out, then the output's row stride and the column of its
    /// first output (`y[r · y_stride + y_off + o]`).
    fn params(&self, rows: usize, tiles_n: usize, y_stride: usize, y_off: usize) -> Vec<u8> {
        [
            rows,
            self.d_in,
            self.d_out,
            self.format.row_bytes(self.d_in),
            self.d_in.div_ceil(32),
            tiles_n,
            y_stride,
            y_off,
        ]
        .iter()
        .flat_map(|&v| (v as u32).to_le_bytes())
        .collect()
    }
}

/// `d_in` a positive multiple of `format`'s block, `d_out` positive.
fn check_row_length(format: WeightFormat, d_in: usize, d_out: usize) -> Result<(), GpuError> {
    let block = format.block_values();
    if d_in == 0 || d_out == 0 || !d_in.is_multiple_of(block) {
        return Err(GpuError::Shape {
            op: "weight upload",
            problem: format!(
                "a {format} matrix of {d_out} rows of {d_in} values: both must be positive, \
                 and the row length a multiple of {block}"
            ),
        });
    }
    Ok(())
}

/// `n` must fit the shaders' 32-bit indices.
fn check_index(op: &'static str, what: &str, n: usize) -> Result<(), GpuError> {
    if n > u32::MAX as usize {
        return Err(GpuError::Shape {
            op,
            problem: format!("{what} ({n}) exceeds the 32-bit indices of the shaders"),
        });
    }
    Ok(())
}

/// Records `y [rows, d_out] = x [rows, d_in] · Wᵀ` (`y[r, o] = Σ_k x[r, k] · W[o, k]`), with
/// the matrix-vector kernel for up to [`MATVEC_ROWS`] rows and the tiled one above; checks
/// first that `x` holds `rows × d_in` values, `y` `rows × d_out`, and that they are not the
/// same buffer. Nothing is recorded for `rows = 0`.
pub fn weight_product(
    gpu: &Gpu,
    y: &GpuBuffer<f32>,
    x: &GpuBuffer<f32>,
    rows: usize,
    w: &GpuWeight,
) -> Result<(), GpuError> {
    const OP: &str = "weight product";
    let (d_in, d_out) = (w.d_in, w.d_out);
    if x.len() != rows * d_in || y.len() != rows * d_out {
        return Err(GpuError::Shape {
            op: OP,
            problem: format!(
                "x of {} values and y of {} for {rows} rows through a {} matrix of \
                 [{d_out}, {d_in}]: x needs {}, y {}",
                x.len(),
                y.len(),
                w.format,
                rows * d_in,
                rows * d_out
            ),
        });
    }
    if x.raw == y.raw {
        return Err(GpuError::Shape {
            op: OP,
            problem: "y must be another buffer than x".into(),
        });
    }
    check_index(OP, "x's length", x.len())?;
    check_index(OP, "y's length", y.len())?;
    record_product(gpu, y, x, rows, w, d_out, 0, Gate::None)
}

/// What the product's outputs are.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// `y[r, o] = (x · Wᵀ)[r, o]`.
    None,
    /// `W` is gate‖up: `y[r, j] = act((x · Wᵀ)[r, j]) · (x · Wᵀ)[r, d_ff + j]`.
    Glu(Activation),
}

/// Records one product into `y[r · y_stride + y_off + o]` (`o < d_out`, or `< d_out / 2`
/// gated); the caller checked the shapes.
#[allow(clippy::too_many_arguments)]
fn record_product(
    gpu: &Gpu,
    y: &GpuBuffer<f32>,
    x: &GpuBuffer<f32>,
    rows: usize,
    w: &GpuWeight,
    y_stride: usize,
    y_off: usize,
    gate: Gate,
) -> Result<(), GpuError> {
    const OP: &str = "weight product";
    if rows == 0 {
        return Ok(());
    }
    let k = kernels::of(w.format);
    let buffers = [&w.data.raw, &x.raw, &y.raw];
    let glu = match gate {
        Gate::None => 0.0,
        Gate::Glu(act) => f64::from(1 + act_kind(act)),
    };
    let constants = [("GLU", glu)];
    // Outputs per row: gated, each pairs a gate row with its up row.
    let outs = if gate == Gate::None {
        w.d_out
    } else {
        w.d_out / 2
    };
    if rows <= MATVEC_ROWS {
        gpu.record(
            k.matvec,
            &constants,
            &w.params(rows, 0, y_stride, y_off),
            &buffers,
            gpu.grid(outs as u32),
        );
    } else {
        // Gated, a tile's 64 columns are 32 gate rows and their 32 up rows.
        let tiles_n = if gate == Gate::None {
            outs.div_ceil(64)
        } else {
            outs.div_ceil(32)
        };
        let groups = rows.div_ceil(64) * tiles_n;
        check_index(OP, "the tiles", groups)?;
        gpu.record(
            k.matmul,
            &constants,
            &w.params(rows, tiles_n, y_stride, y_off),
            &buffers,
            gpu.grid(groups as u32),
        );
    }
    Ok(())
}

/// Records the embedding lookup `out[i, :] = W[ids[i], :]` (row `ids[i]` of `table`
/// decoded to f32), zeros for an id `≥ d_out`. The ids are not looked at here (they may be
/// computed on the device); `out` must hold `ids × d_in` values.
pub fn gather_rows(
    gpu: &Gpu,
    out: &GpuBuffer<f32>,
    ids: &GpuBuffer<u32>,
    table: &GpuWeight,
) -> Result<(), GpuError> {
    const OP: &str = "gather rows";
    let n = ids.len();
    if out.len() != n * table.d_in {
        return Err(GpuError::Shape {
            op: OP,
            problem: format!(
                "out of {} values for {n} rows of {} values",
                out.len(),
                table.d_in
            ),
        });
    }
    if n == 0 {
        return Ok(());
    }
    gather_rows_at(gpu, out, ids, table, None)
}

/// [`gather_rows`] of a table that holds rows `first ..` of a larger one: `ids[i] − first`
/// within it is gathered, any other id leaves `out`'s row alone.
pub(crate) fn gather_rows_of(
    gpu: &Gpu,
    out: &GpuBuffer<f32>,
    ids: &GpuBuffer<u32>,
    table: &GpuWeight,
    first: usize,
) -> Result<(), GpuError> {
    if out.len() != ids.len() * table.d_in {
        return Err(GpuError::Shape {
            op: "gather rows",
            problem: format!(
                "out of {} values for {} rows of {}",
                out.len(),
                ids.len(),
                table.d_in
            ),
        });
    }
    gather_rows_at(gpu, out, ids, table, Some(first))
}

fn gather_rows_at(
    gpu: &Gpu,
    out: &GpuBuffer<f32>,
    ids: &GpuBuffer<u32>,
    table: &GpuWeight,
    first: Option<usize>,
) -> Result<(), GpuError> {
    let n = ids.len();
    if n == 0 {
        return Ok(());
    }
    let invocations = n * table.d_in.div_ceil(32) * 8;
    check_index("gather rows", "the invocations", invocations)?;
    check_index("gather rows", "the first row", first.unwrap_or(0))?;
    // tiles_n: 1 when rows outside the table are left alone; y_off: the table's first id.
    let (skip, at) = first.map_or((0, 0), |f| (1, f));
    gpu.record(
        kernels::of(table.format).gather,
        &[],
        &table.params(n, skip, table.d_in, at),
        &[&table.data.raw, &ids.raw, &out.raw],
        gpu.grid(invocations.div_ceil(256) as u32),
    );
    Ok(())
}
