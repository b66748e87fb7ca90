//! Row norms of activations `[rows, d]` (row-major f32), one workgroup per row:
//!
//! - RMSNorm: `y = x / √(mean(x²) + ε) · (w + o)`, where the offset `o` is 0, or 1 for
//!   Gemma-style weights stored as `w − 1`;
//! - LayerNorm: `y = (x − μ) / √(σ² + ε) · g + b` (the bias optional), with `μ` and the
//!   (biased) variance `σ²` of the row, computed in two passes (no `E[x²] − μ²` cancellation);
//! - [`add_norm`]: the residual add fused with the next sublayer's norm, `h ← h + x; y = norm(h)`,
//!   as a decoder does before every sublayer.
//!
//! Sums are workgroup tree reductions in f32.

use crate::buffer::GpuBuffer;
use crate::device::Gpu;
use crate::dispatch::Kernel;
use crate::error::GpuError;

const NORM: Kernel = Kernel {
    name: "norm",
    source: concat!(
        include_str!("shaders/reduce.wgsl"),
        include_str!("shaders/norm.wgsl")
    ),
};

const ADD_NORM: Kernel = Kernel {
    name: "add_norm",
    source: concat!(
        include_str!("shaders/reduce.wgsl"),
        include_str!("shaders/add_norm.wgsl")
    ),
};

/// Which norm, with its parameters (each `[d]`, which sets the row width).
#[derive(Clone, Copy, Debug)]
pub enum Norm<'a> {
    /// `y = x / √(mean(x²) + eps) · (weight + offset)`; `offset` 1 for Gemma's stored `w − 1`.
    Rms {
        weight: &'a GpuBuffer<f32>,
        eps: f32,
        offset: f32,
    },
    /// `y = (x − mean) / √(var + eps) · gain + bias` (no `+ bias` without one, as in OLMo).
    Layer {
        gain: &'a GpuBuffer<f32>,
        bias: Option<&'a GpuBuffer<f32>>,
        eps: f32,
    },
}

impl Norm<'_> {
    /// The row width `d`.
    pub fn width(&self) -> usize {
        match self {
            Norm::Rms { weight, .. } => weight.len(),
            Norm::Layer { gain, .. } => gain.len(),
        }
    }

    fn check(&self, op: &'static str, len: usize) -> Result<(u32, u32), GpuError> {
        let d = self.width();
        let shape = |problem: String| Err(GpuError::Shape { op, problem });
        if d == 0 {
            return shape("an empty weight (d = 0)".into());
        }
        if let Norm::Layer {
            bias: Some(bias), ..
        } = self
        {
            if bias.len() != d {
                return shape(format!("a bias of {} for a gain of {d}", bias.len()));
            }
        }
        if !len.is_multiple_of(d) {
            return shape(format!("{len} activations are not rows of d = {d}"));
        }
        Ok(((len / d) as u32, d as u32))
    }

    /// The uniform parameters (rows, d, eps, layer, w_offset, bias) and the weight and bias
    /// buffers (the weight bound again as the unused bias when there is none).
    fn bind(&self, rows: u32, d: u32) -> (Vec<u8>, [&wgpu::Buffer; 2]) {
        let (eps, layer, offset, w, b) = match *self {
            Norm::Rms {
                weight,
                eps,
                offset,
            } => (eps, 0u32, offset, weight, None),
            Norm::Layer { gain, bias, eps } => (eps, 1, 0.0, gain, bias),
        };
        let words = [
            rows,
            d,
            eps.to_bits(),
            layer,
            offset.to_bits(),
            b.is_some() as u32,
        ];
        let b = b.unwrap_or(w);
        (bytemuck::cast_slice(&words).to_vec(), [&w.raw, &b.raw])
    }
}

const HEAD_NORM: Kernel = Kernel {
    name: "head_norm",
    source: include_str!("shaders/head_norm.wgsl"),
};

