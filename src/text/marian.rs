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
//! [`MarianIds`] maps them onto ours, one more row than Marian's: our BOS is Marian's padding
//! token (the decoder's start, which Marian never emits), our EOS and UNK are Marian's, our PAD
//! is the added row (only ever masked), and every other token keeps Marian's order after them.

use super::sentencepiece::SentencePiece;
use super::{BOS, EOS, PAD, UNK};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::path::Path;

/// The files of a Marian tokenizer in a model directory.
pub const SOURCE_SPM: &str = "source.spm";
/// The target side's SentencePiece model.
pub const TARGET_SPM: &str = "target.spm";
/// Piece -> Marian id, shared by both sides.
pub const MARIAN_VOCAB: &str = "vocab.json";

/// How Marian's token ids (`0 .. n`) map onto this project's (`0 .. n + 1`), see the module
/// docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MarianIds {
    /// Marian id -> ours.
    to_ours: Vec<u32>,
    /// Our id -> Marian's (`None`: our added padding row).
    to_theirs: Vec<Option<u32>>,
}

impl MarianIds {
    /// The map of a vocabulary of `n` Marian ids whose padding (= decoder start), EOS and unknown
    /// tokens are `pad`, `eos` and `unk`; an error says which id is out of range or repeated.
    pub fn new(n: usize, pad: u32, eos: u32, unk: u32) -> std::result::Result<MarianIds, String> {
        for (what, id) in [("pad_token_id", pad), ("eos_token_id", eos), ("<unk>", unk)] {
            if id as usize >= n {
                return Err(format!("{what} {id} is not below the vocabulary size {n}"));
            }
        }
        if pad == eos || pad == unk || eos == unk {
            return Err(format!(
                "padding ({pad}), EOS ({eos}) and <unk> ({unk}) must be three different tokens"
            ));
        }
        let mut to_theirs = vec![None; n + 1];
        to_theirs[BOS as usize] = Some(pad);
        to_theirs[EOS as usize] = Some(eos);
        to_theirs[UNK as usize] = Some(unk);
        let others = (0..n as u32).filter(|t| ![pad, eos, unk].contains(t));
        for (ours, theirs) in (UNK as usize + 1..).zip(others) {
            to_theirs[ours] = Some(theirs);
        }
        let mut to_ours = vec![PAD; n];
        for (ours, theirs) in to_theirs.iter().enumerate() {
            if let Some(t) = theirs {
                to_ours[*t as usize] = ours as u32;
            }
        }
        Ok(MarianIds { to_ours, to_theirs })
    }

    /// Our id of Marian's `theirs` (below [`len_theirs`](Self::len_theirs)).
    pub fn ours(&self, theirs: u32) -> u32 {
        self.to_ours[theirs as usize]
    }

    /// Marian's id of our `ours`; `None` for our padding row and ids past the vocabulary.
    pub fn theirs(&self, ours: u32) -> Option<u32> {
        self.to_theirs.get(ours as usize).copied().flatten()
    }

    /// Marian's vocabulary size.
    pub fn len_theirs(&self) -> usize {
        self.to_ours.len()
    }

    /// Ours: Marian's and the padding row.
    pub fn len_ours(&self) -> usize {
        self.to_theirs.len()
    }

    /// The rows of a Marian table `[n, width]` in our order (`[n + 1, width]`), the padding row
    /// filled with `pad_value`.
    pub fn reorder_rows(&self, table: &[f32], width: usize, pad_value: f32) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.len_ours() * width);
        for theirs in &self.to_theirs {
            match theirs {
                Some(t) => {
                    out.extend_from_slice(&table[*t as usize * width..(*t as usize + 1) * width])
                }
                None => out.extend(std::iter::repeat_n(pad_value, width)),
            }
        }
        out
    }
}

/// A Marian model's tokenizer: both SentencePiece models, `vocab.json`, and the id map.
pub struct MarianTokenizer {
    source: SentencePiece,
    target: SentencePiece,
    /// Piece -> Marian id.
    ids_by_piece: HashMap<String, u32>,
    /// Our id -> piece (the padding row: `<pad>`).
    pieces: Vec<String>,
    ids: MarianIds,
    /// Marian's id of `<unk>`.
    unk: u32,
}

