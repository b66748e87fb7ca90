//! The storage formats of a key/value cache (llama.cpp's `--cache-type-k` / `--cache-type-v`
//! names and ggml's block layouts), and the quantisation of one cached row into them:
//!
//! | type | values a block | bytes a block | block | value `j` |
//! |---|---|---|---|---|
//! | `f32` | 1 | 4 | the float itself (the exact default) | `x` |
//! | `f16` | 1 | 2 | IEEE half, round to nearest even | `x` |
//! | `bf16` | 1 | 2 | bfloat16, round to nearest even | `x` |
//! | `q8_0` | 32 | 34 | `d: f16, qs: [i8; 32]` | `qs[j] · d` |
//! | `q4_0` | 32 | 18 | `d: f16, qs: [u8; 16]` | `((qs[j mod 16] >> 4⌊j/16⌋) & 15 − 8) · d` |
//!
//! Quantisation follows ggml's reference (`quantize_row_q8_0_ref`, `quantize_row_q4_0_ref`):
//! `q8_0`: `d = max|x| / 127`, `qs[j] = round(x_j / d)`; `q4_0`: `m` the value of largest
//! magnitude (its sign kept), `d = m / −8`, `qs = min(15, ⌊x_j / d + 8.5⌋)`; the scale is then
//! stored as f16. So a value comes back within `d/2` (q8_0: `max|x|/254`; q4_0: `|m|/16`,
//! but `|m|/8` for a value of the other sign near `−m`, clipped from 16 to 15) plus the f16
//! rounding of `d` times `|qs|`.
//!
//! A cached row of `d_kv` values is `d_kv / values a block` blocks one after the other; a head
//! of `d_head` values (a multiple of 32 for the quantised types) is whole blocks of its row.

use super::lowp::ggml::{f16_to_f32, f32_to_f16};
use super::lowp::{bf16_to_f32, f32_to_bf16};
use std::fmt;

/// A key/value cache storage type (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvType {
    /// The model's own float type, exact.
    #[default]
    F32,
    F16,
    Bf16,
    Q8_0,
    Q4_0,
}

impl KvType {
    /// Every type, in the order of the module table.
    pub const ALL: [KvType; 5] = [
        KvType::F32,
        KvType::F16,
        KvType::Bf16,
        KvType::Q8_0,
        KvType::Q4_0,
    ];

    /// llama.cpp's name (`-ctk` / `-ctv`).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Bf16 => "bf16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }

    /// The type named `name` (llama.cpp's spelling, any case), if it is one of ours.
    pub fn parse(name: &str) -> Option<KvType> {
        KvType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Values in one block.
    pub fn block_values(self) -> usize {
        match self {
            KvType::Q8_0 | KvType::Q4_0 => 32,
            _ => 1,
        }
    }

    /// Bytes of one block.
    pub fn block_bytes(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::F16 | KvType::Bf16 => 2,
            KvType::Q8_0 => 34,
            KvType::Q4_0 => 18,
        }
    }

    /// Bytes of a row of `d` values, `None` unless `d` is whole blocks.
    pub fn row_bytes(self, d: usize) -> Option<usize> {
        d.is_multiple_of(self.block_values())
            .then(|| d / self.block_values() * self.block_bytes())
    }

    /// Bytes per value (`f32`: those of the model's float).
    pub fn bytes_per_value(self, float_bytes: usize) -> f64 {
        match self {
            KvType::F32 => float_bytes as f64,
            t => t.block_bytes() as f64 / t.block_values() as f64,
        }
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Cached rows in a packed type: `[rows, row_bytes]`, each row `d / block_values` blocks.
#[derive(Clone, Copy, Debug)]
pub struct PackedRows<'a> {
    pub ty: KvType,
    pub bytes: &'a [u8],
    pub row_bytes: usize,
    /// `Some(n)`: each run of `n` values was rotated by `R_n` before packing
    /// (`super::hadamard`); readers rotate queries, values or sums to match.
    pub rotation: Option<usize>,
}

impl<'a> PackedRows<'a> {
    /// The bytes of values `at .. at + d` of stored row `r` (whole blocks).
    #[inline(always)]
    pub fn head(&self, r: u32, at: usize, d: usize) -> &'a [u8] {
        let (bv, bb) = (self.ty.block_values(), self.ty.block_bytes());
        let start = r as usize * self.row_bytes + at / bv * bb;
        &self.bytes[start..start + d / bv * bb]
    }
}

