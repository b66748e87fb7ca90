//! Kernel benchmarks (`cargo bench --bench kernels`): median time and throughput of the matmul
//! shapes of a base-model training step, the attention kernel, layer norm and the loss.
//! No harness dependency: plain timing, medians over repeated runs. Threads: RAYON_NUM_THREADS.

mod timing;

use timing::median_secs;
use transformer::kernels::attention::{attention_backward, attention_forward, AttnDims, AttnMask};
use transformer::kernels::layer_norm::{layer_norm_backward, layer_norm_forward};
use transformer::kernels::lowp::bf16_gemm::{self, Bf16Panels};
use transformer::kernels::matmul::{matmul, MatMut, MatRef};
use transformer::model::loss::label_smoothed_cross_entropy;

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 1000.0 - 0.5
        })
        .collect()
}

fn main() {
    println!("threads: {}", rayon::current_num_threads());
    // Base model, batch 16 x 32 tokens = 512 rows.
    let rows = 512;
    for (m, n, k, what) in [
        (
            rows,
            512,
            512,
            "x W^T, d_model -> d_model (attention projections)",
        ),
        (rows, 2048, 512, "x W1^T, d_model -> d_ff"),
        (rows, 512, 2048, "h W2^T, d_ff -> d_model"),
        (rows, 8000, 512, "logits = h E^T, vocab 8000"),
        (512, 512, rows, "dW = dy^T x (weight gradient)"),
    ] {
        let a = data(m * k, 1);
        let b = data(n * k, 2);
        let mut c = vec![0f32; m * n];
        let secs = median_secs(9, || {
            matmul(
                MatMut::new(&mut c, m, n),
                MatRef::new(&a, m, k),
                MatRef::new(&b, n, k).t(),
                1.0,
                false,
            )
        });
        let gflops = 2.0 * (m * n * k) as f64 / secs / 1e9;
        println!(
            "matmul {m}x{n}x{k:<5} {:>8.3} ms {gflops:>7.1} GFLOP/s  {what}",
            secs * 1e3
        );
        // The same product in bf16 (training's --precision bf16): B packed once (a weight,
        // once per optimizer step), A rounded and packed on every call.
        let b_view = MatRef::new(&b, n, k).t();
        let pack = median_secs(9, || drop(Bf16Panels::pack(b_view)));
        let panels = Bf16Panels::pack(b_view);
        let kernel = bf16_gemm::best_kernel();
        let secs16 = median_secs(9, || {
            bf16_gemm::bf16_matmul(kernel, &mut c, MatRef::new(&a, m, k), &panels, false)
        });
        println!(
            "bf16   {m}x{n}x{k:<5} {:>8.3} ms {:>7.1} GFLOP/s  {:.2}x f32 ({kernel:?}; packing B {:.3} ms)",
            secs16 * 1e3,
            2.0 * (m * n * k) as f64 / secs16 / 1e9,
            secs / secs16,
            pack * 1e3
        );
    }
    let (batch, heads, d_head, len) = (16, 8, 64, 32);
    let d = heads * d_head;
    let dims = AttnDims {
        batch,
        heads,
        kv_heads: heads,
        d_head,
        q_len: len,
        k_len: len,
        kv_stride: len,
        scores: Default::default(),
    };
    let lens = vec![len; batch];
    let mask = AttnMask {
        key_lens: &lens,
        causal: true,
        q_offset: 0,
    };
    let (q, k, v) = (
        data(batch * len * d, 3),
        data(batch * len * d, 4),
        data(batch * len * d, 5),
    );
    let mut ctx = vec![0f32; batch * len * d];
    let mut probs = vec![0f32; batch * heads * len * len];
    let secs = median_secs(21, || {
        attention_forward(&mut ctx, &mut probs, &q, &k, &v, dims, mask, None)
    });
    println!(
        "attention forward  16x8 heads x 32x32 x 64 {:>8.3} ms",
        secs * 1e3
    );
    let (mut dq, mut dk, mut dv) = (ctx.clone(), ctx.clone(), ctx.clone());
    let secs = median_secs(21, || {
        attention_backward(
            &mut dq, &mut dk, &mut dv, &ctx, &q, &k, &v, &probs, dims, None,
        )
    });
    println!(
        "attention backward 16x8 heads x 32x32 x 64 {:>8.3} ms",
        secs * 1e3
    );
    let x = data(rows * d, 6);
    let (gamma, beta) = (vec![1f32; d], vec![0f32; d]);
    let mut y = vec![0f32; rows * d];
    let secs = median_secs(21, || {
        layer_norm_forward(&mut y, &x, &gamma, &beta, d, 1e-6);
    });
    println!("layer norm forward  512x512 {:>8.3} ms", secs * 1e3);
    let stats = layer_norm_forward(&mut y, &x, &gamma, &beta, d, 1e-6);
    let (mut dx, mut dg, mut db) = (vec![0f32; rows * d], vec![0f32; d], vec![0f32; d]);
    let secs = median_secs(21, || {
        layer_norm_backward(&mut dx, &y, &x, &stats, &gamma, &mut dg, &mut db, d)
    });
    println!("layer norm backward 512x512 {:>8.3} ms", secs * 1e3);
    let vocab = 8000;
    let logits = data(rows * vocab, 7);
    let targets: Vec<u32> = (0..rows as u32).map(|i| 4 + i % 7000).collect();
    let mut work = logits.clone();
    let secs = median_secs(9, || {
        work.copy_from_slice(&logits);
        label_smoothed_cross_entropy(&mut work, &targets, vocab, 0.1, Some(1.0));
    });
    println!(
        "label-smoothed loss + gradient 512x8000 {:>8.3} ms",
        secs * 1e3
    );
}
