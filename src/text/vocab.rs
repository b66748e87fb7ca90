//! A vocabulary: the table between tokens (characters or words) and ids.
//!
//! Ids 0..=3 are always the specials of [`crate::text`]: [`PAD`] `<pad>`, [`BOS`] `<s>`,
//! [`EOS`] `</s>` and [`UNK`] `<unk>`. A vocabulary is saved as JSON,
//! `{"level": "char", "tokens": ["<pad>", "<s>", "</s>", "<unk>", ...]}`, where the position of
//! a token is its id.
//!
//! A byte-level BPE vocabulary ([`VocabLevel::Bpe`], see [`Vocab::build_bpe`]) is a
//! `tokenizers` tokenizer whose special tokens are the four specials with the same ids. It is
//! saved as two files in one directory: `vocab.json` holds
//! `{"level": "bpe", "tokenizer": "tokenizer.json"}` and the tokenizer itself is
//! [`TOKENIZER_FILE`] next to it; [`Vocab::load`] of `vocab.json` reads both.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::bpe::Bpe;
use super::fairseq::FairseqTokenizer;
use super::marian::MarianTokenizer;
use super::pretrained::Pretrained;
use super::TextError;
use super::{BOS, EOS, PAD, UNK};
use crate::store::{TOKENIZER_FILE, VOCAB_FILE};

/// The spellings of the special tokens, in id order.
pub const SPECIAL_TOKENS: [&str; 4] = ["<pad>", "<s>", "</s>", "<unk>"];

/// What one token is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VocabLevel {
    /// Every Unicode scalar value (Rust `char`), space included, is one token.
    Char,
    /// Whitespace-separated words are tokens; decoding joins them with one space.
    Word,
    /// Byte-level BPE subwords (GPT-2 style): any text is representable, decoding restores it.
    Bpe,
    /// A pretrained model's SentencePiece pieces (Marian's `source.spm`, `target.spm` and
    /// `vocab.json`, see `text::marian`; fairseq's `sentencepiece.bpe.model` and dictionary, see
    /// `text::fairseq`): loaded with the model, never written as ours.
    SentencePiece,
}

/// The on-disk form of a [`Vocab`]; deserialising goes through it so every loaded vocabulary
/// is validated.
#[derive(Deserialize)]
struct VocabFile {
    level: VocabLevel,
    #[serde(default)]
    tokens: Vec<String>,
    /// BPE only: the tokenizer file, relative to the directory of `vocab.json`.
    #[serde(default)]
    tokenizer: Option<String>,
}

/// A token table: `tokens[id]` is the token of `id`, and the first four ids are the specials.
/// For BPE, `tokens[id]` is the text of the subword `id` alone (for display) and the
/// tokenizer does the encoding and decoding.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(try_from = "VocabFile")]
pub struct Vocab {
    level: VocabLevel,
    tokens: Vec<String>,
    /// Token -> id, the inverse of `tokens` (char and word levels).
    #[serde(skip)]
    ids_by_token: HashMap<String, u32>,
    /// The byte-level BPE tokenizer (BPE level only).
    #[serde(skip)]
    bpe: Option<Box<tokenizers::Tokenizer>>,
    /// A pretrained model's tokenizer (SentencePiece level only).
    #[serde(skip)]
    pretrained: Option<Pretrained>,
}

impl PartialEq for Vocab {
    fn eq(&self, other: &Self) -> bool {
        let tokenizer_json = |vocab: &Self| {
            vocab
                .bpe
                .as_ref()
                .map(|tokenizer| tokenizer.to_string(false).unwrap_or_default())
        };
        self.level == other.level
            && self.tokens == other.tokens
            && tokenizer_json(self) == tokenizer_json(other)
    }
}

impl Eq for Vocab {}

impl TryFrom<VocabFile> for Vocab {
    type Error = String;

    fn try_from(file: VocabFile) -> Result<Self, Self::Error> {
        if file.level == VocabLevel::SentencePiece {
            return Err("a SentencePiece vocabulary is a Marian model's (source.spm, \
                        target.spm and its vocab.json), read with the model"
                .into());
        }
        if file.level == VocabLevel::Bpe {
            return Err(format!(
                "a BPE vocabulary lives in its tokenizer file ({}); load it with Vocab::load",
                file.tokenizer.as_deref().unwrap_or(TOKENIZER_FILE)
            ));
        }
        Vocab::from_tokens(file.level, file.tokens)
    }
}

