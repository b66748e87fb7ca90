//! Deterministic reductions: partial sums over fixed chunks of rows, added in a fixed order, so
//! a run gives the same bits whatever the thread schedule (exact resume depends on it).

use crate::Float;
use rayon::prelude::*;

/// Rows per partial sum. Fixed, so results do not depend on the number of threads.
const CHUNK_ROWS: usize = 64;

/// `out[c] += Σ_r x[r, c]` for row-major `x [rows, cols]`.
pub fn add_column_sums<T: Float>(out: &mut [T], x: &[T], cols: usize) {
    assert_eq!(out.len(), cols);
    if cols == 0 || x.is_empty() {
        return;
    }
    let partials: Vec<Vec<T>> = x
        .par_chunks(CHUNK_ROWS * cols)
        .map(|chunk| {
            let mut acc = vec![T::zero(); cols];
            for row in chunk.chunks_exact(cols) {
                for (a, &v) in acc.iter_mut().zip(row) {
                    *a += v;
                }
            }
            acc
        })
        .collect();
    for p in partials {
        for (o, v) in out.iter_mut().zip(p) {
            *o += v;
        }
    }
}

/// `out[c] += Σ_r f(r, c)` computed chunk by chunk: for column-wise reductions of products
/// (layer-norm gain gradients) without materialising the product.
pub fn add_column_sums_with<T: Float, F>(out: &mut [T], rows: usize, f: F)
where
    F: Fn(usize, &mut [T]) + Sync,
{
    let cols = out.len();
    let n_chunks = rows.div_ceil(CHUNK_ROWS);
    let partials: Vec<Vec<T>> = (0..n_chunks)
        .into_par_iter()
        .map(|ci| {
            let mut acc = vec![T::zero(); cols];
            for r in ci * CHUNK_ROWS..((ci + 1) * CHUNK_ROWS).min(rows) {
                f(r, &mut acc);
            }
            acc
        })
        .collect();
    for p in partials {
        for (o, v) in out.iter_mut().zip(p) {
            *o += v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_sums_match_serial() {
        let (rows, cols) = (200, 3);
        let x: Vec<f64> = (0..rows * cols).map(|i| (i % 13) as f64).collect();
        let mut out = vec![1.0; cols];
        add_column_sums(&mut out, &x, cols);
        for c in 0..cols {
            let want: f64 = 1.0 + (0..rows).map(|r| x[r * cols + c]).sum::<f64>();
            assert_eq!(out[c], want);
        }
        let mut out2 = vec![0.0; cols];
        add_column_sums_with(&mut out2, rows, |r, acc: &mut [f64]| {
            for c in 0..cols {
                acc[c] += 2.0 * x[r * cols + c];
            }
        });
        for c in 0..cols {
            assert_eq!(out2[c], 2.0 * (out[c] - 1.0));
        }
    }
}
