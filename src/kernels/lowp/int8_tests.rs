//! Tests of `int8`: rows given quantised kept as given, the signed-activation flag, the activation quantisers agreeing.

use super::*;

/// Rows given already quantised are laid out exactly as `from_f32` lays out its own.
#[test]
fn quantised_rows_are_kept_as_given() {
    let w: Vec<f32> = (0..3 * 37).map(|i| ((i * 7919) % 23) as f32 - 11.0).collect();
    let a = Int8Matrix::from_f32(&w, 3, 37).unwrap();
    let q: Vec<i8> = (0..3 * 37).map(|i| a.q_at(i / 37, i % 37)).collect();
    let b = Int8Matrix::from_quantized(&q, &a.scale[..3], 3, 37).unwrap();
    assert_eq!((&b.q, &b.scale, &b.row_sum), (&a.q, &a.scale, &a.row_sum));
    assert!(Int8Matrix::from_quantized(&q, &a.scale[..2], 3, 37).is_err());
    let mut bad = q.clone();
    bad[5] = i8::MIN;
    assert!(Int8Matrix::from_quantized(&bad, &a.scale[..3], 3, 37).is_err());
    assert!(Int8Matrix::from_quantized(&q, &[1.0, f32::NAN, 1.0], 3, 37).is_err());
}

/// The plain AVX2 form of the activations is `p` itself, padded with 0, and knows when
/// every `p` is at least 0 (so that the product takes `run_non_negative`): a ReLU's output
/// and all-zero rows are; one value below 0 anywhere is not.
#[test]
fn signed_activations_say_when_none_is_below_zero() {
    if !super::super::has_avx2() {
        eprintln!("skipped: no AVX2 on this CPU");
        return;
    }
    let m = Int8Matrix::from_f32(&[1.0; 3 * 45], 3, 45).unwrap();
    let relu: Vec<f32> = (0..2 * 45).map(|i| (i % 7) as f32 * 0.25).collect();
    let acts = m.quantize_acts(Kernel::Avx2, &relu, 2, true);
    assert!(acts.signed && acts.non_negative && acts.magnitude.is_empty());
    assert_eq!(acts.stride, 48);
    assert_eq!(&acts.u[45..48], &[0, 0, 0], "padding is p = 0");
    assert_eq!(acts.u[6], 127, "the row's maximum is 127");
    let zeros = m.quantize_acts(Kernel::Avx2, &[0.0; 45], 1, true);
    assert!(zeros.non_negative);
    let mut one_below = relu.clone();
    one_below[60] = -0.1;
    let acts = m.quantize_acts(Kernel::Avx2, &one_below, 2, true);
    assert!(!acts.non_negative);
    let p_abs: Vec<u8> = acts.u.iter().map(|&p| (p as i8).unsigned_abs()).collect();
    assert_eq!(acts.magnitude, p_abs, "|p| beside p");
    // x[60] is row 1, column 15: u[48 + 15].
    assert_eq!(acts.u[63] as i8, -8, "-0.1 / (1.5 / 127) rounds to -8");
    // -1e-3 against a maximum of 1.5 rounds to p = 0: not below 0 as an integer.
    let mut rounds_to_zero = relu.clone();
    rounds_to_zero[60] = -1e-3;
    let acts = m.quantize_acts(Kernel::Avx2, &rounds_to_zero, 2, true);
    assert!(acts.non_negative);
    let u = m.quantize_acts(Kernel::Avx2, &relu, 2, false);
    assert!(!u.signed && !u.non_negative);
}

/// The AVX-512 activation quantiser gives the portable one's bits: scale and bytes, on
/// rows with and without a tail of 16, all-zero rows, tiny values, a grid of halves.
#[test]
fn activation_quantisers_agree() {
    if !super::super::has_vnni() {
        eprintln!("skipped: no AVX-512 on this CPU");
        return;
    }
    let mut state = 1u64;
    let mut next = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        ((state >> 33) % 2001) as f32 / 1000.0 - 1.0
    };
    for len in [1, 15, 16, 17, 45, 64, 256, 1000] {
        for case in 0..4 {
            let row: Vec<f32> = (0..len)
                .map(|i| match case {
                    0 => next() * 3.0,
                    1 => 0.0,
                    // Half-integers: the products with 1 / t land on integers.
                    2 => (i % 255) as f32 / 2.0 - 63.5,
                    _ => next() * 1e-30,
                })
                .collect();
            let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
            let sa = quantize_row(&row, &mut a);
            // SAFETY: has_vnni() includes AVX-512F.
            let sb = unsafe { quantize_row_avx512(&row, &mut b) };
            assert_eq!(sa.to_bits(), sb.to_bits(), "scale, len {len} case {case}");
            assert_eq!(a, b, "bytes, len {len} case {case}");
        }
    }
}
