//! The two products of one decode step's attention for one query and head, in f32, over keys
//! and values that lie anywhere in the stores (stored row `rows[t]` of `k`, `v`, columns
//! `at .. at + d` of each):
//!
//! ```text
//! s_t = (q · k_{rows[t]}) · scale          (scores)
//! c   = Σ_t p_t v_{rows[t]}                (the weighted sum of the values)
//! ```
//!
//! A dot product puts element `i`'s product in lane `i mod 16`, adds the chunks of 16 in order,
//! then the lanes pairwise (`i` and `i + 8`, then `i + 4`, `i + 2`, `i + 1`), then the tail of
//! `d mod 16` elements summed in order. The weighted sum adds `p_t v_t` key after key. No FMA
//! anywhere (a product is rounded before it is added, as in plain Rust), so the portable, AVX2
//! and AVX-512F versions, chosen by the low-precision kernel switch ([`Kernel`]), give the same
//! bits; the weighted sum gives the bits of a plain `c += p · v` loop.
//!
//! They replace a reduction with sixteen dependent scalar additions per key, which the compiler
//! cannot reorder, and a value accumulator kept in memory: together most of a step's attention.

use super::lowp::Kernel;
use super::reduce::{tree_sum, LANES};

/// `out[t] = (q · k[rows[t] · stride + at ..][..d]) · scale` for every `t`, `d = q.len()`.
///
/// # Panics
/// When a key's columns lie outside `k`, `out` and `rows` differ in length, or the CPU lacks
/// `kernel`.
pub fn scores(
    kernel: Kernel,
    q: &[f32],
    k: &[f32],
    (rows, stride, at): (&[u32], usize, usize),
    scale: f32,
    out: &mut [f32],
) {
    assert_eq!(rows.len(), out.len());
    assert!(super::lowp::cpu_has(kernel), "{} kernel", kernel.name());
    let d = q.len();
    let key = |r: u32| &k[r as usize * stride + at..r as usize * stride + at + d];
    if let Some(&last) = rows.iter().max() {
        key(last); // every key's columns inside k (panics otherwise)
    }
    match kernel {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F (cpu_has); every key's d columns are inside k (checked above).
        Kernel::Avx512 => unsafe { x86::scores_avx512(q, k, (rows, stride, at), scale, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 (cpu_has); every key's d columns are inside k (checked above).
        Kernel::Avx2 => unsafe { x86::scores_avx2(q, k, (rows, stride, at), scale, out) },
        _ => {
            for (s, &r) in out.iter_mut().zip(rows) {
                *s = dot_portable(q, key(r)) * scale;
            }
        }
    }
}

/// `out = Σ_t p[t] · v[rows[t] · stride + at ..][..d]`, `d = out.len()`, key after key.
///
/// # Panics
/// When a value's columns lie outside `v`, `p` and `rows` differ in length, or the CPU lacks
/// `kernel`.
pub fn weighted_sum(
    kernel: Kernel,
    p: &[f32],
    v: &[f32],
    (rows, stride, at): (&[u32], usize, usize),
    out: &mut [f32],
) {
    assert_eq!(rows.len(), p.len());
    assert!(super::lowp::cpu_has(kernel), "{} kernel", kernel.name());
    let d = out.len();
    if let Some(&last) = rows.iter().max() {
        assert!(last as usize * stride + at + d <= v.len(), "value rows outside the store");
    }
    match kernel {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F (cpu_has); every row's d columns are inside v (checked above).
        Kernel::Avx512 => unsafe { x86::weighted_sum_avx512(p, v, rows, stride, at, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 (cpu_has); every row's d columns are inside v (checked above).
        Kernel::Avx2 => unsafe { x86::weighted_sum_avx2(p, v, rows, stride, at, out) },
        _ => {
            out.fill(0.0);
            for (&w, &r) in p.iter().zip(rows) {
                let row = &v[r as usize * stride + at..r as usize * stride + at + d];
                for (c, &x) in out.iter_mut().zip(row) {
                    *c += w * x;
                }
            }
        }
    }
}

/// The tail of `a · b` after the whole chunks of 16, in order.
#[inline(always)]
fn tail(a: &[f32], b: &[f32]) -> f32 {
    let from = a.len() / LANES * LANES;
    a[from..]
        .iter()
        .zip(&b[from..])
        .fold(0.0, |s, (&x, &y)| s + x * y)
}

fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    for (x, y) in a.chunks_exact(LANES).zip(b.chunks_exact(LANES)) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    tree_sum(acc) + tail(a, b)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{tail, LANES};
    use std::arch::x86_64::*;

    /// The portable kernel's scores with one 16-lane register per dot product.
    ///
    /// # Safety
    /// AVX-512F; `rows[t] · stride + at + q.len() <= k.len()` for every `t`, `out.len() ==
    /// rows.len()`.
    #[target_feature(enable = "avx512f,avx2")]
    pub(super) unsafe fn scores_avx512(
        q: &[f32],
        k: &[f32],
        (rows, stride, at): (&[u32], usize, usize),
        scale: f32,
        out: &mut [f32],
    ) {
        let d = q.len();
        for (s, &r) in out.iter_mut().zip(rows) {
            let key = r as usize * stride + at;
            let mut acc = _mm512_setzero_ps();
            for c in 0..d / LANES {
                // SAFETY (caller): chunk c is inside q and inside the key's columns of k.
                let (x, y) = unsafe {
                    (
                        _mm512_loadu_ps(q.as_ptr().add(c * LANES)),
                        _mm512_loadu_ps(k.as_ptr().add(key + c * LANES)),
                    )
                };
                acc = _mm512_add_ps(acc, _mm512_mul_ps(x, y));
            }
            // lanes i + (i + 8), the low half first
            let lo = _mm512_castps512_ps256(acc);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
            let dot = reduce8(_mm256_add_ps(lo, hi)) + tail(q, &k[key..key + d]);
            *s = dot * scale;
        }
    }

    /// The portable kernel's scores with two 8-lane registers (lanes 0–7 and 8–15) per dot
    /// product.
    ///
    /// # Safety
    /// AVX2; as [`scores_avx512`].
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn scores_avx2(
        q: &[f32],
        k: &[f32],
        (rows, stride, at): (&[u32], usize, usize),
        scale: f32,
        out: &mut [f32],
    ) {
        let d = q.len();
        for (s, &r) in out.iter_mut().zip(rows) {
            let key = r as usize * stride + at;
            let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            for c in 0..d / LANES {
                // SAFETY (caller): chunk c is inside q and inside the key's columns of k.
                unsafe {
                    let (pa, pb) = (q.as_ptr().add(c * LANES), k.as_ptr().add(key + c * LANES));
                    let x = _mm256_mul_ps(_mm256_loadu_ps(pa), _mm256_loadu_ps(pb));
                    lo = _mm256_add_ps(lo, x);
                    let y = _mm256_mul_ps(_mm256_loadu_ps(pa.add(8)), _mm256_loadu_ps(pb.add(8)));
                    hi = _mm256_add_ps(hi, y);
                }
            }
            let dot = reduce8(_mm256_add_ps(lo, hi)) + tail(q, &k[key..key + d]);
            *s = dot * scale;
        }
    }

    /// Lanes 0–7 added as the portable tree's last three levels: `i + (i + 4)`, `+ (i + 2)`,
    /// `+ (i + 1)`.
    #[inline(always)]
    fn reduce8(v: __m256) -> f32 {
        // SAFETY: AVX, which both callers' features include.
        unsafe {
            let v4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
            _mm_cvtss_f32(_mm_add_ss(v2, _mm_shuffle_ps::<0b01>(v2, v2)))
        }
    }

    /// `out = Σ_t p_t v_t` in vectors of 16, then 8 columns, the rest one by one; the
    /// accumulators stay in registers over the keys.
    ///
    /// # Safety
    /// AVX-512F; `rows[t] · stride + at + out.len() <= v.len()` for every `t`, `p.len() ==
    /// rows.len()`.
    #[target_feature(enable = "avx512f,avx2")]
    pub(super) unsafe fn weighted_sum_avx512(
        p: &[f32],
        v: &[f32],
        rows: &[u32],
        stride: usize,
        at: usize,
        out: &mut [f32],
    ) {
        let d = out.len();
        let base = |r: u32| r as usize * stride + at;
        let mut c0 = 0;
        // Four registers (64 columns, a head of SmolLM2 or GPT-2) at a time.
        while c0 + 4 * LANES <= d {
            let mut acc = [_mm512_setzero_ps(); 4];
            for (&w, &r) in p.iter().zip(rows) {
                let wv = _mm512_set1_ps(w);
                for (j, a) in acc.iter_mut().enumerate() {
                    // SAFETY (caller): columns c0 .. c0 + 64 of the row are inside v.
                    let x = unsafe { _mm512_loadu_ps(v.as_ptr().add(base(r) + c0 + j * LANES)) };
                    *a = _mm512_add_ps(*a, _mm512_mul_ps(wv, x));
                }
            }
            for (j, a) in acc.iter().enumerate() {
                // SAFETY: c0 + 64 <= d.
                unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(c0 + j * LANES), *a) };
            }
            c0 += 4 * LANES;
        }
        while c0 + LANES <= d {
            let mut acc = _mm512_setzero_ps();
            for (&w, &r) in p.iter().zip(rows) {
                // SAFETY (caller): columns c0 .. c0 + 16 of the row are inside v.
                let x = unsafe { _mm512_loadu_ps(v.as_ptr().add(base(r) + c0)) };
                acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(w), x));
            }
            // SAFETY: c0 + 16 <= d.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(c0), acc) };
            c0 += LANES;
        }
        // SAFETY: as above, for the last columns.
        unsafe { rest(p, v, rows, (stride, at), c0, out) };
    }

    /// As [`weighted_sum_avx512`], in vectors of 8.
    ///
    /// # Safety
    /// AVX2; as [`weighted_sum_avx512`].
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn weighted_sum_avx2(
        p: &[f32],
        v: &[f32],
        rows: &[u32],
        stride: usize,
        at: usize,
        out: &mut [f32],
    ) {
        let d = out.len();
        let base = |r: u32| r as usize * stride + at;
        let mut c0 = 0;
        // Four registers (32 columns) at a time.
        while c0 + 32 <= d {
            let mut acc = [_mm256_setzero_ps(); 4];
            for (&w, &r) in p.iter().zip(rows) {
                let wv = _mm256_set1_ps(w);
                for (j, a) in acc.iter_mut().enumerate() {
                    // SAFETY (caller): columns c0 .. c0 + 32 of the row are inside v.
                    let x = unsafe { _mm256_loadu_ps(v.as_ptr().add(base(r) + c0 + j * 8)) };
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(wv, x));
                }
            }
            for (j, a) in acc.iter().enumerate() {
                // SAFETY: c0 + 32 <= d.
                unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(c0 + j * 8), *a) };
            }
            c0 += 32;
        }
        // SAFETY: as above, for the last columns.
        unsafe { rest(p, v, rows, (stride, at), c0, out) };
    }

    /// Columns `c0 ..` of the weighted sum, one by one.
    ///
    /// # Safety
    /// As the callers'.
    #[inline(always)]
    unsafe fn rest(
        p: &[f32],
        v: &[f32],
        rows: &[u32],
        (stride, at): (usize, usize),
        c0: usize,
        out: &mut [f32],
    ) {
        for (c, o) in out.iter_mut().enumerate().skip(c0) {
            let mut acc = 0f32;
            for (&w, &r) in p.iter().zip(rows) {
                // SAFETY (caller): column c of every row is inside v.
                acc += w * unsafe { *v.get_unchecked(r as usize * stride + at + c) };
            }
            *o = acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::lowp::{cpu_has, Kernel};
    use crate::rng::Rng;

    const KERNELS: [Kernel; 3] = [Kernel::Portable, Kernel::Avx2, Kernel::Avx512];

    /// Every kernel the CPU has gives the portable kernel's bits, for head widths below one
    /// vector, between vectors and over several, through a shuffled table with repeats; the
    /// portable kernel against f64 within f32 rounding.
    #[test]
    fn kernels_agree_bit_for_bit_and_with_f64() {
        let mut rng = Rng::new(7);
        for &(d, keys) in &[(1, 1), (5, 3), (16, 4), (24, 7), (64, 33), (80, 5), (128, 2), (200, 9)] {
            let stride = d + 3;
            let stored = keys + 4;
            let (at, scale) = (2, 0.125f32);
            let mut gen = |n: usize| -> Vec<f32> {
                (0..n).map(|_| rng.uniform_range(-2.0, 2.0) as f32).collect()
            };
            let q = gen(d);
            let k = gen(stored * stride);
            let v = gen(stored * stride);
            let p = gen(keys);
            let rows: Vec<u32> = (0..keys).map(|t| ((t * 5 + 1) % stored) as u32).collect();
            let mut want_s = vec![0f32; keys];
            let mut want_c = vec![0f32; d];
            scores(Kernel::Portable, &q, &k, (&rows, stride, at), scale, &mut want_s);
            weighted_sum(Kernel::Portable, &p, &v, (&rows, stride, at), &mut want_c);
            for (t, &r) in rows.iter().enumerate() {
                let row = r as usize * stride + at;
                let exact: f64 = (0..d).map(|i| q[i] as f64 * k[row + i] as f64).sum::<f64>();
                let bound: f64 = (0..d).map(|i| (q[i] * k[row + i]).abs() as f64).sum::<f64>();
                let got = want_s[t] as f64 / scale as f64;
                assert!((got - exact).abs() <= 1e-6 * (bound + 1.0), "d {d}: {got} vs {exact}");
            }
            for c in 0..d {
                let mut plain = 0f32;
                for (t, &r) in rows.iter().enumerate() {
                    plain += p[t] * v[r as usize * stride + at + c];
                }
                assert_eq!(want_c[c].to_bits(), plain.to_bits(), "d {d}, column {c}");
            }
            for kernel in KERNELS.into_iter().filter(|&k| cpu_has(k)) {
                let mut s = vec![f32::NAN; keys];
                let mut c = vec![f32::NAN; d];
                scores(kernel, &q, &k, (&rows, stride, at), scale, &mut s);
                weighted_sum(kernel, &p, &v, (&rows, stride, at), &mut c);
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&s), bits(&want_s), "{} scores, d {d}", kernel.name());
                assert_eq!(bits(&c), bits(&want_c), "{} values, d {d}", kernel.name());
            }
        }
    }

    #[test]
    fn no_keys_give_a_zero_sum() {
        let mut c = vec![f32::NAN; 20];
        for kernel in KERNELS.into_iter().filter(|&k| cpu_has(k)) {
            weighted_sum(kernel, &[], &[], (&[], 20, 0), &mut c);
            assert!(c.iter().all(|&x| x == 0.0));
            let mut s: [f32; 0] = [];
            scores(kernel, &[1.0; 20], &[], (&[], 20, 0), 1.0, &mut s);
        }
    }
}
