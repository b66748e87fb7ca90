//! Sentence embeddings with a pretrained BERT encoder in a Hugging Face directory
//! (`config.json`, `model.safetensors`, `tokenizer.json`; e.g. all-MiniLM-L6-v2): the
//! L2-normalised mean of the last hidden states, the sentence-transformers recipe. An encoder
//! pre-trained here (`train-mlm`: our `config.json`, `tokenizer.json` with BERT's template)
//! loads the same way.

use super::{check_model_dir, check_vocab};
use crate::error::{Error, Result};
use crate::model::bert::Bert;
use crate::store::{read_file, SENTENCE_CONFIG_FILE, TOKENIZER_FILE};
use crate::text::tokenizer::Tokenizer;
use std::path::Path;

/// Word pieces kept per sentence when the directory does not say.
pub const DEFAULT_MAX_LEN: usize = 256;

/// A pretrained encoder with its tokenizer.
pub struct SentenceEncoder {
    /// The BERT-style encoder.
    pub model: Bert<f32>,
    /// Its WordPiece tokenizer, with the directory's truncation length.
    pub tokenizer: Tokenizer,
}

impl SentenceEncoder {
    /// Loads a model directory; `max_len` overrides the directory's truncation length.
    pub fn load(dir: &Path, max_len: Option<usize>) -> Result<SentenceEncoder> {
        check_model_dir(dir)?;
        let model = Bert::load(dir)?;
        let positions = model.config.max_position_embeddings;
        // Without a sentence-transformers config the default is capped by the model's positions
        // (a `train-mlm` encoder of 128 positions embeds up to 128 tokens).
        let max_len = match max_len {
            Some(n) => n,
            None if !dir.join(SENTENCE_CONFIG_FILE).is_file() => DEFAULT_MAX_LEN.min(positions),
            None => configured_max_len(dir)?,
        };
        if max_len == 0 || max_len > positions {
            return Err(Error::Input(format!(
                "max length {max_len} must be in 1..={positions} (the model's positions)"
            )));
        }
        let path = dir.join(TOKENIZER_FILE);
        let tokenizer = Tokenizer::load(&path, max_len)?;
        check_vocab(
            &path,
            tokenizer.vocab_size(),
            model.config.vocab_size,
            false,
        )?;
        Ok(SentenceEncoder { model, tokenizer })
    }

    /// Embeds `sentences`, `batch_size` at a time (sorted by length so that little is padded),
    /// returning the embeddings in input order.
    pub fn embed(&self, sentences: &[String], batch_size: usize) -> Result<Vec<Vec<f32>>> {
        let ids = sentences
            .iter()
            .map(|s| self.tokenizer.encode(s))
            .collect::<Result<Vec<_>>>()?;
        self.embed_ids(&ids, batch_size)
    }

    /// Embeds sequences of token ids as given (no special tokens added, none cut): each must
    /// hold 1 to `Tokenizer::max_len` ids of the vocabulary.
    pub fn embed_ids(&self, ids: &[Vec<u32>], batch_size: usize) -> Result<Vec<Vec<f32>>> {
        self.embed_ids_with(ids, batch_size, |seqs| self.model.embed(seqs))
    }

    /// [`embed`](Self::embed) with each batch embedded by `embed` (the model's own forward,
    /// or a device's: `crate::model::device_encoder`).
    pub fn embed_with(
        &self,
        sentences: &[String],
        batch_size: usize,
        embed: impl FnMut(&[&[u32]]) -> Result<Vec<Vec<f32>>>,
    ) -> Result<Vec<Vec<f32>>> {
        let ids = sentences
            .iter()
            .map(|s| self.tokenizer.encode(s))
            .collect::<Result<Vec<_>>>()?;
        self.embed_ids_with(&ids, batch_size, embed)
    }

    /// [`embed`](Self::embed) on a device: each batch one step of `bert` (the encoder uploaded
    /// there, `crate::model::device_encoder`).
    pub fn embed_on_device<D: crate::backend::Device>(
        &self,
        bert: &crate::model::device_encoder::DeviceBert<D>,
        sentences: &[String],
        batch_size: usize,
    ) -> Result<Vec<Vec<f32>>> {
        self.embed_with(sentences, batch_size, |seqs| Ok(bert.embed(seqs)?))
    }

    /// [`embed_ids`](Self::embed_ids) with each batch embedded by `embed`.
    pub fn embed_ids_with(
        &self,
        ids: &[Vec<u32>],
        batch_size: usize,
        mut embed: impl FnMut(&[&[u32]]) -> Result<Vec<Vec<f32>>>,
    ) -> Result<Vec<Vec<f32>>> {
        let (max, vocab) = (self.tokenizer.max_len(), self.model.config.vocab_size);
        for (i, seq) in ids.iter().enumerate() {
            if seq.is_empty() || seq.len() > max {
                return Err(Error::Input(format!(
                    "input {i} has {} token ids; 1 to {max} (the model's length)",
                    seq.len()
                )));
            }
            if let Some(&bad) = seq.iter().find(|&&id| id as usize >= vocab) {
                return Err(Error::Input(format!(
                    "input {i}: token id {bad} is outside the vocabulary of {vocab}"
                )));
            }
        }
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(ids[i].len()));
        let mut out = vec![Vec::new(); ids.len()];
        for chunk in order.chunks(batch_size.max(1)) {
            let seqs: Vec<&[u32]> = chunk.iter().map(|&i| &ids[i][..]).collect();
            for (&i, e) in chunk.iter().zip(embed(&seqs)?) {
                out[i] = e;
            }
        }
        Ok(out)
    }
}

/// `max_seq_length` from the directory's `sentence_bert_config.json`, or 256 without that file.
fn configured_max_len(dir: &Path) -> Result<usize> {
    let path = dir.join(SENTENCE_CONFIG_FILE);
    if !path.is_file() {
        return Ok(DEFAULT_MAX_LEN);
    }
    let bad = |reason: String| Error::Checkpoint {
        path: path.clone(),
        reason,
    };
    let v: serde_json::Value = serde_json::from_slice(&read_file(&path)?)
        .map_err(|e| bad(format!("invalid JSON: {e}")))?;
    match v.get("max_seq_length") {
        None => Ok(DEFAULT_MAX_LEN),
        Some(n) => n
            .as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| bad("max_seq_length is not a count".into())),
    }
}
