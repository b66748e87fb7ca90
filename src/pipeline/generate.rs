//! Language models written by `train-lm` (`config.json`, `model.safetensors`,
//! `tokenizer.json`): continuing a prompt by sampling through the KV cache, and the perplexity
//! of a text.
//!
//! A document is trained, scored and prompted as `[<|endoftext|>] + encode(text)`
//! ([`document_tokens`]).

use super::check_model_dir;
use crate::decode::sample::{sample, SamplingOptions};
use crate::decode::score::score_stream;
use crate::error::{Error, Result};
use crate::model::checkpoint::load_language_model;
use crate::model::LanguageModel;
use crate::rng::Rng;
use crate::store::TOKENIZER_FILE;
use crate::text::bpe::Bpe;
use std::path::Path;

/// A language model and its byte-level BPE.
pub struct TextGenerator {
    pub model: LanguageModel<f32>,
    pub bpe: Bpe,
}

impl TextGenerator {
    /// Loads a language-model directory, checking that the tokenizer matches the model.
    pub fn load(dir: &Path) -> Result<TextGenerator> {
        check_model_dir(dir)?;
        let model = load_language_model(dir)?;
        let bpe = Bpe::load(&dir.join(TOKENIZER_FILE))?;
        if bpe.vocab_size() != model.config.vocab_size {
            return Err(Error::Input(format!(
                "{}: tokenizer has {} tokens but config.json says vocab_size {}",
                dir.join(TOKENIZER_FILE).display(),
                bpe.vocab_size(),
                model.config.vocab_size
            )));
        }
        Ok(TextGenerator { model, bpe })
    }

    /// Scores `text` as one document; see [`score_text`].
    pub fn perplexity(&self, text: &str, stride: usize, batch: usize) -> Result<TextScore> {
        score_text(&self.model, &self.bpe, text, stride, batch)
    }
}

/// `[<|endoftext|>] + encode(text)`: the stream a document is trained and scored as.
pub fn document_tokens(bpe: &Bpe, text: &str) -> Result<Vec<u32>> {
    let mut tokens = vec![bpe.eot()];
    tokens.extend(bpe.encode(text)?);
    Ok(tokens)
}

/// Continues `prompt` (ids, starting with `<|endoftext|>`) by `max_tokens` sampled ids, feeding
/// each id through the KV caches; calls `emit` with every new id (an error from it stops the
/// generation and is returned). When the context is full the caches are rebuilt from the last
/// half of the context.
pub fn generate_ids<E>(
    model: &LanguageModel<f32>,
    prompt: &[u32],
    max_tokens: usize,
    opts: SamplingOptions,
    rng: &mut Rng,
    mut emit: impl FnMut(u32) -> std::result::Result<(), E>,
) -> std::result::Result<Vec<u32>, E> {
    let max_len = model.max_len();
    let v = model.config.vocab_size;
    let mut history = prompt.to_vec();
    let keep = |h: &[u32], n: usize| h[h.len().saturating_sub(n)..].to_vec();
    let mut state = model.start(1, max_len);
    let first = keep(&history, max_len);
    let mut logprobs = model.step(&mut state, &first);
    let mut out = Vec::with_capacity(max_tokens);
    for _ in 0..max_tokens {
        let last = &logprobs[logprobs.len() - v..];
        let id = sample(last, opts, rng);
        emit(id)?;
        out.push(id);
        history.push(id);
        if state.len() == max_len {
            state = model.start(1, max_len);
            let recent = keep(&history, (max_len / 2).max(1));
            logprobs = model.step(&mut state, &recent);
        } else {
            logprobs = model.step(&mut state, &[id]);
        }
    }
    Ok(out)
}

/// Loss per token, perplexity and bits per character of a scored document.
pub struct TextScore {
    pub nats_per_token: f64,
    pub perplexity: f64,
    pub bits_per_char: f64,
    pub tokens: usize,
    pub chars: usize,
}

/// Scores `text` as one document (every token after `<|endoftext|>`), windows of the model's
/// context every `stride` tokens.
pub fn score_text(
    model: &LanguageModel<f32>,
    bpe: &Bpe,
    text: &str,
    stride: usize,
    batch: usize,
) -> Result<TextScore> {
    let tokens = document_tokens(bpe, text)?;
    let s = score_stream(model, &tokens, model.max_len(), stride, batch);
    let chars = text.chars().count();
    Ok(TextScore {
        nats_per_token: s.nll(),
        perplexity: s.nll().exp(),
        bits_per_char: s.nll_sum / chars.max(1) as f64 / std::f64::consts::LN_2,
        tokens: s.n_tokens,
        chars,
    })
}
