//! Byte-level BPE (GPT-2 style) with the `tokenizers` crate: trained on the text itself, saved
//! as `tokenizer.json` in the model directory. The ByteLevel pre-tokenizer maps every byte to a
//! printable character before merging, so any UTF-8 text is representable (the 256 byte symbols
//! are always in the vocabulary) and decoding gives the original text back byte for byte
//! (no prefix space is added, nothing is normalised).
//!
//! One special token, `<|endoftext|>`, starts every document: the training stream, the text a
//! perplexity is computed on and every generation prompt begin with it.
//!
//! Learning stays near-linear in the corpus: the `tokenizers` trainer rewrites a whole word at
//! every merge that touches it (a shift of the word per occurrence), which is quadratic in a
//! word's length, and one line of 10^6 letters without a space is one word. So the learner sees
//! words of at most [`MAX_LEARNT_WORD`] byte symbols: a longer one is cut into pieces of that
//! length (as sentencepiece and Hugging Face bound the pieces they learn). Ordinary text has no
//! such word, so what it learns is unchanged; encoding is not affected.

use super::TextError;
use crate::error::{Error, Result};
use std::path::Path;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{
    AddedToken, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, Trainer,
};

/// The document separator (and start token).
pub const END_OF_TEXT: &str = "<|endoftext|>";
/// The smallest vocabulary: the 256 byte symbols and `<|endoftext|>`.
// Used outside the library only (feature `internals`).
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub const MIN_VOCAB: usize = 257;
/// Texts are encoded in pieces of about this many bytes, cut where the cut cannot change the
/// pre-tokenization (see [`chunk_bounds`]).
const CHUNK_BYTES: usize = 1 << 15;
/// The longest word, in byte symbols, that BPE learning considers (see the module docs).
pub const MAX_LEARNT_WORD: usize = 256;

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
        let mut trainer = BpeTrainerBuilder::new()
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
            .build();
        // What `tokenizers::Tokenizer::train` feeds the trainer (the ByteLevel pre-tokenizer's
        // words; no normalizer, no added tokens yet), long words cut.
        let pre_tokenizer = ByteLevel::new(false, false, true);
        trainer
            .feed(texts, |text| {
                let mut pre_tokenized = PreTokenizedString::from(text);
                pre_tokenizer.pre_tokenize(&mut pre_tokenized)?;
                Ok(pre_tokenized
                    .get_splits(OffsetReferential::Original, OffsetType::Byte)
                    .into_iter()
                    .flat_map(|(word, _, _)| learnt_pieces(word))
                    .collect())
            })
            .map_err(|e| bad("training the BPE tokenizer", e))?;
        let mut model = BPE::default();
        let learnt_specials = trainer
            .train(&mut model)
            .map_err(|e| bad("training the BPE tokenizer", e))?;
        let mut inner = Self::with_model(model);
        inner.add_special_tokens(&learnt_specials);
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
    /// checkpoint manifest when it has one (`crate::store::read_file`).
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
    /// are below its size (see `crate::text::vocab::parse_tokenizer`) with `<|endoftext|>`.
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

