//! bf16 weights and activations, f32 accumulation: `y_ro = Σ_k bf16(x_rk) · bf16(w_ok)`.
//!
//! bf16 is the top half of an f32 (8 exponent, 7 mantissa bits); [`f32_to_bf16`] rounds to the
//! nearest, ties to even, as `vcvtneps2bf16` does. A product of two bf16 numbers has at most
//! 16 significant bits, so it is exact in f32; the sum is in f32 lanes, 2 products per lane
//! per step of 32 elements (`vdpbf16ps`, two chains of lanes for even and odd steps; the
//! portable kernel sums in one chain of the same lanes, so the two differ by f32 rounding of
//! the sums and where the hardware flushes subnormals to zero). Rows are padded with zeros to a multiple of 32 elements.
//!
//! On AVX2 (+FMA) there is no bf16 instruction: the kernel widens each bf16 to f32 (a mask or
//! a shift of 16 bits) and multiplies with FMA in the portable kernel's lanes and order, so it
//! gives the portable bits. It reads half the bytes of float32 weights, but it does float32's
//! multiply-adds plus the widening: bf16 gains on AVX2 only where the product waits on memory
//! (one or a few activation rows against weights larger than the caches, i.e. decoding); for
//! batched products (prefill, training, many rows) float32's packed GEMM is as fast or faster.

use super::{Kernel, PackedFormat};

/// Elements per step of the kernels (one 512-bit register of bf16).
const STEP: usize = 32;

/// f32 -> bf16, round to nearest even; NaN stays a (quiet) NaN.
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) as u16) | 0x0040;
    }
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1));
    (rounded >> 16) as u16
}

/// bf16 -> f32 (exact).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// `x` rounded to the nearest bf16 value (ties to even), kept in an f32: the same as
/// `bf16_to_f32(f32_to_bf16(x))`, branch-free so that a loop of it vectorises.
#[inline(always)]
pub fn round_to_bf16(x: f32) -> f32 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) & 0xffff_0000;
    let nan = (b | 0x0040_0000) & 0xffff_0000;
    f32::from_bits(if x.is_nan() { nan } else { rounded })
}

/// Every element of `x` rounded to bf16 ([`round_to_bf16`]), as f32 values.
pub fn rounded_to_bf16(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| round_to_bf16(v)).collect()
}

/// `W [rows, cols]` in bf16, each row padded with zeros to `stride` (a multiple of 32).
#[derive(Clone, Debug)]
pub struct Bf16Matrix {
    rows: usize,
    cols: usize,
    stride: usize,
    /// [rows, stride]
    data: Vec<u16>,
}

/// Activations `[n, stride]` in bf16, zero-padded like the weight rows.
pub struct Bf16Acts {
    stride: usize,
    data: Vec<u16>,
}

fn to_padded_bf16(x: &[f32], n: usize, cols: usize, stride: usize) -> Vec<u16> {
    let mut data = vec![0u16; n * stride];
    for (dst, src) in data.chunks_exact_mut(stride).zip(x.chunks_exact(cols)) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = f32_to_bf16(s);
        }
    }
    data
}

impl Bf16Matrix {
    /// Rounds `w [rows, cols]` to bf16.
    pub fn from_f32(w: &[f32], rows: usize, cols: usize) -> Bf16Matrix {
        assert_eq!(w.len(), rows * cols, "bf16 weight is not [rows, cols]");
        let stride = cols.div_ceil(STEP).max(1) * STEP;
        Bf16Matrix {
            rows,
            cols,
            stride,
            data: to_padded_bf16(w, rows, cols, stride),
        }
    }

    /// Weight `(o, k)` as f32.
    pub fn get(&self, o: usize, k: usize) -> f32 {
        bf16_to_f32(self.data[o * self.stride + k])
    }

    pub fn bytes(&self) -> usize {
        self.data.len() * 2
    }

    fn row(&self, o: usize) -> &[u16] {
        &self.data[o * self.stride..(o + 1) * self.stride]
    }
}

