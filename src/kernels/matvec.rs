//! `y = x Wᵀ` for a few rows `x [rows, d_in]` and a weight in PyTorch's layout `W [d_out, d_in]`
//! (row-major), as dot products along W's contiguous rows:
//! `y[r, o] = Σ_i x[r, i] · W[o, i]`.
//!
//! A decoding step of one sequence multiplies one row by every weight matrix: that is
//! memory-bound, its time the time to stream the weights once. A general matrix multiply either
//! repacks W on every call or needs a transposed copy of it (twice the memory), and its
//! column-major matrix-vector path streamed the weights more slowly here; reading each row of W
//! once, in the order it is stored, with the `rows` dot products of that row side by side,
//! does neither. Blocks of `BLOCK` (64) rows of W are shared between the threads; every output is
//! computed by the same `dot4` (or, for the last rows of a weight whose row count is not a
//! multiple of four, [`lane_dot`]) whatever the thread count, so results do not depend on it. The loops are
//! compiled for the machine's widest vectors at run time (`pulp`).

use super::reduce::{lane_dot, tree_sum, LANES};
use crate::Float;
use rayon::prelude::*;

/// At most this many rows of `x` go through [`matvec`] (see `weight_product`); more rows
/// reuse each weight often enough that a blocked matrix multiply is faster.
pub const MATVEC_MAX_ROWS: usize = 4;

/// Rows of W per parallel task.
const BLOCK: usize = 64;

/// `y [rows, d_out] = x [rows, d_in] · Wᵀ` for `w [d_out, d_in]`; `parallel`: blocks of W's
/// rows on the rayon pool's threads.
pub fn matvec<T: Float>(y: &mut [T], x: &[T], w: &[T], d_in: usize, parallel: bool) {
    assert!(
        d_in > 0 && x.len().is_multiple_of(d_in),
        "x is not [rows, d_in]"
    );
    let rows = x.len() / d_in;
    assert!(
        w.len().is_multiple_of(d_in),
        "the weight is not [d_out, d_in]"
    );
    let d_out = w.len() / d_in;
    assert_eq!(y.len(), rows * d_out, "y is not [rows, d_out]");
    if rows == 0 || d_out == 0 {
        return;
    }
    let block = |w_block: &[T]| -> Vec<T> {
        // out: [BLOCK, rows], W's row o of the block against every row of x
        let mut out = vec![T::zero(); w_block.len() / d_in * rows];
        pulp::Arch::new().dispatch(Dots {
            out: &mut out,
            x,
            w: w_block,
            d_in,
        });
        out
    };
    let scatter = |y: &mut [T], b: usize, out: &[T]| {
        for (j, dots) in out.chunks_exact(rows).enumerate() {
            for (r, &v) in dots.iter().enumerate() {
                y[r * d_out + b * BLOCK + j] = v;
            }
        }
    };
    if rows == 1 {
        // One row: `y` is already laid out as the blocks' outputs, no scatter needed (serially,
        // the whole weight is one block: the same groups of four rows, so the same bits).
        let dots =
            |(y, w): (&mut [T], &[T])| pulp::Arch::new().dispatch(Dots { out: y, x, w, d_in });
        if parallel {
            y.par_chunks_mut(BLOCK)
                .zip(w.par_chunks(BLOCK * d_in))
                .for_each(dots);
        } else {
            dots((y, w));
        }
    } else if parallel {
        let outs: Vec<Vec<T>> = w.par_chunks(BLOCK * d_in).map(block).collect();
        outs.iter().enumerate().for_each(|(b, o)| scatter(y, b, o));
    } else {
        for (b, w) in w.chunks(BLOCK * d_in).enumerate() {
            scatter(y, b, &block(w));
        }
    }
}

/// `out [w rows, x rows]`: every row of `w` dotted with every row of `x`. A `WithSimd` type
/// so that its `#[inline(always)]` body is compiled into each of pulp's target-feature
/// functions.
struct Dots<'a, T> {
    out: &'a mut [T],
    x: &'a [T],
    w: &'a [T],
    d_in: usize,
}

impl<T: Float> pulp::WithSimd for Dots<'_, T> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        let Dots { out, x, w, d_in } = self;
        let rows = x.len() / d_in;
        // Four rows of W at a time (four independent chains of sums), then the rest.
        let quads = w.len() / (4 * d_in);
        let (w4, w_rest) = w.split_at(quads * 4 * d_in);
        let (out4, out_rest) = out.split_at_mut(quads * 4 * rows);
        for (o, w_rows) in out4
            .chunks_exact_mut(4 * rows)
            .zip(w4.chunks_exact(4 * d_in))
        {
            let (w0, w123) = w_rows.split_at(d_in);
            let (w1, w23) = w123.split_at(d_in);
            let (w2, w3) = w23.split_at(d_in);
            for (r, x_row) in x.chunks_exact(d_in).enumerate() {
                let dots = dot4(x_row, [w0, w1, w2, w3]);
                for (j, dot) in dots.into_iter().enumerate() {
                    o[j * rows + r] = dot;
                }
            }
        }
        for (o, w_row) in out_rest
            .chunks_exact_mut(rows)
            .zip(w_rest.chunks_exact(d_in))
        {
            for (v, x_row) in o.iter_mut().zip(x.chunks_exact(d_in)) {
                *v = lane_dot(x_row, w_row);
            }
        }
    }
}

