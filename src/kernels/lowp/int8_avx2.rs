//! The AVX2 kernel of [`Int8Matrix`](super::Int8Matrix): the same weight panels (`[panel][k /
//! 4][16 outputs][4]`) and the same exact integer sums as the portable and the AVX-512 VNNI
//! kernels, with the 256-bit instructions every x86-64 CPU since Haswell / Zen has.
//!
//! AVX2 has no `vpdpbusd`; its byte product `vpmaddubsw` multiplies unsigned by signed bytes
//! and adds neighbouring pairs into *saturating* i16 lanes. On `u = p + 128 ∈ [1, 255]` and
//! `q ∈ [-127, 127]` a pair reaches `2 · 255 · 127 = 64,770 > 32,767`, so it could saturate.
//! The kernel uses a sign trick instead (ggml's, with the roles turned round): the activations
//! are quantised to `p ∈ [-127, 127]` itself, and to `|p|` beside it, once per product, and
//!
//! ```text
//! q_k p_k = |p_k| · (sign(p_k) q_k),   |p_k| ∈ [0, 127] as u8,  sign(p_k) q_k ∈ [-127, 127] as i8
//! ```
//!
//! (`vpsignb` applies the sign, zero where `p_k = 0`), so a pair is at most `2 · 127 · 127 =
//! 32,258`: never saturated. `vpmaddwd` with ones then adds the pairs into i32 lanes, one per
//! output: `Σ_k q_ok p_rk` directly, the integer the other kernels reach as
//! `Σ_k q_ok u_rk - 128 Σ_k q_ok`. Every integer is the same, and so is every float operation
//! after it (`sum as f32 · (s_o · t_r)`): the three kernels give the same bits. With `|q|` as
//! the unsigned side (ggml's way) each group of weights would need its absolute value as well;
//! with `|p|`, stored once per product, a tile's weights are loaded and used as they are. Where
//! every `p` of a product is at least 0 (the input of a layer after a ReLU),
//! [`Tile::run_non_negative`] takes `p` as the unsigned side directly: no sign to move.
//!
//! The plain kernel's work per row, half-panel and group of four inputs is four vector
//! operations (`vpsignb`, `vpmaddubsw`, `vpmaddwd`, `vpaddd`), three without signs; on the Zen 5
//! measured it is bound by their count, not by the two multiplier pipes.
//!
//! A register tile is `R ≤ 4` activation rows × one panel (16 outputs = two 8-lane halves):
//! `2R` accumulators and two weight registers within AVX2's 16 registers. Rows `R` apart
//! reuse the panel from L1.
//!
//! Where the CPU has AVX-VNNI (the 256-bit `vpdpbusd` of Alder Lake and later, Zen 5), the
//! tile takes the AVX-512 kernel's route on 8-lane vectors instead ([`Tile::run_vnni`]): one
//! `vpdpbusd` of `u` against the weights, then `- 128 Σ_k q_ok`, the same integer.
//! [`set_plain_avx2`] turns it off (tests and benchmarks of what a CPU without it runs).

use std::arch::x86_64::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// Whether the AVX2 kernel keeps to `vpmaddubsw` even with AVX-VNNI: `TRANSFORMER_AVX_VNNI=0`
/// at first use ([`super::AVX_VNNI_ENV`]; a value that does not parse changes nothing here, the
/// binary refuses it at start), then what [`set_plain_avx2`] sets.
static PLAIN_AVX2: OnceLock<AtomicBool> = OnceLock::new();

fn plain_avx2() -> &'static AtomicBool {
    PLAIN_AVX2.get_or_init(|| AtomicBool::new(super::avx_vnni_from_env() == Ok(Some(false))))
}

/// Makes the AVX2 int8 kernel use (`false`, the default) or leave (`true`) AVX-VNNI where the
/// CPU has it: the two give the same bits, so this changes speed only.
// Used by the tests and outside the library (feature `internals`).
#[cfg_attr(not(any(test, feature = "internals")), allow(dead_code))]
pub fn set_plain_avx2(plain: bool) {
    plain_avx2().store(plain, Ordering::Relaxed);
}

/// Whether the AVX2 int8 kernel runs its AVX-VNNI form: the CPU has AVX-VNNI and it was not
/// turned off.
pub fn uses_avx_vnni() -> bool {
    !plain_avx2().load(Ordering::Relaxed) && super::has_avx_vnni()
}

