//! Structured random mutation of valid files, seeded with the crate's generator: byte-level
//! operators (bit flips, interesting integers, truncation, deletion, duplication, splices from
//! other seeds, dictionary tokens) and field-level edits of JSON documents (any node replaced by
//! an interesting value, removed, duplicated, nudged, an unknown key added) and of safetensors
//! headers. Shared by `tests/robustness/fuzz_readers.rs` and nothing else (the `cargo fuzz`
//! targets in `fuzz/` get their inputs from libFuzzer).
#![allow(dead_code)]

use serde_json::Value as Json;
use transformer::rng::Rng;

/// Little-endian integers that sit at the edges of ranges.
const INTERESTING: [u64; 14] = [
    0,
    1,
    2,
    0x7f,
    0xff,
    0x7fff,
    0xffff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    0x7fff_ffff_ffff_ffff,
    0x8000_0000_0000_0000,
    u64::MAX,
];

/// Bytes that mean something to our formats' parsers.
const DICTIONARY: [&[u8]; 22] = [
    b"\"",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"null",
    b"-1",
    b"1e999",
    b"18446744073709551616",
    b"NaN",
    b"\\u0000",
    b"\xEF\xBB\xBF",
    b"\t",
    b"\n",
    b"\r\n",
    b"\xff\xfe",
    b"\xc3",
    b"<unk>",
    b"GGUF",
    b"\"dtype\":\"F16\"",
];

fn pick<'a, T>(rng: &mut Rng, items: &'a [T]) -> &'a T {
    &items[rng.below(items.len())]
}

/// A position in `0..=len`.
fn at(rng: &mut Rng, len: usize) -> usize {
    rng.below(len + 1)
}

/// One to four byte-level operators applied to `data`; `others` are the splice sources.
pub fn bytes(rng: &mut Rng, data: &[u8], others: &[Vec<u8>]) -> Vec<u8> {
    let mut d = data.to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = d.len();
        match rng.below(10) {
            0 if len > 0 => {
                let i = rng.below(len);
                d[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                d[i] = rng.below(256) as u8;
            }
            2 if len > 0 => {
                let width = *pick(rng, &[1usize, 2, 4, 8]);
                let v = pick(rng, &INTERESTING).to_le_bytes();
                let i = rng.below(len);
                for (k, b) in v[..width].iter().enumerate() {
                    if let Some(x) = d.get_mut(i + k) {
                        *x = *b;
                    }
                }
            }
            3 => d.truncate(at(rng, len)),
            4 if len > 0 => {
                let a = rng.below(len);
                let b = (a + 1 + rng.below(64)).min(len);
                d.drain(a..b);
            }
            5 if len > 0 => {
                let a = rng.below(len);
                let b = (a + 1 + rng.below(256)).min(len);
                let chunk = d[a..b].to_vec();
                let i = at(rng, len);
                d.splice(i..i, chunk);
            }
            6 if !others.is_empty() => {
                let other = pick(rng, others);
                if !other.is_empty() {
                    let a = rng.below(other.len());
                    let b = (a + 1 + rng.below(512)).min(other.len());
                    let i = at(rng, len);
                    let j = (i + rng.below(512)).min(len);
                    d.splice(i..j, other[a..b].iter().copied());
                }
            }
            7 => {
                let token = pick(rng, &DICTIONARY);
                let i = at(rng, len);
                d.splice(i..i, token.iter().copied());
            }
            8 => {
                let n = 1 + rng.below(16);
                let i = at(rng, len);
                let junk: Vec<u8> = (0..n).map(|_| rng.below(256) as u8).collect();
                d.splice(i..i, junk);
            }
            _ => {
                // A run of one byte (long lines, long tokens).
                let n = 1 + rng.below(4096);
                let i = at(rng, len);
                let b = *pick(rng, &[b'a', b'\t', b'\n', b' ', 0u8, 0xff]);
                d.splice(i..i, std::iter::repeat_n(b, n));
            }
        }
    }
    d
}

/// JSON values that sit at the edges of what a field may hold.
fn interesting_json(rng: &mut Rng) -> Json {
    use serde_json::json;
    match rng.below(22) {
        0 => json!(0),
        1 => json!(-1),
        2 => json!(1),
        3 => json!(u64::MAX),
        4 => json!(i64::MIN),
        5 => json!(1u64 << 32),
        6 => json!(1u64 << 53),
        7 => json!(1e308),
        8 => json!(-1e308),
        9 => json!(0.5),
        10 => json!(1e-320),
        11 => json!(""),
        12 => json!("x"),
        13 => Json::String("ü".repeat(1 + rng.below(300))),
        14 => Json::Null,
        15 => json!(true),
        16 => json!([]),
        17 => json!({}),
        18 => json!([[1, 2], {"a": null}]),
        19 => json!(rng.below(1000)),
        20 => json!(-(rng.below(1000) as i64)),
        _ => json!(rng.uniform_range(-10.0, 10.0)),
    }
}

