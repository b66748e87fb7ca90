//! ggml's tensor element types as GGUF files store them (the block layouts the products of
//! [`super::BlockMatrix`] read, and `store::gguf` decodes), and their dequantisation to f32.
//!
//! A GGUF tensor's data is a row-major run of *blocks*; a row (`ne[0]` elements, the fastest
//! dimension) is always a whole number of blocks. The supported layouts, as ggml's
//! `ggml-common.h` declares them (all little-endian, `f16` = IEEE 754 half precision):
//!
//! | type (code) | elements / block | bytes / block | layout | element `j` |
//! |---|---|---|---|---|
//! | `F32` (0) | 1 | 4 | `f32` | the value |
//! | `F16` (1) | 1 | 2 | `f16` | the value |
//! | `BF16` (30) | 1 | 2 | the top 16 bits of an `f32` | the value |
//! | `Q4_0` (2) | 32 | 18 | `d: f16, qs: [u8; 16]` | `(q_j - 8) · d` |
//! | `Q4_1` (3) | 32 | 20 | `d: f16, m: f16, qs: [u8; 16]` | `q_j · d + m` |
//! | `Q5_0` (6) | 32 | 22 | `d: f16, qh: [u8; 4], qs: [u8; 16]` | `(q_j + 16 h_j - 16) · d` |
//! | `Q5_1` (7) | 32 | 24 | `d: f16, m: f16, qh: [u8; 4], qs: [u8; 16]` | `(q_j + 16 h_j) · d + m` |
//! | `Q8_0` (8) | 32 | 34 | `d: f16, qs: [i8; 32]` | `qs[j] · d` |
//! | `IQ4_NL` (20) | 32 | 18 | `d: f16, qs: [u8; 16]` | `K[q_j] · d`, `K` ggml's 16 non-linear levels ([`IQ4_NL_LEVELS`]) |
//! | `MXFP4` (39) | 32 | 17 | `e: u8, qs: [u8; 16]` | `F[q_j] · 2^(e − 128)`, `F` twice the e2m1 values ([`MXFP4_LEVELS`]) |
//! | `Q2_K` … `Q6_K`, `Q8_K` (10–15) | 256 | 84 … 292 | super-blocks, see [`super::kquants`] | |
//!
//! `MXFP4` (OCP microscaling FP4, gpt-oss's experts): each nibble an e2m1 float (sign, 2
//! exponent bits, 1 mantissa bit: 0, ±0.5, ±1, ±1.5, ±2, ±3, ±4, ±6), stored doubled as the
//! integers of [`MXFP4_LEVELS`], and one shared e8m0 exponent `e` (a power of two `2^(e − 127)`,
//! halved to undo the doubling: ggml's `GGML_E8M0_TO_FP32_HALF`, [`e8m0_half`]).
//!
//! In the 4-bit blocks, element `j < 16` is the low nibble of `qs[j]` and element `j + 16` the
//! high nibble of `qs[j]` (not interleaved pairs); the 5-bit blocks add bit `j` of the
//! little-endian u32 `qh` as the fifth bit `h_j` of element `j`. The formulas are those of
//! ggml's `dequantize_row_q4_0`, `dequantize_row_q4_1`, `dequantize_row_q5_0`, ...,
//! `dequantize_row_iq4_nl` (`ggml-quants.c`), computed in f32 in the same order: the integer
//! times `d` is exact in f32 (at most 8 × 11 significant bits), so the only rounding is the
//! `+ m` of Q4_1 and Q5_1, as in ggml and in gguf-py's numpy version. Every other ggml type is
//! named in errors but not decoded.

pub use super::bf16::bf16_to_f32;
use super::kquants::{self, QK_K};
use rayon::prelude::*;

/// ggml's `kvalues_iq4nl`: the 16 levels an `IQ4_NL` nibble selects.
pub const IQ4_NL_LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// ggml's `kvalues_mxfp4`: the 16 e2m1 values an `MXFP4` nibble selects, doubled (integers).
pub const MXFP4_LEVELS: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// An `MXFP4` block's e8m0 scale halved, `2^(e − 128)` in f32 (ggml's
/// `ggml_e8m0_to_fp32_half`: `e` 0 and 1 are the subnormals `2^-128` and `2^-127`).
pub fn e8m0_half(e: u8) -> f32 {
    let bits = match e {
        0 | 1 => 0x0020_0000u32 << e,
        _ => u32::from(e - 1) << 23,
    };
    f32::from_bits(bits)
}

