//! T5's tokenizer (transformers' `T5Tokenizer`, for T5, mT5 and MADLAD-400): one SentencePiece
//! unigram model whose ids are the model's, then the sentinel pieces `<extra_id_0>` ..
//! `<extra_id_{n-1}>` counted down from the last of `n` ids after the pieces (`<extra_id_0>` is
//! the highest), then rows the model holds but no piece names (T5's table is padded to a
//! multiple of 128).
//!
//! The pieces come from `spiece.model` (read by `text::sentencepiece`), or, in a directory that
//! ships only the converted `tokenizer.json` (many Hub T5 / mT5 / MADLAD repositories), from
//! it through the `tokenizers` crate, as transformers itself reads it: the same unigram
//! pieces, normalizer (SentencePiece's precompiled rules) and `▁` pre-tokenizer, the
//! sentinels closing its unigram vocabulary (and listed as added tokens). `spiece.model` is
//! preferred where both are present.
//!
//! Encoding: the pieces of the text, no special token (the searches append `</s>`). MADLAD-400
//! puts the target language first as a piece of its model (`<2de> text`, a user-defined
//! piece): [`T5Tokenizer::language`] finds it, and the translator puts it before the text.
//! Decoding skips the special tokens (padding, `</s>`, `<unk>`) and the sentinels, and joins
//! the rest as the SentencePiece package's `decode` does.
//!
//! T5's ids differ from this project's fixed specials (PAD 0, BOS 1, EOS 2, UNK 3): its padding
//! token 0 is the decoder's start, `</s>` 1, `<unk>` 2. [`IdMap`] maps them onto ours as it does
//! Marian's: our BOS is T5's padding token, our EOS and UNK are T5's, our PAD is an added row.

use super::bart_tokenizer::TOKENIZER_JSON;
use super::id_map::IdMap;
use super::sentencepiece::SentencePiece;
use super::UNK;
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::path::Path;

/// T5's SentencePiece model in a model directory.
pub const SPIECE: &str = "spiece.model";

/// Where the unigram pieces come from.
enum Pieces {
    /// `spiece.model`.
    Spm(Box<SentencePiece>),
    /// `tokenizer.json`: a unigram model of the pieces and, after them, the sentinels (as
    /// transformers converts `spiece.model`, which also lists them as added tokens); the
    /// pieces before the first sentinel.
    Json(Box<tokenizers::Tokenizer>, usize),
}

impl Pieces {
    /// The pieces before the sentinels.
    fn len(&self) -> usize {
        match self {
            Pieces::Spm(spm) => spm.len(),
            Pieces::Json(_, pieces) => *pieces,
        }
    }

    /// The piece of their id `id`, if it is one of the pieces.
    fn piece(&self, id: u32) -> Option<String> {
        match self {
            Pieces::Spm(spm) => spm.id_to_piece(id).map(str::to_string),
            Pieces::Json(t, pieces) => ((id as usize) < *pieces)
                .then(|| t.id_to_token(id))
                .flatten(),
        }
    }

    /// Their ids of `text`'s pieces, no special token.
    fn encode(&self, text: &str) -> Vec<u32> {
        match self {
            Pieces::Spm(spm) => spm.encode(text).into_iter().map(|(_, id)| id).collect(),
            Pieces::Json(t, _) => (t.encode(text, false).ok())
                .map(|e| e.get_ids().to_vec())
                .unwrap_or_default(),
        }
    }

    /// The text of their piece ids.
    fn decode(&self, ids: &[u32]) -> String {
        match self {
            Pieces::Spm(spm) => spm.decode_ids(ids).unwrap_or_default(),
            Pieces::Json(t, _) => t.decode(ids, true).unwrap_or_default(),
        }
    }
}

impl std::fmt::Debug for Pieces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pieces::Spm(_) => write!(f, "{SPIECE} ({} pieces)", self.len()),
            Pieces::Json(..) => write!(f, "{TOKENIZER_JSON} ({} pieces)", self.len()),
        }
    }
}

/// A T5 model's tokenizer: the unigram pieces, its sentinels and the id map.
#[derive(Debug)]
pub struct T5Tokenizer {
    spm: Pieces,
    ids: IdMap,
    /// Their ids from the first sentinel on (`spm.len()`): not text.
    sentinels_from: u32,
    /// Our id -> piece (`<pad>` for our padding row, `""` for unnamed rows).
    pieces: Vec<String>,
    /// MADLAD-400's language pieces `<2xx>`: code `xx` -> their id.
    languages: BTreeMap<String, u32>,
}

