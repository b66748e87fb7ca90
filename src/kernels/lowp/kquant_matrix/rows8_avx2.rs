//! The AVX2 kernels of `Q4_K` and `Q6_K` rows interleaved by eight (`rows8`, `rows8_q6_k`: the
//! same layout and expanded activations), for CPUs without AVX-512 VNNI: one weight row per i32
//! lane of a 256-bit vector, each 64-byte vector of the layout read as two halves (lanes
//! `0..8`: quad `2v`, lanes `8..16`: quad `2v + 1`, the same row `r` in lane `r` of each).
//!
//! ```text
//! vpdpbusd is vpmaddubsw (u8 × i8 pairs → i16) then vpmaddwd (i16 pairs → i32):
//! Q4_K, sub-block s = 2c + h, lane r:
//!     t_s  = Σ_{v<4, half<2} maddubs(nibbles_{c,v,h,half}, A_{c,v,h,half})       (i16)
//!          8 terms of pairs ≤ 2 · 15 · 127, so |t_s| ≤ 30,480 < 2^15: exact
//!     I_r  = Σ_s maddwd(t_s, (sc_{r,s}, sc_{r,s}))                                (i32)
//!     M_r  = Σ_k maddwd((m_{r,k}, m_{r,k+2}), (P_k, P_{k+2}))   P_s = bsums_2s + bsums_2s+1
//! Q6_K, group s (vectors v = 2m, 2m + 1 of chunk c, half h), lane r:
//!     t_{s,v} = Σ_{half<2} maddubs(u_{c,v,h,half}, A_{c,v,h,half})               (i16)
//!          2 terms of pairs ≤ 2 · 63 · 127, so |t| ≤ 32,004 < 2^15: exact
//!     I_r  = Σ_s Σ_v maddwd(t_{s,v}, (sc_{r,s}, sc_{r,s})) − 32 Σ_s sc_{r,s} bsums_s
//! ```
//!
//! The integer sums are those of the VNNI kernels (exact), and the f32 steps theirs in their
//! order, so every output is the portable kernel's bit for bit.

use super::rows8::{by_type_and_rows, prefetch_ahead, ExpandedActs, ACT_BYTES, GROUP, Q4_K_QS, Q6_K_QH, Q6_K_QL};
use super::{KQuantActs, KQuantMatrix};
use crate::kernels::lowp::ROW_TILE;
use std::arch::x86_64::*;

/// `sums[i][k] = w_{8g+k} · x_{r0+i}` for `i < n`, `k < 8`, with the kernel of `w`'s type.
///
/// # Safety
/// AVX2, FMA and F16C; group `g` exists in `w.data` (laid out by `rows8::interleave`, `nb`
/// super-blocks a row); `acts` and `expanded` hold rows `r0 .. r0 + n` (`n <= ROW_TILE`) of
/// `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn group_sums(
    w: &KQuantMatrix,
    acts: &KQuantActs,
    expanded: &ExpandedActs,
    (r0, n): (usize, usize),
    g: usize,
    nb: usize,
    sums: &mut [[f32; GROUP]; ROW_TILE],
) {
    let args = (w, acts, expanded, r0, g, nb, sums);
    // SAFETY: the caller's contract, passed on with R = n.
    unsafe { by_type_and_rows!(w.ty, n, q4_k_sums, q6_k_sums, args) }
}

/// The two 32-byte halves of the 64-byte vector at `p`.
///
/// # Safety
/// AVX2; 64 readable bytes at `p`.
#[inline(always)]
unsafe fn halves(p: *const u8) -> [__m256i; 2] {
    // SAFETY (caller): both loads inside the 64 bytes.
    unsafe {
        [
            _mm256_loadu_si256(p as *const __m256i),
            _mm256_loadu_si256(p.add(32) as *const __m256i),
        ]
    }
}

