//! The GPU's weight products and embedding rows (the `gpu/` crate, on whatever adapter this
//! machine has: Mesa's lavapipe in CI) against the CPU's decoding of the same bytes, on every
//! matrix of the K-quant fixture files of ../shared (one small Llama quantised by llama.cpp to
//! each format): `y = x · Wᵀ` with `W` dequantised by the CPU's reader and summed in f64, for
//! one row (the matrix-vector kernel) and nine (the tiled one); each table's rows gathered.

#![cfg(feature = "gpu")]

use std::path::PathBuf;

use transformer::backend::gpu_format;
use transformer::store::gguf::GgufFile;
use transformer_gpu::products::{gather_rows, weight_product, GpuWeight};
use transformer_gpu::testing::rand_vec;
use transformer_gpu::Gpu;

/// The first adapter, shared with the GPU crate's own tests: `None` (printing why) where
/// there is none, a failure under `CI`.
pub fn gpu() -> Option<&'static Gpu> {
    transformer_gpu::testing::gpu()
}

fn kquants() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/kquants");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!("skipped: {} is absent", dir.display());
        None
    }
}

#[test]
fn every_matrix_of_every_format_multiplies_and_gathers_as_the_cpu_decodes_it() {
    let (Some(gpu), Some(dir)) = (gpu(), kquants()) else {
        return;
    };
    let mut formats_seen = std::collections::BTreeSet::new();
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no .gguf in {}", dir.display());
    for path in names {
        let file = GgufFile::open(&path).unwrap();
        for info in file.tensors() {
            let Some(fmt) = gpu_format(info.ggml_type) else {
                continue;
            };
            if info.dims.len() != 2 {
                continue;
            }
            formats_seen.insert(fmt.name());
            let (d_out, d_in) = info.rows_cols();
            let w_cpu = file.dequantize_info(info).unwrap(); // [d_out, d_in]
            let w =
                GpuWeight::upload(gpu, fmt, d_in, d_out, file.tensor_data(info).unwrap()).unwrap();
            let what = format!("{} {} [{d_out}, {d_in}]", path.display(), info.name);
            for rows in [1usize, 9] {
                let x = rand_vec(rows * d_in, rows as u64 + d_out as u64);
                let (dx, dy) = (
                    gpu.upload(&x).unwrap(),
                    gpu.upload(&vec![f32::NAN; rows * d_out]).unwrap(),
                );
                weight_product(gpu, &dy, &dx, rows, &w).unwrap();
                let y = gpu.read(&dy).unwrap();
                for r in 0..rows {
                    for o in 0..d_out {
                        let (mut want, mut scale) = (0f64, 0f64);
                        for i in 0..d_in {
                            let t = f64::from(w_cpu[o * d_in + i]) * f64::from(x[r * d_in + i]);
                            want += t;
                            scale += t * t;
                        }
                        let got = f64::from(y[r * d_out + o]);
                        let tol = 1e-5 * scale.sqrt() * (d_in as f64).sqrt() + 1e-30;
                        assert!(
                            (got - want).abs() <= tol,
                            "{what} rows {rows} ({r}, {o}): {got} vs {want}"
                        );
                    }
                }
            }
            // Rows of the table by id: first, last, one past the end (zeros).
            let ids = [0u32, (d_out - 1) as u32, d_out as u32];
            let out = gpu.upload(&vec![f32::NAN; ids.len() * d_in]).unwrap();
            gather_rows(gpu, &out, &gpu.upload(&ids).unwrap(), &w).unwrap();
            let rows = gpu.read(&out).unwrap();
            for (k, &id) in ids.iter().enumerate() {
                for i in 0..d_in {
                    let want = w_cpu.get(id as usize * d_in + i).copied().unwrap_or(0.0);
                    let got = rows[k * d_in + i];
                    assert!(
                        (got - want).abs() <= 1e-6 * want.abs().max(1e-3),
                        "{what} row {id} [{i}]: {got} vs {want}"
                    );
                }
            }
        }
    }
    for f in [
        "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16",
    ] {
        assert!(
            formats_seen.contains(f),
            "no {f} matrix in the fixtures: {formats_seen:?}"
        );
    }
}