/// `word` (in the byte-level alphabet, one character per byte) cut into pieces of at most
/// [`MAX_LEARNT_WORD`] characters.
fn learnt_pieces(word: &str) -> Vec<String> {
    let chars: Vec<char> = word.chars().collect();
    if chars.len() <= MAX_LEARNT_WORD {
        return vec![word.to_string()];
    }
    chars
        .chunks(MAX_LEARNT_WORD)
        .map(|piece| piece.iter().collect())
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::models::TrainerWrapper;

    pub fn letters_for_timing(n: usize) -> String {
        letters(n, 1)
    }

    pub fn reference_for_timing(texts: &[&str], vocab_size: usize) -> String {
        reference(texts, vocab_size)
    }

    /// Letters from a fixed linear congruential generator.
    fn letters(n: usize, seed: u64) -> String {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (b'a' + ((x >> 33) % 26) as u8) as char
            })
            .collect()
    }

    /// The reference path: the `tokenizers` library's own `Tokenizer::train`, uncut words.
    fn reference(texts: &[&str], vocab_size: usize) -> String {
        let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
            .show_progress(false)
            .vocab_size(vocab_size)
            .min_frequency(2)
            .special_tokens(vec![AddedToken::from(END_OF_TEXT.to_string(), true)])
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build()
            .into();
        let mut tk = Bpe::with_model(BPE::default());
        tk.train(&mut trainer, texts.iter().copied()).unwrap();
        tk.to_string(false).unwrap()
    }

    #[test]
    fn learning_is_the_libraries_own_on_ordinary_text() {
        // Words of up to 256 symbols (the longest learnt whole: a space and 255 letters),
        // punctuation, numbers, spaces.
        let long_word = letters(MAX_LEARNT_WORD - 1, 7);
        let mut lines = Vec::new();
        for i in 0..300 {
            lines.push(format!(
                "The {} quick brown fox, number {i}, jumps over {}!  The lazy dog's {} bed.\n",
                ["red", "green", "blue"][i % 3],
                letters(3 + i % 9, i as u64),
                if i % 50 == 0 { &long_word } else { "warm" }
            ));
        }
        let texts: Vec<&str> = lines.iter().map(String::as_str).collect();
        for vocab_size in [300, 600] {
            let ours = Bpe::train(texts.iter().copied(), vocab_size).unwrap();
            let json = String::from_utf8(ours.to_bytes().unwrap()).unwrap();
            assert_eq!(json, reference(&texts, vocab_size), "vocab {vocab_size}");
        }
    }

    #[test]
    fn long_words_are_learnt_in_pieces() {
        assert_eq!(learnt_pieces("Ġab"), ["Ġab"]);
        let word = "Ġ".repeat(2 * MAX_LEARNT_WORD + 3);
        let pieces = learnt_pieces(&word);
        assert_eq!(pieces.len(), 3);
        assert_eq!(pieces[2], "ĠĠĠ");
        assert_eq!(pieces.concat(), word);
    }

    /// One line of 10^6 letters without a space (one word) learns in seconds, where the uncut
    /// word's time grows with the square of its length (see `timing`), and the learnt
    /// vocabulary encodes it back.
    #[test]
    fn a_million_letter_line_learns_in_seconds() {
        let line = letters(1_000_000, 1);
        let started = std::time::Instant::now();
        let bpe = Bpe::train(std::iter::once(line.as_str()), 2000).unwrap();
        let ids = bpe.encode(&line).unwrap();
        let took = started.elapsed();
        assert!(took.as_secs_f64() < 20.0, "took {took:?}");
        assert_eq!(bpe.vocab_size(), 2000);
        // Random letters: about 1.9 letters a token with 2000 tokens.
        assert!(ids.len() < line.len() * 3 / 5, "{} ids", ids.len());
        assert_eq!(bpe.decode(&ids).unwrap(), line);
    }
}

/// Learning times of a line of letters, the library's own training against ours:
/// `cargo test --lib text::bpe -- --ignored --nocapture` (sizes in `BPE_TIMES`, default
/// `100000,300000,1000000`; the library's path is skipped above 300000: it runs for many
/// minutes).
#[cfg(test)]
mod timing {
    #[test]
    #[ignore]
    fn learning_times() {
        let sizes = std::env::var("BPE_TIMES").unwrap_or("100000,300000,1000000".into());
        for n in sizes.split(',').map(|s| s.trim().parse::<usize>().unwrap()) {
            let line = super::tests::letters_for_timing(n);
            let t = std::time::Instant::now();
            super::Bpe::train(std::iter::once(line.as_str()), 2000).unwrap();
            let ours = t.elapsed().as_secs_f64();
            let theirs = (n <= 300_000).then(|| {
                let t = std::time::Instant::now();
                super::tests::reference_for_timing(&[&line], 2000);
                t.elapsed().as_secs_f64()
            });
            eprintln!("{n} letters: ours {ours:.2} s, tokenizers' own {theirs:?} s");
        }
    }
}