/// [`group_sums`] of `Q4_K` for `R` activation rows.
///
/// # Safety
/// As [`group_sums`], with `R` rows and `w` of `Q4_K`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_sums<const R: usize>(
    w: &KQuantMatrix,
    acts: &KQuantActs,
    expanded: &ExpandedActs,
    r0: usize,
    g: usize,
    nb: usize,
    sums: &mut [[f32; GROUP]; ROW_TILE],
) {
    let stored: &[u8] = &w.data;
    const GROUP_BYTES: usize = GROUP * 144;
    let group = &stored[g * nb * GROUP_BYTES..(g + 1) * nb * GROUP_BYTES];
    let base = group.as_ptr();
    let low = _mm256_set1_epi8(0x0f);
    let even_bytes = _mm256_set1_epi32(0x00ff_00ff);
    // Byte k of each lane into both i16 halves of the lane (vpshufb, within 128-bit halves).
    let spread = |k: i8| {
        let (a, b, c, d) = (k, 4 + k, 8 + k, 12 + k);
        _mm256_setr_epi8(
            a, -1, a, -1, b, -1, b, -1, c, -1, c, -1, d, -1, d, -1, a, -1, a, -1, b, -1, b, -1,
            c, -1, c, -1, d, -1, d, -1,
        )
    };
    let spreads = [spread(0), spread(1), spread(2), spread(3)];
    let mut y = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        // SAFETY (all loads): super-block b of the group is GROUP_BYTES bytes at
        // base + b · GROUP_BYTES (the caller's contract); row r0 + r's expanded activations of
        // block b are ACT_BYTES at ((r0 + r) · nb + b) · ACT_BYTES, its 8 pair sums at
        // ((r0 + r) · nb + b) · 8, its scale at (r0 + r) · nb + b.
        unsafe {
            let blk = base.add(b * GROUP_BYTES);
            prefetch_ahead(stored, (g * nb + b) * GROUP_BYTES, GROUP_BYTES);
            let [sc_lo, sc_hi, m_lo, m_hi] = super::rows8::q4_k_scales_and_minima(blk);
            // (sc_{r,s}, sc_{r,s}) as i16 in lane r.
            let scale = |s: usize| _mm256_shuffle_epi8(if s < 4 { sc_lo } else { sc_hi }, spreads[s % 4]);
            // (m_{4q}, m_{4q+2}) and (m_{4q+1}, m_{4q+3}) as i16 in lane r.
            let mins = [
                _mm256_and_si256(m_lo, even_bytes),
                _mm256_and_si256(_mm256_srli_epi16::<8>(m_lo), even_bytes),
                _mm256_and_si256(m_hi, even_bytes),
                _mm256_and_si256(_mm256_srli_epi16::<8>(m_hi), even_bytes),
            ];
            let mut isum = [_mm256_setzero_si256(); R];
            for c in 0..4 {
                let mut t = [[_mm256_setzero_si256(); 2]; R];
                for v in 0..4 {
                    let z = halves(blk.add(Q4_K_QS + 256 * c + 64 * v));
                    // [h][half]: low nibbles (sub-block 2c), high nibbles (2c + 1).
                    let nib = [
                        [_mm256_and_si256(z[0], low), _mm256_and_si256(z[1], low)],
                        [
                            _mm256_and_si256(_mm256_srli_epi16::<4>(z[0]), low),
                            _mm256_and_si256(_mm256_srli_epi16::<4>(z[1]), low),
                        ],
                    ];
                    for (r, t_r) in t.iter_mut().enumerate() {
                        let a = expanded.bytes.as_ptr().add(((r0 + r) * nb + b) * ACT_BYTES) as *const u8;
                        for (h, t_rh) in t_r.iter_mut().enumerate() {
                            let av = halves(a.add(64 * ((4 * c + v) * 2 + h)));
                            let p0 = _mm256_maddubs_epi16(nib[h][0], av[0]);
                            let p1 = _mm256_maddubs_epi16(nib[h][1], av[1]);
                            *t_rh = _mm256_add_epi16(*t_rh, _mm256_add_epi16(p0, p1));
                        }
                    }
                }
                let (s0, s1) = (scale(2 * c), scale(2 * c + 1));
                for r in 0..R {
                    let scaled = _mm256_add_epi32(
                        _mm256_madd_epi16(t[r][0], s0),
                        _mm256_madd_epi16(t[r][1], s1),
                    );
                    isum[r] = _mm256_add_epi32(isum[r], scaled);
                }
            }
            let d = _mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i));
            let dmin = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16) as *const __m128i));
            for r in 0..R {
                // M_r: the minima against the activation row's pair sums P_s.
                let p = expanded.pairs.as_ptr().add(((r0 + r) * nb + b) * 8);
                let pair = |s: usize, t: usize| _mm256_set1_epi32((*p.add(s) & 0xffff) | (*p.add(t) << 16));
                let m_r = _mm256_add_epi32(
                    _mm256_add_epi32(
                        _mm256_madd_epi16(mins[0], pair(0, 2)),
                        _mm256_madd_epi16(mins[1], pair(1, 3)),
                    ),
                    _mm256_add_epi32(
                        _mm256_madd_epi16(mins[2], pair(4, 6)),
                        _mm256_madd_epi16(mins[3], pair(5, 7)),
                    ),
                );
                let e = _mm256_set1_ps(*acts.e.as_ptr().add((r0 + r) * nb + b));
                let t = _mm256_mul_ps(_mm256_mul_ps(d, e), _mm256_cvtepi32_ps(isum[r]));
                y[r] = _mm256_add_ps(y[r], t);
                let m = _mm256_mul_ps(_mm256_mul_ps(dmin, e), _mm256_cvtepi32_ps(m_r));
                y[r] = _mm256_sub_ps(y[r], m);
            }
        }
    }
    for r in 0..R {
        // SAFETY: sums[r] holds 8 floats.
        unsafe { _mm256_storeu_ps(sums[r].as_mut_ptr(), y[r]) };
    }
}

