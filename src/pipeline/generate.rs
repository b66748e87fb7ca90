//! Decoder-only language models: continuing a prompt by sampling through the KV cache, and the
//! perplexity of a text. One `--model PATH` takes any of:
//! - a directory written by `train-lm` (`config.json`, `model.safetensors`, `tokenizer.json`:
//!   this crate's byte-level BPE; a document is `[<|endoftext|>] + encode(text)`);
//! - a Hugging Face directory whose `config.json` says the `model_type` of a decoder family of
//!   `crate::model::families` (`llama`, `gpt2`; `model.safetensors` or a sharded index,
//!   `tokenizer.json`);
//! - a GGUF file of an architecture of that table (`llama`; tokenizer and chat template in its
//!   metadata);
//! - a pretrained model saved in our format with its own tokenizer (`prune`'s output, see
//!   `super::lm_dir`).

use super::check_vocab;
use crate::decode::sample::{sample_search, SamplingOptions};
use crate::decode::score::{score_stream, score_stream_through_cache};
use crate::decode::speculative::Rollback;
use crate::decode::{DecodingState, IncrementalDecoder};
use crate::error::{Error, Result};
use crate::kernels::lowp::Precision;
use crate::model::checkpoint::load;
use crate::model::families::{self, FamilyKind, GgufWeights};
use crate::model::lm::LmState;
use crate::model::{LanguageModel, StepLayout};
use crate::pipeline::chat::{hf_chat_template, ChatMessage, ChatTemplate};
use crate::pipeline::lm_dir::load_pretrained_tokenizer;
use crate::rng::Rng;
use crate::store::gguf::GgufFile;
use crate::store::{ckpt_err, read_file, CONFIG_FILE, TOKENIZER_FILE};
use crate::text::bpe::Bpe;
use crate::text::decoder_tokenizer::DecoderTokenizer;
use crate::text::gguf_tokenizer::GgufTokenizer;
use crate::Float;
use std::path::Path;

/// Where a loaded model came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelSource {
    /// A `train-lm` directory.
    Ours,
    /// A Hugging Face directory of the family of this name (see
    /// `crate::model::families`).
    HuggingFace(&'static str),
    /// A GGUF file.
    Gguf,
}

/// The numbers a loaded model multiplies its weights in (see `crate::kernels::lowp`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ModelPrecision {
    /// The float32 weights (a GGUF file's dequantised to float32 at load): the default, the
    /// path checked against transformers.
    #[default]
    F32,
    /// bf16 weights and activations, f32 sums.
    Bf16,
    /// int8 weights per output row, activations per row.
    Int8,
    /// A GGUF file's blocks as stored (Q4_0 / Q4_1 / Q8_0, Q5_0 / Q5_1 / IQ4_NL, the K-quants
    /// Q2_K … Q6_K), times 8-bit activations as llama.cpp quantises them (Q8_0 / Q8_1 / Q8_K;
    /// float32 for the tensors it stores as floats); GGUF files only.
    Ggml,
}

impl ModelPrecision {
    /// The format float32 weights are packed in (GGUF blocks aside).
    pub fn float_precision(self) -> Precision {
        match self {
            ModelPrecision::Bf16 => Precision::Bf16,
            ModelPrecision::Int8 => Precision::Int8,
            _ => Precision::F32,
        }
    }
}

/// A language model, its tokenizer and, for a chat model, its chat template.
pub struct TextGenerator {
    /// The decoder-only model.
    pub model: LanguageModel<f32>,
    /// Its tokenizer.
    pub tokenizer: DecoderTokenizer,
    /// What it was loaded from.
    pub source: ModelSource,
    /// The chat template, for a chat model.
    pub chat: Option<ChatTemplate>,
}

/// The end-of-sequence id of a Hugging Face `config.json` (`eos_token_id`: a number or a list,
/// the first taken; a multimodal checkpoint's may be its `text_config`'s only).
pub(crate) fn hf_eos(config: &serde_json::Value) -> Option<u32> {
    let v = config
        .get("eos_token_id")
        .filter(|v| !v.is_null())
        .or_else(|| config.get("text_config")?.get("eos_token_id"))?;
    let id = v.as_u64().or_else(|| v.as_array()?.first()?.as_u64())?;
    u32::try_from(id).ok()
}

