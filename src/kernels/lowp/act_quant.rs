//! Activations to 8 bits, 32 at a time, in the three forms the block products meet, with a
//! portable loop and AVX2 / AVX-512 versions that give the same bytes and sums:
//!
//! ```text
//! amax = max_j |x_j|                                 (NaN elements skipped, as f32::max does)
//! round-last  (Q8_0, the block GEMM):  p_j = round(clamp(x_j · inv, −127, 127))
//! round-first (Q8_K):                  p_j = clamp(round(x_j · inv), −128, 127)
//! round = to nearest, ties to even ((x + 1.5·2²³) − 1.5·2²³); a NaN quantises to 0
//! ```
//!
//! The maximum is exact in any order, and every element's steps are the same IEEE operations
//! in every version, so the versions agree bit for bit (tested on zeros, ties, huge values,
//! subnormals, infinities and NaN).

use super::{round_small, Kernel};

/// Elements per call.
pub(super) const N: usize = 32;

/// `max_j |x_j|`, NaN skipped, with `kernel` (which must run on this CPU).
pub(super) fn amax(kernel: Kernel, x: &[f32; N]) -> f32 {
    match kernel {
        // SAFETY: the caller's kernel runs on this CPU.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => unsafe { x86::amax_avx512(x) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { x86::amax_avx2(x) },
        _ => x.iter().fold(0f32, |m, v| m.max(v.abs())),
    }
}

/// `p_j` of `x_j · inv` into `p` (round-last, or round-first when `ROUND_FIRST`), and
/// `Σ_j p_j`, with `kernel` (which must run on this CPU).
pub(super) fn round<const ROUND_FIRST: bool>(
    kernel: Kernel,
    x: &[f32; N],
    inv: f32,
    p: &mut [i8; N],
) -> i32 {
    match kernel {
        // SAFETY: the caller's kernel runs on this CPU.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => unsafe { x86::round_avx512::<ROUND_FIRST>(x, inv, p) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { x86::round_avx2::<ROUND_FIRST>(x, inv, p) },
        _ => {
            let mut sum = 0i32;
            for (q, &v) in p.iter_mut().zip(x) {
                let r = if ROUND_FIRST {
                    round_small(v * inv).clamp(-128.0, 127.0)
                } else {
                    round_small((v * inv).clamp(-127.0, 127.0))
                } as i32;
                sum += r;
                *q = r as i8;
            }
            sum
        }
    }
}

/// One block in the form of the `Q4_0`/`Q4_1`/`Q8_0` products (the row kernels and the block
/// GEMM): `e = amax / 127`, then round-last with `inv = 1 / e` (0 for an all-zero block), into
/// `p`; returns `(e, Σ_j p_j)`.
pub(super) fn by_scale(kernel: Kernel, x: &[f32; N], p: &mut [i8; N]) -> (f32, i32) {
    let e = amax(kernel, x) / 127.0;
    let inv = if e > 0.0 { 1.0 / e } else { 0.0 };
    (e, round::<false>(kernel, x, inv, p))
}

