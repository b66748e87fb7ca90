//! The K-quants, `Q5_0`, `Q5_1`, `IQ4_NL` and `MXFP4`: dequantisation against a port of ggml's C
//! (`ggml-quants.c`, written here from the C, pointer walks and all) bit for bit, on random
//! blocks and on every tensor of the `../shared/reference/kquants` files; `Q8_K` activations
//! against a port of `quantize_row_q8_K_ref`; the block products of [`KQuantMatrix`] against
//! float64 loops over the dequantised weights and the dequantised activations.

use super::ggml::{dequantize, GgmlType};
use super::tests::Lcg;
use super::*;
use crate::store::gguf::GgufFile;
use std::path::{Path, PathBuf};

/// ggml's C, ported line by line: `const float d = GGML_FP16_TO_FP32(x[i].d)` and so on, the
/// float expressions in C's left-to-right order.
mod ggml_c {
    /// IEEE half precision from its definition (exact in f32).
    pub fn fp16(b: &[u8], at: usize) -> f32 {
        let h = u16::from_le_bytes([b[at], b[at + 1]]);
        let sign = if h >> 15 == 1 { -1.0 } else { 1.0 };
        let (e, m) = (i32::from((h >> 10) & 0x1f), f64::from(h & 0x3ff));
        (match e {
            0 => sign * m / 1024.0 * 2f64.powi(-14),
            31 if m == 0.0 => sign * f64::INFINITY,
            31 => f64::NAN,
            _ => sign * (1.0 + m / 1024.0) * 2f64.powi(e - 15),
        }) as f32
    }

