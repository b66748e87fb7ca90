//! `Q4_K` and `Q6_K` weights with eight rows interleaved (llama.cpp's `block_q4_Kx8` idea, our
//! own layout), so that a decoding step's product keeps one weight row per i32 lane: no
//! horizontal sums, the sub-block scales and minima of eight rows applied by one vector
//! operation each. `Q4_K` below; `Q6_K`'s layout and kernel in `rows8_q6_k`.
//!
//! ```text
//! group g = rows 8g .. 8g + 8, super-block b: 1,152 bytes (8 × 144, the file's size)
//!     [0, 16)      d_r     (f16, row r at 2r)          [16, 32)  dmin_r (f16)
//!     [32, 128)    the 12 packed scale bytes as three u32 words: word k of row r at 32 + 32k + 4r
//!     [128, 1152)  nibbles: chunk c < 4 (the file's qs[32c .. 32c + 32]), vector v < 4, lane
//!                  L < 16: the 4 bytes qs[32c + 4j ..] of row r = L mod 8, j = 2v + ⌊L / 8⌋,
//!                  at 128 + 256c + 64v + 4L
//! activations, per super-block: A[c, v, h] = 64 bytes, lane L the 4 values p_{64c + 32h + 4j ..}
//!     (h = 0: low nibbles, sub-block 2c; h = 1: high nibbles, sub-block 2c + 1)
//! per group and super-block, lane L (row L mod 8):
//!     T_s  = Σ_v vpdpbusd(nibbles_{c,v,h}, A[c, v, h])        s = 2c + h     (exact i32)
//!     I_r  = Σ_s sc_{r,s} (T_s[r] + T_s[r + 8]),   M_r = Σ_s m_{r,s} (bsums_2s + bsums_2s+1)
//!     y_r ← y_r + (d_r e) I_r;   y_r ← y_r − (dmin_r e) M_r           (no FMA)
//! ```
//!
//! The integer sums are the row kernels' (exact), and the f32 steps theirs in their order, so a
//! row's result is the portable kernel's bit for bit. Rows past the last whole group stay in
//! the file's layout after the groups; [`file_block`] gives any row's block back as the file
//! stored it, for the kernels that read that layout.

use super::{KQuantActs, KQuantMatrix, RawBytes, QK_K};
use crate::kernels::lowp::ggml::GgmlType;
use crate::kernels::lowp::{products_are_serial, ROW_TILE};
use rayon::prelude::*;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Rows a group interleaves.
pub(super) const GROUP: usize = 8;
/// Bytes of the expanded activations of one super-block (4 chunks × 4 vectors × 2 halves × 64).
pub(super) const ACT_BYTES: usize = 2048;
/// Where `Q4_K`'s interleaved nibbles start.
pub(super) const Q4_K_QS: usize = 128;
/// Where `Q6_K`'s interleaved low four bits (`ql`) and top two bits (`qh`) start.
pub(super) const Q6_K_QL: usize = 144;
pub(super) const Q6_K_QH: usize = 1168;

/// Whether rows of `ty` can be interleaved by eight.
pub(super) fn interleaves(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K)
}

/// How far ahead of the super-block they multiply the interleaved kernels ask for the weights,
/// in bytes (rounded down to whole super-blocks of the matrix, two at least): far enough that
/// a line's trip from memory is over before the arithmetic of the super-blocks between reaches
/// it. Decoding reads each weight byte once, one group after the other; with the hardware's
/// prefetcher alone (or a request two super-blocks ahead) the kernel waits for memory and then
/// computes, one after the other: on an AMD EPYC Zen 4, 1 thread, a `Q4_K` / `Q6_K` matrix of
/// Llama-3.2-1B's FFN shape read from memory at 14 / 9 GB/s against 32 / 30 from the L3
/// cache; 6 to 32 super-blocks ahead into L2 gave 24 / 21 (`cargo bench --bench
/// kquant_decode`).
const PREFETCH_BYTES: usize = 12 << 10;

