//! Byte-level BPE (GPT-2 style) with the `tokenizers` crate: trained on the text itself, saved
//! as `tokenizer.json` in the model directory. The ByteLevel pre-tokenizer maps every byte to a
//! printable character before merging, so any UTF-8 text is representable (the 256 byte symbols
//! are always in the vocabulary) and decoding gives the original text back byte for byte
//! (no prefix space is added, nothing is normalised).
//!
//! One special token, `<|endoftext|>`, starts every document: the training stream, the text a
//! perplexity is computed on and every generation prompt begin with it.

use super::TextError;
use crate::error::{Error, Result};
use std::path::Path;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::AddedToken;

/// The document separator (and start token).
pub const END_OF_TEXT: &str = "<|endoftext|>";
/// The smallest vocabulary: the 256 byte symbols and `<|endoftext|>`.
pub const MIN_VOCAB: usize = 257;
/// Texts are encoded in pieces of about this many bytes, cut where the cut cannot change the
/// pre-tokenization (see [`chunk_bounds`]).
const CHUNK_BYTES: usize = 1 << 15;

/// A byte-level BPE tokenizer.
pub struct Bpe {
    inner: tokenizers::Tokenizer,
    eot: u32,
}

fn bad(what: &str, reason: impl std::fmt::Display) -> Error {
    Error::Input(format!("{what}: {reason}"))
}

impl Bpe {
    fn with_model(model: BPE) -> tokenizers::Tokenizer {
        let mut tk = tokenizers::Tokenizer::new(model);
        // add_prefix_space false: decode(encode(text)) == text.
        tk.with_pre_tokenizer(Some(ByteLevel::new(false, false, true)));
        tk.with_decoder(Some(ByteLevelDecoder::new(false, false, true)));
        tk
    }

    fn from_tokenizer(inner: tokenizers::Tokenizer, what: &str) -> Result<Bpe> {
        let eot = inner
            .token_to_id(END_OF_TEXT)
            .ok_or_else(|| bad(what, format!("no {END_OF_TEXT} token")))?;
        Ok(Bpe { inner, eot })
    }

