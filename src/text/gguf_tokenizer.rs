//! The tokenizer stored in a GGUF file's metadata, rebuilt with the `tokenizers` crate.
//!
//! llama.cpp's keys (`llama-vocab.cpp`):
//! - `tokenizer.ggml.model`: the algorithm; `gpt2` (byte-level BPE) is the one read here.
//! - `tokenizer.ggml.tokens`: the vocabulary, id = index, in GPT-2's byte-level spelling (each
//!   byte as one printable character, a space as `Ġ`, a newline as `Ċ`).
//! - `tokenizer.ggml.merges`: the merge rules, highest priority first, each `"left right"`.
//! - `tokenizer.ggml.token_type`: per token 1 normal, 2 unknown, 3 control, 4 user-defined,
//!   5 unused, 6 byte. Control tokens (`<|im_start|>`, ...) are matched whole in the text,
//!   before any splitting, as the special tokens of a Hugging Face tokenizer are; user-defined
//!   ones likewise, as plain added tokens. Both are stored as plain text (llama.cpp's
//!   converter writes them so), and decode to that text's UTF-8, as in llama.cpp; the
//!   `tokenizers` decoder would pass them through the byte-level alphabet (the same for ASCII,
//!   as SmolLM2's are).
//! - `tokenizer.ggml.pre`: the name of the pre-tokenizer, the regular expressions that cut text
//!   into the chunks BPE merges within (absent in older files: then GPT-2's is used). Two are
//!   built here, as llama.cpp defines them:
//!   - `gpt2`: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`, which
//!     is the regex of the `tokenizers` crate's `ByteLevel` pre-tokenizer;
//!   - `smollm` (shared in llama.cpp with `starcoder`, `refact`, `command-r`, ...): `\p{N}` first,
//!     every digit its own chunk, then the GPT-2 regex. In `tokenizers` that is
//!     `Sequence[Digits(individual_digits), ByteLevel]`, the pre-tokenizer of SmolLM2's own
//!     `tokenizer.json`. (transformers' GGUF loader, in the versions read, cuts SmolLM2's text
//!     with the GPT-2 regex alone. No merge of this vocabulary joins a digit to anything, so
//!     the two agree on ASCII numbers, but not on a space before a non-ASCII numeral: ` ²` is
//!     `Ġ` + `Â²` here, as in llama.cpp, and `ĠÂ` + `²` there.)
//! - `tokenizer.ggml.bos_token_id`, `eos_token_id`, `padding_token_id`, `unknown_token_id`,
//!   `add_bos_token`; `tokenizer.chat_template`.
//!
//! [`GgufTokenizer::encode`] adds nothing to the text (no BOS): a chat prompt already holds its
//! special tokens, written by the chat template. [`GgufTokenizer::decode`] renders special
//! tokens as their text.

use super::TextError;
use crate::error::{Error, Result};
use crate::store::gguf::GgufFile;
use std::path::PathBuf;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::AddedToken;

/// `tokenizer.ggml.token_type` of a control token.
pub const TOKEN_TYPE_CONTROL: i64 = 3;
/// `tokenizer.ggml.token_type` of a user-defined token.
pub const TOKEN_TYPE_USER_DEFINED: i64 = 4;
/// The pre-tokenizer names understood.
pub const SUPPORTED_PRE: [&str; 2] = ["gpt2", "smollm"];

/// A byte-level BPE tokenizer from GGUF metadata.
pub struct GgufTokenizer {
    inner: tokenizers::Tokenizer,
    /// The bytes each token stands for (a control token's: its text).
    token_bytes: Vec<Vec<u8>>,
    special: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    pre: String,
    chat_template: Option<String>,
    path: PathBuf,
}

