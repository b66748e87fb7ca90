//! `Q5_0` and `Q5_1` regrouped at load: each run of eight blocks of a row keeps its bytes,
//! but its 256 five-bit values are packed whole, five bits to a byte's five low bits and the
//! three other bits of the five vectors holding the last three blocks, so that unpacking eight
//! blocks is 23 vector operations instead of the file layout's 7 a block (nibbles, then the
//! fifth bits spread from `qh` to bytes), and the eight scales are one load instead of eight.
//!
//! ```text
//! a row of nb blocks:  ⌊nb / 8⌋ groups, then the last nb mod 8 blocks as the file stores them
//! a group (8 blocks' bytes: 176 for Q5_0, 192 for Q5_1):
//!     d_0 … d_7 (f16),  Q5_1 also m_0 … m_7 (f16),  then V_0 … V_4 (32 bytes each)
//!     u_kj = nibble_kj + 16 h_kj   (element j of block k, unsigned, 0 … 31)
//!     V_kj bits 0–4 = u_kj                                     (k < 5)
//!     u_5j = V_0j[7:5] | V_1j[6:5] << 3
//!     u_6j = V_2j[7:5] | V_3j[6:5] << 3
//!     u_7j = V_4j[7:5] | V_1j[7] << 3 | V_3j[7] << 4
//! ```
//!
//! [`values`] is the reference reading of a group, [`unsigned_avx2`] the vector one (16-bit
//! shifts, each followed by a byte mask that keeps only bits of the same byte).

use super::super::ggml::{five_bit_pair, GgmlType};
use super::half_at;
use rayon::prelude::*;

/// Blocks per group.
pub(super) const GROUP: usize = 8;

/// Bytes of a group's eight f16 `d` (and again of `Q5_1`'s eight `m`, which follow them).
pub(super) const SCALES: usize = 2 * GROUP;

/// Whether the blocks of `ty` are regrouped.
pub(super) fn regrouped(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q5_0 | GgmlType::Q5_1)
}

/// How many of a row's `nb` blocks of `ty` lie in groups (the first ones; none unless
/// [`regrouped`]).
pub(super) fn grouped_blocks(ty: GgmlType, nb: usize) -> usize {
    match regrouped(ty) {
        true => nb / GROUP * GROUP,
        false => 0,
    }
}

/// Bytes of a group before its values: the eight `d`, and the eight `m` of `Q5_1`.
pub(super) const fn head_bytes(with_min: bool) -> usize {
    if with_min {
        2 * SCALES
    } else {
        SCALES
    }
}

/// `d` and `m` (`Q5_1`, else 0) of block `k` of `group`.
pub(super) fn scales(group: &[u8], k: usize, with_min: bool) -> (f32, f32) {
    let m = if with_min { half_at(group, SCALES + 2 * k) } else { 0.0 };
    (half_at(group, 2 * k), m)
}

/// The unsigned values `u_j` (`nibble + 16 h`) of a stored block, with `d` and `m` (`Q5_1`,
/// else 0) as their f16 bits.
fn stored_block(block: &[u8], with_min: bool) -> ([u8; 32], u16, u16) {
    let at = if with_min { 4 } else { 2 };
    let half = |i: usize| u16::from_le_bytes([block[i], block[i + 1]]);
    let qh = u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]]);
    let mut u = [0u8; 32];
    for (j, &byte) in block[at + 4..at + 20].iter().enumerate() {
        let (lo, hi) = five_bit_pair(byte, qh, j);
        (u[j], u[j + 16]) = (lo as u8, hi as u8);
    }
    (u, half(0), if with_min { half(2) } else { 0 })
}

/// One group from the 8 stored blocks of `blocks` into `group` (as many bytes).
fn regroup_one(blocks: &[u8], group: &mut [u8], with_min: bool) {
    let bb = blocks.len() / GROUP;
    let head = head_bytes(with_min);
    let (heads, v) = group.split_at_mut(head);
    let mut u = [[0u8; 32]; GROUP];
    for (k, block) in blocks.chunks_exact(bb).enumerate() {
        let (values, d, m) = stored_block(block, with_min);
        u[k] = values;
        heads[2 * k..2 * k + 2].copy_from_slice(&d.to_le_bytes());
        if with_min {
            heads[SCALES + 2 * k..SCALES + 2 * k + 2].copy_from_slice(&m.to_le_bytes());
        }
    }
    for j in 0..32 {
        let (u5, u6, u7) = (u[5][j], u[6][j], u[7][j]);
        let top = [
            u5 & 7,
            (u5 >> 3) | ((u7 >> 3) & 1) << 2,
            u6 & 7,
            (u6 >> 3) | ((u7 >> 4) & 1) << 2,
            u7 & 7,
        ];
        for (k, t) in top.into_iter().enumerate() {
            v[32 * k + j] = u[k][j] | t << 5;
        }
    }
}