/// Starts the super-block [`PREFETCH_BYTES`] after the one at byte `at` of `stored` (`block`
/// bytes each) coming from memory into the L2 cache (a hint; the groups lie one after the
/// other, so past a group's end it is the next group's), unless it lies past the matrix. Into
/// L2, not L1: requests for L1 hold its few miss buffers, which the kernel's own loads need
/// (the same distance into L1 read 13-14 GB/s).
#[inline(always)]
pub(super) fn prefetch_ahead(stored: &[u8], at: usize, block: usize) {
    let ahead = (PREFETCH_BYTES / block).max(2) * block;
    if let Some(next) = stored.get(at + ahead..at + ahead + block) {
        super::prefetch_to_l2(next);
    }
}

/// Bytes of one super-block of `ty` in the file.
fn block_bytes(ty: GgmlType) -> usize {
    ty.block().expect("a K-quant").1
}

/// Where quad `j < 8` (4 bytes) of 32-byte chunk `c` of row `r` lies among a group's vectors
/// starting at `at`: vector `⌊j / 2⌋` of the chunk, lane `r + 8 (j mod 2)`.
fn quad_at(at: usize, c: usize, j: usize, r: usize) -> usize {
    at + 256 * c + 64 * (j / 2) + 4 * (r + 8 * (j % 2))
}

/// The byte runs `(in the file's block, in the group's super-block, length)` that move row
/// `r`'s block of `ty` into its group (the layouts above and in `rows8_q6_k`).
fn moves(ty: GgmlType, r: usize) -> Vec<(usize, usize, usize)> {
    let mut m = Vec::with_capacity(72);
    match ty {
        GgmlType::Q4_K => {
            m.push((0, 2 * r, 2));
            m.push((2, 16 + 2 * r, 2));
            m.extend((0..3).map(|k| (4 + 4 * k, 32 + 32 * k + 4 * r, 4)));
            for c in 0..4 {
                m.extend((0..8).map(|j| (16 + 32 * c + 4 * j, quad_at(Q4_K_QS, c, j, r), 4)));
            }
        }
        _ => {
            m.push((208, 2 * r, 2));
            m.extend((0..16).map(|g| (192 + g, 16 + 8 * g + r, 1)));
            for c in 0..4 {
                m.extend((0..8).map(|j| (32 * c + 4 * j, quad_at(Q6_K_QL, c, j, r), 4)));
            }
            for n in 0..2 {
                m.extend((0..8).map(|j| (128 + 32 * n + 4 * j, quad_at(Q6_K_QH, n, j, r), 4)));
            }
        }
    }
    m
}

/// [`moves`] of the eight rows of a group, made once per type.
fn row_runs(ty: GgmlType) -> &'static [Vec<(usize, usize, usize)>] {
    use std::sync::OnceLock;
    static Q4_K: OnceLock<Vec<Vec<(usize, usize, usize)>>> = OnceLock::new();
    static Q6_K: OnceLock<Vec<Vec<(usize, usize, usize)>>> = OnceLock::new();
    let cell = if ty == GgmlType::Q4_K { &Q4_K } else { &Q6_K };
    cell.get_or_init(|| (0..GROUP).map(|r| moves(ty, r)).collect())
}