    fn u32_le(b: &[u8]) -> u32 {
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    /// `get_scale_min_k4`.
    fn get_scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
        if j < 4 {
            (q[j] & 63, q[j + 4] & 63)
        } else {
            (
                (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
                (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
            )
        }
    }

    pub fn dequantize_row_q2_k(x: &[u8], y: &mut Vec<f32>) {
        for b in x.chunks_exact(84) {
            let (scales, qs) = (&b[0..16], &b[16..80]);
            let (d, min) = (fp16(b, 80), fp16(b, 82));
            let (mut q, mut is) = (0, 0);
            for _n in 0..2 {
                let mut shift = 0;
                for _j in 0..4 {
                    let sc = scales[is];
                    is += 1;
                    let (dl, ml) = (d * f32::from(sc & 0xF), min * f32::from(sc >> 4));
                    for l in 0..16 {
                        y.push(dl * f32::from(((qs[q + l] >> shift) & 3) as i8) - ml);
                    }
                    let sc = scales[is];
                    is += 1;
                    let (dl, ml) = (d * f32::from(sc & 0xF), min * f32::from(sc >> 4));
                    for l in 0..16 {
                        y.push(dl * f32::from(((qs[q + l + 16] >> shift) & 3) as i8) - ml);
                    }
                    shift += 2;
                }
                q += 32;
            }
        }
    }

    pub fn dequantize_row_q3_k(x: &[u8], y: &mut Vec<f32>) {
        let (kmask1, kmask2) = (0x03030303u32, 0x0f0f0f0fu32);
        for b in x.chunks_exact(110) {
            let (hm, qs, sc12) = (&b[0..32], &b[32..96], &b[96..108]);
            let d_all = fp16(b, 108);
            let mut aux = [
                u32_le(&sc12[0..]),
                u32_le(&sc12[4..]),
                u32_le(&sc12[8..]),
                0,
            ];
            let tmp = aux[2];
            aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
            aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
            aux[0] = (aux[0] & kmask2) | ((tmp & kmask1) << 4);
            aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
            let scales: Vec<i8> = aux
                .iter()
                .flat_map(|a| a.to_le_bytes())
                .map(|v| v as i8)
                .collect();
            let (mut q, mut is, mut m) = (0, 0, 1u8);
            for _n in 0..2 {
                let mut shift = 0;
                for _j in 0..4 {
                    for half in 0..2 {
                        let dl = d_all * (i32::from(scales[is]) - 32) as f32;
                        is += 1;
                        for l in 16 * half..16 * half + 16 {
                            let low = ((qs[q + l] >> shift) & 3) as i8;
                            let v = i32::from(low) - if hm[l] & m != 0 { 0 } else { 4 };
                            y.push(dl * v as f32);
                        }
                    }
                    shift += 2;
                    m = m.wrapping_shl(1);
                }
                q += 32;
            }
        }
    }

    pub fn dequantize_row_q4_k(x: &[u8], y: &mut Vec<f32>) {
        for b in x.chunks_exact(144) {
            let (d, min) = (fp16(b, 0), fp16(b, 2));
            let (scales, qs) = (&b[4..16], &b[16..144]);
            let (mut q, mut is) = (0, 0);
            for _j in 0..4 {
                let (sc, m) = get_scale_min_k4(is, scales);
                let (d1, m1) = (d * f32::from(sc), min * f32::from(m));
                let (sc, m) = get_scale_min_k4(is + 1, scales);
                let (d2, m2) = (d * f32::from(sc), min * f32::from(m));
                for l in 0..32 {
                    y.push(d1 * f32::from(qs[q + l] & 0xF) - m1);
                }
                for l in 0..32 {
                    y.push(d2 * f32::from(qs[q + l] >> 4) - m2);
                }
                q += 32;
                is += 2;
            }
        }
    }

    pub fn dequantize_row_q5_k(x: &[u8], y: &mut Vec<f32>) {
        for b in x.chunks_exact(176) {
            let (d, min) = (fp16(b, 0), fp16(b, 2));
            let (scales, qh, ql) = (&b[4..16], &b[16..48], &b[48..176]);
            let (mut q, mut is, mut u1, mut u2) = (0, 0, 1u8, 2u8);
            for _j in 0..4 {
                let (sc, m) = get_scale_min_k4(is, scales);
                let (d1, m1) = (d * f32::from(sc), min * f32::from(m));
                let (sc, m) = get_scale_min_k4(is + 1, scales);
                let (d2, m2) = (d * f32::from(sc), min * f32::from(m));
                for l in 0..32 {
                    let v = (ql[q + l] & 0xF) + if qh[l] & u1 != 0 { 16 } else { 0 };
                    y.push(d1 * f32::from(v) - m1);
                }
                for l in 0..32 {
                    let v = (ql[q + l] >> 4) + if qh[l] & u2 != 0 { 16 } else { 0 };
                    y.push(d2 * f32::from(v) - m2);
                }
                q += 32;
                is += 2;
                u1 = u1.wrapping_shl(2);
                u2 = u2.wrapping_shl(2);
            }
        }
    }

    pub fn dequantize_row_q6_k(x: &[u8], y: &mut Vec<f32>) {
        for b in x.chunks_exact(210) {
            let d = fp16(b, 208);
            let mut out = [0f32; 256];
            for n in 0..2 {
                let (ql, qh, sc) = (&b[64 * n..], &b[128 + 32 * n..], &b[192 + 8 * n..]);
                let yy = &mut out[128 * n..];
                for l in 0..32 {
                    let is = l / 16;
                    let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
                    let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                    let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                    let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
                    yy[l] = d * f32::from(sc[is] as i8) * f32::from(q1);
                    yy[l + 32] = d * f32::from(sc[is + 2] as i8) * f32::from(q2);
                    yy[l + 64] = d * f32::from(sc[is + 4] as i8) * f32::from(q3);
                    yy[l + 96] = d * f32::from(sc[is + 6] as i8) * f32::from(q4);
                }
            }
            y.extend_from_slice(&out);
        }
    }

    pub fn dequantize_row_q5(x: &[u8], y: &mut Vec<f32>, with_min: bool) {
        let size = if with_min { 24 } else { 22 };
        for b in x.chunks_exact(size) {
            let d = fp16(b, 0);
            let m = if with_min { fp16(b, 2) } else { 0.0 };
            let at = if with_min { 4 } else { 2 };
            let qh = u32_le(&b[at..]);
            let qs = &b[at + 4..at + 20];
            let mut out = [0f32; 32];
            for j in 0..16 {
                let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
                let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
                if with_min {
                    let x0 = i32::from((qs[j] & 0x0F) | xh_0);
                    let x1 = i32::from((qs[j] >> 4) | xh_1);
                    out[j] = x0 as f32 * d + m;
                    out[j + 16] = x1 as f32 * d + m;
                } else {
                    let x0 = i32::from((qs[j] & 0x0F) | xh_0) - 16;
                    let x1 = i32::from((qs[j] >> 4) | xh_1) - 16;
                    out[j] = x0 as f32 * d;
                    out[j + 16] = x1 as f32 * d;
                }
            }
            y.extend_from_slice(&out);
        }
    }

    pub fn dequantize_row_iq4_nl(x: &[u8], y: &mut Vec<f32>) {
        const KVALUES: [i8; 16] = [
            -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
        ];
        for b in x.chunks_exact(18) {
            let d = fp16(b, 0);
            let mut out = [0f32; 32];
            for j in 0..16 {
                out[j] = d * f32::from(KVALUES[usize::from(b[2 + j] & 0xf)]);
                out[j + 16] = d * f32::from(KVALUES[usize::from(b[2 + j] >> 4)]);
            }
            y.extend_from_slice(&out);
        }
    }

    /// `ggml_e8m0_to_fp32_half` (`ggml-impl.h`).
    fn e8m0_to_fp32_half(x: u8) -> f32 {
        let bits: u32 = if x < 2 { 0x0020_0000 << x } else { u32::from(x - 1) << 23 };
        f32::from_bits(bits)
    }

    pub fn dequantize_row_mxfp4(x: &[u8], y: &mut Vec<f32>) {
        const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];
        for b in x.chunks_exact(17) {
            let d = e8m0_to_fp32_half(b[0]);
            let mut out = [0f32; 32];
            for j in 0..16 {
                out[j] = f32::from(KVALUES[usize::from(b[1 + j] & 0x0f)]) * d;
                out[j + 16] = f32::from(KVALUES[usize::from(b[1 + j] >> 4)]) * d;
            }
            y.extend_from_slice(&out);
        }
    }

    /// `nearest_int`: the float's bits after adding 1.5 · 2^23.
    fn nearest_int(fval: f32) -> i32 {
        let val = fval + 12582912.0;
        (val.to_bits() & 0x007fffff) as i32 - 0x00400000
    }

    /// `quantize_row_q8_K_ref`: per block `(d, qs, bsums)`.
    pub fn quantize_row_q8_k(x: &[f32]) -> Vec<(f32, Vec<i8>, Vec<i32>)> {
        x.chunks_exact(256)
            .map(|x| {
                let (mut max, mut amax) = (0f32, 0f32);
                for &v in x {
                    if v.abs() > amax {
                        amax = v.abs();
                        max = v;
                    }
                }
                if amax == 0.0 {
                    return (0.0, vec![0; 256], vec![0; 16]);
                }
                let iscale = -127.0 / max;
                let qs: Vec<i8> = x
                    .iter()
                    .map(|&v| nearest_int(iscale * v).min(127) as i8)
                    .collect();
                let bsums = qs
                    .chunks(16)
                    .map(|g| g.iter().map(|&q| i32::from(q)).sum())
                    .collect();
                (1.0 / iscale, qs, bsums)
            })
            .collect()
    }

    /// The ported `dequantize_row_*` of `ty`, or `None` for a type not ported here.
    pub fn dequantize(ty: super::GgmlType, x: &[u8]) -> Option<Vec<f32>> {
        use super::GgmlType::*;
        let mut y = Vec::new();
        match ty {
            Q2_K => dequantize_row_q2_k(x, &mut y),
            Q3_K => dequantize_row_q3_k(x, &mut y),
            Q4_K => dequantize_row_q4_k(x, &mut y),
            Q5_K => dequantize_row_q5_k(x, &mut y),
            Q6_K => dequantize_row_q6_k(x, &mut y),
            Q5_0 => dequantize_row_q5(x, &mut y, false),
            Q5_1 => dequantize_row_q5(x, &mut y, true),
            IQ4_NL => dequantize_row_iq4_nl(x, &mut y),
            MXFP4 => dequantize_row_mxfp4(x, &mut y),
            _ => return None,
        }
        Some(y)
    }

    /// `|dmin · m|` of each element (the minimum term a weight subtracts; `|m|` of Q5_1).
    pub fn minimum_terms(ty: super::GgmlType, x: &[u8]) -> Vec<f64> {
        use super::GgmlType::*;
        let mut out = Vec::new();
        let (_, size) = ty.block().unwrap();
        for b in x.chunks_exact(size) {
            match ty {
                Q2_K => {
                    let dmin = f64::from(fp16(b, 82));
                    for e in 0..256 {
                        let sc = b[(e / 128) * 8 + ((e % 128) / 32) * 2 + (e % 32) / 16];
                        out.push((dmin * f64::from(sc >> 4)).abs());
                    }
                }
                Q4_K | Q5_K => {
                    let dmin = f64::from(fp16(b, 2));
                    for e in 0..256 {
                        let (_, m) = get_scale_min_k4(e / 32, &b[4..16]);
                        out.push((dmin * f64::from(m)).abs());
                    }
                }
                Q5_1 => out.extend([f64::from(fp16(b, 2)).abs(); 32]),
                _ => out.extend(vec![0.0; ty.block().unwrap().0]),
            }
        }
        out
    }
}

const TYPES: [GgmlType; 9] = [
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::IQ4_NL,
    GgmlType::MXFP4,
];

/// Offsets of the f16 scales in a block of `ty`.
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q5_1 => &[0, 2],
        GgmlType::Q6_K => &[208],
        // MXFP4's one-byte e8m0 scale: see random_blocks.
        GgmlType::MXFP4 => &[],
        _ => &[0],
    }
}

