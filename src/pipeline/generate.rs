//! Language models written by `train-lm` (`config.json`, `model.safetensors`,
//! `tokenizer.json`): continuing a prompt by sampling through the KV cache, and the perplexity
//! of a text.
//!
//! A document is trained, scored and prompted as `[<|endoftext|>] + encode(text)`
//! ([`document_tokens`]).

use super::{check_model_dir, check_vocab};
use crate::decode::sample::{sample_search, SamplingOptions};
use crate::decode::score::score_stream;
use crate::decode::{DecodingState, IncrementalDecoder};
use crate::error::Result;
use crate::model::checkpoint::load;
use crate::model::lm::LmState;
use crate::model::LanguageModel;
use crate::rng::Rng;
use crate::store::TOKENIZER_FILE;
use crate::text::bpe::Bpe;
use crate::Float;
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
        let model: LanguageModel<f32> = load(dir)?;
        let path = dir.join(TOKENIZER_FILE);
        let bpe = Bpe::load(&path)?;
        check_vocab(&path, bpe.vocab_size(), model.config.vocab_size, true)?;
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

/// A language model decoded past its context: when the next positions would not fit, the
/// state is rebuilt from the last half of the context ([`LanguageModel::max_len`]) of the
/// tokens fed so far. One row.
pub struct ContextWindow<'a, T> {
    pub model: &'a LanguageModel<T>,
}

/// The window's state: the model's caches and every token fed.
pub struct WindowState<T> {
    pub caches: LmState<T>,
    pub history: Vec<u32>,
}

impl<T: Float> ContextWindow<'_, T> {
    /// An empty state with room for the whole context.
    pub fn start(&self) -> WindowState<T> {
        WindowState {
            caches: self.model.start(1, self.model.max_len()),
            history: Vec::new(),
        }
    }
}

impl<T: Float> DecodingState for WindowState<T> {
    fn len(&self) -> usize {
        self.history.len()
    }
    fn gather_rows(&mut self, rows: &[usize]) {
        assert!(
            rows.iter().all(|&r| r == 0),
            "a context window holds one row"
        );
        self.caches.gather_rows(rows);
    }
}

impl<T: Float> IncrementalDecoder<T> for ContextWindow<'_, T> {
    type State = WindowState<T>;
    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }
    /// Feeds `tokens` (one row); a first feed longer than the context keeps its last
    /// `max_len` tokens.
    fn step(&self, state: &mut WindowState<T>, tokens: &[u32]) -> Vec<T> {
        let max_len = self.model.max_len();
        state.history.extend_from_slice(tokens);
        let recent = |n: usize| &state.history[state.history.len().saturating_sub(n)..];
        let feed = if state.caches.is_empty() {
            recent(max_len)
        } else if state.caches.len() + tokens.len() > max_len {
            state.caches = self.model.start(1, max_len);
            recent((max_len / 2).max(1))
        } else {
            tokens
        };
        self.model.step(&mut state.caches, feed)
    }
}

/// Continues `prompt` (ids, starting with `<|endoftext|>`) by `max_tokens` sampled ids through
/// the KV caches of a [`ContextWindow`]; calls `emit` with every new id (an error from it stops
/// the generation and is returned).
pub fn generate_ids<E>(
    model: &LanguageModel<f32>,
    prompt: &[u32],
    max_tokens: usize,
    opts: SamplingOptions,
    rng: &mut Rng,
    emit: impl FnMut(u32) -> std::result::Result<(), E>,
) -> std::result::Result<Vec<u32>, E> {
    let window = ContextWindow { model };
    let mut state = window.start();
    sample_search(&window, &mut state, prompt, max_tokens, opts, rng, emit)
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
    model.embedding.check_ids(&tokens)?;
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