/// The portable kernel: 16 f32 lanes, each adding the odd then the even product of its pair.
fn dot_portable(w: &[u16], x: &[u16]) -> f32 {
    let mut lanes = [0f32; 16];
    for (wc, xc) in w.chunks_exact(STEP).zip(x.chunks_exact(STEP)) {
        for (l, lane) in lanes.iter_mut().enumerate() {
            *lane += bf16_to_f32(wc[2 * l + 1]) * bf16_to_f32(xc[2 * l + 1]);
            *lane += bf16_to_f32(wc[2 * l]) * bf16_to_f32(xc[2 * l]);
        }
    }
    lanes.iter().sum()
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// `out[i] = Σ_k w_k x_{i,k}` for `R` activation rows.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX-512 BF16, and `w` and every `xs[i]` must hold the same
    /// multiple of 32 elements.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn dot_rows<const R: usize>(w: &[u16], xs: [&[u16]; R], out: &mut [f32]) {
        // Two chains per row (even and odd steps), so one row does not wait on the latency
        // of a single chain.
        let mut acc = [[_mm512_setzero_ps(); R]; 2];
        let n = w.len() / 32;
        macro_rules! step {
            ($c:expr, $set:expr) => {{
                let c = $c;
                // SAFETY (caller): 32 u16 from element 32c lie inside `w` and each `xs[r]`;
                // loadu has no alignment requirement; __m512i and __m512bh are both 64 plain
                // bytes.
                let wv: __m512bh = std::mem::transmute(_mm512_loadu_si512(
                    w.as_ptr().add(32 * c) as *const __m512i
                ));
                for r in 0..R {
                    let xv: __m512bh = std::mem::transmute(_mm512_loadu_si512(
                        xs[r].as_ptr().add(32 * c) as *const __m512i,
                    ));
                    acc[$set][r] = _mm512_dpbf16_ps(acc[$set][r], wv, xv);
                }
            }};
        }
        let mut c = 0;
        while c + 1 < n {
            step!(c, 0);
            step!(c + 1, 1);
            c += 2;
        }
        if c < n {
            step!(c, 0);
        }
        for r in 0..R {
            out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][r], acc[1][r]));
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// `out[i] = Σ_k w_k x_{i,k}` for `R` activation rows, in the portable kernel's 16 lanes
    /// and order: lane `l` of a step of 32 adds the product of elements `2l + 1`, then of
    /// `2l`. A bf16 word pair widens to f32 by masking (the odd element, the high half) and
    /// shifting (the even one); a product of two bf16 is exact in f32, so `fma(w, x, acc)`
    /// rounds as the portable `acc + w · x` does: the same bits, unless a product falls
    /// below f32's normal range (subnormal products are rounded once here, twice there).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA, and `w` and every `xs[i]` must hold the same multiple
    /// of 32 elements.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_rows<const R: usize>(w: &[u16], xs: [&[u16]; R], out: &mut [f32]) {
        let high = _mm256_set1_epi32(0xffff_0000_u32 as i32);
        // Lanes 0..8 and 8..16 of each row.
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for c in 0..w.len() / 32 {
            // h names the half's accumulators and its offset in w and x alike.
            #[allow(clippy::needless_range_loop)]
            for h in 0..2 {
                // SAFETY (caller): 16 u16 from element 32c + 16h lie inside `w` and each
                // `xs[r]`; loadu has no alignment requirement.
                let wv = _mm256_loadu_si256(w.as_ptr().add(32 * c + 16 * h) as *const __m256i);
                let w_odd = _mm256_castsi256_ps(_mm256_and_si256(wv, high));
                let w_even = _mm256_castsi256_ps(_mm256_slli_epi32(wv, 16));
                for r in 0..R {
                    let xv =
                        _mm256_loadu_si256(xs[r].as_ptr().add(32 * c + 16 * h) as *const __m256i);
                    let x_odd = _mm256_castsi256_ps(_mm256_and_si256(xv, high));
                    let x_even = _mm256_castsi256_ps(_mm256_slli_epi32(xv, 16));
                    acc[r][h] = _mm256_fmadd_ps(w_odd, x_odd, acc[r][h]);
                    acc[r][h] = _mm256_fmadd_ps(w_even, x_even, acc[r][h]);
                }
            }
        }
        for r in 0..R {
            let mut lanes = [0f32; 16];
            // SAFETY: `lanes` holds 16 f32, two stores of 8.
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc[r][0]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[r][1]);
            // The portable kernel's final sum, lane 0 first.
            out[r] = lanes.iter().sum();
        }
    }
}

impl PackedFormat for Bf16Matrix {
    type Acts = Bf16Acts;

    fn rows(&self) -> usize {
        self.rows
    }

    fn cols(&self) -> usize {
        self.cols
    }

