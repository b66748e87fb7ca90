//! Every format against float64 loops on every shape class (one row, rows not a multiple of
//! the tile, many rows; columns not a multiple of the SIMD step where the format allows; an
//! odd number of blocks), the AVX-512 kernels against the portable ones where the CPU has them.

use super::ggml::{dequantize, GgmlType};
use super::*;

/// (d_out, d_in, rows): decode, tile remainders, odd block counts, prefill.
const SHAPES: &[(usize, usize, usize)] = &[
    (1, 32, 1),
    (37, 64, 1),
    (5, 96, 7),
    (70, 160, 13),
    (33, 576, 64),
    (17, 1536, 3),
];
/// Shapes whose d_in is not a multiple of 32 (bf16 and int8 pad their rows).
const RAGGED: &[(usize, usize, usize)] = &[
    (19, 45, 6),
    (3, 1, 2),
    (9, 77, 5),
    (40, 200, 1),
    // int8: several groups of 64 outputs, the last one partial, rows past a tile of 4.
    (150, 66, 11),
];

/// The low-precision kernels' test numbers (every lowp test file draws from this one).
pub(super) struct Lcg(pub(super) u64);
impl Lcg {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
    /// Uniform in [-1, 1).
    pub(super) fn unit(&mut self) -> f64 {
        (self.next() % (1 << 24)) as f64 / (1 << 23) as f64 - 1.0
    }
    /// [`unit`](Self::unit) rounded to f32.
    pub(super) fn unit_f32(&mut self) -> f32 {
        self.unit() as f32
    }
    pub(super) fn vec(&mut self, n: usize, scale: f64) -> Vec<f32> {
        (0..n).map(|_| (self.unit() * scale) as f32).collect()
    }
}

/// The kernels this CPU runs for `w`.
fn kernels(w: &PackedWeight) -> Vec<Kernel> {
    Kernel::ALL.into_iter().filter(|&k| w.runs(k)).collect()
}

fn run(w: &PackedWeight, kernel: Kernel, x: &[f32], rows: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; rows * w.rows()];
    w.product_with(kernel, &mut y, x, rows);
    y
}

/// Checks `y [rows, d_out]` against `want(r, o) = (value, tolerance)`.
fn check(label: &str, y: &[f32], d_out: usize, want: impl Fn(usize, usize) -> (f64, f64)) {
    for (i, &v) in y.iter().enumerate() {
        let (r, o) = (i / d_out, i % d_out);
        let (value, tol) = want(r, o);
        let err = (f64::from(v) - value).abs();
        assert!(
            err <= tol,
            "{label}: y[{r}][{o}] = {v}, want {value} ± {tol:e} (off by {err:e})"
        );
    }
}

#[test]
fn bf16_rounds_to_nearest_even() {
    let mut rng = Lcg(7);
    for _ in 0..100_000 {
        let x = f32::from_bits(rng.next() as u32 ^ ((rng.next() as u32) << 16));
        if !x.is_finite() || bf16_to_f32(f32_to_bf16(x)).is_infinite() {
            continue;
        }
        let got = f64::from(bf16_to_f32(f32_to_bf16(x)));
        // The two bf16 neighbours of x, by truncation and one step away from zero.
        let down = f64::from(f32::from_bits(x.to_bits() & 0xffff_0000));
        let up = f64::from(f32::from_bits((x.to_bits() & 0xffff_0000) + 0x1_0000));
        let (dd, du) = ((f64::from(x) - down).abs(), (up - f64::from(x)).abs());
        let want = if dd < du || (dd == du && (x.to_bits() >> 16) & 1 == 0) {
            down
        } else {
            up
        };
        assert_eq!(got, want, "{x:e}");
    }
    assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
    assert_eq!(bf16_to_f32(f32_to_bf16(1.0 + 1.0 / 256.0)), 1.0); // tie to even
    assert_eq!(
        bf16_to_f32(f32_to_bf16(1.0 + 3.0 / 256.0)),
        1.0 + 4.0 / 256.0
    );
}

#[test]
fn small_rounding_is_round_ties_even() {
    let mut rng = Lcg(5);
    for _ in 0..100_000 {
        let x = (rng.unit() * 130.0) as f32;
        assert_eq!(round_small(x), x.round_ties_even(), "{x}");
    }
    for x in [0.5f32, 1.5, 2.5, -0.5, -1.5, 126.5, -127.0, 0.0, -0.0] {
        assert_eq!(round_small(x), x.round_ties_even(), "{x}");
    }
}