/// `n_blocks` random blocks of `ty`: random bytes, with normal f16 scales of either sign and
/// exponent 2^-8 .. 2^-3 (finite products, every bit pattern of the quants and sub-scales).
fn random_blocks(rng: &mut Lcg, ty: GgmlType, n_blocks: usize) -> Vec<u8> {
    let (_, size) = ty.block().unwrap();
    let mut data: Vec<u8> = (0..n_blocks * size).map(|_| rng.next() as u8).collect();
    for block in data.chunks_exact_mut(size) {
        for &at in scale_offsets(ty) {
            let h = ((rng.next() % 2) << 15) | ((7 + rng.next() % 6) << 10) | (rng.next() % 1024);
            block[at..at + 2].copy_from_slice(&(h as u16).to_le_bytes());
        }
        if ty == GgmlType::MXFP4 {
            // 2^-9 .. 2^6: finite products
            block[0] = 119 + (rng.next() % 16) as u8;
        }
    }
    data
}

fn assert_bits_equal(ty: GgmlType, what: &str, ours: &[f32], theirs: &[f32]) {
    assert_eq!(ours.len(), theirs.len(), "{ty} {what}");
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        assert!(
            a.to_bits() == b.to_bits(),
            "{ty} {what}: element {i}: ours {a}, ggml {b}"
        );
    }
}

