//! int8 weights per output row, int8 activations per row (CTranslate2's `int8` compute type):
//!
//! ```text
//! s_o = max_k |w_ok| / 127,  q_ok = round(w_ok / s_o)        (once, at load)
//! t_r = max_k |x_rk| / 127,  p_rk = round(x_rk / t_r)        (every call)
//! y_ro = s_o t_r Σ_k q_ok p_rk
//! ```
//!
//! `vpdpbusd` multiplies unsigned by signed bytes, so the activations are stored as
//! `u_rk = p_rk + 128 ∈ [1, 255]` and the kernel subtracts `128 Σ_k q_ok` (kept per row):
//! `Σ_k q_ok p_rk = Σ_k q_ok u_rk - 128 Σ_k q_ok`. Every sum is an exact i32 (each term is at
//! most 255 · 127, and rows are limited to [`MAX_COLS`] elements), so the portable and the
//! AVX-512 kernel give bit-identical results. Rows are padded to a multiple of 64 with zero
//! weights.

use super::{Kernel, PackedFormat};

/// Bytes per step of the AVX-512 kernel.
const STEP: usize = 64;
/// The longest row: `255 · 127 · MAX_COLS` stays below `i32::MAX`.
pub const MAX_COLS: usize = 65_536;

/// `W [rows, cols]` as int8 with one scale per row.
#[derive(Clone, Debug)]
pub struct Int8Matrix {
    rows: usize,
    cols: usize,
    stride: usize,
    /// [rows, stride], zero-padded.
    q: Vec<i8>,
    /// [rows]: `s_o`.
    scale: Vec<f32>,
    /// [rows]: `Σ_k q_ok`.
    row_sum: Vec<i32>,
}

/// Activations: `u = p + 128` `[n, stride]` and the row scales `t [n]`.
pub struct Int8Acts {
    stride: usize,
    u: Vec<u8>,
    scale: Vec<f32>,
}

/// The symmetric int8 scale and values of one row (`scale` 0 for an all-zero row).
fn quantize_row(row: &[f32], out: &mut [i8]) -> f32 {
    let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = amax / 127.0;
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    for (q, &v) in out.iter_mut().zip(row) {
        *q = super::round_small((v * inv).clamp(-127.0, 127.0)) as i8;
    }
    scale
}

impl Int8Matrix {
    /// Quantises `w [rows, cols]` per row, or says why not (a row longer than `MAX_COLS` (65,536),
    /// a value that is not finite).
    pub fn from_f32(w: &[f32], rows: usize, cols: usize) -> Result<Int8Matrix, String> {
        assert_eq!(w.len(), rows * cols, "int8 weight is not [rows, cols]");
        if cols > MAX_COLS {
            return Err(format!(
                "int8 rows of {cols} elements are longer than the {MAX_COLS} the kernel sums exactly"
            ));
        }
        if let Some(bad) = w.iter().find(|v| !v.is_finite()) {
            return Err(format!("int8 weight holds a non-finite value {bad}"));
        }
        let stride = cols.div_ceil(STEP).max(1) * STEP;
        let mut q = vec![0i8; rows * stride];
        let mut scale = Vec::with_capacity(rows);
        let mut row_sum = Vec::with_capacity(rows);
        for (dst, src) in q.chunks_exact_mut(stride).zip(w.chunks_exact(cols.max(1))) {
            scale.push(quantize_row(src, dst));
            row_sum.push(dst.iter().map(|&v| i32::from(v)).sum());
        }
        Ok(Int8Matrix {
            rows,
            cols,
            stride,
            q,
            scale,
            row_sum,
        })
    }

    /// Weight `(o, k)` as stored: `s_o · q_ok`.
    pub fn get(&self, o: usize, k: usize) -> f32 {
        self.scale[o] * f32::from(self.q[o * self.stride + k])
    }

    pub fn bytes(&self) -> usize {
        self.q.len() + self.scale.len() * 8
    }
}