#[test]
fn bf16_products_match_float64() {
    let mut rng = Lcg(11);
    for &(d_out, d_in, rows) in SHAPES.iter().chain(RAGGED) {
        let w = rng.vec(d_out * d_in, 0.5);
        let x = rng.vec(rows * d_in, 2.0);
        let packed = PackedWeight::Bf16(Bf16Matrix::from_f32(&w, d_out, d_in));
        let r16 = |v: f32| f64::from(bf16_to_f32(f32_to_bf16(v)));
        for kernel in kernels(&packed) {
            let y = run(&packed, kernel, &x, rows);
            let label = format!("bf16 {kernel:?} {d_out}x{d_in} rows {rows}");
            check(&label, &y, d_out, |r, o| {
                let (mut exact, mut rounded, mut mag) = (0.0, 0.0, 0.0);
                for k in 0..d_in {
                    let (a, b) = (w[o * d_in + k], x[r * d_in + k]);
                    exact += f64::from(a) * f64::from(b);
                    rounded += r16(a) * r16(b);
                    mag += (f64::from(a) * f64::from(b)).abs();
                }
                // f32 sums of d_in / 16 terms per lane, then 16 lanes.
                let sum_err = (d_in as f64 / 16.0 + 6.0) * f64::from(f32::EPSILON) * mag;
                assert!(
                    (rounded - exact).abs() <= mag * 2.0 * 2f64.powi(-8),
                    "bf16 rounding bound"
                );
                (rounded, sum_err * 1.1 + 1e-30)
            });
        }
    }
}

#[test]
fn int8_products_match_float64() {
    let mut rng = Lcg(13);
    for &(d_out, d_in, rows) in SHAPES.iter().chain(RAGGED) {
        // Integer grids: w = s_o q, x = t_r p with a ±127 in every row, so quantisation is
        // lossless and the product must equal the float64 one up to the final f32 rounding.
        let grid = |rng: &mut Lcg, n: usize, len: usize, scale: f32| -> Vec<f32> {
            let mut v: Vec<f32> = (0..n * len)
                .map(|_| (rng.next() % 255) as f32 - 127.0)
                .collect();
            for row in v.chunks_exact_mut(len) {
                row[0] = 127.0;
                row.iter_mut().for_each(|e| *e *= scale);
            }
            v
        };
        let w = grid(&mut rng, d_out, d_in, 0.25 / 127.0);
        let x = grid(&mut rng, rows, d_in, 2.0);
        let packed = PackedWeight::Int8(Int8Matrix::from_f32(&w, d_out, d_in).unwrap());
        let exact = |w: &[f32], x: &[f32], r: usize, o: usize| -> (f64, f64) {
            let mut s = (0.0, 0.0);
            for k in 0..d_in {
                let (a, b) = (f64::from(w[o * d_in + k]), f64::from(x[r * d_in + k]));
                s.0 += a * b;
                s.1 += (a * b).abs();
            }
            s
        };
        let mut results = Vec::new();
        for kernel in kernels(&packed) {
            let y = run(&packed, kernel, &x, rows);
            let label = format!("int8 grid {kernel:?} {d_out}x{d_in} rows {rows}");
            check(&label, &y, d_out, |r, o| {
                let (v, mag) = exact(&w, &x, r, o);
                (v, 3e-7 * mag + 1e-30)
            });
            results.push(y);
        }
        // The integer sums are exact: every kernel gives the same bits.
        assert!(
            results.windows(2).all(|p| p[0] == p[1]),
            "int8 kernels differ"
        );

        // Random values: off by at most the rounding of each factor (half a step each).
        let w = rng.vec(d_out * d_in, 0.5);
        let x = rng.vec(rows * d_in, 3.0);
        let packed = PackedWeight::Int8(Int8Matrix::from_f32(&w, d_out, d_in).unwrap());
        let step = |v: &[f32]| v.iter().fold(0f64, |m, &e| m.max(f64::from(e).abs())) / 127.0;
        for kernel in kernels(&packed) {
            let y = run(&packed, kernel, &x, rows);
            let label = format!("int8 random {kernel:?} {d_out}x{d_in} rows {rows}");
            check(&label, &y, d_out, |r, o| {
                let (v, mag) = exact(&w, &x, r, o);
                let s = step(&w[o * d_in..(o + 1) * d_in]);
                let t = step(&x[r * d_in..(r + 1) * d_in]);
                let mut bound = 0.0;
                for k in 0..d_in {
                    let (a, b) = (f64::from(w[o * d_in + k]), f64::from(x[r * d_in + k]));
                    bound += a.abs() * t / 2.0 + b.abs() * s / 2.0 + s * t / 4.0;
                }
                (v, bound * 1.001 + 1e-6 * mag + 1e-30)
            });
        }
    }
}

