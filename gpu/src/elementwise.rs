//! Element-wise operations: `y = a + b` (the residual connection), and rows copied between
//! buffers (the positions of a step whose outputs are read).

use crate::buffer::GpuBuffer;
use crate::device::Gpu;
use crate::dispatch::Kernel;
use crate::error::GpuError;

const ADD: Kernel = Kernel {
    name: "add",
    source: include_str!("shaders/add.wgsl"),
};

const SCALE: Kernel = Kernel {
    name: "scale",
    source: include_str!("shaders/scale.wgsl"),
};

/// Records `x ← s · x`, element by element (f32 arithmetic: one rounding, as the host's).
pub fn scale(gpu: &Gpu, x: &GpuBuffer<f32>, s: f32) -> Result<(), GpuError> {
    let n = u32::try_from(x.len()).map_err(|_| GpuError::Shape {
        op: "scale",
        problem: format!("{} elements exceed u32", x.len()),
    })?;
    if n == 0 {
        return Ok(());
    }
    let words = [n, s.to_bits()];
    gpu.record(
        SCALE,
        &[],
        bytemuck::cast_slice(&words),
        &[&x.raw],
        gpu.grid(n.div_ceil(256)),
    );
    Ok(())
}

const ADD_BIAS: Kernel = Kernel {
    name: "add_bias",
    source: include_str!("shaders/add_bias.wgsl"),
};

/// Records `y[r, :] += b` for every row of `y` `[rows, b.len()]` (a linear layer's bias).
pub fn add_bias(gpu: &Gpu, y: &GpuBuffer<f32>, b: &GpuBuffer<f32>) -> Result<(), GpuError> {
    if b.is_empty() || !y.len().is_multiple_of(b.len()) || u32::try_from(y.len()).is_err() {
        return Err(GpuError::Shape {
            op: "add_bias",
            problem: format!("{} values are not rows of a bias of {}", y.len(), b.len()),
        });
    }
    if y.is_empty() {
        return Ok(());
    }
    let words = [y.len() as u32, b.len() as u32];
    gpu.record(
        ADD_BIAS,
        &[],
        bytemuck::cast_slice(&words),
        &[&b.raw, &y.raw],
        gpu.grid((y.len() as u32).div_ceil(256)),
    );
    Ok(())
}

const SOFTCAP: Kernel = Kernel {
    name: "softcap",
    source: include_str!("shaders/softcap.wgsl"),
};

/// Records `x ← c · tanh(x / c)`, element by element (the logits' soft cap, `c > 0`).
pub fn softcap(gpu: &Gpu, x: &GpuBuffer<f32>, c: f32) -> Result<(), GpuError> {
    let n = u32::try_from(x.len())
        .ok()
        .filter(|_| c > 0.0 && c.is_finite());
    let Some(n) = n else {
        return Err(GpuError::Shape {
            op: "softcap",
            problem: format!("a cap of {c} over {} values", x.len()),
        });
    };
    if n == 0 {
        return Ok(());
    }
    let words = [n, c.to_bits()];
    gpu.record(
        SOFTCAP,
        &[],
        bytemuck::cast_slice(&words),
        &[&x.raw],
        gpu.grid(n.div_ceil(256)),
    );
    Ok(())
}

/// Records `y = a + b`, element by element.
pub fn add(
    gpu: &Gpu,
    y: &GpuBuffer<f32>,
    a: &GpuBuffer<f32>,
    b: &GpuBuffer<f32>,
) -> Result<(), GpuError> {
    let n = y.len();
    if a.len() != n || b.len() != n {
        return Err(GpuError::Shape {
            op: "add",
            problem: format!("lengths {} + {} into {n}", a.len(), b.len()),
        });
    }
    let groups = (n as u32).div_ceil(256);
    gpu.record(
        ADD,
        &[],
        &(n as u32).to_le_bytes(),
        &[&a.raw, &b.raw, &y.raw],
        gpu.grid(groups),
    );
    Ok(())
}

