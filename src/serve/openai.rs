//! The OpenAI-compatible text endpoints: `POST /v1/completions`, `POST /v1/chat/completions`
//! (`GET /v1/models` is in [`super::native`]).
//!
//! Requests: `prompt` (a string, a list of strings, a list of token ids or a list of such lists:
//! one prompt each) or `messages` (rendered with `tools` by the model's chat template, ChatML
//! for a model without one: `chat_prompt.rs`), `max_tokens` (or `max_completion_tokens`; default
//! 16 for completions, up to 512 for chat), `temperature` (default 1; 0 is greedy), `top_p`,
//! `top_k`, `seed`, `stop` (a string or a list), `stream`, and the sampling and scoring options of
//! [`options`] (`n`, `logprobs`, `top_logprobs`, `echo`, `logit_bias`, the penalties, `min_p`,
//! `stream_options`). Unknown fields are ignored, as OpenAI's own clients send more; the known
//! ones this server does not implement are refused by name.
//!
//! Responses: `{"id", "object": "text_completion" | "chat.completion", "created", "model",
//! "choices": [{"index", "text" | "message", "logprobs", "finish_reason": "stop" | "length" |
//! "tool_calls"}], "usage": {"prompt_tokens", "completion_tokens", "total_tokens"}}`, one choice
//! per prompt and `n` ([`choice`]); a chat reply that calls tools has `message.tool_calls`
//! (`[{id, type: "function", function: {name, arguments}}]`, [`tool_calls`]). With `stream:
//! true`, server-sent events, one `data: {json}` per piece of text (`text_completion` /
//! `chat.completion.chunk` with a `delta`; each choice's first chat chunk carries the role;
//! tool calls in one `delta.tool_calls` chunk at the end of their choice), each choice's last
//! with its `finish_reason`, the usage on the last finish chunk or, with
//! `stream_options.include_usage`, in a chunk of its own with `choices: []` (every other chunk
//! then has `"usage": null`), then `data: [DONE]`.

mod answer;
pub(super) use answer::Reply;
mod chat_prompt;
mod prompts;
use prompts::completion_prompts;
pub mod forced_tools;
pub(super) use chat_prompt::chat_prompt;
pub mod choice;
pub mod logprobs;
pub mod options;
pub mod tool_calls;

use super::api_error::ApiError;
use super::context_shift;
use super::scheduler::{Event, GenRequest, RowOptions};
use super::{App, LmFront, OutcomeGuard};
use crate::decode::constraint::{Constraint, Grammar};
use crate::decode::sample::SamplingOptions;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use choice::{ChoiceState, Receivers};
use options::Scoring;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedReceiver;

/// Which endpoint: the shapes of its answers differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    Completion,
    Chat,
}

/// Field `name` of the request object as a `T`, `None` when absent or null; a wrong type is a
/// 400 naming the field.
fn field<T: DeserializeOwned>(body: &Value, name: &'static str) -> Result<Option<T>, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone())
            .map(Some)
            .map_err(|e| ApiError::invalid(Some(name), format!("{name}: {e}"))),
    }
}

/// A string or a list of strings (`prompt`, `stop`).
fn strings(body: &Value, name: &'static str) -> Result<Option<Vec<String>>, ApiError> {
    match body.get(name) {
        Some(Value::String(s)) => Ok(Some(vec![s.clone()])),
        _ => field::<Vec<String>>(body, name).map_err(|_| {
            ApiError::invalid(
                Some(name),
                format!("{name} must be a string or a list of strings"),
            )
        }),
    }
}

/// `n_predict: -1`: generate until the context is full (at most `--max-output-tokens`).
const UNTIL_FULL: usize = usize::MAX;

/// The generation parameters every text endpoint shares, checked.
struct Params {
    /// [`UNTIL_FULL`]: until the context is full (`n_predict: -1`).
    max_tokens: Option<usize>,
    /// Whether the budget came as llama.cpp's `n_predict` (see [`params`]).
    native_budget: bool,
    /// Prompt tokens a context shift keeps (`n_keep`; -1, the whole prompt: `usize::MAX`).
    n_keep: usize,
    sampling: SamplingOptions,
    seed: u64,
    stop: Vec<String>,
    stream: bool,
    scoring: Scoring,
}

