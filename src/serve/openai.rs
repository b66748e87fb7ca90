//! The OpenAI-compatible text endpoints: `POST /v1/completions`, `POST /v1/chat/completions`
//! (`GET /v1/models` is in [`super::native`]).
//!
//! Requests: `prompt` (a string, or a list of one) or `messages` (`[{role, content}]`, rendered
//! by the model's chat template; ChatML for a model without one), `max_tokens` (or
//! `max_completion_tokens`; default 16 for completions, up to 512 for chat), `temperature`
//! (default 1; 0 is greedy), `top_p`, `top_k`, `seed`, `stop` (a string or a list), `stream`,
//! `n` (1 only). Unknown fields are ignored, as OpenAI's own clients send more.
//!
//! Responses: `{"id", "object": "text_completion" | "chat.completion", "created", "model",
//! "choices": [{"index": 0, "text" | "message", "finish_reason": "stop" | "length"}],
//! "usage": {"prompt_tokens", "completion_tokens", "total_tokens"}}`. With `stream: true`,
//! server-sent events, one `data: {json}` per piece of text (`text_completion` /
//! `chat.completion.chunk` with a `delta`; the first chat chunk carries the role), the last with
//! the `finish_reason` and `usage`, then `data: [DONE]`.

use super::api_error::ApiError;
use super::metrics::Outcome;
use super::scheduler::{Event, FinishReason, GenRequest};
use super::text::TextStream;
use super::{App, LmFront, OutcomeGuard};
use crate::decode::sample::SamplingOptions;
use crate::pipeline::chat::{render_chat, ChatMessage, CHATML};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedReceiver;

/// Which endpoint: the shapes of its answers differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flavor {
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

/// The generation parameters every text endpoint shares, checked.
struct Params {
    max_tokens: Option<usize>,
    sampling: SamplingOptions,
    seed: u64,
    stop: Vec<String>,
    stream: bool,
}

fn params(body: &Value, seed_default: u64) -> Result<Params, ApiError> {
    let max_tokens = match field::<usize>(body, "max_tokens")? {
        Some(n) => Some(n),
        None => field::<usize>(body, "max_completion_tokens")?,
    };
    // llama.cpp's name of max_tokens; -1 (its "until the end") is the default.
    let max_tokens = match max_tokens {
        Some(n) => Some(n),
        None => field::<i64>(body, "n_predict")?
            .filter(|&n| n >= 0)
            .map(|n| n as usize),
    };
    if max_tokens == Some(0) {
        return Err(ApiError::invalid(
            Some("max_tokens"),
            "max_tokens must be at least 1",
        ));
    }
    let temperature = field::<f64>(body, "temperature")?.unwrap_or(1.0);
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
    if let Some(n) = field::<i64>(body, "n")?.filter(|&n| n != 1) {
        return Err(ApiError::invalid(
            Some("n"),
            format!("n {n}: this server returns one choice per request (n = 1)"),
        ));
    }
    let stop = strings(body, "stop")?.unwrap_or_default();
    if stop.len() > 16 {
        return Err(ApiError::invalid(
            Some("stop"),
            format!("{} stop strings; at most 16", stop.len()),
        ));
    }
    Ok(Params {
        max_tokens,
        sampling: SamplingOptions {
            temperature,
            top_k,
            top_p,
        },
        seed: field::<u64>(body, "seed")?.unwrap_or(seed_default),
        stop,
        stream: field::<bool>(body, "stream")?.unwrap_or(false),
    })
}