impl std::fmt::Debug for MarianTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MarianTokenizer")
            .field("pieces", &self.pieces.len())
            .finish_non_exhaustive()
    }
}

impl MarianTokenizer {
    /// Reads `source.spm`, `target.spm` and `vocab.json` of `dir` for a model of `vocab_size`
    /// Marian ids whose padding and EOS tokens are `pad` and `eos`. Errors name the file.
    pub fn load(dir: &Path, vocab_size: usize, pad: u32, eos: u32) -> Result<MarianTokenizer> {
        let path = dir.join(MARIAN_VOCAB);
        let bad = |reason: String| Error::Input(format!("{}: {reason}", path.display()));
        let bytes = std::fs::read(&path).map_err(|e| bad(format!("cannot read: {e}")))?;
        let map: HashMap<String, u64> = serde_json::from_slice(crate::store::strip_bom(&bytes))
            .map_err(|e| bad(format!("not a Marian vocabulary (piece -> id): {e}")))?;
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
            .ok_or_else(|| bad("no <unk> piece".into()))? as u32;
        let ids = MarianIds::new(vocab_size, pad, eos, unk).map_err(bad)?;
        let pieces = (0..ids.len_ours() as u32)
            .map(|ours| match ids.theirs(ours) {
                Some(t) => by_id[t as usize].clone().unwrap_or_default(),
                None => "<pad>".to_string(),
            })
            .collect();
        let ids_by_piece = map.into_iter().map(|(p, id)| (p, id as u32)).collect();
        Ok(MarianTokenizer {
            source: SentencePiece::load(&dir.join(SOURCE_SPM))?,
            target: SentencePiece::load(&dir.join(TARGET_SPM))?,
            ids_by_piece,
            pieces,
            ids,
            unk,
        })
    }

    /// The id map.
    pub fn ids(&self) -> &MarianIds {
        &self.ids
    }

    /// Our token ids of a source `text`, no EOS (the searches append it).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let (code, text) = split_language_code(text);
        let theirs = |piece: &str| *self.ids_by_piece.get(piece).unwrap_or(&self.unk);
        let pieces = self.source.encode(&text);
        code.into_iter()
            .map(theirs)
            .chain(pieces.iter().map(|(piece, _)| theirs(piece)))
            .map(|t| self.ids.ours(t))
            .collect()
    }

    /// The text of our token ids, specials skipped (transformers'
    /// `decode(ids, skip_special_tokens=True)`).
    pub fn decode(&self, ids: &[u32]) -> String {
        let pieces: Vec<&str> = ids
            .iter()
            .filter(|&&id| id > UNK)
            .filter_map(|&id| self.pieces.get(id as usize).map(String::as_str))
            .collect();
        let text = self.target.decode_pieces(&pieces).replace('\u{2581}', " ");
        text.trim().to_string()
    }

    /// Our vocabulary size (Marian's and the padding row).
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Never true: a Marian vocabulary holds its specials.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// The piece of our id `id`.
    pub fn token(&self, id: u32) -> Option<&str> {
        self.pieces.get(id as usize).map(String::as_str)
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
    fn marian_ids_put_the_specials_where_ours_are() {
        // Marian: EOS 0, <unk> 1, padding (and decoder start) 5 of 6 tokens.
        let ids = MarianIds::new(6, 5, 0, 1).unwrap();
        assert_eq!(ids.len_ours(), 7);
        assert_eq!([ids.ours(5), ids.ours(0), ids.ours(1)], [BOS, EOS, UNK]);
        assert_eq!((2..5).map(|t| ids.ours(t)).collect::<Vec<_>>(), [4, 5, 6]);
        assert_eq!(ids.theirs(PAD), None);
        for t in 0..6 {
            assert_eq!(ids.theirs(ids.ours(t)), Some(t));
        }
        assert_eq!(ids.theirs(7), None);
        let table: Vec<f32> = (0..12).map(|v| v as f32).collect(); // [6, 2]
        assert_eq!(
            ids.reorder_rows(&table, 2, -1.0),
            [-1., -1., 10., 11., 0., 1., 2., 3., 4., 5., 6., 7., 8., 9.]
        );
        assert!(MarianIds::new(6, 6, 0, 1).unwrap_err().contains("pad_token_id 6"));
        assert!(MarianIds::new(6, 0, 0, 1).unwrap_err().contains("three different"));
    }

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