impl Vocab {
    /// Builds a vocabulary from `texts` (sentences or lines), keeping the tokens seen at least
    /// `min_count` times (0 and 1 both keep every token).
    ///
    /// Ordering is deterministic: specials first, then by descending count, ties broken by
    /// the token string. Text that spells a special token (`"<unk>"` as a word) is not counted:
    /// the specials already have their ids.
    pub fn build<'a>(
        texts: impl IntoIterator<Item = &'a str>,
        level: VocabLevel,
        min_count: usize,
    ) -> Vocab {
        let mut counts: HashMap<String, usize> = HashMap::new();
        let mut count_token = |token: &str| {
            if let Some(count) = counts.get_mut(token) {
                *count += 1;
            } else {
                counts.insert(token.to_string(), 1);
            }
        };
        for text in texts {
            match level {
                VocabLevel::Char => {
                    let mut buffer = [0u8; 4];
                    for ch in text.chars() {
                        count_token(ch.encode_utf8(&mut buffer));
                    }
                }
                VocabLevel::Word => text.split_whitespace().for_each(&mut count_token),
                VocabLevel::Bpe => panic!("BPE vocabularies are built with Vocab::build_bpe"),
                VocabLevel::SentencePiece => {
                    panic!("SentencePiece vocabularies come with a Marian model")
                }
            }
        }
        let mut counted: Vec<(String, usize)> = counts
            .into_iter()
            .filter(|(token, count)| {
                *count >= min_count && !SPECIAL_TOKENS.contains(&token.as_str())
            })
            .collect();
        counted.sort_by(|(token_a, count_a), (token_b, count_b)| {
            count_b.cmp(count_a).then_with(|| token_a.cmp(token_b))
        });
        let tokens = SPECIAL_TOKENS
            .iter()
            .map(|special| special.to_string())
            .chain(counted.into_iter().map(|(token, _)| token))
            .collect();
        Vocab::from_tokens(level, tokens).expect("built vocabularies are valid by construction")
    }

    /// A byte-level BPE vocabulary of (at most) `vocab_size` entries learnt from `texts`
    /// (source and target sentences together for a joint vocabulary); the specials keep ids
    /// 0..=3.
    pub fn build_bpe<'a>(
        texts: impl Iterator<Item = &'a str> + Send,
        vocab_size: usize,
    ) -> crate::error::Result<Vocab> {
        let tokenizer = Bpe::train_with_specials(texts, vocab_size, &SPECIAL_TOKENS)?;
        Ok(Vocab::from_tokenizer(tokenizer))
    }

    /// Wraps a tokenizer whose first four ids are the specials (checked by the caller).
    fn from_tokenizer(mut tokenizer: tokenizers::Tokenizer) -> Vocab {
        // Text that spells a special is encoded as plain bytes: text never injects control
        // tokens.
        tokenizer.set_encode_special_tokens(true);
        let size = tokenizer.get_vocab_size(true) as u32;
        let tokens = (0..size)
            .map(|id| match SPECIAL_TOKENS.get(id as usize) {
                Some(special) => special.to_string(),
                None => tokenizer.decode(&[id], false).unwrap_or_default(),
            })
            .collect();
        Vocab {
            level: VocabLevel::Bpe,
            tokens,
            ids_by_token: HashMap::new(),
            bpe: Some(Box::new(tokenizer)),
            pretrained: None,
        }
    }

    /// A vocabulary from its token list, checked: specials in place, no duplicates, and each
    /// token a possible token of `level` (one char, or one non-empty word without whitespace).
    fn from_tokens(level: VocabLevel, tokens: Vec<String>) -> Result<Vocab, String> {
        if tokens.len() < SPECIAL_TOKENS.len() {
            return Err(format!(
                "{} tokens, fewer than the {} specials",
                tokens.len(),
                SPECIAL_TOKENS.len()
            ));
        }
        if u32::try_from(tokens.len()).is_err() {
            return Err(format!("{} tokens do not fit u32 ids", tokens.len()));
        }
        for (id, special) in SPECIAL_TOKENS.iter().enumerate() {
            if tokens[id] != *special {
                return Err(format!(
                    "token {id} is {:?}, expected the special {special:?}",
                    tokens[id]
                ));
            }
        }
        let mut seen = HashSet::with_capacity(tokens.len());
        for (id, token) in tokens.iter().enumerate() {
            if !seen.insert(token.as_str()) {
                return Err(format!("duplicate token {token:?} at id {id}"));
            }
            if id < SPECIAL_TOKENS.len() {
                continue;
            }
            let valid = match level {
                VocabLevel::Char => token.chars().count() == 1,
                VocabLevel::Word => !token.is_empty() && !token.chars().any(char::is_whitespace),
                VocabLevel::Bpe | VocabLevel::SentencePiece => false,
            };
            if !valid {
                let expected = match level {
                    VocabLevel::Char => "exactly one character",
                    VocabLevel::Word => "a non-empty word without whitespace",
                    VocabLevel::Bpe | VocabLevel::SentencePiece => "a token of a tokenizer file",
                };
                return Err(format!("token {id} ({token:?}) is not {expected}"));
            }
        }
        let ids_by_token = tokens
            .iter()
            .enumerate()
            .map(|(id, token)| (token.clone(), id as u32))
            .collect();
        Ok(Vocab {
            level,
            tokens,
            ids_by_token,
            bpe: None,
            pretrained: None,
        })
    }

    /// The vocabulary of a Marian model: its tokenizer encodes and decodes, and `tokens` are
    /// its pieces in our id order.
    pub fn from_marian(tokenizer: MarianTokenizer) -> Vocab {
        Vocab::from_pretrained(Pretrained::Marian(std::sync::Arc::new(tokenizer)))
    }

    /// The vocabulary of an M2M100 / NLLB model (see `text::fairseq`).
    pub fn from_fairseq(tokenizer: FairseqTokenizer) -> Vocab {
        Vocab::from_pretrained(Pretrained::Fairseq(std::sync::Arc::new(tokenizer)))
    }

    /// The vocabulary of a CTranslate2 model directory (see `text::ct2_tokenizer`).
    pub fn from_ct2(tokenizer: super::ct2_tokenizer::Ct2Tokenizer) -> Vocab {
        Vocab::from_pretrained(Pretrained::Ct2(std::sync::Arc::new(tokenizer)))
    }

    /// The CTranslate2 tokenizer, when this is a CTranslate2 model's vocabulary.
    pub fn ct2(&self) -> Option<&super::ct2_tokenizer::Ct2Tokenizer> {
        match &self.pretrained {
            Some(Pretrained::Ct2(t)) => Some(t),
            _ => None,
        }
    }

    /// The vocabulary of a BART model (see `text::bart_tokenizer`).
    pub fn from_bart(tokenizer: super::bart_tokenizer::BartTokenizer) -> Vocab {
        Vocab::from_pretrained(Pretrained::Bart(std::sync::Arc::new(tokenizer)))
    }

    /// The BART tokenizer, when this is a BART model's vocabulary.
    pub fn bart(&self) -> Option<&super::bart_tokenizer::BartTokenizer> {
        match &self.pretrained {
            Some(Pretrained::Bart(t)) => Some(t),
            _ => None,
        }
    }

    /// The vocabulary of a T5 / mT5 / MADLAD-400 model (see `text::t5_tokenizer`).
    pub fn from_t5(tokenizer: super::t5_tokenizer::T5Tokenizer) -> Vocab {
        Vocab::from_pretrained(Pretrained::T5(std::sync::Arc::new(tokenizer)))
    }

    /// The T5 tokenizer, when this is a T5 model's vocabulary.
    pub fn t5(&self) -> Option<&super::t5_tokenizer::T5Tokenizer> {
        match &self.pretrained {
            Some(Pretrained::T5(t)) => Some(t),
            _ => None,
        }
    }

    fn from_pretrained(pretrained: Pretrained) -> Vocab {
        let tokens = (0..pretrained.len() as u32)
            .map(|id| pretrained.token(id).unwrap_or_default().to_string())
            .collect();
        Vocab {
            level: VocabLevel::SentencePiece,
            tokens,
            ids_by_token: HashMap::new(),
            bpe: None,
            pretrained: Some(pretrained),
        }
    }

    /// The multilingual tokenizer, when this is an M2M100 / NLLB vocabulary.
    pub fn fairseq(&self) -> Option<&FairseqTokenizer> {
        match &self.pretrained {
            Some(Pretrained::Fairseq(tokenizer)) => Some(tokenizer),
            _ => None,
        }
    }

    /// The id of one token; unknown tokens and the spellings of PAD/BOS/EOS give [`UNK`], so
    /// text never injects control tokens.
    fn id_of(&self, token: &str) -> u32 {
        match self.ids_by_token.get(token) {
            Some(&id) if id > UNK => id,
            _ => UNK,
        }
    }

    /// Token ids of `text`, no specials added; tokens outside the vocabulary become `UNK`.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        if let Some(tokenizer) = &self.pretrained {
            return tokenizer.encode(text);
        }
        if let Some(tokenizer) = &self.bpe {
            // Byte-level BPE represents every text; the error arm is unreachable in practice.
            return tokenizer
                .encode(text, false)
                .map(|encoding| encoding.get_ids().to_vec())
                .unwrap_or_else(|_| vec![UNK]);
        }
        match self.level {
            VocabLevel::Char => {
                let mut buffer = [0u8; 4];
                text.chars()
                    .map(|ch| self.id_of(ch.encode_utf8(&mut buffer)))
                    .collect()
            }
            VocabLevel::Word => text
                .split_whitespace()
                .map(|word| self.id_of(word))
                .collect(),
            VocabLevel::Bpe | VocabLevel::SentencePiece => {
                unreachable!("a BPE or SentencePiece vocabulary has its tokenizer")
            }
        }
    }

    /// Text of `ids`: stops at the first `EOS`, skips `PAD` and `BOS`; `UNK` and ids
    /// outside the vocabulary render as `<unk>`. Characters are concatenated, words joined
    /// with one space. BPE: the specials (and ids outside the vocabulary) are skipped and the
    /// subwords' bytes concatenated, so the text comes back as it was.
    pub fn decode(&self, ids: &[u32]) -> String {
        if let Some(tokenizer) = &self.pretrained {
            let kept: Vec<u32> = ids.iter().copied().take_while(|&id| id != EOS).collect();
            return tokenizer.decode(&kept);
        }
        if let Some(tokenizer) = &self.bpe {
            let kept: Vec<u32> = ids
                .iter()
                .copied()
                .take_while(|&id| id != EOS)
                .filter(|&id| id > UNK && (id as usize) < self.tokens.len())
                .collect();
            return tokenizer.decode(&kept, true).unwrap_or_default();
        }
        let pieces = ids
            .iter()
            .take_while(|&&id| id != EOS)
            .filter(|&&id| id != PAD && id != BOS)
            .map(|&id| self.token(id).unwrap_or(SPECIAL_TOKENS[UNK as usize]));
        match self.level {
            VocabLevel::Char => pieces.collect(),
            VocabLevel::Word => pieces.collect::<Vec<_>>().join(" "),
            VocabLevel::Bpe | VocabLevel::SentencePiece => {
                unreachable!("a BPE or SentencePiece vocabulary has its tokenizer")
            }
        }
    }

    /// A Marian model's tokenizer, when this is its vocabulary.
    pub fn marian(&self) -> Option<&MarianTokenizer> {
        match &self.pretrained {
            Some(Pretrained::Marian(t)) => Some(t),
            _ => None,
        }
    }

    /// Number of tokens, specials included.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Never true for a valid vocabulary (the specials are always there); provided for API
    /// completeness.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Whether tokens are characters or words.
    pub fn level(&self) -> VocabLevel {
        self.level
    }

    /// The token of `id`, if `id` is in the vocabulary.
    pub fn token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The files of the vocabulary as (name, bytes): `VOCAB_FILE` with its JSON and, for
    /// BPE, `TOKENIZER_FILE` (what `vocab.json` points to), for a checkpoint save.
    pub fn files(&self) -> Result<Vec<(&'static str, Vec<u8>)>, TextError> {
        if let Some(pretrained) = &self.pretrained {
            return Err(TextError::Write {
                path: PathBuf::from(VOCAB_FILE),
                cause: std::io::Error::other(format!(
                    "a pretrained model's SentencePiece vocabulary is not written as ours (copy \
                     {} instead)",
                    pretrained.files()
                )),
            });
        }
        let mut files = Vec::new();
        let json = match &self.bpe {
            Some(tokenizer) => {
                let tokenizer_json = tokenizer.to_string(true).map_err(|e| TextError::Write {
                    path: PathBuf::from(TOKENIZER_FILE),
                    cause: std::io::Error::other(e.to_string()),
                })?;
                files.push((TOKENIZER_FILE, tokenizer_json.into_bytes()));
                serde_json::to_string_pretty(&serde_json::json!({
                    "level": "bpe",
                    "tokenizer": TOKENIZER_FILE,
                }))
                .expect("a JSON value always serialises")
            }
            None => serde_json::to_string_pretty(self)
                .expect("a vocabulary of strings always serialises"),
        };
        files.push((VOCAB_FILE, json.into_bytes()));
        Ok(files)
    }

    /// Stages the vocabulary's [`Vocab::files`] in a checkpoint save.
    pub fn write(&self, writer: &mut crate::store::CheckpointWriter) -> crate::error::Result<()> {
        for (name, bytes) in self.files()? {
            writer.add(name, &bytes)?;
        }
        Ok(())
    }

    /// Writes the vocabulary as JSON to `path`, through `path.tmp` and a rename so a crash
    /// never leaves a half-written file. BPE: also writes `TOKENIZER_FILE` next to `path`
    /// (first, so `vocab.json` never points to a missing tokenizer).
    pub fn save(&self, path: &Path) -> Result<(), TextError> {
        for (name, bytes) in self.files()? {
            let target = if name == VOCAB_FILE {
                path.to_path_buf()
            } else {
                path.with_file_name(name)
            };
            write_atomic(&target, &bytes)?;
        }
        Ok(())
    }

    /// Reads and validates a vocabulary written by [`Vocab::save`] (for BPE, `vocab.json` and
    /// the tokenizer file it names, in the same directory), each checked against the
    /// directory's checkpoint manifest when it has one (`crate::store::read_file`). A
    /// leading UTF-8 byte order mark is accepted.
    pub fn load(path: &Path) -> Result<Vocab, TextError> {
        let read = |path: &Path| {
            crate::store::read_file(path).map_err(|e| match e {
                crate::error::Error::Checkpoint { reason, .. } if reason == "file not found" => {
                    TextError::Io {
                        path: path.to_path_buf(),
                        cause: std::io::Error::new(std::io::ErrorKind::NotFound, "file not found"),
                    }
                }
                other => TextError::BadVocab {
                    path: path.to_path_buf(),
                    reason: other.to_string(),
                },
            })
        };
        let json = read(path)?;
        Vocab::from_bytes(&json, path, |name| {
            read(&path.with_file_name(name)).map_err(|e| match e {
                TextError::Io {
                    path: tokenizer, ..
                } => TextError::BadVocab {
                    path: tokenizer,
                    reason: format!("tokenizer file not found (named by {})", path.display()),
                },
                other => other,
            })
        })
    }

    /// Parses `vocab.json` bytes read from `path` (named in errors); a BPE vocabulary's
    /// tokenizer file is read with `read_tokenizer(name)`.
    pub fn from_bytes(
        json: &[u8],
        path: &Path,
        read_tokenizer: impl FnOnce(&str) -> Result<Vec<u8>, TextError>,
    ) -> Result<Vocab, TextError> {
        let bad = |path: &Path, reason: String| TextError::BadVocab {
            path: path.to_path_buf(),
            reason,
        };
        let file: VocabFile = serde_json::from_slice(crate::store::strip_bom(json))
            .map_err(|error| bad(path, error.to_string()))?;
        if file.level != VocabLevel::Bpe {
            return Vocab::try_from(file).map_err(|reason| bad(path, reason));
        }
        let name = file.tokenizer.as_deref().unwrap_or(TOKENIZER_FILE);
        let tokenizer_path = path.with_file_name(name);
        if name.contains(['/', '\\']) || name.is_empty() || name == "." || name == ".." {
            return Err(bad(
                path,
                format!("tokenizer {name:?} must be a file name in the same directory"),
            ));
        }
        let bytes = read_tokenizer(name)?;
        let tokenizer = parse_tokenizer(&bytes, &tokenizer_path)?;
        for (id, special) in SPECIAL_TOKENS.iter().enumerate() {
            let got = tokenizer.token_to_id(special);
            if got != Some(id as u32) {
                return Err(bad(
                    &tokenizer_path,
                    format!("special token {special:?} has id {got:?}, expected {id}"),
                ));
            }
        }
        Ok(Vocab::from_tokenizer(tokenizer))
    }
}