/// The conversation of a chat request.
pub(super) fn messages(body: &Value) -> Result<Vec<ChatMessage>, ApiError> {
    let Some(list) = body.get("messages").and_then(Value::as_array) else {
        return Err(ApiError::invalid(
            Some("messages"),
            "messages must be a list of {role, content}",
        ));
    };
    if list.is_empty() {
        return Err(ApiError::invalid(Some("messages"), "messages is empty"));
    }
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let role = m.get("role").and_then(Value::as_str);
            // content: a string, or OpenAI's list of parts `[{"type": "text", "text": ...}]`.
            let content = match m.get("content") {
                Some(Value::String(s)) => Some(s.clone()),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Option<Vec<_>>>()
                    .map(|t| t.concat()),
                _ => None,
            };
            match (role, content) {
                (Some(role), Some(content)) => Ok(ChatMessage::new(role, &content)),
                _ => Err(ApiError::invalid(
                    Some("messages"),
                    format!("messages[{i}] needs a string role and a text content"),
                )),
            }
        })
        .collect()
}

/// Seconds since the Unix epoch (`created`).
fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A prepared request: checked, tokenized, queued.
struct Accepted {
    events: UnboundedReceiver<Event>,
    stop: Vec<String>,
    stream: bool,
    prompt_tokens: usize,
}

/// Checks the limits, then queues the request with the engine (429 when the queue is full).
fn submit(
    app: &App,
    lm: &LmFront,
    prompt: Vec<u32>,
    p: Params,
    default_max: usize,
) -> Result<Accepted, ApiError> {
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
            format!("the prompt has {n} tokens; the limit is {input_limit} (--max-input-tokens, and the model's context of {} less one)", lm.max_len),
        )
        .with_context(n, lm.max_len));
    }
    let room = lm.max_len - n;
    let max_tokens = p
        .max_tokens
        .unwrap_or(default_max.min(room).min(cfg.max_output_tokens));
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
    if max_tokens > room {
        return Err(ApiError::limit(
            "max_tokens",
            "context_length_exceeded",
            format!("the prompt ({n} tokens) plus max_tokens ({max_tokens}) is over the model's context of {} tokens", lm.max_len),
        ));
    }
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
    let req = GenRequest {
        prompt,
        max_tokens,
        sampling: p.sampling,
        seed: p.seed,
        stop_ids: lm.end_tokens.clone(),
        arrived: now,
        deadline: now + Duration::from_secs_f64(cfg.timeout_s),
        events: tx,
    };
    if lm.requests.send(req).is_err() {
        app.metrics.queued.fetch_sub(1, Ordering::AcqRel);
        return Err(ApiError::internal("the engine has stopped"));
    }
    Ok(Accepted {
        events: rx,
        stop: p.stop,
        stream: p.stream,
        prompt_tokens: n,
    })
}

/// Parses the body and builds the prompt of either endpoint.
fn prepare(app: &App, flavor: Flavor, body: &Bytes) -> Result<(Arc<LmFront>, Accepted), ApiError> {
    let lm = app.lm()?;
    let body: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(None, format!("the body is not valid JSON: {e}")))?;
    if !body.is_object() {
        return Err(ApiError::invalid(None, "the body must be a JSON object"));
    }
    app.check_model(&body)?;
    let seed_default = app.next_id.fetch_add(1, Ordering::Relaxed);
    let p = params(&body, seed_default)?;
    let (prompt, default_max) = match flavor {
        Flavor::Completion => {
            let prompt = strings(&body, "prompt")?
                .ok_or_else(|| ApiError::invalid(Some("prompt"), "prompt is missing"))?;
            let [text] = &prompt[..] else {
                return Err(ApiError::invalid(
                    Some("prompt"),
                    "prompt must be one string (one completion per request)",
                ));
            };
            let ids = lm
                .tokenizer
                .document(text)
                .map_err(|e| ApiError::invalid(Some("prompt"), e.to_string()))?;
            (ids, 16)
        }
        Flavor::Chat => {
            let messages = messages(&body)?;
            let text = match &lm.chat {
                Some(t) => t.prompt(&messages),
                None => render_chat(CHATML, &messages, true, "", ""),
            }
            .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
            let ids = lm
                .tokenizer
                .encode(&text)
                .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
            (ids, 512)
        }
    };
    let accepted = submit(app, &lm, prompt, p, default_max)?;
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
    };
    if accepted.stream {
        stream(lm, accepted, reply, guard).into_response()
    } else {
        whole(lm, accepted, reply, guard).await
    }
}