/// `u_k = round(x_k / t) + 128` for one activation row with AVX2 instructions; returns `t`.
/// The same operations as the portable `quantize_row` (the maximum ignores NaN as `f32::max`
/// does; finite inputs give the same bits).
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
pub unsafe fn quantize_row(src: &[f32], dst: &mut [u8]) -> f32 {
    let n = src.len().min(dst.len());
    let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr());
    let scale = max_abs(&src[..n]) / 127.0;
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    let (inv_v, lo, hi) = (
        _mm256_set1_ps(inv),
        _mm256_set1_ps(-127.0),
        _mm256_set1_ps(127.0),
    );
    let (magic, offset) = (_mm256_set1_ps(12_582_912.0), _mm256_set1_ps(128.0));
    // round_small(clamp(v · inv, ±127)) + 128, an integer in [1, 255], as i32 lanes.
    let quantize = |at: usize| {
        // SAFETY (callers below): elements at .. at + 8 lie inside `src`.
        let v = _mm256_loadu_ps(sp.add(at));
        let c = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v, inv_v), lo), hi);
        let r = _mm256_sub_ps(_mm256_add_ps(c, magic), magic);
        _mm256_cvttps_epi32(_mm256_add_ps(r, offset))
    };
    // packs / packus interleave the two 128-bit halves; this puts the 4-byte groups back.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let mut i = 0;
    while i + 32 <= n {
        let (a, b, c, d) = (
            quantize(i),
            quantize(i + 8),
            quantize(i + 16),
            quantize(i + 24),
        );
        // Values in [1, 255]: the saturating packs are exact.
        let bytes = _mm256_packus_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
        let bytes = _mm256_permutevar8x32_epi32(bytes, order);
        // SAFETY: bytes i .. i + 32 < n lie inside `dst`.
        _mm256_storeu_si256(dp.add(i) as *mut __m256i, bytes);
        i += 32;
    }
    for (d, &v) in dst[i..n].iter_mut().zip(&src[i..n]) {
        *d = (super::int8::quantize(v, inv) + 128.0) as u8;
    }
    scale
}

/// `max_k |row_k|`, as the portable `max_abs` (a NaN is skipped as `f32::max` skips it).
#[inline]
#[target_feature(enable = "avx2")]
fn max_abs(row: &[f32]) -> f32 {
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut amax = _mm256_setzero_ps();
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        // SAFETY: `c` holds 8 f32; loadu has no alignment rule.
        let v = _mm256_and_ps(unsafe { _mm256_loadu_ps(c.as_ptr()) }, abs_mask);
        // A NaN in `v` (the first operand) leaves `amax`, as `f32::max` skips it.
        amax = _mm256_max_ps(v, amax);
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds 8 f32.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), amax) };
    let m = lanes.iter().fold(0f32, |m, &v| m.max(v));
    chunks.remainder().iter().fold(m, |m, v| m.max(v.abs()))
}

/// [`quantize_row`] for the plain kernel: `p_k = round(x_k / t)` itself as i8 bytes (what
/// `u_k ^ 0x80` would give); returns `t` and the OR of every byte written, whose top bit says
/// whether any `p` is below 0.
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
pub unsafe fn quantize_row_signed(src: &[f32], dst: &mut [u8]) -> (f32, u8) {
    let n = src.len().min(dst.len());
    let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr());
    let scale = max_abs(&src[..n]) / 127.0;
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    let (inv_v, lo, hi) = (
        _mm256_set1_ps(inv),
        _mm256_set1_ps(-127.0),
        _mm256_set1_ps(127.0),
    );
    let magic = _mm256_set1_ps(12_582_912.0);
    // round_small(clamp(v · inv, ±127)), an integer in [-127, 127], as i32 lanes.
    let quantize = |at: usize| {
        // SAFETY (callers below): elements at .. at + 8 lie inside `src`.
        let v = _mm256_loadu_ps(sp.add(at));
        let c = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v, inv_v), lo), hi);
        _mm256_cvttps_epi32(_mm256_sub_ps(_mm256_add_ps(c, magic), magic))
    };
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let mut bits = _mm256_setzero_si256();
    let mut i = 0;
    while i + 32 <= n {
        let (a, b, c, d) = (
            quantize(i),
            quantize(i + 8),
            quantize(i + 16),
            quantize(i + 24),
        );
        // Values in [-127, 127]: the signed saturating packs are exact.
        let bytes = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
        let bytes = _mm256_permutevar8x32_epi32(bytes, order);
        bits = _mm256_or_si256(bits, bytes);
        // SAFETY: bytes i .. i + 32 < n lie inside `dst`.
        _mm256_storeu_si256(dp.add(i) as *mut __m256i, bytes);
        i += 32;
    }
    let mut or = [0u8; 32];
    // SAFETY: `or` holds 32 bytes.
    _mm256_storeu_si256(or.as_mut_ptr() as *mut __m256i, bits);
    let mut top = or.iter().fold(0, |a, &b| a | b);
    for (d, &v) in dst[i..n].iter_mut().zip(&src[i..n]) {
        *d = super::int8::quantize(v, inv) as i8 as u8;
        top |= *d;
    }
    (scale, top)
}

