//! A weight held only as `Wᵀ` (the layout [`transpose_weight`] makes: `Wᵀ [d_in, d_out]`, or,
//! for a vocabulary-sized `d_out`, `⌈d_out / PANEL⌉` contiguous panels `[d_in, width]` of
//! [`PANEL`] outputs, the last one narrower), with no copy of `W [d_out, d_in]` beside it:
//!
//! - a product of a few rows, `y[r, o] = Σ_i x[r, i] · Wᵀ[i, o]` ([`matvec_transposed`]): each
//!   panel (or band of `Wᵀ`'s columns) streamed once, row `i` of it scaled by `x[r, i]` and added
//!   into the outputs of its columns, for every row `r` at once;
//! - row `o` of `W` read back, `W[o, i] = Wᵀ[i, o]` ([`transposed_row`]): a token's embedding
//!   when the output projection's `Wᵀ` is the table's one copy;
//! - `W` turned into `Wᵀ` in its own memory where it is panelled ([`into_transposed`]): panel `p`
//!   is the transpose of `W`'s rows `p · PANEL ..`, which lie at the same offsets, so each block
//!   is transposed in place through a panel-sized scratch and a vocabulary-sized table never
//!   exists twice.
//!
//! Every output of [`matvec_transposed`] is summed over `i` in order, by the same loop whatever
//! the row count, the thread count or the band it falls in: a row's result is the one-row
//! result bit for bit (what `row_exact` asks of products).

use super::matmul::{transpose_weight, PANEL, PANELLED_OUT};
use crate::Float;
use rayon::prelude::*;

/// Columns of a plain (unpanelled) `Wᵀ` per parallel task of [`matvec_transposed`]: 1 KiB of
/// f32 per row of `Wᵀ` read contiguously.
const BAND: usize = 256;

/// The width of the blocks `Wᵀ` is held in: [`PANEL`] for a vocabulary-sized `d_out`, else the
/// whole `d_out` (one block, `Wᵀ` itself).
pub fn block_width(d_out: usize) -> usize {
    if d_out >= PANELLED_OUT {
        PANEL
    } else {
        d_out
    }
}

/// `y [rows, d_out] = x [rows, d_in] · Wᵀ` from `w_t`, `Wᵀ` as [`transpose_weight`] lays it out;
/// `parallel`: panels (or bands of columns) on the rayon pool's threads.
pub fn matvec_transposed<T: Float>(
    y: &mut [T],
    x: &[T],
    w_t: &[T],
    d_in: usize,
    d_out: usize,
    parallel: bool,
) {
    assert!(d_in > 0 && x.len().is_multiple_of(d_in), "x is not [rows, d_in]");
    let rows = x.len() / d_in;
    assert_eq!(w_t.len(), d_in * d_out, "Wᵀ is not [d_in, d_out]");
    assert_eq!(y.len(), rows * d_out, "y is not [rows, d_out]");
    if rows == 0 || d_out == 0 {
        return;
    }
    let width = block_width(d_out);
    // The tasks: (first output column, block of Wᵀ it lies in, its column in the block, columns).
    let tasks: Vec<(usize, usize, usize, usize)> = if width == d_out {
        (0..d_out)
            .step_by(BAND)
            .map(|c0| (c0, 0, c0, BAND.min(d_out - c0)))
            .collect()
    } else {
        (0..d_out)
            .step_by(PANEL)
            .map(|o0| (o0, o0 / PANEL, 0, PANEL.min(d_out - o0)))
            .collect()
    };
    let block_of = |b: usize| {
        let start = b * width * d_in;
        let w = width.min(d_out - b * width);
        (&w_t[start..start + w * d_in], w)
    };
    let run = |&(_, b, c0, n): &(usize, usize, usize, usize)| -> Vec<T> {
        let (block, w) = block_of(b);
        // out: [rows, n]
        let mut out = vec![T::zero(); rows * n];
        pulp::Arch::new().dispatch(Axpys {
            out: &mut out,
            x,
            block,
            width: w,
            cols: c0..c0 + n,
        });
        out
    };
    let outs: Vec<Vec<T>> = if parallel {
        tasks.par_iter().map(run).collect()
    } else {
        tasks.iter().map(run).collect()
    };
    for (&(o0, _, _, n), out) in tasks.iter().zip(&outs) {
        for (r, row) in out.chunks_exact(n).enumerate() {
            y[r * d_out + o0..r * d_out + o0 + n].copy_from_slice(row);
        }
    }
}