impl TextGenerator {
    /// Loads a model directory or GGUF file (see the module docs), checking that the tokenizer
    /// fits the model.
    pub fn load(path: &Path) -> Result<TextGenerator> {
        if path.is_file() {
            if path
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
            {
                return Self::load_gguf(path, false);
            }
            return Err(Error::Input(format!(
                "{} is a file: give a model directory or a .gguf file",
                path.display()
            )));
        }
        super::check_model_dir(path)?;
        let config_path = path.join(CONFIG_FILE);
        let bytes = read_file(&config_path)?;
        let json: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| ckpt_err(&config_path, format!("invalid JSON: {e}")))?;
        let (model, tokenizer, source) = match json.get("model_type").and_then(|t| t.as_str()) {
            None => {
                let model: LanguageModel<f32> = load(path)?;
                if let Some((tokenizer, source, chat)) = load_pretrained_tokenizer(path)? {
                    check_vocab(
                        &path.join(TOKENIZER_FILE),
                        tokenizer.vocab_size(),
                        model.config.vocab_size,
                        false,
                    )?;
                    return Ok(TextGenerator {
                        model,
                        tokenizer,
                        source,
                        chat,
                    });
                }
                let bpe = Bpe::load(&path.join(TOKENIZER_FILE))?;
                (
                    model,
                    DecoderTokenizer::Ours(Box::new(bpe)),
                    ModelSource::Ours,
                )
            }
            Some(kind) => {
                let family = families::by_model_type(kind)
                    .filter(|f| f.kind == FamilyKind::Decoder && f.hf_decoder.is_some())
                    .ok_or_else(|| {
                        ckpt_err(
                            &config_path,
                            format!(
                                "model_type {kind:?} is not supported here ({} generate; a \
                                 {} encoder embeds: transformer embed)",
                                families::hf_list(FamilyKind::Decoder),
                                families::hf_list(FamilyKind::Encoder),
                            ),
                        )
                    })?;
                let model = families::load_hf_decoder(family, path, &bytes, &config_path)?;
                let tok =
                    DecoderTokenizer::hugging_face(&path.join(TOKENIZER_FILE), hf_eos(&json))?;
                (model, tok, ModelSource::HuggingFace(family.name))
            }
        };
        let exact = source == ModelSource::Ours;
        let tok_path = path.join(TOKENIZER_FILE);
        check_vocab(
            &tok_path,
            tokenizer.vocab_size(),
            model.config.vocab_size,
            exact,
        )?;
        let chat = match source {
            ModelSource::HuggingFace(name) => hf_chat_template(path)?.or_else(|| {
                let template = families::by_name(name)?.chat_template?;
                Some(ChatTemplate {
                    template: template.to_string(),
                    bos: String::new(),
                    eos: String::new(),
                })
            }),
            _ => None,
        };
        Ok(TextGenerator {
            model,
            tokenizer,
            source,
            chat,
        })
    }

    /// The ids of a chat prompt: `messages` through the model's chat template, ending where the
    /// assistant's reply begins (the template writes every special token; nothing is added).
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        let chat = self.chat.as_ref().ok_or_else(|| {
            Error::Input("this model has no chat template (give a plain --prompt)".into())
        })?;
        self.tokenizer.encode(&chat.prompt(messages)?)
    }

    /// Loads a model (see [`load`](Self::load)) and readies it for inference in `precision`:
    /// [`ModelPrecision::Ggml`] multiplies a GGUF file's quantised blocks as stored.
    pub fn load_prepared(path: &Path, precision: ModelPrecision) -> Result<TextGenerator> {
        let is_gguf = path.is_file()
            && path
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
        if precision == ModelPrecision::Ggml && !is_gguf {
            return Err(Error::Input(format!(
                "--precision ggml needs a .gguf file, {} is not one",
                path.display()
            )));
        }
        let blocks = is_gguf && precision == ModelPrecision::Ggml;
        let mut g = if is_gguf {
            Self::load_gguf(path, blocks)?
        } else {
            Self::load(path)?
        };
        g.model
            .prepare_precision(precision.float_precision())
            .map_err(|e| ckpt_err(path, e))?;
        Ok(g)
    }

    /// A llama GGUF file: its weights dequantised to float32 (and, with `blocks`, its linear
    /// layers multiplying the stored blocks instead), its tokenizer.
    fn load_gguf(path: &Path, blocks: bool) -> Result<TextGenerator> {
        let file = GgufFile::open(path)?;
        let tokenizer = GgufTokenizer::from_gguf(&file)?;
        let weights = match blocks {
            true => GgufWeights::Blocks,
            false => GgufWeights::Dequantised,
        };
        let model = families::load_gguf(&file, weights)?;
        check_vocab(path, tokenizer.vocab_size(), model.config.vocab_size, false)?;
        let chat = gguf_chat(&tokenizer);
        Ok(TextGenerator {
            model,
            tokenizer: DecoderTokenizer::Gguf(Box::new(tokenizer)),
            source: ModelSource::Gguf,
            chat,
        })
    }

    /// Scores `text` as one document in windows of the model's whole context; see
    /// [`score_document`].
    pub fn perplexity(&self, text: &str, stride: usize, batch: usize) -> Result<TextScore> {
        let window = self.model.max_len();
        let windows = (window, stride, batch);
        score_document(&self.model, &self.tokenizer, text, windows, false)
    }

    /// [`perplexity`](Self::perplexity) in windows of `window` tokens (at most the model's
    /// context); `through_cache`: see [`score_document`].
    pub fn perplexity_in_windows(
        &self,
        text: &str,
        (window, stride, batch): (usize, usize, usize),
        through_cache: bool,
    ) -> Result<TextScore> {
        let windows = (window, stride, batch);
        score_document(&self.model, &self.tokenizer, text, windows, through_cache)
    }
}

