//! Row softmax, log-softmax and greedy argmax over `x` `[rows, n]` (row-major f32), one
//! workgroup per row with tree reductions:
//!
//! - softmax `y_j = exp(x_j − m) / Σ_k exp(x_k − m)` and log-softmax
//!   `y_j = x_j − m − log Σ_k exp(x_k − m)`, with `m = max_k x_k` so nothing overflows; rows
//!   longer than [`SOFTMAX_CHUNK`] are split into chunks whose maxima `m_c` and sums `l_c` are
//!   computed in parallel and merged as `m = max m_c`, `Σ = Σ_c l_c exp(m_c − m)`;
//! - [`argmax`]: `ids[r] = argmax_j x[r, j]` as `u32`, the lowest index on ties (as the CPU's
//!   greedy pick), so a greedy decode step reads back 4 bytes per sequence, not the logits;
//!   rows longer than [`ARGMAX_CHUNK`] are scanned in chunks by parallel workgroups, then the
//!   chunks' maxima merged.
//!   Rows holding NaN give an unspecified index.

use crate::buffer::GpuBuffer;
use crate::device::Gpu;
use crate::dispatch::Kernel;
use crate::error::GpuError;

const SOFTMAX: Kernel = Kernel {
    name: "softmax",
    source: concat!(
        include_str!("shaders/reduce.wgsl"),
        include_str!("shaders/softmax.wgsl")
    ),
};

const SOFTMAX_PARTIAL: Kernel = Kernel {
    name: "softmax_partial",
    source: concat!(
        include_str!("shaders/reduce.wgsl"),
        include_str!("shaders/softmax_partial.wgsl")
    ),
};

const SOFTMAX_WRITE: Kernel = Kernel {
    name: "softmax_write",
    source: include_str!("shaders/softmax_write.wgsl"),
};

/// The entries one workgroup of [`softmax`] and [`log_softmax`] covers: longer rows are
/// split into chunks whose max and sum are computed in parallel, then merged by every chunk's
/// writer.
pub const SOFTMAX_CHUNK: usize = 4096;

const ARGMAX: Kernel = Kernel {
    name: "argmax",
    source: include_str!("shaders/argmax.wgsl"),
};

const ARGMAX_MERGE: Kernel = Kernel {
    name: "argmax_merge",
    source: include_str!("shaders/argmax_merge.wgsl"),
};

/// The entries one workgroup of [`argmax`] scans: longer rows (vocabularies) are split into
/// chunks scanned in parallel, then merged.
pub const ARGMAX_CHUNK: usize = 4096;

fn rows_of(op: &'static str, len: usize, n: usize) -> Result<u32, GpuError> {
    if n == 0 || !len.is_multiple_of(n) {
        return Err(GpuError::Shape {
            op,
            problem: format!("{len} elements are not rows of n = {n}"),
        });
    }
    Ok((len / n) as u32)
}

fn softmax_rows(
    gpu: &Gpu,
    op: &'static str,
    x: &GpuBuffer<f32>,
    y: &GpuBuffer<f32>,
    n: usize,
    log: bool,
) -> Result<(), GpuError> {
    let rows = rows_of(op, x.len(), n)?;
    if y.len() != x.len() {
        return Err(GpuError::Shape {
            op,
            problem: format!("an output of {} for an input of {}", y.len(), x.len()),
        });
    }
    let chunks = n.div_ceil(SOFTMAX_CHUNK);
    if chunks == 1 {
        let words = [rows, n as u32, log as u32];
        gpu.record(
            SOFTMAX,
            &[],
            bytemuck::cast_slice(&words),
            &[&x.raw, &y.raw],
            gpu.grid(rows),
        );
        return Ok(());
    }
    let part = gpu.zeros::<f32>(2 * rows as usize * chunks)?;
    let words = [
        rows,
        n as u32,
        SOFTMAX_CHUNK as u32,
        chunks as u32,
        log as u32,
    ];
    let grid = gpu.grid(rows * chunks as u32);
    let params: &[u8] = bytemuck::cast_slice(&words);
    gpu.record(SOFTMAX_PARTIAL, &[], params, &[&x.raw, &part.raw], grid);
    gpu.record(
        SOFTMAX_WRITE,
        &[],
        params,
        &[&x.raw, &part.raw, &y.raw],
        grid,
    );
    Ok(())
}

/// Records `y = softmax(x)` per row of `x` `[rows, n]`.
pub fn softmax(
    gpu: &Gpu,
    x: &GpuBuffer<f32>,
    y: &GpuBuffer<f32>,
    n: usize,
) -> Result<(), GpuError> {
    softmax_rows(gpu, "softmax", x, y, n, false)
}

/// Records `y = log softmax(x)` per row of `x` `[rows, n]`.
pub fn log_softmax(
    gpu: &Gpu,
    x: &GpuBuffer<f32>,
    y: &GpuBuffer<f32>,
    n: usize,
) -> Result<(), GpuError> {
    softmax_rows(gpu, "log_softmax", x, y, n, true)
}