#[test]
fn dequantisation_is_ggmls_bit_for_bit_on_random_blocks() {
    let mut rng = Lcg(5);
    for ty in TYPES {
        let data = random_blocks(&mut rng, ty, 64);
        let n = 64 * ty.block().unwrap().0;
        let ours = dequantize(ty, &data, n).unwrap();
        let theirs = ggml_c::dequantize(ty, &data).unwrap();
        assert_bits_equal(ty, "random blocks", &ours, &theirs);
        // Not all zero or all alike: the blocks exercise the formulas.
        let distinct: std::collections::BTreeSet<u32> = ours.iter().map(|v| v.to_bits()).collect();
        // (MXFP4's values are ±{1, 3} · 2^k: a few dozen over its 16 scales)
        let enough = if ty == GgmlType::MXFP4 { 48 } else { n / 8 };
        assert!(
            distinct.len() > enough,
            "{ty}: {} distinct values",
            distinct.len()
        );
    }
}

/// The `../shared/reference/kquants` GGUF files, or `None` (with the reason printed).
fn kquant_files() -> Option<Vec<PathBuf>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/kquants");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!("skipped: {} is absent", dir.display());
        return None;
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    files.sort();
    Some(files)
}

#[test]
fn dequantisation_is_ggmls_bit_for_bit_on_real_tensors() {
    let Some(files) = kquant_files() else { return };
    let mut seen = std::collections::BTreeSet::new();
    for path in files {
        let file = GgufFile::open(&path).unwrap();
        for info in file.tensors() {
            let data = file.tensor_data(info).unwrap();
            let Some(theirs) = ggml_c::dequantize(info.ggml_type, data) else {
                continue;
            };
            let ours = file.dequantize_info(info).unwrap();
            let what = format!("{} of {}", info.name, path.display());
            assert_bits_equal(info.ggml_type, &what, &ours, &theirs);
            seen.insert(info.ggml_type.name());
        }
    }
    eprintln!("real tensors checked of types {seen:?}");
    for ty in ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1"] {
        assert!(seen.contains(ty), "no {ty} tensor in the kquants files");
    }
}

