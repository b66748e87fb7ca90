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
//! measured it is bound by their count, not by the two multiplier pipes. So two groups share
//! one `vpmaddwd` and one `vpaddd` where their pairs' i16 sum is exact: a [`GroupPlan`], made
//! once per product from `|p|`, lists the pairs of groups whose four inputs behind each i16
//! lane have `Σ |p| ≤ 258` in every row of a tile (then `|sum| ≤ 127 · 258 < 2^15`), seven
//! operations for two groups instead of eight (five instead of six without signs). On the
//! De-En model's activations 93% of the groups go in pairs.
//!
//! A register tile is `R ≤ 4` activation rows × one panel (16 outputs = two 8-lane halves):
//! `2R` accumulators and two weight registers within AVX2's 16 registers. Rows `R` apart
//! reuse the panel from L1.
//!
//! Where the CPU has AVX-VNNI (the 256-bit `vpdpbusd` of Alder Lake and later, Zen 5), the
//! tile takes the AVX-512 kernel's route on 8-lane vectors instead ([`Tile::run_vnni`]): one
//! `vpdpbusd` of `u` against the weights, then `- 128 Σ_k q_ok`, the same integer.
//! [`set_plain_avx2`] turns it off (tests and benchmarks of what a CPU without it runs).

use super::int8::TILE_ROWS;
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
    // SAFETY: the caller's contract.
    unsafe { quantize_row_as::<true>(src, dst).0 }
}

/// [`quantize_row`] for the plain kernel: `p_k = round(x_k / t)` itself as i8 bytes (what
/// `u_k ^ 0x80` would give); returns `t` and the OR of every byte written, whose top bit says
/// whether any `p` is below 0.
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
pub unsafe fn quantize_row_signed(src: &[f32], dst: &mut [u8]) -> (f32, u8) {
    // SAFETY: the caller's contract.
    unsafe { quantize_row_as::<false>(src, dst) }
}

/// One activation row: `p_k = round_small(clamp(x_k / t, ±127))`, written as `p + 128` where
/// `OFFSET` (an integer in [1, 255]) or as `p`'s i8 byte; returns `t` and the OR of the bytes.
///
/// # Safety
/// The CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn quantize_row_as<const OFFSET: bool>(src: &[f32], dst: &mut [u8]) -> (f32, u8) {
    let n = src.len().min(dst.len());
    let scale = max_abs(&src[..n]) / 127.0;
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    let step = Quantize8 {
        inv: _mm256_set1_ps(inv),
        lo: _mm256_set1_ps(-127.0),
        hi: _mm256_set1_ps(127.0),
        magic: _mm256_set1_ps(12_582_912.0),
        offset: _mm256_set1_ps(if OFFSET { 128.0 } else { 0.0 }),
    };
    // packs / packus interleave the two 128-bit halves; this puts the 4-byte groups back.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let mut bits = _mm256_setzero_si256();
    let (src_chunks, dst_chunks) = (src[..n].chunks_exact(32), dst[..n].chunks_exact_mut(32));
    let done = n - src_chunks.remainder().len();
    for (from, to) in src_chunks.zip(dst_chunks) {
        let (a, b) = (step.lanes(&from[..8]), step.lanes(&from[8..16]));
        let (c, d) = (step.lanes(&from[16..24]), step.lanes(&from[24..]));
        let words = (_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
        // Values in [1, 255] (packus) or [-127, 127] (packs): the saturating packs are exact.
        let bytes = match OFFSET {
            true => _mm256_packus_epi16(words.0, words.1),
            false => _mm256_packs_epi16(words.0, words.1),
        };
        let bytes = _mm256_permutevar8x32_epi32(bytes, order);
        bits = _mm256_or_si256(bits, bytes);
        // SAFETY: `to` holds 32 bytes; unaligned store.
        unsafe { _mm256_storeu_si256(to.as_mut_ptr() as *mut __m256i, bytes) };
    }
    let mut or = [0u8; 32];
    // SAFETY: `or` holds 32 bytes.
    unsafe { _mm256_storeu_si256(or.as_mut_ptr() as *mut __m256i, bits) };
    let mut top = or.iter().fold(0, |a, &b| a | b);
    for (d, &v) in dst[done..n].iter_mut().zip(&src[done..n]) {
        let p = super::int8::quantize(v, inv);
        *d = if OFFSET { (p + 128.0) as u8 } else { p as i8 as u8 };
        top |= *d;
    }
    (scale, top)
}

