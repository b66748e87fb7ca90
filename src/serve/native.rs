//! llama.cpp's own server routes, so that its users can point their tools here, and the model
//! list of both APIs:
//! - `GET /v1/models` (also `/models`): the one model served, with its context
//!   (`context_length`, vLLM's `max_model_len`, llama.cpp's `meta.n_ctx_train`);
//!   `GET /v1/models/{id}`: the same object, 404 in OpenAI's shape for another id.
//! - `POST /completion` `{"prompt", "n_predict", "temperature", "top_k", "top_p", "seed",
//!   "stop", "json_schema", "grammar"}` (a JSON schema, a GBNF grammar: constrained decoding) → `{"content", "model", "tokens_predicted", "tokens_evaluated", "stop": true,
//!   "stop_type": "eos" | "limit", "truncated": false}`: `/v1/completions` underneath (the same
//!   checks, queue and engine), answered in llama.cpp's fields. Not streamed (`stream: true` is
//!   refused by name: `/v1/completions` streams), and the llama.cpp options this server does not
//!   have (`n_probs`, `logit_bias`, `mirostat`, `image_data`, `lora`)
//!   are refused by name.
//! - `POST /tokenize` `{"content", "add_special": false, "with_pieces": false}` →
//!   `{"tokens": [id, ...] | [{"id", "piece"}, ...]}` (`add_special`: the special tokens a
//!   document starts with, BOS); `POST /detokenize` `{"tokens": [...]}` → `{"content"}`.
//! - `POST /apply-template` `{"messages"}` → `{"prompt"}`: the chat template's rendering, as
//!   `/v1/chat/completions` feeds it.
//! - `GET /props`: the context, the slots (`--max-batch`), the model's name and path and its chat
//!   template.
//!
//! `/completions`, `/chat/completions` and `/v1/health` are plain aliases (see the router).

use super::api_error::ApiError;
use super::{App, LmFront};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

/// llama.cpp's `/completion` options this server does not have: refused by name.
const UNSUPPORTED_COMPLETION_FIELDS: [&str; 5] =
    ["n_probs", "logit_bias", "mirostat", "image_data", "lora"];

/// A JSON object body, or a 400.
fn object(body: &Bytes) -> Result<Value, ApiError> {
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
    if id != app.model_name && id != app.own_name {
        return ApiError::model_not_found(&id, &app.model_name).into_response();
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
        json!({
            "default_generation_settings": {
                "n_ctx": lm.max_len,
                "params": {"n_predict": -1, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
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

/// `POST /completion`: see the module docs.
pub async fn completion(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let request = match object(&body) {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    if request.get("stream").and_then(Value::as_bool) == Some(true) {
        return ApiError::invalid(
            Some("stream"),
            "stream: POST /completion answers whole; stream with POST /v1/completions",
        )
        .into_response();
    }
    for name in UNSUPPORTED_COMPLETION_FIELDS {
        let present = match request.get(name) {
            None | Some(Value::Null) => false,
            Some(Value::Number(n)) => n.as_f64() != Some(0.0),
            Some(_) => true,
        };
        if present {
            return ApiError::invalid(
                Some(name),
                format!("{name}: this server does not support llama.cpp's {name}"),
            )
            .into_response();
        }
    }
    let response = super::openai::completions(State(app.clone()), body).await;
    if !response.status().is_success() {
        return response;
    }
    let bytes = match axum::body::to_bytes(response.into_body(), usize::MAX).await {
        Ok(b) => b,
        Err(e) => return ApiError::internal(e.to_string()).into_response(),
    };
    let openai: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => return ApiError::internal(e.to_string()).into_response(),
    };
    let choice = &openai["choices"][0];
    let stop_type = match choice["finish_reason"].as_str() {
        Some("length") => "limit",
        _ => "eos",
    };
    Json(json!({
        "content": choice["text"],
        "model": openai["model"],
        "tokens_predicted": openai["usage"]["completion_tokens"],
        "tokens_evaluated": openai["usage"]["prompt_tokens"],
        "tokens_cached": openai["usage"]["prompt_tokens_details"]["cached_tokens"],
        "timings": openai["timings"],
        "system_fingerprint": openai["system_fingerprint"],
        "stop": true,
        "stop_type": stop_type,
        "stopping_word": "",
        "truncated": false,
    }))
    .into_response()
}
