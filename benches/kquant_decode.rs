//! Decoding's product of K-quant weights, `y [1, d_out] = x [1, d_in] · Wᵀ` for `Q4_K` and
//! `Q6_K` (`cargo bench --bench kquant_decode`): the weight bytes read a second, from memory
//! (`COPIES` matrices of Llama-3.2-1B's FFN shape in turn, more than any cache holds) and from
//! cache (one matrix again and again: the kernel's own arithmetic), through
//! [`PackedWeight::product_with`] as decoding calls it. Threads: RAYON_NUM_THREADS; kernel:
//! TRANSFORMER_KERNEL caps it as it does everywhere.

mod timing;

use timing::{median_secs, pseudo_random_bytes as bytes};
use transformer::kernels::lowp::ggml::GgmlType;
use transformer::kernels::lowp::{pack_ggml, PackedWeight, RawBytes};

/// `rows × cols` of `ty` with every super-block's scales small finite f16 values.
fn matrix(ty: GgmlType, rows: usize, cols: usize, seed: u32) -> PackedWeight {
    let (_, block_bytes) = ty.block().expect("a block type");
    let mut data = bytes(rows * cols / 256 * block_bytes, seed);
    for block in data.chunks_exact_mut(block_bytes) {
        match ty {
            GgmlType::Q4_K => {
                block[..2].copy_from_slice(&0x211Fu16.to_le_bytes());
                block[2..4].copy_from_slice(&0x211Fu16.to_le_bytes());
            }
            _ => block[208..210].copy_from_slice(&0x211Fu16.to_le_bytes()),
        }
    }
    pack_ggml(ty, RawBytes::owned(data), rows, cols)
        .expect("valid blocks")
        .expect("a block format")
}

/// Seconds of CPU this thread has run (its own clock: under other processes' load, a
/// one-thread product's time without the waits).
fn thread_cpu_secs() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for clock_gettime to write.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

fn main() {
    let copies: usize = std::env::var("COPIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48);
    let (rows, cols) = (8192, 2048);
    let x: Vec<f32> = (0..cols)
        .map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5)
        .collect();
    let mut y = vec![0f32; rows];
    println!("threads: {}", rayon::current_num_threads());
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        let ws: Vec<PackedWeight> = (0..copies)
            .map(|c| matrix(ty, rows, cols, c as u32 + 1))
            .collect();
        let bytes = ws[0].bytes() as f64;
        let from_memory = median_secs(5, || {
            for w in &ws {
                w.product(&mut y, &x, 1);
            }
        }) / copies as f64;
        let from_cache = median_secs(5, || {
            for _ in 0..copies {
                ws[0].product(&mut y, &x, 1);
            }
        }) / copies as f64;
        let cpu = |f: &mut dyn FnMut()| {
            let start = thread_cpu_secs();
            f();
            thread_cpu_secs() - start
        };
        let cpu_memory = cpu(&mut || {
            for w in &ws {
                w.product(&mut y, &x, 1);
            }
        }) / copies as f64;
        println!(
            "{ty:?} thread CPU from memory {:.1} GB/s",
            bytes / cpu_memory / 1e9
        );
        println!(
            "{ty:?} {rows}x{cols} ({:.1} MB): from memory {:.1} GB/s ({:.3} ms), from cache {:.1} GB/s ({:.3} ms)",
            bytes / 1e6,
            bytes / from_memory / 1e9,
            from_memory * 1e3,
            bytes / from_cache / 1e9,
            from_cache * 1e3
        );
    }
}
