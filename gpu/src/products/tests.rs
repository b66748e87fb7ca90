//! Every format against a float64 product of its ggml-spec decoding, on shapes that cross the
//! matrix-vector / matrix-matrix switch, partial tiles and partial workgroups.

use super::reference::{dequantize, random_weight};
use super::*;
use crate::testing::{gpu, rand_vec};

/// The `(rows, d_in, d_out)` shapes `format` is tested on: rows on both sides of
/// [`MATVEC_ROWS`], outputs fewer than a workgroup or a tile and odd, rows one block, a few
/// blocks, and (for the float formats) not a multiple of the 32-value unit; one long row
/// (more pieces than a matrix-vector workgroup has invocations) and a 2 × 2 grid of tiles.
fn shapes(format: WeightFormat) -> Vec<(usize, usize, usize)> {
    let b = format.block_values().max(32);
    let d_ins: Vec<usize> = if format.block_values() == 1 {
        vec![1, 37, 96, 100]
    } else {
        vec![b, 3 * b, 2 * b]
    };
    let d_outs = [1, 3, 67];
    let mut shapes: Vec<_> = [1, 2, 3, 7, 8, 9, 33, 64]
        .iter()
        .enumerate()
        .map(|(i, &rows)| (rows, d_ins[i % d_ins.len()], d_outs[i % d_outs.len()]))
        .collect();
    let long = if b == 256 { 5 * 256 } else { 1312 };
    shapes.push((2, long, 5));
    shapes.push((70, 2 * b, 130));
    shapes
}

/// The GPU product of a random `format` matrix against the float64 one.
fn check_product(gpu: &Gpu, format: WeightFormat, rows: usize, d_in: usize, d_out: usize) {
    let seed = (rows * 1000 + d_in * 10 + d_out) as u64;
    let bytes = random_weight(format, d_in, d_out, seed);
    let wf = dequantize(format, &bytes, d_in, d_out);
    let x = rand_vec(rows * d_in, seed + 1);
    let w = GpuWeight::upload(gpu, format, d_in, d_out, &bytes).unwrap();
    let dx = gpu.upload(&x).unwrap();
    // NaN where nothing is written: a missed output fails.
    let dy = gpu.upload(&vec![f32::NAN; rows * d_out]).unwrap();
    weight_product(gpu, &dy, &dx, rows, &w).unwrap();
    let y = gpu.read(&dy).unwrap();
    for r in 0..rows {
        for o in 0..d_out {
            let terms = (0..d_in).map(|k| wf[o * d_in + k] * f64::from(x[r * d_in + k]));
            let (sum, sq) = terms.fold((0.0, 0.0), |(s, q), t| (s + t, q + t * t));
            let tol = 1e-5 * (d_in as f64).sqrt() * sq.sqrt() + 1e-30;
            let got = f64::from(y[r * d_out + o]);
            assert!(
                (got - sum).abs() <= tol,
                "{format} rows {rows} d_in {d_in} d_out {d_out}: y[{r}, {o}] = {got}, \
                 float64 {sum} (tolerance {tol})"
            );
        }
    }
}

/// The embedding lookup of a random `format` table, with ids out of range.
fn check_gather(gpu: &Gpu, format: WeightFormat, d_in: usize, d_out: usize) {
    let bytes = random_weight(format, d_in, d_out, 77);
    let wf = dequantize(format, &bytes, d_in, d_out);
    let table = GpuWeight::upload(gpu, format, d_in, d_out, &bytes).unwrap();
    let ids = [2, d_out as u32, 0, u32::MAX, d_out as u32 - 1, 2];
    let dids = gpu.upload(&ids).unwrap();
    let out = gpu.upload(&vec![f32::NAN; ids.len() * d_in]).unwrap();
    gather_rows(gpu, &out, &dids, &table).unwrap();
    let got = gpu.read(&out).unwrap();
    for (i, &id) in ids.iter().enumerate() {
        for k in 0..d_in {
            let want = if (id as usize) < d_out {
                wf[id as usize * d_in + k]
            } else {
                0.0
            };
            let g = f64::from(got[i * d_in + k]);
            assert!(
                (g - want).abs() <= 1e-6 * want.abs(),
                "{format} gather d_in {d_in}: out[{i}, {k}] (id {id}) = {g}, float64 {want}"
            );
        }
    }
}

fn check_format(format: WeightFormat) {
    let Some(gpu) = gpu() else { return };
    for (rows, d_in, d_out) in shapes(format) {
        check_product(gpu, format, rows, d_in, d_out);
    }
    let d_in = if format.block_values() == 1 {
        37
    } else {
        2 * format.block_values()
    };
    check_gather(gpu, format, d_in, 5);
}