/// The file's `rows × nb` blocks of `ty` with each whole group of eight rows interleaved (the
/// layouts above), the rows after the last group as they were, in memory advised for
/// transparent huge pages where the system allows (the decoding kernels stream these bytes
/// every token: 2 MiB pages spare them a TLB miss every 4 KiB, as the file's own buffer,
/// `store::file_memory`). Parallel over groups.
pub(super) fn interleave(ty: GgmlType, data: &[u8], rows: usize, nb: usize) -> RawBytes {
    let len = data.len();
    let anon = (len > 0)
        .then(|| memmap2::MmapOptions::new().len(len).map_anon().ok())
        .flatten();
    let Some(mut anon) = anon else {
        let mut out = vec![0u8; len];
        interleave_into(ty, data, rows, nb, &mut out);
        return RawBytes::owned(out);
    };
    #[cfg(target_os = "linux")]
    let _ = anon.advise(memmap2::Advice::HugePage);
    interleave_into(ty, data, rows, nb, &mut anon);
    match anon.make_read_only() {
        Ok(map) => RawBytes::shared(std::sync::Arc::new(map), 0..len).expect("the whole map"),
        Err(_) => {
            let mut out = vec![0u8; len];
            interleave_into(ty, data, rows, nb, &mut out);
            RawBytes::owned(out)
        }
    }
}

/// [`interleave`] into `out` (`data.len()` bytes).
fn interleave_into(ty: GgmlType, data: &[u8], rows: usize, nb: usize, out: &mut [u8]) {
    let bb = block_bytes(ty);
    let row_bytes = nb * bb;
    let groups = rows / GROUP;
    let runs = row_runs(ty);
    let (grouped, tail) = out.split_at_mut(groups * GROUP * row_bytes);
    tail.copy_from_slice(&data[groups * GROUP * row_bytes..]);
    let fill = |(g, dst): (usize, &mut [u8])| {
        for (b, x8) in dst.chunks_exact_mut(GROUP * bb).enumerate() {
            for (r, runs) in runs.iter().enumerate() {
                let at = ((g * GROUP + r) * nb + b) * bb;
                let block = &data[at..at + bb];
                for &(from, to, len) in runs {
                    x8[to..to + len].copy_from_slice(&block[from..from + len]);
                }
            }
        }
    };
    if products_are_serial() {
        grouped.chunks_mut(GROUP * row_bytes).enumerate().for_each(fill);
    } else {
        grouped.par_chunks_mut(GROUP * row_bytes).enumerate().for_each(fill);
    }
}

/// Block `b` of row `o` as the file stores it, from a matrix of `rows` rows of `nb` blocks of
/// `ty` laid out by [`interleave`]: a slice of `data` for the rows after the groups, else
/// reassembled into `buf`.
pub(super) fn file_block<'a>(
    ty: GgmlType,
    data: &'a [u8],
    (rows, nb): (usize, usize),
    (o, b): (usize, usize),
    buf: &'a mut [u8; 256],
) -> &'a [u8] {
    let bb = block_bytes(ty);
    let (g, r) = (o / GROUP, o % GROUP);
    if g >= rows / GROUP {
        let at = (o * nb + b) * bb;
        return &data[at..at + bb];
    }
    let x8 = &data[(g * nb + b) * GROUP * bb..(g * nb + b + 1) * GROUP * bb];
    for &(from, to, len) in &row_runs(ty)[r] {
        buf[from..from + len].copy_from_slice(&x8[to..to + len]);
    }
    &buf[..bb]
}

/// The activations of rows `0 .. n` of `acts` (`Q8_K`) laid out for the interleaved kernels:
/// `[n, nb, ACT_BYTES]` bytes, vector `(c, v, h)` of a super-block at `64 ((4c + v) 2 + h)`,
/// lane `L` the 4 values from element `element(c, h, 2v + ⌊L / 8⌋)`; and for `Q4_K` the pair
/// sums `bsums_2s + bsums_2s+1` as `[n, nb, 8]` i32.
pub(super) struct ExpandedActs {
    pub(super) bytes: Vec<i8>,
    pub(super) pairs: Vec<i32>,
}