/// The clamp bounds of each form.
const fn bounds(round_first: bool) -> (f32, f32) {
    if round_first {
        (-128.0, 127.0)
    } else {
        (-127.0, 127.0)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{bounds, N};
    use std::arch::x86_64::*;

    const MAGIC: f32 = 12_582_912.0;

    /// # Safety
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn amax_avx512(x: &[f32; N]) -> f32 {
        // SAFETY: 2 × 16 floats of x.
        let v = unsafe { [_mm512_loadu_ps(x.as_ptr()), _mm512_loadu_ps(x.as_ptr().add(16))] };
        // vmaxps returns its second operand where the first is NaN: NaN elements are
        // skipped and the running maximum never holds one.
        let m = v.iter().fold(_mm512_setzero_ps(), |m, &v| _mm512_max_ps(_mm512_abs_ps(v), m));
        _mm512_reduce_max_ps(m)
    }

    /// # Safety
    /// AVX-512F/BW.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn round_avx512<const ROUND_FIRST: bool>(
        x: &[f32; N],
        inv: f32,
        p: &mut [i8; N],
    ) -> i32 {
        let (lo, hi) = bounds(ROUND_FIRST);
        let (lo, hi) = (_mm512_set1_ps(lo), _mm512_set1_ps(hi));
        let (inv, magic) = (_mm512_set1_ps(inv), _mm512_set1_ps(MAGIC));
        let mut sum = _mm512_setzero_si512();
        for half in 0..2 {
            // SAFETY: floats 16·half .. + 16 of x.
            let y = _mm512_mul_ps(unsafe { _mm512_loadu_ps(x.as_ptr().add(16 * half)) }, inv);
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(y, y);
            let r = if ROUND_FIRST {
                let r = _mm512_sub_ps(_mm512_add_ps(y, magic), magic);
                _mm512_min_ps(_mm512_max_ps(r, lo), hi)
            } else {
                let c = _mm512_min_ps(_mm512_max_ps(y, lo), hi);
                _mm512_sub_ps(_mm512_add_ps(c, magic), magic)
            };
            // NaN quantises to 0, as `NaN as i32` is 0.
            let q = _mm512_maskz_mov_epi32(!nan, _mm512_cvttps_epi32(r));
            sum = _mm512_add_epi32(sum, q);
            let bytes = _mm512_cvtepi32_epi8(q);
            // SAFETY: bytes 16·half .. + 16 of p.
            unsafe { _mm_storeu_si128(p.as_mut_ptr().add(16 * half) as *mut __m128i, bytes) };
        }
        _mm512_reduce_add_epi32(sum)
    }

    /// # Safety
    /// AVX2.
    #[target_feature(enable = "avx2")]
    pub unsafe fn amax_avx2(x: &[f32; N]) -> f32 {
        // SAFETY: 4 × 8 floats of x.
        let v: [__m256; 4] =
            std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * i)) });
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        // vmaxps returns its second operand where the first is NaN (see amax_avx512).
        let m = v.iter().fold(_mm256_setzero_ps(), |m, &v| _mm256_max_ps(_mm256_and_ps(v, abs), m));
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)))
    }

    /// # Safety
    /// AVX2.
    #[target_feature(enable = "avx2")]
    pub unsafe fn round_avx2<const ROUND_FIRST: bool>(
        x: &[f32; N],
        inv: f32,
        p: &mut [i8; N],
    ) -> i32 {
        let (lo, hi) = bounds(ROUND_FIRST);
        let (lo, hi) = (_mm256_set1_ps(lo), _mm256_set1_ps(hi));
        let (inv, magic) = (_mm256_set1_ps(inv), _mm256_set1_ps(MAGIC));
        let q: [__m256i; 4] = std::array::from_fn(|i| {
            // SAFETY: floats 8i .. + 8 of x.
            let y = _mm256_mul_ps(unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * i)) }, inv);
            let number = _mm256_cmp_ps::<_CMP_ORD_Q>(y, y);
            let r = if ROUND_FIRST {
                let r = _mm256_sub_ps(_mm256_add_ps(y, magic), magic);
                _mm256_min_ps(_mm256_max_ps(r, lo), hi)
            } else {
                let c = _mm256_min_ps(_mm256_max_ps(y, lo), hi);
                _mm256_sub_ps(_mm256_add_ps(c, magic), magic)
            };
            // NaN quantises to 0, as `NaN as i32` is 0.
            _mm256_and_si256(_mm256_cvttps_epi32(r), _mm256_castps_si256(number))
        });
        let t = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let t = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t));
        let t = _mm_add_epi32(t, _mm_shuffle_epi32::<0b01_00_11_10>(t));
        let t = _mm_add_epi32(t, _mm_shuffle_epi32::<0b10_11_00_01>(t));
        // Per 128-bit lane the packs give [q0 0-3, q1 0-3, q2 0-3, q3 0-3 | q0 4-7, ...] in
        // dwords of four bytes; the permutation puts each vector's eight back in order.
        let bytes =
            _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        // SAFETY: the 32 bytes of p.
        unsafe { _mm256_storeu_si256(p.as_mut_ptr() as *mut __m256i, bytes) };
        _mm_cvtsi128_si32(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks that reach the quantisers' edges, and random ones of every magnitude.
    fn blocks() -> Vec<[f32; N]> {
        let mut state = 47u64;
        let mut unit = move || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 40) as f64 / (1u64 << 23) as f64 - 1.0) as f32
        };
        let mut blocks: Vec<[f32; N]> = vec![
            [0.0; N],
            [-0.0; N],
            std::array::from_fn(|j| (j as f32 - 16.0) * 0.5),
            std::array::from_fn(|j| if j == 5 { 3e38 } else { j as f32 }),
            std::array::from_fn(|j| (j as f32 + 1.0) * 1e-44),
            std::array::from_fn(|j| [f32::INFINITY, -1.0, f32::NEG_INFINITY, 2.0][j % 4]),
            std::array::from_fn(|j| if j % 7 == 3 { f32::NAN } else { j as f32 - 9.5 }),
            [f32::NAN; N],
        ];
        for scale in [1e-30f32, 1e-3, 1.0, 1e3, 1e30] {
            for _ in 0..20 {
                blocks.push(std::array::from_fn(|_| unit() * scale));
            }
        }
        blocks
    }

    /// Every SIMD version gives the portable maximum, bytes and sums, bit for bit, in both
    /// forms, for the scales the callers use (1 / e, 127 / amax, −127 / max) and extreme ones.
    #[test]
    fn simd_versions_equal_the_portable_one_bit_for_bit() {
        let kernels: Vec<Kernel> = [Kernel::Avx2, Kernel::Avx512]
            .into_iter()
            .filter(|&k| super::super::cpu_has(k))
            .collect();
        if kernels.is_empty() {
            eprintln!("skipped: this CPU has neither the AVX2 nor the AVX-512 kernel");
        }
        for (i, x) in blocks().iter().enumerate() {
            let m = amax(Kernel::Portable, x);
            let invs = [
                if m > 0.0 { 1.0 / (m / 127.0) } else { 0.0 },
                if m != 0.0 { 127.0 / m } else { 0.0 },
                -127.0 / x[3],
                f32::INFINITY,
                0.0,
            ];
            for &kernel in &kernels {
                assert_eq!(amax(kernel, x).to_bits(), m.to_bits(), "block {i} {kernel:?}");
                for inv in invs {
                    let mut want = [0i8; N];
                    let mut got = [0i8; N];
                    let s = round::<false>(Kernel::Portable, x, inv, &mut want);
                    assert_eq!(round::<false>(kernel, x, inv, &mut got), s, "block {i} {kernel:?}");
                    assert_eq!(got, want, "block {i} {kernel:?} inv {inv}: round-last");
                    let s = round::<true>(Kernel::Portable, x, inv, &mut want);
                    assert_eq!(round::<true>(kernel, x, inv, &mut got), s, "block {i} {kernel:?}");
                    assert_eq!(got, want, "block {i} {kernel:?} inv {inv}: round-first");
                }
            }
        }
    }
}
