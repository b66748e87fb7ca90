//! The ggml block GEMM against float32 at the shapes of SmolLM2-135M's linear layers
//! (`cargo bench --bench block_gemm`): median time of `y [rows, d_out] = x [rows, d_in] · Wᵀ`
//! for `Q4_0`, `Q4_1` and `Q8_0` weights through [`PackedWeight::product_with`] (the row
//! kernels below `block_gemm::MIN_ROWS` rows, the register-tiled GEMM from there), next to the
//! float32 `matmul` on the same shape. Threads: RAYON_NUM_THREADS; kernel: TRANSFORMER_KERNEL
//! caps it as it does everywhere; ROWS (default "1 16 64") the activation rows.

mod timing;

use timing::{median_secs, pseudo_random_bytes as bytes};
use transformer::kernels::lowp::ggml::GgmlType;
use transformer::kernels::lowp::{pack_ggml, PackedWeight, RawBytes};
use transformer::kernels::matmul::{matmul, MatMut, MatRef};

/// `rows × cols` of `ty` with every block's scales set to small finite f16 values.
fn blocks(ty: GgmlType, rows: usize, cols: usize) -> PackedWeight {
    let (_, block_bytes) = ty.block().expect("a block type");
    let mut data = bytes(rows * cols / 32 * block_bytes, 7);
    for block in data.chunks_exact_mut(block_bytes) {
        block[..2].copy_from_slice(&0x211Fu16.to_le_bytes()); // d = 0.01
        if ty == GgmlType::Q4_1 {
            block[2..4].copy_from_slice(&0xAA66u16.to_le_bytes()); // m = -0.05
        }
    }
    pack_ggml(ty, RawBytes::owned(data), rows, cols)
        .expect("valid blocks")
        .expect("a block format")
}

fn main() {
    println!("threads: {}", rayon::current_num_threads());
    let rows_list: Vec<usize> = std::env::var("ROWS")
        .unwrap_or_else(|_| "1 16 64".into())
        .split_whitespace()
        .map(|r| r.parse().expect("ROWS: numbers"))
        .collect();
    let shapes = [
        (576, 576, "q/o projection"),
        (192, 576, "k/v projection"),
        (1536, 576, "gate/up"),
        (576, 1536, "down"),
    ];
    for &rows in &rows_list {
        let mut totals = [0f64; 4];
        for &(d_out, d_in, what) in &shapes {
            let x: Vec<f32> = bytes(rows * d_in, 3)
                .iter()
                .map(|&b| b as f32 / 128.0 - 1.0)
                .collect();
            let w: Vec<f32> = bytes(d_out * d_in, 5)
                .iter()
                .map(|&b| b as f32 / 2048.0 - 0.06)
                .collect();
            let mut y = vec![0f32; rows * d_out];
            let f32_secs = median_secs(31, || {
                matmul(
                    MatMut::new(&mut y, rows, d_out),
                    MatRef::new(&x, rows, d_in),
                    MatRef::new(&w, d_out, d_in).t(),
                    1.0,
                    false,
                )
            });
            totals[0] += f32_secs;
            let mut line = format!(
                "rows {rows:>3} {d_out:>4}x{d_in:<4} {what:<15} f32 {:>8.1} us",
                f32_secs * 1e6
            );
            for (i, ty) in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0]
                .into_iter()
                .enumerate()
            {
                let packed = blocks(ty, d_out, d_in);
                let kernel = packed.best_kernel();
                let secs = median_secs(31, || packed.product_with(kernel, &mut y, &x, rows));
                totals[i + 1] += secs;
                line += &format!(
                    "  {} {:>8.1} us ({:.2}x)",
                    ty.name(),
                    secs * 1e6,
                    f32_secs / secs
                );
            }
            println!("{line}");
        }
        println!(
            "rows {rows:>3} all four          f32 {:>8.1} us  Q4_0 {:.2}x  Q4_1 {:.2}x  Q8_0 {:.2}x",
            totals[0] * 1e6,
            totals[0] / totals[1],
            totals[0] / totals[2],
            totals[0] / totals[3]
        );
    }
}
