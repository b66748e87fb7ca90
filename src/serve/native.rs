//! llama.cpp's own server routes, so that its users can point their tools here, and the model
//! list of both APIs:
//! - `GET /v1/models` (also `/models`): the one model served, with its context
//!   (`context_length`, vLLM's `max_model_len`, llama.cpp's `meta.n_ctx_train`);
//!   `GET /v1/models/{id}`: the same object, 404 in OpenAI's shape for another id.
//! - `POST /completion` (also `/completions`, as llama.cpp routes it), streamed or not:
//!   [`super::native_completion`].
//! - `POST /tokenize` `{"content", "add_special": false, "with_pieces": false}` →
//!   `{"tokens": [id, ...] | [{"id", "piece"}, ...]}` (`add_special`: the special tokens a
//!   document starts with, BOS); `POST /detokenize` `{"tokens": [...]}` → `{"content"}`.
//! - `POST /apply-template` `{"messages"}` → `{"prompt"}`: the chat template's rendering, as
//!   `/v1/chat/completions` feeds it.
//! - `GET /props`: the context, the slots (`--max-batch`), the default generation settings
//!   (`--n-predict`, `--seed`, `--temp`), the model's name and path and its chat template.
//! - `GET /slots`: one object per slot of the running batch (`--max-batch`): `{"id", "n_ctx",
//!   "speculative": false, "is_processing"}`, the first `running` slots processing (the engine
//!   has no fixed slots: a sequence takes any free row); 501 with `--no-slots`.
//!
//! llama.cpp's server settings that `transformer serve` takes are [`LlamaOptions`].
//!
//! - `POST /chat/completions/input_tokens` (also under `/v1`): the prompt's token count.
//! - `"verbose": true` on the chat and completions routes adds `__verbose: {"prompt"}` to a
//!   whole answer (not to a stream).
//!
//! `/chat/completions` and `/v1/health` are plain aliases (see the router).

use super::api_error::ApiError;
use super::{App, LmFront};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

/// llama.cpp's server settings (`transformer serve --ctx-size --n-predict --seed --temp
/// --no-slots`, named as llama-server names them).
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaOptions {
    /// Tokens one sequence holds at most, prompt and output (`--ctx-size`); default: the
    /// model's context (also the most it can be).
    pub ctx_size: Option<usize>,
    /// The `max_tokens` of a request that gives none (`--n-predict`); default: 16 for
    /// completions, 512 for chat.
    pub n_predict: Option<usize>,
    /// The seed of a request that gives none (`--seed`); default: a new one per request.
    pub seed: Option<u64>,
    /// The temperature of a request that gives none (`--temp`).
    pub temperature: f64,
    /// Whether `GET /slots` answers (`--no-slots`: 501).
    pub slots: bool,
    /// Whether `GET /metrics` answers (`--no-metrics`: 501).
    pub metrics: bool,
    /// Whether `GET /` serves the web page (`--no-webui`: 404).
    pub webui: bool,
    /// Whether a sequence that fills its context goes on after discarding old tokens
    /// (`--context-shift`; see [`super::context_shift`]).
    pub ctx_shift: bool,
}

impl Default for LlamaOptions {
    fn default() -> Self {
        LlamaOptions {
            ctx_size: None,
            n_predict: None,
            seed: None,
            temperature: 1.0,
            slots: true,
            metrics: true,
            webui: true,
            ctx_shift: false,
        }
    }
}

/// A JSON object body, or a 400.
pub(super) fn object(body: &Bytes) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(None, format!("the body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::invalid(None, "the body must be a JSON object"));
    }
    Ok(value)
}

/// Runs `work` on a blocking thread (tokenizing a large body must not hold the async threads).
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(ApiError::internal(format!("the request failed: {e}"))))
}

fn answer(result: Result<Value, ApiError>) -> Response {
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The model object of `/v1/models`.
fn model_object(app: &App) -> Value {
    let mut model = json!({
        "id": app.model_name, "object": "model", "created": 0, "owned_by": "transformer",
    });
    if let Ok(lm) = app.lm() {
        model["context_length"] = lm.max_len.into();
        model["max_model_len"] = lm.max_len.into();
        model["meta"] = json!({"n_ctx_train": lm.max_len, "n_vocab": lm.vocab_size});
    }
    model
}

/// `GET /v1/models`, `GET /models`.
pub async fn models(State(app): State<Arc<App>>) -> Response {
    Json(json!({"object": "list", "data": [model_object(&app)]})).into_response()
}

/// `GET /v1/models/{id}`.
pub async fn model(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    if !app.names.knows(&id) {
        return ApiError::model_not_found(&id, &app.names.all()).into_response();
    }
    Json(model_object(&app)).into_response()
}

/// `POST /tokenize`.
pub async fn tokenize(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let result = async {
        let lm = app.lm()?;
        let body = object(&body)?;
        blocking(move || tokenize_body(&lm, &body)).await
    };
    answer(result.await)
}

fn tokenize_body(lm: &LmFront, body: &Value) -> Result<Value, ApiError> {
    let flag = |name: &'static str| match body.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::invalid(
            Some(name),
            format!("{name} must be true or false"),
        )),
    };
    let (add_special, with_pieces) = (flag("add_special")?, flag("with_pieces")?);
    let Some(text) = body.get("content").and_then(Value::as_str) else {
        return Err(ApiError::invalid(
            Some("content"),
            "content (the text to tokenize) is missing or not a string",
        ));
    };
    let ids = match add_special {
        true => lm.tokenizer.document(text),
        false => lm.tokenizer.encode(text),
    }
    .map_err(|e| ApiError::invalid(Some("content"), e.to_string()))?;
    let tokens: Vec<Value> = if with_pieces {
        ids.iter()
            .map(|&id| {
                let piece = lm.tokenizer.decode(&[id]).unwrap_or_default();
                json!({"id": id, "piece": piece})
            })
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(json!({"tokens": tokens, "count": ids.len(), "max_model_len": lm.max_len}))
}