#[test]
fn f32_products() {
    check_format(WeightFormat::F32);
}

#[test]
fn f16_products() {
    check_format(WeightFormat::F16);
}

#[test]
fn bf16_products() {
    check_format(WeightFormat::Bf16);
}

#[test]
fn q4_0_products() {
    check_format(WeightFormat::Q4_0);
}

#[test]
fn q4_1_products() {
    check_format(WeightFormat::Q4_1);
}

#[test]
fn q5_0_products() {
    check_format(WeightFormat::Q5_0);
}

#[test]
fn q5_1_products() {
    check_format(WeightFormat::Q5_1);
}

#[test]
fn q8_0_products() {
    check_format(WeightFormat::Q8_0);
}

#[test]
fn q4_k_products() {
    check_format(WeightFormat::Q4K);
}

#[test]
fn q5_k_products() {
    check_format(WeightFormat::Q5K);
}

#[test]
fn q6_k_products() {
    check_format(WeightFormat::Q6K);
}

#[test]
fn a_wrong_byte_length_names_the_sizes() {
    let Some(gpu) = gpu() else { return };
    let e = GpuWeight::upload(gpu, WeightFormat::Q4_0, 64, 3, &[0u8; 100])
        .unwrap_err()
        .to_string();
    assert!(e.contains("3 × 36 bytes, not the 100 given"), "{e}");
    let e = GpuWeight::upload(gpu, WeightFormat::Q6K, 300, 1, &[0u8; 210])
        .unwrap_err()
        .to_string();
    assert!(e.contains("a multiple of 256"), "{e}");
}

#[test]
fn mismatched_activations_are_an_error_naming_them() {
    let Some(gpu) = gpu() else { return };
    let w = GpuWeight::upload(gpu, WeightFormat::F32, 4, 2, &[0u8; 32]).unwrap();
    let x = gpu.zeros::<f32>(12).unwrap();
    let y = gpu.zeros::<f32>(6).unwrap();
    let e = weight_product(gpu, &y, &x, 2, &w).unwrap_err().to_string();
    assert!(e.contains("x needs 8, y 4"), "{e}");
    let xy = gpu.zeros::<f32>(8).unwrap();
    let w4 = GpuWeight::upload(gpu, WeightFormat::F32, 4, 4, &[0u8; 64]).unwrap();
    let e = weight_product(gpu, &xy, &xy, 2, &w4)
        .unwrap_err()
        .to_string();
    assert!(e.contains("another buffer than x"), "{e}");
    let out = gpu.zeros::<f32>(5).unwrap();
    let ids = gpu.upload(&[0u32]).unwrap();
    let e = gather_rows(gpu, &out, &ids, &w).unwrap_err().to_string();
    assert!(e.contains("out of 5 values for 1 rows of 4 values"), "{e}");
}

#[test]
fn a_vocabulary_past_one_grid_dimension() {
    // More outputs than workgroups along x (65 535 on most adapters): a 2D grid.
    let Some(gpu) = gpu() else { return };
    let (format, d_in, d_out) = (WeightFormat::Q4_0, 32, 65_600);
    let bytes = random_weight(format, d_in, d_out, 3);
    let wf = dequantize(format, &bytes, d_in, d_out);
    let w = GpuWeight::upload(gpu, format, d_in, d_out, &bytes).unwrap();
    let x = rand_vec(d_in, 4);
    let dx = gpu.upload(&x).unwrap();
    let dy = gpu.upload(&vec![f32::NAN; d_out]).unwrap();
    weight_product(gpu, &dy, &dx, 1, &w).unwrap();
    let y = gpu.read(&dy).unwrap();
    for o in [0, 1, 65_534, 65_535, 65_536, d_out - 1] {
        let want: f64 = (0..d_in).map(|k| wf[o * d_in + k] * f64::from(x[k])).sum();
        let got = f64::from(y[o]);
        assert!(
            (got - want).abs() <= 1e-4 * want.abs().max(1.0),
            "y[{o}] = {got}, float64 {want}"
        );
    }
    assert!(y.iter().all(|v| v.is_finite()), "every output written");
    let ids = gpu.upload(&[d_out as u32 - 1, 65_535]).unwrap();
    let out = gpu.zeros::<f32>(2 * d_in).unwrap();
    gather_rows(gpu, &out, &ids, &w).unwrap();
    let got = gpu.read(&out).unwrap();
    for (i, o) in [d_out - 1, 65_535].into_iter().enumerate() {
        for k in 0..d_in {
            assert_eq!(
                f64::from(got[i * d_in + k]),
                wf[o * d_in + k],
                "row {o} value {k}"
            );
        }
    }
}

