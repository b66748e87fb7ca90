//! The bytes every token of a decoder's vocabulary stands for, as a grammar sees the text it
//! writes ([`token_bytes`]): what constrained decoding (`decode::constraint`) builds its token
//! trie from.
//!
//! - GGUF: the bytes the tokenizer decodes each token to (byte-level BPE's `Ġ`-style characters
//!   mapped back to bytes, SentencePiece's `▁` a space, `<0xAB>` byte tokens their byte).
//! - Hugging Face `tokenizer.json` (and this crate's BPE, which is one): per the decoder, GPT-2's
//!   byte-level alphabet, or `▁` a space with `<0xAB>` byte fallback (Metaspace /
//!   SentencePiece-style decoders); added tokens as their text.
//!
//! Special tokens (GGUF control tokens, Hugging Face added tokens marked `special`) are flagged:
//! a grammar never writes them (a constraint allows only the end tokens among them).

use super::decoder_tokenizer::DecoderTokenizer;
use super::gguf_tokenizer::{byte_of_hex_token, bytes_of_token};
use crate::error::{Error, Result};
use serde_json::Value;

/// One token's bytes and whether it is a special (control) token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenBytes {
    pub bytes: Vec<u8>,
    pub special: bool,
}

/// How a Hugging Face decoder turns vocabulary entries into bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Spelling {
    /// GPT-2's byte-level alphabet.
    ByteLevel,
    /// `▁` for a space, `<0xAB>` for a byte (SentencePiece / Metaspace, byte fallback).
    Metaspace,
    /// The entry's text as it is (WordPiece and others: no bytes hidden in it).
    Plain,
}

/// Every `"type"` named in a serialised decoder (a `Sequence` lists its parts).
fn decoder_types(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(t)) = map.get("type") {
                out.push(t.clone());
            }
            for v in map.values() {
                decoder_types(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| decoder_types(v, out)),
        _ => {}
    }
}

/// The bytes of vocabulary entry `entry` spelt as `spelling`.
fn entry_bytes(entry: &str, spelling: Spelling) -> Vec<u8> {
    match spelling {
        Spelling::ByteLevel => bytes_of_token(entry),
        Spelling::Metaspace => match byte_of_hex_token(entry) {
            Some(b) => vec![b],
            None => entry.replace('\u{2581}', " ").into_bytes(),
        },
        Spelling::Plain => entry.as_bytes().to_vec(),
    }
}

/// The bytes of every token of a `tokenizers` tokenizer, id = index.
fn hugging_face_bytes(inner: &tokenizers::Tokenizer, size: usize) -> Result<Vec<TokenBytes>> {
    let mut types = Vec::new();
    if let Some(decoder) = inner.get_decoder() {
        let value = serde_json::to_value(decoder)
            .map_err(|e| Error::Input(format!("cannot read the tokenizer's decoder: {e}")))?;
        decoder_types(&value, &mut types);
    }
    let has = |t: &str| types.iter().any(|x| x == t);
    let spelling = if has("ByteLevel") {
        Spelling::ByteLevel
    } else if has("Metaspace") || has("ByteFallback") || has("Replace") {
        Spelling::Metaspace
    } else {
        Spelling::Plain
    };
    let mut out = vec![
        TokenBytes {
            bytes: Vec::new(),
            special: false,
        };
        size
    ];
    for (entry, id) in inner.get_vocab(false) {
        if let Some(slot) = out.get_mut(id as usize) {
            slot.bytes = entry_bytes(&entry, spelling);
        }
    }
    for (id, added) in inner.get_added_tokens_decoder() {
        if let Some(slot) = out.get_mut(id as usize) {
            *slot = TokenBytes {
                bytes: added.content.as_bytes().to_vec(),
                special: added.special,
            };
        }
    }
    Ok(out)
}

/// The bytes of every token of `tokenizer`'s vocabulary, id = index (see the module docs).
pub fn token_bytes(tokenizer: &DecoderTokenizer) -> Result<Vec<TokenBytes>> {
    let size = tokenizer.vocab_size();
    match tokenizer {
        DecoderTokenizer::Gguf(t) => (0..size as u32)
            .map(|id| {
                let bytes = t.token_bytes(id).ok_or_else(|| {
                    Error::Input(format!("token {id} has no bytes in the GGUF vocabulary"))
                })?;
                Ok(TokenBytes {
                    bytes: bytes.to_vec(),
                    special: t.is_special(id),
                })
            })
            .collect(),
        DecoderTokenizer::HuggingFace { inner, .. } => hugging_face_bytes(inner, size),
        DecoderTokenizer::Ours(b) => hugging_face_bytes(b.tokenizer(), size),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_map_back_to_bytes() {
        assert_eq!(entry_bytes("Ġthe", Spelling::ByteLevel), b" the");
        assert_eq!(entry_bytes("ĊĊ", Spelling::ByteLevel), b"\n\n");
        assert_eq!(entry_bytes("\u{2581}the", Spelling::Metaspace), b" the");
        assert_eq!(entry_bytes("<0x0A>", Spelling::Metaspace), b"\n");
        assert_eq!(entry_bytes("<0xE2>", Spelling::Metaspace), vec![0xe2]);
        assert_eq!(entry_bytes("##ing", Spelling::Plain), b"##ing");
    }
}