/// Where an attention call's keys (or values) are: floats of the model's type, or packed.
#[derive(Clone, Copy, Debug)]
pub enum KvSlice<'a, T> {
    /// `[rows, d_kv]`.
    Float(&'a [T]),
    /// `[rows, row_bytes]` (see [`PackedRows`]).
    Packed(PackedRows<'a>),
}

impl<'a, T> KvSlice<'a, T> {
    /// The floats, when not packed.
    pub fn as_float(&self) -> Option<&'a [T]> {
        match *self {
            KvSlice::Float(x) => Some(x),
            KvSlice::Packed(_) => None,
        }
    }
}

impl<'a, T> From<&'a [T]> for KvSlice<'a, T> {
    fn from(x: &'a [T]) -> Self {
        KvSlice::Float(x)
    }
}

impl<'a, T> From<&'a Vec<T>> for KvSlice<'a, T> {
    fn from(x: &'a Vec<T>) -> Self {
        KvSlice::Float(x)
    }
}

/// ggml's `roundf` (half away from zero).
fn round_half_away(x: f32) -> f32 {
    x.round()
}

/// Packs the row `x` (whole blocks of `ty`) into `out` (`ty.row_bytes(x.len())` bytes).
///
/// # Panics
/// When `x` is not whole blocks or `out` has another length.
pub fn quantise_row(ty: KvType, x: &[f32], out: &mut [u8]) {
    let n = ty
        .row_bytes(x.len())
        .unwrap_or_else(|| panic!("{} values are not whole {ty} blocks", x.len()));
    assert_eq!(out.len(), n, "{ty} row of {} values", x.len());
    match ty {
        KvType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        KvType::F16 => {
            for (o, &v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&f32_to_f16(v).to_le_bytes());
            }
        }
        KvType::Bf16 => {
            for (o, &v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&f32_to_bf16(v).to_le_bytes());
            }
        }
        KvType::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(34).zip(x.chunks_exact(32)) {
                let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                o[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
                for (q, &v) in o[2..].iter_mut().zip(b) {
                    *q = round_half_away(v * id) as i8 as u8;
                }
            }
        }
        KvType::Q4_0 => {
            for (o, b) in out.chunks_exact_mut(18).zip(x.chunks_exact(32)) {
                // The value of largest magnitude, sign kept (the first of equals).
                let (mut amax, mut max) = (0f32, 0f32);
                for &v in b {
                    if amax < v.abs() {
                        (amax, max) = (v.abs(), v);
                    }
                }
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                o[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
                let q = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
                for j in 0..16 {
                    o[2 + j] = q(b[j]) | (q(b[j + 16]) << 4);
                }
            }
        }
    }
}

