//! GGUF reading: a small file written here byte by byte from the format's definition (every
//! metadata value type, alignment padding, one tensor of each supported element type built from
//! known blocks and checked against a float64 decode written here) must read back exactly;
//! damaged files (truncated anywhere, bad magic, version 2, absurd counts, offsets past the
//! end, unsupported types) must give clear errors, never a panic. Then the real SmolLM2 file
//! from `../shared`: metadata, hyper-parameters and every tensor decoded (skipped, with the
//! reason, where it is absent). The tokenizer is tested in `gguf_tokenizer.rs`.

use crate::gguf_common;

use gguf_common::{gguf, parse, parse_err, put_str, put_u32, put_u64, smollm2, tensor, TensorSpec};
use transformer::store::file_memory::FileMemory;
use transformer::store::ggml::GgmlType;
use transformer::store::gguf::{GgufFile, Value, ValueType};
use transformer::store::gguf_llama::LlamaGgufConfig;

// ---------------------------------------------------------------------------------------------
// Known blocks and their float64 decode.

/// IEEE half precision to f64, from the definition.
fn half(h: u16) -> f64 {
    let sign = if h >> 15 == 1 { -1.0 } else { 1.0 };
    let (e, m) = (i32::from((h >> 10) & 0x1f), f64::from(h & 0x3ff));
    match e {
        0 => sign * m / 1024.0 * 2f64.powi(-14),
        31 => panic!("no infinities in the test blocks"),
        _ => sign * (1.0 + m / 1024.0) * 2f64.powi(e - 15),
    }
}

/// The scales used by the blocks: ordinary, negative, tiny (subnormal) and large.
const SCALES: [u16; 4] = [0x2e66, 0xb19a, 0x0003, 0x5a00];

/// `n_blocks` Q8_0 blocks and their values.
fn q8_0_blocks(n_blocks: usize) -> (Vec<u8>, Vec<f64>) {
    let (mut bytes, mut values) = (vec![], vec![]);
    for i in 0..n_blocks {
        let d = SCALES[i % 4];
        bytes.extend_from_slice(&d.to_le_bytes());
        for j in 0..32 {
            let q = ((i * 37 + j * 11) % 256) as u8 as i8; // covers -128..127
            bytes.push(q as u8);
            values.push(f64::from(q) * half(d));
        }
    }
    (bytes, values)
}

/// `n_blocks` Q4_0 (`with_min` false) or Q4_1 blocks and their values: nibble `j` of byte `k`
/// is element `k` (low) or `k + 16` (high).
fn q4_blocks(n_blocks: usize, with_min: bool) -> (Vec<u8>, Vec<f64>) {
    let (mut bytes, mut values) = (vec![], vec![]);
    for i in 0..n_blocks {
        let d = SCALES[i % 4];
        let m = SCALES[(i + 1) % 4] ^ 0x8000;
        bytes.extend_from_slice(&d.to_le_bytes());
        if with_min {
            bytes.extend_from_slice(&m.to_le_bytes());
        }
        let q: Vec<u8> = (0..32).map(|j| ((i * 7 + j * 5) % 16) as u8).collect();
        bytes.extend((0..16).map(|k| q[k] | (q[k + 16] << 4)));
        for &q in &q {
            values.push(if with_min {
                f64::from(q) * half(d) + half(m)
            } else {
                (f64::from(q) - 8.0) * half(d)
            });
        }
    }
    (bytes, values)
}

const F16_BITS: [u16; 6] = [0x3c00, 0xc000, 0x3555, 0x0001, 0x7bff, 0x8000];
const BF16_BITS: [u16; 3] = [0x3f80, 0xc0a0, 0x0001];
const F32_VALUES: [f32; 6] = [0.5, -1.25, 3.0e-39, 1.0e30, -0.0, 7.0];

