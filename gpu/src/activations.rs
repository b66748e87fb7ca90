//! Activation functions of the feed-forward block, element-wise on f32:
//!
//! - in place, `x ← act(x)` ([`activate`]): SiLU `x·σ(x)`, GELU (tanh approximation
//!   `½x(1 + tanh(√(2/π)(x + 0.044715x³)))` or exact `x·Φ(x) = ½x·erfc(−x/√2)`), ReLU;
//! - gated ([`glu`]): `y = act(gate) · up` on `[rows, d_ff]` — SwiGLU (SiLU), GeGLU (either
//!   GELU), ReGLU — with gate and up as two buffers or as one fused `[rows, 2·d_ff]` buffer
//!   (gate in the first half of each row, as `gate_up_proj` checkpoints store it).
//!
//! WGSL has no `erf`: the exact GELU uses an `erfc` fit with fractional error below 1.2e-7
//! (Numerical Recipes' Chebyshev form), so `erf` is within about 1e-7 and the GELU keeps its
//! relative accuracy in the negative tail.

use crate::buffer::GpuBuffer;
use crate::device::Gpu;
use crate::dispatch::Kernel;
use crate::error::GpuError;

const ACT: Kernel = Kernel {
    name: "act",
    source: concat!(
        include_str!("shaders/act_fns.wgsl"),
        include_str!("shaders/act.wgsl")
    ),
};

const GLU: Kernel = Kernel {
    name: "glu",
    source: concat!(
        include_str!("shaders/act_fns.wgsl"),
        include_str!("shaders/glu.wgsl")
    ),
};

/// An activation function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x · σ(x)` (SwiGLU's gate).
    Silu,
    /// `½x(1 + tanh(√(2/π)(x + 0.044715x³)))` (GPT-2's `gelu_new`, Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
    /// `x · Φ(x) = ½x(1 + erf(x/√2))` (BERT's `gelu`).
    GeluErf,
    /// `max(x, 0)`.
    Relu,
}

impl Activation {
    fn kind(self) -> u32 {
        match self {
            Activation::Silu => 0,
            Activation::GeluTanh => 1,
            Activation::GeluErf => 2,
            Activation::Relu => 3,
        }
    }
}

/// The kernels' code of `act` (`activate(kind, x)` in `act_fns.wgsl`).
pub(crate) fn act_kind(act: Activation) -> u32 {
    act.kind()
}

/// Where a gated unit's two inputs are.
#[derive(Clone, Copy, Debug)]
pub enum GluInput<'a> {
    /// `gate` and `up`, each `[rows, d_ff]`.
    Split {
        gate: &'a GpuBuffer<f32>,
        up: &'a GpuBuffer<f32>,
    },
    /// One `[rows, 2·d_ff]` buffer: each row's gate, then its up.
    Fused(&'a GpuBuffer<f32>),
}

fn elements(op: &'static str, n: usize) -> Result<u32, GpuError> {
    u32::try_from(n).map_err(|_| GpuError::Shape {
        op,
        problem: format!("{n} elements exceed u32"),
    })
}

/// Records `x ← act(x)` on every element of `x`.
pub fn activate(gpu: &Gpu, x: &GpuBuffer<f32>, act: Activation) -> Result<(), GpuError> {
    let n = elements("activate", x.len())?;
    if n == 0 {
        return Ok(());
    }
    let words = [n, act.kind()];
    gpu.record(
        ACT,
        &[],
        bytemuck::cast_slice(&words),
        &[&x.raw],
        gpu.grid(n.div_ceil(256)),
    );
    Ok(())
}