/// How far ahead [`dot4`] asks for W's rows: two groups of four rows, issued while the current
/// group is multiplied. Measured at one thread on a `[196608, 576]` weight: 9.2 GB/s without
/// prefetching, 14-14.7 with it four to eight rows ahead (OpenBLAS's sgemv 12.3-14.2 in the
/// same minutes); SmolLM2's f32 decode went from 18 to 24.5 tokens/s (BENCHMARKS.md).
const PREFETCH_ROWS: usize = 8;

/// Four dot products `x · w[j]` in one pass over `x`: sixteen running sums per row, four
/// independent chains (a row no longer waits for the previous row's additions, and `x` is
/// read once for four rows), each row's sums added by [`tree_sum`], then the tail of a width
/// that is not a multiple of sixteen; W's rows prefetched [`PREFETCH_ROWS`] ahead. A fixed
/// order: the same bits whatever the threads.
#[inline(always)]
fn dot4<T: Float>(x: &[T], w: [&[T]; 4]) -> [T; 4] {
    let n = x.len();
    assert!(w.iter().all(|r| r.len() == n));
    let full = n - n % LANES;
    let (xf, [w0, w1, w2, w3]) = (&x[..full], w.map(|r| &r[..full]));
    let zero = [T::zero(); LANES];
    // Four named arrays, not one [[T; 16]; 4]: the compiler keeps these in registers.
    let (mut a0, mut a1, mut a2, mut a3) = (zero, zero, zero, zero);
    for ((((xc, c0), c1), c2), c3) in xf
        .chunks_exact(LANES)
        .zip(w0.chunks_exact(LANES))
        .zip(w1.chunks_exact(LANES))
        .zip(w2.chunks_exact(LANES))
        .zip(w3.chunks_exact(LANES))
    {
        #[cfg(target_arch = "x86_64")]
        for c in [c0, c1, c2, c3] {
            // The same columns PREFETCH_ROWS rows further on: W streams from memory ahead of
            // use (the hardware prefetcher alone left a third of the bandwidth unused).
            let ahead = c.as_ptr().wrapping_add(PREFETCH_ROWS * n).cast::<i8>();
            // SAFETY: a prefetch is only a hint: it never faults and reads nothing into the
            // program, whatever the address (`wrapping_add` may point past the slice, e.g. on
            // the last rows, which is allowed). SSE is part of every x86_64 CPU.
            unsafe {
                core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(ahead)
            };
        }
        for i in 0..LANES {
            a0[i] += xc[i] * c0[i];
            a1[i] += xc[i] * c1[i];
            a2[i] += xc[i] * c2[i];
            a3[i] += xc[i] * c3[i];
        }
    }
    let mut out = [T::zero(); 4];
    for ((out, a), r) in out.iter_mut().zip([a0, a1, a2, a3]).zip(w) {
        let tail = x[full..].iter().zip(&r[full..]);
        *out = tail.fold(tree_sum(a), |s, (&p, &q)| s + p * q);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// Against the float64 sum of products, for row counts 1..=5, widths that are and are not
    /// multiples of the lanes and of the block, serial and parallel (which agree bit for bit).
    #[test]
    fn matches_the_f64_products_and_threads_do_not_change_bits() {
        let mut rng = Rng::new(7);
        for (rows, d_in, d_out) in [
            (1, 576, 1536),
            (1, 37, 5),
            (1, 40, 130),
            (2, 64, 130),
            (3, 17, 64),
            (5, 100, 129),
        ] {
            let x: Vec<f32> = (0..rows * d_in)
                .map(|_| rng.uniform() as f32 - 0.5)
                .collect();
            let w: Vec<f32> = (0..d_out * d_in)
                .map(|_| rng.uniform() as f32 - 0.5)
                .collect();
            let mut serial = vec![f32::NAN; rows * d_out];
            let mut parallel = vec![f32::NAN; rows * d_out];
            matvec(&mut serial, &x, &w, d_in, false);
            matvec(&mut parallel, &x, &w, d_in, true);
            assert_eq!(serial, parallel, "rows {rows} d_in {d_in} d_out {d_out}");
            for r in 0..rows {
                for o in 0..d_out {
                    let want: f64 = (0..d_in)
                        .map(|i| f64::from(x[r * d_in + i]) * f64::from(w[o * d_in + i]))
                        .sum();
                    let got = f64::from(serial[r * d_out + o]);
                    assert!((got - want).abs() < 1e-4, "({r}, {o}): {got} vs {want}");
                }
            }
        }
    }

    /// Small integers and halves: every product and sum is exact, in either order.
    #[test]
    fn f64_rows() {
        let x = [1.0f64, 2.0, 3.0, 0.5, -1.0, 4.0];
        let w = [1.0f64, 0.0, -1.0, 2.0, 2.0, 2.0];
        let mut y = [0.0f64; 4];
        matvec(&mut y, &x, &w, 3, true);
        assert_eq!(y, [-2.0, 12.0, -3.5, 7.0]);
    }
}
