//! Writing a GGUF file that holds metadata and no tensors (version 3, little-endian): the
//! header `GGUF`, version, tensor count 0, key/value count, then each key (a u64 length and its
//! UTF-8 bytes), its value type code (u32) and value, padded to the alignment. What a model
//! directory keeps of a GGUF model's tokenizer (`tokenizer.*` keys and the chat template) when
//! its weights are saved in this crate's format (`crate::pipeline::lm_dir`); [`super::gguf`]
//! reads it back.

use super::gguf_value::Value;

/// The data-section alignment the file is padded to (GGUF's default).
const ALIGNMENT: usize = 32;

/// A version-3 GGUF file of `metadata` and no tensors.
pub fn metadata_only(metadata: &[(String, Value)]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        put_str(&mut b, key);
        b.extend_from_slice(&(value.value_type() as u32).to_le_bytes());
        put_value(&mut b, value);
    }
    b.resize(b.len().div_ceil(ALIGNMENT) * ALIGNMENT, 0);
    b
}

/// A GGUF string: its length (u64) and its UTF-8 bytes.
pub fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

/// A value's payload (its type code written by the caller; an array's element type and count
/// are part of the payload).
pub fn put_value(b: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => b.push(*x),
        Value::I8(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => b.push(u8::from(*x)),
        Value::String(s) => put_str(b, s),
        Value::Array(t, items) => {
            b.extend_from_slice(&(*t as u32).to_le_bytes());
            b.extend_from_slice(&(items.len() as u64).to_le_bytes());
            items.iter().for_each(|i| put_value(b, i));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::gguf::GgufFile;
    use crate::store::gguf_value::ValueType;
    use std::path::Path;

    #[test]
    fn metadata_reads_back_as_written() {
        let metadata = vec![
            ("general.architecture".to_string(), Value::String("llama".into())),
            ("tokenizer.ggml.bos_token_id".to_string(), Value::U32(7)),
            ("x.f".to_string(), Value::F32(-1.5)),
            ("x.i".to_string(), Value::I8(-3)),
            (
                "tokenizer.ggml.tokens".to_string(),
                Value::Array(
                    ValueType::String,
                    vec![Value::String("a".into()), Value::String("bc".into())],
                ),
            ),
        ];
        let bytes = metadata_only(&metadata);
        assert_eq!(bytes.len() % ALIGNMENT, 0);
        let file = GgufFile::from_bytes(bytes, Path::new("t.gguf")).unwrap();
        assert_eq!(file.version(), 3);
        assert!(file.tensors().is_empty());
        assert_eq!(file.metadata(), &metadata[..]);
    }
}