/// Every node of `v` as a path of object keys and array indices.
#[derive(Clone, Debug)]
enum Step {
    Key(String),
    Index(usize),
}

fn paths(v: &Json, prefix: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    out.push(prefix.clone());
    match v {
        Json::Object(m) => {
            for (k, child) in m {
                prefix.push(Step::Key(k.clone()));
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        Json::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                prefix.push(Step::Index(i));
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

fn node<'a>(v: &'a mut Json, path: &[Step]) -> &'a mut Json {
    path.iter().fold(v, |v, s| match s {
        Step::Key(k) => &mut v[k.as_str()],
        Step::Index(i) => &mut v[*i],
    })
}

/// One to three field-level edits of the JSON document `doc`, written back compact or
/// pretty, sometimes with a byte order mark; a document that does not parse gets byte-level
/// mutations instead.
pub fn json(rng: &mut Rng, doc: &[u8], others: &[Vec<u8>]) -> Vec<u8> {
    let Ok(mut v) = serde_json::from_slice::<Json>(doc) else {
        return bytes(rng, doc, others);
    };
    for _ in 0..1 + rng.below(3) {
        let mut all = Vec::new();
        paths(&v, &mut Vec::new(), &mut all);
        let path = pick(rng, &all).clone();
        let (parent_path, last) = match path.split_last() {
            Some((last, parent)) => (parent.to_vec(), Some(last.clone())),
            None => (Vec::new(), None),
        };
        match rng.below(7) {
            0 | 1 => *node(&mut v, &path) = interesting_json(rng),
            2 => match (node(&mut v, &parent_path), last) {
                (Json::Object(m), Some(Step::Key(k))) => {
                    m.remove(&k);
                }
                (Json::Array(a), Some(Step::Index(i))) => {
                    a.remove(i);
                }
                _ => {}
            },
            3 => {
                let n = node(&mut v, &path);
                if let Some(x) = n.as_f64() {
                    let y = match rng.below(5) {
                        0 => x + 1.0,
                        1 => x - 1.0,
                        2 => x * 1000.0,
                        3 => -x,
                        _ => x * 0.5,
                    };
                    *n = if y.fract() == 0.0 && y.abs() < 9e15 {
                        serde_json::json!(y as i64)
                    } else {
                        serde_json::json!(y)
                    };
                } else if let Some(s) = n.as_str() {
                    let mut s = s.to_string();
                    match rng.below(3) {
                        0 => s.push_str("<unk>"),
                        1 => {
                            let mut cut = s.len() / 2;
                            while !s.is_char_boundary(cut) {
                                cut -= 1;
                            }
                            s.truncate(cut);
                        }
                        _ => s = s.repeat(2),
                    }
                    *n = Json::String(s);
                }
            }
            4 => {
                if let Json::Object(m) = node(&mut v, &parent_path) {
                    m.insert("unexpected_field".into(), interesting_json(rng));
                }
            }
            5 => {
                if let Json::Array(a) = node(&mut v, &parent_path) {
                    if !a.is_empty() {
                        let i = rng.below(a.len());
                        let dup = a[i].clone();
                        a.insert(rng.below(a.len() + 1), dup);
                    }
                }
            }
            _ => {
                // Swap the node with another one of the document.
                let other = pick(rng, &all).clone();
                let value = node(&mut v, &other).clone();
                *node(&mut v, &path) = value;
            }
        }
    }
    let mut out = if rng.below(2) == 0 {
        serde_json::to_vec(&v).unwrap()
    } else {
        serde_json::to_vec_pretty(&v).unwrap()
    };
    if rng.below(10) == 0 {
        out.splice(0..0, *b"\xEF\xBB\xBF");
    }
    if rng.below(4) == 0 {
        out = bytes(rng, &out, others);
    }
    out
}

/// A safetensors file mutated in its JSON header (dtype, shape, offsets, names: field-level
/// edits, the header length rewritten or not), in its data (values set to NaN or infinities),
/// or byte by byte.
pub fn safetensors(rng: &mut Rng, file: &[u8], others: &[Vec<u8>]) -> Vec<u8> {
    let header_len = file
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()) as usize);
    let Some(n) = header_len.filter(|&n| n <= file.len() - 8) else {
        return bytes(rng, file, others);
    };
    let (header, data) = (&file[8..8 + n], &file[8 + n..]);
    match rng.below(3) {
        0 => {
            let header = json(rng, header, &[]);
            let mut out = (header.len() as u64).to_le_bytes().to_vec();
            if rng.below(8) == 0 {
                out = pick(rng, &INTERESTING).to_le_bytes().to_vec();
            }
            out.extend_from_slice(&header);
            out.extend_from_slice(data);
            out
        }
        1 if data.len() >= 4 => {
            let mut out = file.to_vec();
            for _ in 0..1 + rng.below(3) {
                let i = 8 + n + rng.below(data.len() / 4) * 4;
                let v = *pick(rng, &[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX]);
                out[i..i + 4].copy_from_slice(&v.to_le_bytes());
            }
            out
        }
        _ => bytes(rng, file, others),
    }
}
