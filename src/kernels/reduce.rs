//! Deterministic reductions: partial sums over fixed chunks of rows, added in a fixed order, so
//! a run gives the same bits whatever the thread schedule (exact resume depends on it).

use crate::Float;
use rayon::prelude::*;

/// Running sums (or maxima) of the lane reductions below: element `i` goes to lane `i % LANES`.
pub(crate) const LANES: usize = 16;

/// `Σᵢ f(xᵢ)` with sixteen running sums, which the compiler keeps in vector registers (a plain
/// left-to-right sum is one long chain of dependent additions that it may not reorder). The
/// order is fixed, so the result is deterministic; it differs from the left-to-right sum only
/// by rounding.
#[inline(always)]
pub fn lane_sum<T: Float>(xs: &[T], f: impl Fn(T) -> T) -> T {
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder().iter().fold(T::zero(), |s, &x| s + f(x));
    let mut acc = [T::zero(); LANES];
    for c in chunks {
        for i in 0..LANES {
            acc[i] += f(c[i]);
        }
    }
    acc.iter().fold(tail, |s, &x| s + x)
}

/// `a · b` with sixteen running sums (see [`lane_sum`]).
#[inline(always)]
pub fn lane_dot<T: Float>(a: &[T], b: &[T]) -> T {
    assert_eq!(a.len(), b.len());
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail = (ca.remainder().iter().zip(cb.remainder())).fold(T::zero(), |s, (&x, &y)| s + x * y);
    let mut acc = [T::zero(); LANES];
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().fold(tail, |s, &x| s + x)
}

/// `Σ a` as a tree: 8 + 8, 4 + 4, 2 + 2, 1 + 1 (lane `i` and lane `i + half`; vector adds,
/// where a left-to-right fold is sixteen dependent scalar ones).
#[inline(always)]
pub fn tree_sum<T: Float>(mut a: [T; LANES]) -> T {
    let mut half = LANES / 2;
    while half > 0 {
        for i in 0..half {
            a[i] += a[i + half];
        }
        half /= 2;
    }
    a[0]
}

/// The largest element (−∞ for an empty slice; NaNs are skipped, as by `f32::max`), with
/// sixteen running maxima.
#[inline(always)]
pub fn lane_max<T: Float>(xs: &[T]) -> T {
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks
        .remainder()
        .iter()
        .fold(T::neg_infinity(), |m, &x| m.max(x));
    let mut acc = [T::neg_infinity(); LANES];
    for c in chunks {
        for i in 0..LANES {
            acc[i] = acc[i].max(c[i]);
        }
    }
    acc.iter().fold(tail, |m, &x| m.max(x))
}

/// The index of the first largest element of `xs` outside the indices `skip` (ties to the
/// lowest index; NaNs are never chosen), or `None` when every element is skipped or NaN.
///
/// The same answer as the scalar scan `if x > best { best = x }` over the allowed elements, in
/// two vector passes per allowed stretch: [`lane_max`], then the first position holding it.
/// Greedy search takes this argmax over a vocabulary of 32k–256k log-probabilities for every
/// row and step.
pub fn first_argmax<T: Float>(xs: &[T], skip: &[u32]) -> Option<usize> {
    // The stretches between skipped indices, in order: a later stretch must be strictly
    // larger to win, so ties go to the lowest index.
    let mut cuts: Vec<usize> = (skip.iter().map(|&i| i as usize))
        .filter(|&i| i < xs.len())
        .collect();
    cuts.sort_unstable();
    let mut best: Option<(usize, T)> = None;
    let mut from = 0;
    for end in cuts.into_iter().chain([xs.len()]) {
        if end > from {
            let stretch = &xs[from..end];
            // −∞ both for a stretch of NaNs (no position holds it then) and one of −∞s.
            let max = lane_max(stretch);
            if best.is_none_or(|(_, b)| max > b) {
                if let Some(i) = first_equal(stretch, max) {
                    best = Some((from + i, max));
                }
            }
        }
        from = from.max(end + 1);
    }
    best.map(|(i, _)| i)
}

/// The first index holding `v`, sixteen elements compared at a time (one vector compare per
/// block; the position inside the block found only in the block that holds it).
#[inline(always)]
fn first_equal<T: Float>(xs: &[T], v: T) -> Option<usize> {
    let mut blocks = xs.chunks_exact(LANES);
    for (b, block) in blocks.by_ref().enumerate() {
        if block.iter().fold(false, |any, &x| any | (x == v)) {
            return block.iter().position(|&x| x == v).map(|i| b * LANES + i);
        }
    }
    let tail = xs.len() - blocks.remainder().len();
    blocks.remainder().iter().position(|&x| x == v).map(|i| tail + i)
}

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

    /// The lane reductions against plain f64 loops on lengths around the lane width.
    #[test]
    fn lane_reductions_match_plain_loops() {
        for len in [0, 1, 15, 16, 17, 31, 32, 33, 100] {
            let a: Vec<f64> = (0..len).map(|i| ((i * 37) % 11) as f64 - 5.3).collect();
            let b: Vec<f64> = (0..len).map(|i| ((i * 13) % 7) as f64 * 0.25).collect();
            let sq: f64 = a.iter().map(|x| x * x).sum();
            let dot: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            let max = a.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            assert!((lane_sum(&a, |x| x * x) - sq).abs() < 1e-9, "{len}");
            assert!((lane_dot(&a, &b) - dot).abs() < 1e-9, "{len}");
            assert_eq!(lane_max(&a), max, "{len}");
        }
        assert_eq!(lane_max(&[f64::NAN, 1.0, -2.0]), 1.0);
    }

    /// The argmax against the scalar scan it replaces (`if x > best`, allowed indices only), on
    /// lengths around the lane width, with ties, NaNs, −∞ and skipped indices anywhere.
    #[test]
    fn first_argmax_is_the_scalar_scan() {
        fn scan(xs: &[f32], skip: &[u32]) -> Option<usize> {
            let mut best: Option<(usize, f32)> = None;
            for (i, &x) in xs.iter().enumerate() {
                if skip.contains(&(i as u32)) || x.is_nan() {
                    continue;
                }
                if best.is_none_or(|(_, b)| x > b) {
                    best = Some((i, x));
                }
            }
            best.map(|(i, _)| i)
        }
        let mut rng = crate::rng::Rng::new(7);
        for len in [0, 1, 2, 15, 16, 17, 33, 100, 1000] {
            for trial in 0..40 {
                // Few distinct values, so ties are common.
                let mut xs: Vec<f32> = (0..len).map(|_| (rng.uniform() * 6.0).floor() as f32).collect();
                if trial % 4 == 1 && len > 0 {
                    xs[rng.below(len)] = f32::NAN;
                }
                if trial % 4 == 2 {
                    xs.iter_mut().for_each(|x| *x = f32::NEG_INFINITY);
                }
                if trial % 8 == 3 {
                    xs.iter_mut().for_each(|x| *x = f32::NAN);
                }
                let skips: [&[u32]; 4] = [
                    &[],
                    &[0, 1],
                    &[(len as u32).saturating_sub(1), len as u32 + 5],
                    &[3, 3],
                ];
                for skip in skips {
                    assert_eq!(first_argmax(&xs, skip), scan(&xs, skip), "{len} {trial} {skip:?}");
                }
                // The maximum skipped: the next best wins.
                if let Some(m) = scan(&xs, &[]) {
                    let skip = [m as u32];
                    assert_eq!(first_argmax(&xs, &skip), scan(&xs, &skip), "{len} {trial}");
                }
            }
        }
    }

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
