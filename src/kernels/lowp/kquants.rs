//! ggml's K-quants: *super-blocks* of `QK_K = 256` weights split into sub-blocks of 16 or 32,
//! each sub-block with its own small integer scale (and minimum) that multiplies one f16
//! super-block scale `d` (and `dmin`); and `Q8_K`, the activations they are multiplied with.
//! The layouts, as ggml's `ggml-common.h` declares them (little-endian, fields in this order):
//!
//! | type (code) | bytes / 256 | layout | element `i` of sub-block `s` |
//! |---|---|---|---|
//! | `Q2_K` (10) | 84 | `scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16` | `d·(sc_s & 15)·q_i − dmin·(sc_s >> 4)`, 16 sub-blocks of 16, `q` 2 bits |
//! | `Q3_K` (11) | 110 | `hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16` | `d·(sc_s − 32)·(q_i − 4·(1 − h_i))`, 16 of 16, `sc` 6 bits, `q` 2 low bits + high bit `h` |
//! | `Q4_K` (12) | 144 | `d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]` | `d·sc_s·q_i − dmin·m_s`, 8 of 32, `sc`, `m` 6 bits, `q` 4 bits |
//! | `Q5_K` (13) | 176 | `d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]` | `d·sc_s·(q_i + 16 h_i) − dmin·m_s`, as Q4_K plus a fifth bit |
//! | `Q6_K` (14) | 210 | `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16` | `d·sc_s·(q_i − 32)`, 16 of 16, `q` 4 low + 2 high bits |
//! | `Q8_K` (15) | 292 | `d: f32, qs: [i8; 256], bsums: [i16; 16]` | `d·qs_i`; `bsums` = sums of `qs` per 16 |
//!
//! Where the bits sit (ggml's `dequantize_row_*`, `ggml-quants.c`): the 2-bit types take the
//! 256 elements in two halves of 128; half `n` reads the 32 bytes `qs[32n..32n+32]` four times,
//! at bit shifts 0, 2, 4, 6, giving 32 elements each (element `128n + 32j + l` is bits `2j` of
//! `qs[32n + l]`); its 2-bit sub-blocks are those 32 in two runs of 16. `Q3_K`'s high bit of
//! that element is bit `4n + j` of `hmask[l]`. The 4-bit types take four chunks of 64: chunk
//! `c` reads `qs[32c..32c+32]`, low nibbles first (sub-block `2c`), then high nibbles (sub-block
//! `2c + 1`); `Q5_K`'s fifth bit is bit `2c` (low) or `2c + 1` (high) of `qh[l]`. `Q6_K` takes
//! two halves of 128: half `n` reads `ql[64n..64n+64]` and `qh[32n..32n+32]`; for `l < 32`,
//! elements `l, l+32, l+64, l+96` are the low nibble of `ql[l]`, of `ql[l+32]`, the high nibble
//! of `ql[l]`, of `ql[l+32]`, with bits 0-1, 2-3, 4-5, 6-7 of `qh[l]` on top; the sub-block of
//! element `e` of the half is `8n + e / 16`.
//!
//! The 6-bit scales (`Q3_K`, `Q4_K`, `Q5_K`) are packed into 12 bytes: see [`q3_k_scale`] and
//! [`q4_k_scale_min`] (ggml's `get_scale_min_k4`). Every formula is computed in f32 in ggml's
//! order (`(d · sc) · q − dmin · m`, each product rounded, no fused multiply-add), so the
//! values are ggml's bit for bit.

use super::ggml::f16_to_f32;

/// Elements per super-block.
pub const QK_K: usize = 256;

fn half_at(bytes: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([bytes[at], bytes[at + 1]]))
}

/// Sub-block `s < 8`'s 6-bit scale and minimum of `Q4_K` / `Q5_K` from their 12 bytes:
/// for `s < 4` the low 6 bits of bytes `s` and `s + 4`; for `s >= 4` the nibbles of byte
/// `s + 4` with the top 2 bits of bytes `s − 4` and `s` above them.
pub fn q4_k_scale_min(scales: &[u8], s: usize) -> (u8, u8) {
    if s < 4 {
        (scales[s] & 63, scales[s + 4] & 63)
    } else {
        (
            (scales[s + 4] & 0x0f) | ((scales[s - 4] >> 6) << 4),
            (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4),
        )
    }
}

/// Sub-block `s < 16`'s signed scale of `Q3_K` (`sc − 32`, in [-32, 31]) from its 12 bytes:
/// the low 4 bits are the low (`s < 8`) or high nibble of byte `s mod 8`, the top 2 bits are
/// bits `2⌊s/4⌋` of byte `8 + s mod 4`.
pub fn q3_k_scale(scales: &[u8], s: usize) -> i32 {
    let low = if s < 8 {
        scales[s] & 0x0f
    } else {
        scales[s - 8] >> 4
    };
    let high = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
    i32::from(low | (high << 4)) - 32
}