/// `POST /detokenize`.
pub async fn detokenize(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let result = async {
        let lm = app.lm()?;
        let body = object(&body)?;
        blocking(move || {
            let ids: Vec<u32> = body
                .get("tokens")
                .and_then(|t| serde_json::from_value(t.clone()).ok())
                .ok_or_else(|| {
                    ApiError::invalid(Some("tokens"), "tokens must be a list of token ids")
                })?;
            if let Some(&bad) = ids.iter().find(|&&id| id as usize >= lm.vocab_size) {
                return Err(ApiError::invalid(
                    Some("tokens"),
                    format!(
                        "token id {bad} is outside the vocabulary of {}",
                        lm.vocab_size
                    ),
                ));
            }
            let content = lm
                .tokenizer
                .decode(&ids)
                .map_err(|e| ApiError::invalid(Some("tokens"), e.to_string()))?;
            Ok(json!({"content": content}))
        })
        .await
    };
    answer(result.await)
}

/// `POST /apply-template`.
pub async fn apply_template(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let result = async {
        let lm = app.lm()?;
        let parsed = object(&body)?;
        blocking(move || {
            // The chat route's own rendering: messages (tool calls and results too) and tools.
            let (prompt, _) = super::openai::chat_prompt(&lm, &parsed, &body)?;
            Ok(json!({"prompt": prompt}))
        })
        .await
    };
    answer(result.await)
}

/// `GET /props`.
pub async fn props(State(app): State<Arc<App>>) -> Response {
    let result = app.lm().map(|lm| {
        let template = lm.chat.as_ref().map(|t| t.template.clone());
        let llama = &app.config.llama;
        let n_predict = llama.n_predict.map_or(-1, |n| n as i64);
        // -1: a new seed per request, as llama.cpp writes it.
        let seed = llama.seed.map_or(json!(-1), |s| json!(s));
        json!({
            "default_generation_settings": {
                "n_ctx": lm.max_len,
                "params": {"n_predict": n_predict, "temperature": llama.temperature, "top_k": 0,
                           "top_p": 1.0, "seed": seed,
                           "max_tokens_limit": app.config.max_output_tokens},
            },
            "total_slots": lm.engine.max_batch,
            "model_alias": app.model_name,
            "model_path": app.config.model.display().to_string(),
            "chat_template": template.unwrap_or_default(),
            "modalities": {"vision": false, "audio": false},
            "build_info": concat!("transformer ", env!("CARGO_PKG_VERSION")),
        })
    });
    answer(result)
}

/// `GET /slots`: see the module docs.
pub async fn slots(State(app): State<Arc<App>>) -> Response {
    if !app.config.llama.slots {
        return ApiError::new(
            axum::http::StatusCode::NOT_IMPLEMENTED,
            "not_supported",
            None,
            "this server does not answer /slots (started with --no-slots)",
        )
        .into_response();
    }
    let result = app.lm().map(|lm| {
        let running = app.metrics.gauges().running;
        let slots: Vec<Value> = (0..lm.engine.max_batch)
            .map(|id| {
                json!({"id": id, "n_ctx": lm.max_len, "speculative": false,
                       "is_processing": id < running})
            })
            .collect();
        Value::Array(slots)
    });
    answer(result)
}

/// Whether a request body asks for llama.cpp's `__verbose` (`"verbose": true`).
pub(super) fn asks_verbose(body: &Bytes) -> bool {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("verbose")?.as_bool())
        .unwrap_or(false)
}

/// A successful JSON answer with llama.cpp's `__verbose: {"prompt"}` added (the prompt as
/// fed, decoded).
pub(super) async fn add_verbose(response: Response, prompt: String) -> Response {
    if !response.status().is_success() {
        return response;
    }
    let (parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return ApiError::internal("the answer could not be read back").into_response();
    };
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(mut v) => {
            v["__verbose"] = json!({"prompt": prompt});
            (parts.status, Json(v)).into_response()
        }
        Err(_) => Response::from_parts(parts, axum::body::Body::from(bytes)),
    }
}

/// `POST /chat/completions/input_tokens` (also under `/v1`): `{"input_tokens"}`, the prompt
/// tokens `/v1/chat/completions` would feed for these messages and tools.
pub async fn chat_input_tokens(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let result = async {
        let lm = app.lm()?;
        let parsed = object(&body)?;
        blocking(move || {
            let (prompt, _) = super::openai::chat_prompt(&lm, &parsed, &body)?;
            let ids = lm
                .tokenizer
                .encode(&prompt)
                .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
            Ok(json!({"input_tokens": ids.len()}))
        })
        .await
    };
    answer(result.await)
}
