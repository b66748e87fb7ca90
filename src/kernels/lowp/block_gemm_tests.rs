//! The block GEMM against float64 loops over the dequantised weights on every shape class
//! (rows 1..=9, 17, 64: tile remainders; d_out not a multiple of a panel or of a task; d_in
//! from one block to 1024, odd block counts), and each SIMD kernel against the portable
//! reference, bit for bit (the same integer sums, the same float operations).

use super::super::ggml::{dequantize, GgmlType};
use super::super::tests::Lcg;
use super::super::{BlockMatrix, Kernel, PackedFormat, PackedWeight};
use super::*;

const TYPES: [GgmlType; 3] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0];
/// (d_out, d_in): one output, less than a panel, a panel and one, two tasks and some; one
/// block, odd block counts, not multiples of 256, 1024.
const SHAPES: &[(usize, usize)] = &[
    (1, 32),
    (7, 96),
    (16, 64),
    (17, 160),
    (33, 544),
    (70, 1024),
    (40, 32),
];
const ROWS: &[usize] = &[1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 64];

/// Random blocks of `ty` as a GGUF file stores them: normal f16 scales 2^-6 .. 2^-1 of either
/// sign, any nibbles, `Q8_0` bytes over the whole of `[-128, 127]`.
fn random_blocks(rng: &mut Lcg, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let mut data = Vec::new();
    let f16 = |rng: &mut Lcg| -> [u8; 2] {
        let h = ((rng.next() % 2) << 15) | ((9 + rng.next() % 6) << 10) | (rng.next() % 1024);
        (h as u16).to_le_bytes()
    };
    for _ in 0..rows * cols / 32 {
        data.extend(f16(rng));
        if ty == GgmlType::Q4_1 {
            data.extend(f16(rng));
        }
        let n = if ty == GgmlType::Q8_0 { 32 } else { 16 };
        data.extend((0..n).map(|_| rng.next() as u8));
    }
    data
}

/// The SIMD kernels this CPU has.
fn simd_kernels() -> Vec<Kernel> {
    [Kernel::Avx2, Kernel::Avx512]
        .into_iter()
        .filter(|&k| runs(k))
        .collect()
}

fn gemm(w: &BlockMatrix, kernel: Kernel, x: &[f32], rows: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; rows * w.rows()];
    product(w, kernel, &mut y, x, rows);
    y
}

/// `x [rows, d_in]`: lossless (each block `e · p`, integer `|p| <= 127`, one `p = ±127`) or
/// plain random values.
fn activations(rng: &mut Lcg, rows: usize, d_in: usize, lossless: bool) -> Vec<f32> {
    if !lossless {
        return (0..rows * d_in).map(|_| 4.0 * rng.unit_f32()).collect();
    }
    let mut x: Vec<f32> = (0..rows * d_in)
        .map(|_| (rng.next() % 255) as f32 - 127.0)
        .collect();
    for (b, block) in x.chunks_exact_mut(32).enumerate() {
        block[b % 32] = if b % 3 == 0 { -127.0 } else { 127.0 };
        let e = 2f32.powi((b % 5) as i32 - 8);
        block.iter_mut().for_each(|v| *v *= e);
    }
    x
}