/// The chat template in a GGUF file's metadata, with its BOS and EOS tokens' text.
pub(crate) fn gguf_chat(tokenizer: &GgufTokenizer) -> Option<ChatTemplate> {
    let text = |id: Option<u32>| {
        id.and_then(|i| tokenizer.token_bytes(i))
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    };
    tokenizer.chat_template().map(|t| ChatTemplate {
        template: t.to_string(),
        bos: text(tokenizer.bos_id()),
        eos: text(tokenizer.eos_id()),
    })
}

/// `[<|endoftext|>] + encode(text)`: the stream a document of ours is trained and scored as.
pub fn document_tokens(bpe: &Bpe, text: &str) -> Result<Vec<u32>> {
    let mut tokens = vec![bpe.eot()];
    tokens.extend(bpe.encode(text)?);
    Ok(tokens)
}

/// A language model decoded past its context: when the next positions would not fit, the
/// state is rebuilt from the last half of the context ([`LanguageModel::max_len`]) of the
/// tokens fed so far. One row; its caches have room for `capacity` positions (at most the
/// context: a model with a long context need not hold it all for a short generation).
pub struct ContextWindow<'a, T> {
    /// The model decoded.
    pub model: &'a LanguageModel<T>,
    /// Positions the caches hold (at most the model's context).
    pub capacity: usize,
}

/// The window's state: the model's caches and every token fed.
pub struct WindowState<T> {
    /// The model's key/value caches.
    pub caches: LmState<T>,
    /// Every token fed so far.
    pub history: Vec<u32>,
}

impl<T: Float> ContextWindow<'_, T> {
    /// An empty state.
    pub fn start(&self) -> WindowState<T> {
        WindowState {
            caches: self.model.start(1, self.capacity),
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
    fn step(&self, state: &mut WindowState<T>, tokens: &[u32], layout: &StepLayout<'_>) -> Vec<T> {
        let feed = self.feed(state, tokens);
        self.model.step(&mut state.caches, &feed, layout)
    }
}

/// Cut back for speculative decoding: the history and the caches lose the same last tokens.
/// Where the caches cannot lose them (they hold fewer after a rebuild, or a sliding window has
/// released positions before the cut: a draft model run many tokens ahead) they are emptied,
/// to be refilled from the history at the next feed. The target of a speculative search is
/// only ever cut back within its last feed, which a sliding window does not release.
impl<T: Float> Rollback<T> for ContextWindow<'_, T> {
    fn truncate(&self, state: &mut WindowState<T>, len: usize) {
        let removed = state.history.len() - len.min(state.history.len());
        state.history.truncate(len);
        let cached = state.caches.len();
        if removed <= cached && state.caches.can_truncate_row(0, cached - removed) {
            state.caches.truncate_row(0, cached - removed);
        } else {
            state.caches = self.model.start(1, self.capacity);
        }
    }

    fn room(&self, state: &WindowState<T>) -> usize {
        let max_len = self.capacity.min(self.model.max_len());
        max_len.saturating_sub(state.caches.len())
    }
}