fn params(
    body: &Value,
    seed_default: u64,
    temperature_default: f64,
    chat: bool,
    vocab: usize,
) -> Result<Params, ApiError> {
    let max_tokens = match field::<usize>(body, "max_tokens")? {
        Some(n) => Some(n),
        None => field::<usize>(body, "max_completion_tokens")?,
    };
    // llama.cpp's name of max_tokens, with llama.cpp's meaning: a negative value generates
    // until the context is full, and a value past the context stops there (or shifts it,
    // --context-shift) where max_tokens past the context is refused.
    let (max_tokens, native_budget) = match max_tokens {
        Some(n) => (Some(n), false),
        None => match field::<i64>(body, "n_predict")? {
            Some(n) if n < 0 => (Some(UNTIL_FULL), true),
            Some(n) => (Some(n as usize), true),
            None => (None, false),
        },
    };
    let n_keep = match field::<i64>(body, "n_keep")? {
        None => 0,
        Some(-1) => usize::MAX,
        Some(n) if n >= 0 => n as usize,
        Some(n) => {
            return Err(ApiError::invalid(
                Some("n_keep"),
                format!("n_keep {n} must be >= 0, or -1 for the whole prompt"),
            ))
        }
    };
    if max_tokens == Some(0) {
        return Err(ApiError::invalid(
            Some("max_tokens"),
            "max_tokens must be at least 1",
        ));
    }
    let temperature = field::<f64>(body, "temperature")?.unwrap_or(temperature_default);
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(ApiError::invalid(
            Some("temperature"),
            format!("temperature {temperature} must be >= 0"),
        ));
    }
    let top_p = field::<f64>(body, "top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid(
            Some("top_p"),
            format!("top_p {top_p} must be in (0, 1]"),
        ));
    }
    let top_k = match field::<i64>(body, "top_k")? {
        None => 0,
        Some(k) if k <= 0 => 0,
        Some(k) => k as usize,
    };
    let stop = strings(body, "stop")?.unwrap_or_default();
    if stop.len() > 16 {
        return Err(ApiError::invalid(
            Some("stop"),
            format!("{} stop strings; at most 16", stop.len()),
        ));
    }
    let stream = field::<bool>(body, "stream")?.unwrap_or(false);
    Ok(Params {
        scoring: options::scoring(body, chat, vocab, stream)?,
        max_tokens,
        native_budget,
        n_keep,
        sampling: SamplingOptions {
            temperature,
            top_k,
            top_p,
        },
        seed: field::<u64>(body, "seed")?.unwrap_or(seed_default),
        stop,
        stream,
    })
}

/// Seconds since the Unix epoch (`created`).
fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A prepared request: checked, tokenized, queued (one row per choice).
pub struct Accepted {
    /// Per choice, in order of index.
    pub choices: Vec<ChoiceState>,
    pub receivers: Receivers,
    pub stream: bool,
    pub scoring: Scoring,
    /// The seed of the first choice (the others: `seed + index`), the sampling, and the
    /// `max_tokens` a request that gives none gets (llama.cpp's `generation_settings`).
    pub seed: u64,
    pub sampling: SamplingOptions,
    pub default_max_tokens: usize,
}

/// Prompts per completions request at most, and rows (prompts × `n`) per request.
pub const MAX_PROMPTS: usize = 16;
pub const MAX_ROWS: usize = 64;