/// Records `dst[i, :] = src[rows[i], :]` for rows of `width` values: buffer copies in the
/// pending encoder (ordered with the dispatches around them), one per run of consecutive rows.
pub fn copy_rows(
    gpu: &Gpu,
    dst: &GpuBuffer<f32>,
    src: &GpuBuffer<f32>,
    rows: &[usize],
    width: usize,
) -> Result<(), GpuError> {
    let n_src = src.len().checked_div(width).unwrap_or(0);
    if dst.len() != rows.len() * width || rows.iter().any(|&r| r >= n_src) {
        return Err(GpuError::Shape {
            op: "copy_rows",
            problem: format!(
                "rows {rows:?} of {width} values from {} into {}",
                src.len(),
                dst.len()
            ),
        });
    }
    let bytes = (width * 4) as u64;
    let mut i = 0;
    while i < rows.len() {
        let mut j = i + 1;
        while j < rows.len() && rows[j] == rows[j - 1] + 1 {
            j += 1;
        }
        let (from, to, size) = (
            rows[i] as u64 * bytes,
            i as u64 * bytes,
            (j - i) as u64 * bytes,
        );
        if size > 0 {
            gpu.with_encoder(|e| e.copy_buffer_to_buffer(&src.raw, from, &dst.raw, to, size));
        }
        i = j;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{gpu, rand_vec};

    #[test]
    fn add_matches_the_host_on_odd_lengths() {
        let Some(gpu) = gpu() else { return };
        for n in [1usize, 7, 255, 256, 257, 100_003] {
            let a = rand_vec(n, 1);
            let b = rand_vec(n, 2);
            let (da, db) = (gpu.upload(&a).unwrap(), gpu.upload(&b).unwrap());
            let dy = gpu.zeros::<f32>(n).unwrap();
            add(gpu, &dy, &da, &db).unwrap();
            let y = gpu.read(&dy).unwrap();
            for i in 0..n {
                assert_eq!(y[i], a[i] + b[i], "n {n} at {i}");
            }
        }
    }

    #[test]
    fn one_submission_for_many_dispatches() {
        // Its own device: the shared one's counters move with the other tests.
        if gpu().is_none() {
            return;
        }
        let gpu = Gpu::open(None).unwrap();
        let a = gpu.upload(&[1.0f32, 2.0, 3.0]).unwrap();
        let y = gpu.zeros::<f32>(3).unwrap();
        gpu.counters().reset();
        for _ in 0..5 {
            add(&gpu, &y, &a, &a).unwrap();
        }
        assert_eq!(gpu.read(&y).unwrap(), vec![2.0, 4.0, 6.0]);
        let c = gpu.counters().get();
        assert_eq!((c.dispatches, c.submissions, c.bytes_down), (5, 1, 12));
    }

    #[test]
    fn scaled_values_are_the_hosts_products() {
        let Some(gpu) = gpu() else { return };
        for n in [1usize, 255, 257, 10_001] {
            let x = rand_vec(n, 5);
            let dx = gpu.upload(&x).unwrap();
            scale(gpu, &dx, 7.389).unwrap();
            let got = gpu.read(&dx).unwrap();
            for i in 0..n {
                assert_eq!(got[i], x[i] * 7.389, "n {n} at {i}");
            }
        }
    }

    #[test]
    fn biases_are_added_to_every_row() {
        let Some(gpu) = gpu() else { return };
        for (rows, n) in [(1usize, 1usize), (3, 7), (5, 300)] {
            let (y, b) = (rand_vec(rows * n, 8), rand_vec(n, 9));
            let (dy, db) = (gpu.upload(&y).unwrap(), gpu.upload(&b).unwrap());
            add_bias(gpu, &dy, &db).unwrap();
            let got = gpu.read(&dy).unwrap();
            for i in 0..rows * n {
                assert_eq!(got[i], y[i] + b[i % n], "{rows}x{n} at {i}");
            }
        }
        let y = gpu.zeros::<f32>(10).unwrap();
        let b = gpu.zeros::<f32>(3).unwrap();
        let e = add_bias(gpu, &y, &b).unwrap_err().to_string();
        assert!(e.contains("10 values are not rows of a bias of 3"), "{e}");
    }

    #[test]
    fn soft_capped_values_are_the_equations() {
        let Some(gpu) = gpu() else { return };
        let x: Vec<f32> = rand_vec(1000, 6).iter().map(|v| v * 80.0).collect();
        let dx = gpu.upload(&x).unwrap();
        softcap(gpu, &dx, 30.0).unwrap();
        let got = gpu.read(&dx).unwrap();
        for (g, v) in got.iter().zip(&x) {
            let want = 30.0 * (f64::from(*v) / 30.0).tanh();
            assert!(
                (f64::from(*g) - want).abs() <= 1e-5 * 30.0,
                "{v}: {g} vs {want}"
            );
        }
        assert!(softcap(gpu, &dx, 0.0).is_err());
    }

    #[test]
    fn a_long_chain_of_dispatches_passes_the_uniform_arena_in_order() {
        // Its own device: the counters of the shared one move with the other tests.
        if gpu().is_none() {
            return;
        }
        let gpu = Gpu::open(None).unwrap();
        let x = rand_vec(4, 12);
        let dx = gpu.upload(&x).unwrap();
        gpu.counters().reset();
        // Enough dispatches, each with its own factor, for their parameters to fill the arena
        // twice: the recording is submitted early, in order.
        let align = u64::from(gpu.limits.min_uniform_buffer_offset_alignment).max(16);
        let n = (2 * crate::dispatch::ARENA_BYTES / align + 10) as usize;
        let factors: Vec<f32> = (0..n).map(|i| 1.0 + (i % 7) as f32 * 1e-4).collect();
        for &f in &factors {
            scale(&gpu, &dx, f).unwrap();
        }
        let got = gpu.read(&dx).unwrap();
        let want: Vec<f32> = x
            .iter()
            .map(|&v| factors.iter().fold(v, |v, &f| v * f))
            .collect();
        assert_eq!(got, want);
        let c = gpu.counters().get();
        assert_eq!(c.dispatches, n as u64);
        assert!(c.submissions >= 3, "{} submissions", c.submissions);
    }

    #[test]
    fn copied_rows_are_the_rows_asked_for_in_order() {
        let Some(gpu) = gpu() else { return };
        let (rows, width) = (7usize, 5usize);
        let src = rand_vec(rows * width, 3);
        let picks = [6usize, 0, 1, 2, 4, 4];
        let ds = gpu.upload(&src).unwrap();
        let dd = gpu.zeros::<f32>(picks.len() * width).unwrap();
        copy_rows(gpu, &dd, &ds, &picks, width).unwrap();
        let got = gpu.read(&dd).unwrap();
        for (i, &r) in picks.iter().enumerate() {
            assert_eq!(
                got[i * width..(i + 1) * width],
                src[r * width..(r + 1) * width]
            );
        }
        let e = copy_rows(gpu, &dd, &ds, &[7, 0, 0, 0, 0, 0], width).unwrap_err();
        assert!(e.to_string().contains("rows [7"), "{e}");
    }

    #[test]
    fn mismatched_lengths_are_an_error_naming_them() {
        let Some(gpu) = gpu() else { return };
        let a = gpu.zeros::<f32>(3).unwrap();
        let y = gpu.zeros::<f32>(4).unwrap();
        let e = add(gpu, &y, &a, &a).unwrap_err().to_string();
        assert!(e.contains("3 + 3 into 4"), "{e}");
    }
}