#[test]
fn the_portable_gemm_matches_float64() {
    let mut rng = Lcg(41);
    for ty in TYPES {
        for &(d_out, d_in) in SHAPES {
            let data = random_blocks(&mut rng, ty, d_out, d_in);
            let w = dequantize(ty, &data, d_out * d_in).unwrap();
            let m = BlockMatrix::from_ggml(ty, &data, d_out, d_in).unwrap();
            for &rows in &[1, 5, 9] {
                for lossless in [true, false] {
                    let x = activations(&mut rng, rows, d_in, lossless);
                    let y = gemm(&m, Kernel::Portable, &x, rows);
                    for (i, &v) in y.iter().enumerate() {
                        let (r, o) = (i / d_out, i % d_out);
                        let (mut want, mut quant, mut scale) = (0f64, 0f64, 0f64);
                        for b in 0..d_in / 32 {
                            let xb = &x[r * d_in + b * 32..][..32];
                            let wb = &w[o * d_in + b * 32..][..32];
                            let e = xb.iter().fold(0f64, |m, &t| m.max(f64::from(t).abs())) / 127.0;
                            let wmax = wb.iter().fold(0f64, |m, &t| m.max(f64::from(t).abs()));
                            for (&a, &t) in wb.iter().zip(xb) {
                                let (a, t) = (f64::from(a), f64::from(t));
                                want += a * t;
                                // Half a quantisation step of the activation.
                                quant += a.abs() * e / 2.0;
                                // The size of the f32 terms (block sums and the minimum term).
                                scale += (wmax + a.abs()) * (t.abs() + 128.0 * e);
                            }
                        }
                        let tol = 2e-6 * scale + if lossless { 0.0 } else { quant * 1.001 };
                        let err = (f64::from(v) - want).abs();
                        assert!(
                            err <= tol,
                            "{ty} {d_out}x{d_in} rows {rows} lossless {lossless}: y[{r}][{o}] = \
                             {v}, want {want} ± {tol:e}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn simd_gemms_equal_the_portable_one_bit_for_bit() {
    let kernels = simd_kernels();
    if kernels.is_empty() {
        eprintln!("skipped: this CPU has neither the AVX2 nor the AVX-512 kernel");
        return;
    }
    let mut rng = Lcg(43);
    for ty in TYPES {
        for &(d_out, d_in) in SHAPES {
            let data = random_blocks(&mut rng, ty, d_out, d_in);
            let m = BlockMatrix::from_ggml(ty, &data, d_out, d_in).unwrap();
            for &rows in ROWS {
                let x = activations(&mut rng, rows, d_in, rows % 2 == 0);
                let want = gemm(&m, Kernel::Portable, &x, rows);
                for &kernel in &kernels {
                    let got = gemm(&m, kernel, &x, rows);
                    for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                        assert_eq!(
                            a.to_bits(),
                            b.to_bits(),
                            "{ty} {kernel:?} {d_out}x{d_in} rows {rows}: y[{}][{}] {a} vs {b}",
                            i / d_out,
                            i % d_out
                        );
                    }
                }
            }
        }
    }
}

/// The extremes of the integer sums: nibbles all 15 or 0, `Q8_0` bytes -128 and 127, against
/// activations of ±127 (where AVX2's 16-bit pair sums come closest to overflowing).
#[test]
fn extreme_blocks_sum_exactly() {
    let kernels = simd_kernels();
    let (d_out, d_in, rows) = (24, 256, 6);
    for ty in TYPES {
        let (_, bytes) = ty.block().unwrap();
        let q_at = if ty == GgmlType::Q4_1 { 4 } else { 2 };
        let mut data = Vec::new();
        for i in 0..d_out * d_in / 32 {
            let mut block = vec![0u8; bytes];
            block[..2].copy_from_slice(&0x3c00u16.to_le_bytes()); // d = 1
            if ty == GgmlType::Q4_1 {
                block[2..4].copy_from_slice(&0xbc00u16.to_le_bytes()); // m = -1
            }
            let fill: &[u8] = match (ty, i % 3) {
                (GgmlType::Q8_0, 0) => &[0x80],
                (GgmlType::Q8_0, 1) => &[0x7f],
                (GgmlType::Q8_0, _) => &[0x80, 0x7f],
                (_, 0) => &[0xff],
                (_, 1) => &[0x00],
                _ => &[0x0f, 0xf0],
            };
            for (j, q) in block[q_at..].iter_mut().enumerate() {
                *q = fill[j % fill.len()];
            }
            data.extend(block);
        }
        let w = dequantize(ty, &data, d_out * d_in).unwrap();
        let m = BlockMatrix::from_ggml(ty, &data, d_out, d_in).unwrap();
        for sign in [1.0f32, -1.0] {
            let x: Vec<f32> = (0..rows * d_in)
                .map(|k| {
                    if (k / 7) % 2 == 0 {
                        127.0 * sign
                    } else {
                        -127.0 * sign
                    }
                })
                .collect();
            // e = 1 for every block: the products are exact integers, the sums too.
            let want: Vec<f32> = (0..rows * d_out)
                .map(|i| {
                    let (r, o) = (i / d_out, i % d_out);
                    let s: f64 = (0..d_in)
                        .map(|k| f64::from(w[o * d_in + k]) * f64::from(x[r * d_in + k]))
                        .sum();
                    s as f32
                })
                .collect();
            for kernel in std::iter::once(Kernel::Portable).chain(kernels.iter().copied()) {
                assert_eq!(
                    gemm(&m, kernel, &x, rows),
                    want,
                    "{ty} {kernel:?} sign {sign}"
                );
            }
        }
    }
}

/// `PackedWeight::product_with` takes the GEMM from `MIN_ROWS` rows on (its bits), the row
/// kernel below; threaded and serial products agree.
#[test]
fn products_of_many_rows_take_the_gemm() {
    let mut rng = Lcg(47);
    let (d_out, d_in) = (150, 320);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for ty in TYPES {
        let data = random_blocks(&mut rng, ty, d_out, d_in);
        let m = BlockMatrix::from_ggml(ty, &data, d_out, d_in).unwrap();
        let packed = PackedWeight::Blocks(m.clone());
        for kernel in simd_kernels().into_iter().filter(|&k| m.runs(k)) {
            for rows in [MIN_ROWS - 1, MIN_ROWS, 33] {
                let x = activations(&mut rng, rows, d_in, false);
                let run = || {
                    let mut y = vec![f32::NAN; rows * d_out];
                    packed.product_with(kernel, &mut y, &x, rows);
                    y
                };
                let (threaded, serial) =
                    pool.install(|| (run(), crate::kernels::matmul::serial_matmuls(run)));
                assert_eq!(threaded, serial, "{ty} {kernel:?} rows {rows}");
                let gemm_bits = gemm(&m, kernel, &x, rows) == threaded;
                assert_eq!(gemm_bits, rows >= MIN_ROWS, "{ty} {kernel:?} rows {rows}");
            }
        }
    }
}