/// Checks the limits of one row, then queues it with the engine (429 when the queue is full).
fn submit(
    app: &App,
    lm: &LmFront,
    prompt: Vec<u32>,
    p: &Params,
    seed: u64,
    default_max: usize,
    constraint: Option<Constraint>,
) -> Result<UnboundedReceiver<Event>, ApiError> {
    let cfg = &app.config;
    let n = prompt.len();
    if n == 0 {
        return Err(ApiError::invalid(Some("prompt"), "the prompt is empty"));
    }
    if let Some(&bad) = prompt.iter().find(|&&id| id as usize >= lm.vocab_size) {
        return Err(ApiError::invalid(
            Some("prompt"),
            format!(
                "token id {bad} is outside the vocabulary of {}",
                lm.vocab_size
            ),
        ));
    }
    let input_limit = cfg
        .max_input_tokens
        .unwrap_or(lm.max_len - 1)
        .min(lm.max_len - 1);
    if n > input_limit {
        return Err(ApiError::limit(
            "prompt",
            "context_length_exceeded",
            format!("the prompt ({n} tokens) exceeds the available context size ({input_limit} tokens: --max-input-tokens, and the context of {} less one)", lm.max_len),
        )
        .with_context(n, lm.max_len));
    }
    let room = lm.max_len - n;
    // --context-shift: a row without a grammar goes on past the context's end.
    let shift = cfg.llama.ctx_shift && constraint.is_none();
    let max_tokens = match p.max_tokens {
        None => default_max.min(room).min(cfg.max_output_tokens),
        Some(UNTIL_FULL) if shift => cfg.max_output_tokens,
        Some(UNTIL_FULL) => room.min(cfg.max_output_tokens),
        Some(n) => n,
    };
    if max_tokens > cfg.max_output_tokens {
        return Err(ApiError::limit(
            "max_tokens",
            "max_tokens_exceeded",
            format!(
                "max_tokens {max_tokens} is over the limit of {} (--max-output-tokens)",
                cfg.max_output_tokens
            ),
        ));
    }
    if max_tokens > room && !shift && !p.native_budget {
        return Err(ApiError::limit(
            "max_tokens",
            "context_length_exceeded",
            format!("the prompt ({n} tokens) plus max_tokens ({max_tokens}) is over the model's context of {} tokens", lm.max_len),
        ));
    }
    // What the first row generates at most; with a shift, continuations do the rest.
    let total = max_tokens;
    let max_tokens = max_tokens.min(room);
    let blocks = lm.engine.blocks_for(n, max_tokens);
    if blocks > lm.engine.pool_blocks {
        return Err(ApiError::limit(
            "max_tokens",
            "kv_memory_exceeded",
            format!(
                "the prompt plus max_tokens ({} tokens) needs {blocks} KV blocks of {}; the pool holds {} (--kv-memory)",
                n + max_tokens,
                lm.engine.block_rows,
                lm.engine.pool_blocks
            ),
        ));
    }
    if p.scoring.row.prompt_logprobs.is_some() && n > MAX_ECHO_SCORED {
        return Err(ApiError::limit(
            "echo",
            "context_length_exceeded",
            format!("echo with logprobs scores prompts of at most {MAX_ECHO_SCORED} tokens; this one has {n}"),
        ));
    }
    if app.draining.load(Ordering::Relaxed) {
        return Err(ApiError::unavailable("the server is shutting down"));
    }
    let queued = app
        .metrics
        .queued
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
            (q < cfg.max_queue).then_some(q + 1)
        });
    if queued.is_err() {
        return Err(ApiError::queue_full(cfg.max_queue));
    }
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let now = Instant::now();
    let deadline = now + Duration::from_secs_f64(cfg.timeout_s);
    let continuation = (shift && total > max_tokens).then(|| {
        let continuation = context_shift::Continuation {
            n_ctx: lm.max_len,
            n_keep: p.n_keep.min(n),
            max_tokens: total,
            sampling: p.sampling,
            options: RowOptions {
                prompt_logprobs: None,
                ..p.scoring.row.clone()
            },
            seed,
            stop_ids: lm.end_tokens.clone(),
            arrived: now,
            deadline,
            requests: lm.requests.clone(),
            metrics: app.metrics.clone(),
            max_queue: cfg.max_queue,
        };
        (prompt.clone(), continuation)
    });
    let req = GenRequest {
        prompt,
        max_tokens,
        sampling: p.sampling,
        options: p.scoring.row.clone(),
        constraint,
        seed,
        stop_ids: lm.end_tokens.clone(),
        arrived: now,
        deadline,
        events: tx,
    };
    if lm.requests.send(req).is_err() {
        app.metrics.queued.fetch_sub(1, Ordering::AcqRel);
        return Err(ApiError::internal("the engine has stopped"));
    }
    Ok(match continuation {
        Some((prompt, c)) => context_shift::relay(prompt, rx, c),
        None => rx,
    })
}

/// `grammar` (asked for by `field`) compiled against the model's vocabulary; a 400 naming the
/// field with llguidance's message when it does not compile.
fn compile(lm: &LmFront, field: &'static str, grammar: &Grammar) -> Result<Constraint, ApiError> {
    let vocab = lm.constraints.as_ref().map_err(|why| {
        ApiError::invalid(
            Some(field),
            format!("{field}: constrained decoding is not available for this model: {why}"),
        )
    })?;
    vocab
        .compile(grammar)
        .map_err(|e| ApiError::invalid(Some(field), format!("{field}: {e}")))
}

/// Prompt tokens `echo` with `logprobs` scores at most (every position's distribution is kept
/// while the prompt is fed).
pub const MAX_ECHO_SCORED: usize = 4096;

