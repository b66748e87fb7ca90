//! The two products of one decode step's attention for one query and head over keys and values
//! stored in a packed cache type (`super::kv_blocks`), as `super::step_dots` computes them
//! over floats:
//!
//! ```text
//! s_t = (q · deq(k_{rows[t]})) · scale      (scores)
//! c   = Σ_t p_t deq(v_{rows[t]})            (the weighted sum of the values)
//! ```
//!
//! Each block is unpacked to floats in registers, 16 values at a time, and multiplied there:
//! the query stays f32 (not quantised to q8_0 for an integer dot product as llama.cpp's CPU
//! path does), so the only error is the cache's own, and the attention over a quantised
//! cache equals attention over its dequantised values up to f32 rounding. A step reads each
//! cached byte once and does a few operations per value: it is bound by reading the cache,
//! which the packed types shrink, not by the multiply-adds an integer dot product would save.
//! AVX-512 (with F16C and FMA) where the CPU has it, else AVX2 (eight values a register);
//! elsewhere a portable loop that dequantises a head's slice and reuses the float dot product.
//!
//! Rows stored rotated (`PackedRows::rotation`, `super::hadamard`) are met by the rotated
//! query, `(R q) · deq(pack(R k))`, and the weighted sum of rotated values is rotated back,
//! `R Σ p_t deq(pack(R v_t))`: what attention over the stored rows means, since `R` is
//! orthogonal and its own inverse.

use super::hadamard::rotate;
use super::kv_blocks::{dequantise_row, KvType, PackedRows};
use std::borrow::Cow;
use super::lowp::Kernel;
use super::reduce::lane_dot;

/// The values `at .. at + out.len()` of stored row `r`, unpacked (and rotated back when
/// stored rotated).
pub fn head_values(k: PackedRows<'_>, r: u32, at: usize, out: &mut [f32]) {
    dequantise_row(k.ty, k.head(r, at, out.len()), out);
    if let Some(n) = k.rotation {
        rotate(out, n);
    }
}

/// Whether the AVX2 kernels run for `kernel` (AVX2 or AVX-512 without the AVX-512 path),
/// type `ty` and heads of `d` values.
fn use_avx2(kernel: Kernel, ty: KvType, d: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        kernel != Kernel::Portable
            && ty != KvType::F32
            && d.is_multiple_of(8)
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (kernel, ty, d);
        false
    }
}

/// Whether the AVX-512 kernels run for `kernel`, type `ty` and heads of `d` values.
fn use_avx512(kernel: Kernel, ty: KvType, d: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        kernel == Kernel::Avx512
            && ty != KvType::F32
            && d.is_multiple_of(16)
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (kernel, ty, d);
        false
    }
}

