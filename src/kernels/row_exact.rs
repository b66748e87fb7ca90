//! Row-exact products: inside [`row_exact`], a weight product or a decoding attention call of
//! several rows computes every row with the kernel a one-row call uses, so that row `i` of a
//! `k`-row step is bit for bit the output of a one-row step on row `i` alone.
//!
//! Speculative decoding (`crate::decode::speculative`) verifies `k` drafted tokens in one
//! forward over `[last, d₁ … d_k]` and must accept exactly what `k + 1` one-token steps would
//! have produced. Without this mode the kernel choice depends on the row count: from
//! `matvec::MATVEC_MAX_ROWS` rows on, f32 products go through gemm (another order of the
//! float sums), the ggml blocks from `lowp::block_gemm::MIN_ROWS` on through their
//! register-tiled GEMM, and attention from `attention::STEP_KERNEL_MAX_QUERIES` queries a row
//! on through matrix products. Inside `row_exact` each keeps its one-row kernel: f32 products
//! are dot products along W's rows whatever the row count (W is still read once for all
//! rows), a packed weight multiplies each row by its one-row kernel, attention runs the step
//! kernel (each query's scores, softmax and weighted sum written out, the same loops for one
//! query as for several).
//!
//! The flag is the calling thread's (like `matmul::serial_matmuls`): the kernel is chosen on
//! the thread that calls the product, before any work is handed to other threads.

use std::cell::Cell;

thread_local! {
    static ROW_EXACT: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with every product and decoding attention call it makes row-exact (module docs).
pub fn row_exact<R>(f: impl FnOnce() -> R) -> R {
    let before = ROW_EXACT.with(|s| s.replace(true));
    let result = f();
    ROW_EXACT.with(|s| s.set(before));
    result
}

/// Whether the calling thread is inside [`row_exact`].
pub fn products_are_row_exact() -> bool {
    ROW_EXACT.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_holds_inside_only_and_nests() {
        assert!(!products_are_row_exact());
        let inner = row_exact(|| {
            let nested = row_exact(products_are_row_exact);
            (nested, products_are_row_exact())
        });
        assert_eq!(inner, (true, true));
        assert!(!products_are_row_exact());
    }
}
