//! The one strided matrix-multiply entry point: `dst = [dst +] alpha * lhs · rhs`.
//!
//! Views carry row and column strides, so a transpose or one attention head inside a wider
//! matrix is a view, never a copy. The `gemm` crate (AVX-512 kernels with its `x86-v4` feature)
//! does the work; only this file knows about it.

use super::matvec::{matvec, MATVEC_MAX_ROWS};
use super::panels::matvec_transposed;
use super::row_exact::products_are_row_exact;
use crate::Float;
use rayon::prelude::*;
use std::cell::Cell;

thread_local! {
    /// Set inside [`serial_matmuls`]: this thread's products run on this thread alone.
    static SERIAL: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with every matrix product it makes on the calling thread single-threaded (for
/// callers that already keep every thread busy, such as the data-parallel training step).
/// Work that `f` hands to other threads through rayon keeps their setting; either way the
/// products' results are the same, since gemm splits rows and columns, never the summed
/// dimension.
pub fn serial_matmuls<R>(f: impl FnOnce() -> R) -> R {
    let before = SERIAL.with(|s| s.replace(true));
    let result = f();
    SERIAL.with(|s| s.set(before));
    result
}

/// Whether the calling thread is inside [`serial_matmuls`].
pub fn matmuls_are_serial() -> bool {
    SERIAL.with(Cell::get)
}

/// A read-only matrix view: element (r, c) is `data[offset + r * row_stride + c * col_stride]`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a, T> {
    data: &'a [T],
    offset: usize,
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a, T> MatRef<'a, T> {
    /// A contiguous row-major `rows x cols` matrix at the start of `data`.
    pub fn new(data: &'a [T], rows: usize, cols: usize) -> Self {
        Self::strided(data, 0, rows, cols, cols, 1)
    }

    /// A general strided view; panics if any element would fall outside `data`.
    pub fn strided(
        data: &'a [T],
        offset: usize,
        rows: usize,
        cols: usize,
        row_stride: usize,
        col_stride: usize,
    ) -> Self {
        check_bounds(data.len(), offset, rows, cols, row_stride, col_stride);
        MatRef {
            data,
            offset,
            rows,
            cols,
            row_stride,
            col_stride,
        }
    }

    /// The transpose, as a view of the same memory.
    pub fn t(self) -> Self {
        MatRef {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Element `(r, c)`; `r < rows`, `c < cols`.
    #[inline(always)]
    pub fn at(&self, r: usize, c: usize) -> T
    where
        T: Copy,
    {
        self.data[self.offset + r * self.row_stride + c * self.col_stride]
    }
}

/// A mutable matrix view whose elements never overlap: either row-major (`col_stride == 1`,
/// `row_stride >= cols`) or column-major (`row_stride == 1`, `col_stride >= rows`).
#[derive(Debug)]
pub struct MatMut<'a, T> {
    data: &'a mut [T],
    offset: usize,
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a, T> MatMut<'a, T> {
    /// A contiguous row-major `rows x cols` matrix at the start of `data`.
    pub fn new(data: &'a mut [T], rows: usize, cols: usize) -> Self {
        Self::strided(data, 0, rows, cols, cols, 1)
    }

    /// A strided view; panics if it could overlap itself or fall outside `data`.
    pub fn strided(
        data: &'a mut [T],
        offset: usize,
        rows: usize,
        cols: usize,
        row_stride: usize,
        col_stride: usize,
    ) -> Self {
        let row_major = col_stride == 1 && (row_stride >= cols || rows <= 1);
        let col_major = row_stride == 1 && (col_stride >= rows || cols <= 1);
        assert!(
            row_major || col_major,
            "MatMut {rows}x{cols} with strides ({row_stride}, {col_stride}) may overlap itself"
        );
        check_bounds(data.len(), offset, rows, cols, row_stride, col_stride);
        MatMut {
            data,
            offset,
            rows,
            cols,
            row_stride,
            col_stride,
        }
    }

    /// The transpose, as a view of the same memory.
    // Used outside the library only (feature `internals`).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn t(self) -> Self {
        MatMut {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }
}

fn check_bounds(len: usize, offset: usize, rows: usize, cols: usize, rs: usize, cs: usize) {
    if rows == 0 || cols == 0 {
        assert!(
            offset <= len,
            "matrix view offset {offset} past buffer of {len}"
        );
        return;
    }
    let last = offset + (rows - 1) * rs + (cols - 1) * cs;
    assert!(
        last < len,
        "matrix view {rows}x{cols} at {offset} strides ({rs}, {cs}) ends at {last}, buffer holds {len}"
    );
}

/// `dst = alpha * lhs · rhs` when `accumulate` is false, `dst += alpha * lhs · rhs` when true.
///
/// Uses all threads of the current rayon pool for large products (the `gemm` crate only splits
/// work over output blocks, so results do not depend on the thread schedule).
pub fn matmul<T: Float>(
    dst: MatMut<'_, T>,
    lhs: MatRef<'_, T>,
    rhs: MatRef<'_, T>,
    alpha: T,
    accumulate: bool,
) {
    assert_eq!(lhs.cols, rhs.rows, "matmul inner dimensions differ");
    assert_eq!(
        (dst.rows, dst.cols),
        (lhs.rows, rhs.cols),
        "matmul output shape"
    );
    let (m, n, k) = (dst.rows, dst.cols, lhs.cols);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                for c in 0..n {
                    dst.data[dst.offset + r * dst.row_stride + c * dst.col_stride] = T::zero();
                }
            }
        }
        return;
    }
    let threads = if SERIAL.with(Cell::get) {
        1
    } else {
        rayon::current_num_threads()
    };
    let parallelism = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the constructors of MatRef/MatMut checked that every element (r, c) of each view,
    // at offset + r*row_stride + c*col_stride, lies inside its slice, so gemm only touches
    // in-bounds memory. `dst` is borrowed mutably and `lhs`/`rhs` immutably, so dst cannot alias
    // them, and MatMut::strided refused strides under which two dst elements share an address,
    // so gemm's writes never race. Strides fit in isize because they index existing slices.
    // T is f32 or f64 (the only Float impls), both supported by gemm's dispatch.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.data.as_mut_ptr().add(dst.offset),
            dst.col_stride as isize,
            dst.row_stride as isize,
            accumulate,
            lhs.data.as_ptr().add(lhs.offset),
            lhs.col_stride as isize,
            lhs.row_stride as isize,
            rhs.data.as_ptr().add(rhs.offset),
            rhs.col_stride as isize,
            rhs.row_stride as isize,
            T::one(),
            alpha,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// Plain `y = x · Wᵀ (+ b)` for row-major `x [rows, d_in]` and PyTorch-layout `w [d_out, d_in]`.
