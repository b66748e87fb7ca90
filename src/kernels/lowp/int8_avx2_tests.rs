//! The AVX2 int8 kernel against the portable one: the activation quantisers byte for byte,
//! the group plan against a plain loop, and the products bit for bit on every shape class.

use super::super::tests::Lcg;
use super::super::{has_avx2, int8, Int8Matrix, Kernel};

/// `y [rows, d_out] = x Wᵀ` by `kernel` (`y` starts as NaN: every output must be written).
fn product(m: &Int8Matrix, kernel: Kernel, x: &[f32], rows: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; rows * m.rows()];
    m.product(kernel, &mut y, x, rows);
    y
}

/// The AVX2 activation quantiser gives the portable one's bits (scale and bytes) on rows
/// shorter than a vector, with tails of 8 and of 32, all-zero rows, tiny values and a grid
/// of halves (ties).
#[test]
fn activation_quantiser_gives_the_portable_bits() {
    if !has_avx2() {
        eprintln!("skipped: no AVX2 on this CPU");
        return;
    }
    let mut rng = Lcg(3);
    for len in [1, 7, 8, 9, 31, 32, 33, 45, 64, 100, 1000] {
        for case in 0..4 {
            let row: Vec<f32> = (0..len)
                .map(|i| match case {
                    0 => rng.unit_f32() * 3.0,
                    1 => 0.0,
                    2 => (i % 255) as f32 / 2.0 - 63.5,
                    _ => rng.unit_f32() * 1e-30,
                })
                .collect();
            let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
            let sa = int8::quantize_row(&row, &mut a);
            // SAFETY: has_avx2() checked above.
            let sb = unsafe { super::quantize_row(&row, &mut b) };
            assert_eq!(sa.to_bits(), sb.to_bits(), "scale, len {len} case {case}");
            assert_eq!(a, b, "bytes, len {len} case {case}");
            // The signed form: p = u - 128 itself, and whether any p is below 0.
            let mut p = vec![0u8; len];
            // SAFETY: has_avx2() checked above.
            let (sp, bits) = unsafe { super::quantize_row_signed(&row, &mut p) };
            assert_eq!(sa.to_bits(), sp.to_bits(), "signed scale, len {len} case {case}");
            let want: Vec<u8> = a.iter().map(|u| u ^ 0x80).collect();
            assert_eq!(p, want, "signed bytes, len {len} case {case}");
            let negative = a.iter().any(|&u| u < 128);
            assert_eq!(bits & 0x80 != 0, negative, "sign, len {len} case {case}");
        }
    }
}

/// The AVX2 product, run explicitly, equals the portable one bit for bit (the integer sums
/// are exact) on every shape class: rows 1..7 and 17 (tile remainders), d_in shorter than a
/// group of 4 and than a vector, not a multiple of 32 or 64; d_out not a multiple of the
/// 16-output panel or of the 64-output group. Values: random, and the extremes where
/// `vpmaddubsw` on `u = p + 128` would saturate (every q and p at ±127, same signs); and
/// activations that are all at least 0 (after a ReLU: `run_non_negative`), random with
/// every third row all zero, and all at the maximum against weights at ±127.
#[test]
fn avx2_product_equals_the_portable_one_bit_for_bit() {
    if !has_avx2() {
        eprintln!("skipped: no AVX2 on this CPU");
        return;
    }
    let mut rng = Lcg(5);
    for d_in in [1, 3, 5, 31, 33, 45, 64, 100, 257] {
        for d_out in [1, 7, 16, 17, 33, 64, 70, 130] {
            for rows in [1, 2, 3, 4, 5, 7, 17] {
                for case in 0..5 {
                    let mut value = |i: usize| match case {
                        0 | 3 => rng.unit_f32(),
                        // All ±max with the same sign: the largest pairs.
                        1 => 1.0,
                        _ => {
                            if i.is_multiple_of(3) {
                                -1.0
                            } else {
                                1.0
                            }
                        }
                    };
                    let w: Vec<f32> = (0..d_out * d_in).map(&mut value).collect();
                    let x: Vec<f32> = match case {
                        // A ReLU's output, every third row all zero.
                        3 => (0..rows * d_in)
                            .map(|i| {
                                let v = rng.unit_f32().max(0.0);
                                if (i / d_in).is_multiple_of(3) {
                                    0.0
                                } else {
                                    v
                                }
                            })
                            .collect(),
                        // Every p at 127 against q at ±127.
                        4 => vec![0.5; rows * d_in],
                        _ => (0..rows * d_in).map(|i| value(i / d_in) * 2.0).collect(),
                    };
                    let m = Int8Matrix::from_f32(&w, d_out, d_in).unwrap();
                    let run = |kernel| product(&m, kernel, &x, rows);
                    let want = run(Kernel::Portable);
                    // Both forms where the CPU has AVX-VNNI (the switch changes no bits,
                    // so other tests running meanwhile are unaffected).
                    super::set_plain_avx2(true);
                    let plain = run(Kernel::Avx2);
                    super::set_plain_avx2(false);
                    let got = run(Kernel::Avx2);
                    let same = want
                        .iter()
                        .zip(&got)
                        .chain(want.iter().zip(&plain))
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{d_out}x{d_in} rows {rows} case {case}: {want:?} vs {got:?}"
                    );
                    if case == 1 {
                        // Σ 127 · 127 over d_in, times s t = (1/127)(2/127): 2 d_in.
                        let exact = 2.0 * d_in as f32;
                        let near = |v: &f32| (v - exact).abs() <= 1e-6 * exact;
                        assert!(want.iter().all(near), "{want:?}");
                    }
                }
            }
        }
    }
}