/// Unpacks the row `bytes` (whole blocks of `ty`) into `out`.
///
/// # Panics
/// When `bytes` is not `ty.row_bytes(out.len())` long.
pub fn dequantise_row(ty: KvType, bytes: &[u8], out: &mut [f32]) {
    assert_eq!(
        Some(bytes.len()),
        ty.row_bytes(out.len()),
        "{ty} row of {} values",
        out.len()
    );
    let half = |b: &[u8]| u16::from_le_bytes([b[0], b[1]]);
    match ty {
        KvType::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        KvType::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16_to_f32(half(b));
            }
        }
        KvType::Bf16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16_to_f32(half(b));
            }
        }
        KvType::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(32).zip(bytes.chunks_exact(34)) {
                let d = f16_to_f32(half(b));
                for (x, &q) in o.iter_mut().zip(&b[2..]) {
                    *x = f32::from(q as i8) * d;
                }
            }
        }
        KvType::Q4_0 => {
            for (o, b) in out.chunks_exact_mut(32).zip(bytes.chunks_exact(18)) {
                let d = f16_to_f32(half(b));
                for j in 0..16 {
                    o[j] = (f32::from(b[2 + j] & 15) - 8.0) * d;
                    o[j + 16] = (f32::from(b[2 + j] >> 4) - 8.0) * d;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// Each type's round trip against a float64 loop over the same blocks: the error of every
    /// value within the type's bound (module docs), and the packed sizes.
    #[test]
    fn round_trips_within_each_types_bound() {
        let mut rng = Rng::new(7);
        let n = 32 * 40;
        // Blocks of very different magnitudes, some all zero, one of a single spike.
        let mut x: Vec<f32> = (0..n)
            .map(|i| {
                let scale = [1e-3, 0.5, 3.0, 40.0][i / 32 % 4];
                (rng.uniform_range(-1.0, 1.0) * scale) as f32
            })
            .collect();
        x[64..96].fill(0.0);
        x[96..128].fill(0.0);
        x[100] = -7.5;
        for ty in KvType::ALL {
            let mut packed = vec![0u8; ty.row_bytes(n).unwrap()];
            quantise_row(ty, &x, &mut packed);
            let mut back = vec![0f32; n];
            dequantise_row(ty, &packed, &mut back);
            assert_eq!(
                packed.len() as f64,
                n as f64 * ty.bytes_per_value(4),
                "{ty}"
            );
            for (blk, (xs, ys)) in x.chunks(32).zip(back.chunks(32)).enumerate() {
                let amax = xs.iter().fold(0f64, |m, &v| m.max((v as f64).abs()));
                for (&a, &b) in xs.iter().zip(ys) {
                    let (a, b) = (a as f64, b as f64);
                    let bound = match ty {
                        KvType::F32 => 0.0,
                        KvType::F16 => a.abs() * 2f64.powi(-11) + 2f64.powi(-25),
                        KvType::Bf16 => a.abs() * 2f64.powi(-8),
                        // d/2 plus the f16 rounding of d (2^-11 relative, or half the
                        // subnormal step 2^-25 for a tiny d) times |q| ≤ 127.
                        KvType::Q8_0 => amax / 254.0 + amax * 2f64.powi(-11) + 127.0 * 2f64.powi(-25),
                        // |d| = amax/8 (d/2, except at the clipped end: x/d = 8 becomes
                        // 7), plus f16 rounding of d times |q − 8| ≤ 8.
                        KvType::Q4_0 => amax / 8.0 + amax * 2f64.powi(-11) + 8.0 * 2f64.powi(-25),
                    };
                    assert!((a - b).abs() <= bound, "{ty} block {blk}: {a} -> {b}");
                }
            }
        }
    }

    /// The exact bytes of ggml's reference quantisation for hand-computed blocks.
    #[test]
    fn blocks_match_ggml_reference_bytes() {
        // q8_0: max 127 → d = 1, qs = x rounded half away from zero.
        let mut x = [0f32; 32];
        x[0] = 127.0;
        x[1] = -2.5;
        x[2] = 0.49;
        let mut b = [0u8; 34];
        quantise_row(KvType::Q8_0, &x, &mut b);
        assert_eq!(u16::from_le_bytes([b[0], b[1]]), 0x3c00); // 1.0 in f16
        assert_eq!((b[2] as i8, b[3] as i8, b[4] as i8), (127, -3, 0));
        // q4_0: largest magnitude −8 → d = 1; x = 7 → 15, −8 → 0, 0.4 → 8, value 16 high nibble.
        let mut x = [0f32; 32];
        x[0] = -8.0;
        x[1] = 7.0;
        x[2] = 0.4;
        x[16] = 3.0;
        let mut b = [0u8; 18];
        quantise_row(KvType::Q4_0, &x, &mut b);
        assert_eq!(u16::from_le_bytes([b[0], b[1]]), 0x3c00);
        assert_eq!(b[2], 11 << 4);
        assert_eq!((b[3], b[4]), (8 << 4 | 15, 8 << 4 | 8));
    }

    #[test]
    fn names_parse_back() {
        for ty in KvType::ALL {
            assert_eq!(KvType::parse(ty.name()), Some(ty));
        }
        assert_eq!(KvType::parse("Q8_0"), Some(KvType::Q8_0));
        assert_eq!(KvType::parse("q4_1"), None);
        assert_eq!(KvType::Q4_0.row_bytes(64), Some(36));
        assert_eq!(KvType::Q8_0.row_bytes(48), None);
    }
}