pub fn linear_forward<T: Float>(
    y: &mut [T],
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    rows: usize,
    d_in: usize,
    d_out: usize,
) {
    matmul(
        MatMut::new(y, rows, d_out),
        MatRef::new(x, rows, d_in),
        MatRef::new(w, d_out, d_in).t(),
        T::one(),
        false,
    );
    if let Some(b) = bias {
        add_row_bias(y, b);
    }
}

/// `W [d_out, d_in]` -> `Wᵀ [d_in, d_out]`, row-major: the layout [`weight_product`] multiplies
/// without repacking. With `y = x Wᵀ` and a row-major `y`, gemm works on `yᵀ = W xᵀ` and must
/// repack `W` on every call; from `Wᵀ` it reads the weight in place (in a decoding step with a
/// few dozen rows that repacking was a quarter of the time). A vocabulary-sized projection
/// (`d_out >= PANELLED_OUT`) is kept in panels of [`PANEL`] outputs instead (see there).
///
/// Copied in square tiles of `TRANSPOSE_TILE` (16), a band of `Wᵀ`'s rows per task of the
/// thread pool: element by element, every write of a column of `W` lands on another cache line
/// and, past 512 rows, on another 4 KiB page (the copy of a 1B model's float32 weights took a
/// minute).
pub fn transpose_weight<T: Float>(w: &[T], d_out: usize, d_in: usize) -> Vec<T> {
    if d_out < PANELLED_OUT || d_in == 0 {
        return transpose_block(w, d_out, d_in);
    }
    // Panel by panel of PANEL rows of W, each panel's transpose contiguous.
    let mut t = Vec::with_capacity(d_in * d_out);
    for panel in w.chunks(PANEL * d_in) {
        t.extend(transpose_block(panel, panel.len() / d_in, d_in));
    }
    t
}