/// A ggml tensor element type, by its code in the GGUF tensor info (named as ggml names them).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ4_NL,
    MXFP4,
    /// A type this reader does not decode (its ggml code).
    Unsupported(u32),
}

/// ggml's names of its type codes (`ggml.h`, `enum ggml_type`); codes 4, 5 and 31–33, 36–38
/// were retired and are unnamed.
fn ggml_type_name(code: u32) -> Option<&'static str> {
    Some(match code {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => return None,
    })
}

impl GgmlType {
    /// The type of ggml code `code`.
    pub fn from_code(code: u32) -> GgmlType {
        match code {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            10 => GgmlType::Q2_K,
            11 => GgmlType::Q3_K,
            12 => GgmlType::Q4_K,
            13 => GgmlType::Q5_K,
            14 => GgmlType::Q6_K,
            15 => GgmlType::Q8_K,
            20 => GgmlType::IQ4_NL,
            30 => GgmlType::BF16,
            39 => GgmlType::MXFP4,
            other => GgmlType::Unsupported(other),
        }
    }

    /// The ggml code.
    pub fn code(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::Q8_K => 15,
            GgmlType::IQ4_NL => 20,
            GgmlType::BF16 => 30,
            GgmlType::MXFP4 => 39,
            GgmlType::Unsupported(code) => code,
        }
    }

    /// ggml's name (`Q4_1`), or `unknown type N`.
    pub fn name(self) -> String {
        match ggml_type_name(self.code()) {
            Some(name) => name.to_string(),
            None => format!("unknown type {}", self.code()),
        }
    }

    /// Elements per block and bytes per block, for the supported types.
    pub fn block(self) -> Option<(usize, usize)> {
        match self {
            GgmlType::F32 => Some((1, 4)),
            GgmlType::F16 | GgmlType::BF16 => Some((1, 2)),
            GgmlType::Q4_0 | GgmlType::IQ4_NL => Some((32, 18)),
            GgmlType::Q4_1 => Some((32, 20)),
            GgmlType::Q5_0 => Some((32, 22)),
            GgmlType::Q5_1 => Some((32, 24)),
            GgmlType::Q8_0 => Some((32, 34)),
            GgmlType::MXFP4 => Some((32, 17)),
            GgmlType::Q2_K => Some((QK_K, 84)),
            GgmlType::Q3_K => Some((QK_K, 110)),
            GgmlType::Q4_K => Some((QK_K, 144)),
            GgmlType::Q5_K => Some((QK_K, 176)),
            GgmlType::Q6_K => Some((QK_K, 210)),
            GgmlType::Q8_K => Some((QK_K, 292)),
            GgmlType::Unsupported(_) => None,
        }
    }

    /// Whether [`dequantize`] decodes this type.
    pub fn is_supported(self) -> bool {
        self.block().is_some()
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// IEEE 754 half precision (1 sign, 5 exponent, 10 mantissa bits) to f32; exact for every
/// input (f32 holds every f16 value), NaN payloads kept in the top mantissa bits.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let magnitude = match exp {
        // Zero and subnormals: man · 2^-24, exact in f32.
        0 => (man as f32 * f32::powi(2.0, -24)).to_bits(),
        // Infinity and NaN.
        0x1f => 0x7f80_0000 | (man << 13),
        // Normal: rebias the exponent from 15 to 127.
        _ => ((exp + 112) << 23) | (man << 13),
    };
    f32::from_bits(sign | magnitude)
}

/// f32 to IEEE 754 half precision, rounded to nearest, ties to even (as the F16C
/// instruction `vcvtps2ph` and ggml's `GGML_FP32_TO_FP16` round): too large for f16 gives
/// infinity, too small a signed zero, NaN stays a (quiet) NaN.
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let man = bits & 0x007f_ffff;
    if exp == 0xff {
        let nan = if man != 0 {
            0x0200 | (man >> 13) as u16
        } else {
            0
        };
        return sign | 0x7c00 | nan;
    }
    // The f16 biased exponent.
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    // Rounds `value >> shift` to nearest, ties to even; a carry out of the mantissa moves
    // into the exponent (up to infinity), which is the right result.
    let round = |value: u32, shift: u32| -> u16 {
        let kept = value >> shift;
        let rest = value & ((1 << shift) - 1);
        let half = 1 << (shift - 1);
        let up = rest > half || (rest == half && kept & 1 == 1);
        (kept + u32::from(up)) as u16
    };
    if e > 0 {
        // Normal: 10 of the 23 mantissa bits.
        return sign | round(((e as u32) << 23) | man, 13);
    }
    // Subnormal (or zero) in f16: the 24-bit significand in units of 2^-24.
    let shift = (14 - e) as u32;
    if shift > 24 {
        return sign;
    }
    sign | round(man | 0x0080_0000, shift)
}