/// One `Q2_K` super-block (84 bytes) into 256 values.
pub fn dequantize_q2_k(block: &[u8], out: &mut [f32]) {
    let (scales, qs) = (&block[0..16], &block[16..80]);
    let (d, dmin) = (half_at(block, 80), half_at(block, 82));
    for (e, o) in out[..QK_K].iter_mut().enumerate() {
        let (n, j, l) = (e / 128, (e % 128) / 32, e % 32);
        let q = (qs[32 * n + l] >> (2 * j)) & 3;
        let sc = scales[8 * n + 2 * j + l / 16];
        let dl = d * f32::from(sc & 0x0f);
        let ml = dmin * f32::from(sc >> 4);
        *o = dl * f32::from(q) - ml;
    }
}

/// One `Q3_K` super-block (110 bytes) into 256 values.
pub fn dequantize_q3_k(block: &[u8], out: &mut [f32]) {
    let (hmask, qs, scales) = (&block[0..32], &block[32..96], &block[96..108]);
    let d = half_at(block, 108);
    for (e, o) in out[..QK_K].iter_mut().enumerate() {
        let (n, j, l) = (e / 128, (e % 128) / 32, e % 32);
        let low = i32::from((qs[32 * n + l] >> (2 * j)) & 3);
        let high = (hmask[l] >> (4 * n + j)) & 1;
        let q = low - if high == 1 { 0 } else { 4 };
        let dl = d * q3_k_scale(scales, 8 * n + 2 * j + l / 16) as f32;
        *o = dl * q as f32;
    }
}

/// One `Q4_K` super-block (144 bytes) into 256 values.
pub fn dequantize_q4_k(block: &[u8], out: &mut [f32]) {
    let (d, dmin) = (half_at(block, 0), half_at(block, 2));
    let (scales, qs) = (&block[4..16], &block[16..144]);
    for (e, o) in out[..QK_K].iter_mut().enumerate() {
        let (c, high, l) = (e / 64, (e % 64) / 32, e % 32);
        let byte = qs[32 * c + l];
        let q = if high == 1 { byte >> 4 } else { byte & 0x0f };
        let (sc, m) = q4_k_scale_min(scales, 2 * c + high);
        *o = d * f32::from(sc) * f32::from(q) - dmin * f32::from(m);
    }
}

/// One `Q5_K` super-block (176 bytes) into 256 values.
pub fn dequantize_q5_k(block: &[u8], out: &mut [f32]) {
    let (d, dmin) = (half_at(block, 0), half_at(block, 2));
    let (scales, qh, qs) = (&block[4..16], &block[16..48], &block[48..176]);
    for (e, o) in out[..QK_K].iter_mut().enumerate() {
        let (c, high, l) = (e / 64, (e % 64) / 32, e % 32);
        let byte = qs[32 * c + l];
        let low = if high == 1 { byte >> 4 } else { byte & 0x0f };
        let fifth = (qh[l] >> (2 * c + high)) & 1;
        let q = low + 16 * fifth;
        let (sc, m) = q4_k_scale_min(scales, 2 * c + high);
        *o = d * f32::from(sc) * f32::from(q) - dmin * f32::from(m);
    }
}

/// The 6-bit value (0..63) of element `e < 256` of a `Q6_K` block's `ql` and `qh`.
pub fn q6_k_value(ql: &[u8], qh: &[u8], e: usize) -> u8 {
    let (n, quarter, l) = (e / 128, (e % 128) / 32, e % 32);
    let low_byte = ql[64 * n + l + 32 * (quarter % 2)];
    let low = if quarter >= 2 {
        low_byte >> 4
    } else {
        low_byte & 0x0f
    };
    let high = (qh[32 * n + l] >> (2 * quarter)) & 3;
    low | (high << 4)
}

/// One `Q6_K` super-block (210 bytes) into 256 values.
pub fn dequantize_q6_k(block: &[u8], out: &mut [f32]) {
    let (ql, qh, scales) = (&block[0..128], &block[128..192], &block[192..208]);
    let d = half_at(block, 208);
    for (e, o) in out[..QK_K].iter_mut().enumerate() {
        let q = i32::from(q6_k_value(ql, qh, e)) - 32;
        let sc = scales[e / 16] as i8;
        *o = d * f32::from(sc) * q as f32;
    }
}

/// One `Q8_K` block (292 bytes) into 256 values.
pub fn dequantize_q8_k(block: &[u8], out: &mut [f32]) {
    let d = f32::from_le_bytes([block[0], block[1], block[2], block[3]]);
    for (o, &q) in out[..QK_K].iter_mut().zip(&block[4..4 + QK_K]) {
        *o = f32::from(q as i8) * d;
    }
}
