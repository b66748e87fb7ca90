//! The softmax of one decode step's scores, with a vectorised exponential:
//!
//! ```text
//! p_t = e^{s_t − m} / Σ_u e^{s_u − m},   m = max_u s_u
//! e^x = 2^n · e^r,   n = round(x · log₂e),   r = x − n ln 2 ∈ [−ln2/2, ln2/2]
//! ```
//!
//! `e^r` is Cephes' degree-6 polynomial (`expf`, as [`exp_f32`](super::softmax::exp_f32)), and
//! `2^n` is applied in two exact halves, `(e^r · 2^⌊n/2⌋) · 2^(n − ⌊n/2⌋)`, so results in
//! float32's subnormal range are rounded once and correctly instead of being flushed: `x` is
//! clamped to `[−104, 89]`, below which `e^x` rounds to 0 and above which it overflows to ∞.
//! NaN stays NaN. Within 2 ulp of the exact value over the whole range (tested against f64).
//!
//! Three implementations of the same operations — portable (16 lanes in plain Rust), AVX2
//! (two 8-lane registers) and AVX-512F (one 16-lane register), chosen by the low-precision
//! kernel switch ([`Kernel`]) — give the same bits: no FMA (a product is rounded before it is
//! added, as in plain Rust), element `i`'s exponential summed into lane `i mod 16`, and the 16
//! lanes added in order. Only the decode step (`step_attention`) uses this; training's and
//! prefill's softmax ([`softmax_inplace`](super::softmax::softmax_inplace), library `exp`)
//! keep their bits.

use super::lowp::Kernel;

/// Running sums of the softmax: element `i` goes to lane `i % LANES`.
const LANES: usize = 16;
/// Below this `e^x` is under half the smallest subnormal: 0 (`e^−104 ≈ 6.8e−46 < 2^−150`).
const LO: f32 = -104.0;
/// Above this `e^x` overflows to ∞ (`ln f32::MAX ≈ 88.72`).
const HI: f32 = 89.0;
const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split so that `n · LN2_HI` is exact for `|n| ≤ 2^9`.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 · 2^23: adding and subtracting it rounds to the nearest integer (ties to even).
const ROUND: f32 = 12_582_912.0;
/// Cephes' `expf` coefficients, highest degree first (then `+ 0.5`, `r² p + r + 1`).
const P: [f32; 5] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
];

/// `2^k` for `k ∈ [−126, 127]`, written into the exponent bits.
#[inline(always)]
fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// `e^x` (see the module's doc), the portable form of the vector kernels' operations.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(LO, HI); // NaN stays NaN
    let n = (x * LOG2_E + ROUND) - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = P[0];
    for c in &P[1..] {
        p = p * r + c;
    }
    p = p * r + 0.5;
    let e_r = p * r * r + r + 1.0;
    // n ∈ [−150, 129]: both halves are normal exponents. NaN: n as i32 is 0, e_r is NaN.
    let n = n as i32;
    let half = n >> 1;
    e_r * pow2(half) * pow2(n - half)
}

