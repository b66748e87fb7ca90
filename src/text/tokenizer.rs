//! Hugging Face `tokenizer.json` files (the `tokenizers` crate), for pretrained models: a
//! sentence in, word-piece ids with the model's special tokens out, truncated to a maximum
//! length. The file's own padding and truncation settings are replaced by ours.

use super::TextError;
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use tokenizers::{TruncationParams, TruncationStrategy};

/// A loaded `tokenizer.json`, encoding one sentence at a time.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    max_len: usize,
}

impl Tokenizer {
    /// Loads `path` (a leading UTF-8 byte order mark accepted; every id below the tokenizer's
    /// size); encodings keep at most `max_len` ids, special tokens included.
    pub fn load(path: &Path, max_len: usize) -> Result<Tokenizer> {
        if !path.is_file() {
            return Err(Error::Text(TextError::BadVocab {
                path: path.to_path_buf(),
                reason: "file not found".into(),
            }));
        }
        let bytes = crate::store::read_file(path)?;
        Self::from_bytes(&bytes, path, max_len)
    }

    /// [`Tokenizer::load`] of a `tokenizer.json` already read (from `path`, named in errors).
    pub fn from_bytes(bytes: &[u8], path: &Path, max_len: usize) -> Result<Tokenizer> {
        let bad = |reason: String| {
            Error::Text(TextError::BadVocab {
                path: path.to_path_buf(),
                reason,
            })
        };
        // Ids below the size: no encoding can reach past the vocabulary.
        let mut inner = super::vocab::parse_tokenizer(bytes, path)?;
        // Sentences are padded by the caller, per batch; the file may ask for fixed padding.
        inner.with_padding(None);
        inner
            .with_truncation(Some(TruncationParams {
                max_length: max_len,
                strategy: TruncationStrategy::LongestFirst,
                ..TruncationParams::default()
            }))
            .map_err(|e| bad(format!("cannot truncate to {max_len} tokens: {e}")))?;
        Ok(Tokenizer {
            inner,
            path: path.to_path_buf(),
            max_len,
        })
    }

    /// The ids of `text` with the special tokens (`[CLS] … [SEP]` for BERT), at most
    /// [`Tokenizer::max_len`] of them.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, true).map_err(|e| {
            Error::Input(format!(
                "{}: cannot tokenize {text:?}: {e}",
                self.path.display()
            ))
        })?;
        Ok(enc.get_ids().to_vec())
    }

    /// The largest number of ids [`Tokenizer::encode`] returns.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}