#[test]
fn int8_refuses_what_it_cannot_sum() {
    let err = Int8Matrix::from_f32(&[1.0, f32::NAN], 1, 2).unwrap_err();
    assert!(err.contains("non-finite"), "{err}");
    let long = vec![0f32; int8::MAX_COLS + 1];
    let err = Int8Matrix::from_f32(&long, 1, long.len()).unwrap_err();
    assert!(err.contains("longer"), "{err}");
}

/// Random ggml blocks of `ty`, `rows x cols`, as a GGUF file stores them.
fn random_blocks(rng: &mut Lcg, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let (_, bytes) = ty.block().unwrap();
    let mut data = Vec::new();
    // Normal f16 scales: sign, exponent 9..14 (2^-6 .. 2^-1), any mantissa.
    let f16 = |rng: &mut Lcg| -> [u8; 2] {
        let h = ((rng.next() % 2) << 15) | ((9 + rng.next() % 6) << 10) | (rng.next() % 1024);
        (h as u16).to_le_bytes()
    };
    for _ in 0..rows * cols / 32 {
        let start = data.len();
        data.extend(f16(rng));
        match ty {
            GgmlType::Q4_0 => data.extend((0..16).map(|_| rng.next() as u8)),
            GgmlType::Q4_1 => {
                data.extend(f16(rng));
                data.extend((0..16).map(|_| rng.next() as u8));
            }
            _ => data.extend((0..32).map(|_| ((rng.next() % 255) as i32 - 127) as i8 as u8)),
        }
        assert_eq!(data.len() - start, bytes);
    }
    data
}

#[test]
fn ggml_block_products_match_float64() {
    let mut rng = Lcg(17);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        for &(d_out, d_in, rows) in SHAPES {
            let data = random_blocks(&mut rng, ty, d_out, d_in);
            // The weights' values by the store's own dequantisation.
            let w = dequantize(ty, &data, d_out * d_in).unwrap();
            let packed =
                PackedWeight::Blocks(BlockMatrix::from_ggml(ty, &data, d_out, d_in).unwrap());
            for lossless in [true, false] {
                // Lossless: each 32-block of x is e·p with integer p, |p| <= 127, one p = 127.
                let x: Vec<f32> = if lossless {
                    let mut x: Vec<f32> = (0..rows * d_in)
                        .map(|_| (rng.next() % 255) as f32 - 127.0)
                        .collect();
                    for (b, block) in x.chunks_exact_mut(32).enumerate() {
                        block[b % 32] = 127.0;
                        let e = 2f32.powi((b % 5) as i32 - 8);
                        block.iter_mut().for_each(|v| *v *= e);
                    }
                    x
                } else {
                    rng.vec(rows * d_in, 4.0)
                };
                let mut results = Vec::new();
                for kernel in kernels(&packed) {
                    let y = run(&packed, kernel, &x, rows);
                    let label =
                        format!("{ty} lossless={lossless} {kernel:?} {d_out}x{d_in} rows {rows}");
                    check(&label, &y, d_out, |r, o| {
                        let (mut v, mut quant, mut scale) = (0.0, 0.0, 0.0);
                        for b in 0..d_in / 32 {
                            let xb = &x[r * d_in + b * 32..r * d_in + b * 32 + 32];
                            let e = xb.iter().fold(0f64, |m, &t| m.max(f64::from(t).abs())) / 127.0;
                            let wb = &w[o * d_in + b * 32..o * d_in + b * 32 + 32];
                            let wmax = wb.iter().fold(0f64, |m, &t| m.max(f64::from(t).abs()));
                            for j in 0..32 {
                                let (a, t) = (f64::from(wb[j]), f64::from(xb[j]));
                                v += a * t;
                                quant += a.abs() * e / 2.0;
                                // f32 sums of the integer-scaled terms, including the
                                // offsets (nibble - 8, Q4_1's minimum, Q8_0's shift of 128).
                                scale += (wmax + a.abs()) * (t.abs() + 128.0 * e);
                            }
                        }
                        let round = 2e-6 * scale;
                        (
                            v,
                            if lossless {
                                round
                            } else {
                                quant * 1.001 + round
                            },
                        )
                    });
                    results.push(y);
                }
                // The AVX-512 kernel differs from the portable one only in the order of f32
                // sums (of terms that can cancel); the AVX2 kernel keeps its order (checked
                // bit for bit in `ggml_block_kernels_agree_on_every_shape`).
                let p = &results[0];
                let top = p.iter().fold(0f32, |m, v| m.max(v.abs()));
                for s in &results[1..] {
                    for (a, b) in p.iter().zip(s) {
                        assert!((a - b).abs() <= 1e-5 * top, "{ty}: {a} vs {b}");
                    }
                }
            }
        }
    }
}