/// `out [rows, cols.len()]`: columns `cols` of `block [d_in, width]` against every row of
/// `x [rows, d_in]`, `out[r, j] = Σ_i x[r, i] · block[i, cols.start + j]`, `i` in order. A
/// `WithSimd` type so that its `#[inline(always)]` body is compiled into each of pulp's
/// target-feature functions (the inner loop over contiguous columns vectorises).
struct Axpys<'a, T> {
    out: &'a mut [T],
    x: &'a [T],
    block: &'a [T],
    width: usize,
    cols: std::ops::Range<usize>,
}

impl<T: Float> pulp::WithSimd for Axpys<'_, T> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        let Axpys {
            out,
            x,
            block,
            width,
            cols,
        } = self;
        let n = cols.len();
        let d_in = block.len() / width;
        for (i, w_row) in block.chunks_exact(width).enumerate() {
            let w = &w_row[cols.clone()];
            for (o, x_row) in out.chunks_exact_mut(n).zip(x.chunks_exact(d_in)) {
                let a = x_row[i];
                for (v, &wv) in o.iter_mut().zip(w) {
                    *v += a * wv;
                }
            }
        }
    }
}

/// Row `o` of `W [d_out, d_in]` from `w_t`, `Wᵀ` as [`transpose_weight`] lays it out, into
/// `out [d_in]`.
pub fn transposed_row<T: Float>(w_t: &[T], d_out: usize, d_in: usize, o: usize, out: &mut [T]) {
    assert!(o < d_out, "row {o} of a weight of {d_out} rows");
    assert_eq!(out.len(), d_in, "out is not [d_in]");
    let width = block_width(d_out);
    let b = o / width;
    let w = width.min(d_out - b * width);
    let block = &w_t[b * width * d_in..b * width * d_in + w * d_in];
    for (v, row) in out.iter_mut().zip(block.chunks_exact(w)) {
        *v = row[o % width];
    }
}

/// `W [d_out, d_in]` -> `Wᵀ` as [`transpose_weight`] lays it out, in `W`'s own memory where it
/// is panelled (each panel through a scratch of its size, panels side by side on the pool's
/// threads); otherwise into a new vector (`W` dropped after).
pub fn into_transposed<T: Float>(mut w: Vec<T>, d_out: usize, d_in: usize) -> Vec<T> {
    assert_eq!(w.len(), d_out * d_in, "W is not [d_out, d_in]");
    if d_out < PANELLED_OUT || d_in == 0 {
        return transpose_weight(&w, d_out, d_in);
    }
    w.par_chunks_mut(PANEL * d_in).for_each(|rows| {
        // Fewer than PANELLED_OUT rows: the plain transpose of the block, [d_in, width].
        let t = transpose_weight(rows, rows.len() / d_in, d_in);
        rows.copy_from_slice(&t);
    });
    w
}

#[cfg(test)]
mod tests {
    use super::super::matvec::matvec;
    use super::*;
    use crate::rng::Rng;

