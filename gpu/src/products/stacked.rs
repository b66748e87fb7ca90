//! Several weight matrices of one row length behind one product: Q‖K‖V, gate‖up.

use super::{check_index, record_product, Gate, GpuWeight, WeightFormat};
use crate::activations::Activation;
use crate::buffer::GpuBuffer;
use crate::device::Gpu;
use crate::error::GpuError;

/// Matrices `W_0, W_1, …` of one row length `d_in` stacked by rows, `W = [W_0; W_1; …]`, so
/// that [`stacked_product`] writes `y = x · Wᵀ`: part `i` in columns `offset(i) ..
/// offset(i) + rows(i)` of each output row.
///
/// Consecutive parts of one format share one device buffer and one dispatch
/// ([`GpuWeight::concat_rows`]). A part of another format starts a new buffer: Q4_K_M files
/// store V (and some `ffn_down`) in Q6_K beside Q/K in Q4_K, and then Q‖K‖V takes two
/// dispatches (Q‖K, then V) into the same output buffer — never a wrong result, one more
/// dispatch. [`StackedWeight::dispatches`] says how many.
#[derive(Debug)]
pub struct StackedWeight {
    /// Each run of same-format parts as one matrix, with its first output column.
    runs: Vec<(GpuWeight, usize)>,
    /// Each part's format, first column and rows.
    parts: Vec<(WeightFormat, usize, usize)>,
    d_in: usize,
    d_out: usize,
}

impl StackedWeight {
    /// Uploads `parts` (`(format, rows, bytes)`, each `rows` rows of `d_in` values, as
    /// [`GpuWeight::upload`] takes them), runs of one format into one buffer each.
    pub fn upload(
        gpu: &Gpu,
        d_in: usize,
        parts: &[(WeightFormat, usize, &[u8])],
    ) -> Result<StackedWeight, GpuError> {
        if parts.is_empty() {
            return Err(GpuError::Shape {
                op: "weight upload",
                problem: "a stack of no matrices".into(),
            });
        }
        let mut layout = Vec::new();
        let mut col = 0;
        // Pieces of at most one buffer's bytes: a part larger than a binding allows is cut
        // into runs of whole rows (an embedding table of 128k rows on a 128 MiB adapter).
        let limit = gpu.buffer_limit().saturating_sub(4).max(1) as usize;
        let mut pieces: Vec<(WeightFormat, &[u8])> = Vec::new();
        for (j, &(format, rows, b)) in parts.iter().enumerate() {
            let row_bytes = format.row_bytes(d_in);
            if Some(b.len()) != rows.checked_mul(row_bytes) || rows == 0 {
                return Err(GpuError::Shape {
                    op: "weight upload",
                    problem: format!(
                        "part {j}: a {format} matrix of {rows} rows of {d_in} values is not \
                         the {} bytes given (or has no rows)",
                        b.len()
                    ),
                });
            }
            layout.push((format, col, rows));
            col += rows;
            let per_piece = (limit / row_bytes.max(1)).max(1) * row_bytes;
            pieces.extend(b.chunks(per_piece).map(|c| (format, c)));
        }
        // Consecutive pieces of one format share a buffer while it stays within the limit.
        let mut runs = Vec::new();
        let mut row = 0;
        let mut i = 0;
        while i < pieces.len() {
            let format = pieces[i].0;
            let mut bytes: Vec<&[u8]> = vec![pieces[i].1];
            let mut total = pieces[i].1.len();
            let mut j = i + 1;
            while j < pieces.len() && pieces[j].0 == format && total + pieces[j].1.len() <= limit {
                total += pieces[j].1.len();
                bytes.push(pieces[j].1);
                j += 1;
            }
            let w = GpuWeight::concat_rows(gpu, format, d_in, &bytes)?;
            let rows = w.d_out;
            runs.push((w, row));
            row += rows;
            i = j;
        }
        Ok(StackedWeight {
            runs,
            parts: layout,
            d_in,
            d_out: row,
        })
    }

    /// Values per row (the product's input width).
    pub fn d_in(&self) -> usize {
        self.d_in
    }

    /// Rows of all the parts: the product's output width.
    pub fn d_out(&self) -> usize {
        self.d_out
    }

    /// The parts.
    pub fn len(&self) -> usize {
        self.parts.len()
    }

    /// Never: a stack has at least one part.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// Where part `i`'s outputs start in each output row.
    pub fn offset(&self, i: usize) -> usize {
        self.parts[i].1
    }

    /// Part `i`'s rows (its outputs per row).
    pub fn rows(&self, i: usize) -> usize {
        self.parts[i].2
    }

    /// Part `i`'s format.
    pub fn format(&self, i: usize) -> WeightFormat {
        self.parts[i].0
    }