impl ExpandedActs {
    pub(super) fn new(ty: GgmlType, acts: &KQuantActs, n: usize) -> ExpandedActs {
        let (nb, cols) = (acts.nb, acts.nb * QK_K);
        // The first of the 4 elements a lane takes: Q4_K's chunk c holds sub-blocks 2c
        // (low nibbles) and 2c + 1; Q6_K's chunk c = 2n + k elements 128n + 64h + 32k + ...
        let element = |c: usize, h: usize, j: usize| match ty {
            GgmlType::Q4_K => 64 * c + 32 * h + 4 * j,
            _ => 128 * (c / 2) + 64 * h + 32 * (c % 2) + 4 * j,
        };
        let mut bytes = vec![0i8; n * nb * ACT_BYTES];
        for (rb, dst) in bytes.chunks_exact_mut(ACT_BYTES).enumerate() {
            let p = &acts.q[(rb / nb) * cols + (rb % nb) * QK_K..][..QK_K];
            for (k, v64) in dst.chunks_exact_mut(64).enumerate() {
                // k = (c · 4 + v) · 2 + h
                let (c, v, h) = (k / 8, (k / 2) % 4, k % 2);
                for (lane, quad) in v64.chunks_exact_mut(4).enumerate() {
                    let at = element(c, h, 2 * v + lane / 8);
                    quad.copy_from_slice(&p[at..at + 4]);
                }
            }
        }
        let pairs = match ty {
            GgmlType::Q4_K => acts.bsums[..n * nb * 16]
                .chunks_exact(2)
                .map(|g| g[0] + g[1])
                .collect(),
            _ => Vec::new(),
        };
        ExpandedActs { bytes, pairs }
    }
}

