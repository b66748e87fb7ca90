//! Element-wise operations: `y = a + b` (the residual connection).

use crate::buffer::GpuBuffer;
use crate::device::Gpu;
use crate::dispatch::Kernel;
use crate::error::GpuError;

const ADD: Kernel = Kernel {
    name: "add",
    source: include_str!("shaders/add.wgsl"),
};

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
    fn mismatched_lengths_are_an_error_naming_them() {
        let Some(gpu) = gpu() else { return };
        let a = gpu.zeros::<f32>(3).unwrap();
        let y = gpu.zeros::<f32>(4).unwrap();
        let e = add(gpu, &y, &a, &a).unwrap_err().to_string();
        assert!(e.contains("3 + 3 into 4"), "{e}");
    }
}