/// The constants of eight lanes of [`quantize_row_as`].
struct Quantize8 {
    inv: __m256,
    lo: __m256,
    hi: __m256,
    magic: __m256,
    offset: __m256,
}

impl Quantize8 {
    /// `round_small(clamp(v · inv, ±127)) + offset` of 8 values, as i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn lanes(&self, v: &[f32]) -> __m256i {
        // SAFETY: `v` holds 8 f32 (the caller's slices); unaligned load.
        let v = unsafe { _mm256_loadu_ps(v[..8].as_ptr()) };
        let c = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v, self.inv), self.lo), self.hi);
        let r = _mm256_sub_ps(_mm256_add_ps(c, self.magic), self.magic);
        _mm256_cvttps_epi32(_mm256_add_ps(r, self.offset))
    }
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

/// The most `Σ |p|` four inputs may reach for two groups' `vpmaddubsw` pairs to be added in
/// i16 lanes before `vpmaddwd`: each term is at most `127 |p|`, so the sum is at most
/// `127 · 258 = 32,766 < 2^15`.
const PAIR_BOUND: u32 = 258;

/// Which groups of four inputs each row tile (`TILE_ROWS` rows) adds two at a time: the pair
/// `(g, g + 1)` where, in every row of the tile, the four inputs behind each i16 lane (`4g + j,
/// 4g + j + 1, 4g + 4 + j, 4g + 5 + j` for `j = 0, 2`) have `Σ |p| ≤ 258`. The i16 sum of the
/// two groups' pairs is then exact, and one `vpmaddwd` and one `vpaddd` serve both groups.
/// Every other group is taken alone. Integer sums in any order are the same integer, so the
/// plan changes no bits, only how many vector operations reach them.
pub struct GroupPlan {
    /// Per row tile: the ranges of `twos` and of `ones`.
    tiles: Vec<[usize; 4]>,
    /// `g` of each pair `(g, g + 1)` added in i16.
    twos: Vec<u32>,
    /// The groups taken alone.
    ones: Vec<u32>,
}

impl GroupPlan {
    /// The plan of `rows` rows of `|p|` (`stride = 4 · groups` bytes each).
    pub fn new(magnitude: &[u8], stride: usize, rows: usize) -> GroupPlan {
        let groups = stride / 4;
        let pairs = groups.div_ceil(2);
        let mut plan = GroupPlan {
            tiles: Vec::with_capacity(rows.div_ceil(TILE_ROWS)),
            twos: Vec::new(),
            ones: Vec::new(),
        };
        // Bit i of a tile's mask: pair (2i, 2i + 1) is taken as two lone groups.
        let mut tile_mask = vec![0u64; pairs.div_ceil(64)];
        let mut row_mask = vec![0u64; pairs.div_ceil(64)];
        for r0 in (0..rows).step_by(TILE_ROWS) {
            tile_mask.fill(0);
            let tile = &magnitude[r0 * stride..(r0 + TILE_ROWS).min(rows) * stride];
            for row in tile.chunks_exact(stride) {
                // SAFETY: the plain AVX2 kernel (the only one with a plan) runs where the CPU
                // has AVX2.
                unsafe { over_bound(row, &mut row_mask) };
                tile_mask.iter_mut().zip(&row_mask).for_each(|(t, r)| *t |= r);
            }
            let (twos, ones) = (plan.twos.len(), plan.ones.len());
            for i in 0..pairs {
                let g = 2 * i;
                match tile_mask[i / 64] >> (i % 64) & 1 == 0 {
                    true => plan.twos.push(g as u32),
                    false => plan.ones.extend((g..(g + 2).min(groups)).map(|g| g as u32)),
                }
            }
            plan.tiles.push([twos, plan.twos.len(), ones, plan.ones.len()]);
        }
        plan
    }