/// Records the RMSNorm of each query and key head inside the Q‖K‖V rows of `qkv`
/// `[rows, (n_q + n_k + n_v) · d]`, in place: the `n_q` query heads with `q_gain`, then the
/// `n_k` key heads with `k_gain` (each `[d]`); the value heads after them are left alone.
#[allow(clippy::too_many_arguments)]
pub fn head_norm(
    gpu: &Gpu,
    qkv: &GpuBuffer<f32>,
    width: usize,
    (n_q, n_k): (usize, usize),
    q_gain: &GpuBuffer<f32>,
    k_gain: &GpuBuffer<f32>,
    eps: f32,
) -> Result<(), GpuError> {
    let d = q_gain.len();
    let heads = n_q + n_k;
    if d == 0
        || k_gain.len() != d
        || width < heads * d
        || width == 0
        || !qkv.len().is_multiple_of(width)
    {
        return Err(GpuError::Shape {
            op: "head_norm",
            problem: format!(
                "{} values in rows of {width} for {n_q} + {n_k} heads of gains {} and {}",
                qkv.len(),
                q_gain.len(),
                k_gain.len()
            ),
        });
    }
    let total = qkv.len() / width * heads;
    let total = u32::try_from(total).map_err(|_| GpuError::Shape {
        op: "head_norm",
        problem: format!("{total} heads exceed u32"),
    })?;
    if total == 0 {
        return Ok(());
    }
    let words = [
        total,
        heads as u32,
        n_q as u32,
        width as u32,
        d as u32,
        eps.to_bits(),
    ];
    gpu.record(
        HEAD_NORM,
        &[],
        bytemuck::cast_slice(&words),
        &[&q_gain.raw, &k_gain.raw, &qkv.raw],
        gpu.grid(total.div_ceil(64)),
    );
    Ok(())
}

/// Records `y = norm(x)` for every row of `x` `[rows, d]` into `y` `[rows, d]`.
pub fn norm(
    gpu: &Gpu,
    norm: &Norm<'_>,
    x: &GpuBuffer<f32>,
    y: &GpuBuffer<f32>,
) -> Result<(), GpuError> {
    let (rows, d) = norm.check("norm", x.len())?;
    if y.len() != x.len() {
        return Err(GpuError::Shape {
            op: "norm",
            problem: format!("an output of {} for an input of {}", y.len(), x.len()),
        });
    }
    let (params, [w, b]) = norm.bind(rows, d);
    gpu.record(NORM, &[], &params, &[&x.raw, w, b, &y.raw], gpu.grid(rows));
    Ok(())
}