/// What every answer of one request repeats.
struct Reply {
    flavor: Flavor,
    id: String,
    created: u64,
    model: String,
}

impl Reply {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.flavor, chunk) {
            (Flavor::Completion, _) => "text_completion",
            (Flavor::Chat, false) => "chat.completion",
            (Flavor::Chat, true) => "chat.completion.chunk",
        }
    }

    fn usage(prompt: usize, completion: usize) -> Value {
        json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
    }

    /// The non-streamed answer.
    fn whole(&self, text: &str, reason: FinishReason, prompt: usize, completion: usize) -> Value {
        let choice = match self.flavor {
            Flavor::Completion => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": reason.as_str()})
            }
            Flavor::Chat => {
                json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": reason.as_str()})
            }
        };
        json!({"id": self.id, "object": self.object(false), "created": self.created, "model": self.model,
               "choices": [choice], "usage": Self::usage(prompt, completion)})
    }

    /// One streamed chunk: a piece of text, or (with `finish`) the last one.
    fn chunk(
        &self,
        text: Option<&str>,
        role: bool,
        finish: Option<(FinishReason, usize, usize)>,
    ) -> Value {
        let reason = finish.map(|f| f.0.as_str());
        let choice = match self.flavor {
            Flavor::Completion => {
                json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": reason})
            }
            Flavor::Chat => {
                let mut delta = serde_json::Map::new();
                if role {
                    delta.insert("role".into(), "assistant".into());
                }
                if let Some(t) = text {
                    delta.insert("content".into(), t.into());
                }
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": reason})
            }
        };
        let mut out = json!({"id": self.id, "object": self.object(true), "created": self.created, "model": self.model, "choices": [choice]});
        if let Some((_, p, c)) = finish {
            out["usage"] = Self::usage(p, c);
        }
        out
    }
}

/// Collects the whole answer. Dropping this future (the client went away) drops the receiver,
/// which the engine sees at its next step: the sequence leaves and its blocks are freed.
async fn whole(
    lm: Arc<LmFront>,
    mut acc: Accepted,
    reply: Reply,
    mut guard: OutcomeGuard,
) -> Response {
    let mut text = TextStream::new(acc.stop.clone());
    let mut out = String::new();
    let mut completion = 0;
    while let Some(event) = acc.events.recv().await {
        match event {
            Event::Token(id) => {
                completion += 1;
                if lm.end_tokens.contains(&id) {
                    continue;
                }
                match text.push(&lm.tokenizer, id) {
                    Ok(piece) => out.push_str(&piece),
                    Err(e) => return fail(&mut guard, ApiError::internal(e.to_string())),
                }
                if text.stopped() {
                    guard.set(Outcome::Ok);
                    let body = reply.whole(&out, FinishReason::Stop, acc.prompt_tokens, completion);
                    return Json(body).into_response();
                }
            }
            Event::Finished {
                reason,
                prompt_tokens,
                completion_tokens,
            } => {
                match text.finish(&lm.tokenizer) {
                    Ok(piece) => out.push_str(&piece),
                    Err(e) => return fail(&mut guard, ApiError::internal(e.to_string())),
                }
                let reason = if text.stopped() {
                    FinishReason::Stop
                } else {
                    reason
                };
                guard.set(Outcome::Ok);
                return Json(reply.whole(&out, reason, prompt_tokens, completion_tokens))
                    .into_response();
            }
            Event::TimedOut => return fail(&mut guard, ApiError::timeout(lm.timeout_s)),
        }
    }
    fail(
        &mut guard,
        ApiError::internal("the engine dropped the request"),
    )
}

fn fail(guard: &mut OutcomeGuard, e: ApiError) -> Response {
    guard.set(e.outcome());
    e.into_response()
}

