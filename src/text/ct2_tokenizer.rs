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
use super::spm_pair::SpmPair;
use std::collections::HashMap;

/// A CTranslate2 model's tokenizer (see the module docs).
#[derive(Debug)]
pub struct Ct2Tokenizer {
    pair: SpmPair,
    /// The model's id put before every source (`add_source_bos`), if any.
    first: Option<u32>,
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
        let piece_of = |t: u32| vocab[t as usize].clone();
        Ct2Tokenizer {
            pair: SpmPair::new(source, target, ids_by_piece, piece_of, ids, unk),
            first,
        }
    }

    /// The id map.
    pub fn ids(&self) -> &IdMap {
        self.pair.ids()
    }

    /// Our token ids of a source `text` (after the BOS token where the config adds it), no
    /// EOS (the searches append it).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.pair.encode_after(self.first, text)
    }

    /// The text of our ids, specials skipped: the target model's detokenization of the pieces
    /// (`sp.decode(pieces)`).
    pub fn decode(&self, ids: &[u32]) -> String {
        self.pair.decode(ids)
    }

    /// Our vocabulary size.
    pub fn len(&self) -> usize {
        self.pair.len()
    }

    /// Never true: the vocabulary holds its specials.
    pub fn is_empty(&self) -> bool {
        self.pair.is_empty()
    }

    /// The piece of our id `id`.
    pub fn token(&self, id: u32) -> Option<&str> {
        self.pair.token(id)
    }
}