/// [`group_sums`] of `Q6_K` for `R` activation rows.
///
/// # Safety
/// As [`group_sums`], with `R` rows and `w` of `Q6_K`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_sums<const R: usize>(
    w: &KQuantMatrix,
    acts: &KQuantActs,
    expanded: &ExpandedActs,
    r0: usize,
    g: usize,
    nb: usize,
    sums: &mut [[f32; GROUP]; ROW_TILE],
) {
    let stored: &[u8] = &w.data;
    const GROUP_BYTES: usize = GROUP * 210;
    let group = &stored[g * nb * GROUP_BYTES..(g + 1) * nb * GROUP_BYTES];
    let base = group.as_ptr();
    let low = _mm256_set1_epi8(0x0f);
    let (bits01, bits23, bits45) = (
        _mm256_set1_epi8(0x03),
        _mm256_set1_epi8(0x0c),
        _mm256_set1_epi8(0x30),
    );
    let mut y = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        // SAFETY (all loads): as in `q4_k_sums`; row r0 + r's 16 group sums of block b are at
        // ((r0 + r) · nb + b) · 16 of `acts.bsums`.
        unsafe {
            let blk = base.add(b * GROUP_BYTES);
            prefetch_ahead(stored, (g * nb + b) * GROUP_BYTES, GROUP_BYTES);
            // Group s's signed scales as (sc, sc) i16 in lane r; and groups (2q, 2q + 1)'s as
            // (sc_{r,2q}, sc_{r,2q+1}) for the taken term.
            let scale = |s: usize| {
                let sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64(blk.add(16 + 8 * s) as *const __m128i));
                _mm256_or_si256(_mm256_and_si256(sc, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32::<16>(sc))
            };
            let scale_pairs = |q: usize| {
                let two = _mm_loadu_si128(blk.add(16 + 16 * q) as *const __m128i);
                _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(two, _mm_srli_si128::<8>(two)))
            };
            let pairs: [__m256i; 8] = std::array::from_fn(scale_pairs);
            let mut isum = [_mm256_setzero_si256(); R];
            for c in 0..4 {
                let (n, k) = (c / 2, c % 2);
                // u of vectors v, halves h, 32-byte halves: [v][h][half]
                let mut u = [[[_mm256_setzero_si256(); 2]; 2]; 4];
                for (v, u_v) in u.iter_mut().enumerate() {
                    let ql = halves(blk.add(Q6_K_QL + 256 * c + 64 * v));
                    let qh = halves(blk.add(Q6_K_QH + 256 * n + 64 * v));
                    for half in 0..2 {
                        let (l, hb) = (ql[half], qh[half]);
                        let (top_lo, top_hi) = if k == 0 {
                            (
                                _mm256_slli_epi16::<4>(_mm256_and_si256(hb, bits01)),
                                _mm256_and_si256(hb, bits45),
                            )
                        } else {
                            (
                                _mm256_slli_epi16::<2>(_mm256_and_si256(hb, bits23)),
                                _mm256_and_si256(_mm256_srli_epi16::<2>(hb), bits45),
                            )
                        };
                        u_v[0][half] = _mm256_or_si256(_mm256_and_si256(l, low), top_lo);
                        u_v[1][half] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(l), low), top_hi);
                    }
                }
                for m in 0..2 {
                    for h in [0, 1] {
                        let s = 8 * n + 4 * h + 2 * k + m;
                        let sc = scale(s);
                        for (r, isum_r) in isum.iter_mut().enumerate() {
                            let a = expanded.bytes.as_ptr().add(((r0 + r) * nb + b) * ACT_BYTES) as *const u8;
                            for v in [2 * m, 2 * m + 1] {
                                let av = halves(a.add(64 * ((4 * c + v) * 2 + h)));
                                let t = _mm256_add_epi16(
                                    _mm256_maddubs_epi16(u[v][h][0], av[0]),
                                    _mm256_maddubs_epi16(u[v][h][1], av[1]),
                                );
                                *isum_r = _mm256_add_epi32(*isum_r, _mm256_madd_epi16(t, sc));
                            }
                        }
                    }
                }
            }
            let d = _mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i));
            for r in 0..R {
                // − 32 Σ_s sc_{r,s} bsums_s: the values were stored as q + 32.
                let bs = acts.bsums.as_ptr().add(((r0 + r) * nb + b) * 16);
                let mut taken = _mm256_setzero_si256();
                for (q, &pq) in pairs.iter().enumerate() {
                    let both = (*bs.add(2 * q) & 0xffff) | (*bs.add(2 * q + 1) << 16);
                    taken = _mm256_add_epi32(taken, _mm256_madd_epi16(pq, _mm256_set1_epi32(both)));
                }
                let i_r = _mm256_sub_epi32(isum[r], _mm256_slli_epi32::<5>(taken));
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