/// The shape classes of the SIMD-against-portable checks: rows (a tile of 4 and its
/// remainders, past it), columns (blocks of 32 not a multiple of the 8-block step; whole
/// 256-super-blocks), outputs.
pub(super) const KERNEL_ROWS: &[usize] = &[1, 2, 3, 4, 5, 17];
/// 576 and 608: SmolLM2's width, 18 blocks (two steps of 8 and a rest), and an odd 19.
pub(super) const KERNEL_COLS: &[usize] = &[32, 64, 96, 256, 512, 576, 608, 768];
/// Runs of 4 output rows (the decoding kernels') and remainders of 1, 2 and 3; 70: three tasks
/// of the GEMMs (32 outputs each, the last one 6), whose reused panel buffers then hold
/// another task's outputs in the lanes past the last.
pub(super) const KERNEL_OUTS: &[usize] = &[1, 3, 6, 16, 17, 70];

/// The SIMD kernels this CPU has, each asserted to run for `w` where the CPU has it.
pub(super) fn simd_kernels(w: &PackedWeight, label: &str) -> Vec<Kernel> {
    let mut simd = Vec::new();
    if has_avx2() {
        assert!(
            w.runs(Kernel::Avx2),
            "{label}: no AVX2 kernel on an AVX2 CPU"
        );
        simd.push(Kernel::Avx2);
    } else {
        eprintln!("{label}: this CPU has no AVX2, its kernel is not checked");
    }
    if w.runs(Kernel::Avx512) {
        simd.push(Kernel::Avx512);
    }
    simd
}

