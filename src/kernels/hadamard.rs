//! The Walsh–Hadamard rotation of a quantised key/value cache (llama.cpp's `attn_rot_k` /
//! `attn_rot_v`, on by default there since its PR 21038):
//!
//! ```text
//! H_1 = [1],   H_2s = [[H_s, H_s], [H_s, −H_s]],   R_n = H_n / √n   (orthonormal, R_n² = I)
//! ```
//!
//! A key is stored as `pack(R k)` and met by the rotated query `R q`; since `R` is orthogonal,
//! `(R q) · (R k) = q · k` exactly, and only the quantisation error differs. A rotation spreads
//! a head's few large channels (the outliers of RoPE'd keys) over all of its values, so a
//! block's one scale fits every value; on SmolLM2-135M it cuts `q4_0`'s perplexity cost about
//! fourfold (BENCHMARKS.md). A value is stored as `pack(R v)`; the weighted sum of stored
//! values is rotated back, `R Σ p_t R v_t = Σ p_t v_t` (`R` is its own inverse). Each run of
//! `n` values of a row is rotated on its own (`n` divides a head, so no rotation mixes heads).
//!
//! Which `n`, as llama.cpp chooses it: only for the block types (`q8_0`, `q4_0`; not `f16` or
//! `bf16`) and heads whose width is a multiple of 64; keys by the largest power of two that
//! divides the head, values always by 64.

use super::kv_blocks::KvType;

/// The rotation size for keys of type `ty` in heads of `d_head` values, `None` for none.
pub fn key_rotation(ty: KvType, d_head: usize) -> Option<usize> {
    rotates(ty, d_head).then(|| 1 << d_head.trailing_zeros())
}

/// The rotation size for values of type `ty` in heads of `d_head` values, `None` for none.
pub fn value_rotation(ty: KvType, d_head: usize) -> Option<usize> {
    rotates(ty, d_head).then_some(64)
}

fn rotates(ty: KvType, d_head: usize) -> bool {
    matches!(ty, KvType::Q8_0 | KvType::Q4_0) && d_head > 0 && d_head.is_multiple_of(64)
}

/// `x ← R_n x` for each run of `n` values of `x` (`n` a power of two): the fast transform, `n
/// log n` additions in the butterfly order that gives Sylvester's `H_n`, then the scale `1/√n`.
///
/// # Panics
/// When `n` is not a power of two or does not divide `x.len()`.
pub fn rotate(x: &mut [f32], n: usize) {
    assert!(
        n.is_power_of_two() && x.len().is_multiple_of(n),
        "a rotation of {n} over {} values",
        x.len()
    );
    let scale = 1.0 / (n as f32).sqrt();
    for run in x.chunks_exact_mut(n) {
        let mut half = 1;
        while half < n {
            for pair in run.chunks_exact_mut(2 * half) {
                let (lo, hi) = pair.split_at_mut(half);
                for (a, b) in lo.iter_mut().zip(hi) {
                    (*a, *b) = (*a + *b, *a - *b);
                }
            }
            half *= 2;
        }
        run.iter_mut().for_each(|v| *v *= scale);
    }
}

/// llama.cpp's `ggml_gen_hadamard`, in float64: `R_n` row-major (the tests' reference).
#[cfg(test)]
pub(crate) fn hadamard_matrix(n: usize) -> Vec<f64> {
        let mut h = vec![0f64; n * n];
        h[0] = 1.0 / (n as f64).sqrt();
        let mut s = 1;
        while s < n {
            for i in 0..s {
                for j in 0..s {
                    let v = h[i * n + j];
                    h[(i + s) * n + j] = v;
                    h[i * n + j + s] = v;
                    h[(i + s) * n + j + s] = -v;
                }
            }
            s *= 2;
        }
        h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// The fast transform equals the matrix product, run by run; it preserves dot products and
    /// undoes itself.
    #[test]
    fn rotation_is_llama_cpps_matrix_and_its_own_inverse() {
        let mut rng = Rng::new(11);
        for n in [1, 2, 8, 64, 128, 256] {
            let len = 3 * n;
            let x: Vec<f32> = (0..len).map(|_| rng.uniform_range(-3.0, 3.0) as f32).collect();
            let y: Vec<f32> = (0..len).map(|_| rng.uniform_range(-3.0, 3.0) as f32).collect();
            let h = hadamard_matrix(n);
            let (mut rx, mut ry) = (x.clone(), y.clone());
            rotate(&mut rx, n);
            rotate(&mut ry, n);
            for (run, got) in x.chunks(n).zip(rx.chunks(n)) {
                for (i, &g) in got.iter().enumerate() {
                    let want: f64 = (0..n).map(|j| h[i * n + j] * run[j] as f64).sum();
                    assert!((g as f64 - want).abs() < 1e-5, "n {n} row {i}: {g} vs {want}");
                }
            }
            let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(&u, &v)| u as f64 * v as f64).sum::<f64>();
            assert!((dot(&rx, &ry) - dot(&x, &y)).abs() < 1e-3, "n {n}");
            rotate(&mut rx, n);
            for (&back, &orig) in rx.iter().zip(&x) {
                assert!((back - orig).abs() < 1e-5, "n {n}: {back} vs {orig}");
            }
        }
    }

    /// llama.cpp's choices: block types only, heads of a multiple of 64, keys by the largest
    /// power of two dividing the head, values by 64.
    #[test]
    fn rotation_sizes_follow_llama_cpp() {
        assert_eq!(key_rotation(KvType::Q4_0, 64), Some(64));
        assert_eq!(key_rotation(KvType::Q8_0, 128), Some(128));
        assert_eq!(key_rotation(KvType::Q4_0, 192), Some(64));
        assert_eq!(key_rotation(KvType::Q4_0, 256), Some(256));
        assert_eq!(value_rotation(KvType::Q4_0, 256), Some(64));
        assert_eq!(key_rotation(KvType::Q4_0, 96), None);
        assert_eq!(value_rotation(KvType::Q8_0, 80), None);
        for ty in [KvType::F32, KvType::F16, KvType::Bf16] {
            assert_eq!(key_rotation(ty, 128), None);
            assert_eq!(value_rotation(ty, 128), None);
        }
    }
}
