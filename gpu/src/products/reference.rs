//! The tests' side: random weights in each format, and their decoding in float64 written from
//! ggml's `dequantize_row_*` (`ggml-quants.c`), loop for loop, independently of the shaders.

use super::WeightFormat;

/// A seeded xorshift stream of bytes and small values.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn byte(&mut self) -> u8 {
        (self.next() >> 56) as u8
    }

    /// A normal f16 of either sign with its exponent in `exps` (biased), any mantissa.
    pub fn half(&mut self, exps: std::ops::Range<u16>) -> u16 {
        let r = self.next();
        let exp = exps.start + (r >> 20) as u16 % (exps.end - exps.start);
        ((r >> 40) as u16 & 0x8000) | (exp << 10) | (r as u16 & 0x3ff)
    }
}

/// IEEE half precision to f64.
pub fn half(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let man = f64::from(h & 0x3ff);
    sign * match exp {
        0 => man * 2f64.powi(-24),
        31 => {
            if man == 0.0 {
                f64::INFINITY
            } else {
                f64::NAN
            }
        }
        _ => (1.0 + man / 1024.0) * 2f64.powi(exp - 15),
    }
}

fn half_at(b: &[u8], at: usize) -> f64 {
    half(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// The bytes of a random `d_out × d_in` matrix in `format`: random bytes for the quantised
/// fields (every bit pattern), normal f16 scales; floats in about [-2, 2].
pub fn random_weight(format: WeightFormat, d_in: usize, d_out: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let n = d_out * format.row_bytes(d_in);
    let mut bytes: Vec<u8> = (0..n).map(|_| rng.byte()).collect();
    // Where the f16 scales of a block sit.
    let halves: &[usize] = match format {
        WeightFormat::F32 => {
            for c in bytes.chunks_mut(4) {
                let v = (rng.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
                c.copy_from_slice(&v.to_le_bytes());
            }
            &[]
        }
        WeightFormat::F16 => &[0],
        WeightFormat::Bf16 => {
            for c in bytes.chunks_mut(2) {
                let v = (rng.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
                c.copy_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
            }
            &[]
        }
        WeightFormat::Q4_0 | WeightFormat::Q5_0 | WeightFormat::Q8_0 => &[0],
        WeightFormat::Q4_1 | WeightFormat::Q5_1 | WeightFormat::Q4K | WeightFormat::Q5K => &[0, 2],
        WeightFormat::Q6K => &[208],
    };
    let exps = if format == WeightFormat::F16 {
        10..17
    } else {
        6..13
    };
    for block in bytes.chunks_mut(format.block_bytes()) {
        for &at in halves {
            let h = rng.half(exps.clone());
            block[at..at + 2].copy_from_slice(&h.to_le_bytes());
        }
    }
    bytes
}

/// ggml's `get_scale_min_k4`.
fn scale_min_k4(j: usize, q: &[u8]) -> (f64, f64) {
    if j < 4 {
        (f64::from(q[j] & 63), f64::from(q[j + 4] & 63))
    } else {
        (
            f64::from((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)),
            f64::from((q[j + 4] >> 4) | ((q[j] >> 6) << 4)),
        )
    }
}

/// One row (`d_in` values) of `format` from its bytes, in f64.
pub fn dequantize_row(format: WeightFormat, row: &[u8], d_in: usize) -> Vec<f64> {
    let mut y = vec![0.0f64; d_in];
    let bb = format.block_bytes();
    let bv = format.block_values();
    for (i, x) in row.chunks(bb).enumerate() {
        let y = &mut y[i * bv..(i + 1) * bv];
        match format {
            WeightFormat::F32 => y[0] = f64::from(f32::from_le_bytes([x[0], x[1], x[2], x[3]])),
            WeightFormat::F16 => y[0] = half_at(x, 0),
            WeightFormat::Bf16 => {
                y[0] = f64::from(f32::from_bits(
                    u32::from(u16::from_le_bytes([x[0], x[1]])) << 16,
                ))
            }
            WeightFormat::Q4_0 => {
                let d = half_at(x, 0);
                for j in 0..16 {
                    let x0 = i32::from(x[2 + j] & 0x0F) - 8;
                    let x1 = i32::from(x[2 + j] >> 4) - 8;
                    y[j] = f64::from(x0) * d;
                    y[j + 16] = f64::from(x1) * d;
                }
            }
            WeightFormat::Q4_1 => {
                let (d, m) = (half_at(x, 0), half_at(x, 2));
                for j in 0..16 {
                    y[j] = f64::from(x[4 + j] & 0x0F) * d + m;
                    y[j + 16] = f64::from(x[4 + j] >> 4) * d + m;
                }
            }
            WeightFormat::Q5_0 | WeightFormat::Q5_1 => {
                let one = format == WeightFormat::Q5_1;
                let (d, m) = (half_at(x, 0), if one { half_at(x, 2) } else { 0.0 });
                let at = if one { 4 } else { 2 };
                let qh = u32::from_le_bytes([x[at], x[at + 1], x[at + 2], x[at + 3]]);
                let qs = &x[at + 4..at + 20];
                for j in 0..16 {
                    let xh_0 = ((qh >> j) << 4) & 0x10;
                    let xh_1 = (qh >> (j + 12)) & 0x10;
                    let x0 = (u32::from(qs[j] & 0x0F) | xh_0) as i32;
                    let x1 = (u32::from(qs[j] >> 4) | xh_1) as i32;
                    if one {
                        y[j] = f64::from(x0) * d + m;
                        y[j + 16] = f64::from(x1) * d + m;
                    } else {
                        y[j] = f64::from(x0 - 16) * d;
                        y[j + 16] = f64::from(x1 - 16) * d;
                    }
                }
            }
            WeightFormat::Q8_0 => {
                let d = half_at(x, 0);
                for j in 0..32 {
                    y[j] = f64::from(x[2 + j] as i8) * d;
                }
            }
            WeightFormat::Q4K | WeightFormat::Q5K => {
                let five = format == WeightFormat::Q5K;
                let (d, min) = (half_at(x, 0), half_at(x, 2));
                let scales = &x[4..16];
                let (qh, mut ql) = if five {
                    (&x[16..48], &x[48..176])
                } else {
                    (&x[16..16], &x[16..144])
                };
                let (mut is, mut u1, mut u2, mut out) = (0, 1u8, 2u8, 0);
                for _ in (0..256).step_by(64) {
                    let (sc, m) = scale_min_k4(is, scales);
                    let (d1, m1) = (d * sc, min * m);
                    let (sc, m) = scale_min_k4(is + 1, scales);
                    let (d2, m2) = (d * sc, min * m);
                    for l in 0..32 {
                        let h = if five && qh[l] & u1 != 0 { 16.0 } else { 0.0 };
                        y[out] = d1 * (f64::from(ql[l] & 0xF) + h) - m1;
                        out += 1;
                    }
                    for l in 0..32 {
                        let h = if five && qh[l] & u2 != 0 { 16.0 } else { 0.0 };
                        y[out] = d2 * (f64::from(ql[l] >> 4) + h) - m2;
                        out += 1;
                    }
                    ql = &ql[32..];
                    is += 2;
                    u1 = u1.wrapping_shl(2);
                    u2 = u2.wrapping_shl(2);
                }
            }
            WeightFormat::Q6K => {
                let d = half_at(x, 208);
                let (mut ql, mut qh, mut sc) = (&x[0..128], &x[128..192], &x[192..208]);
                for n in (0..256).step_by(128) {
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = i32::from((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
                        let q2 = i32::from((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                        let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                        let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                        let s = |k: usize| d * f64::from(sc[k] as i8);
                        y[n + l] = s(is) * f64::from(q1);
                        y[n + l + 32] = s(is + 2) * f64::from(q2);
                        y[n + l + 64] = s(is + 4) * f64::from(q3);
                        y[n + l + 96] = s(is + 6) * f64::from(q4);
                    }
                    ql = &ql[64..];
                    qh = &qh[32..];
                    sc = &sc[8..];
                }
            }
        }
    }
    y
}

/// The whole matrix, row after row, in f64.
pub fn dequantize(format: WeightFormat, bytes: &[u8], d_in: usize, d_out: usize) -> Vec<f64> {
    let rb = format.row_bytes(d_in);
    (0..d_out)
        .flat_map(|o| dequantize_row(format, &bytes[o * rb..(o + 1) * rb], d_in))
        .collect()
}