/// The state of a streamed answer between events.
struct Streaming {
    lm: Arc<LmFront>,
    acc: Accepted,
    reply: Reply,
    guard: OutcomeGuard,
    text: TextStream,
    completion: usize,
    role_sent: bool,
    done: bool,
    /// An event to send before anything else.
    pending: Option<SseEvent>,
}

impl Streaming {
    fn data(
        &mut self,
        text: Option<&str>,
        finish: Option<(FinishReason, usize, usize)>,
    ) -> SseEvent {
        let role = self.reply.flavor == Flavor::Chat && !self.role_sent;
        self.role_sent = true;
        SseEvent::default().data(self.reply.chunk(text, role, finish).to_string())
    }

    /// The next event to send, `None` after `[DONE]`.
    async fn next(&mut self) -> Option<SseEvent> {
        if let Some(event) = self.pending.take() {
            return Some(event);
        }
        if self.done {
            return None;
        }
        loop {
            let Some(event) = self.acc.events.recv().await else {
                self.done = true;
                self.guard.set(Outcome::Error);
                return Some(
                    SseEvent::default().data(
                        ApiError::internal("the engine dropped the request")
                            .body()
                            .to_string(),
                    ),
                );
            };
            match event {
                Event::Token(id) => {
                    self.completion += 1;
                    if self.lm.end_tokens.contains(&id) {
                        continue;
                    }
                    let piece = self.text.push(&self.lm.tokenizer, id).unwrap_or_default();
                    if self.text.stopped() {
                        // The stop string ends it here; the engine frees the sequence when this
                        // stream (and its receiver) is dropped after [DONE].
                        let finish = (FinishReason::Stop, self.acc.prompt_tokens, self.completion);
                        let piece = (!piece.is_empty()).then_some(piece);
                        return Some(self.finish(piece, finish));
                    }
                    if !piece.is_empty() {
                        return Some(self.data(Some(&piece), None));
                    }
                }
                Event::Finished {
                    reason,
                    prompt_tokens,
                    completion_tokens,
                } => {
                    let piece = self.text.finish(&self.lm.tokenizer).unwrap_or_default();
                    let reason = if self.text.stopped() {
                        FinishReason::Stop
                    } else {
                        reason
                    };
                    let piece = (!piece.is_empty()).then_some(piece);
                    return Some(self.finish(piece, (reason, prompt_tokens, completion_tokens)));
                }
                Event::TimedOut => {
                    self.done = true;
                    self.guard.set(Outcome::Timeout);
                    return Some(
                        SseEvent::default()
                            .data(ApiError::timeout(self.lm.timeout_s).body().to_string()),
                    );
                }
            }
        }
    }

    /// The last text (if any) and the finish chunk; `[DONE]` comes after them.
    fn finish(&mut self, piece: Option<String>, finish: (FinishReason, usize, usize)) -> SseEvent {
        self.done = true;
        self.guard.set(Outcome::Ok);
        match piece {
            Some(p) => {
                let first = self.data(Some(&p), None);
                self.pending = Some(self.data(None, Some(finish)));
                first
            }
            None => self.data(None, Some(finish)),
        }
    }
}

/// Server-sent events: `data: {chunk}` per piece, the finish chunk, `data: [DONE]`.
fn stream(lm: Arc<LmFront>, acc: Accepted, reply: Reply, guard: OutcomeGuard) -> impl IntoResponse {
    let text = TextStream::new(acc.stop.clone());
    let state = Streaming {
        lm,
        acc,
        reply,
        guard,
        text,
        completion: 0,
        role_sent: false,
        done: false,
        pending: None,
    };
    let events = futures_util::stream::unfold(Some(state), |state| async move {
        let mut state = state?;
        match state.next().await {
            Some(event) => Some((Ok::<_, Infallible>(event), Some(state))),
            None => Some((Ok(SseEvent::default().data("[DONE]")), None)),
        }
    });
    Sse::new(events)
}