impl<T: Float> ContextWindow<'_, T> {
    /// Records `tokens` and returns what to feed the caches: `tokens`, or the recent history
    /// into emptied caches when they would overflow.
    fn feed(&self, state: &mut WindowState<T>, tokens: &[u32]) -> Vec<u32> {
        let max_len = self.capacity.min(self.model.max_len());
        state.history.extend_from_slice(tokens);
        let recent = |n: usize| state.history[state.history.len().saturating_sub(n)..].to_vec();
        if state.caches.is_empty() {
            recent(max_len)
        } else if state.caches.len() + tokens.len() > max_len {
            state.caches = self.model.start(1, self.capacity);
            recent((max_len / 2).max(1))
        } else {
            tokens.to_vec()
        }
    }
}

/// Continues `prompt` (a document's ids) by up to `max_tokens` sampled ids through the KV caches
/// of a [`ContextWindow`], stopping after any of `until` (included in the result); calls `emit`
/// with every new id (an error from it stops the generation and is returned).
pub fn generate_ids<E>(
    model: &LanguageModel<f32>,
    prompt: &[u32],
    max_tokens: usize,
    opts: SamplingOptions,
    rng: &mut Rng,
    until: &[u32],
    emit: impl FnMut(u32) -> std::result::Result<(), E>,
) -> std::result::Result<Vec<u32>, E> {
    let needed = prompt.len().saturating_add(max_tokens);
    let window = ContextWindow {
        model,
        capacity: needed.clamp(1, model.max_len()),
    };
    let mut state = window.start();
    sample_search(
        &window, &mut state, prompt, max_tokens, opts, rng, until, emit,
    )
}

impl TextScore {
    /// The score of `text` from the loss sums of its tokens.
    pub fn of(s: &crate::model::loss::LossStats, text: &str) -> TextScore {
        let chars = text.chars().count();
        TextScore {
            nats_per_token: s.nll(),
            perplexity: s.nll().exp(),
            bits_per_char: s.nll_sum / chars.max(1) as f64 / std::f64::consts::LN_2,
            tokens: s.n_tokens,
            chars,
        }
    }
}

/// Loss per token, perplexity and bits per character of a scored document.
pub struct TextScore {
    /// Mean negative log-likelihood per scored token, in nats.
    pub nats_per_token: f64,
    /// `exp(nats_per_token)`.
    pub perplexity: f64,
    /// Total negative log-likelihood in bits per character of the text.
    pub bits_per_char: f64,
    /// Tokens scored (every token after the first).
    pub tokens: usize,
    /// Characters (Unicode scalar values) of the text.
    pub chars: usize,
}

/// Scores `text` as one document (every token after the first of
/// [`DecoderTokenizer::document`]), windows of `window` tokens (clamped to the model's context)
/// every `stride` tokens, `batch` windows at once; `through_cache`: fed through the key/value
/// cache (`score_stream_through_cache`, the way a quantised cache is scored) even when it is
/// exact.
pub fn score_document(
    model: &LanguageModel<f32>,
    tokenizer: &DecoderTokenizer,
    text: &str,
    (window, stride, batch): (usize, usize, usize),
    through_cache: bool,
) -> Result<TextScore> {
    if window == 0 {
        return Err(Error::Input("the scoring window must hold a token".into()));
    }
    let tokens = tokenizer.document(text)?;
    model.embedding.check_ids(&tokens)?;
    let window = window.min(model.max_len());
    let s = match through_cache {
        true => score_stream_through_cache(model, &tokens, window, stride, batch),
        false => score_stream(model, &tokens, window, stride, batch),
    };
    Ok(TextScore::of(&s, text))
}