    fn runs(&self, kernel: Kernel) -> bool {
        match kernel {
            Kernel::Portable => true,
            Kernel::Avx2 => super::has_avx2(),
            Kernel::Avx512 => super::has_avx512_bf16(),
        }
    }

    fn quantize_acts(&self, x: &[f32], n: usize) -> Bf16Acts {
        Bf16Acts {
            stride: self.stride,
            data: to_padded_bf16(x, n, self.cols, self.stride),
        }
    }

    fn tile(&self, kernel: Kernel, acts: &Bf16Acts, o: usize, r0: usize, out: &mut [f32]) {
        let w = self.row(o);
        let x = |i: usize| &acts.data[(r0 + i) * acts.stride..(r0 + i + 1) * acts.stride];
        match kernel {
            Kernel::Portable => {
                for (i, v) in out.iter_mut().enumerate() {
                    *v = dot_portable(w, x(i));
                }
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => {
                // SAFETY: product_with only passes Avx512 after runs(Avx512) (the CPU has
                // AVX-512F and BF16); every row here is `stride` long, a multiple of 32.
                unsafe {
                    match out.len() {
                        1 => avx512::dot_rows(w, [x(0)], out),
                        2 => avx512::dot_rows(w, [x(0), x(1)], out),
                        3 => avx512::dot_rows(w, [x(0), x(1), x(2)], out),
                        _ => avx512::dot_rows(w, [x(0), x(1), x(2), x(3)], out),
                    }
                }
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                // SAFETY: product_with only passes Avx2 after runs(Avx2) (the CPU has AVX2 and
                // FMA); every row here is `stride` long, a multiple of 32.
                unsafe {
                    match out.len() {
                        1 => avx2::dot_rows(w, [x(0)], out),
                        2 => avx2::dot_rows(w, [x(0), x(1)], out),
                        3 => avx2::dot_rows(w, [x(0), x(1), x(2)], out),
                        _ => avx2::dot_rows(w, [x(0), x(1), x(2), x(3)], out),
                    }
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Avx2 | Kernel::Avx512 => {
                unreachable!("runs(Avx2 / Avx512) is false off x86_64")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{has_avx2, product_with};
    use super::*;

    /// The AVX2 kernel, run explicitly, gives the portable kernel's bits (products of normal
    /// bf16 values are exact, the lanes and their order are the same) on every shape class:
    /// rows 1..7 and 17 (tile remainders), d_in shorter than a step of 32, not a multiple of
    /// 16 or 32, d_out of one row and more.
    #[test]
    fn avx2_tile_gives_the_portable_bits() {
        if !has_avx2() {
            eprintln!("skipped: no AVX2 on this CPU");
            return;
        }
        let mut state = 9u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 40) as f64 / (1u64 << 23) as f64 - 1.0) as f32
        };
        for d_in in [1, 7, 16, 31, 33, 45, 100, 257] {
            for d_out in [1, 3, 17] {
                for rows in [1, 2, 3, 4, 5, 7, 17] {
                    let w: Vec<f32> = (0..d_out * d_in).map(|_| next()).collect();
                    let x: Vec<f32> = (0..rows * d_in).map(|_| 3.0 * next()).collect();
                    let m = Bf16Matrix::from_f32(&w, d_out, d_in);
                    let run = |kernel| {
                        let mut y = vec![f32::NAN; rows * d_out];
                        product_with(&m, kernel, &mut y, &x, rows);
                        y
                    };
                    let (want, got) = (run(Kernel::Portable), run(Kernel::Avx2));
                    let same = want
                        .iter()
                        .zip(&got)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{d_out}x{d_in} rows {rows}: {want:?} vs {got:?}");
                    // And the value itself: the f64 sum of the bf16 products, to f32 rounding.
                    for r in 0..rows {
                        for o in 0..d_out {
                            let (mut exact, mut mag) = (0f64, 0f64);
                            for k in 0..d_in {
                                let t = f64::from(m.get(o, k))
                                    * f64::from(round_to_bf16(x[r * d_in + k]));
                                exact += t;
                                mag += t.abs();
                            }
                            let tol = (d_in as f64 / 16.0 + 18.0) * f64::from(f32::EPSILON) * mag;
                            let v = f64::from(got[r * d_out + o]);
                            assert!((v - exact).abs() <= tol + 1e-30, "{v} vs {exact}");
                        }
                    }
                }
            }
        }
    }
}