/// Records `ids[r] = argmax_j x[r, j]` for `x` `[rows, n]`, `ids` `[rows]` (lowest index on
/// ties).
pub fn argmax(
    gpu: &Gpu,
    x: &GpuBuffer<f32>,
    ids: &GpuBuffer<u32>,
    n: usize,
) -> Result<(), GpuError> {
    let rows = rows_of("argmax", x.len(), n)?;
    if ids.len() != rows as usize {
        return Err(GpuError::Shape {
            op: "argmax",
            problem: format!("{} ids for {rows} rows", ids.len()),
        });
    }
    let chunks = n.div_ceil(ARGMAX_CHUNK);
    // The chunks' maxima (unused when a row is one chunk: ids is bound in their place).
    let parts = (chunks > 1)
        .then(|| -> Result<_, GpuError> {
            let len = rows as usize * chunks;
            Ok((gpu.zeros::<f32>(len)?, gpu.zeros::<u32>(len)?))
        })
        .transpose()?;
    let (part_v, part_i) = match &parts {
        Some((v, i)) => (&v.raw, &i.raw),
        None => (&ids.raw, &ids.raw),
    };
    let words = [rows, n as u32, ARGMAX_CHUNK as u32, chunks as u32];
    gpu.record(
        ARGMAX,
        &[],
        bytemuck::cast_slice(&words),
        &[&x.raw, &ids.raw, part_v, part_i],
        gpu.grid(rows * chunks as u32),
    );
    if chunks > 1 {
        let words = [rows, chunks as u32];
        gpu.record(
            ARGMAX_MERGE,
            &[],
            bytemuck::cast_slice(&words),
            &[part_v, part_i, &ids.raw],
            gpu.grid(rows),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_close, gpu, rand_vec};

    const SHAPES: [(usize, usize); 7] = [
        (1, 1),
        (3, 7),
        (1, 256),
        (5, 257),
        (300, 9),
        (2, 50_000),
        (1, 151_936),
    ];

    fn softmax_ref(x: &[f32], n: usize, log: bool) -> Vec<f64> {
        let mut y = Vec::with_capacity(x.len());
        for row in x.chunks(n) {
            let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let s: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
            y.extend(row.iter().map(|&v| {
                if log {
                    v as f64 - m - s.ln()
                } else {
                    (v as f64 - m).exp() / s
                }
            }));
        }
        y
    }

    #[test]
    fn softmax_and_log_softmax_match_f64() {
        let Some(gpu) = gpu() else { return };
        for (rows, n) in SHAPES {
            // Logits of scale 20 (overflowing exp without the max), offset by 100.
            let x: Vec<f32> = rand_vec(rows * n, 30)
                .iter()
                .map(|v| v * 20.0 + 100.0)
                .collect();
            let dx = gpu.upload(&x).unwrap();
            let dy = gpu.zeros::<f32>(rows * n).unwrap();
            softmax(gpu, &dx, &dy, n).unwrap();
            let want = softmax_ref(&x, n, false);
            let what = format!("softmax {rows}x{n}");
            assert_close(&gpu.read(&dy).unwrap(), &want, 1e-5, 1e-30, &what);
            log_softmax(gpu, &dx, &dy, n).unwrap();
            let want = softmax_ref(&x, n, true);
            // x − m − log s: x (≈ 100) is known to f32 only, ulp 8e-6.
            let what = format!("log_softmax {rows}x{n}");
            assert_close(&gpu.read(&dy).unwrap(), &want, 1e-5, 2e-5, &what);
        }
    }

    #[test]
    fn masked_logits_get_zero_probability() {
        let Some(gpu) = gpu() else { return };
        let inf = f32::INFINITY;
        let x = [1.0f32, -inf, 2.0, -inf, -inf, -inf, -inf, 0.5];
        let dx = gpu.upload(&x).unwrap();
        let dy = gpu.zeros::<f32>(8).unwrap();
        softmax(gpu, &dx, &dy, 4).unwrap();
        let e2 = (-1.0f64).exp();
        let want = [
            e2 / (1.0 + e2),
            0.0,
            1.0 / (1.0 + e2),
            0.0,
            0.0,
            0.0,
            0.0,
            1.0,
        ];
        assert_close(&gpu.read(&dy).unwrap(), &want, 1e-6, 0.0, "masked softmax");
        let ids = gpu.zeros::<u32>(2).unwrap();
        argmax(gpu, &dx, &ids, 4).unwrap();
        assert_eq!(gpu.read(&ids).unwrap(), vec![2, 3]);
    }

    fn argmax_ref(row: &[f32]) -> u32 {
        let mut best = 0;
        for (i, &v) in row.iter().enumerate() {
            if v > row[best] {
                best = i;
            }
        }
        best as u32
    }

    #[test]
    fn argmax_matches_the_cpu_with_ties_to_the_lowest_index() {
        let Some(gpu) = gpu() else { return };
        for (rows, n) in SHAPES {
            // Few distinct values: many ties, across invocations' slices and chunks.
            let mut x: Vec<f32> = rand_vec(rows * n, 31)
                .iter()
                .map(|v| (v * 4.0).round())
                .collect();
            if n > 600 {
                // A tied maximum late in the last row, then earlier in it (in a later chunk
                // than the first of a long row).
                let last = (rows - 1) * n;
                let at = if n > 2 * ARGMAX_CHUNK {
                    [n - 1, 2 * ARGMAX_CHUNK + 5, ARGMAX_CHUNK + 1]
                } else {
                    [n - 1, 517, 300]
                };
                for j in at {
                    x[last + j] = 9.0;
                }
            }
            let dx = gpu.upload(&x).unwrap();
            let ids = gpu.zeros::<u32>(rows).unwrap();
            argmax(gpu, &dx, &ids, n).unwrap();
            let want: Vec<u32> = x.chunks(n).map(argmax_ref).collect();
            assert_eq!(gpu.read(&ids).unwrap(), want, "argmax {rows}x{n}");
        }
    }

    #[test]
    fn softmax_family_shape_errors() {
        let Some(gpu) = gpu() else { return };
        let x = gpu.zeros::<f32>(10).unwrap();
        let ids = gpu.zeros::<u32>(3).unwrap();
        let e = argmax(gpu, &x, &ids, 5).unwrap_err().to_string();
        assert!(e.contains("3 ids for 2 rows"), "{e}");
        let e = softmax(gpu, &x, &x, 3).unwrap_err().to_string();
        assert!(e.contains("10 elements are not rows of n = 3"), "{e}");
    }
}