/// One register tile: `R` activation rows × one panel of 16 outputs.
pub struct Tile {
    /// The panel's `[groups, 16, 4]` weights.
    pub q: *const i8,
    pub groups: usize,
    /// The first row's activations, rows `u_stride` apart: `p` as i8 bytes for
    /// [`run`](Self::run) and [`run_non_negative`](Self::run_non_negative), `u = p + 128`
    /// for [`run_vnni`](Self::run_vnni).
    pub u: *const u8,
    /// For [`run`](Self::run): `|p|` in the same layout.
    pub magnitude: Option<*const u8>,
    pub u_stride: usize,
    /// `s_o` from the panel's first output (16 values, padded).
    pub scale: *const f32,
    /// `Σ_k q_ok` from the panel's first output (16 values, padded; the AVX-VNNI form).
    pub row_sum: *const i32,
    /// The rows' scales `t_r`.
    pub t: *const f32,
    /// `y` at (first row, the panel's first output).
    pub y: *mut f32,
    pub d_out: usize,
    /// Outputs of the panel to write (1..=16).
    pub lanes: usize,
}

impl Tile {
    /// `y_ro = (Σ_k q_ok p_rk) · (s_o t_r)` for the tile.
    ///
    /// # Safety
    /// The CPU has AVX2; the pointers cover the panel (`groups · 64` bytes), `R` rows of `u`
    /// and of `magnitude` (`4 · groups` bytes each) and `t`, 16 scales, and `R` rows of `y`
    /// at `lanes` outputs, which nothing else accesses meanwhile.
    #[target_feature(enable = "avx2")]
    pub unsafe fn run<const R: usize>(&self) {
        let ones = _mm256_set1_epi16(1);
        let magnitude = self.magnitude.expect("run takes |p|");
        let mut acc = [[_mm256_setzero_si256(); 2]; R];
        for g in 0..self.groups {
            // SAFETY (caller): the 64 bytes of group g: outputs 0..8 then 8..16, four each.
            let w = [
                _mm256_loadu_si256(self.q.add(g * 64) as *const __m256i),
                _mm256_loadu_si256(self.q.add(g * 64 + 32) as *const __m256i),
            ];
            for (r, acc_r) in acc.iter_mut().enumerate() {
                // SAFETY (caller): bytes 4g .. 4g + 4 of row r (rows are 4 · groups long) of
                // p and of |p|.
                let at = r * self.u_stride + 4 * g;
                let p = _mm256_set1_epi32((self.u.add(at) as *const i32).read_unaligned());
                let p_abs = _mm256_set1_epi32((magnitude.add(at) as *const i32).read_unaligned());
                for h in 0..2 {
                    // sign(p) q: the weights carry the activations' signs (0 where p = 0).
                    let signed_q = _mm256_sign_epi8(w[h], p);
                    // |p| · sign(p) q in pairs: at most 2 · 127 · 127, no saturation.
                    let pairs = _mm256_maddubs_epi16(p_abs, signed_q);
                    acc_r[h] = _mm256_add_epi32(acc_r[h], _mm256_madd_epi16(pairs, ones));
                }
            }
        }
        // SAFETY: the caller's contract.
        unsafe { self.store(&acc) }
    }

