//! The bf16 matrix product of mixed-precision training: `C [m, n] (+)= bf16(A) · bf16(B)` with
//! `A [m, k]` and `B [k, n]` float32 (any strides), rounded to bf16 (nearest, ties to even) as
//! they are packed, and every sum in float32:
//!
//! `c_ij = Σ_k bf16(a_ik) · bf16(b_kj)`.
//!
//! A product of two bf16 numbers has at most 16 significant bits, so it is exact in f32; the
//! result differs from the float64 sum of the same products only by f32 rounding of the sums.
//!
//! Layout (as BLIS does it, with the AVX-512 BF16 `vdpbf16ps` instruction as the inner step,
//! which adds two bf16 products to each of 16 f32 lanes):
//! - `B` is packed once into [`Bf16Panels`]: panels of [`NR`] = 32 columns, for each pair of
//!   rows `(2p, 2p+1)` the 32 columns' two values side by side (`[panel][p][col][2]`). A
//!   weight is packed once per optimizer step and reused by every batch of the update.
//! - `A` is packed per call in blocks of rows: panels of [`MR`] rows, for each pair `p` the
//!   rows' two values as one 32-bit word (`[panel][p][row]`), which the kernel broadcasts.
//! - The micro-kernel computes an `MR x NR` tile over [`KC_PAIRS`] pairs of the summed
//!   dimension: 2 loads of `B` and `MR` broadcasts of `A` per pair, `2 MR` `vdpbf16ps` into
//!   `2 MR` independent accumulators. Each lane adds the odd product, then the even one (the
//!   instruction's order); the portable kernel does the same in plain Rust, so the two differ
//!   only where the hardware flushes subnormals to zero.
//!
//! Work is split over blocks of rows of `C`, and the summed dimension is always cut at the same
//! places, so the result does not depend on the number of threads.

use super::bf16::{bf16_to_f32, f32_to_bf16};
use super::Kernel;
use crate::kernels::matmul::{matmuls_are_serial, MatRef};
use rayon::prelude::*;

/// Columns of `C` per micro-kernel tile (two 16-lane registers).
pub const NR: usize = 32;
/// Rows of `C` per micro-kernel tile.
pub const MR: usize = 12;
/// Pairs of the summed dimension per block (the `B` micro-panel, `KC_PAIRS · 128` bytes,
/// stays in L1 while the rows of a block pass it).
pub const KC_PAIRS: usize = 192;
/// The most rows of `C` one task packs and computes at a time.
const MC: usize = 240;

/// `B [k, n]` in bf16, packed for [`bf16_matmul`].
#[derive(Clone, Debug)]
pub struct Bf16Panels {
    k: usize,
    n: usize,
    /// `ceil(k / 2)`
    pairs: usize,
    /// `[ceil(n / NR)][pairs][NR][2]`, zero-padded past `k` and `n`.
    data: Vec<u16>,
}

impl Bf16Panels {
    /// Rounds `b [k, n]` to bf16 and packs it.
    pub fn pack(b: MatRef<'_, f32>) -> Bf16Panels {
        let (k, n) = (b.rows(), b.cols());
        let pairs = k.div_ceil(2);
        let panels = n.div_ceil(NR);
        let mut data = vec![0u16; panels * pairs * 2 * NR];
        let pack_panel = |(jp, panel): (usize, &mut [u16])| {
            let j0 = jp * NR;
            let nc = NR.min(n - j0);
            for (p, dst) in panel.chunks_exact_mut(2 * NR).enumerate() {
                let k0 = 2 * p;
                for c in 0..nc {
                    dst[2 * c] = f32_to_bf16(b.at(k0, j0 + c));
                    if k0 + 1 < k {
                        dst[2 * c + 1] = f32_to_bf16(b.at(k0 + 1, j0 + c));
                    }
                }
            }
        };
        let chunk = (pairs * 2 * NR).max(1);
        if super::products_are_serial() || panels < 4 {
            data.chunks_mut(chunk).enumerate().for_each(pack_panel);
        } else {
            data.par_chunks_mut(chunk).enumerate().for_each(pack_panel);
        }
        Bf16Panels { k, n, pairs, data }
    }

    /// `k` (rows of `B`).
    // Used outside the library only (feature `internals`).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn rows(&self) -> usize {
        self.k
    }

    /// `n` (columns of `B`).
    // Used outside the library only (feature `internals`).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn cols(&self) -> usize {
        self.n
    }

    /// Bytes of the packed matrix.
    // Used outside the library only (feature `internals`).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn bytes(&self) -> usize {
        self.data.len() * 2
    }
}