/// Output columns per panel of [`transpose_weight`]'s layout for a vocabulary-sized
/// projection (`d_out >= PANELLED_OUT`): `Wᵀ` is kept as `⌈d_out / PANEL⌉` contiguous
/// `[d_in, PANEL]` blocks (the last one narrower), so that a product of a few dozen rows reads
/// each panel as a small matrix of short rows (256 bytes apart) instead of walking `Wᵀ`'s rows
/// `4 · d_out` bytes apart (a page or more), where every step of the summed dimension missed
/// the caches and the TLB: Marian's 58,101-token projection at 32 rows ran a quarter faster.
pub const PANEL: usize = 64;

/// The widest projection kept as plain `Wᵀ`; from this many outputs (a vocabulary, not a
/// layer: Llama 3 8B's FFN is 14,336 wide) `Wᵀ` is kept in panels.
pub const PANELLED_OUT: usize = 16384;

/// The most rows [`weight_product`] multiplies panel by panel for an input of `d_in` columns:
/// as many as keep the rows `x [rows, d_in]` within [`PANEL_MAX_INPUT`] floats (each panel's
/// product reads all of them, so they stay in the core's L2 cache), at least 32 (twice gemm's
/// register tile of f32 rows on AVX2) and at most 256. More rows go to gemm on the whole
/// weight, which packs it again on every call: on Marian's 58,101-token projection, beam 4 over
/// 32 sentences (128 rows of 512) ran 1.28× faster from the panels (Zen 4, one thread).
fn panel_max_rows(d_in: usize) -> usize {
    (PANEL_MAX_INPUT / d_in.max(1)).clamp(32, 256)
}

/// The floats of input rows a panelled product keeps (512 KiB of f32).
const PANEL_MAX_INPUT: usize = 128 * 1024;

/// `W [d_out, d_in]` -> `Wᵀ [d_in, d_out]`, row-major, in square tiles.
fn transpose_block<T: Float>(w: &[T], d_out: usize, d_in: usize) -> Vec<T> {
    let mut t = vec![T::zero(); d_in * d_out];
    if d_in == 0 || d_out == 0 {
        return t;
    }
    // t[i, o] = w[o, i], band by band of TILE rows of t (TILE columns of w); each tile read
    // row by row into `tile`, then written row by row, so that reads and writes both run
    // along rows (TILE values, whole cache lines) instead of down a column.
    const TILE: usize = TRANSPOSE_TILE;
    t.par_chunks_mut(TILE * d_out)
        .enumerate()
        .for_each(|(band, rows)| {
            let i0 = band * TILE;
            let n_i = rows.len() / d_out;
            let mut tile = [[T::zero(); TILE]; TILE];
            for o0 in (0..d_out).step_by(TILE) {
                let n_o = TILE.min(d_out - o0);
                for (tile_row, o) in tile.iter_mut().zip(o0..o0 + n_o) {
                    tile_row[..n_i].copy_from_slice(&w[o * d_in + i0..o * d_in + i0 + n_i]);
                }
                for (di, row) in rows.chunks_exact_mut(d_out).enumerate() {
                    for (out, tile_row) in row[o0..o0 + n_o].iter_mut().zip(&tile) {
                        *out = tile_row[di];
                    }
                }
            }
        });
    t
}

/// The side of the square tiles [`transpose_weight`] copies: 16 rows of 16 values (1 KiB of
/// float32, read and written as 16 runs of 64 bytes, a cache line each).
const TRANSPOSE_TILE: usize = 16;

/// `y = x Wᵀ` (no bias) into `y [rows, d_out]` from `w [d_out, d_in]`, or from its
/// [`transpose_weight`] copy `w_t` when there is one (same result up to rounding). Up to
/// [`MATVEC_MAX_ROWS`] rows are dot products along W's rows ([`matvec`]). An empty `w` beside
/// `w_t` is a weight held only as `Wᵀ`: every product reads `w_t` (a few rows through
/// [`matvec_transposed`], many through the panels whatever their number).
pub fn weight_product<T: Float>(
    y: &mut [T],
    x: &[T],
    w: &[T],
    w_t: Option<&[T]>,
    rows: usize,
    d_in: usize,
    d_out: usize,
) {
    let only_t = w_t.filter(|_| w.is_empty() && d_in * d_out > 0);
    if (rows <= MATVEC_MAX_ROWS || products_are_row_exact()) && d_in > 0 {
        // A few rows (a decoding step), or rows that must each get the one-row bits
        // (`super::row_exact`): W streamed once as stored (or Wᵀ, when it is the only form).
        let parallel = !SERIAL.with(Cell::get) && rayon::current_num_threads() > 1;
        let (y, x) = (&mut y[..rows * d_out], &x[..rows * d_in]);
        return match only_t {
            Some(t) => matvec_transposed(y, x, t, d_in, d_out, parallel),
            None => matvec(y, x, w, d_in, parallel),
        };
    }
    match w_t {
        Some(t) if d_out < PANELLED_OUT => matmul(
            MatMut::new(y, rows, d_out),
            MatRef::new(x, rows, d_in),
            MatRef::new(t, d_in, d_out),
            T::one(),
            false,
        ),
        Some(t) if rows <= panel_max_rows(d_in) || only_t.is_some() => {
            panel_product(y, x, t, rows, d_in, d_out)
        }
        // More rows: gemm packs the weight whichever layout it reads (W's rows, as stored).
        _ => linear_forward(y, x, w, None, rows, d_in, d_out),
    }
}