#[test]
fn q8_k_activations_are_ggmls() {
    let mut rng = Lcg(9);
    let cols = 512;
    let w = KQuantMatrix::from_ggml(
        GgmlType::Q4_K,
        RawBytes::owned(random_blocks(&mut rng, GgmlType::Q4_K, 2)),
        1,
        cols,
    )
    .unwrap();
    // Large positive and negative maxima, a block of zeros, ties (integers times 1/127-steps).
    let mut x: Vec<f32> = (0..cols).map(|_| (rng.unit() * 3.0) as f32).collect();
    x[3] = -7.5;
    x[300] = 9.0;
    let mut rows = x.clone();
    rows.extend(vec![0f32; cols]);
    rows.extend((0..cols).map(|j| (j % 255) as f32 - 127.0));
    let acts = w.quantize(&rows, 3);
    for r in 0..3 {
        let theirs = ggml_c::quantize_row_q8_k(&rows[r * cols..(r + 1) * cols]);
        for (b, (d, qs, bsums)) in theirs.iter().enumerate() {
            assert_eq!(
                acts.e[r * 2 + b].to_bits(),
                d.to_bits(),
                "row {r} block {b}"
            );
            assert_eq!(
                &acts.q[r * cols + 256 * b..r * cols + 256 * (b + 1)],
                &qs[..]
            );
            assert_eq!(
                &acts.bsums[r * 32 + 16 * b..r * 32 + 16 * (b + 1)],
                &bsums[..]
            );
        }
    }
}

/// (d_out, cols, rows): one output and one row, rows past a tile of 4, outputs past a task of
/// 16, cols of one and two super-blocks (and of 3 and 18 blocks of 32 for the small types).
const SHAPES: &[(usize, usize, usize)] = &[
    (1, 256, 1),
    (17, 256, 3),
    (5, 512, 7),
    (33, 512, 5),
    (3, 768, 9),
];