/// The fastest kernel this CPU runs for [`bf16_matmul`].
pub fn best_kernel() -> Kernel {
    super::widest_kernel(|k| k == Kernel::Avx512 && super::has_avx512_bf16())
}

/// `c [m, n] = bf16(a) · b` (`c +=` when `accumulate`), `a [m, k]` any strides, `c`
/// row-major; with `kernel` ([`Kernel::Avx512`] only where [`super::has_avx512_bf16`]).
/// Uses the threads of the current rayon pool unless inside
/// [`serial_matmuls`](crate::kernels::matmul::serial_matmuls).
pub fn bf16_matmul(
    kernel: Kernel,
    c: &mut [f32],
    a: MatRef<'_, f32>,
    b: &Bf16Panels,
    accumulate: bool,
) {
    let (m, k, n) = (a.rows(), a.cols(), b.n);
    assert_eq!(k, b.k, "bf16 matmul: inner dimensions differ");
    assert_eq!(c.len(), m * n, "bf16 matmul: c is not [m, n]");
    assert!(
        kernel == Kernel::Portable || (kernel == Kernel::Avx512 && super::has_avx512_bf16()),
        "the AVX-512 BF16 kernel was asked for on a CPU without it"
    );
    if !accumulate {
        c.fill(0.0);
    }
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    let threads = if matmuls_are_serial() {
        1
    } else {
        rayon::current_num_threads()
    };
    let mc = (m.div_ceil(threads).div_ceil(MR) * MR).clamp(MR, MC);
    let block = |(bi, cb): (usize, &mut [f32])| {
        compute_block(kernel, cb, a, bi * mc, cb.len() / n, b);
    };
    if threads > 1 && m > mc {
        c.par_chunks_mut(mc * n).enumerate().for_each(block);
    } else {
        c.chunks_mut(mc * n).enumerate().for_each(block);
    }
}

/// `c [mb, n] += bf16(a[i0..i0 + mb]) · b`.
fn compute_block(
    kernel: Kernel,
    c: &mut [f32],
    a: MatRef<'_, f32>,
    i0: usize,
    mb: usize,
    b: &Bf16Panels,
) {
    let (k, n, pairs) = (b.k, b.n, b.pairs);
    let mpanels = mb.div_ceil(MR);
    // [mpanels][kp][MR]
    let mut apack = vec![0u32; mpanels * KC_PAIRS.min(pairs) * MR];
    let mut tile = [[0f32; NR]; MR];
    for p0 in (0..pairs).step_by(KC_PAIRS) {
        let kp = KC_PAIRS.min(pairs - p0);
        // Pack this block of A's rows over pairs p0..p0+kp.
        for (ip, panel) in apack.chunks_exact_mut(kp * MR).take(mpanels).enumerate() {
            let nr = MR.min(mb - ip * MR);
            for (p, dst) in panel.chunks_exact_mut(MR).enumerate() {
                let k0 = 2 * (p0 + p);
                for (r, d) in dst.iter_mut().enumerate() {
                    *d = if r < nr {
                        let row = i0 + ip * MR + r;
                        let lo = f32_to_bf16(a.at(row, k0));
                        let hi = if k0 + 1 < k {
                            f32_to_bf16(a.at(row, k0 + 1))
                        } else {
                            0
                        };
                        u32::from(lo) | (u32::from(hi) << 16)
                    } else {
                        0
                    };
                }
            }
        }
        for jp in 0..n.div_ceil(NR) {
            let start = (jp * pairs + p0) * 2 * NR;
            let bpanel = &b.data[start..start + kp * 2 * NR];
            let j0 = jp * NR;
            let nc = NR.min(n - j0);
            for ip in 0..mpanels {
                let ap = &apack[ip * kp * MR..(ip + 1) * kp * MR];
                micro(kernel, kp, ap, bpanel, &mut tile);
                let r0 = ip * MR;
                for (r, t) in tile.iter().enumerate().take(MR.min(mb - r0)) {
                    let row = &mut c[(r0 + r) * n + j0..(r0 + r) * n + j0 + nc];
                    row.iter_mut().zip(t).for_each(|(d, &v)| *d += v);
                }
            }
        }
    }
}