/// `y [rows, d_out] = x [rows, d_in] · Wᵀ` of a matrix laid out by [`interleave`], with the
/// AVX-512 VNNI kernel (`kernel` AVX-512) or the AVX2 one (`rows8_avx2`) for the groups
/// (tiles of up to `ROW_TILE` activation rows) and the matrix's row kernel for the rows after
/// them. AVX-512 takes it for the few rows of decoding steps (more take its GEMM); AVX2 for
/// every product (the group's bytes stay in cache from one row tile to the next).
///
/// # Panics
/// Unless the CPU has `kernel`'s features (AVX-512F/BW/VL and VNNI; AVX2, FMA and F16C), `w`
/// is interleaved and the operands' sizes fit.
#[cfg(target_arch = "x86_64")]
pub(in crate::kernels::lowp) fn product(
    w: &KQuantMatrix,
    kernel: crate::kernels::lowp::Kernel,
    y: &mut [f32],
    x: &[f32],
    rows: usize,
) {
    use crate::kernels::lowp::{has_avx2, has_vnni, Kernel, PackedFormat};
    let vnni = kernel == Kernel::Avx512;
    assert!(
        w.grouped_rows > 0 && if vnni { has_vnni() } else { kernel == Kernel::Avx2 && has_avx2() },
        "the interleaved product needs an interleaved matrix and AVX-512 VNNI or AVX2"
    );
    assert!(x.len() == rows * w.cols && y.len() == rows * w.rows, "operand sizes");
    let acts = w.quantize(x, rows);
    let expanded = ExpandedActs::new(w.ty, &acts, rows);
    let nb = w.cols / QK_K;
    let d_out = w.rows;
    // Each task: 4 groups (32 outputs), written through `Out` at their own columns of y.
    const TASK_GROUPS: usize = 4;
    let groups = w.grouped_rows / GROUP;
    let out = Out(y.as_mut_ptr());
    let task = |t: usize| {
        for g in t * TASK_GROUPS..((t + 1) * TASK_GROUPS).min(groups) {
            for r0 in (0..rows).step_by(ROW_TILE) {
                let n = ROW_TILE.min(rows - r0);
                let mut sums = [[0f32; GROUP]; ROW_TILE];
                // SAFETY: the kernel's features were asserted; group g < groups of nb
                // super-blocks exists in w.data; `expanded` and `acts` hold rows r0 .. r0 + n
                // of nb super-blocks.
                unsafe {
                    if vnni {
                        group_sums(w, &acts, &expanded, (r0, n), g, nb, &mut sums)
                    } else {
                        super::rows8_avx2::group_sums(w, &acts, &expanded, (r0, n), g, nb, &mut sums)
                    }
                };
                for (i, s) in sums.iter().enumerate().take(n) {
                    // SAFETY: y is [rows, d_out] (asserted); outputs 8g .. 8g + 8 of row
                    // r0 + i are this task's alone, and y outlives the loop.
                    unsafe {
                        let to = out.at((r0 + i) * d_out + g * GROUP);
                        std::ptr::copy_nonoverlapping(s.as_ptr(), to, GROUP)
                    };
                }
            }
        }
    };
    let tasks = groups.div_ceil(TASK_GROUPS);
    if products_are_serial() {
        (0..tasks).for_each(task);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
    // The rows after the last group, in the file's layout.
    let mut one = [0f32; ROW_TILE];
    for o in w.grouped_rows..d_out {
        for r0 in (0..rows).step_by(ROW_TILE) {
            let n = ROW_TILE.min(rows - r0);
            w.tile(kernel, &acts, o, r0, &mut one[..n]);
            for (i, v) in one[..n].iter().enumerate() {
                y[(r0 + i) * d_out + o] = *v;
            }
        }
    }
}

/// `y`'s first element, shared by the tasks of one product (each writes its own outputs).
struct Out(*mut f32);
// SAFETY: written through only at outputs that one task owns, of a `y` that outlives the loop.
unsafe impl Sync for Out {}

impl Out {
    /// Element `i` (a method, so that closures capture the whole `Sync` wrapper).
    ///
    /// # Safety
    /// `i` is inside `y`.
    unsafe fn at(&self, i: usize) -> *mut f32 {
        // SAFETY: the caller's contract.
        unsafe { self.0.add(i) }
    }
}

/// The 6-bit scales and minima of the eight rows of the interleaved `Q4_K` super-block at
/// `blk`, spread from its packed scale words as llama.cpp's `utmp`: lane `r` of the four
/// vectors holds bytes `[sc0..3]`, `[sc4..7]`, `[m0..3]`, `[m4..7]` of row `r`.
///
/// # Safety
/// AVX2; `blk` points at a whole interleaved `Q4_K` super-block.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn q4_k_scales_and_minima(blk: *const u8) -> [__m256i; 4] {
    // SAFETY (caller): the three 32-byte words lie at 32 .. 128 of the super-block.
    unsafe {
        let (kmask1, kmask2, kmask3) = (
            _mm256_set1_epi32(0x3f3f_3f3f),
            _mm256_set1_epi32(0x0f0f_0f0f),
            _mm256_set1_epi32(0x0303_0303),
        );
        let word = |k: usize| _mm256_loadu_si256(blk.add(32 + 32 * k) as *const __m256i);
        let (w0, w1, w2) = (word(0), word(1), word(2));
        let top = |x: __m256i| {
            _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(x), kmask3))
        };
        [
            _mm256_and_si256(w0, kmask1),
            _mm256_or_si256(_mm256_and_si256(w2, kmask2), top(w0)),
            _mm256_and_si256(w1, kmask1),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32::<4>(w2), kmask2), top(w1)),
        ]
    }
}

/// A group's kernel for its type and `n` activation rows: `$q4_k::<R>` or `$q6_k::<R>` (each
/// generic over the rows `R`, 1 to `ROW_TILE`) called with `R = n` on the tuple `$args`
/// (`(w, acts, expanded, r0, g, nb, sums)`); the VNNI and AVX2 kernel families both dispatch
/// through it.
macro_rules! by_type_and_rows {
    ($ty:expr, $n:expr, $q4_k:ident, $q6_k:ident, $args:expr) => {{
        let (w, acts, expanded, r0, g, nb, sums) = $args;
        let q4_k = matches!($ty, $crate::kernels::lowp::ggml::GgmlType::Q4_K);
        match (q4_k, $n) {
            (true, 1) => $q4_k::<1>(w, acts, expanded, r0, g, nb, sums),
            (true, 2) => $q4_k::<2>(w, acts, expanded, r0, g, nb, sums),
            (true, 3) => $q4_k::<3>(w, acts, expanded, r0, g, nb, sums),
            (true, _) => $q4_k::<4>(w, acts, expanded, r0, g, nb, sums),
            (false, 1) => $q6_k::<1>(w, acts, expanded, r0, g, nb, sums),
            (false, 2) => $q6_k::<2>(w, acts, expanded, r0, g, nb, sums),
            (false, 3) => $q6_k::<3>(w, acts, expanded, r0, g, nb, sums),
            (false, _) => $q6_k::<4>(w, acts, expanded, r0, g, nb, sums),
        }
    }};
}
#[cfg(target_arch = "x86_64")]
pub(super) use by_type_and_rows;