/// Records the residual add and the norm of its result, per row of `[rows, d]`:
/// `h ← h + x`, then `y = norm(h)`.
pub fn add_norm(
    gpu: &Gpu,
    norm: &Norm<'_>,
    h: &GpuBuffer<f32>,
    x: &GpuBuffer<f32>,
    y: &GpuBuffer<f32>,
) -> Result<(), GpuError> {
    let (rows, d) = norm.check("add_norm", h.len())?;
    if x.len() != h.len() || y.len() != h.len() {
        return Err(GpuError::Shape {
            op: "add_norm",
            problem: format!(
                "residual {}, sublayer output {} and norm output {} differ",
                h.len(),
                x.len(),
                y.len()
            ),
        });
    }
    let (params, [w, b]) = norm.bind(rows, d);
    gpu.record(
        ADD_NORM,
        &[],
        &params,
        &[&h.raw, &x.raw, w, b, &y.raw],
        gpu.grid(rows),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_close, gpu, rand_vec};

    /// (rows, d): one element, widths below, at and past the workgroup, a single row, rows
    /// fewer than the workgroup, a long row.
    const SHAPES: [(usize, usize); 7] = [
        (1, 1),
        (3, 7),
        (1, 256),
        (5, 257),
        (17, 100),
        (300, 33),
        (2, 5000),
    ];

    fn rms_ref(x: &[f32], w: &[f32], d: usize, eps: f64, offset: f64) -> Vec<f64> {
        let mut y = Vec::with_capacity(x.len());
        for row in x.chunks(d) {
            let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / d as f64;
            let inv = 1.0 / (ms + eps).sqrt();
            y.extend(
                row.iter()
                    .zip(w)
                    .map(|(&v, &w)| v as f64 * inv * (w as f64 + offset)),
            );
        }
        y
    }

    fn layer_ref(x: &[f32], g: &[f32], b: &[f32], d: usize, eps: f64) -> Vec<f64> {
        let mut y = Vec::with_capacity(x.len());
        for row in x.chunks(d) {
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
            let inv = 1.0 / (var + eps).sqrt();
            for i in 0..d {
                y.push((row[i] as f64 - mean) * inv * g[i] as f64 + b[i] as f64);
            }
        }
        y
    }

    #[test]
    fn rms_norm_matches_f64_with_and_without_the_offset() {
        let Some(gpu) = gpu() else { return };
        for (rows, d) in SHAPES {
            for offset in [0.0f32, 1.0] {
                let x: Vec<f32> = rand_vec(rows * d, 3).iter().map(|v| v * 3.0).collect();
                let w = rand_vec(d, 4);
                let (dx, dw) = (gpu.upload(&x).unwrap(), gpu.upload(&w).unwrap());
                let dy = gpu.zeros::<f32>(rows * d).unwrap();
                let n = Norm::Rms {
                    weight: &dw,
                    eps: 1e-6,
                    offset,
                };
                norm(gpu, &n, &dx, &dy).unwrap();
                let want = rms_ref(&x, &w, d, 1e-6f32 as f64, offset as f64);
                let what = format!("rms {rows}x{d} offset {offset}");
                assert_close(&gpu.read(&dy).unwrap(), &want, 1e-5, 1e-6, &what);
            }
        }
    }

    #[test]
    fn layer_norm_matches_f64_on_offset_rows() {
        let Some(gpu) = gpu() else { return };
        for (rows, d) in SHAPES {
            // A large mean: the variance must not come from E[x²] − μ².
            let x: Vec<f32> = rand_vec(rows * d, 5).iter().map(|v| v + 20.0).collect();
            let (g, b) = (rand_vec(d, 6), rand_vec(d, 7));
            let (dx, dg, db) = (
                gpu.upload(&x).unwrap(),
                gpu.upload(&g).unwrap(),
                gpu.upload(&b).unwrap(),
            );
            let dy = gpu.zeros::<f32>(rows * d).unwrap();
            for with_bias in [true, false] {
                let n = Norm::Layer {
                    gain: &dg,
                    bias: with_bias.then_some(&db),
                    eps: 1e-5,
                };
                norm(gpu, &n, &dx, &dy).unwrap();
                let zeros = vec![0.0; d];
                let bias = if with_bias { &b } else { &zeros };
                let want = layer_ref(&x, &g, bias, d, 1e-5f32 as f64);
                // x is known to f32 only (ulp 2e-6 at 20), which LayerNorm divides by σ ≈ 0.58.
                let what = format!("layer {rows}x{d} bias {with_bias}");
                assert_close(&gpu.read(&dy).unwrap(), &want, 1e-5, 1e-5, &what);
            }
        }
    }

    #[test]
    fn add_norm_updates_the_residual_and_norms_it() {
        let Some(gpu) = gpu() else { return };
        for (rows, d) in SHAPES {
            let h = rand_vec(rows * d, 8);
            let x = rand_vec(rows * d, 9);
            let (w, b) = (rand_vec(d, 10), rand_vec(d, 11));
            let sum: Vec<f32> = h.iter().zip(&x).map(|(a, b)| a + b).collect();
            let (dw, db) = (gpu.upload(&w).unwrap(), gpu.upload(&b).unwrap());
            let norms = [
                Norm::Rms {
                    weight: &dw,
                    eps: 1e-6,
                    offset: 1.0,
                },
                Norm::Layer {
                    gain: &dw,
                    bias: Some(&db),
                    eps: 1e-5,
                },
            ];
            for n in norms {
                let (dh, dx) = (gpu.upload(&h).unwrap(), gpu.upload(&x).unwrap());
                let dy = gpu.zeros::<f32>(rows * d).unwrap();
                add_norm(gpu, &n, &dh, &dx, &dy).unwrap();
                let want = match n {
                    Norm::Rms { .. } => rms_ref(&sum, &w, d, 1e-6f32 as f64, 1.0),
                    Norm::Layer { .. } => layer_ref(&sum, &w, &b, d, 1e-5f32 as f64),
                };
                assert_eq!(gpu.read(&dh).unwrap(), sum, "h {rows}x{d}");
                let what = format!("add_norm {rows}x{d} {n:?}");
                assert_close(&gpu.read(&dy).unwrap(), &want, 1e-5, 1e-6, &what);
            }
        }
    }

    #[test]
    fn zero_and_constant_rows_stay_finite() {
        // RMSNorm of zeros is 0 and LayerNorm of a constant row is its bias: ε alone keeps
        // the scale finite.
        let Some(gpu) = gpu() else { return };
        let d = 1000;
        let mut x = vec![0.0f32; d];
        x.extend(std::iter::repeat_n(3.0f32, d));
        let (w, b) = (rand_vec(d, 13), rand_vec(d, 14));
        let (dx, dw, db) = (
            gpu.upload(&x).unwrap(),
            gpu.upload(&w).unwrap(),
            gpu.upload(&b).unwrap(),
        );
        let dy = gpu.zeros::<f32>(2 * d).unwrap();
        let rms = Norm::Rms {
            weight: &dw,
            eps: 1e-6,
            offset: 0.0,
        };
        norm(gpu, &rms, &dx, &dy).unwrap();
        let y = gpu.read(&dy).unwrap();
        assert!(y[..d].iter().all(|&v| v == 0.0));
        let layer = Norm::Layer {
            gain: &dw,
            bias: Some(&db),
            eps: 1e-5,
        };
        norm(gpu, &layer, &dx, &dy).unwrap();
        let want: Vec<f64> = b.iter().chain(&b).map(|&v| v as f64).collect();
        assert_close(&gpu.read(&dy).unwrap(), &want, 0.0, 1e-6, "constant rows");
    }

    #[test]
    fn shape_errors_name_the_problem() {
        let Some(gpu) = gpu() else { return };
        let w = gpu.zeros::<f32>(4).unwrap();
        let b = gpu.zeros::<f32>(3).unwrap();
        let x = gpu.zeros::<f32>(10).unwrap();
        let y = gpu.zeros::<f32>(8).unwrap();
        let rms = Norm::Rms {
            weight: &w,
            eps: 1e-6,
            offset: 0.0,
        };
        let e = norm(gpu, &rms, &x, &y).unwrap_err().to_string();
        assert!(e.contains("10 activations are not rows of d = 4"), "{e}");
        let e = norm(gpu, &rms, &y, &x).unwrap_err().to_string();
        assert!(e.contains("an output of 10 for an input of 8"), "{e}");
        let layer = Norm::Layer {
            gain: &w,
            bias: Some(&b),
            eps: 1e-5,
        };
        let e = add_norm(gpu, &layer, &y, &y, &y).unwrap_err().to_string();
        assert!(e.contains("a bias of 3 for a gain of 4"), "{e}");
    }

    #[test]
    fn head_norms_normalise_query_and_key_heads_only() {
        let Some(gpu) = gpu() else { return };
        for (rows, n_q, n_k, n_v, d) in [
            (1usize, 2usize, 1usize, 1usize, 8usize),
            (5, 6, 2, 2, 64),
            (3, 4, 4, 4, 33),
        ] {
            let width = (n_q + n_k + n_v) * d;
            let x = rand_vec(rows * width, 31);
            let (gq, gk) = (rand_vec(d, 32), rand_vec(d, 33));
            let buf = gpu.upload(&x).unwrap();
            let (dq, dk) = (gpu.upload(&gq).unwrap(), gpu.upload(&gk).unwrap());
            head_norm(gpu, &buf, width, (n_q, n_k), &dq, &dk, 1e-6).unwrap();
            let got = gpu.read(&buf).unwrap();
            let mut want: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
            for r in 0..rows {
                for h in 0..n_q + n_k {
                    let seg = &mut want[r * width + h * d..][..d];
                    let ms = seg.iter().map(|v| v * v).sum::<f64>() / d as f64;
                    let inv = 1.0 / (ms + 1e-6).sqrt();
                    let g = if h < n_q { &gq } else { &gk };
                    for (v, &gc) in seg.iter_mut().zip(g) {
                        *v *= inv * f64::from(gc);
                    }
                }
            }
            assert_close(&got, &want, 1e-5, 1e-6, "head norm");
        }
        let buf = gpu.zeros::<f32>(10).unwrap();
        let g = gpu.zeros::<f32>(4).unwrap();
        assert!(head_norm(gpu, &buf, 10, (2, 1), &g, &g, 1e-6).is_err());
    }
}