/// The plan of a plain loop: per tile of four rows, each pair of groups `(g, g + 1)` whose
/// every row keeps both i16 lanes' `Σ |p|` within the bound; every group in exactly one list.
#[test]
fn group_plan_matches_a_plain_loop() {
    if !has_avx2() {
        eprintln!("skipped: no AVX2 on this CPU");
        return;
    }
    let mut rng = Lcg(11);
    for groups in [1, 2, 3, 7, 8, 9, 16, 17, 64, 65, 256, 257] {
        let stride = 4 * groups;
        for rows in [1, 3, 4, 5, 9] {
            for spread in [40, 70, 128] {
                // Lane sums around the bound (258): values up to `spread`, some rows at 127.
                let magnitude: Vec<u8> = (0..rows * stride)
                    .map(|i| match rng.next() % 50 {
                        0 => 127,
                        _ if i % 97 == 5 => 0,
                        _ => (rng.next() % spread) as u8,
                    })
                    .collect();
                let plan = super::GroupPlan::new(&magnitude, stride, rows);
                for r0 in (0..rows).step_by(4) {
                    let (twos, ones) = plan.tile(r0);
                    let (mut want_twos, mut want_ones) = (vec![], vec![]);
                    for g in (0..groups).step_by(2) {
                        let fits = g + 1 < groups
                            && (r0..(r0 + 4).min(rows)).all(|r| {
                                [0, 2].iter().all(|&j| {
                                    let at = r * stride + 4 * g + j;
                                    let s: u32 = [0, 1, 4, 5]
                                        .iter()
                                        .map(|&k| u32::from(magnitude[at + k]))
                                        .sum();
                                    s <= 258
                                })
                            });
                        if fits {
                            want_twos.push(g as u32);
                        } else {
                            want_ones.extend((g..(g + 2).min(groups)).map(|g| g as u32));
                        }
                    }
                    let what = format!("groups {groups} rows {rows} spread {spread} tile {r0}");
                    assert_eq!(twos, &want_twos[..], "{what}");
                    assert_eq!(ones, &want_ones[..], "{what}");
                }
            }
        }
    }
}

/// Pairs of groups added in i16 at the bound: four inputs with `|p|` 127, 127, 4 and 0 behind
/// each lane against weights at ±127 sum to ±32,766, exact; with 5 instead of 4 (±32,893, past
/// i16) the plan takes those groups alone. Signed and non-negative activations, both signs of
/// the sums; the product equals the portable one bit for bit and the exact value.
#[test]
fn groups_added_in_i16_stay_exact_at_the_bound() {
    if !has_avx2() {
        eprintln!("skipped: no AVX2 on this CPU");
        return;
    }
    let (d_in, d_out) = (64, 20);
    for (sign_x, sign_w) in [(1.0, 1.0), (-1.0, -1.0), (-1.0, 1.0), (1.0, -1.0)] {
        // Rows 0..4 (the first tile) at the bound; row 5 of the second tile past it.
        let rows = 7;
        let x: Vec<f32> = (0..rows * d_in)
            .map(|i| {
                let (r, k) = (i / d_in, i % d_in);
                let extra = if r == 5 { 5.0 } else { 4.0 };
                let p = match k % 8 {
                    0 | 1 => 127.0,
                    4 => extra,
                    _ => 0.0,
                };
                sign_x * p / 127.0
            })
            .collect();
        let w = vec![sign_w; d_out * d_in];
        let m = Int8Matrix::from_f32(&w, d_out, d_in).unwrap();
        super::set_plain_avx2(true);
        let (want, got) = (
            product(&m, Kernel::Portable, &x, rows),
            product(&m, Kernel::Avx2, &x, rows),
        );
        super::set_plain_avx2(false);
        let same = want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "signs {sign_x} {sign_w}: {want:?} vs {got:?}");
        for (i, v) in want.iter().enumerate() {
            // Σ over the row's 8 blocks of 8 inputs: 127 · (127 + 127 + extra), times
            // s t = (1/127)(1/127).
            let extra = if i / d_out == 5 { 5.0 } else { 4.0 };
            let exact = sign_x * sign_w * 8.0 * (254.0 + extra) / 127.0;
            assert!((v - exact).abs() <= 1e-5 * exact.abs(), "{v} vs {exact}");
        }
        // The plan: the first tile adds its groups two at a time, the second takes them alone.
        let u: Vec<u8> = x
            .chunks(d_in)
            .flat_map(|row| {
                let mut b = vec![0u8; d_in];
                // SAFETY: has_avx2() checked above.
                unsafe { super::quantize_row_signed(row, &mut b) };
                b.into_iter().map(|p| (p as i8).unsigned_abs())
            })
            .collect();
        let plan = super::GroupPlan::new(&u, d_in, rows);
        assert_eq!(plan.tile(0), (&[0, 2, 4, 6, 8, 10, 12, 14][..], &[][..]));
        assert_eq!(plan.tile(4).0, &[] as &[u32]);
    }
}
