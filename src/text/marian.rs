//! Marian's tokenizer (OPUS-MT, transformers' `MarianTokenizer`): a SentencePiece model for each
//! side (`source.spm` encodes the sources, `target.spm` decodes the translations) and one
//! `vocab.json` (piece -> id) shared by both sides and the model's embedding table.
//!
//! Encoding: a leading language code `>>xx<<` (multilingual models) is its own token, then the
//! source model's pieces, each looked up in `vocab.json` (unknown pieces: `<unk>`). Decoding
//! drops the special tokens (EOS, padding, `<unk>`), joins the rest with the target model's
//! detokenizer, turns any `▁` left into spaces and strips the ends, as transformers'
//! `decode(ids, skip_special_tokens=True)` does.
//!
//! Marian's ids differ from this project's fixed specials (PAD 0, BOS 1, EOS 2, UNK 3): its EOS
//! is 0, `<unk>` 1, and its padding token (the last id) is also the decoder's first input.
//! [`IdMap`] maps them onto ours, one more row than Marian's: our BOS is Marian's padding
//! token (the decoder's start, which Marian never emits), our EOS and UNK are Marian's, our PAD
//! is the added row (only ever masked), and every other token keeps Marian's order after them.

use super::id_map::IdMap;
use super::sentencepiece::SentencePiece;
use super::spm_pair::SpmPair;
use crate::error::{Error, Result};
use std::path::Path;

/// The files of a Marian tokenizer in a model directory.
pub const SOURCE_SPM: &str = "source.spm";
/// The target side's SentencePiece model.
pub const TARGET_SPM: &str = "target.spm";
/// Piece -> Marian id, shared by both sides.
pub const MARIAN_VOCAB: &str = "vocab.json";

/// A Marian model's tokenizer: both SentencePiece models, `vocab.json`, and the id map.
#[derive(Debug)]
pub struct MarianTokenizer {
    pair: SpmPair,
}

impl MarianTokenizer {
    /// Reads `source.spm`, `target.spm` and `vocab.json` of `dir` for a model of `vocab_size`
    /// Marian ids whose padding and EOS tokens are `pad` and `eos`. Errors name the file.
    pub fn load(dir: &Path, vocab_size: usize, pad: u32, eos: u32) -> Result<MarianTokenizer> {
        let path = dir.join(MARIAN_VOCAB);
        let bad = |reason: String| Error::Input(format!("{}: {reason}", path.display()));
        let map = super::pretrained::read_piece_ids(&path)?;
        let mut by_id: Vec<Option<String>> = vec![None; vocab_size];
        for (piece, &id) in &map {
            let slot = by_id.get_mut(id as usize).ok_or_else(|| {
                bad(format!(
                    "piece {piece:?} has id {id}, past the model's vocab_size {vocab_size}"
                ))
            })?;
            if let Some(first) = slot.replace(piece.clone()) {
                return Err(bad(format!("pieces {first:?} and {piece:?} share id {id}")));
            }
        }
        let unk = *map
            .get("<unk>")
            .ok_or_else(|| bad("no <unk> piece".into()))?;
        let ids = IdMap::new(vocab_size, pad, eos, unk).map_err(bad)?;
        let source = SentencePiece::load(&dir.join(SOURCE_SPM))?;
        let target = SentencePiece::load(&dir.join(TARGET_SPM))?;
        let piece_of = |t: u32| by_id[t as usize].clone().unwrap_or_default();
        Ok(MarianTokenizer {
            pair: SpmPair::new(source, target, map, piece_of, ids, unk),
        })
    }

    /// The id map.
    pub fn ids(&self) -> &IdMap {
        self.pair.ids()
    }

    /// Our token ids of a source `text` (its `>>xx<<` code first), no EOS (the searches
    /// append it).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let (code, text) = split_language_code(text);
        let code = code.map(|c| self.pair.their_id(c));
        self.pair.encode_after(code, &text)
    }

    /// The text of our token ids, specials skipped (transformers'
    /// `decode(ids, skip_special_tokens=True)`).
    pub fn decode(&self, ids: &[u32]) -> String {
        self.pair.decode(ids)
    }

    /// Our vocabulary size (Marian's and the padding row).
    pub fn len(&self) -> usize {
        self.pair.len()
    }

    /// Never true: a Marian vocabulary holds its specials.
    pub fn is_empty(&self) -> bool {
        self.pair.is_empty()
    }

    /// The piece of our id `id`.
    pub fn token(&self, id: u32) -> Option<&str> {
        self.pair.token(id)
    }
}

/// transformers' `remove_language_code`: every match of `>>.+<<` (greedy: up to the last `<<`
/// of its line) is removed from the text, and the first is the language code when it starts
/// the text.
fn split_language_code(text: &str) -> (Option<&str>, String) {
    let (mut code, mut kept, mut from) = (None, String::new(), 0);
    while let Some(found) = text[from..].find(">>") {
        let at = from + found;
        let line_end = text[at..].find('\n').map_or(text.len(), |n| at + n);
        match text[at..line_end].rfind("<<").filter(|&j| j >= 3) {
            Some(j) => {
                let end = at + j + 2;
                if at == 0 {
                    code = Some(&text[..end]);
                }
                kept.push_str(&text[from..at]);
                from = end;
            }
            None => {
                kept.push_str(&text[from..at + 1]);
                from = at + 1;
            }
        }
    }
    kept.push_str(&text[from..]);
    (code, kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn language_codes_are_split_as_transformers_splits_them() {
        assert_eq!(
            split_language_code(">>fra<< Hello"),
            (Some(">>fra<<"), " Hello".to_string())
        );
        // Greedy: up to the last `<<`.
        assert_eq!(
            split_language_code(">>a<< b <<c"),
            (Some(">>a<< b <<"), "c".to_string())
        );
        // Inside the text: removed, not a code.
        assert_eq!(
            split_language_code("x >>de<< y"),
            (None, "x  y".to_string())
        );
        assert_eq!(split_language_code(">><<"), (None, ">><<".to_string()));
        assert_eq!(split_language_code("plain"), (None, "plain".to_string()));
        assert_eq!(split_language_code(">>>a<<"), (Some(">>>a<<"), String::new()));
        assert_eq!(
            split_language_code("a >>b\n>>c<< d"),
            (None, "a >>b\n d".to_string())
        );
    }
}