/// Quantises `x [n, cols]` per row into `u = p + 128`, padded with 128 (`p = 0`).
pub fn quantize_acts(x: &[f32], n: usize, cols: usize, stride: usize) -> Int8Acts {
    let mut u = vec![128u8; n * stride];
    let mut scale = Vec::with_capacity(n);
    let mut p = vec![0i8; cols];
    for (dst, src) in u.chunks_exact_mut(stride).zip(x.chunks_exact(cols.max(1))) {
        scale.push(quantize_row(src, &mut p));
        for (d, &v) in dst.iter_mut().zip(&p) {
            *d = (i32::from(v) + 128) as u8;
        }
    }
    Int8Acts { stride, u, scale }
}

fn dot_portable(q: &[i8], u: &[u8]) -> i32 {
    q.iter()
        .zip(u)
        .map(|(&a, &b)| i32::from(a) * i32::from(b))
        .sum()
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// `out[i] = Σ_k q_k u_{i,k}` (exact i32) for `R` activation rows.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and VNNI, and `q` and every `us[i]` must hold the same
    /// multiple of 64 bytes.
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub unsafe fn dot_rows<const R: usize>(q: &[i8], us: [&[u8]; R], out: &mut [i32; R]) {
        // Two chains per row (even and odd steps), so one row does not wait on the latency
        // of a single chain; the integer sums are exact in any order.
        let mut acc = [[_mm512_setzero_si512(); R]; 2];
        let n = q.len() / 64;
        macro_rules! step {
            ($c:expr, $set:expr) => {{
                let c = $c;
                // SAFETY (caller): 64 bytes from 64c lie inside `q` and each `us[r]`; unaligned
                // loads.
                let qv = _mm512_loadu_si512(q.as_ptr().add(64 * c) as *const __m512i);
                for r in 0..R {
                    let uv = _mm512_loadu_si512(us[r].as_ptr().add(64 * c) as *const __m512i);
                    acc[$set][r] = _mm512_dpbusd_epi32(acc[$set][r], uv, qv);
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
            out[r] = _mm512_reduce_add_epi32(_mm512_add_epi32(acc[0][r], acc[1][r]));
        }
    }
}

impl PackedFormat for Int8Matrix {
    type Acts = Int8Acts;

    fn rows(&self) -> usize {
        self.rows
    }

    fn cols(&self) -> usize {
        self.cols
    }

    fn simd_available(&self) -> bool {
        super::has_vnni()
    }

    fn quantize_acts(&self, x: &[f32], n: usize) -> Int8Acts {
        quantize_acts(x, n, self.cols, self.stride)
    }

    fn tile(&self, kernel: Kernel, acts: &Int8Acts, o: usize, r0: usize, out: &mut [f32]) {
        let q = &self.q[o * self.stride..(o + 1) * self.stride];
        let u = |i: usize| &acts.u[(r0 + i) * acts.stride..(r0 + i + 1) * acts.stride];
        let mut sums = [0i32; super::ROW_TILE];
        match kernel {
            Kernel::Portable => {
                for (i, s) in sums.iter_mut().take(out.len()).enumerate() {
                    *s = dot_portable(q, u(i));
                }
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => {
                // SAFETY: product_with only passes Avx512 after simd_available() (AVX-512F and
                // VNNI present); every row here is `stride` bytes, a multiple of 64.
                unsafe {
                    match out.len() {
                        1 => {
                            let mut s = [0; 1];
                            avx512::dot_rows(q, [u(0)], &mut s);
                            sums[..1].copy_from_slice(&s);
                        }
                        2 => {
                            let mut s = [0; 2];
                            avx512::dot_rows(q, [u(0), u(1)], &mut s);
                            sums[..2].copy_from_slice(&s);
                        }
                        3 => {
                            let mut s = [0; 3];
                            avx512::dot_rows(q, [u(0), u(1), u(2)], &mut s);
                            sums[..3].copy_from_slice(&s);
                        }
                        _ => avx512::dot_rows(q, [u(0), u(1), u(2), u(3)], &mut sums),
                    }
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Avx512 => unreachable!("simd_available is false off x86_64"),
        }
        let comp = 128 * self.row_sum[o];
        for (i, v) in out.iter_mut().enumerate() {
            *v = (sums[i] - comp) as f32 * (self.scale[o] * acts.scale[r0 + i]);
        }
    }
}