impl T5Tokenizer {
    /// Reads `spiece.model` of `dir`, else its `tokenizer.json`, for a model of `vocab_size`
    /// ids whose padding token (the decoder's start) and EOS are `pad` and `eos`, with
    /// `extra_ids` sentinels after the pieces. Errors name the file and what does not fit the
    /// model, or both files when neither is there.
    pub fn load(
        dir: &Path,
        vocab_size: usize,
        (pad, eos): (u32, u32),
        extra_ids: usize,
    ) -> Result<T5Tokenizer> {
        let (spiece, json) = (dir.join(SPIECE), dir.join(TOKENIZER_JSON));
        let (path, spm) = if spiece.exists() {
            let spm = SentencePiece::load(&spiece)?;
            (spiece, Pieces::Spm(Box::new(spm)))
        } else if json.exists() {
            let bytes = std::fs::read(&json)
                .map_err(|e| Error::Input(format!("{}: cannot read: {e}", json.display())))?;
            let tokenizer = super::vocab::parse_tokenizer(&bytes, &json)?;
            if !matches!(tokenizer.get_model(), tokenizers::ModelWrapper::Unigram(_)) {
                return Err(Error::Input(format!(
                    "{}: not a unigram model (T5's tokenizer is SentencePiece's unigram)",
                    json.display()
                )));
            }
            // The sentinels close the unigram vocabulary.
            let is_sentinel = |id: usize| {
                (tokenizer.id_to_token(id as u32)).is_some_and(|t| {
                    let n = t.strip_prefix("<extra_id_").and_then(|t| t.strip_suffix('>'));
                    n.is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                })
            };
            let mut pieces = tokenizer.get_vocab_size(false);
            while pieces > 0 && is_sentinel(pieces - 1) {
                pieces -= 1;
            }
            (json, Pieces::Json(Box::new(tokenizer), pieces))
        } else {
            return Err(Error::Input(format!(
                "{}: neither {SPIECE} nor {TOKENIZER_JSON} is there (T5's tokenizer is read \
                 from one of them)",
                dir.display()
            )));
        };
        let bad = |reason: String| Error::Input(format!("{}: {reason}", path.display()));
        let named = spm.len() + extra_ids;
        if named > vocab_size {
            return Err(bad(format!(
                "{} pieces and {extra_ids} sentinels name {named} ids, more than the model's \
                 vocab_size {vocab_size} (config.json): not this model's tokenizer",
                spm.len()
            )));
        }
        for (what, id, piece) in [("pad_token_id", pad, "<pad>"), ("eos_token_id", eos, "</s>")] {
            if spm.piece(id).as_deref() != Some(piece) {
                return Err(bad(format!(
                    "{what} {id} is {:?} here, not {piece:?}: not this model's tokenizer",
                    spm.piece(id).unwrap_or_else(|| "past the pieces".into())
                )));
            }
        }
        let unk = match &spm {
            Pieces::Spm(model) => model.unk_id(),
            Pieces::Json(t, _) => (t.token_to_id("<unk>").filter(|&u| (u as usize) < spm.len()))
                .ok_or_else(|| bad("no <unk> piece".into()))?,
        };
        let ids = IdMap::new(vocab_size, pad, eos, unk).map_err(bad)?;
        let sentinels_from = spm.len() as u32;
        let piece_of = |theirs: u32| -> String {
            let t = theirs as usize;
            match spm.piece(theirs) {
                Some(piece) => piece,
                None if t < named => format!("<extra_id_{}>", named - 1 - t),
                None => String::new(),
            }
        };
        let pieces = (0..ids.len_ours() as u32)
            .map(|ours| ids.theirs(ours).map_or_else(|| "<pad>".to_string(), piece_of))
            .collect();
        let languages = (0..spm.len() as u32)
            .filter_map(|id| {
                let piece = spm.piece(id)?;
                let code = piece.strip_prefix("<2")?.strip_suffix('>')?;
                let plain = !code.is_empty() && !code.contains(['<', '>']);
                plain.then(|| (code.to_string(), id))
            })
            .collect();
        Ok(T5Tokenizer {
            spm,
            ids,
            sentinels_from,
            pieces,
            languages,
        })
    }

    /// The id map.
    pub fn ids(&self) -> &IdMap {
        &self.ids
    }

    /// Our token ids of `text`, no `</s>` (the searches append it).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        (self.spm.encode(text).into_iter())
            .map(|id| self.ids.ours(id))
            .collect()
    }

    /// The text of our ids, special tokens and sentinels skipped (transformers'
    /// `decode(ids, skip_special_tokens=True)`).
    pub fn decode(&self, ids: &[u32]) -> String {
        let theirs: Vec<u32> = (ids.iter().filter(|&&id| id > UNK))
            .filter_map(|&id| self.ids.theirs(id))
            .filter(|&t| t < self.sentinels_from)
            .collect();
        self.spm.decode(&theirs)
    }

    /// Our vocabulary size (the model's ids and the padding row).
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Never true: the vocabulary holds its specials.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// The piece of our id `id`.
    pub fn token(&self, id: u32) -> Option<&str> {
        self.pieces.get(id as usize).map(String::as_str)
    }

    /// Our id of MADLAD-400's language piece `<2code>`, if the model has it.
    pub fn language(&self, code: &str) -> Option<u32> {
        self.languages.get(code).map(|&t| self.ids.ours(t))
    }

    /// The codes of the language pieces (`de` for `<2de>`), in order; none for T5 and mT5.
    pub fn language_codes(&self) -> impl Iterator<Item = &str> {
        self.languages.keys().map(String::as_str)
    }
}