    fn random(rng: &mut Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.uniform() as f32 - 0.5).collect()
    }

    /// Against the float64 sum of products and against the product from `W` as stored
    /// (`matvec`), for 1 to 5 rows, plain `Wᵀ` (widths on and off a band) and panels (a
    /// narrower last one); serial, parallel and row by row give the same bits.
    #[test]
    fn products_from_the_transpose_are_the_f64_products_and_row_exact() {
        let mut rng = Rng::new(11);
        for (rows, d_in, d_out) in [
            (1, 48, 40),
            (2, 37, 300),
            (4, 64, 1024),
            (3, 20, PANELLED_OUT + 37),
            (5, 17, PANELLED_OUT),
        ] {
            let x = random(&mut rng, rows * d_in);
            let w = random(&mut rng, d_out * d_in);
            let w_t = transpose_weight(&w, d_out, d_in);
            let mut serial = vec![f32::NAN; rows * d_out];
            let mut parallel = vec![f32::NAN; rows * d_out];
            matvec_transposed(&mut serial, &x, &w_t, d_in, d_out, false);
            matvec_transposed(&mut parallel, &x, &w_t, d_in, d_out, true);
            assert_eq!(serial, parallel, "{rows}x{d_in} -> {d_out}");
            let mut from_w = vec![f32::NAN; rows * d_out];
            matvec(&mut from_w, &x, &w, d_in, true);
            for r in 0..rows {
                let mut one = vec![f32::NAN; d_out];
                matvec_transposed(&mut one, &x[r * d_in..(r + 1) * d_in], &w_t, d_in, d_out, true);
                assert_eq!(one, serial[r * d_out..(r + 1) * d_out], "row {r} alone");
                for o in 0..d_out {
                    let want: f64 = (0..d_in)
                        .map(|i| f64::from(x[r * d_in + i]) * f64::from(w[o * d_in + i]))
                        .sum();
                    let got = f64::from(serial[r * d_out + o]);
                    assert!((got - want).abs() < 1e-4, "({r}, {o}): {got} vs {want}");
                    let stored = f64::from(from_w[r * d_out + o]);
                    assert!((got - stored).abs() < 1e-4, "({r}, {o}): {got} vs W's {stored}");
                }
            }
        }
    }

    /// `weight_product` of a weight held only as `Wᵀ` (an empty `W`): any number of rows, on
    /// both sides of every threshold (a few rows, gemm, the panels past their usual rows).
    #[test]
    fn weight_products_read_the_transpose_when_it_is_the_only_form() {
        use super::super::matmul::weight_product;
        let mut rng = Rng::new(5);
        for (d_in, d_out) in [(24, 70), (8, PANELLED_OUT + 5)] {
            let w = random(&mut rng, d_out * d_in);
            let w_t = transpose_weight(&w, d_out, d_in);
            for rows in [1, 4, 5, 40, 300] {
                let x = random(&mut rng, rows * d_in);
                let mut y = vec![f32::NAN; rows * d_out];
                weight_product(&mut y, &x, &[], Some(&w_t), rows, d_in, d_out);
                for (e, &got) in y.iter().enumerate().step_by(7) {
                    let (r, o) = (e / d_out, e % d_out);
                    let want: f64 = (0..d_in)
                        .map(|i| f64::from(x[r * d_in + i]) * f64::from(w[o * d_in + i]))
                        .sum();
                    assert!((f64::from(got) - want).abs() < 1e-4, "{rows} rows ({r}, {o})");
                }
            }
        }
    }

    /// Small integers: every product and sum is exact in f64, so the product is exact.
    #[test]
    fn f64_rows_are_exact() {
        let (d_in, d_out) = (3, 2);
        let w = [1.0f64, 0.0, -1.0, 2.0, 2.0, 2.0];
        let x = [1.0f64, 2.0, 3.0, 0.5, -1.0, 4.0];
        let w_t = transpose_weight(&w, d_out, d_in);
        let mut y = [0.0f64; 4];
        matvec_transposed(&mut y, &x, &w_t, d_in, d_out, true);
        assert_eq!(y, [-2.0, 12.0, -3.5, 7.0]);
    }

    /// The rows read back are W's, and the in-place transpose is `transpose_weight`'s, panelled
    /// (a narrower last panel) and plain.
    #[test]
    fn rows_read_back_and_the_in_place_transpose() {
        for (d_out, d_in) in [(PANELLED_OUT + 70, 9), (100, 13), (PANELLED_OUT, 1)] {
            let w: Vec<f32> = (0..d_out * d_in).map(|v| v as f32).collect();
            let want = transpose_weight(&w, d_out, d_in);
            let t = into_transposed(w.clone(), d_out, d_in);
            assert_eq!(t, want, "{d_out}x{d_in}");
            let mut row = vec![0f32; d_in];
            for o in [0, 1, 63, 64, d_out / 2, d_out - 1] {
                transposed_row(&t, d_out, d_in, o, &mut row);
                assert_eq!(row, w[o * d_in..(o + 1) * d_in], "row {o} of {d_out}x{d_in}");
            }
        }
    }
}