/// `out[t] = (q · key_t) · scale` for every `t`, `d = q.len()`, `key_t` the values `at ..
/// at + d` of stored row `rows[t]` as [`head_values`] reads them.
///
/// # Panics
/// When a key's blocks lie outside `k`, `at` or `d` are not whole blocks, or `out` and `rows`
/// differ in length.
pub fn scores(
    kernel: Kernel,
    q: &[f32],
    k: PackedRows<'_>,
    (rows, at): (&[u32], usize),
    scale: f32,
    out: &mut [f32],
) {
    assert_eq!(rows.len(), out.len());
    let d = q.len();
    assert!(
        at.is_multiple_of(k.ty.block_values()) && d.is_multiple_of(k.ty.block_values()),
        "a head is whole {} blocks",
        k.ty
    );
    if let Some(&last) = rows.iter().max() {
        k.head(last, at, d); // every key's blocks inside k (panics otherwise)
    }
    // Keys stored rotated meet the rotated query.
    let q: Cow<'_, [f32]> = match k.rotation {
        Some(n) => {
            let mut rq = q.to_vec();
            rotate(&mut rq, n);
            Cow::Owned(rq)
        }
        None => Cow::Borrowed(q),
    };
    let (q, k) = (&q[..], PackedRows { rotation: None, ..k });
    #[cfg(target_arch = "x86_64")]
    if use_avx512(kernel, k.ty, d) {
        // SAFETY: AVX-512F/BW, FMA and F16C (use_avx512); every key's blocks are inside k
        // (checked above) and d is a multiple of 16.
        unsafe { x86::scores(q, k, rows, at, scale, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if use_avx2(kernel, k.ty, d) {
        // SAFETY: AVX2, FMA and F16C (use_avx2); every key's blocks are inside k (checked
        // above) and d is a multiple of 8.
        unsafe { x86_avx2::scores(q, k, rows, at, scale, out) };
        return;
    }
    let _ = kernel;
    let mut key = vec![0f32; d];
    for (s, &r) in out.iter_mut().zip(rows) {
        head_values(k, r, at, &mut key);
        *s = lane_dot(q, &key) * scale;
    }
}

/// `out = Σ_t p[t] · value_t`, `d = out.len()`, `value_t` the values `at .. at + d` of
/// stored row `rows[t]` as [`head_values`] reads them.
///
/// # Panics
/// As [`scores`].
pub fn weighted_sum(
    kernel: Kernel,
    p: &[f32],
    v: PackedRows<'_>,
    (rows, at): (&[u32], usize),
    out: &mut [f32],
) {
    assert_eq!(rows.len(), p.len());
    let d = out.len();
    assert!(
        at.is_multiple_of(v.ty.block_values()) && d.is_multiple_of(v.ty.block_values()),
        "a head is whole {} blocks",
        v.ty
    );
    if let Some(&last) = rows.iter().max() {
        v.head(last, at, d);
    }
    // The sum of values stored rotated, rotated back.
    let rotation = v.rotation;
    let v = PackedRows { rotation: None, ..v };
    sum_stored(kernel, p, v, (rows, at), out);
    if let Some(n) = rotation {
        rotate(out, n);
    }
}

/// [`weighted_sum`] of the stored values as they are (`v.rotation` not applied).
fn sum_stored(
    kernel: Kernel,
    p: &[f32],
    v: PackedRows<'_>,
    (rows, at): (&[u32], usize),
    out: &mut [f32],
) {
    let d = out.len();
    #[cfg(target_arch = "x86_64")]
    if use_avx512(kernel, v.ty, d) {
        // SAFETY: as in `scores` (the caller checked every value's blocks and the widths).
        unsafe { x86::weighted_sum(p, v, rows, at, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if use_avx2(kernel, v.ty, d) {
        // SAFETY: as in `scores`, with AVX2 and d a multiple of 8.
        unsafe { x86_avx2::weighted_sum(p, v, rows, at, out) };
        return;
    }
    out.fill(0.0);
    let mut value = vec![0f32; d];
    for (&w, &r) in p.iter().zip(rows) {
        head_values(v, r, at, &mut value);
        for (c, &x) in out.iter_mut().zip(&value) {
            *c += w * x;
        }
    }
}

/// `$kernel::<U>(args)` with `U` the unpacking of the packed type `$ty` (`F16`, `Bf16`, `Q8`,
/// `Q4`: each kernel module's own), for the AVX-512 and AVX2 kernels alike.
#[cfg(target_arch = "x86_64")]
macro_rules! by_kv_type {
    ($ty:expr, $kernel:ident($($arg:expr),*)) => {
        match $ty {
            KvType::F16 => $kernel::<F16>($($arg),*),
            KvType::Bf16 => $kernel::<Bf16>($($arg),*),
            KvType::Q8_0 => $kernel::<Q8>($($arg),*),
            KvType::Q4_0 => $kernel::<Q4>($($arg),*),
            KvType::F32 => unreachable!("f32 keys and values are floats, not packed"),
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::kv_blocks::{KvType, PackedRows};
    use std::arch::x86_64::*;

    /// Values `c .. c + 16` of a head whose bytes start at `h` (c a multiple of 16).
    trait Unpack {
        /// # Safety
        /// AVX-512F/BW and F16C; the 16 values' bytes (and their block's scale) are readable.
        unsafe fn unpack16(h: *const u8, c: usize) -> __m512;
    }
    struct F16;
    struct Bf16;
    struct Q8;
    struct Q4;

    /// The f16 scale at `p`.
    #[inline(always)]
    unsafe fn scale(p: *const u8) -> f32 {
        // SAFETY (caller): two bytes at p; F16C.
        unsafe {
            let h = u16::from_le_bytes([*p, *p.add(1)]);
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))))
        }
    }

    impl Unpack for F16 {
        #[inline(always)]
        unsafe fn unpack16(h: *const u8, c: usize) -> __m512 {
            // SAFETY (caller): 32 bytes at h + 2c.
            unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(h.add(2 * c) as *const __m256i)) }
        }
    }
    impl Unpack for Bf16 {
        #[inline(always)]
        unsafe fn unpack16(h: *const u8, c: usize) -> __m512 {
            // SAFETY (caller): 32 bytes at h + 2c; a bf16 is the top half of its f32.
            unsafe {
                let x = _mm512_cvtepu16_epi32(_mm256_loadu_si256(h.add(2 * c) as *const __m256i));
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(x))
            }
        }
    }
    impl Unpack for Q8 {
        #[inline(always)]
        unsafe fn unpack16(h: *const u8, c: usize) -> __m512 {
            // SAFETY (caller): block c/32 (34 bytes) at h + 34·(c/32).
            unsafe {
                let blk = h.add(c / 32 * 34);
                let qs = _mm_loadu_si128(blk.add(2 + c % 32) as *const __m128i);
                let x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(qs));
                _mm512_mul_ps(_mm512_set1_ps(scale(blk)), x)
            }
        }
    }
    impl Unpack for Q4 {
        #[inline(always)]
        unsafe fn unpack16(h: *const u8, c: usize) -> __m512 {
            // SAFETY (caller): block c/32 (18 bytes) at h + 18·(c/32); values 0..16 of a block
            // are the low nibbles of its 16 bytes, 16..32 the high ones.
            unsafe {
                let blk = h.add(c / 32 * 18);
                let wide = _mm512_cvtepu8_epi32(_mm_loadu_si128(blk.add(2) as *const __m128i));
                let nibbles = if c.is_multiple_of(32) {
                    wide
                } else {
                    _mm512_srli_epi32::<4>(wide)
                };
                let q = _mm512_and_si512(nibbles, _mm512_set1_epi32(15));
                let x = _mm512_cvtepi32_ps(_mm512_sub_epi32(q, _mm512_set1_epi32(8)));
                _mm512_mul_ps(_mm512_set1_ps(scale(blk)), x)
            }
        }
    }

    /// # Safety
    /// AVX-512F/BW, FMA, F16C; every key's head inside `k`; `q.len()` a multiple of 16.
    pub(super) unsafe fn scores(
        q: &[f32],
        k: PackedRows<'_>,
        rows: &[u32],
        at: usize,
        scale: f32,
        out: &mut [f32],
    ) {
        // SAFETY: passed on from the caller.
        unsafe {
            by_kv_type!(k.ty, scores_as(q, k, rows, at, scale, out))
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    unsafe fn scores_as<U: Unpack>(
        q: &[f32],
        k: PackedRows<'_>,
        rows: &[u32],
        at: usize,
        scale: f32,
        out: &mut [f32],
    ) {
        let d = q.len();
        for (s, &r) in out.iter_mut().zip(rows) {
            let h = k.head(r, at, d).as_ptr();
            let mut acc = _mm512_setzero_ps();
            for c in (0..d).step_by(16) {
                // SAFETY (caller): values c .. c + 16 are inside q and the key's head.
                unsafe {
                    acc = _mm512_fmadd_ps(_mm512_loadu_ps(q.as_ptr().add(c)), U::unpack16(h, c), acc)
                };
            }
            *s = _mm512_reduce_add_ps(acc) * scale;
        }
    }

    /// # Safety
    /// As [`scores`], for `v` and `out.len()`.
    pub(super) unsafe fn weighted_sum(
        p: &[f32],
        v: PackedRows<'_>,
        rows: &[u32],
        at: usize,
        out: &mut [f32],
    ) {
        // SAFETY: passed on from the caller.
        unsafe {
            by_kv_type!(v.ty, weighted_sum_as(p, v, rows, at, out))
        }
    }

    /// Four registers (64 columns) at a time over all keys, then one register at a time; the
    /// accumulators stay in registers over the keys.
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    unsafe fn weighted_sum_as<U: Unpack>(
        p: &[f32],
        v: PackedRows<'_>,
        rows: &[u32],
        at: usize,
        out: &mut [f32],
    ) {
        let d = out.len();
        let mut c0 = 0;
        while c0 < d {
            let regs = if c0 + 64 <= d { 4 } else { 1 };
            let mut acc = [_mm512_setzero_ps(); 4];
            for (&w, &r) in p.iter().zip(rows) {
                let h = v.head(r, at, d).as_ptr();
                let wv = _mm512_set1_ps(w);
                for (j, a) in acc.iter_mut().enumerate().take(regs) {
                    // SAFETY (caller): columns c0 + 16j .. + 16 are inside the value's head.
                    *a = _mm512_fmadd_ps(wv, unsafe { U::unpack16(h, c0 + 16 * j) }, *a);
                }
            }
            for (j, a) in acc.iter().enumerate().take(regs) {
                // SAFETY: c0 + 16·regs <= d.
                unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(c0 + 16 * j), *a) };
            }
            c0 += 16 * regs;
        }
    }
}