/// `data` (`rows` rows of `nb` stored blocks of `ty`, `Q5_0` or `Q5_1`) regrouped: the same
/// number of bytes, each row's whole groups of eight blocks packed as the module describes,
/// its last `nb mod 8` blocks copied.
pub(super) fn regroup(ty: GgmlType, data: &[u8], nb: usize) -> Vec<u8> {
    let with_min = ty == GgmlType::Q5_1;
    let (_, bb) = ty.block().expect("a block type");
    let row_bytes = nb * bb;
    let mut out = vec![0u8; data.len()];
    out.par_chunks_mut(row_bytes.max(1))
        .zip(data.par_chunks(row_bytes.max(1)))
        .for_each(|(to, from)| {
            let whole = grouped_blocks(ty, nb) * bb;
            let groups = to[..whole].chunks_exact_mut(GROUP * bb);
            for (group, blocks) in groups.zip(from[..whole].chunks_exact(GROUP * bb)) {
                regroup_one(blocks, group, with_min);
            }
            to[whole..].copy_from_slice(&from[whole..]);
        });
    out
}

/// The file's layout back from [`regroup`]'s: `data` (`rows` rows of `nb` regrouped blocks of
/// `ty`) as the file stored it (a device that reads the file's blocks takes this copy).
pub(super) fn ungroup(ty: GgmlType, data: &[u8], nb: usize) -> Vec<u8> {
    let with_min = ty == GgmlType::Q5_1;
    let (_, bb) = ty.block().expect("a block type");
    let row_bytes = (nb * bb).max(1);
    let head = head_bytes(with_min);
    let at = if with_min { 4 } else { 2 };
    let mut out = data.to_vec();
    for (to, from) in out.chunks_mut(row_bytes).zip(data.chunks(row_bytes)) {
        let whole = grouped_blocks(ty, nb) * bb;
        for (blocks, group) in to[..whole]
            .chunks_exact_mut(GROUP * bb)
            .zip(from[..whole].chunks_exact(GROUP * bb))
        {
            for (k, block) in blocks.chunks_exact_mut(bb).enumerate() {
                block[..2].copy_from_slice(&group[2 * k..2 * k + 2]);
                if with_min {
                    block[2..4].copy_from_slice(&group[SCALES + 2 * k..SCALES + 2 * k + 2]);
                }
                let u = values(&group[head..], k);
                let qh = (0..32).fold(0u32, |qh, j| qh | u32::from(u[j] >> 4) << j);
                block[at..at + 4].copy_from_slice(&qh.to_le_bytes());
                for j in 0..16 {
                    block[at + 4 + j] = (u[j] & 15) | (u[j + 16] & 15) << 4;
                }
            }
        }
    }
    out
}

/// The 32 unsigned values `u_j` of block `k` of a group whose values `V_0 … V_4` are `v`
/// (160 bytes): the reference reading.
pub(super) fn values(v: &[u8], k: usize) -> [u8; 32] {
    let byte = |i: usize, j: usize| v[32 * i + j];
    std::array::from_fn(|j| match k {
        0..5 => byte(k, j) & 0x1f,
        5 => byte(0, j) >> 5 | (byte(1, j) >> 5 & 3) << 3,
        6 => byte(2, j) >> 5 | (byte(3, j) >> 5 & 3) << 3,
        _ => byte(4, j) >> 5 | (byte(1, j) >> 7) << 3 | (byte(3, j) >> 7) << 4,
    })
}