/// `sums[i][k] = w_{8g+k} · x_{r0+i}` for `i < n`, `k < 8`: the kernel of the matrix's type
/// (`Q4_K` here, `Q6_K` in `rows8_q6_k`) for `R = n` activation rows.
///
/// # Safety
/// AVX-512F/BW/VL and VNNI; group `g` exists in `w.data` (laid out by [`interleave`], `nb`
/// super-blocks a row); `acts` and `expanded` hold rows `r0 .. r0 + n` (`n <= ROW_TILE`) of
/// `nb` blocks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn group_sums(
    w: &KQuantMatrix,
    acts: &KQuantActs,
    expanded: &ExpandedActs,
    (r0, n): (usize, usize),
    g: usize,
    nb: usize,
    sums: &mut [[f32; GROUP]; ROW_TILE],
) {
    use super::rows8_q6_k::sums_r as q6_k_sums_r;
    let args = (w, acts, expanded, r0, g, nb, sums);
    // SAFETY: the caller's contract, passed on with R = n.
    unsafe { by_type_and_rows!(w.ty, n, group_sums_r, q6_k_sums_r, args) }
}

/// [`group_sums`] of `Q4_K` for `R` activation rows.
///
/// # Safety
/// As [`group_sums`], with `R` rows.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn group_sums_r<const R: usize>(
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
    let low = _mm512_set1_epi8(0x0f);
    let byte = _mm512_set1_epi32(0xff);
    // Lanes 2r of a pair-sum vector, gathered into 8 lanes.
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    let mut y = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        // SAFETY (all loads): super-block b of the group is GROUP_BYTES bytes at
        // base + b · GROUP_BYTES (the caller's contract); row r's expanded activations of
        // block b are ACT_BYTES at (r · nb + b) · ACT_BYTES, its 8 pair sums at (r · nb + b) · 8,
        // its scale at r · nb + b (r from r0).
        unsafe {
            let blk = base.add(b * GROUP_BYTES);
            prefetch_ahead(stored, (g * nb + b) * GROUP_BYTES, GROUP_BYTES);
            let [sc_lo, sc_hi, m_lo, m_hi] = q4_k_scales_and_minima(blk);
            // Scale of sub-block s in lane L (row L mod 8).
            let (sc_lo, sc_hi) = (_mm512_broadcast_i64x4(sc_lo), _mm512_broadcast_i64x4(sc_hi));
            let scale = |s: usize| {
                let src = if s < 4 { sc_lo } else { sc_hi };
                let shifted = match s % 4 {
                    0 => src,
                    1 => _mm512_srli_epi32::<8>(src),
                    2 => _mm512_srli_epi32::<16>(src),
                    _ => _mm512_srli_epi32::<24>(src),
                };
                _mm512_and_si512(shifted, byte)
            };
            // Minima as i16 pairs: lane 2r (m_{4k}, m_{4k+1}), lane 2r + 1 (m_{4k+2}, m_{4k+3}).
            let (mins_lo, mins_hi) = (_mm512_cvtepu8_epi16(m_lo), _mm512_cvtepu8_epi16(m_hi));
            let mut isum = [_mm512_setzero_si512(); R];
            for c in 0..4 {
                let mut t = [[_mm512_setzero_si512(); 2]; R];
                for v in 0..4 {
                    let z = _mm512_loadu_si512(blk.add(Q4_K_QS + 256 * c + 64 * v) as *const __m512i);
                    let halves = [
                        _mm512_and_si512(z, low),
                        _mm512_and_si512(_mm512_srli_epi16::<4>(z), low),
                    ];
                    for (r, t_r) in t.iter_mut().enumerate() {
                        let a = expanded.bytes.as_ptr().add(((r0 + r) * nb + b) * ACT_BYTES);
                        for (h, t_rh) in t_r.iter_mut().enumerate() {
                            let av = _mm512_loadu_si512(a.add(64 * ((4 * c + v) * 2 + h)) as *const __m512i);
                            *t_rh = _mm512_dpbusd_epi32(*t_rh, halves[h], av);
                        }
                    }
                }
                let (s0, s1) = (scale(2 * c), scale(2 * c + 1));
                for r in 0..R {
                    let scaled = _mm512_add_epi32(
                        _mm512_mullo_epi32(t[r][0], s0),
                        _mm512_mullo_epi32(t[r][1], s1),
                    );
                    isum[r] = _mm512_add_epi32(isum[r], scaled);
                }
            }
            let d = _mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i));
            let dmin = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16) as *const __m128i));
            for r in 0..R {
                // I_r: the two lanes of each row added.
                let i_r = _mm256_add_epi32(
                    _mm512_castsi512_si256(isum[r]),
                    _mm512_extracti64x4_epi64::<1>(isum[r]),
                );
                // M_r: (m, m) pairs against (P, P) pairs, then lanes 2r + 2r + 1.
                let p = expanded.pairs.as_ptr().add(((r0 + r) * nb + b) * 8);
                let pair = |s: usize| (*p.add(s) & 0xffff) | (*p.add(s + 1) << 16);
                let (p01, p23, p45, p67) = (pair(0), pair(2), pair(4), pair(6));
                let lo = _mm512_setr_epi32(
                    p01, p23, p01, p23, p01, p23, p01, p23, p01, p23, p01, p23, p01, p23, p01, p23,
                );
                let hi = _mm512_setr_epi32(
                    p45, p67, p45, p67, p45, p67, p45, p67, p45, p67, p45, p67, p45, p67, p45, p67,
                );
                let m2 = _mm512_dpwssd_epi32(
                    _mm512_dpwssd_epi32(_mm512_setzero_si512(), mins_lo, lo),
                    mins_hi,
                    hi,
                );
                let m2 = _mm512_add_epi32(m2, _mm512_shuffle_epi32::<0b10_11_00_01>(m2));
                let m_r = _mm512_castsi512_si256(_mm512_permutexvar_epi32(even, m2));
                let e = _mm256_set1_ps(acts.e[(r0 + r) * nb + b]);
                let t = _mm256_mul_ps(_mm256_mul_ps(d, e), _mm256_cvtepi32_ps(i_r));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::lowp::{has_avx2, has_vnni, Kernel, PackedWeight, RawBytes};

    /// `rows × nb` random blocks of `ty`: random bytes, normal f16 scales of either sign.
    fn random_blocks(ty: GgmlType, rows: usize, nb: usize, seed: u64) -> Vec<u8> {
        let mut state = seed;
        let mut next = move || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) as u32
        };
        let bb = block_bytes(ty);
        let mut data: Vec<u8> = (0..rows * nb * bb).map(|_| next() as u8).collect();
        let scales: &[usize] = if ty == GgmlType::Q4_K { &[0, 2] } else { &[208] };
        for block in data.chunks_exact_mut(bb) {
            for &at in scales {
                let h = ((next() % 2) << 15) | ((7 + next() % 6) << 10) | (next() % 1024);
                block[at..at + 2].copy_from_slice(&(h as u16).to_le_bytes());
            }
        }
        data
    }

    #[test]
    fn every_block_comes_back_as_the_file_stored_it() {
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            let bb = block_bytes(ty);
            for (rows, nb) in [(1, 2), (7, 1), (8, 1), (9, 3), (16, 2), (23, 3), (40, 1)] {
                let data = random_blocks(ty, rows, nb, (rows * 31 + nb) as u64);
                let laid = interleave(ty, &data, rows, nb);
                let laid: &[u8] = &laid;
                assert_eq!(laid.len(), data.len());
                let mut buf = [0u8; 256];
                for o in 0..rows {
                    for b in 0..nb {
                        let at = (o * nb + b) * bb;
                        let got = file_block(ty, laid, (rows, nb), (o, b), &mut buf);
                        assert_eq!(got, &data[at..at + bb], "{ty} {rows}x{nb}: row {o} block {b}");
                    }
                }
            }
        }
    }

    /// Every byte of a group's super-block is written by exactly one run.
    #[test]
    fn the_runs_of_a_group_cover_its_bytes_once() {
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            let bb = block_bytes(ty);
            let mut hits = vec![0u8; GROUP * bb];
            for r in 0..GROUP {
                let mut from_hits = vec![0u8; bb];
                for (from, to, len) in moves(ty, r) {
                    hits[to..to + len].iter_mut().for_each(|h| *h += 1);
                    from_hits[from..from + len].iter_mut().for_each(|h| *h += 1);
                }
                assert!(from_hits.iter().all(|&h| h == 1), "{ty} row {r}: file bytes");
            }
            assert!(hits.iter().all(|&h| h == 1), "{ty}: group bytes");
        }
    }

    /// Interleaved rows give the file layout's products bit for bit, on every kernel (AVX2's
    /// and AVX-512 VNNI's interleaved kernels), for any number of activation rows (tiles of
    /// four; AVX-512's GEMM from 8) and weight rows (whole groups and the rows after them).
    #[test]
    fn interleaved_rows_give_the_file_layouts_bits() {
        let mut seed = 7;
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            for (d_out, cols) in [(8, 256), (13, 512), (24, 768), (70, 256)] {
                let nb = cols / QK_K;
                seed += 1;
                let data = random_blocks(ty, d_out, nb, seed);
                let layout = |interleave| {
                    let bytes = RawBytes::owned(data.clone());
                    KQuantMatrix::from_ggml_laid_out(ty, bytes, d_out, cols, interleave).unwrap()
                };
                let (file, laid) = (layout(false), layout(true));
                assert!(laid.is_interleaved() && !file.is_interleaved());
                let (file, laid) = (PackedWeight::KQuants(file), PackedWeight::KQuants(laid));
                let mut kernels = vec![Kernel::Portable];
                if has_avx2() {
                    kernels.push(Kernel::Avx2);
                }
                if has_vnni() {
                    kernels.push(Kernel::Avx512);
                } else {
                    eprintln!("no AVX-512 VNNI: the interleaved VNNI kernels are not run here");
                }
                for rows in 1..=9 {
                    let x: Vec<f32> = (0..rows * cols)
                        .map(|i| ((i * 7919 + rows * 13) % 2001) as f32 / 400.0 - 2.5)
                        .collect();
                    let mut want = vec![f32::NAN; rows * d_out];
                    file.product_with(Kernel::Portable, &mut want, &x, rows);
                    assert!(want.iter().all(|v| v.is_finite()));
                    for &kernel in &kernels {
                        let mut got = vec![f32::NAN; rows * d_out];
                        laid.product_with(kernel, &mut got, &x, rows);
                        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                            let label = format!("{ty} {d_out}x{cols} rows {rows} {kernel:?}");
                            assert_eq!(a.to_bits(), b.to_bits(), "{label} y[{i}]");
                        }
                    }
                }
            }
        }
    }
}