/// The AVX2 kernel of the ggml blocks gives the portable kernel's bits on every shape class
/// (it keeps the portable order of f32 sums); the AVX-512 kernel, and from
/// [`block_gemm::MIN_ROWS`](super::block_gemm::MIN_ROWS) rows on the tiled GEMMs (checked bit
/// for bit against their own portable reference in `block_gemm_tests`), are within the f32
/// rounding of their own order.
#[test]
fn ggml_block_kernels_agree_on_every_shape() {
    let mut rng = Lcg(31);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        for &d_in in KERNEL_COLS {
            for &d_out in KERNEL_OUTS {
                let data = random_blocks(&mut rng, ty, d_out, d_in);
                let w =
                    PackedWeight::Blocks(BlockMatrix::from_ggml(ty, &data, d_out, d_in).unwrap());
                for &rows in KERNEL_ROWS {
                    let x = rng.vec(rows * d_in, 3.0);
                    let label = format!("{ty} {d_out}x{d_in} rows {rows}");
                    let want = run(&w, Kernel::Portable, &x, rows);
                    assert!(want.iter().all(|v| v.is_finite()), "{label}");
                    let top = want.iter().fold(0f32, |m, v| m.max(v.abs()));
                    for kernel in simd_kernels(&w, &label) {
                        let got = run(&w, kernel, &x, rows);
                        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                            if kernel == Kernel::Avx2 && rows < super::block_gemm::MIN_ROWS {
                                assert_eq!(
                                    a.to_bits(),
                                    b.to_bits(),
                                    "{label} {kernel:?} y[{i}]: {a} vs {b}"
                                );
                            } else {
                                assert!(
                                    (a - b).abs() <= 1e-5 * top,
                                    "{label} {kernel:?} y[{i}]: {a} vs {b}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A decoding step (one activation row) takes several weight rows per pass
/// (`row_outputs`): on every kernel it gives, bit for bit, what the kernel's one-row tile
/// gives row by row (for the AVX-512 kernel, whose order is not the portable one, this is
/// the check that the runs of rows keep each row's sums).
#[test]
fn decoding_runs_of_rows_give_the_row_kernels_bits() {
    let mut rng = Lcg(41);
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::IQ4_NL,
    ] {
        for &d_in in &[32, 64, 96, 576, 608, 1536] {
            for &d_out in &[1, 5, 6, 7, 8, 37] {
                let label = format!("{ty} {d_out}x{d_in}");
                let data = match ty {
                    GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => {
                        random_blocks(&mut rng, ty, d_out, d_in)
                    }
                    // Any bytes are 32-blocks of these types once the f16 scales are normal.
                    _ => {
                        let (_, bb) = ty.block().unwrap();
                        let mut data: Vec<u8> =
                            (0..d_out * d_in / 32 * bb).map(|_| rng.next() as u8).collect();
                        for block in data.chunks_exact_mut(bb) {
                            block[1] = 0x28 | (block[1] & 0x83);
                            if ty == GgmlType::Q5_1 {
                                block[3] = 0x28 | (block[3] & 0x83);
                            }
                        }
                        data
                    }
                };
                let w = pack_ggml(ty, RawBytes::owned(data), d_out, d_in)
                    .unwrap()
                    .unwrap();
                let x = rng.vec(d_in, 3.0);
                for kernel in kernels(&w) {
                    let got = run(&w, kernel, &x, 1);
                    let want: Vec<f32> = (0..d_out)
                        .map(|o| {
                            let mut v = [f32::NAN];
                            match &w {
                                PackedWeight::Blocks(b) => {
                                    b.tile(kernel, &b.quantize_acts(&x, 1), o, 0, &mut v)
                                }
                                PackedWeight::KQuants(k) => {
                                    k.tile(kernel, &k.quantize_acts(&x, 1), o, 0, &mut v)
                                }
                                _ => unreachable!("a block format"),
                            }
                            v[0]
                        })
                        .collect();
                    assert!(want.iter().all(|v| v.is_finite()), "{label} {kernel:?}");
                    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(a.to_bits(), b.to_bits(), "{label} {kernel:?} y[{i}]");
                    }
                }
            }
        }
    }
}

/// Blocks multiplied where a shared buffer holds them (a file's map), at any byte offset, give
/// the products of the same blocks copied, bit for bit, on every kernel, and are not copied.
#[test]
fn ggml_blocks_are_read_in_place() {
    let mut rng = Lcg(29);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        for &(d_out, d_in, rows) in SHAPES {
            let data = random_blocks(&mut rng, ty, d_out, d_in);
            let copied =
                PackedWeight::Blocks(BlockMatrix::from_ggml(ty, &data, d_out, d_in).unwrap());
            // The tensor at an odd offset of a larger buffer, ending where the buffer ends.
            let lead = 1 + (rng.next() % 31) as usize;
            let mut file = vec![0xa5u8; lead];
            file.extend_from_slice(&data);
            let file: raw_bytes::SharedBuffer = std::sync::Arc::new(file);
            let range = lead..lead + data.len();
            let bytes = RawBytes::shared(std::sync::Arc::clone(&file), range).unwrap();
            let in_place = BlockMatrix::in_place(ty, bytes, d_out, d_in).unwrap();
            let base = (*file).as_ref().as_ptr();
            assert_eq!(
                in_place.stored().as_ptr(),
                base.wrapping_add(lead),
                "{ty}: copied"
            );
            let in_place = PackedWeight::Blocks(in_place);
            let x = rng.vec(rows * d_in, 3.0);
            for kernel in kernels(&copied) {
                let want = run(&copied, kernel, &x, rows);
                let got = run(&in_place, kernel, &x, rows);
                let same = want
                    .iter()
                    .zip(&got)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{ty} {kernel:?} {d_out}x{d_in} rows {rows}");
            }
        }
    }
}

#[test]
fn ggml_blocks_check_their_input() {
    let err = BlockMatrix::from_ggml(GgmlType::F32, &[0; 128], 1, 32).unwrap_err();
    assert!(err.contains("F32"), "{err}");
    let err = BlockMatrix::from_ggml(GgmlType::Q4_0, &[0; 18], 1, 16).unwrap_err();
    assert!(err.contains("32-element"), "{err}");
    let err = BlockMatrix::from_ggml(GgmlType::Q4_0, &[0; 17], 1, 32).unwrap_err();
    assert!(err.contains("17"), "{err}");
}

#[test]
fn pair_order_is_a_permutation() {
    for nb in 1..6 {
        let mut seen = vec![false; nb * 32];
        for b in 0..nb {
            for j in 0..32 {
                let at = blocks::pair_order(b, j, nb);
                assert!(!seen[at]);
                seen[at] = true;
            }
        }
    }
}

#[test]
fn serial_and_parallel_products_agree() {
    let mut rng = Lcg(19);
    let (d_out, d_in, rows) = (300, 128, 9);
    let w = rng.vec(d_out * d_in, 1.0);
    let x = rng.vec(rows * d_in, 1.0);
    let packed = PackedWeight::Bf16(Bf16Matrix::from_f32(&w, d_out, d_in));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let product = || run(&packed, packed.best_kernel(), &x, rows);
    let (threaded, serial) =
        pool.install(|| (product(), crate::kernels::matmul::serial_matmuls(product)));
    assert_eq!(threaded, serial);
}
