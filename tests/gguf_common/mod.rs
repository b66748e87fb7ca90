//! Helpers of the GGUF tests: a GGUF writer following the format's definition, parsing
//! shortcuts, and the real SmolLM2 file from `../shared`, read once.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use transformer::store::gguf::{GgufFile, Value};

// A GGUF writer, from the specification.

pub fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}

pub fn put_u64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}

/// A string and a value's payload (no type code) as the crate's own GGUF writer puts them
/// (`tokenizer.gguf`); the header, key/value and tensor-info layout below is written here.
pub use transformer::store::gguf_write::{put_str, put_value};

pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub code: u32,
    pub data: Vec<u8>,
    /// Replaces the computed offset.
    pub offset: Option<u64>,
}

pub fn tensor(name: &str, dims: &[u64], code: u32, data: Vec<u8>) -> TensorSpec {
    TensorSpec {
        name: name.to_string(),
        dims: dims.to_vec(),
        code,
        data,
        offset: None,
    }
}

/// A version-3 file: header, key/values, tensor infos, padding, data (each tensor aligned).
pub fn gguf(kvs: &[(&str, Value)], tensors: &[TensorSpec], alignment: usize) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    put_u32(&mut b, 3);
    put_u64(&mut b, tensors.len() as u64);
    put_u64(&mut b, kvs.len() as u64);
    for (k, v) in kvs {
        put_str(&mut b, k);
        put_u32(&mut b, v.value_type() as u32);
        put_value(&mut b, v);
    }
    let pad = |n: usize| n.div_ceil(alignment) * alignment;
    let mut offset = 0;
    let mut offsets = vec![];
    for t in tensors {
        put_str(&mut b, &t.name);
        put_u32(&mut b, t.dims.len() as u32);
        t.dims.iter().for_each(|&d| put_u64(&mut b, d));
        put_u32(&mut b, t.code);
        put_u64(&mut b, t.offset.unwrap_or(offset as u64));
        offsets.push(offset);
        offset = pad(offset + t.data.len());
    }
    let data_start = pad(b.len());
    for (t, off) in tensors.iter().zip(offsets) {
        b.resize(data_start + off, 0);
        b.extend_from_slice(&t.data);
    }
    b
}

pub fn parse(bytes: Vec<u8>) -> transformer::error::Result<GgufFile> {
    GgufFile::from_bytes(bytes, Path::new("test.gguf"))
}

pub fn parse_err(bytes: Vec<u8>) -> String {
    match parse(bytes) {
        Ok(_) => panic!("a damaged file was accepted"),
        Err(e) => e.to_string(),
    }
}

// The real SmolLM2 file.

pub fn shared() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared")
}

/// The SmolLM2 file, read once, or `None` (with the reason printed) where it is absent.
pub fn smollm2() -> Option<&'static GgufFile> {
    static FILE: OnceLock<Option<GgufFile>> = OnceLock::new();
    let path = shared().join("models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    let file = FILE.get_or_init(|| path.is_file().then(|| GgufFile::open(&path).unwrap()));
    if file.is_none() {
        eprintln!("skipping: {} not found (needs ../shared)", path.display());
    }
    file.as_ref()
}
