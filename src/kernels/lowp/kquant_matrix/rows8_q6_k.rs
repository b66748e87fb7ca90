//! `Q6_K` rows interleaved by eight (see `rows8`), and the decoding kernel that reads them.
//!
//! ```text
//! group g = rows 8g .. 8g + 8, super-block b: 1,680 bytes (8 × 210, the file's size)
//!     [0, 16)       d_r (f16, row r at 2r)
//!     [16, 144)     the signed scales: group s < 16 of row r at 16 + 8s + r
//!     [144, 1168)   ql: chunk c < 4 (the file's ql[32c .. 32c + 32]), vector v < 4, lane L:
//!                   the 4 bytes ql[32c + 4j ..] of row L mod 8, j = 2v + ⌊L / 8⌋
//!     [1168, 1680)  qh: chunk n < 2 (qh[32n .. 32n + 32]), the same lanes
//! chunk c = 2n + k, vector v, half h (h = 0: low four bits, 1: high):
//!     u = (ql nibble h) | (qh bits 2k + 4h, 2k + 4h + 1) << 4        (u = q + 32 ∈ [0, 63])
//!     elements 128n + 64h + 32k + 4j .., all of group s = 8n + 4h + 2k + ⌊v / 2⌋
//! per group s, lane L (row r = L mod 8; lanes r and r + 8 hold halves of the group's sum):
//!     T_s = [−32 bsums_s on lanes 0–7] + Σ_{v ∈ s} vpdpbusd(u_{c,v,h}, A[c, v, h])
//!     I_r = Σ_s sc_{r,s} (T_s[r] + T_s[r + 8])   (= shifted − 32 taken of the row kernel)
//!     y_r ← y_r + (d_r e) I_r
//! ```

use super::rows8::{prefetch_ahead, ExpandedActs, GROUP, Q6_K_QH, Q6_K_QL};
use super::{KQuantActs, KQuantMatrix};
use crate::kernels::lowp::ROW_TILE;
use std::arch::x86_64::*;

/// Bytes of one interleaved super-block.
const GROUP_BYTES: usize = GROUP * 210;
/// Bytes of one super-block's expanded activations.
const ACT_BYTES: usize = 2048;

/// `sums[i][k] = w_{8g+k} · x_{r0+i}` for `i < R`, `k < 8`, of interleaved `Q6_K` rows (called
/// by `rows8::group_sums`).
///
/// # Safety
/// AVX-512F/BW/VL and VNNI; group `g` exists in `w.data` (`Q6_K` laid out by
/// `rows8::interleave`, `nb` super-blocks a row); `acts` and `expanded` hold rows
/// `r0 .. r0 + R` (`R <= ROW_TILE`) of `nb` blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn sums_r<const R: usize>(
    w: &KQuantMatrix,
    acts: &KQuantActs,
    expanded: &ExpandedActs,
    r0: usize,
    g: usize,
    nb: usize,
    sums: &mut [[f32; GROUP]; ROW_TILE],
) {
    let stored: &[u8] = &w.data;
    let group = &stored[g * nb * GROUP_BYTES..(g + 1) * nb * GROUP_BYTES];
    let base = group.as_ptr();
    let low = _mm512_set1_epi8(0x0f);
    let (bits01, bits23, bits45) = (
        _mm512_set1_epi8(0x03),
        _mm512_set1_epi8(0x0c),
        _mm512_set1_epi8(0x30),
    );
    let mut y = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        // SAFETY (all loads): super-block b of the group is GROUP_BYTES bytes at
        // base + b · GROUP_BYTES (the caller's contract); row r0 + r's expanded activations of
        // block b are ACT_BYTES at ((r0 + r) · nb + b) · ACT_BYTES, its 16 group sums at
        // ((r0 + r) · nb + b) · 16, its scale at (r0 + r) · nb + b.
        unsafe {
            let blk = base.add(b * GROUP_BYTES);
            prefetch_ahead(stored, (g * nb + b) * GROUP_BYTES, GROUP_BYTES);
            let mut isum = [_mm512_setzero_si512(); R];
            for c in 0..4 {
                let (n, k) = (c / 2, c % 2);
                // u of vectors v = 2m, 2m + 1, halves h: [m][h][v mod 2]
                let mut u = [[[_mm512_setzero_si512(); 2]; 2]; 2];
                for v in 0..4 {
                    let ql = _mm512_loadu_si512(blk.add(Q6_K_QL + 256 * c + 64 * v) as *const __m512i);
                    let qh = _mm512_loadu_si512(blk.add(Q6_K_QH + 256 * n + 64 * v) as *const __m512i);
                    // The top two bits of the low and high nibbles' values, at bits 4–5.
                    let (top_lo, top_hi) = if k == 0 {
                        (
                            _mm512_slli_epi16::<4>(_mm512_and_si512(qh, bits01)),
                            _mm512_and_si512(qh, bits45),
                        )
                    } else {
                        (
                            _mm512_slli_epi16::<2>(_mm512_and_si512(qh, bits23)),
                            _mm512_and_si512(_mm512_srli_epi16::<2>(qh), bits45),
                        )
                    };
                    u[v / 2][0][v % 2] = _mm512_or_si512(_mm512_and_si512(ql, low), top_lo);
                    u[v / 2][1][v % 2] = _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi16::<4>(ql), low),
                        top_hi,
                    );
                }
                for (m, u_m) in u.iter().enumerate() {
                    for (h, u_mh) in u_m.iter().enumerate() {
                        let s = 8 * n + 4 * h + 2 * k + m;
                        // Group s's 8 scales, in lanes r and r + 8.
                        let sc8 = _mm_loadl_epi64(blk.add(16 + 8 * s) as *const __m128i);
                        let scale = _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(sc8, sc8));
                        for (r, isum_r) in isum.iter_mut().enumerate() {
                            let row = (r0 + r) * nb + b;
                            let taken = -32 * *acts.bsums.as_ptr().add(row * 16 + s);
                            let mut t = _mm512_maskz_set1_epi32(0x00ff, taken);
                            let a = expanded.bytes.as_ptr().add(row * ACT_BYTES);
                            for (half, &uv) in u_mh.iter().enumerate() {
                                let v = 2 * m + half;
                                let at = 64 * ((4 * c + v) * 2 + h);
                                let av = _mm512_loadu_si512(a.add(at) as *const __m512i);
                                t = _mm512_dpbusd_epi32(t, uv, av);
                            }
                            *isum_r = _mm512_add_epi32(*isum_r, _mm512_mullo_epi32(t, scale));
                        }
                    }
                }
            }
            let d = _mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i));
            for r in 0..R {
                let i_r = _mm256_add_epi32(
                    _mm512_castsi512_si256(isum[r]),
                    _mm512_extracti64x4_epi64::<1>(isum[r]),
                );
                let e = _mm256_set1_ps(*acts.e.as_ptr().add((r0 + r) * nb + b));
                let t = _mm256_mul_ps(_mm256_mul_ps(d, e), _mm256_cvtepi32_ps(i_r));
                y[r] = _mm256_add_ps(y[r], t);
            }
        }
    }
    for r in 0..R {
        // SAFETY: sums[r] holds 8 floats.
        unsafe { _mm256_storeu_ps(sums[r].as_mut_ptr(), y[r]) };
    }
}