#[test]
fn block_products_match_float64() {
    let mut rng = Lcg(23);
    for ty in TYPES {
        let block = ty.block().unwrap().0;
        let mut shapes = SHAPES.to_vec();
        if block == 32 {
            // Fewer blocks than a group of eight (Q5_0, Q5_1 regroup by eight), and two groups
            // then two blocks as stored (SmolLM2's 576).
            shapes.extend([(4, 96, 2), (3, 576, 2)]);
        }
        for (d_out, cols, rows) in shapes {
            let data = random_blocks(&mut rng, ty, d_out * cols / block);
            let w = dequantize(ty, &data, d_out * cols).unwrap();
            let minimum = ggml_c::minimum_terms(ty, &data);
            let q5_1_min: Vec<f64> = match ty {
                GgmlType::Q5_1 => data
                    .chunks_exact(24)
                    .map(|b| f64::from(ggml_c::fp16(b, 2)))
                    .collect(),
                _ => vec![],
            };
            let packed = pack_ggml(ty, RawBytes::owned(data), d_out, cols)
                .unwrap()
                .unwrap();
            let PackedWeight::KQuants(matrix) = &packed else {
                panic!("{ty} packed as {packed:?}");
            };
            let x: Vec<f32> = (0..rows * cols)
                .map(|_| (rng.unit() * 2.0) as f32)
                .collect();
            let acts = matrix.quantize(&x, rows);
            let mut y = vec![f32::NAN; rows * d_out];
            packed.product_with(Kernel::Portable, &mut y, &x, rows);
            // The SIMD kernels (AVX2 for every type, AVX-512 for the K-quants, where the CPU
            // has them) sum the same integers and apply the same f32 steps: bit for bit the
            // portable result.
            for kernel in [Kernel::Avx2, Kernel::Avx512] {
                if !packed.runs(kernel) {
                    eprintln!("{ty}: no {kernel:?} kernel on this CPU");
                    continue;
                }
                let mut simd = vec![f32::NAN; rows * d_out];
                packed.product_with(kernel, &mut simd, &x, rows);
                for (i, (a, b)) in simd.iter().zip(&y).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{ty} {kernel:?} y[{i}]: {a} vs {b}"
                    );
                }
            }
            for r in 0..rows {
                let xq = acts.values(r);
                // The activations are x to within half a step (and the f16 rounding of e).
                for (j, (&a, &b)) in xq.iter().zip(&x[r * cols..]).enumerate() {
                    let e = f64::from(acts.e[r * (cols / block) + j / block]).abs();
                    let bound = e * 0.5 * (1.0 + 1e-6) + f64::from(b).abs() * 1e-3;
                    assert!((a - f64::from(b)).abs() <= bound, "{ty} x[{r},{j}]");
                }
                let s = acts.block_sums(r);
                for o in 0..d_out {
                    let wo = &w[o * cols..(o + 1) * cols];
                    let mut want: f64 = wo.iter().zip(&xq).map(|(&a, &b)| f64::from(a) * b).sum();
                    // Q5_1: llama.cpp's m · s where s is e Σ p rounded to f16.
                    for (b, &sb) in s.iter().enumerate() {
                        let exact: f64 = xq[b * 32..(b + 1) * 32].iter().sum();
                        want += q5_1_min[o * (cols / 32) + b] * (f64::from(sb) - exact);
                    }
                    let magnitude: f64 = wo
                        .iter()
                        .zip(&xq)
                        .zip(&minimum[o * cols..(o + 1) * cols])
                        .map(|((&a, &b), &m)| (f64::from(a).abs() + 2.0 * m) * b.abs())
                        .sum();
                    let nb = (cols / block) as f64;
                    let tol = (nb + 8.0) * f64::from(f32::EPSILON) * magnitude + 1e-30;
                    let got = f64::from(y[r * d_out + o]);
                    assert!(
                        (got - want).abs() <= tol,
                        "{ty} {d_out}x{cols} rows {rows}: y[{r},{o}] = {got}, float64 {want} \
                         (tolerance {tol})"
                    );
                }
            }
        }
    }
}