/// Records `y = act(gate) · up` for `y` `[rows, d_ff]`.
pub fn glu(
    gpu: &Gpu,
    act: Activation,
    input: GluInput<'_>,
    y: &GpuBuffer<f32>,
    d_ff: usize,
) -> Result<(), GpuError> {
    let shape = |problem: String| Err(GpuError::Shape { op: "glu", problem });
    if d_ff == 0 || !y.len().is_multiple_of(d_ff) {
        return shape(format!(
            "an output of {} is not rows of d_ff = {d_ff}",
            y.len()
        ));
    }
    let (gate, up, fused) = match input {
        GluInput::Split { gate, up } => {
            if gate.len() != y.len() || up.len() != y.len() {
                return shape(format!(
                    "gate {} and up {} for an output of {}",
                    gate.len(),
                    up.len(),
                    y.len()
                ));
            }
            (gate, up, 0u32)
        }
        GluInput::Fused(gu) => {
            if gu.len() != 2 * y.len() {
                return shape(format!(
                    "a fused gate-up of {} for an output of {} (needs twice)",
                    gu.len(),
                    y.len()
                ));
            }
            (gu, gu, 1)
        }
    };
    let n = elements("glu", y.len())?;
    if n == 0 {
        return Ok(());
    }
    let words = [n, d_ff as u32, act.kind(), fused];
    gpu.record(
        GLU,
        &[],
        bytemuck::cast_slice(&words),
        &[&gate.raw, &up.raw, &y.raw],
        gpu.grid(n.div_ceil(256)),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_close, gpu, rand_vec};

    const ALL: [Activation; 4] = [
        Activation::Silu,
        Activation::GeluTanh,
        Activation::GeluErf,
        Activation::Relu,
    ];

    fn act_ref(act: Activation, x: f64) -> f64 {
        match act {
            Activation::Silu => x / (1.0 + (-x).exp()),
            Activation::GeluTanh => {
                let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
                0.5 * x * (1.0 + u.tanh())
            }
            Activation::GeluErf => 0.5 * x * libm::erfc(-x / std::f64::consts::SQRT_2),
            Activation::Relu => x.max(0.0),
        }
    }

    /// Values over [−8, 8), plus the far tails and zero.
    fn inputs(n: usize, seed: u64) -> Vec<f32> {
        let mut x: Vec<f32> = rand_vec(n, seed).iter().map(|v| v * 8.0).collect();
        for (i, v) in [0.0f32, -30.0, 30.0, -1e-3, 1e-3].into_iter().enumerate() {
            if i < n {
                x[i] = v;
            }
        }
        x
    }

    #[test]
    fn activations_in_place_match_f64() {
        let Some(gpu) = gpu() else { return };
        for n in [1usize, 7, 255, 257, 10_007] {
            for act in ALL {
                let x = inputs(n, n as u64);
                let dx = gpu.upload(&x).unwrap();
                activate(gpu, &dx, act).unwrap();
                let want: Vec<f64> = x.iter().map(|&v| act_ref(act, v as f64)).collect();
                let what = format!("{act:?} n {n}");
                assert_close(&gpu.read(&dx).unwrap(), &want, 1e-5, 1e-12, &what);
            }
        }
    }

    #[test]
    fn glu_split_and_fused_match_f64() {
        let Some(gpu) = gpu() else { return };
        for (rows, d_ff) in [(1usize, 1usize), (3, 7), (1, 300), (5, 257), (2, 5000)] {
            let n = rows * d_ff;
            let gate = inputs(n, 20);
            let up = rand_vec(n, 21);
            let mut fused = Vec::with_capacity(2 * n);
            for r in 0..rows {
                fused.extend_from_slice(&gate[r * d_ff..(r + 1) * d_ff]);
                fused.extend_from_slice(&up[r * d_ff..(r + 1) * d_ff]);
            }
            let (dg, du, df) = (
                gpu.upload(&gate).unwrap(),
                gpu.upload(&up).unwrap(),
                gpu.upload(&fused).unwrap(),
            );
            for act in ALL {
                let want: Vec<f64> = gate
                    .iter()
                    .zip(&up)
                    .map(|(&g, &u)| act_ref(act, g as f64) * u as f64)
                    .collect();
                let inputs = [GluInput::Split { gate: &dg, up: &du }, GluInput::Fused(&df)];
                for input in inputs {
                    let dy = gpu.zeros::<f32>(n).unwrap();
                    glu(gpu, act, input, &dy, d_ff).unwrap();
                    let what = format!("{act:?} {rows}x{d_ff} {input:?}");
                    assert_close(&gpu.read(&dy).unwrap(), &want, 1e-5, 1e-12, &what);
                }
            }
        }
    }

    #[test]
    fn erf_is_within_about_1e7() {
        // The exact GELU through erf: Φ(x) = gelu(x) / x, so erf(z) = 2·gelu(√2 z)/(√2 z) − 1.
        let Some(gpu) = gpu() else { return };
        let z: Vec<f32> = (1..=400).map(|i| i as f32 / 100.0).collect();
        let x: Vec<f32> = z.iter().map(|z| z * std::f32::consts::SQRT_2).collect();
        let dx = gpu.upload(&x).unwrap();
        activate(gpu, &dx, Activation::GeluErf).unwrap();
        let y = gpu.read(&dx).unwrap();
        for i in 0..z.len() {
            let phi = y[i] as f64 / x[i] as f64;
            let err = (phi - 0.5 * libm::erfc(-(x[i] as f64) / std::f64::consts::SQRT_2)).abs();
            assert!(err < 2e-7, "Φ at {} off by {err:e}", x[i]);
        }
    }

    #[test]
    fn glu_shape_errors() {
        let Some(gpu) = gpu() else { return };
        let a = gpu.zeros::<f32>(12).unwrap();
        let y = gpu.zeros::<f32>(12).unwrap();
        let e = glu(gpu, Activation::Silu, GluInput::Fused(&a), &y, 4).unwrap_err();
        assert!(e.to_string().contains("needs twice"), "{e}");
        let e = glu(gpu, Activation::Silu, GluInput::Fused(&a), &y, 5).unwrap_err();
        assert!(e.to_string().contains("not rows of d_ff = 5"), "{e}");
    }
}