/// Parses the body and queues every choice of either endpoint.
pub(super) fn prepare(
    app: &App,
    flavor: Flavor,
    body: &Bytes,
) -> Result<(Arc<LmFront>, Accepted), ApiError> {
    let lm = app.lm()?;
    let raw: &[u8] = body;
    let body: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(None, format!("the body is not valid JSON: {e}")))?;
    if !body.is_object() {
        return Err(ApiError::invalid(None, "the body must be a JSON object"));
    }
    app.check_model(&body)?;
    let llama = &app.config.llama;
    let seed_default = match llama.seed {
        Some(seed) => seed,
        None => app.next_id.fetch_add(1, Ordering::Relaxed),
    };
    let chat = flavor == Flavor::Chat;
    let p = params(&body, seed_default, llama.temperature, chat, lm.vocab_size)?;
    let (prompts, tools, default_max) = match flavor {
        Flavor::Completion => (
            completion_prompts(&lm, &body)?,
            None,
            llama.n_predict.unwrap_or(16),
        ),
        Flavor::Chat => {
            if body.get("prompt").is_some_and(|v| !v.is_null()) {
                return Err(ApiError::invalid(
                    Some("prompt"),
                    "prompt is a completions field; chat takes messages",
                ));
            }
            let (text, tools) = chat_prompt::chat_prompt(&lm, &body, raw)?;
            let ids = lm
                .tokenizer
                .encode(&text)
                .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
            (
                vec![(ids, String::new())],
                tools,
                llama.n_predict.unwrap_or(512),
            )
        }
    };
    let forced = tools.as_ref().and_then(|t| t.forced.as_ref());
    let constraint = match (&p.scoring.grammar, forced) {
        (Some((field, _)), Some(_)) => {
            return Err(ApiError::invalid(
                Some(field),
                format!("{field}: a required or named tool_choice already constrains the reply"),
            ))
        }
        (Some((field, grammar)), None) => Some(compile(&lm, field, grammar)?),
        (None, Some(grammar)) => Some(compile(&lm, "tool_choice", grammar)?),
        (None, None) => None,
    };
    let n = p.scoring.n;
    if prompts.len() * n > MAX_ROWS {
        return Err(ApiError::limit(
            "n",
            "too_many_choices",
            format!(
                "{} prompts x n {n} choices; at most {MAX_ROWS} per request",
                prompts.len()
            ),
        ));
    }
    let mut choices = Vec::with_capacity(prompts.len() * n);
    let mut receivers = Vec::with_capacity(prompts.len() * n);
    for (i, (ids, shown)) in prompts.into_iter().enumerate() {
        for c in 0..n {
            let index = i * n + c;
            let seed = p.seed.wrapping_add(index as u64);
            let row_constraint = constraint.clone();
            receivers.push(submit(
                app,
                &lm,
                ids.clone(),
                &p,
                seed,
                default_max,
                row_constraint,
            )?);
            let echo = p.scoring.echo.then(|| shown.clone());
            choices.push(ChoiceState::new(
                index,
                ids.clone(),
                c == 0,
                echo,
                p.stop.clone(),
                tools.as_ref(),
            ));
        }
    }
    let accepted = Accepted {
        choices,
        receivers: Receivers::new(receivers),
        stream: p.stream,
        scoring: p.scoring,
        seed: p.seed,
        sampling: p.sampling,
        default_max_tokens: default_max,
    };
    Ok((lm, accepted))
}

/// `POST /v1/completions`.
pub async fn completions(State(app): State<Arc<App>>, body: Bytes) -> Response {
    respond(app, Flavor::Completion, body).await
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(State(app): State<Arc<App>>, body: Bytes) -> Response {
    respond(app, Flavor::Chat, body).await
}

async fn respond(app: Arc<App>, flavor: Flavor, body: Bytes) -> Response {
    let mut guard = OutcomeGuard::new(app.metrics.clone());
    // Parsing, templating and tokenizing a large body takes milliseconds of CPU: off the
    // async threads, so that /health and the streams keep answering meanwhile.
    // llama.cpp's `verbose`: the answer adds `__verbose` with the prompt fed.
    let verbose = super::native::asks_verbose(&body);
    let prepared = {
        let app = app.clone();
        tokio::task::spawn_blocking(move || prepare(&app, flavor, &body))
            .await
            .unwrap_or_else(|e| {
                Err(ApiError::internal(format!(
                    "preparing the request failed: {e}"
                )))
            })
    };
    let (lm, accepted) = match prepared {
        Ok(x) => x,
        Err(e) => {
            guard.set(e.outcome());
            return e.into_response();
        }
    };
    let id = format!(
        "{}-{}",
        match flavor {
            Flavor::Completion => "cmpl",
            Flavor::Chat => "chatcmpl",
        },
        app.next_id.fetch_add(1, Ordering::Relaxed)
    );
    let reply = Reply {
        flavor,
        id,
        created: now_unix(),
        model: app.model_name.clone(),
        fingerprint: lm.fingerprint.clone(),
    };
    if accepted.stream {
        answer::stream(lm, accepted, reply, guard).into_response()
    } else {
        let prompt = verbose.then(|| lm.tokenizer.decode(&accepted.choices[0].prompt_ids));
        let response = answer::whole(lm, accepted, reply, guard).await;
        match prompt {
            Some(prompt) => super::native::add_verbose(response, prompt.unwrap_or_default()).await,
            None => response,
        }
    }
}