/// The AVX2 kernels (`x86`'s, eight values a register).
#[cfg(target_arch = "x86_64")]
#[path = "kv_dots_avx2.rs"]
mod x86_avx2;

#[cfg(test)]
mod tests {
    use super::super::kv_blocks::quantise_row;
    use super::*;
    use crate::rng::Rng;

    /// Scores and weighted sums over every packed type, stored plain and rotated (`R_64`),
    /// through a shuffled table and a head at a column offset, with each kernel the CPU has:
    /// against float64 loops over the dequantised values (rotated back by llama.cpp's matrix).
    #[test]
    fn packed_products_match_float64_loops_over_dequantised_values() {
        let (stored, d_kv, d, at) = (37, 192, 64, 128);
        let mut rng = Rng::new(3);
        let x: Vec<f32> = (0..stored * d_kv)
            .map(|_| rng.uniform_range(-2.0, 2.0) as f32)
            .collect();
        let q: Vec<f32> = (0..d).map(|_| rng.uniform_range(-1.0, 1.0) as f32).collect();
        let mut rows: Vec<u32> = (0..stored as u32).collect();
        rng.shuffle(&mut rows);
        rows.truncate(29);
        let p: Vec<f32> = (0..rows.len()).map(|t| 1.0 / (t + 2) as f32).collect();
        let h = crate::kernels::hadamard::hadamard_matrix(64);
        for rotation in [None, Some(64)] {
            for ty in [KvType::F16, KvType::Bf16, KvType::Q8_0, KvType::Q4_0] {
                let rb = ty.row_bytes(d_kv).unwrap();
                let mut bytes = vec![0u8; stored * rb];
                for (r, row) in x.chunks(d_kv).enumerate() {
                    let mut row = row.to_vec();
                    if let Some(n) = rotation {
                        rotate(&mut row, n);
                    }
                    quantise_row(ty, &row, &mut bytes[r * rb..(r + 1) * rb]);
                }
                let packed = PackedRows {
                    ty,
                    bytes: &bytes,
                    row_bytes: rb,
                    rotation,
                };
                // The head's stored values, in float64, rotated back by the matrix.
                let deq = |r: u32| {
                    let mut row = vec![0f32; d_kv];
                    dequantise_row(ty, &bytes[r as usize * rb..(r as usize + 1) * rb], &mut row);
                    let stored: Vec<f64> = row[at..at + d].iter().map(|&v| v as f64).collect();
                    match rotation {
                        None => stored,
                        Some(n) => (0..d)
                            .map(|i| (0..n).map(|j| h[i * n + j] * stored[j]).sum())
                            .collect(),
                    }
                };
                for kernel in Kernel::ALL.into_iter().filter(|&k| crate::kernels::lowp::cpu_has(k)) {
                    let mut s = vec![0f32; rows.len()];
                    scores(kernel, &q, packed, (&rows, at), 0.125, &mut s);
                    let mut c = vec![0f32; d];
                    weighted_sum(kernel, &p, packed, (&rows, at), &mut c);
                    let mut want_c = vec![0f64; d];
                    let mut value = vec![0f32; d];
                    for (t, &r) in rows.iter().enumerate() {
                        let k = deq(r);
                        let dot: f64 = q.iter().zip(&k).map(|(&a, &b)| a as f64 * b).sum();
                        let want = dot * 0.125;
                        let what = format!("{ty} {rotation:?} {kernel:?}");
                        assert!((s[t] as f64 - want).abs() < 1e-5, "{what}: {} vs {want}", s[t]);
                        head_values(packed, r, at, &mut value);
                        for (&got, &want) in value.iter().zip(&k) {
                            assert!((got as f64 - want).abs() < 1e-5, "{what}: {got} vs {want}");
                        }
                        for (w, &v) in want_c.iter_mut().zip(&k) {
                            *w += p[t] as f64 * v;
                        }
                    }
                    for (&got, &want) in c.iter().zip(&want_c) {
                        assert!((got as f64 - want).abs() < 1e-5, "{ty} {kernel:?}: {got} vs {want}");
                    }
                }
            }
        }
    }
}