/// GPT-2's byte-level alphabet, inverted: the byte each of the 256 characters stands for.
/// Bytes `!`..=`~`, `¡`..=`¬` and `®`..=`ÿ` are their own character; the other 68, in byte
/// order, are U+0100 onwards (so a space is `Ġ` U+0120 and a newline `Ċ` U+010A).
fn byte_of_char(c: char) -> Option<u8> {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    let c = c as u32;
    if c < 0x100 {
        return printable(c).then_some(c as u8);
    }
    (0..=255u32)
        .filter(|&b| !printable(b))
        .nth(c.checked_sub(0x100)? as usize)
        .map(|b| b as u8)
}

/// The bytes a BPE vocabulary entry stands for: each character through the byte-level
/// alphabet, or, for a token not spelt in it, its UTF-8 (as the `tokenizers` ByteLevel decoder
/// does).
fn bytes_of_token(token: &str) -> Vec<u8> {
    token
        .chars()
        .map(byte_of_char)
        .collect::<Option<Vec<u8>>>()
        .unwrap_or_else(|| token.as_bytes().to_vec())
}

impl GgufTokenizer {
    /// Builds the tokenizer described by `file`'s metadata.
    pub fn from_gguf(file: &GgufFile) -> Result<GgufTokenizer> {
        let bad = |reason: String| {
            Error::Text(TextError::BadVocab {
                path: file.path().to_path_buf(),
                reason,
            })
        };
        let model: &str = file.require("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(bad(format!(
                "tokenizer.ggml.model is {model:?}; only \"gpt2\" (byte-level BPE) is supported"
            )));
        }
        let pre: &str = file.get("tokenizer.ggml.pre")?.unwrap_or("gpt2");
        let byte_level = PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true));
        let pre_tokenizer = match pre {
            "gpt2" => byte_level,
            "smollm" => PreTokenizerWrapper::Sequence(Sequence::new(vec![
                PreTokenizerWrapper::Digits(Digits::new(true)),
                byte_level,
            ])),
            other => {
                return Err(bad(format!(
                    "tokenizer.ggml.pre is {other:?}; supported: {}",
                    SUPPORTED_PRE.join(", ")
                )))
            }
        };

        let tokens: Vec<&str> = file.require("tokenizer.ggml.tokens")?;
        let n = tokens.len();
        let mut vocab = Vocab::default();
        for (id, &t) in tokens.iter().enumerate() {
            if let Some(first) = vocab.insert(t.to_string(), id as u32) {
                return Err(bad(format!(
                    "token {t:?} appears twice (ids {first} and {id})"
                )));
            }
        }
        let merges: Vec<&str> = file.require("tokenizer.ggml.merges")?;
        let merges = merges
            .iter()
            .enumerate()
            .map(|(i, m)| match m.split_once(' ') {
                Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains(' ') => {
                    Ok((a.to_string(), b.to_string()))
                }
                _ => Err(bad(format!(
                    "merge {i} {m:?} is not two tokens separated by one space"
                ))),
            })
            .collect::<Result<Vec<_>>>()?;
        let types: Vec<i64> = match file.get("tokenizer.ggml.token_type")? {
            Some(t) => t,
            None => vec![1; n],
        };
        if types.len() != n {
            return Err(bad(format!(
                "tokenizer.ggml.token_type has {} entries for {n} tokens",
                types.len()
            )));
        }

        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| bad(format!("cannot build the BPE model: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pre_tokenizer));
        inner.with_decoder(Some(ByteLevelDecoder::new(false, false, true)));
        let types = &types;
        let of_type = |ty: i64| (0..n).filter(move |&i| types[i] == ty);
        let special: Vec<u32> = of_type(TOKEN_TYPE_CONTROL).map(|i| i as u32).collect();
        let specials: Vec<AddedToken> = special
            .iter()
            .map(|&i| AddedToken::from(tokens[i as usize], true))
            .collect();
        inner.add_special_tokens(&specials);
        let user: Vec<AddedToken> = of_type(TOKEN_TYPE_USER_DEFINED)
            .map(|i| AddedToken::from(tokens[i], false).normalized(false))
            .collect();
        inner.add_tokens(&user);

        let id = |key: &str| -> Result<Option<u32>> {
            match file.get::<u32>(key)? {
                Some(i) if i as usize >= n => {
                    Err(bad(format!("{key} is {i}, past the {n} tokens")))
                }
                other => Ok(other),
            }
        };
        Ok(GgufTokenizer {
            token_bytes: (tokens.iter().zip(types))
                .map(|(t, &ty)| match ty {
                    TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED => t.as_bytes().to_vec(),
                    _ => bytes_of_token(t),
                })
                .collect(),
            inner,
            special,
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            pad: id("tokenizer.ggml.padding_token_id")?,
            add_bos: file.get("tokenizer.ggml.add_bos_token")?.unwrap_or(false),
            pre: pre.to_string(),
            chat_template: file.chat_template()?.map(str::to_string),
            path: file.path().to_path_buf(),
        })
    }

    /// The ids of `text`, special tokens written in it recognised; nothing is added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(|e| {
            Error::Input(format!(
                "{}: cannot tokenize {text:?}: {e}",
                self.path.display()
            ))
        })?;
        Ok(enc.get_ids().to_vec())
    }

    /// The bytes `ids` stand for (special tokens as their text). Not necessarily UTF-8: a
    /// character may be split across tokens, so streamed output should be cut here.
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for &id in ids {
            out.extend_from_slice(self.token_bytes(id).ok_or_else(|| {
                Error::Input(format!(
                    "token id {id} is outside the vocabulary of {} tokens",
                    self.vocab_size()
                ))
            })?);
        }
        Ok(out)
    }

    /// The text of `ids`, special tokens rendered; invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.decode_bytes(ids)?).into_owned())
    }

    /// The bytes of one token.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.token_bytes.get(id as usize).map(Vec::as_slice)
    }

    /// The id of a vocabulary entry (byte-level spelling, or a special token's text).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Number of tokens.
    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// The control tokens' ids (`tokenizer.ggml.token_type` 3), ascending.
    pub fn special_ids(&self) -> &[u32] {
        &self.special
    }

    /// Whether `id` is a control token.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.binary_search(&id).is_ok()
    }

    /// `tokenizer.ggml.bos_token_id`.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// `tokenizer.ggml.eos_token_id` (for a chat model, the end of a turn).
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// `tokenizer.ggml.padding_token_id`.
    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    /// `tokenizer.ggml.add_bos_token` (false when absent): whether a plain prompt should start
    /// with BOS. [`GgufTokenizer::encode`] never adds it.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// The pre-tokenizer's name (`tokenizer.ggml.pre`).
    pub fn pre_tokenizer(&self) -> &str {
        &self.pre
    }

    /// `tokenizer.chat_template`, the Jinja template that writes a conversation as a prompt.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The `tokenizers` tokenizer inside (to save as `tokenizer.json`, or compare).
    pub fn as_tokenizers(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_is_gpt2s() {
        assert_eq!(byte_of_char('Ġ'), Some(b' '));
        assert_eq!(byte_of_char('Ċ'), Some(b'\n'));
        assert_eq!(byte_of_char('ĉ'), Some(b'\t'));
        assert_eq!(byte_of_char('Ā'), Some(0));
        assert_eq!(byte_of_char('a'), Some(b'a'));
        assert_eq!(byte_of_char('ÿ'), Some(0xff));
        assert_eq!(byte_of_char('ł'), Some(0xa0));
        assert_eq!(byte_of_char('Ń'), Some(0xad));
        assert_eq!(byte_of_char(' '), None);
        assert_eq!(byte_of_char('ń'), None);
        // A bijection between 256 characters and the 256 bytes.
        let mut seen = [false; 256];
        for c in (0u32..0x200).filter_map(char::from_u32) {
            if let Some(b) = byte_of_char(c) {
                assert!(!seen[b as usize], "byte {b} twice");
                seen[b as usize] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(bytes_of_token("ĠHello"), b" Hello");
        assert_eq!(bytes_of_token("<|im_start|>"), b"<|im_start|>");
        assert_eq!(bytes_of_token("Ã©"), "é".as_bytes());
    }
}