    /// The pairs and the lone groups of the row tile from row `r0` (a multiple of
    /// `TILE_ROWS`).
    pub fn tile(&self, r0: usize) -> (&[u32], &[u32]) {
        let [a, b, c, d] = self.tiles[r0 / TILE_ROWS];
        (&self.twos[a..b], &self.ones[c..d])
    }
}

/// Sets bit `i` of `mask` (`⌈pairs / 64⌉` words) where the groups `(2i, 2i + 1)` of one row of
/// `|p|` cannot be added in i16: one of the pair's two lanes has `Σ |p| > PAIR_BOUND`, or the
/// row's last group has no second. 32 bytes (four pairs) a step: `vpmaddubsw` against ones
/// sums neighbouring bytes, and each lane adds the sum 4 bytes on.
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
unsafe fn over_bound(row: &[u8], mask: &mut [u64]) {
    mask.fill(0);
    let groups = row.len() / 4;
    let mut set = |i: usize| mask[i / 64] |= 1 << (i % 64);
    let (ones, bound) = (_mm256_set1_epi8(1), _mm256_set1_epi16(PAIR_BOUND as i16));
    let mut chunks = row.chunks_exact(32);
    for (c, chunk) in (&mut chunks).enumerate() {
        // SAFETY: `chunk` holds 32 bytes; unaligned load.
        let v = unsafe { _mm256_loadu_si256(chunk.as_ptr() as *const __m256i) };
        // i16 k: bytes 2k + 2k+1 (at most 254); then in each 8-byte pair of groups, fields 0
        // and 1 are its two lanes' sums (bytes 0,1,4,5 and 2,3,6,7).
        let sums = _mm256_maddubs_epi16(v, ones);
        let lanes = _mm256_add_epi16(sums, _mm256_srli_epi64::<32>(sums));
        let over = _mm256_movemask_epi8(_mm256_cmpgt_epi16(lanes, bound)) as u32;
        for j in 0..4 {
            if over >> (8 * j) & 0xf != 0 {
                set(4 * c + j);
            }
        }
    }
    let done = row.len() - chunks.remainder().len();
    for g in (done / 4..groups).step_by(2) {
        // Only called where group g + 1 exists: bytes 4g .. 4g + 8 lie inside the row.
        let lane = |j: usize| -> u32 {
            [0, 1, 4, 5]
                .iter()
                .map(|&k| u32::from(row[4 * g + j + k]))
                .sum()
        };
        if g + 1 >= groups || lane(0) > PAIR_BOUND || lane(2) > PAIR_BOUND {
            set(g / 2);
        }
    }
}

/// One register tile: `R` activation rows × one panel of 16 outputs.
pub struct Tile<'a> {
    /// The panel's `[groups, 16, 4]` weights.
    pub q: *const i8,
    pub groups: usize,
    /// The first row's activations, rows `u_stride` apart: `p` as i8 bytes for
    /// [`run`](Self::run) and [`run_non_negative`](Self::run_non_negative), `u = p + 128`
    /// for [`run_vnni`](Self::run_vnni).
    pub u: *const u8,
    /// For [`run`](Self::run): `|p|` in the same layout (for the others, `u` again: where
    /// every `p` is at least 0 it is its own `|p|`).
    pub magnitude: *const u8,
    pub u_stride: usize,
    /// For `run` and `run_non_negative`: the [`GroupPlan`] of these rows, the groups added
    /// two at a time (`twos`, each the first of its pair) and those taken alone (`ones`).
    pub twos: &'a [u32],
    pub ones: &'a [u32],
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

