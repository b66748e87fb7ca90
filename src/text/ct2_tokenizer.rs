//! The tokenizer of a CTranslate2 model directory: CTranslate2 itself takes tokens, so the
//! pieces come from the SentencePiece model its users run beside it (`source.spm` /
//! `target.spm` of a converted Marian model, `sentencepiece.model` of an Argos Translate
//! package), looked up in the directory's vocabulary (`shared_vocabulary.json` / `.txt`: one
//! piece per id). Unknown pieces become CTranslate2's `unk_token`.
//!
//! Ids map onto ours through an [`IdMap`] as for the Hugging Face families: our BOS is the
//! decoder's start token (a row of our own when the model starts from a zero embedding or from
//! its EOS), our EOS and UNK are the model's, our PAD is an added row. Whether the source ends
//! with EOS is the model's business (`ModelConfig::source_eos`); `add_source_bos` puts the BOS
//! token first here.

use super::id_map::IdMap;
use super::sentencepiece::SentencePiece;
use super::UNK;
use std::collections::HashMap;

/// A CTranslate2 model's tokenizer (see the module docs).
pub struct Ct2Tokenizer {
    source: SentencePiece,
    target: SentencePiece,
    /// Piece -> the model's id.
    ids_by_piece: HashMap<String, u32>,
    /// Our id -> piece.
    pieces: Vec<String>,
    ids: IdMap,
    /// The model's id of its unknown token.
    unk: u32,
    /// The model's id put before every source (`add_source_bos`), if any.
    first: Option<u32>,
}

impl std::fmt::Debug for Ct2Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ct2Tokenizer")
            .field("pieces", &self.pieces.len())
            .finish_non_exhaustive()
    }
}

impl Ct2Tokenizer {
    /// The tokenizer of `vocab` (the model's pieces in id order) with the SentencePiece models
    /// `source` and `target`, the id map `ids`, the unknown token `unk` and the token `first`
    /// put before every source.
    pub fn new(
        source: SentencePiece,
        target: SentencePiece,
        vocab: &[String],
        ids: IdMap,
        unk: u32,
        first: Option<u32>,
    ) -> Ct2Tokenizer {
        let mut ids_by_piece = HashMap::with_capacity(vocab.len());
        for (i, piece) in vocab.iter().enumerate() {
            // The first of repeated pieces, as CTranslate2's vocabulary map keeps it.
            ids_by_piece.entry(piece.clone()).or_insert(i as u32);
        }
        let pieces = (0..ids.len_ours() as u32)
            .map(|ours| match ids.theirs(ours) {
                Some(t) => vocab[t as usize].clone(),
                None => "<pad>".to_string(),
            })
            .collect();
        Ct2Tokenizer {
            source,
            target,
            ids_by_piece,
            pieces,
            ids,
            unk,
            first,
        }
    }

    /// The id map.
    pub fn ids(&self) -> &IdMap {
        &self.ids
    }

    /// Our token ids of a source `text` (after the BOS token where the config adds it), no
    /// EOS (the searches append it).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let theirs = |piece: &str| *self.ids_by_piece.get(piece).unwrap_or(&self.unk);
        let pieces = self.source.encode(text);
        self.first
            .into_iter()
            .chain(pieces.iter().map(|(piece, _)| theirs(piece)))
            .map(|t| self.ids.ours(t))
            .collect()
    }

    /// The text of our ids, specials skipped: the target model's detokenization of the pieces
    /// (`sp.decode(pieces)`).
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