fn le16(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Every metadata value type, arrays nested and empty.
fn all_values() -> Vec<(&'static str, Value)> {
    use Value::*;
    vec![
        ("general.architecture", String("llama".into())),
        ("t.u8", U8(200)),
        ("t.i8", I8(-100)),
        ("t.u16", U16(60000)),
        ("t.i16", I16(-30000)),
        ("t.u32", U32(4_000_000_000)),
        ("t.i32", I32(-2_000_000_000)),
        ("t.f32", F32(1.0e-5)),
        ("t.bool.true", Bool(true)),
        ("t.bool.false", Bool(false)),
        ("t.string", String("héllo ✓ <|im_start|>".into())),
        ("t.empty_string", String("".into())),
        ("t.u64", U64(u64::MAX)),
        ("t.i64", I64(i64::MIN)),
        ("t.f64", F64(-1.0e300)),
        (
            "t.array.u8",
            Array(ValueType::U8, vec![U8(1), U8(2), U8(255)]),
        ),
        ("t.array.i32", Array(ValueType::I32, vec![I32(-1), I32(3)])),
        (
            "t.array.string",
            Array(
                ValueType::String,
                vec![String("a b".into()), String("".into())],
            ),
        ),
        (
            "t.array.bool",
            Array(ValueType::Bool, vec![Bool(true), Bool(false)]),
        ),
        ("t.array.f64.empty", Array(ValueType::F64, vec![])),
        (
            "t.array.nested",
            Array(
                ValueType::Array,
                vec![
                    Array(ValueType::I16, vec![I16(-7)]),
                    Array(
                        ValueType::String,
                        vec![String("x".into()), String("yz".into())],
                    ),
                    Array(ValueType::U64, vec![]),
                ],
            ),
        ),
    ]
}

/// The supported tensors (and one of an unsupported type, not last), with their values.
fn all_tensors() -> (Vec<TensorSpec>, Vec<(&'static str, Vec<f64>)>) {
    let (q8, q8_v) = q8_0_blocks(4);
    let (q40, q40_v) = q4_blocks(3, false);
    let (q41, q41_v) = q4_blocks(4, true);
    let specs = vec![
        tensor(
            "f32",
            &[3, 2],
            0,
            F32_VALUES.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ),
        tensor("iq2_xxs", &[256], 16, vec![0xab; 66]),
        tensor("f16", &[6], 1, le16(&F16_BITS)),
        tensor("bf16", &[3, 1], 30, le16(&BF16_BITS)),
        tensor("q8_0", &[64, 2], 8, q8),
        tensor("q4_0", &[32, 3], 2, q40),
        tensor("q4_1", &[64, 1, 2], 3, q41),
    ];
    let values = vec![
        ("f32", F32_VALUES.iter().map(|&x| f64::from(x)).collect()),
        ("f16", F16_BITS.iter().map(|&h| half(h)).collect()),
        (
            "bf16",
            BF16_BITS
                .iter()
                .map(|&b| f64::from(f32::from_bits(u32::from(b) << 16)))
                .collect(),
        ),
        ("q8_0", q8_v),
        ("q4_0", q40_v),
        ("q4_1", q41_v),
    ];
    (specs, values)
}

// ---------------------------------------------------------------------------------------------
// The hand-built file.

#[test]
fn hand_built_file_reads_back_exactly() {
    for alignment in [None, Some(64u32)] {
        let mut kvs = all_values();
        if let Some(a) = alignment {
            kvs.push(("general.alignment", Value::U32(a)));
        }
        let align = alignment.map_or(32, |a| a as usize);
        let (specs, values) = all_tensors();
        let file = parse(gguf(&kvs, &specs, align)).unwrap();

        assert_eq!(file.version(), 3);
        assert_eq!(file.alignment(), align);
        assert_eq!(file.data_start() % align, 0);
        let want: Vec<(String, Value)> = kvs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        assert_eq!(file.metadata(), want.as_slice());
        assert_eq!(file.architecture().unwrap(), "llama");
        assert_eq!(file.require::<usize>("t.u32").unwrap(), 4_000_000_000);
        assert_eq!(file.require::<f64>("t.f32").unwrap(), f64::from(1.0e-5f32));
        assert_eq!(file.get::<&str>("no.such.key").unwrap(), None);
        let err = file.require::<usize>("t.i8").unwrap_err().to_string();
        assert!(err.contains("t.i8") && err.contains("i8 -100"), "{err}");
        let err = file.require::<f64>("no.such.key").unwrap_err().to_string();
        assert!(err.contains("no.such.key is missing"), "{err}");

        assert_eq!(file.tensors().len(), specs.len());
        for (t, s) in file.tensors().iter().zip(&specs) {
            assert_eq!(t.name, s.name);
            assert_eq!(
                t.dims,
                s.dims.iter().map(|&d| d as usize).collect::<Vec<_>>()
            );
            assert_eq!(t.ggml_type.code(), s.code);
            assert_eq!(t.offset % align, 0);
        }
        let q41 = file.tensor("q4_1").unwrap();
        assert_eq!(q41.shape(), vec![2, 1, 64]);
        assert_eq!(q41.rows_cols(), (2, 64));
        assert_eq!(file.tensor("q8_0").unwrap().ggml_type, GgmlType::Q8_0);
        for (name, want) in &values {
            let got = file.dequantize(name).unwrap();
            let want: Vec<f32> = want.iter().map(|&v| v as f32).collect();
            assert_eq!(got.len(), want.len(), "{name}");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{name}[{i}]: {g} vs {w}");
            }
        }
        let err = file.dequantize("iq2_xxs").unwrap_err().to_string();
        assert!(err.contains("iq2_xxs") && err.contains("IQ2_XXS"), "{err}");
        assert!(file
            .dequantize("nothing")
            .unwrap_err()
            .to_string()
            .contains("no tensor"));
    }
}

#[test]
fn every_truncation_is_a_clear_error() {
    let (specs, _) = all_tensors();
    let full = gguf(&all_values(), &specs, 32);
    parse(full.clone()).unwrap();
    for len in 0..full.len() {
        let err = parse_err(full[..len].to_vec());
        assert!(
            err.contains("truncated") || err.contains("past the end") || err.contains("remain"),
            "{len} bytes: {err}"
        );
    }
}

/// The file opened through its memory map (`GgufFile::open`) reads as its bytes parsed in
/// memory; the bytes of its tensors stay readable after the file value is dropped.
#[test]
fn mapped_file_reads_as_its_bytes() {
    let (specs, _) = all_tensors();
    let bytes = gguf(&all_values(), &specs, 32);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let mapped = GgufFile::open(&path).unwrap();
    let read = parse(bytes).unwrap();
    assert_eq!(mapped.path(), path);
    assert_eq!(mapped.metadata(), read.metadata());
    assert_eq!(mapped.tensors(), read.tensors());
    assert_eq!(mapped.data_start(), read.data_start());
    let mut kept = Vec::new();
    for info in mapped.tensors() {
        let Ok(want) = read.tensor_data(info) else {
            assert!(mapped.tensor_data(info).is_err(), "{}", info.name);
            continue;
        };
        assert_eq!(mapped.tensor_data(info).unwrap(), want, "{}", info.name);
        let (got, want_f32) = (
            mapped.dequantize_info(info).unwrap(),
            read.dequantize_info(info).unwrap(),
        );
        assert!(got
            .iter()
            .zip(&want_f32)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        kept.push((mapped.tensor_bytes(info).unwrap(), want.to_vec()));
    }
    assert!(kept.len() >= 6, "only {} tensors decoded", kept.len());
    drop(mapped);
    for (bytes, want) in kept {
        assert_eq!(&*bytes, &want[..]);
    }
}

/// A tensor whose memory is given back (`release`, after a block product copied it) is
/// refused by name from then on, in both ways a file is held, and the tensors around it still
/// read as their bytes: whole pages inside the released one only, never a neighbour's.
#[test]
fn released_tensors_are_refused_and_their_neighbours_kept() {
    // Q5_0 (type 6), three tensors of 64 x 576 (25,344 bytes: several pages each).
    let block = |i: usize| -> Vec<u8> { (0..22).map(|j| ((i * 31 + j * 7) % 251) as u8).collect() };
    let data = |t: usize| -> Vec<u8> { (0..64 * 18).flat_map(|b| block(t * 10_000 + b)).collect() };
    let specs: Vec<TensorSpec> = (0..3)
        .map(|t| tensor(&format!("w{t}"), &[576, 64], 6, data(t)))
        .collect();
    let bytes = gguf(&[], &specs, 32);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q5.gguf");
    std::fs::write(&path, &bytes).unwrap();
    for memory in [FileMemory::HugePages, FileMemory::Map] {
        let file = GgufFile::open_with(&path, memory).unwrap();
        let middle = file.tensor("w1").unwrap().clone();
        // SAFETY: nothing read from w1 is alive.
        let given = unsafe { file.release(&middle) };
        if cfg!(target_os = "linux") {
            assert!(given >= 4 * 4096, "{memory:?}: {given} bytes given back");
        }
        let err = file.tensor_data(&middle).unwrap_err().to_string();
        assert!(err.contains("w1") && err.contains("given back"), "{err}");
        assert!(file.dequantize("w1").is_err());
        for t in [0, 2] {
            let info = file.tensor(&format!("w{t}")).unwrap();
            assert_eq!(
                file.tensor_data(info).unwrap(),
                &data(t)[..],
                "{memory:?} w{t}"
            );
        }
        // A file parsed from bytes it does not hold gives nothing back, and refuses alike.
        let read = parse(bytes.clone()).unwrap();
        // SAFETY: nothing read from w1 is alive.
        assert_eq!(unsafe { read.release(&middle) }, 0);
        assert!(read.tensor_data(&middle).is_err());
    }
}

/// Every truncation of a file on disk, opened through its map, is refused with an error naming
/// the file and the cause: the header, the tensor table and every tensor's range are checked
/// against the mapped length before anything is read from them (no read past the end, which
/// would fault).
#[test]
fn every_truncation_of_a_mapped_file_is_a_clear_error() {
    let (specs, _) = all_tensors();
    let full = gguf(&all_values(), &specs, 32);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.gguf");
    for len in 0..full.len() {
        std::fs::write(&path, &full[..len]).unwrap();
        let err = match GgufFile::open(&path) {
            Ok(_) => panic!("{len} bytes of {} were accepted", full.len()),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("cut.gguf"), "{len} bytes: {err}");
        assert!(
            err.contains("truncated") || err.contains("past the end") || err.contains("remain"),
            "{len} bytes: {err}"
        );
    }
    std::fs::write(&path, &full).unwrap();
    GgufFile::open(&path).unwrap();
}

/// A missing file or a directory is named as such.
#[test]
fn opening_what_is_not_a_gguf_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.gguf");
    let err = GgufFile::open(&missing).err().unwrap().to_string();
    assert!(
        err.contains("missing.gguf") && err.contains("not found"),
        "{err}"
    );
    let err = GgufFile::open(dir.path()).err().unwrap().to_string();
    assert!(err.contains("is a directory"), "{err}");
}

/// A file of `n_tensors` and `n_kv` as stated, followed by `rest`.
fn raw(version: u32, n_tensors: u64, n_kv: u64, rest: &[u8]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    put_u32(&mut b, version);
    put_u64(&mut b, n_tensors);
    put_u64(&mut b, n_kv);
    b.extend_from_slice(rest);
    b
}

#[test]
fn damaged_headers_are_refused() {
    let mut bad_magic = raw(3, 0, 0, &[]);
    bad_magic[..4].copy_from_slice(b"GGML");
    assert!(parse_err(bad_magic).contains("not a GGUF file"));
    let err = parse_err(raw(2, 0, 0, &[]));
    assert!(
        err.contains("version 2") && err.contains("only version 3"),
        "{err}"
    );
    assert!(parse_err(raw(3 << 24, 0, 0, &[])).contains("big-endian"));
    assert_eq!(parse(raw(3, 0, 0, &[])).unwrap().tensors().len(), 0);

    let err = parse_err(raw(3, u64::MAX, 0, &[]));
    assert!(
        err.contains("tensor infos") && err.contains(&u64::MAX.to_string()),
        "{err}"
    );
    let err = parse_err(raw(3, 0, 1 << 40, &[0; 64]));
    assert!(err.contains("metadata key/value pairs"), "{err}");

    // A key whose string length, or whose array count, is absurd.
    let mut kv = vec![];
    put_u64(&mut kv, u64::MAX);
    kv.extend_from_slice(&[0; 16]);
    let err = parse_err(raw(3, 0, 1, &kv));
    assert!(
        err.contains("truncated") && err.contains("metadata key 0"),
        "{err}"
    );
    for (elem, count) in [
        (ValueType::U32, 1u64 << 61),
        (ValueType::String, u64::MAX / 2),
    ] {
        let mut kv = vec![];
        put_str(&mut kv, "big.array");
        put_u32(&mut kv, ValueType::Array as u32);
        put_u32(&mut kv, elem as u32);
        put_u64(&mut kv, count);
        kv.extend_from_slice(&[0; 100]);
        let err = parse_err(raw(3, 0, 1, &kv));
        assert!(
            err.contains("big.array") && err.contains(&count.to_string()),
            "{err}"
        );
    }
    // Unknown value type, nesting beyond the limit, duplicate key, bad alignment.
    let mut kv = vec![];
    put_str(&mut kv, "odd");
    put_u32(&mut kv, 13);
    assert!(parse_err(raw(3, 0, 1, &kv)).contains("unknown value type 13"));
    let mut deep = vec![];
    put_str(&mut deep, "deep");
    put_u32(&mut deep, 9);
    for _ in 0..100 {
        put_u32(&mut deep, 9);
        put_u64(&mut deep, 1);
    }
    assert!(parse_err(raw(3, 0, 1, &deep)).contains("nested"));
    let twice = [("a", Value::U8(1)), ("a", Value::U8(2))];
    assert!(parse_err(gguf(&twice, &[], 32)).contains("appears twice"));
    for v in [Value::U32(48), Value::U32(0), Value::U64(32)] {
        let err = parse_err(gguf(&[("general.alignment", v)], &[], 32));
        assert!(err.contains("general.alignment"), "{err}");
    }
}

#[test]
fn damaged_tensor_infos_are_refused() {
    let f32s = |n: usize| vec![0u8; 4 * n];
    let one = |t: TensorSpec| gguf(&[], &[t], 32);
    let err = parse_err(one(tensor("w", &[1, 1, 1, 1, 1], 0, f32s(1))));
    assert!(err.contains("5 dimensions"), "{err}");
    let err = parse_err(one(tensor("w", &[1 << 32, 1 << 32, 1 << 32], 0, f32s(1))));
    assert!(err.contains("overflows"), "{err}");
    let err = parse_err(one(tensor("w", &[16], 8, vec![0; 34])));
    assert!(
        err.contains("not a whole number") && err.contains("Q8_0"),
        "{err}"
    );
    let err = parse_err(one(tensor("w", &[64], 0, f32s(63))));
    assert!(err.contains("past the end"), "{err}");
    let mut t = tensor("w", &[2], 0, f32s(2));
    t.offset = Some(u64::MAX - 7);
    assert!(parse_err(one(t)).contains("w"));
    let mut t = tensor("w", &[2], 0, f32s(2));
    t.offset = Some(1 << 20);
    let err = parse_err(one(t));
    assert!(
        err.contains("past the end") && err.contains("tensor w"),
        "{err}"
    );
    let mut t = tensor("w", &[2], 0, f32s(20));
    t.offset = Some(4);
    assert!(parse_err(one(t)).contains("not a multiple of the alignment 32"));
    let twice = gguf(
        &[],
        &[tensor("w", &[1], 0, f32s(1)), tensor("w", &[1], 0, f32s(1))],
        32,
    );
    assert!(parse_err(twice).contains("appears twice"));
    // An unknown type code parses (its size is unknown) but cannot be read, naming the code.
    let file = parse(one(tensor("w", &[8], 77, vec![0; 8]))).unwrap();
    let err = file.dequantize("w").unwrap_err().to_string();
    assert!(err.contains("unknown type 77"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// The real SmolLM2 file.

#[test]
fn smollm2_metadata_and_config() {
    let Some(file) = smollm2() else { return };
    assert_eq!(file.version(), 3);
    assert_eq!(file.alignment(), 32);
    assert_eq!(file.architecture().unwrap(), "llama");
    let c = LlamaGgufConfig::from_gguf(file).unwrap();
    assert_eq!(
        (c.n_layers, c.d_model, c.d_ff, c.n_heads, c.n_kv_heads),
        (30, 576, 1536, 9, 3)
    );
    assert_eq!(
        (c.head_dim(), c.rope_dim, c.context_length, c.vocab_size),
        (64, 64, 8192, 49152)
    );
    assert_eq!(c.rope_freq_base, 100000.0);
    assert_eq!(c.rms_norm_eps as f32, 1e-5);
    assert_eq!(
        file.require::<&str>("tokenizer.ggml.model").unwrap(),
        "gpt2"
    );
    assert_eq!(
        file.require::<&str>("tokenizer.ggml.pre").unwrap(),
        "smollm"
    );
    assert_eq!(
        file.require::<Vec<&str>>("tokenizer.ggml.tokens")
            .unwrap()
            .len(),
        49152
    );
    assert_eq!(
        file.require::<Vec<&str>>("tokenizer.ggml.merges")
            .unwrap()
            .len(),
        48900
    );
    let template = file.chat_template().unwrap().unwrap();
    assert!(template.contains("<|im_start|>"));
    assert!(
        template.contains("You are a helpful AI assistant named SmolLM, trained by Hugging Face")
    );
}

/// Q8_0 / Q4_1 bytes decoded here, in f64, straight from the block layout.
fn decode_f64(ty: GgmlType, data: &[u8]) -> Vec<f64> {
    let h = |b: &[u8], at: usize| half(u16::from_le_bytes([b[at], b[at + 1]]));
    match ty {
        GgmlType::Q8_0 => data
            .chunks(34)
            .flat_map(|b| b[2..].iter().map(move |&q| f64::from(q as i8) * h(b, 0)))
            .collect(),
        GgmlType::Q4_1 => data
            .chunks(20)
            .flat_map(|b| {
                let lo = b[4..].iter().map(|q| q & 15);
                let hi = b[4..].iter().map(|q| q >> 4);
                lo.chain(hi).map(move |q| f64::from(q) * h(b, 0) + h(b, 2))
            })
            .collect(),
        _ => unreachable!(),
    }
}

#[test]
fn smollm2_every_tensor_dequantises() {
    let Some(file) = smollm2() else { return };
    let tensors = file.tensors();
    assert_eq!(tensors.len(), 272);
    let count = |ty| tensors.iter().filter(|t| t.ggml_type == ty).count();
    assert_eq!(
        (
            count(GgmlType::Q8_0),
            count(GgmlType::Q4_1),
            count(GgmlType::F32)
        ),
        (1, 210, 61)
    );
    let embd = file.tensor("token_embd.weight").unwrap();
    assert_eq!(
        (embd.ggml_type, embd.shape()),
        (GgmlType::Q8_0, vec![49152, 576])
    );
    assert_eq!(
        file.tensor("blk.0.ffn_down.weight").unwrap().shape(),
        vec![576, 1536]
    );
    assert_eq!(
        file.tensor("blk.29.attn_k.weight").unwrap().shape(),
        vec![192, 576]
    );
    let mut total = 0;
    for t in tensors {
        let is_norm = t.name.ends_with("norm.weight");
        let want = match () {
            _ if t.name == "token_embd.weight" => GgmlType::Q8_0,
            _ if is_norm => GgmlType::F32,
            _ => GgmlType::Q4_1,
        };
        assert_eq!(t.ggml_type, want, "{}", t.name);
        let values = file.dequantize_info(t).unwrap();
        assert_eq!(
            values.len(),
            t.shape().iter().product::<usize>(),
            "{}",
            t.name
        );
        assert!(values.iter().all(|v| v.is_finite()), "{}", t.name);
        if t.ggml_type != GgmlType::F32
            && (t.name.starts_with("token") || t.name.starts_with("blk.0."))
        {
            let reference = decode_f64(t.ggml_type, file.tensor_data(t).unwrap());
            assert!(
                values.iter().zip(&reference).all(|(v, r)| *v == *r as f32),
                "{}",
                t.name
            );
        }
        total += values.len();
    }
    assert_eq!(total, 134_515_008);
}
