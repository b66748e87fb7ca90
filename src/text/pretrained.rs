//! The tokenizers of pretrained translation models, behind one [`Vocab`](super::vocab::Vocab):
//! Marian's ([`MarianTokenizer`]), fairseq's multilingual ones ([`FairseqTokenizer`]) and
//! CTranslate2 model directories' ([`Ct2Tokenizer`]). All speak our ids (see `id_map`).

use super::ct2_tokenizer::Ct2Tokenizer;
use super::fairseq::FairseqTokenizer;
use super::marian::MarianTokenizer;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// A `vocab.json` of piece -> id (Marian's, M2M100's); an error names the file and the problem.
pub(crate) fn read_piece_ids(path: &Path) -> Result<HashMap<String, u32>> {
    let bad = |reason: String| Error::Input(format!("{}: {reason}", path.display()));
    let bytes = std::fs::read(path).map_err(|e| bad(format!("cannot read: {e}")))?;
    serde_json::from_slice(crate::store::strip_bom(&bytes))
        .map_err(|e| bad(format!("not a vocabulary of piece -> token id: {e}")))
}

/// A pretrained model's tokenizer.
#[derive(Clone, Debug)]
pub enum Pretrained {
    /// Marian (OPUS-MT).
    Marian(Arc<MarianTokenizer>),
    /// M2M100 / NLLB (the source language's token is the translator's to put first).
    Fairseq(Arc<FairseqTokenizer>),
    /// A CTranslate2 model directory or Argos Translate package.
    Ct2(Arc<Ct2Tokenizer>),
    /// BART (byte-level BPE from `tokenizer.json`).
    Bart(Arc<super::bart_tokenizer::BartTokenizer>),
    /// T5, mT5, MADLAD-400 (`spiece.model`).
    T5(Arc<super::t5_tokenizer::T5Tokenizer>),
}

impl Pretrained {
    /// Our token ids of a source `text`, no EOS (the searches append it).
    pub(crate) fn encode(&self, text: &str) -> Vec<u32> {
        match self {
            Pretrained::Marian(t) => t.encode(text),
            Pretrained::Fairseq(t) => t.encode(text),
            Pretrained::Ct2(t) => t.encode(text),
            Pretrained::Bart(t) => t.encode(text),
            Pretrained::T5(t) => t.encode(text),
        }
    }

    /// The text of our ids (the caller stops them at EOS), special tokens skipped.
    pub(crate) fn decode(&self, ids: &[u32]) -> String {
        match self {
            Pretrained::Marian(t) => t.decode(ids),
            Pretrained::Fairseq(t) => t.decode(ids),
            Pretrained::Ct2(t) => t.decode(ids),
            Pretrained::Bart(t) => t.decode(ids),
            Pretrained::T5(t) => t.decode(ids),
        }
    }

    /// Our vocabulary size.
    pub(crate) fn len(&self) -> usize {
        match self {
            Pretrained::Marian(t) => t.len(),
            Pretrained::Fairseq(t) => t.len(),
            Pretrained::Ct2(t) => t.len(),
            Pretrained::Bart(t) => t.len(),
            Pretrained::T5(t) => t.len(),
        }
    }

    /// The token text of our id `id`.
    pub(crate) fn token(&self, id: u32) -> Option<&str> {
        match self {
            Pretrained::Marian(t) => t.token(id),
            Pretrained::Fairseq(t) => t.token(id),
            Pretrained::Ct2(t) => t.token(id),
            Pretrained::Bart(t) => t.token(id),
            Pretrained::T5(t) => t.token(id),
        }
    }

    /// Which files hold it (for the error that refuses to save it as ours).
    pub(crate) fn files(&self) -> &'static str {
        match self {
            Pretrained::Marian(_) => "source.spm, target.spm and vocab.json",
            Pretrained::Fairseq(_) => {
                "sentencepiece.bpe.model with vocab.json or tokenizer.json, and tokenizer_config.json"
            }
            Pretrained::Ct2(_) => "model.bin, its vocabulary and SentencePiece model",
            Pretrained::Bart(_) => "tokenizer.json",
            Pretrained::T5(_) => "spiece.model or tokenizer.json",
        }
    }
}