    /// [`run`](Self::run) where every `p_rk` is at least 0 (the input of a layer after a
    /// ReLU): `p ∈ [0, 127]` is then the unsigned side of `vpmaddubsw` as it is, against the
    /// signed weights, with no sign to move (a pair is at most `2 · 127 · 127`, never
    /// saturated): the same integer in two vector operations fewer per row and half.
    ///
    /// # Safety
    /// As [`run`](Self::run), and every `p` byte at `u` is in `[0, 127]`.
    #[target_feature(enable = "avx2")]
    pub unsafe fn run_non_negative<const R: usize>(&self) {
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_si256(); 2]; R];
        for g in 0..self.groups {
            // SAFETY (caller): as in `run`.
            let w = [
                _mm256_loadu_si256(self.q.add(g * 64) as *const __m256i),
                _mm256_loadu_si256(self.q.add(g * 64 + 32) as *const __m256i),
            ];
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let four = (self.u.add(r * self.u_stride + 4 * g) as *const i32).read_unaligned();
                let p = _mm256_set1_epi32(four);
                for h in 0..2 {
                    let pairs = _mm256_maddubs_epi16(p, w[h]);
                    acc_r[h] = _mm256_add_epi32(acc_r[h], _mm256_madd_epi16(pairs, ones));
                }
            }
        }
        // SAFETY: the caller's contract.
        unsafe { self.store(&acc) }
    }

    /// [`run`](Self::run) with AVX-VNNI: `Σ_k q_ok u_rk` by `vpdpbusd`, less `128 Σ_k q_ok`:
    /// the integer `run` sums, so the same bits.
    ///
    /// # Safety
    /// As [`run`](Self::run), and the CPU has AVX-VNNI; 16 sums at `row_sum`.
    #[target_feature(enable = "avx2,avxvnni")]
    pub unsafe fn run_vnni<const R: usize>(&self) {
        let mut acc = [[_mm256_setzero_si256(); 2]; R];
        for g in 0..self.groups {
            // SAFETY (caller): as in `run`.
            let w = [
                _mm256_loadu_si256(self.q.add(g * 64) as *const __m256i),
                _mm256_loadu_si256(self.q.add(g * 64 + 32) as *const __m256i),
            ];
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let four = (self.u.add(r * self.u_stride + 4 * g) as *const i32).read_unaligned();
                let u = _mm256_set1_epi32(four);
                for h in 0..2 {
                    acc_r[h] = _mm256_dpbusd_avx_epi32(acc_r[h], u, w[h]);
                }
            }
        }
        for h in 0..2 {
            // SAFETY (caller): the sums are padded to the whole panel.
            let comp = _mm256_slli_epi32::<7>(_mm256_loadu_si256(
                self.row_sum.add(8 * h) as *const __m256i
            ));
            for acc_r in acc.iter_mut() {
                acc_r[h] = _mm256_sub_epi32(acc_r[h], comp);
            }
        }
        // SAFETY: the caller's contract.
        unsafe { self.store(&acc) }
    }

    /// Writes `y_ro = sum · (s_o t_r)` of the tile's exact sums `acc[r][half]`.
    ///
    /// # Safety
    /// As [`run`](Self::run).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn store<const R: usize>(&self, acc: &[[__m256i; 2]; R]) {
        for h in 0..2 {
            let lanes = self.lanes.saturating_sub(8 * h).min(8);
            if lanes == 0 {
                continue;
            }
            // SAFETY (caller): the scales are padded to the whole panel.
            let s = _mm256_loadu_ps(self.scale.add(8 * h));
            // Lane l is written when l < lanes (the mask's top bit set).
            let mask = _mm256_cmpgt_epi32(
                _mm256_set1_epi32(lanes as i32),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            );
            for (r, acc_r) in acc.iter().enumerate() {
                let sum = _mm256_cvtepi32_ps(acc_r[h]);
                let st = _mm256_mul_ps(s, _mm256_set1_ps(*self.t.add(r)));
                let v = _mm256_mul_ps(sum, st);
                let at = self.y.add(r * self.d_out + 8 * h);
                // SAFETY (caller): the lanes written are outputs that exist in row r.
                if lanes == 8 {
                    _mm256_storeu_ps(at, v);
                } else {
                    _mm256_maskstore_ps(at, mask, v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{has_avx2, int8, Int8Matrix, Kernel};

    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            self.0 >> 33
        }
        /// Uniform in [-1, 1).
        fn unit(&mut self) -> f32 {
            ((self.next() % (1 << 24)) as f64 / (1 << 23) as f64 - 1.0) as f32
        }
    }

    /// The AVX2 activation quantiser gives the portable one's bits (scale and bytes) on rows
    /// shorter than a vector, with tails of 8 and of 32, all-zero rows, tiny values and a grid
    /// of halves (ties).
    #[test]
    fn activation_quantiser_gives_the_portable_bits() {
        if !has_avx2() {
            eprintln!("skipped: no AVX2 on this CPU");
            return;
        }
        let mut rng = Lcg(3);
        for len in [1, 7, 8, 9, 31, 32, 33, 45, 64, 100, 1000] {
            for case in 0..4 {
                let row: Vec<f32> = (0..len)
                    .map(|i| match case {
                        0 => rng.unit() * 3.0,
                        1 => 0.0,
                        2 => (i % 255) as f32 / 2.0 - 63.5,
                        _ => rng.unit() * 1e-30,
                    })
                    .collect();
                let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
                let sa = int8::quantize_row(&row, &mut a);
                // SAFETY: has_avx2() checked above.
                let sb = unsafe { super::quantize_row(&row, &mut b) };
                assert_eq!(sa.to_bits(), sb.to_bits(), "scale, len {len} case {case}");
                assert_eq!(a, b, "bytes, len {len} case {case}");
                // The signed form: p = u - 128 itself, and whether any p is below 0.
                let mut p = vec![0u8; len];
                // SAFETY: has_avx2() checked above.
                let (sp, bits) = unsafe { super::quantize_row_signed(&row, &mut p) };
                assert_eq!(sa.to_bits(), sp.to_bits(), "signed scale, len {len} case {case}");
                let want: Vec<u8> = a.iter().map(|u| u ^ 0x80).collect();
                assert_eq!(p, want, "signed bytes, len {len} case {case}");
                let negative = a.iter().any(|&u| u < 128);
                assert_eq!(bits & 0x80 != 0, negative, "sign, len {len} case {case}");
            }
        }
    }

    /// The AVX2 product, run explicitly, equals the portable one bit for bit (the integer sums
    /// are exact) on every shape class: rows 1..7 and 17 (tile remainders), d_in shorter than a
    /// group of 4 and than a vector, not a multiple of 32 or 64; d_out not a multiple of the
    /// 16-output panel or of the 64-output group. Values: random, and the extremes where
    /// `vpmaddubsw` on `u = p + 128` would saturate (every q and p at ±127, same signs); and
    /// activations that are all at least 0 (after a ReLU: `run_non_negative`), random with
    /// every third row all zero, and all at the maximum against weights at ±127.
    #[test]
    fn avx2_product_equals_the_portable_one_bit_for_bit() {
        if !has_avx2() {
            eprintln!("skipped: no AVX2 on this CPU");
            return;
        }
        let mut rng = Lcg(5);
        for d_in in [1, 3, 5, 31, 33, 45, 64, 100, 257] {
            for d_out in [1, 7, 16, 17, 33, 64, 70, 130] {
                for rows in [1, 2, 3, 4, 5, 7, 17] {
                    for case in 0..5 {
                        let mut value = |i: usize| match case {
                            0 | 3 => rng.unit(),
                            // All ±max with the same sign: the largest pairs.
                            1 => 1.0,
                            _ => {
                                if i.is_multiple_of(3) {
                                    -1.0
                                } else {
                                    1.0
                                }
                            }
                        };
                        let w: Vec<f32> = (0..d_out * d_in).map(&mut value).collect();
                        let x: Vec<f32> = match case {
                            // A ReLU's output, every third row all zero.
                            3 => (0..rows * d_in)
                                .map(|i| {
                                    let v = rng.unit().max(0.0);
                                    if (i / d_in).is_multiple_of(3) {
                                        0.0
                                    } else {
                                        v
                                    }
                                })
                                .collect(),
                            // Every p at 127 against q at ±127.
                            4 => vec![0.5; rows * d_in],
                            _ => (0..rows * d_in).map(|i| value(i / d_in) * 2.0).collect(),
                        };
                        let m = Int8Matrix::from_f32(&w, d_out, d_in).unwrap();
                        let run = |kernel| {
                            let mut y = vec![f32::NAN; rows * d_out];
                            m.product(kernel, &mut y, &x, rows);
                            y
                        };
                        let want = run(Kernel::Portable);
                        // Both forms where the CPU has AVX-VNNI (the switch changes no bits,
                        // so other tests running meanwhile are unaffected).
                        super::set_plain_avx2(true);
                        let plain = run(Kernel::Avx2);
                        super::set_plain_avx2(false);
                        let got = run(Kernel::Avx2);
                        let same = want
                            .iter()
                            .zip(&got)
                            .chain(want.iter().zip(&plain))
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{d_out}x{d_in} rows {rows} case {case}: {want:?} vs {got:?}"
                        );
                        if case == 1 {
                            // Σ 127 · 127 over d_in, times s t = (1/127)(2/127): 2 d_in.
                            let exact = 2.0 * d_in as f32;
                            let near = |v: &f32| (v - exact).abs() <= 1e-6 * exact;
                            assert!(want.iter().all(near), "{want:?}");
                        }
                    }
                }
            }
        }
    }
}