/// `y = x Wᵀ` from [`transpose_weight`]'s panels: each panel's `[rows, PANEL]` block of `y`
/// computed on its own (panels side by side on the pool's threads, each product on one
/// thread), then copied into its columns of `y`.
fn panel_product<T: Float>(y: &mut [T], x: &[T], t: &[T], rows: usize, d_in: usize, d_out: usize) {
    let x = MatRef::new(&x[..rows * d_in], rows, d_in);
    let product = |panel: &[T]| {
        let width = panel.len() / d_in;
        // block: [rows, width]
        let mut block = vec![T::zero(); rows * width];
        serial_matmuls(|| {
            matmul(
                MatMut::new(&mut block, rows, width),
                x,
                MatRef::new(panel, d_in, width),
                T::one(),
                false,
            )
        });
        block
    };
    let blocks: Vec<Vec<T>> = if SERIAL.with(Cell::get) || rayon::current_num_threads() == 1 {
        t.chunks(PANEL * d_in).map(product).collect()
    } else {
        t.par_chunks(PANEL * d_in).map(product).collect()
    };
    for (p, block) in blocks.iter().enumerate() {
        let columns = p * PANEL..(p * PANEL + PANEL).min(d_out);
        for (r, row) in block.chunks_exact(columns.len()).enumerate() {
            y[r * d_out + columns.start..r * d_out + columns.end].copy_from_slice(row);
        }
    }
}