/// `got` equal to `want` within `rel` of the larger magnitude, element by element.
fn assert_same(got: &[f32], want: &[f32], rel: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= rel * g.abs().max(w.abs()),
            "{what}: at {i} fused {g}, unfused {w}"
        );
    }
}

/// The product of each part alone.
fn separate_products(
    gpu: &Gpu,
    parts: &[(WeightFormat, usize, Vec<u8>)],
    d_in: usize,
    rows: usize,
    dx: &GpuBuffer<f32>,
) -> Vec<Vec<f32>> {
    parts
        .iter()
        .map(|(f, n, b)| {
            let w = GpuWeight::upload(gpu, *f, d_in, *n, b).unwrap();
            let dy = gpu.zeros::<f32>(rows * n).unwrap();
            weight_product(gpu, &dy, dx, rows, &w).unwrap();
            gpu.read(&dy).unwrap()
        })
        .collect()
}

#[test]
fn stacked_rows_give_each_part_its_own_product() {
    let Some(gpu) = gpu() else { return };
    use WeightFormat::*;
    // Q‖K‖V of one format (one dispatch), then Q4_K_M's Q4_K Q‖K with a Q6_K V (two), and
    // odd part sizes in a format whose rows end mid-word (Q4_0: 18 bytes a block).
    // (d_in, the parts' formats and rows, the dispatches of one product)
    type Case = (usize, Vec<(WeightFormat, usize)>, usize);
    let cases: Vec<Case> = vec![
        (256, vec![(Q4K, 12), (Q4K, 4), (Q4K, 4)], 1),
        (512, vec![(Q4K, 13), (Q4K, 5), (Q6K, 5)], 2),
        (96, vec![(Q4_0, 7), (Q4_0, 3), (Q4_0, 3)], 1),
        (37, vec![(F32, 3), (F16, 5), (F16, 1), (Bf16, 2)], 3),
    ];
    for (d_in, spec, dispatches) in cases {
        let parts: Vec<(WeightFormat, usize, Vec<u8>)> = spec
            .iter()
            .enumerate()
            .map(|(i, &(f, n))| (f, n, random_weight(f, d_in, n, 40 + i as u64)))
            .collect();
        let refs: Vec<(WeightFormat, usize, &[u8])> = parts
            .iter()
            .map(|(f, n, b)| (*f, *n, b.as_slice()))
            .collect();
        let w = StackedWeight::upload(gpu, d_in, &refs).unwrap();
        assert_eq!(w.dispatches(), dispatches, "{spec:?}");
        assert_eq!(w.single().is_some(), dispatches == 1);
        let total: usize = spec.iter().map(|s| s.1).sum();
        assert_eq!(w.d_out(), total);
        for rows in [1, 3, 8, 9, 70] {
            let x = rand_vec(rows * d_in, rows as u64);
            let dx = gpu.upload(&x).unwrap();
            let dy = gpu.upload(&vec![f32::NAN; rows * total]).unwrap();
            let before = gpu.counters().get().dispatches;
            stacked_product(gpu, &dy, &dx, rows, &w).unwrap();
            let recorded = gpu.counters().get().dispatches - before;
            // Other tests share the device's counters: at least ours were recorded.
            assert!(recorded >= dispatches as u64);
            let y = gpu.read(&dy).unwrap();
            let each = separate_products(gpu, &parts, d_in, rows, &dx);
            for (i, part) in each.iter().enumerate() {
                let (off, n) = (w.offset(i), w.rows(i));
                let got: Vec<f32> = (0..rows)
                    .flat_map(|r| y[r * total + off..][..n].to_vec())
                    .collect();
                // The same sums in the same order: exactly the separate product.
                assert_eq!(&got, part, "{spec:?} rows {rows} part {i}");
            }
        }
    }
    let e = StackedWeight::upload(gpu, 64, &[(Q4_0, 2, &[0u8; 36][..])]).unwrap_err();
    assert!(e.to_string().contains("part 0"), "{e}");
    let e = GpuWeight::concat_rows(gpu, Q8_0, 32, &[&[0u8; 34], &[0u8; 35]]).unwrap_err();
    assert!(e.to_string().contains("part 1 of 35 bytes"), "{e}");
}