fn half_at(bytes: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([bytes[at], bytes[at + 1]]))
}

/// The unsigned 5-bit values of elements `j` and `j + 16` of a `Q5_0` / `Q5_1` block: the low
/// and high nibble of `qs[j]`, with bits `j` and `j + 16` of `qh` as their fifth bits.
pub fn five_bit_pair(qs_j: u8, qh: u32, j: usize) -> (i32, i32) {
    let lo = i32::from(qs_j & 0x0f) | (((qh >> j) & 1) << 4) as i32;
    let hi = i32::from(qs_j >> 4) | (((qh >> (j + 16)) & 1) << 4) as i32;
    (lo, hi)
}

/// Decodes one block of `ty` (`block.len()` bytes) into `out` (its elements).
fn dequantize_block(ty: GgmlType, block: &[u8], out: &mut [f32]) {
    match ty {
        GgmlType::F32 => out[0] = f32::from_le_bytes([block[0], block[1], block[2], block[3]]),
        GgmlType::F16 => out[0] = half_at(block, 0),
        GgmlType::BF16 => out[0] = bf16_to_f32(u16::from_le_bytes([block[0], block[1]])),
        GgmlType::Q4_0 => {
            let d = half_at(block, 0);
            for (j, &q) in block[2..18].iter().enumerate() {
                out[j] = ((q & 0x0f) as i32 - 8) as f32 * d;
                out[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
            }
        }
        GgmlType::Q4_1 => {
            let d = half_at(block, 0);
            let m = half_at(block, 2);
            for (j, &q) in block[4..20].iter().enumerate() {
                out[j] = (q & 0x0f) as f32 * d + m;
                out[j + 16] = (q >> 4) as f32 * d + m;
            }
        }
        GgmlType::Q5_0 => {
            let d = half_at(block, 0);
            let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
            for (j, &q) in block[6..22].iter().enumerate() {
                let (lo, hi) = five_bit_pair(q, qh, j);
                out[j] = (lo - 16) as f32 * d;
                out[j + 16] = (hi - 16) as f32 * d;
            }
        }
        GgmlType::Q5_1 => {
            let (d, m) = (half_at(block, 0), half_at(block, 2));
            let qh = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
            for (j, &q) in block[8..24].iter().enumerate() {
                let (lo, hi) = five_bit_pair(q, qh, j);
                out[j] = lo as f32 * d + m;
                out[j + 16] = hi as f32 * d + m;
            }
        }
        GgmlType::Q8_0 => {
            let d = half_at(block, 0);
            for (o, &q) in out.iter_mut().zip(&block[2..34]) {
                *o = q as i8 as f32 * d;
            }
        }
        GgmlType::IQ4_NL => levels_of_nibbles(&IQ4_NL_LEVELS, half_at(block, 0), &block[2..18], out),
        GgmlType::MXFP4 => levels_of_nibbles(&MXFP4_LEVELS, e8m0_half(block[0]), &block[1..17], out),
        GgmlType::Q2_K => kquants::dequantize_q2_k(block, out),
        GgmlType::Q3_K => kquants::dequantize_q3_k(block, out),
        GgmlType::Q4_K => kquants::dequantize_q4_k(block, out),
        GgmlType::Q5_K => kquants::dequantize_q5_k(block, out),
        GgmlType::Q6_K => kquants::dequantize_q6_k(block, out),
        GgmlType::Q8_K => kquants::dequantize_q8_k(block, out),
        GgmlType::Unsupported(_) => unreachable!("checked by dequantize"),
    }
}

/// A block of 32 elements whose nibbles (`qs [16]`: element `j` the low nibble of `qs[j]`,
/// `j + 16` the high one) select one of 16 `levels`, scaled by `d` (`IQ4_NL`, `MXFP4`).
fn levels_of_nibbles(levels: &[i8; 16], d: f32, qs: &[u8], out: &mut [f32]) {
    for (j, &q) in qs.iter().enumerate() {
        out[j] = d * f32::from(levels[usize::from(q & 0x0f)]);
        out[j + 16] = d * f32::from(levels[usize::from(q >> 4)]);
    }
}

/// The types [`dequantize`] decodes, for error messages.
pub const SUPPORTED: &str =
    "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL, MXFP4";

/// Blocks decoded per parallel task: large enough that rayon's overhead does not show.
const BLOCKS_PER_TASK: usize = 4096;

/// The `n` elements of `ty` stored in `data` as f32, or why not: an unsupported type (named),
/// `n` not a whole number of blocks, or `data` not exactly `n`'s blocks long.
pub fn dequantize(ty: GgmlType, data: &[u8], n: usize) -> Result<Vec<f32>, String> {
    check_blocks(ty, data, n)?; // before allocating
    let mut out = vec![0f32; n];
    dequantize_into(ty, data, &mut out)?;
    Ok(out)
}

/// Like [`dequantize`], into `out` (its length is the number of elements): a tensor is decoded
/// straight into the parameter that holds it, without an intermediate copy.
pub fn dequantize_into(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), String> {
    let (block_n, block_bytes) = check_blocks(ty, data, out.len())?;
    out.par_chunks_mut(block_n * BLOCKS_PER_TASK)
        .zip(data.par_chunks(block_bytes * BLOCKS_PER_TASK))
        .for_each(|(out, data)| {
            for (o, b) in out
                .chunks_exact_mut(block_n)
                .zip(data.chunks_exact(block_bytes))
            {
                dequantize_block(ty, b, o);
            }
        });
    Ok(())
}

/// `(elements, bytes)` of one block of `ty`, after checking that `data` holds exactly `n`
/// elements of it.
fn check_blocks(ty: GgmlType, data: &[u8], n: usize) -> Result<(usize, usize), String> {
    let (block_n, block_bytes) = ty.block().ok_or_else(|| {
        format!(
            "ggml type {} cannot be dequantised (supported: {SUPPORTED})",
            ty.name()
        )
    })?;
    if !n.is_multiple_of(block_n) {
        return Err(format!(
            "{n} elements of {} are not a whole number of {block_n}-element blocks",
            ty.name()
        ));
    }
    let blocks = n / block_n;
    if blocks.checked_mul(block_bytes) != Some(data.len()) {
        return Err(format!(
            "{n} elements of {} need {blocks} blocks of {block_bytes} bytes, but the data has {} bytes",
            ty.name(),
            data.len()
        ));
    }
    Ok((block_n, block_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f16 value of `h` from the IEEE 754 definition, in f64.
    fn f16_reference(h: u16) -> f64 {
        let sign = if h >> 15 == 1 { -1.0 } else { 1.0 };
        let exp = i32::from((h >> 10) & 0x1f);
        let man = f64::from(h & 0x3ff);
        match exp {
            0 => sign * man / 1024.0 * 2f64.powi(-14),
            0x1f if man == 0.0 => sign * f64::INFINITY,
            0x1f => f64::NAN,
            _ => sign * (1.0 + man / 1024.0) * 2f64.powi(exp - 15),
        }
    }

    /// MXFP4 against the OCP microscaling definition in f64: each nibble an e2m1 float (sign
    /// bit 3; exponent bits 2..1 and mantissa bit 0: `m/2` for exponent 0, else
    /// `(1 + m/2) · 2^(E − 1)`), times the block's `2^(e − 127)`; low nibbles first.
    #[test]
    fn mxfp4_blocks_decode_as_e2m1_times_e8m0() {
        for e in [0u8, 1, 2, 100, 127, 128, 131, 250] {
            let mut block = vec![e];
            block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
            let mut out = [0f32; 32];
            dequantize_block(GgmlType::MXFP4, &block, &mut out);
            for (j, &got) in out.iter().enumerate() {
                let nibble = match j < 16 {
                    true => block[1 + j] & 15,
                    false => block[1 + j - 16] >> 4,
                };
                let sign = if nibble & 8 != 0 { -1.0 } else { 1.0 };
                let (ex, m) = (i32::from((nibble >> 1) & 3), f64::from(nibble & 1));
                let v = match ex {
                    0 => m / 2.0,
                    _ => (1.0 + m / 2.0) * 2f64.powi(ex - 1),
                };
                let want = sign * v * 2f64.powi(i32::from(e) - 127);
                assert_eq!(f64::from(got), want, "e {e} element {j}");
            }
        }
        assert_eq!(GgmlType::from_code(39), GgmlType::MXFP4);
        assert_eq!((GgmlType::MXFP4.code(), GgmlType::MXFP4.block()), (39, Some((32, 17))));
    }

    #[test]
    fn every_f16_converts_exactly() {
        for h in 0..=u16::MAX {
            let (got, want) = (f16_to_f32(h), f16_reference(h));
            if want.is_nan() {
                assert!(got.is_nan(), "{h:#06x}");
            } else {
                assert_eq!(f64::from(got), want, "{h:#06x}");
                assert_eq!(got.is_sign_negative(), h >> 15 == 1, "{h:#06x} sign");
            }
        }
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
    }

    #[test]
    fn f32_to_f16_rounds_to_nearest_even() {
        // Every finite f16 comes back; midpoints go to the even neighbour, just above them up.
        for h in 0..0x7c00u16 {
            for sign in [0, 0x8000] {
                let x = f16_to_f32(h | sign);
                assert_eq!(f32_to_f16(x), h | sign, "{h:#06x}");
            }
            if h == 0x7bff {
                continue; // its upper neighbour is infinity
            }
            let (lo, hi) = (f64::from(f16_to_f32(h)), f64::from(f16_to_f32(h + 1)));
            let mid = ((lo + hi) / 2.0) as f32; // exact: 12 significant bits
            assert_eq!(f64::from(mid), (lo + hi) / 2.0);
            let even = if h % 2 == 0 { h } else { h + 1 };
            assert_eq!(f32_to_f16(mid), even, "midpoint above {h:#06x}");
            assert_eq!(f32_to_f16(f32::from_bits(mid.to_bits() + 1)), h + 1);
            assert_eq!(f32_to_f16(f32::from_bits(mid.to_bits() - 1)), h);
        }
        assert_eq!(f32_to_f16(65520.0), 0x7c00); // past the largest f16's midpoint
        assert_eq!(f32_to_f16(1.0e-9), 0);
        assert_eq!(f32_to_f16(-1.0e-9), 0x8000);
        assert_eq!(f32_to_f16(f32::INFINITY), 0x7c00);
        assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
    }

    #[test]
    fn bf16_is_the_top_half_of_f32() {
        for x in [1.0f32, -2.5, 3.0e38, 1.0e-38, 0.0, -0.0] {
            let top = (x.to_bits() >> 16) as u16;
            assert_eq!(bf16_to_f32(top).to_bits(), x.to_bits() & 0xffff_0000);
        }
    }

    #[test]
    fn nibbles_split_low_then_high() {
        // d = 1 (0x3c00), qs[j] = j | (15 - j) << 4: elements 0..15 = j - 8, 16..31 = 7 - j.
        let mut block = vec![0x00, 0x3c];
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let got = dequantize(GgmlType::Q4_0, &block, 32).unwrap();
        for j in 0..16 {
            assert_eq!(got[j], j as f32 - 8.0);
            assert_eq!(got[j + 16], 7.0 - j as f32);
        }
        // Q4_1 with d = 0.5 (0x3800), m = -1 (0xbc00): q · 0.5 - 1.
        let mut block = vec![0x00, 0x38, 0x00, 0xbc];
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let got = dequantize(GgmlType::Q4_1, &block, 32).unwrap();
        for j in 0..16 {
            assert_eq!(got[j], j as f32 * 0.5 - 1.0);
            assert_eq!(got[j + 16], (15 - j) as f32 * 0.5 - 1.0);
        }
    }

    #[test]
    fn q8_0_is_signed() {
        let mut block = vec![0x00, 0x40]; // d = 2
        block.extend((0..32).map(|j: i32| ((j - 16) * 8) as i8 as u8));
        let got = dequantize(GgmlType::Q8_0, &block, 32).unwrap();
        for (j, v) in got.iter().enumerate() {
            assert_eq!(*v, ((j as i32 - 16) * 8 * 2) as f32);
        }
    }

    #[test]
    fn sizes_and_types_are_checked() {
        let err = dequantize(GgmlType::from_code(16), &[0; 66], 256).unwrap_err();
        assert!(err.contains("IQ2_XXS"), "{err}");
        let err = dequantize(GgmlType::Unsupported(99), &[], 0).unwrap_err();
        assert!(err.contains("unknown type 99"), "{err}");
        assert!(dequantize(GgmlType::Q8_0, &[0; 34], 16).is_err());
        assert!(dequantize(GgmlType::Q8_0, &[0; 33], 32).is_err());
        assert!(dequantize(GgmlType::F32, &[0; 8], 3).is_err());
        assert_eq!(
            dequantize(GgmlType::F32, &[], 0).unwrap(),
            Vec::<f32>::new()
        );
    }
}