impl Tile<'_> {
    /// `y_ro = (Σ_k q_ok p_rk) · (s_o t_r)` for the tile.
    ///
    /// # Safety
    /// The CPU has AVX2; the pointers cover the panel (`groups · 64` bytes), `R` rows of `u`
    /// and of `magnitude` (`4 · groups` bytes each) and `t`, 16 scales, and `R` rows of `y`
    /// at `lanes` outputs, which nothing else accesses meanwhile; `twos` and `ones` are the
    /// [`GroupPlan`] of these rows' `|p|`.
    #[target_feature(enable = "avx2")]
    pub unsafe fn run<const R: usize>(&self) {
        // SAFETY: the caller's contract.
        unsafe { self.run_planned::<R, true>() }
    }

    /// [`run`](Self::run) where every `p_rk` is at least 0 (the input of a layer after a
    /// ReLU): `p ∈ [0, 127]` is then the unsigned side of `vpmaddubsw` as it is, against the
    /// signed weights, with no sign to move (a pair is at most `2 · 127 · 127`, never
    /// saturated): the same integer in one vector operation fewer per row, half and group.
    ///
    /// # Safety
    /// As [`run`](Self::run), and every `p` byte at `u` is in `[0, 127]` (`twos` and `ones`
    /// the plan of `p`).
    #[target_feature(enable = "avx2")]
    pub unsafe fn run_non_negative<const R: usize>(&self) {
        // SAFETY: the caller's contract.
        unsafe { self.run_planned::<R, false>() }
    }

    /// The tile's exact sums over the plan's pairs of groups, then its lone groups.
    ///
    /// # Safety
    /// As [`run`](Self::run) (`SIGNED`) or [`run_non_negative`](Self::run_non_negative).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn run_planned<const R: usize, const SIGNED: bool>(&self) {
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_si256(); 2]; R];
        // SAFETY (caller, here and below): the 64 bytes of group g are outputs 0..8 then
        // 8..16, four each; group g + 1 of a pair follows (g + 1 < groups).
        for &g in self.twos {
            let g = g as usize;
            let first = self.weights(g);
            let second = self.weights(g + 1);
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let at = r * self.u_stride + 4 * g;
                let a = self.group_pairs::<SIGNED>(at, &first);
                let b = self.group_pairs::<SIGNED>(at + 4, &second);
                for h in 0..2 {
                    // Exact in i16: the plan's bound on these rows' Σ |p|.
                    let both = _mm256_add_epi16(a[h], b[h]);
                    acc_r[h] = _mm256_add_epi32(acc_r[h], _mm256_madd_epi16(both, ones));
                }
            }
        }
        for &g in self.ones {
            let g = g as usize;
            let w = self.weights(g);
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let pairs = self.group_pairs::<SIGNED>(r * self.u_stride + 4 * g, &w);
                for h in 0..2 {
                    acc_r[h] = _mm256_add_epi32(acc_r[h], _mm256_madd_epi16(pairs[h], ones));
                }
            }
        }
        // SAFETY: the caller's contract.
        unsafe { self.store(&acc) }
    }

    /// Group `g`'s 64 weight bytes: outputs 0..8, then 8..16, four each.
    ///
    /// # Safety
    /// The panel holds group `g`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn weights(&self, g: usize) -> [__m256i; 2] {
        // SAFETY (caller): bytes 64g .. 64g + 64 of the panel; unaligned loads.
        unsafe {
            [
                _mm256_loadu_si256(self.q.add(g * 64) as *const __m256i),
                _mm256_loadu_si256(self.q.add(g * 64 + 32) as *const __m256i),
            ]
        }
    }

    /// One group's `vpmaddubsw` pairs for the row whose four activation bytes are at `at`,
    /// against the group's two weight halves `w`: `|p| · sign(p) q` (`SIGNED`) or `p · q`.
    /// Each pair is at most `2 · 127 · 127`: never saturated.
    ///
    /// # Safety
    /// `u` (and, where `SIGNED`, `magnitude`) hold four bytes at `at`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn group_pairs<const SIGNED: bool>(&self, at: usize, w: &[__m256i; 2]) -> [__m256i; 2] {
        // SAFETY (caller): four bytes at `at`.
        let p = _mm256_set1_epi32((self.u.add(at) as *const i32).read_unaligned());
        if SIGNED {
            let p_abs = _mm256_set1_epi32((self.magnitude.add(at) as *const i32).read_unaligned());
            // sign(p) q: the weights carry the activations' signs (0 where p = 0).
            [
                _mm256_maddubs_epi16(p_abs, _mm256_sign_epi8(w[0], p)),
                _mm256_maddubs_epi16(p_abs, _mm256_sign_epi8(w[1], p)),
            ]
        } else {
            [
                _mm256_maddubs_epi16(p, w[0]),
                _mm256_maddubs_epi16(p, w[1]),
            ]
        }
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
#[path = "int8_avx2_tests.rs"]
mod tests;