#[test]
fn the_gated_product_is_the_product_then_the_gated_unit() {
    use crate::activations::{glu, Activation, GluInput};
    let Some(gpu) = gpu() else { return };
    use WeightFormat::*;
    // (format, d_in, d_ff): odd d_ff, one past a 32-output tile, several tiles.
    let cases = [
        (Q4K, 256, 5),
        (Q6K, 512, 33),
        (Q4_0, 96, 67),
        (F32, 37, 1),
        (Q8_0, 64, 70),
    ];
    for (f, d_in, d_ff) in cases {
        let gate = random_weight(f, d_in, d_ff, 91);
        let up = random_weight(f, d_in, d_ff, 92);
        let w = GpuWeight::concat_rows(gpu, f, d_in, &[&gate, &up]).unwrap();
        for act in [Activation::Silu, Activation::GeluTanh] {
            for rows in [1, 2, 8, 9, 65] {
                let x = rand_vec(rows * d_in, (rows + d_ff) as u64);
                let dx = gpu.upload(&x).unwrap();
                let fused = gpu.upload(&vec![f32::NAN; rows * d_ff]).unwrap();
                glu_product(gpu, act, &fused, &dx, rows, &w).unwrap();
                let gu = gpu.zeros::<f32>(rows * 2 * d_ff).unwrap();
                let unfused = gpu.zeros::<f32>(rows * d_ff).unwrap();
                weight_product(gpu, &gu, &dx, rows, &w).unwrap();
                glu(gpu, act, GluInput::Fused(&gu), &unfused, d_ff).unwrap();
                let what = format!("{f} d_in {d_in} d_ff {d_ff} {act:?} rows {rows}");
                // The same sums in the same order and the same activation: bit-equal on
                // lavapipe; 1e-6 leaves room for a compiler that contracts the two kernels'
                // multiply-adds differently.
                assert_same(
                    &gpu.read(&fused).unwrap(),
                    &gpu.read(&unfused).unwrap(),
                    1e-6,
                    &what,
                );
            }
        }
    }
    let w = GpuWeight::upload(gpu, F32, 4, 3, &[0u8; 48]).unwrap();
    let (x, y) = (gpu.zeros::<f32>(4).unwrap(), gpu.zeros::<f32>(1).unwrap());
    let e = glu_product(gpu, Activation::Silu, &y, &x, 1, &w).unwrap_err();
    assert!(e.to_string().contains("gate-up matrix of 3 rows"), "{e}");
}

/// A table larger than one buffer may hold is cut into runs of whole rows: its products and
/// its lookups (ids in every run, and past the table) are those of the uncut table.
#[test]
fn tables_cut_into_runs_multiply_and_gather_as_one() {
    let Some(shared) = gpu() else { return };
    // Its own device: the cap would cut the other tests' weights too.
    let cut = Gpu::open(None).unwrap();
    for format in [WeightFormat::Q8_0, WeightFormat::Q4K, WeightFormat::F32] {
        let (d_in, d_out) = (256usize, 50usize);
        let bytes = random_weight(format, d_in, d_out, 3);
        // Runs of 7 rows (the cap a little more than 7 rows' bytes).
        cut.set_weight_buffer_cap((7 * format.row_bytes(d_in) + 5) as u64);
        let parts = [(format, d_out, &bytes[..])];
        let (whole, pieces) = (
            StackedWeight::upload(shared, d_in, &parts).unwrap(),
            StackedWeight::upload(&cut, d_in, &parts).unwrap(),
        );
        assert_eq!(pieces.dispatches(), 8, "{format}: 50 rows in runs of 7");
        assert_eq!(pieces.d_out(), d_out);
        let rows = 3;
        let x = rand_vec(rows * d_in, 4);
        let run = |gpu: &Gpu, w: &StackedWeight| {
            let (dx, dy) = (
                gpu.upload(&x).unwrap(),
                gpu.zeros::<f32>(rows * d_out).unwrap(),
            );
            stacked_product(gpu, &dy, &dx, rows, w).unwrap();
            let ids = gpu.upload(&[0u32, 6, 7, 49, 23, 50, 1000]).unwrap();
            let out = gpu.zeros::<f32>(7 * d_in).unwrap();
            gather_stacked(gpu, &out, &ids, w).unwrap();
            (gpu.read(&dy).unwrap(), gpu.read(&out).unwrap())
        };
        let (want, got) = (run(shared, &whole), run(&cut, &pieces));
        assert_eq!(got.0, want.0, "{format}: products");
        assert_eq!(got.1, want.1, "{format}: lookups");
        assert!(
            want.1[5 * d_in..].iter().all(|&v| v == 0.0),
            "ids past the table: zeros"
        );
    }
}
