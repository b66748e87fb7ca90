//! `POST /v1/embeddings` (OpenAI-compatible) for an encoder: `{"input": "text" | ["a", "b"]}`
//! → `{"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [...]}],
//! "model", "usage": {"prompt_tokens", "total_tokens"}}` (the L2-normalised mean-pooled
//! sentence embeddings of [`crate::pipeline::embed`]).

use super::api_error::ApiError;
use super::jobs::Job;
use super::{App, OutcomeGuard};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

/// Inputs per request at most.
pub const MAX_INPUTS: usize = 256;

/// `POST /v1/embeddings`.
pub async fn embeddings(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let mut guard = OutcomeGuard::new(app.metrics.clone());
    let result = async {
        let body: Value = serde_json::from_slice(&body)
            .map_err(|e| ApiError::invalid(None, format!("the body is not valid JSON: {e}")))?;
        app.check_model(&body)?;
        let inputs: Vec<String> = match body.get("input") {
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    ApiError::invalid(Some("input"), "input must be a string or a list of strings")
                })?,
            _ => {
                return Err(ApiError::invalid(
                    Some("input"),
                    "input (a string or a list of strings) is missing",
                ))
            }
        };
        if inputs.is_empty() || inputs.len() > MAX_INPUTS {
            return Err(ApiError::limit(
                "input",
                "too_many_inputs",
                format!(
                    "input has {} strings; 1 to {MAX_INPUTS} per request",
                    inputs.len()
                ),
            ));
        }
        let (vectors, tokens) = app
            .job(|reply| Job::Embed {
                inputs,
                arrived: Instant::now(),
                reply,
            })
            .await?;
        let data: Vec<Value> = vectors
            .iter()
            .enumerate()
            .map(|(i, e)| json!({"object": "embedding", "index": i, "embedding": e}))
            .collect();
        Ok::<Value, ApiError>(json!({
            "object": "list", "data": data, "model": app.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }))
    }
    .await;
    guard.respond(result)
}
