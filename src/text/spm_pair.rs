//! What Marian's and CTranslate2's tokenizers share: a source SentencePiece model that cuts the
//! text into pieces, a dictionary of the model's pieces (piece -> their id; our id -> piece
//! through an [`IdMap`]) and a target SentencePiece model that joins decoded pieces back into
//! text. Decoding drops the special tokens (PAD, BOS, EOS, UNK), joins the rest with the target
//! model's detokenizer, turns any `▁` left into spaces and strips the ends, as transformers'
//! `decode(ids, skip_special_tokens=True)` does.

use super::id_map::IdMap;
use super::sentencepiece::SentencePiece;
use super::UNK;
use std::collections::HashMap;

/// Two SentencePiece models and the dictionary between them and the model's ids.
pub struct SpmPair {
    source: SentencePiece,
    target: SentencePiece,
    /// Piece -> the model's id.
    ids_by_piece: HashMap<String, u32>,
    /// Our id -> piece (rows of our own: `<pad>`).
    pieces: Vec<String>,
    ids: IdMap,
    /// The model's id of its unknown piece.
    unk: u32,
}

impl std::fmt::Debug for SpmPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpmPair")
            .field("pieces", &self.pieces.len())
            .finish_non_exhaustive()
    }
}

impl SpmPair {
    /// The pair of `source` and `target`, the dictionary `ids_by_piece`, the piece of each of
    /// the model's ids (`piece_of`), the id map `ids` and the unknown piece's id `unk`.
    pub fn new(
        source: SentencePiece,
        target: SentencePiece,
        ids_by_piece: HashMap<String, u32>,
        piece_of: impl Fn(u32) -> String,
        ids: IdMap,
        unk: u32,
    ) -> SpmPair {
        let pieces = (0..ids.len_ours() as u32)
            .map(|ours| ids.theirs(ours).map_or_else(|| "<pad>".to_string(), &piece_of))
            .collect();
        SpmPair {
            source,
            target,
            ids_by_piece,
            pieces,
            ids,
            unk,
        }
    }

    /// The id map.
    pub fn ids(&self) -> &IdMap {
        &self.ids
    }

    /// The model's id of `piece` (unknown pieces: the unknown token's).
    pub fn their_id(&self, piece: &str) -> u32 {
        *self.ids_by_piece.get(piece).unwrap_or(&self.unk)
    }

    /// Our ids of the model's token `first` (if any), then of the source model's pieces of
    /// `text`; no EOS (the searches append it).
    pub fn encode_after(&self, first: Option<u32>, text: &str) -> Vec<u32> {
        let pieces = self.source.encode(text);
        first
            .into_iter()
            .chain(pieces.iter().map(|(piece, _)| self.their_id(piece)))
            .map(|t| self.ids.ours(t))
            .collect()
    }

    /// The text of our ids, specials skipped (see the module docs).
    pub fn decode(&self, ids: &[u32]) -> String {
        let pieces: Vec<&str> = ids
            .iter()
            .filter(|&&id| id > UNK)
            .filter_map(|&id| self.pieces.get(id as usize).map(String::as_str))
            .collect();
        let text = self.target.decode_pieces(&pieces).replace('\u{2581}', " ");
        text.trim().to_string()
    }

    /// Our vocabulary size.
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
}