    /// The dispatches of one product: one per run of same-format parts.
    pub fn dispatches(&self) -> usize {
        self.runs.len()
    }

    /// The single matrix holding every part, when all share one format.
    pub fn single(&self) -> Option<&GpuWeight> {
        match self.runs.as_slice() {
            [(w, _)] => Some(w),
            _ => None,
        }
    }
}

/// Records the embedding lookup `out[i, :] = W[ids[i], :]` from a stacked table: each run
/// gathers the ids among its rows (a run of rows `first ..` reads `ids[i] − first`) and leaves
/// the others alone; an id past every run leaves its row as it was (zeros in a fresh buffer).
pub fn gather_stacked(
    gpu: &Gpu,
    out: &GpuBuffer<f32>,
    ids: &GpuBuffer<u32>,
    table: &StackedWeight,
) -> Result<(), GpuError> {
    if let Some(w) = table.single() {
        return super::gather_rows(gpu, out, ids, w);
    }
    for (run, first) in &table.runs {
        super::gather_rows_of(gpu, out, ids, run, *first)?;
    }
    Ok(())
}

/// Records `y [rows, d_out] = x [rows, d_in] · Wᵀ` for the stacked `W` (part `i` of each
/// output row in columns `w.offset(i) ..`): [`StackedWeight::dispatches`] dispatches, the
/// matrix-vector kernel up to [`super::MATVEC_ROWS`] rows, tiled above.
pub fn stacked_product(
    gpu: &Gpu,
    y: &GpuBuffer<f32>,
    x: &GpuBuffer<f32>,
    rows: usize,
    w: &StackedWeight,
) -> Result<(), GpuError> {
    const OP: &str = "stacked product";
    check_io(OP, y, x, rows, w.d_in, w.d_out)?;
    for (run, off) in &w.runs {
        record_product(gpu, y, x, rows, run, w.d_out, *off, Gate::None)?;
    }
    Ok(())
}

/// Records a gated feed-forward input in one dispatch, the activation fused into the gate‖up
/// product's output: for `gate_up = [W_gate; W_up]` (`2·d_ff` rows, gate rows first, as
/// [`GpuWeight::concat_rows`] stacks them),
///
/// `y[r, j] = act(Σ_k x[r, k] · W_gate[j, k]) · Σ_k x[r, k] · W_up[j, k]`, `j < d_ff`,
///
/// SwiGLU for [`Activation::Silu`]. Each workgroup computes both dot products of its `j` (the
/// matrix-vector kernel: rows `j` and `d_ff + j`; the tiled one: 32 gate and their 32 up rows
/// per 64-column tile) and writes only `y`, so neither the `[rows, 2·d_ff]` product nor a
/// separate activation dispatch exists. The sums are those of [`super::weight_product`] of
/// `gate_up`, in the same order, followed by [`crate::activations::glu`]'s arithmetic.
/// Gate and up of different formats cannot share `gate_up`: then use [`stacked_product`]
/// into a `[rows, 2·d_ff]` buffer and [`crate::activations::glu`] with its fused input.
pub fn glu_product(
    gpu: &Gpu,
    act: Activation,
    y: &GpuBuffer<f32>,
    x: &GpuBuffer<f32>,
    rows: usize,
    gate_up: &GpuWeight,
) -> Result<(), GpuError> {
    const OP: &str = "glu product";
    if !gate_up.d_out.is_multiple_of(2) {
        return Err(GpuError::Shape {
            op: OP,
            problem: format!(
                "a gate-up matrix of {} rows (gate rows, then as many up rows)",
                gate_up.d_out
            ),
        });
    }
    let d_ff = gate_up.d_out / 2;
    check_io(OP, y, x, rows, gate_up.d_in, d_ff)?;
    record_product(gpu, y, x, rows, gate_up, d_ff, 0, Gate::Glu(act))
}

/// `x` `[rows, d_in]`, `y` `[rows, d_out]`, distinct, within 32-bit indices.
fn check_io(
    op: &'static str,
    y: &GpuBuffer<f32>,
    x: &GpuBuffer<f32>,
    rows: usize,
    d_in: usize,
    d_out: usize,
) -> Result<(), GpuError> {
    if x.len() != rows * d_in || y.len() != rows * d_out {
        return Err(GpuError::Shape {
            op,
            problem: format!(
                "x of {} values and y of {} for {rows} rows of {d_in} in, {d_out} out",
                x.len(),
                y.len()
            ),
        });
    }
    if x.raw == y.raw {
        return Err(GpuError::Shape {
            op,
            problem: "y must be another buffer than x".into(),
        });
    }
    check_index(op, "x's length", x.len())?;
    check_index(op, "y's length", y.len())
}