/// `y[r] += b` for every row `r` of `y [rows, b.len()]`.
pub fn add_row_bias<T: Float>(y: &mut [T], b: &[T]) {
    let add = |row: &mut [T]| row.iter_mut().zip(b).for_each(|(v, &bv)| *v += bv);
    if y.len() < 1 << 14 {
        y.chunks_exact_mut(b.len()).for_each(add);
    } else {
        use rayon::prelude::*;
        y.par_chunks_mut(b.len()).for_each(add);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_products_equal_threaded_ones_bit_for_bit() {
        // Big enough that gemm splits the work across the pool's two threads.
        let (m, k, n) = (300, 500, 200);
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 104_729) % 997) as f32 / 498.5 - 1.0)
            .collect();
        let product = || {
            let mut c = vec![0f32; m * n];
            let (lhs, rhs) = (MatRef::new(&a, m, k), MatRef::new(&b, k, n));
            matmul(MatMut::new(&mut c, m, n), lhs, rhs, 1.0, false);
            c
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let (threaded, serial) = pool.install(|| (product(), serial_matmuls(product)));
        assert_eq!(threaded, serial);
        // The setting ends with the closure.
        assert!(!SERIAL.with(Cell::get));
    }

    fn naive(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                for p in 0..k {
                    c[i * n + j] += a[i * k + p] * b[p * n + j];
                }
            }
        }
        c
    }

    #[test]
    fn matches_naive_with_transposes_and_accumulate() {
        let (m, k, n) = (7, 13, 5);
        let a: Vec<f64> = (0..m * k).map(|i| ((i * 37 % 11) as f64) - 5.0).collect();
        let b: Vec<f64> = (0..k * n).map(|i| ((i * 17 % 7) as f64) * 0.5).collect();
        let want = naive(&a, &b, m, k, n);
        let mut c = vec![1.0; m * n];
        matmul(
            MatMut::new(&mut c, m, n),
            MatRef::new(&a, m, k),
            MatRef::new(&b, k, n),
            1.0,
            false,
        );
        assert_eq!(c, want);
        // b stored transposed [n, k], used through a transposed view; accumulate twice.
        let mut bt = vec![0.0; n * k];
        for p in 0..k {
            for j in 0..n {
                bt[j * k + p] = b[p * n + j];
            }
        }
        matmul(
            MatMut::new(&mut c, m, n),
            MatRef::new(&a, m, k),
            MatRef::new(&bt, n, k).t(),
            2.0,
            true,
        );
        for (x, y) in c.iter().zip(&want) {
            assert_eq!(*x, 3.0 * y);
        }
        // Writing into a column block of a wider matrix leaves the rest untouched.
        let mut wide = vec![-1.0; m * (n + 3)];
        matmul(
            MatMut::strided(&mut wide, 2, m, n, n + 3, 1),
            MatRef::new(&a, m, k),
            MatRef::new(&b, k, n),
            1.0,
            false,
        );
        for i in 0..m {
            assert_eq!(wide[i * (n + 3)], -1.0);
            assert_eq!(wide[i * (n + 3) + 1], -1.0);
            assert_eq!(
                &wide[i * (n + 3) + 2..i * (n + 3) + 2 + n],
                &want[i * n..(i + 1) * n]
            );
        }
    }

    #[test]
    fn vocabulary_sized_projections_are_kept_in_panels_and_multiplied_from_them() {
        // Wide enough for panels, with a narrower last panel; rows on both sides of each
        // threshold (matvec, panels, W as stored), on one thread and on the pool.
        let (d_out, d_in) = (PANELLED_OUT + 37, 24);
        let w: Vec<f64> = (0..d_out * d_in)
            .map(|v| ((v * 7919) % 1009) as f64 / 1009.0 - 0.5)
            .collect();
        let t = transpose_weight(&w, d_out, d_in);
        assert_eq!(t.len(), w.len());
        // Panel p holds W's rows p·PANEL.. as a [d_in, width] block.
        for o in [0, 1, 63, 64, 65, d_out - 38, d_out - 1] {
            let (p, j) = (o / PANEL, o % PANEL);
            let width = PANEL.min(d_out - p * PANEL);
            for i in [0, 5, d_in - 1] {
                assert_eq!(t[p * PANEL * d_in + i * width + j], w[o * d_in + i], "{o},{i}");
            }
        }
        assert_eq!(panel_max_rows(d_in), 256);
        assert_eq!((panel_max_rows(512), panel_max_rows(1024)), (256, 128));
        assert_eq!((panel_max_rows(2048), panel_max_rows(8192)), (64, 32));
        for rows in [1, 4, 5, 17, 33, panel_max_rows(d_in), panel_max_rows(d_in) + 1] {
            let x: Vec<f64> = (0..rows * d_in).map(|v| ((v * 31) % 17) as f64 - 8.0).collect();
            let want: Vec<f64> = (0..rows * d_out)
                .map(|e| {
                    let (r, o) = (e / d_out, e % d_out);
                    (0..d_in).map(|i| x[r * d_in + i] * w[o * d_in + i]).sum()
                })
                .collect();
            for serial in [false, true] {
                let mut y = vec![f64::NAN; rows * d_out];
                let mut product = || weight_product(&mut y, &x, &w, Some(&t), rows, d_in, d_out);
                if serial {
                    serial_matmuls(product);
                } else {
                    product();
                }
                let worst = y.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
                assert!(worst < 1e-12, "{rows} rows (serial {serial}): {worst:e}");
            }
        }
    }

    #[test]
    fn the_tiled_transpose_is_the_transpose() {
        // Sizes on and off the tile, a single row and column, and nothing.
        for (d_out, d_in) in [(1, 1), (1, 70), (70, 1), (33, 65), (64, 96), (100, 37), (0, 5)] {
            let w: Vec<f32> = (0..d_out * d_in).map(|v| v as f32).collect();
            let t = transpose_weight(&w, d_out, d_in);
            assert_eq!(t.len(), w.len());
            for o in 0..d_out {
                for i in 0..d_in {
                    assert_eq!(t[i * d_out + o], w[o * d_in + i], "{d_out}x{d_in} at {o},{i}");
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "buffer holds")]
    fn out_of_bounds_view_is_refused() {
        let a = vec![0.0f32; 10];
        let _ = MatRef::new(&a, 3, 4);
    }

    #[test]
    #[should_panic(expected = "may overlap")]
    fn overlapping_mut_view_is_refused() {
        let mut a = vec![0.0f32; 10];
        let _ = MatMut::strided(&mut a, 0, 3, 3, 1, 1);
    }
}