/// `tile = Σ_p a_p ⊗ b_p` over `kp` pairs: `a [kp][MR]` (two bf16 per word), `b [kp][NR][2]`.
fn micro(kernel: Kernel, kp: usize, a: &[u32], b: &[u16], tile: &mut [[f32; NR]; MR]) {
    assert!(a.len() >= kp * MR && b.len() >= kp * 2 * NR);
    match kernel {
        Kernel::Portable => micro_portable(kp, a, b, tile),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: bf16_matmul only passes Avx512 where has_avx512_bf16() (AVX-512F and BF16);
        // the lengths were checked just above.
        Kernel::Avx512 => unsafe { avx512::micro(kp, a, b, tile) },
        Kernel::Avx2 => unreachable!("bf16_matmul refuses Avx2 (no AVX2 bf16 panels kernel)"),
        #[cfg(not(target_arch = "x86_64"))]
        Kernel::Avx512 => unreachable!("has_avx512_bf16 is false off x86_64"),
    }
}

fn micro_portable(kp: usize, a: &[u32], b: &[u16], tile: &mut [[f32; NR]; MR]) {
    let mut acc = [[0f32; NR]; MR];
    for (ap, bp) in a.chunks_exact(MR).zip(b.chunks_exact(2 * NR)).take(kp) {
        for (row, &w) in acc.iter_mut().zip(ap) {
            let (even, odd) = (bf16_to_f32(w as u16), bf16_to_f32((w >> 16) as u16));
            for (lane, pair) in row.iter_mut().zip(bp.chunks_exact(2)) {
                let t = *lane + odd * bf16_to_f32(pair[1]);
                *lane = t + even * bf16_to_f32(pair[0]);
            }
        }
    }
    *tile = acc;
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{MR, NR};
    use std::arch::x86_64::*;

    /// The tile with `vdpbf16ps`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX-512 BF16; `a` holds at least `kp * MR` words and `b`
    /// at least `kp * 2 * NR` elements.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn micro(kp: usize, a: &[u32], b: &[u16], tile: &mut [[f32; NR]; MR]) {
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        let (ap, bp) = (a.as_ptr(), b.as_ptr());
        for p in 0..kp {
            // SAFETY (caller): elements 64p..64p+64 of b and MR p..MR p+MR of a are in bounds;
            // loadu needs no alignment; __m512i and __m512bh are both 64 plain bytes.
            let b0: __m512bh =
                std::mem::transmute(_mm512_loadu_si512(bp.add(p * 2 * NR) as *const __m512i));
            let b1: __m512bh =
                std::mem::transmute(_mm512_loadu_si512(bp.add(p * 2 * NR + NR) as *const __m512i));
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let av: __m512bh =
                    std::mem::transmute(_mm512_set1_epi32(*ap.add(p * MR + r) as i32));
                acc_r[0] = _mm512_dpbf16_ps(acc_r[0], av, b0);
                acc_r[1] = _mm512_dpbf16_ps(acc_r[1], av, b1);
            }
        }
        for (t, acc_r) in tile.iter_mut().zip(&acc) {
            // SAFETY: each tile row holds NR = 32 f32, two stores of 16.
            _mm512_storeu_ps(t.as_mut_ptr(), acc_r[0]);
            _mm512_storeu_ps(t.as_mut_ptr().add(16), acc_r[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matmul::serial_matmuls;

    fn kernels() -> Vec<Kernel> {
        let mut k = vec![Kernel::Portable];
        if super::super::has_avx512_bf16() {
            k.push(Kernel::Avx512);
        }
        k
    }

    fn vals(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((s >> 40) as f64 / (1u64 << 23) as f64 - 1.0) as f32
            })
            .collect()
    }

    fn round(x: f32) -> f64 {
        f64::from(bf16_to_f32(f32_to_bf16(x)))
    }

    /// `c` against the f64 sums of the bf16-rounded products (plus `c0` when accumulating),
    /// within f32 rounding of a sum of `k` terms.
    fn check(c: &[f32], c0: Option<&[f32]>, a: MatRef<f32>, b: MatRef<f32>, label: &str) {
        let (m, k, n) = (a.rows(), a.cols(), b.cols());
        for i in 0..m {
            for j in 0..n {
                let (mut want, mut mag) = (c0.map_or(0.0, |c0| f64::from(c0[i * n + j])), 0.0);
                for l in 0..k {
                    let t = round(a.at(i, l)) * round(b.at(l, j));
                    want += t;
                    mag += t.abs();
                }
                let tol = (k as f64 + 2.0) * f64::from(f32::EPSILON) * mag + 1e-30;
                let got = f64::from(c[i * n + j]);
                assert!(
                    (got - want).abs() <= tol,
                    "{label} ({m}x{k}x{n}) c[{i},{j}] = {got}, f64 over bf16 inputs {want} (tol {tol})"
                );
            }
        }
    }

    #[test]
    fn matches_f64_over_bf16_inputs_on_every_shape_class() {
        // m: one row, tile remainders, several row blocks; k: odd, one pair, past one block
        // of KC_PAIRS pairs; n: one column, panel remainders.
        for &(m, k, n) in &[
            (1, 1, 1),
            (5, 3, 31),
            (13, 64, 33),
            (40, 389, 70),
            (250, 40, 9),
            (7, 800, 65),
        ] {
            let (a, b) = (vals(m * k, 1 + m as u64), vals(k * n, 7 + n as u64));
            let bp = Bf16Panels::pack(MatRef::new(&b, k, n));
            for kernel in kernels() {
                let mut c = vec![f32::NAN; m * n];
                bf16_matmul(kernel, &mut c, MatRef::new(&a, m, k), &bp, false);
                check(
                    &c,
                    None,
                    MatRef::new(&a, m, k),
                    MatRef::new(&b, k, n),
                    &format!("{kernel:?}"),
                );
            }
        }
    }

    #[test]
    fn transposed_views_and_accumulation() {
        // The three products of a linear layer: x wᵀ, dy w, dyᵀ x (accumulated).
        let (rows, d_in, d_out) = (29, 70, 45);
        let (x, w, dy) = (
            vals(rows * d_in, 3),
            vals(d_out * d_in, 4),
            vals(rows * d_out, 5),
        );
        let c0 = vals(d_out * d_in, 6);
        for kernel in kernels() {
            let wt = MatRef::new(&w, d_out, d_in).t();
            let mut y = vec![0f32; rows * d_out];
            bf16_matmul(
                kernel,
                &mut y,
                MatRef::new(&x, rows, d_in),
                &Bf16Panels::pack(wt),
                false,
            );
            check(&y, None, MatRef::new(&x, rows, d_in), wt, "x wᵀ");
            let wm = MatRef::new(&w, d_out, d_in);
            let mut dx = vec![0f32; rows * d_in];
            bf16_matmul(
                kernel,
                &mut dx,
                MatRef::new(&dy, rows, d_out),
                &Bf16Panels::pack(wm),
                false,
            );
            check(&dx, None, MatRef::new(&dy, rows, d_out), wm, "dy w");
            let dyt = MatRef::new(&dy, rows, d_out).t();
            let xm = MatRef::new(&x, rows, d_in);
            let mut dw = c0.clone();
            bf16_matmul(kernel, &mut dw, dyt, &Bf16Panels::pack(xm), true);
            check(&dw, Some(&c0), dyt, xm, "dw += dyᵀ x");
        }
    }

    #[test]
    fn same_bits_on_any_number_of_threads() {
        let (m, k, n) = (300, 450, 100);
        let (a, b) = (vals(m * k, 11), vals(k * n, 12));
        let bp = Bf16Panels::pack(MatRef::new(&b, k, n));
        let run = |kernel| {
            let mut c = vec![0f32; m * n];
            bf16_matmul(kernel, &mut c, MatRef::new(&a, m, k), &bp, false);
            c
        };
        for kernel in kernels() {
            let serial = serial_matmuls(|| run(kernel));
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(3)
                .build()
                .unwrap();
            assert_eq!(serial, pool.install(|| run(kernel)), "{kernel:?}");
        }
    }

    #[test]
    fn avx512_and_portable_agree_where_the_cpu_has_it() {
        if !super::super::has_avx512_bf16() {
            eprintln!("skipped: this CPU has no AVX-512 BF16 (the portable kernel ran above)");
            return;
        }
        let (m, k, n) = (37, 300, 77);
        let (a, b) = (vals(m * k, 21), vals(k * n, 22));
        let bp = Bf16Panels::pack(MatRef::new(&b, k, n));
        let mut c = [vec![0f32; m * n], vec![0f32; m * n]];
        for (ci, kernel) in c.iter_mut().zip([Kernel::Portable, Kernel::Avx512]) {
            bf16_matmul(kernel, ci, MatRef::new(&a, m, k), &bp, false);
        }
        // Same products, same order of sums: equal unless a subnormal was flushed.
        assert_eq!(c[0], c[1]);
    }
}