/// `x ← e^x` element by element with `kernel` (which the CPU must have).
// Used outside the library only (feature `internals`).
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub fn exp_inplace(kernel: Kernel, xs: &mut [f32]) {
    assert!(super::lowp::cpu_has(kernel), "{} kernel", kernel.name());
    match kernel {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: cpu_has(Avx512) includes AVX-512F.
        Kernel::Avx512 => unsafe { avx512::exp_inplace(xs) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: cpu_has(Avx2) includes AVX2.
        Kernel::Avx2 => unsafe { avx2::exp_inplace(xs) },
        _ => xs.iter_mut().for_each(|x| *x = exp(*x)),
    }
}

/// The kernel [`softmax`] uses here: the widest this CPU has, at or below the kernel cap.
pub fn best_kernel() -> Kernel {
    super::lowp::widest_kernel(super::lowp::cpu_has)
}

/// `row ← softmax(row)` with `kernel` (which the CPU must have; see [`best_kernel`]). An
/// empty row stays empty.
pub fn softmax(kernel: Kernel, row: &mut [f32]) {
    assert!(super::lowp::cpu_has(kernel), "{} kernel", kernel.name());
    if row.is_empty() {
        return;
    }
    match kernel {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: cpu_has(Avx512) includes AVX-512F.
        Kernel::Avx512 => unsafe { avx512::softmax(row) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: cpu_has(Avx2) includes AVX2.
        Kernel::Avx2 => unsafe { avx2::softmax(row) },
        _ => softmax_portable(row),
    }
}

/// The lanes' sum in order, lane 0 first (shared by every kernel).
#[inline(always)]
fn lane_total(lanes: &[f32; LANES]) -> f32 {
    lanes.iter().fold(0.0, |s, &v| s + v)
}

fn softmax_portable(row: &mut [f32]) {
    // The maximum in any order (NaN skipped, as f32::max does).
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut lanes = [0f32; LANES];
    for chunk in row.chunks_mut(LANES) {
        for (x, lane) in chunk.iter_mut().zip(lanes.iter_mut()) {
            *x = exp(*x - max);
            *lane += *x;
        }
    }
    let inv = 1.0 / lane_total(&lanes);
    row.iter_mut().for_each(|x| *x *= inv);
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// [`exp`](super::exp) on 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn exp8(x: __m256) -> __m256 {
        // max / min return their second operand when either is NaN: NaN stays NaN.
        let x = _mm256_min_ps(_mm256_set1_ps(HI), _mm256_max_ps(_mm256_set1_ps(LO), x));
        let round = _mm256_set1_ps(ROUND);
        let n = _mm256_sub_ps(
            _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2_E)), round),
            round,
        );
        let r = _mm256_sub_ps(
            _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(LN2_HI))),
            _mm256_mul_ps(n, _mm256_set1_ps(LN2_LO)),
        );
        let mut p = _mm256_set1_ps(P[0]);
        for &c in &P[1..] {
            p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c));
        }
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(0.5));
        let e_r = _mm256_add_ps(
            _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r),
            _mm256_set1_ps(1.0),
        );
        let n = _mm256_cvttps_epi32(n);
        let half = _mm256_srai_epi32(n, 1);
        let bias = _mm256_set1_epi32(127);
        let pow2 =
            |k: __m256i| _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, bias), 23));
        _mm256_mul_ps(
            _mm256_mul_ps(e_r, pow2(half)),
            pow2(_mm256_sub_epi32(n, half)),
        )
    }

    /// Lane `l` is set where `l < count` (`count ≤ 8`).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn first(count: usize) -> __m256i {
        _mm256_cmpgt_epi32(
            _mm256_set1_epi32(count as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        )
    }

    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    // Used outside the library only (feature `internals`).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub unsafe fn exp_inplace(xs: &mut [f32]) {
        for chunk in xs.chunks_mut(8) {
            let mask = first(chunk.len());
            // SAFETY: the masked lanes are the chunk's elements.
            let v = _mm256_maskload_ps(chunk.as_ptr(), mask);
            _mm256_maskstore_ps(chunk.as_mut_ptr(), mask, exp8(v));
        }
    }

    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub unsafe fn softmax(row: &mut [f32]) {
        let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
        let (n, ptr) = (row.len(), row.as_mut_ptr());
        // Elements at .. at + count (≤ 8) of the row, −∞ past them.
        let load = |at: usize, count: usize| {
            let mask = first(count);
            // SAFETY (callers): at + count ≤ row.len(); masked lanes are not read.
            let v = _mm256_maskload_ps(ptr.add(at), mask);
            (
                _mm256_blendv_ps(neg_inf, v, _mm256_castsi256_ps(mask)),
                mask,
            )
        };
        let mut max = neg_inf;
        for at in (0..n).step_by(8) {
            // A NaN (first operand) leaves the running maximum, as f32::max skips it.
            max = _mm256_max_ps(load(at, (n - at).min(8)).0, max);
        }
        let mut lanes = [0f32; LANES];
        // SAFETY: `lanes` holds 16 f32.
        _mm256_storeu_ps(lanes.as_mut_ptr(), max);
        let m = lanes[..8].iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let m_v = _mm256_set1_ps(m);
        let mut sums = [_mm256_setzero_ps(); 2];
        for at in (0..n).step_by(8) {
            let (v, mask) = load(at, (n - at).min(8));
            // Past the row e^(−∞ − m) = 0 (m finite), and adding 0 leaves a lane's sum.
            let e = exp8(_mm256_sub_ps(v, m_v));
            let e = _mm256_and_ps(e, _mm256_castsi256_ps(mask));
            let s = &mut sums[(at / 8) % 2];
            *s = _mm256_add_ps(*s, e);
            // SAFETY: the masked lanes are elements of the row.
            _mm256_maskstore_ps(ptr.add(at), mask, e);
        }
        _mm256_storeu_ps(lanes.as_mut_ptr(), sums[0]);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), sums[1]);
        let inv = _mm256_set1_ps(1.0 / lane_total(&lanes));
        for at in (0..n).step_by(8) {
            let (v, mask) = load(at, (n - at).min(8));
            // SAFETY: the masked lanes are elements of the row.
            _mm256_maskstore_ps(ptr.add(at), mask, _mm256_mul_ps(v, inv));
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;
    use std::arch::x86_64::*;

    /// [`exp`](super::exp) on 16 lanes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn exp16(x: __m512) -> __m512 {
        // max / min return their second operand when either is NaN: NaN stays NaN.
        let x = _mm512_min_ps(_mm512_set1_ps(HI), _mm512_max_ps(_mm512_set1_ps(LO), x));
        let round = _mm512_set1_ps(ROUND);
        let n = _mm512_sub_ps(
            _mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(LOG2_E)), round),
            round,
        );
        let r = _mm512_sub_ps(
            _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(LN2_HI))),
            _mm512_mul_ps(n, _mm512_set1_ps(LN2_LO)),
        );
        let mut p = _mm512_set1_ps(P[0]);
        for &c in &P[1..] {
            p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(c));
        }
        p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(0.5));
        let e_r = _mm512_add_ps(
            _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r),
            _mm512_set1_ps(1.0),
        );
        let n = _mm512_cvttps_epi32(n);
        let half = _mm512_srai_epi32(n, 1);
        let bias = _mm512_set1_epi32(127);
        let pow2 =
            |k: __m512i| _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k, bias), 23));
        _mm512_mul_ps(
            _mm512_mul_ps(e_r, pow2(half)),
            pow2(_mm512_sub_epi32(n, half)),
        )
    }

    /// Lane `l` is set where `l < count` (`count ≤ 16`).
    #[inline(always)]
    fn first(count: usize) -> __mmask16 {
        ((1u32 << count) - 1) as __mmask16
    }

    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    // Used outside the library only (feature `internals`).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub unsafe fn exp_inplace(xs: &mut [f32]) {
        for chunk in xs.chunks_mut(16) {
            let mask = first(chunk.len());
            // SAFETY: the masked lanes are the chunk's elements.
            let v = _mm512_maskz_loadu_ps(mask, chunk.as_ptr());
            _mm512_mask_storeu_ps(chunk.as_mut_ptr(), mask, exp16(v));
        }
    }

    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn softmax(row: &mut [f32]) {
        let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
        let (n, ptr) = (row.len(), row.as_mut_ptr());
        // Elements at .. at + count (≤ 16) of the row, −∞ past them.
        let load = |at: usize, count: usize| {
            let mask = first(count);
            // SAFETY (callers): at + count ≤ row.len(); masked lanes are not read.
            (_mm512_mask_loadu_ps(neg_inf, mask, ptr.add(at)), mask)
        };
        let mut max = neg_inf;
        for at in (0..n).step_by(16) {
            // A NaN (first operand) leaves the running maximum, as f32::max skips it.
            max = _mm512_max_ps(load(at, (n - at).min(16)).0, max);
        }
        let mut lanes = [0f32; LANES];
        // SAFETY: `lanes` holds 16 f32.
        _mm512_storeu_ps(lanes.as_mut_ptr(), max);
        let m_v = _mm512_set1_ps(lanes.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)));
        let mut sum = _mm512_setzero_ps();
        for at in (0..n).step_by(16) {
            let (v, mask) = load(at, (n - at).min(16));
            // Past the row the lanes add 0, which leaves their sums.
            let e = _mm512_maskz_mov_ps(mask, exp16(_mm512_sub_ps(v, m_v)));
            sum = _mm512_add_ps(sum, e);
            // SAFETY: the masked lanes are elements of the row.
            _mm512_mask_storeu_ps(ptr.add(at), mask, e);
        }
        _mm512_storeu_ps(lanes.as_mut_ptr(), sum);
        let inv = _mm512_set1_ps(1.0 / lane_total(&lanes));
        for at in (0..n).step_by(16) {
            let (v, mask) = load(at, (n - at).min(16));
            // SAFETY: the masked lanes are elements of the row.
            _mm512_mask_storeu_ps(ptr.add(at), mask, _mm512_mul_ps(v, inv));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::lowp::cpu_has;

    /// The kernels this CPU runs, portable first.
    fn kernels() -> Vec<Kernel> {
        Kernel::ALL.into_iter().filter(|&k| cpu_has(k)).collect()
    }

    /// f32's spacing at `v` (the subnormals' 2^−149 below the normal range).
    fn ulp(v: f64) -> f64 {
        let smallest = f64::from(f32::from_bits(1));
        let v = v.abs() as f32;
        if v < f32::MIN_POSITIVE {
            smallest
        } else {
            f64::from(f32::from_bits(v.to_bits() + 1) - v)
        }
    }

    /// Every kernel's `e^x` against f64's over the whole range, densely (normal results,
    /// subnormal ones, the overflow and underflow edges), and at the special values: −∞ and
    /// every `x < −104` give 0, `+∞` and `x > 88.73` give ∞, NaN stays NaN, `e^0 = 1`. The
    /// kernels give the same bits.
    #[test]
    fn exp_is_within_two_ulp_of_f64_on_every_kernel() {
        let mut xs: Vec<f32> = (0..=400_000)
            .map(|i| (-110.0 + 200.0 * f64::from(i) / 400_000.0) as f32)
            .collect();
        xs.extend([
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            88.72,
            88.7228,
            88.723,
            -87.33,
            -103.9,
            -1e30,
            f32::MIN,
            f32::MAX,
            f32::NEG_INFINITY,
            f32::INFINITY,
        ]);
        let portable: Vec<f32> = xs.iter().map(|&x| exp(x)).collect();
        let mut worst = 0f64;
        for (&x, &got) in xs.iter().zip(&portable) {
            let want = f64::from(x).exp();
            if want > f64::from(f32::MAX) * (1.0 + 0.5f64.powi(24)) {
                assert_eq!(got, f32::INFINITY, "e^{x}");
            } else {
                let err = (f64::from(got) - want).abs() / ulp(want);
                assert!(err <= 2.0, "e^{x} = {got:e}, f64 {want:e}: {err} ulp");
                worst = worst.max(err);
            }
        }
        assert!(
            worst > 0.4,
            "the grid reached no rounding at all ({worst} ulp)"
        );
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-104.0), 0.0);
        assert!(
            exp(-100.0) > 0.0 && exp(-100.0) < f32::MIN_POSITIVE,
            "subnormal"
        );
        assert!(exp(f32::NAN).is_nan());
        for kernel in kernels() {
            // Lengths that leave every tail of 8 and 16.
            let mut got = xs.clone();
            exp_inplace(kernel, &mut got[..xs.len() - 5]);
            exp_inplace(kernel, &mut got[xs.len() - 5..]);
            let same = got
                .iter()
                .zip(&portable)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{kernel:?} differs from the portable exp");
            let mut nan = [f32::NAN; 3];
            exp_inplace(kernel, &mut nan);
            assert!(nan.iter().all(|v| v.is_nan()), "{kernel:?}: {nan:?}");
        }
    }

    /// Every kernel's softmax against f64 on rows of every length around the vector widths
    /// (1 .. 40, and 1000), with the maximum anywhere, −∞ scores (weight exactly 0) and far
    /// negative ones; the kernels give the portable bits.
    #[test]
    fn softmax_matches_f64_and_the_kernels_agree() {
        let mut state = 77u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 40) as f64 / (1u64 << 24) as f64
        };
        let lens = (1..=40).chain([1000]);
        for len in lens {
            for case in 0..3 {
                let row: Vec<f32> = (0..len)
                    .map(|i| match (case, i % 7) {
                        (1, 3) => f32::NEG_INFINITY,
                        (2, 5) => -1e30,
                        _ => (next() * 30.0 - 15.0) as f32,
                    })
                    .collect();
                let max = row
                    .iter()
                    .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
                let e: Vec<f64> = row.iter().map(|&v| (f64::from(v) - max).exp()).collect();
                let z: f64 = e.iter().sum();
                let mut want = row.clone();
                softmax(Kernel::Portable, &mut want);
                for (i, (&got, &ei)) in want.iter().zip(&e).enumerate() {
                    let p = ei / z;
                    // exp's 2 ulp, the sum's and the division's rounding, and f32's rounding
                    // of s − max (half an ulp of it: relative error up to |s − max| 2^−24).
                    let gap = (max - f64::from(row[i])).min(1e30); // −∞ scores: p = 0
                    let tol = p * (1e-6 + gap * 0.5f64.powi(24)) + 1e-30;
                    assert!(
                        (f64::from(got) - p).abs() <= tol,
                        "len {len} case {case} [{i}]: {got} vs {p}"
                    );
                    if row[i] == f32::NEG_INFINITY {
                        assert_eq!(got, 0.0);
                    }
                }
                for kernel in kernels() {
                    let mut got = row.clone();
                    softmax(kernel, &mut got);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{kernel:?} len {len} case {case}: {got:?} vs {want:?}"
                    );
                }
            }
        }
        let mut empty: [f32; 0] = [];
        softmax(Kernel::Portable, &mut empty);
    }
}