/// Parses `tokenizer.json` bytes read from `path` (a leading UTF-8 byte order mark accepted)
/// and checks that its ids are `0..n` for its `n` tokens, so that no encoding can produce an id
/// at or past the vocabulary size.
pub fn parse_tokenizer(bytes: &[u8], path: &Path) -> Result<tokenizers::Tokenizer, TextError> {
    let bad = |reason: String| TextError::BadVocab {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::str::from_utf8(crate::store::strip_bom(bytes))
        .map_err(|e| bad(format!("not UTF-8: {e}")))?;
    // The JSON is checked first: the tokenizers crate (0.22) panics instead of returning an
    // error when its decoder section is not valid JSON; a panic it still has on a valid
    // document is turned into an error too.
    serde_json::from_str::<serde::de::IgnoredAny>(text)
        .map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let parsed = std::panic::catch_unwind(|| text.parse::<tokenizers::Tokenizer>())
        .map_err(|_| bad("the tokenizers crate failed on this file".into()))?;
    let tokenizer = parsed.map_err(|e| bad(format!("{e}")))?;
    let size = tokenizer.get_vocab_size(true);
    if let Some((token, id)) = tokenizer
        .get_vocab(true)
        .into_iter()
        .max_by_key(|(_, id)| *id)
        .filter(|(_, id)| *id as usize >= size)
    {
        return Err(bad(format!(
            "token {token:?} has id {id}, but the tokenizer has {size} tokens (ids must be below \
             the vocabulary size)"
        )));
    }
    Ok(tokenizer)
}

/// Writes `contents` to `path` through `path.tmp` and a rename.
fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), TextError> {
    let mut temporary_name = OsString::from(path.as_os_str());
    temporary_name.push(".tmp");
    let temporary_path = PathBuf::from(temporary_name);
    std::fs::write(&temporary_path, contents).map_err(|cause| TextError::Write {
        path: temporary_path.clone(),
        cause,
    })?;
    std::fs::rename(&temporary_path, path).map_err(|cause| TextError::Write {
        path: path.to_path_buf(),
        cause,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_orders_by_count_then_token() {
        let vocab = Vocab::build(["abca", "b a"], VocabLevel::Char, 1);
        // a:3, b:2, c:1, ' ':1 -> ties broken by string (' ' < 'c').
        let tokens: Vec<&str> = (0..vocab.len() as u32)
            .map(|id| vocab.token(id).unwrap())
            .collect();
        assert_eq!(
            tokens,
            ["<pad>", "<s>", "</s>", "<unk>", "a", "b", " ", "c"]
        );
        let pruned = Vocab::build(["abca", "b a"], VocabLevel::Char, 2);
        assert_eq!(pruned.len(), 6);
        assert_eq!(pruned.token(5), Some("b"));
        assert_eq!(pruned.token(6), None);
    }

    #[test]
    fn char_round_trip_and_unknowns() {
        let vocab = Vocab::build(["drei hundert", "zwölf"], VocabLevel::Char, 1);
        let ids = vocab.encode("zwölf drei");
        assert!(ids.iter().all(|&id| id > UNK));
        assert_eq!(vocab.decode(&ids), "zwölf drei");
        let with_unknown = vocab.encode("dx");
        assert_eq!(with_unknown.len(), 2);
        assert_eq!(with_unknown[1], UNK);
        assert_eq!(vocab.decode(&with_unknown), "d<unk>");
        // Specials: BOS and PAD skipped, stop at EOS; ids out of range render as <unk>.
        let d = vocab.encode("d")[0];
        assert_eq!(vocab.decode(&[BOS, d, PAD, 9999, EOS, d]), "d<unk>");
    }

    #[test]
    fn word_level_joins_with_one_space_and_never_injects_specials() {
        let vocab = Vocab::build(["one two", "two  three", "</s> <unk>"], VocabLevel::Word, 1);
        assert_eq!(vocab.len(), 4 + 3);
        assert_eq!(vocab.token(4), Some("two"));
        let ids = vocab.encode("  three\ttwo one four ");
        assert_eq!(ids.len(), 4);
        assert_eq!(ids[3], UNK);
        assert_eq!(vocab.decode(&ids), "three two one <unk>");
        assert_eq!(vocab.encode("</s> <pad> <s>"), vec![UNK, UNK, UNK]);
    }

    #[test]
    fn save_load_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vocab.json");
        let vocab = Vocab::build(["hello world", "héllo"], VocabLevel::Char, 1);
        vocab.save(&path).unwrap();
        assert!(!dir.path().join("vocab.json.tmp").exists());
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"level\": \"char\""));
        let loaded = Vocab::load(&path).unwrap();
        assert_eq!(loaded, vocab);
        assert_eq!(loaded.level(), VocabLevel::Char);
        assert_eq!(loaded.encode("héllo"), vocab.encode("héllo"));
    }

    #[test]
    fn bpe_specials_round_trip_and_save_load() {
        let texts = [
            "the red house",
            "das rote Haus.",
            "zwölf grüne Häuser, 12 €!",
            "naïve café — 東京",
        ];
        let vocab = Vocab::build_bpe(texts.iter().copied().cycle().take(40), 300).unwrap();
        assert_eq!(vocab.level(), VocabLevel::Bpe);
        assert!(
            vocab.len() > 256 + 4 && vocab.len() <= 300,
            "{}",
            vocab.len()
        );
        let tokenizer = vocab.bpe.as_ref().unwrap();
        for (id, special) in SPECIAL_TOKENS.iter().enumerate() {
            assert_eq!(tokenizer.token_to_id(special), Some(id as u32));
            assert_eq!(vocab.token(id as u32), Some(*special));
        }
        assert_eq!((PAD, BOS, EOS, UNK), (0, 1, 2, 3), "crate::text specials");
        // Unicode text (also unseen) round-trips; no specials in the ids; no stray markers.
        for text in [
            "zwölf grüne Häuser, 12 €!",
            "東京 naïve",
            "unseen ✓ text",
            "a  b",
        ] {
            let ids = vocab.encode(text);
            assert!(ids.iter().all(|&id| id > UNK), "{text}: {ids:?}");
            assert_eq!(vocab.decode(&ids), text);
        }
        // Spelling a special is plain text.
        let ids = vocab.encode("</s> <unk>");
        assert!(ids.iter().all(|&id| id > UNK), "{ids:?}");
        assert_eq!(vocab.decode(&ids), "</s> <unk>");
        // Decoding stops at EOS and skips BOS, PAD, UNK and out-of-range ids.
        let house = vocab.encode("the red house");
        let mut ids = vec![BOS];
        ids.extend(&house);
        ids.extend([PAD, UNK, 99_999, EOS]);
        ids.extend(vocab.encode(" more"));
        assert_eq!(vocab.decode(&ids), "the red house");
        assert_eq!(vocab.decode(&[EOS]), "");

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vocab.json");
        vocab.save(&path).unwrap();
        assert!(dir.path().join(TOKENIZER_FILE).is_file());
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"level\": \"bpe\""), "{text}");
        let loaded = Vocab::load(&path).unwrap();
        assert_eq!(loaded, vocab);
        assert_eq!(loaded.encode("東京 naïve"), vocab.encode("東京 naïve"));
        std::fs::remove_file(dir.path().join(TOKENIZER_FILE)).unwrap();
        let error = Vocab::load(&path).unwrap_err().to_string();
        assert!(error.contains(TOKENIZER_FILE), "{error}");
        assert!(Vocab::build_bpe(texts.iter().copied(), 100).is_err());
    }

    #[test]
    fn corrupt_files_are_rejected_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("truncated.json", r#"{"level": "char", "tokens": ["#, ""),
            (
                "specials.json",
                r#"{"level": "word", "tokens": ["<s>", "<pad>", "</s>", "<unk>"]}"#,
                "expected the special",
            ),
            (
                "duplicate.json",
                r#"{"level": "char", "tokens": ["<pad>", "<s>", "</s>", "<unk>", "a", "a"]}"#,
                "duplicate token \"a\"",
            ),
            (
                "multichar.json",
                r#"{"level": "char", "tokens": ["<pad>", "<s>", "</s>", "<unk>", "ab"]}"#,
                "not exactly one character",
            ),
            (
                "level.json",
                r#"{"level": "byte", "tokens": ["<pad>", "<s>", "</s>", "<unk>"]}"#,
                "unknown variant",
            ),
        ];
        for (name, contents, expected_reason) in cases {
            let path = dir.path().join(name);
            std::fs::write(&path, contents).unwrap();
            let error = Vocab::load(&path).unwrap_err();
            assert!(
                matches!(error, TextError::BadVocab { .. }),
                "{name}: {error}"
            );
            let message = error.to_string();
            assert!(message.contains(name), "{message}");
            assert!(message.contains(expected_reason), "{message}");
        }
        let missing = dir.path().join("missing.json");
        let error = Vocab::load(&missing).unwrap_err();
        assert!(matches!(error, TextError::Io { .. }));
        assert!(error.to_string().contains("missing.json"));
    }
}