    /// Learns merges from `texts` (each a piece of the corpus; lines keep their `\n`) until the
    /// vocabulary has `vocab_size` entries (or no pair occurs twice).
    pub fn train<'a>(
        texts: impl Iterator<Item = &'a str> + Send,
        vocab_size: usize,
    ) -> Result<Bpe> {
        let inner = Self::train_with_specials(texts, vocab_size, &[END_OF_TEXT])?;
        Self::from_tokenizer(inner, "trained tokenizer")
    }

    /// The byte-level BPE tokenizer (pre-tokenizer and decoder as for [`Bpe`]) learnt from
    /// `texts` with `specials` as its special tokens: they get ids `0..specials.len()` in
    /// order, then come the 256 byte symbols and the merges, up to `vocab_size` entries.
    pub fn train_with_specials<'a>(
        texts: impl Iterator<Item = &'a str> + Send,
        vocab_size: usize,
        specials: &[&str],
    ) -> Result<tokenizers::Tokenizer> {
        let min_vocab = 256 + specials.len();
        if vocab_size < min_vocab {
            return Err(Error::Config(format!(
                "vocabulary size {vocab_size} is below {min_vocab} (256 bytes and {} special tokens)",
                specials.len()
            )));
        }
        let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
            .show_progress(false)
            .vocab_size(vocab_size)
            .min_frequency(2)
            .special_tokens(
                specials
                    .iter()
                    .map(|s| AddedToken::from(s.to_string(), true))
                    .collect(),
            )
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build()
            .into();
        let mut inner = Self::with_model(BPE::default());
        inner
            .train(&mut trainer, texts)
            .map_err(|e| bad("training the BPE tokenizer", e))?;
        for (id, special) in specials.iter().enumerate() {
            let got = inner.token_to_id(special);
            if got != Some(id as u32) {
                return Err(bad(
                    "trained tokenizer",
                    format!("special token {special:?} has id {got:?}, expected {id}"),
                ));
            }
        }
        Ok(inner)
    }

    /// Loads a `tokenizer.json` written by [`Bpe::save`], checked against the directory's
    /// checkpoint manifest when it has one ([`crate::store::read_file`]).
    pub fn load(path: &Path) -> Result<Bpe> {
        let bytes = crate::store::read_file(path).map_err(|e| match e {
            Error::Checkpoint { reason, .. } => Error::Text(TextError::BadVocab {
                path: path.to_path_buf(),
                reason,
            }),
            other => other,
        })?;
        Self::from_bytes(&bytes, path)
    }

    /// Parses `tokenizer.json` bytes read from `path` (named in errors): a tokenizer whose ids
    /// are below its size (see [`crate::text::vocab::parse_tokenizer`]) with `<|endoftext|>`.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Bpe> {
        let inner = super::vocab::parse_tokenizer(bytes, path)?;
        Self::from_tokenizer(inner, &path.display().to_string())
    }

    /// The bytes of `tokenizer.json` (what [`Bpe::save`] writes).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        self.inner
            .to_string(false)
            .map(String::into_bytes)
            .map_err(|e| bad(crate::store::TOKENIZER_FILE, e))
    }

    /// Stages `tokenizer.json` in a checkpoint save.
    pub fn write(&self, writer: &mut crate::store::CheckpointWriter) -> Result<()> {
        writer.add(crate::store::TOKENIZER_FILE, &self.to_bytes()?)
    }

    /// Writes `tokenizer.json` (through a temporary file and a rename).
    pub fn save(&self, path: &Path) -> Result<()> {
        let json = self
            .inner
            .to_string(false)
            .map_err(|e| bad(&path.display().to_string(), e))?;
        crate::store::write_atomic(path, json.as_bytes())
    }

    /// Vocabulary size, the special token included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn tokenizer(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The id of `<|endoftext|>`.
    pub fn eot(&self) -> u32 {
        self.eot
    }

    /// The ids of `text` (no special token added). Long texts are encoded in parallel pieces;
    /// the result equals encoding the whole text at once.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let bounds = chunk_bounds(text, CHUNK_BYTES);
        let pieces: Vec<&str> = bounds.windows(2).map(|w| &text[w[0]..w[1]]).collect();
        let encodings = self
            .inner
            .encode_batch(pieces, false)
            .map_err(|e| bad("encoding text", e))?;
        Ok(encodings
            .iter()
            .flat_map(|e| e.get_ids().iter().copied())
            .collect())
    }

    /// The text of `ids` (special tokens included, as their text). Invalid UTF-8 (a piece of a
    /// character) comes out as U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| bad("decoding ids", e))
    }
}

/// Byte offsets `0 = b₀ < b₁ < … = text.len()` cutting `text` into pieces of about `target`
/// bytes. A cut is made only after a `\n` that follows a non-space character and precedes one:
/// there the GPT-2 pre-tokenizer's regex splits anyway and no match spans the cut, so encoding
/// piece by piece gives the same ids as encoding the whole text.
pub fn chunk_bounds(text: &str, target: usize) -> Vec<usize> {
    let mut bounds = vec![0];
    let bytes = text.as_bytes();
    let mut last = 0;
    let mut prev_char: Option<char> = None;
    let mut iter = text.char_indices().peekable();
    while let Some((i, c)) = iter.next() {
        if c == '\n' && i + 1 - last >= target {
            let before_ok = prev_char.is_some_and(|p| !p.is_whitespace());
            let after_ok = iter.peek().is_some_and(|&(_, n)| !n.is_whitespace());
            if before_ok && after_ok {
                last = i + 1;
                bounds.push(last);
            }
        }
        prev_char = Some(c);
    }
    if *bounds.last().unwrap() != bytes.len() {
        bounds.push(bytes.len());
    }
    bounds
}