/// The 32 unsigned values of each of the 8 blocks of the group whose values `V_0 … V_4` start
/// at `v`, as [`values`] gives them.
///
/// # Safety
/// AVX2; 160 bytes readable at `v`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn unsigned_avx2(v: *const u8) -> [std::arch::x86_64::__m256i; GROUP] {
    use std::arch::x86_64::*;
    // SAFETY (caller): five vectors of 32 bytes.
    let v: [__m256i; 5] =
        std::array::from_fn(|i| unsafe { _mm256_loadu_si256(v.add(32 * i) as *const __m256i) });
    // SAFETY: AVX2 (the caller).
    unsafe {
        // Bits 5–7 of a byte to bits 0–2 (`top`), 5–6 to 3–4 (`next`), bit 7 to 3 and to 4.
        let top: [__m256i; 3] =
            std::array::from_fn(|i| keep(_mm256_srli_epi16::<5>(v[2 * i]), 0x07));
        let next: [__m256i; 2] =
            std::array::from_fn(|i| keep(_mm256_srli_epi16::<2>(v[2 * i + 1]), 0x18));
        let bit7_to_3 = keep(_mm256_srli_epi16::<4>(v[1]), 0x08);
        let bit7_to_4 = keep(_mm256_srli_epi16::<3>(v[3]), 0x10);
        [
            keep(v[0], 0x1f),
            keep(v[1], 0x1f),
            keep(v[2], 0x1f),
            keep(v[3], 0x1f),
            keep(v[4], 0x1f),
            _mm256_or_si256(top[0], next[0]),
            _mm256_or_si256(top[1], next[1]),
            _mm256_or_si256(_mm256_or_si256(top[2], bit7_to_3), bit7_to_4),
        ]
    }
}

/// The bits `bits` of each byte of `x`.
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn keep(x: std::arch::x86_64::__m256i, bits: i8) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    _mm256_and_si256(x, _mm256_set1_epi8(bits))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regrouping keeps every block's values and scales, and each reading gives them back.
    #[test]
    fn groups_hold_the_stored_blocks() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut byte = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as u8
        };
        for ty in [GgmlType::Q5_0, GgmlType::Q5_1] {
            let with_min = ty == GgmlType::Q5_1;
            let (_, bb) = ty.block().unwrap();
            for nb in [1, 7, 8, 9, 18, 24] {
                let rows = 3;
                let data: Vec<u8> = (0..rows * nb * bb).map(|_| byte()).collect();
                let grouped = regroup(ty, &data, nb);
                assert_eq!(grouped.len(), data.len());
                assert!(ungroup(ty, &grouped, nb) == data, "{ty} nb {nb}: ungrouped");
                for r in 0..rows {
                    let row = &grouped[r * nb * bb..(r + 1) * nb * bb];
                    for b in 0..nb {
                        let stored = &data[(r * nb + b) * bb..(r * nb + b + 1) * bb];
                        let (want, d, m) = stored_block(stored, with_min);
                        if b >= nb / GROUP * GROUP {
                            assert_eq!(&row[b * bb..(b + 1) * bb], stored, "{ty} nb {nb} b {b}");
                            continue;
                        }
                        let (g, k) = (b / GROUP, b % GROUP);
                        let group = &row[g * GROUP * bb..(g + 1) * GROUP * bb];
                        let head = head_bytes(with_min);
                        let v = &group[head..];
                        assert_eq!(values(v, k), want, "{ty} nb {nb} block {b}");
                        let half = |i: usize| u16::from_le_bytes([group[i], group[i + 1]]);
                        assert_eq!(half(2 * k), d);
                        if with_min {
                            assert_eq!(half(16 + 2 * k), m);
                        }
                        #[cfg(target_arch = "x86_64")]
                        if std::arch::is_x86_feature_detected!("avx2") {
                            // SAFETY: AVX2 detected; the group's 160 bytes of values.
                            let u = unsafe { avx2_values(v.as_ptr(), k) };
                            assert_eq!(u, want, "{ty} AVX2 nb {nb} block {b}");
                        }
                    }
                }
            }
        }
    }

    /// Block `k` of [`unsigned_avx2`]'s reading.
    ///
    /// # Safety
    /// AVX2; 160 bytes at `v`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn avx2_values(v: *const u8, k: usize) -> [u8; 32] {
        use std::arch::x86_64::*;
        let mut out = [0u8; 32];
        // SAFETY (caller): 160 bytes; `out` holds 32.
        unsafe {
            let u = unsigned_avx2(v)[k];
            _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, u);
        }
        out
    }
}