/// Every SIMD kernel gives the portable kernel's bits on every shape class (rows 1–5 and 17;
/// 32-blocks: 32 to 768 columns, super-blocks: 256, 512, 768; 1, 3, 16, 17, 70 outputs).
#[test]
fn kernels_agree_bit_for_bit_on_every_shape() {
    use super::tests::{simd_kernels, KERNEL_COLS, KERNEL_OUTS, KERNEL_ROWS};
    let mut rng = Lcg(37);
    for ty in TYPES {
        let block = ty.block().unwrap().0;
        for &cols in KERNEL_COLS.iter().filter(|&&c| c % block == 0) {
            for &d_out in KERNEL_OUTS {
                let data = random_blocks(&mut rng, ty, d_out * cols / block);
                let packed = pack_ggml(ty, RawBytes::owned(data), d_out, cols)
                    .unwrap()
                    .unwrap();
                for &rows in KERNEL_ROWS {
                    let x: Vec<f32> = (0..rows * cols)
                        .map(|_| (rng.unit() * 3.0) as f32)
                        .collect();
                    let label = format!("{ty} {d_out}x{cols} rows {rows}");
                    let mut want = vec![f32::NAN; rows * d_out];
                    packed.product_with(Kernel::Portable, &mut want, &x, rows);
                    assert!(want.iter().all(|v| v.is_finite()), "{label}");
                    for kernel in simd_kernels(&packed, &label) {
                        let mut got = vec![f32::NAN; rows * d_out];
                        packed.product_with(kernel, &mut got, &x, rows);
                        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                            assert_eq!(a.to_bits(), b.to_bits(), "{label} {kernel:?} y[{i}]");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn wrong_types_and_sizes_are_refused() {
    let bytes = |n| RawBytes::owned(vec![0u8; n]);
    let err = KQuantMatrix::from_ggml(GgmlType::Q4_0, bytes(18), 1, 32).unwrap_err();
    assert!(err.contains("Q4_0"), "{err}");
    let err = KQuantMatrix::from_ggml(GgmlType::Q4_K, bytes(144), 1, 128).unwrap_err();
    assert!(err.contains("128") && err.contains("Q4_K"), "{err}");
    let err = KQuantMatrix::from_ggml(GgmlType::Q6_K, bytes(209), 1, 256).unwrap_err();
    assert!(err.contains("210") && err.contains("209"), "{err}");
    let err = KQuantMatrix::from_ggml(GgmlType::Q2_K, bytes(84), usize::MAX, 256).unwrap_err();
    assert!(err.contains("too many"), "{err}");
    assert!(pack_ggml(GgmlType::F32, bytes(4), 1, 1).unwrap().is_none());
    let err = dequantize(GgmlType::Q3_K, &[0; 109], 256).unwrap_err();
    assert!(err.contains("Q3_K") && err.contains("109"), "{err}");
}

/// The 32-blocks' SIMD kernels take 8 blocks a step: rows of 7, 9, 18 (SmolLM2's 576) and 25
/// blocks leave every remainder of a step, and weights at the ends of their ranges (every
/// fifth bit set or clear, `IQ4_NL`'s ±127 level, `MXFP4`'s −12) against activations of ±127
/// give the largest pair sums `vpmaddubsw` meets. Each kernel gives the portable kernel's bits.
#[test]
fn block32_kernels_agree_on_step_remainders_and_extremes() {
    use super::tests::simd_kernels;
    let mut rng = Lcg(41);
    for ty in [GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::IQ4_NL, GgmlType::MXFP4] {
        let (_, size) = ty.block().unwrap();
        for cols in [224, 288, 576, 800] {
            for d_out in [1, 5] {
                let n_blocks = d_out * cols / 32;
                let mut variants = vec![("random", random_blocks(&mut rng, ty, n_blocks))];
                for fill in [0x00u8, 0xff] {
                    let mut data = random_blocks(&mut rng, ty, n_blocks);
                    for block in data.chunks_exact_mut(size) {
                        // (MXFP4: its values from byte 1, after the e8m0 scale)
                        let first = scale_offsets(ty).last().map_or(1, |&at| at + 2);
                        block[first..].fill(fill);
                    }
                    variants.push((if fill == 0 { "zeros" } else { "ones" }, data));
                }
                for (what, data) in variants {
                    let packed = pack_ggml(ty, RawBytes::owned(data), d_out, cols)
                        .unwrap()
                        .unwrap();
                    for rows in [1, 2, 3, 4, 5, 8, 17] {
                        let x: Vec<f32> = (0..rows * cols)
                            .map(|i| match what {
                                // ±1 in each block: every p_j is ±127.
                                "random" => (rng.unit() * 3.0) as f32,
                                _ if (i / 7) % 2 == 0 => 1.0,
                                _ => -1.0,
                            })
                            .collect();
                        let label = format!("{ty} {what} {d_out}x{cols} rows {rows}");
                        let mut want = vec![f32::NAN; rows * d_out];
                        packed.product_with(Kernel::Portable, &mut want, &x, rows);
                        assert!(want.iter().all(|v| v.is_finite()), "{label}");
                        for kernel in simd_kernels(&packed, &label) {
                            let mut got = vec![f32::NAN; rows * d_out];
                            packed.product_with(kernel, &mut got, &x, rows);
                            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                                assert_eq!(a.to_bits(), b.to_bits(), "{label} {kernel:?} y[{i}]");
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A matrix gives back the file's bytes however it holds them: as stored, rows interleaved by
/// eight, or `Q5_0` / `Q5_1` regrouped (what a device reading the file's layout uploads).
#[test]
fn file_bytes_are_the_bytes_given() {
    let mut rng = Lcg(11);
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q3_K] {
        let (block, _) = ty.block().unwrap();
        for (rows, nb) in [(3usize, 1usize), (8, 2), (19, 9)] {
            let data = random_blocks(&mut rng, ty, rows * nb);
            for interleave in [false, true] {
                let w = KQuantMatrix::from_ggml_laid_out(
                    ty,
                    RawBytes::owned(data.clone()),
                    rows,
                    nb * block,
                    interleave,
                )
                .unwrap();
                assert!(w.file_bytes()[..] == data[..], "{ty} {rows}x{nb} {interleave}");
                let packed = PackedWeight::KQuants(w);
                let (t, bytes) = packed.ggml_blocks().unwrap();
                assert_eq!(t, ty);
                assert!(bytes[..] == data[..]);
            }
        }
    }
}
