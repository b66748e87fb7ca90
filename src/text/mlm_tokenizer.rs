//! The vocabulary of a masked-LM encoder trained here: the byte-level BPE of `train-lm`
//! ([`super::bpe`], learnt on the training text) with BERT's four special tokens first —
//! `[PAD]` 0, `[CLS]` 1, `[SEP]` 2, `[MASK]` 3 — and BERT's template: a sentence encodes as
//! `[CLS] … [SEP]`. Saved as `tokenizer.json` (with that template as its post-processor), so
//! [`super::tokenizer::Tokenizer`] — what `embed` loads — encodes sentences as training saw
//! them.

use crate::error::{Error, Result};
use std::path::Path;
use tokenizers::processors::template::TemplateProcessing;

/// The special tokens, in id order.
pub const SPECIALS: [&str; 4] = ["[PAD]", "[CLS]", "[SEP]", "[MASK]"];
/// `[CLS]`'s id.
pub const CLS: u32 = 1;
/// `[SEP]`'s id.
pub const SEP: u32 = 2;
/// `[MASK]`'s id.
pub const MASK: u32 = 3;
/// Ids below this are special (never chosen for prediction, never drawn as random tokens).
pub const N_SPECIAL: u32 = 4;

/// A byte-level BPE with BERT's specials and template.
pub struct MlmTokenizer {
    inner: tokenizers::Tokenizer,
}

fn bad(what: &str, reason: impl std::fmt::Display) -> Error {
    Error::Input(format!("{what}: {reason}"))
}

impl MlmTokenizer {
    /// Learns a BPE of `vocab_size` entries (at least 260: the specials and 256 bytes) from
    /// `texts` (pieces of the corpus, lines with their `\n`).
    pub fn train<'a>(
        texts: impl Iterator<Item = &'a str> + Send,
        vocab_size: usize,
    ) -> Result<MlmTokenizer> {
        let mut inner = super::bpe::Bpe::train_with_specials(texts, vocab_size, &SPECIALS)?;
        let template = TemplateProcessing::builder()
            .try_single("[CLS] $0 [SEP]")
            .and_then(|b| b.try_pair("[CLS] $A [SEP] $B:1 [SEP]:1"))
            .map_err(|e| bad("BERT's template", e))?
            .special_tokens(vec![("[CLS]", CLS), ("[SEP]", SEP)])
            .build()
            .map_err(|e| bad("BERT's template", e))?;
        inner.with_post_processor(Some(template));
        Ok(MlmTokenizer { inner })
    }

    /// Loads the `tokenizer.json` of a masked-LM directory (checked against its manifest),
    /// refusing one whose special tokens are not BERT's four at ids 0..4.
    pub fn load(path: &Path) -> Result<MlmTokenizer> {
        let bytes = crate::store::read_file(path)?;
        let inner = super::vocab::parse_tokenizer(&bytes, path)?;
        for (id, s) in SPECIALS.iter().enumerate() {
            if inner.token_to_id(s) != Some(id as u32) {
                return Err(bad(
                    &path.display().to_string(),
                    format!("not a masked-LM vocabulary: {s} is not token {id}"),
                ));
            }
        }
        Ok(MlmTokenizer { inner })
    }

    /// Vocabulary size, specials included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The ids of `text` without special tokens (the training stream): a special token's text
    /// inside `text` (`[MASK]`, ...) is dropped.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        let bounds = super::bpe::chunk_bounds(text, 1 << 15);
        let pieces: Vec<&str> = bounds.windows(2).map(|w| &text[w[0]..w[1]]).collect();
        let encodings = self
            .inner
            .encode_batch(pieces, false)
            .map_err(|e| bad("encoding text", e))?;
        Ok(encodings
            .iter()
            .flat_map(|e| e.get_ids().iter().copied())
            .filter(|&id| id >= N_SPECIAL)
            .collect())
    }

    /// The `tokenizer.json` text.
    pub fn to_json(&self) -> Result<String> {
        self.inner
            .to_string(false)
            .map_err(|e| bad(crate::store::TOKENIZER_FILE, e))
    }

    /// Stages `tokenizer.json` in a checkpoint save.
    pub fn write(&self, writer: &mut crate::store::CheckpointWriter) -> Result<()> {
        writer.add(crate::store::TOKENIZER_FILE, self.to_json()?.as_bytes())
    }
}
