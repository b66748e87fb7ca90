//! Tests of `embedding`: stored rows, long sinusoid tables, Marian's halves.

use super::*;

/// A table looked up in its stored Q8_0 blocks gives the rows of the dequantised table,
/// holds no float32 values, and refuses data of the wrong size.
#[test]
fn stored_rows_are_the_dequantised_table() {
    let (vocab, d) = (5, 64);
    let mut rng = Rng::new(3);
    let mut data = Vec::new();
    for _ in 0..vocab * d / 32 {
        // f16 scales between 2^-8 and 2^-5, then 32 signed bytes.
        let scale: u16 = 0x1c00 + (rng.next_u64() % 0x0c00) as u16;
        data.extend_from_slice(&scale.to_le_bytes());
        data.extend((0..32).map(|_| rng.next_u64() as u8));
    }
    let table = {
        let mut t = vec![0f32; vocab * d];
        CPU.dequantise_ggml(GgmlType::Q8_0, &data, &mut t).unwrap();
        t
    };
    let mut plain =
        Embedding::<f32>::with_positions(vocab, d, 8, Positions::Rotary, &mut rng).unscaled();
    plain.weight.value.data.copy_from_slice(&table);
    let mut stored = plain.clone();
    assert!(stored
        .set_stored_rows(
            GgmlType::Q8_0,
            RawBytes::owned(data[..data.len() - 34].to_vec())
        )
        .unwrap_err()
        .contains("needs"));
    stored
        .set_stored_rows(GgmlType::Q8_0, RawBytes::owned(data))
        .unwrap();
    assert!(stored.weight.value.data.is_empty() && stored.has_stored_rows());
    assert_eq!(stored.vocab_size(), vocab);
    let tokens = [4, 0, 2, 2, 1, 3];
    let (want, _) = plain.forward(&tokens, 3, 0, 0.0, None);
    let (got, _) = stored.forward(&tokens, 3, 0, 0.0, None);
    assert_eq!(got, want);
    for (r, &t) in tokens.iter().enumerate() {
        assert_eq!(
            got[r * d..(r + 1) * d],
            table[t as usize * d..(t as usize + 1) * d]
        );
    }
}

/// A context of 2^20 positions keeps a table of SINUSOID_TABLE_ROWS rows; positions
/// past it get the paper's values, computed (position 1,000,000: `sin(10^6 / 10000^(2i/d))`).
#[test]
fn long_contexts_keep_a_bounded_sinusoid_table() {
    let (vocab, d, context) = (4, 8, 1 << 20);
    let mut rng = Rng::new(5);
    let e = Embedding::<f64>::with_positions(vocab, d, context, Positions::Sinusoidal, &mut rng)
        .unscaled();
    assert_eq!(e.position_rows(), SINUSOID_TABLE_ROWS);
    assert_eq!(e.max_len(), context);
    for pos in [SINUSOID_TABLE_ROWS - 1, SINUSOID_TABLE_ROWS, 1_000_000, context - 1] {
        let (x, _) = e.forward(&[2], 1, pos, 0.0, None);
        for (dim, &got) in x.iter().enumerate() {
            let angle = pos as f64 / 10000f64.powf((dim - dim % 2) as f64 / d as f64);
            let pe = if dim % 2 == 0 { angle.sin() } else { angle.cos() };
            let want = e.weight.value.data[2 * d + dim] + pe;
            assert!((got - want).abs() < 1e-12, "pos {pos} dim {dim}: {got} vs {want}");
        }
    }
}

#[test]
fn sinusoid_matches_the_paper() {
    // PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...)
    let d = 8;
    assert_eq!(sinusoid(0, 0, d), 0.0);
    assert_eq!(sinusoid(0, 1, d), 1.0);
    assert!((sinusoid(3, 4, d) - (3.0f64 / 10000f64.powf(4.0 / 8.0)).sin()).abs() < 1e-15);
    assert!((sinusoid(3, 5, d) - (3.0f64 / 10000f64.powf(4.0 / 8.0)).cos()).abs() < 1e-15);
}

/// Marian's halves are the paper's columns reordered: even columns first, then the odd
/// ones (odd widths too, where the sines take one more column); past the precomputed table
/// the computed rows are the same values.
#[test]
fn sinusoid_halves_are_the_papers_columns_reordered() {
    for d in [8usize, 7] {
        let sines = d.div_ceil(2);
        for pos in [0, 1, 5, 77] {
            for i in 0..d {
                let paper = if i < sines { 2 * i } else { 2 * (i - sines) + 1 };
                assert_eq!(sinusoid_halves(pos, i, d), sinusoid(pos, paper, d), "{d} {pos} {i}");
            }
        }
    }
    let d = 6;
    let e = Embedding::<f64>::with_positions(3, d, 1 << 14, Positions::SinusoidalHalves, &mut Rng::new(2))
        .unscaled();
    for pos in [3, SINUSOID_TABLE_ROWS + 3] {
        let (x, _) = e.forward(&[1], 1, pos, 0.0, None);
        for (dim, &got) in x.iter().enumerate() {
            let want = e.weight.value.data[d + dim] + sinusoid_halves(pos, dim, d);
            assert!((got - want).abs() < 1e-12, "pos {pos} dim {dim}");
        }
    }
}
