//! T5's tokenizer (transformers' `T5Tokenizer`, for T5, mT5 and MADLAD-400): one SentencePiece
//! model, `spiece.model`, whose ids are the model's, then the sentinel pieces
//! `<extra_id_0>` .. `<extra_id_{n-1}>` counted down from the last of `n` ids after the pieces
//! (`<extra_id_0>` is the highest), then rows the model holds but no piece names (T5's table is
//! padded to a multiple of 128).
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

use super::id_map::IdMap;
use super::sentencepiece::SentencePiece;
use super::UNK;
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::path::Path;

/// T5's SentencePiece model in a model directory.
pub const SPIECE: &str = "spiece.model";

/// A T5 model's tokenizer: the SentencePiece model, its sentinels and the id map.
#[derive(Debug)]
pub struct T5Tokenizer {
    spm: SentencePiece,
    ids: IdMap,
    /// Their ids from the first sentinel on (`spm.len()`): not text.
    sentinels_from: u32,
    /// Our id -> piece (`<pad>` for our padding row, `""` for unnamed rows).
    pieces: Vec<String>,
    /// MADLAD-400's language pieces `<2xx>`: code `xx` -> their id.
    languages: BTreeMap<String, u32>,
}

impl T5Tokenizer {
    /// Reads `spiece.model` of `dir` for a model of `vocab_size` ids whose padding token (the
    /// decoder's start) and EOS are `pad` and `eos`, with `extra_ids` sentinels after the
    /// pieces. Errors name the file and what does not fit the model.
    pub fn load(
        dir: &Path,
        vocab_size: usize,
        (pad, eos): (u32, u32),
        extra_ids: usize,
    ) -> Result<T5Tokenizer> {
        let path = dir.join(SPIECE);
        if !path.exists() {
            return Err(Error::Input(format!(
                "{}: missing (T5's SentencePiece model, which the tokenizer needs)",
                path.display()
            )));
        }
        let spm = SentencePiece::load(&path)?;
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
            if spm.id_to_piece(id) != Some(piece) {
                return Err(bad(format!(
                    "{what} {id} is {:?} here, not {piece:?}: not this model's tokenizer",
                    spm.id_to_piece(id).unwrap_or("past the pieces")
                )));
            }
        }
        let ids = IdMap::new(vocab_size, pad, eos, spm.unk_id()).map_err(bad)?;
        let sentinels_from = spm.len() as u32;
        let piece_of = |theirs: u32| -> String {
            let t = theirs as usize;
            match spm.id_to_piece(theirs) {
                Some(piece) => piece.to_string(),
                None if t < named => format!("<extra_id_{}>", named - 1 - t),
                None => String::new(),
            }
        };
        let pieces = (0..ids.len_ours() as u32)
            .map(|ours| ids.theirs(ours).map_or_else(|| "<pad>".to_string(), piece_of))
            .collect();
        let languages = (0..spm.len() as u32)
            .filter_map(|id| {
                let code = spm.id_to_piece(id)?.strip_prefix("<2")?.strip_suffix('>')?;
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
            .map(|(_, id)| self.ids.ours(id))
            .collect()
    }

    /// The text of our ids, special tokens and sentinels skipped (transformers'
    /// `decode(ids, skip_special_tokens=True)`).
    pub fn decode(&self, ids: &[u32]) -> String {
        let theirs: Vec<u32> = (ids.iter().filter(|&&id| id > UNK))
            .filter_map(|&id| self.ids.theirs(id))
            .filter(|&t| t < self.sentinels_from)
            .collect();
        self.spm.decode_ids(&theirs).unwrap_or_default()
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
