//! `POST /v1/embeddings` (OpenAI-compatible) for an encoder: `{"input": "text" | ["a", "b"] |
//! [ids] | [[ids], ...]}` (a text may also be llama.cpp's `{"prompt_string"}` or
//! `{"content": [text parts]}`; ids and texts mixed are refused) → `{"object": "list", "data": [{"object": "embedding", "index": i,
//! "embedding": [...]}], "model", "usage": {"prompt_tokens", "total_tokens"}}` (the
//! L2-normalised mean-pooled sentence embeddings of [`crate::pipeline::embed`]).
//!
//! Token ids are the model's own, embedded as given (no special tokens added; at most the
//! model's length). `dimensions: k` keeps the first `k` components and divides them by their L2
//! norm (`e'_i = e_i / ‖e_{1..k}‖`, the Matryoshka truncation OpenAI applies);
//! `encoding_format: "base64"` sends each vector as the base64 of its float32 values,
//! little-endian, as OpenAI's clients decode it.

use super::api_error::ApiError;
use super::jobs::{EmbedInput, Job};
use super::{App, OutcomeGuard};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

/// Inputs per request at most.
pub const MAX_INPUTS: usize = 256;

/// The `input` field: strings, or lists of token ids.
fn inputs(body: &Value) -> Result<EmbedInput, ApiError> {
    let shape = "input must be a text (a string, {\"prompt_string\"} or {\"content\": [text parts]}), a list of texts, a list of token ids or a list of lists of token ids (ids and texts are not mixed: the encoder's tokenizer runs with the model)";
    let bad = || ApiError::invalid(Some("input"), shape);
    let id = |v: &Value| {
        v.as_u64()
            .filter(|&x| x <= u32::MAX as u64)
            .map(|x| x as u32)
    };
    let ids = |items: &[Value]| items.iter().map(id).collect::<Option<Vec<u32>>>();
    // A text: a string, llama.cpp's `{"prompt_string": ...}` or `{"content": [text parts]}`.
    let text = |v: &Value| -> Option<String> {
        match v {
            Value::String(s) => Some(s.clone()),
            Value::Object(o) if o.len() == 1 => match (o.get("prompt_string"), o.get("content")) {
                (Some(Value::String(s)), _) => Some(s.clone()),
                (_, Some(Value::Array(parts))) => parts
                    .iter()
                    .map(|p| match p.get("type").and_then(Value::as_str) {
                        Some("text") => p.get("text").and_then(Value::as_str),
                        _ => None,
                    })
                    .collect::<Option<Vec<_>>>()
                    .map(|t| t.concat()),
                _ => None,
            },
            _ => None,
        }
    };
    let input = match body.get("input") {
        Some(v @ (Value::String(_) | Value::Object(_))) => {
            EmbedInput::Texts(vec![text(v).ok_or_else(bad)?])
        }
        Some(Value::Array(items)) => match items.first() {
            None => EmbedInput::Texts(Vec::new()),
            Some(Value::Number(_)) => EmbedInput::Ids(vec![ids(items).ok_or_else(bad)?]),
            Some(Value::Array(_)) => EmbedInput::Ids(
                items
                    .iter()
                    .map(|v| v.as_array().and_then(|list| ids(list)))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(bad)?,
            ),
            Some(_) => EmbedInput::Texts(
                items
                    .iter()
                    .map(text)
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(bad)?,
            ),
        },
        _ => {
            return Err(ApiError::invalid(
                Some("input"),
                "input (a string, a list of strings or of token ids) is missing",
            ))
        }
    };
    let count = match &input {
        EmbedInput::Texts(t) => t.len(),
        EmbedInput::Ids(i) => i.len(),
    };
    if count == 0 || count > MAX_INPUTS {
        return Err(ApiError::limit(
            "input",
            "too_many_inputs",
            format!("input has {count} items; 1 to {MAX_INPUTS} per request"),
        ));
    }
    Ok(input)
}

/// The first `k` components of `e`, renormalised to unit L2 norm (sums in f64; kept as they are
/// when their norm is 0).
pub fn truncate_normalised(e: &[f32], k: usize) -> Vec<f32> {
    let kept = &e[..k.min(e.len())];
    let norm = kept
        .iter()
        .map(|&x| x as f64 * x as f64)
        .sum::<f64>()
        .sqrt();
    if norm == 0.0 {
        return kept.to_vec();
    }
    kept.iter().map(|&x| (x as f64 / norm) as f32).collect()
}

/// Standard base64 (RFC 4648, with padding) of `bytes`.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `POST /v1/embeddings`.
pub async fn embeddings(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let mut guard = OutcomeGuard::new(app.metrics.clone());
    let result = async {
        let body: Value = serde_json::from_slice(&body)
            .map_err(|e| ApiError::invalid(None, format!("the body is not valid JSON: {e}")))?;
        app.check_model(&body)?;
        let inputs = inputs(&body)?;
        let dimensions = match body.get("dimensions") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_u64().filter(|&k| k >= 1).ok_or_else(|| {
                ApiError::invalid(
                    Some("dimensions"),
                    format!("dimensions {v} must be a positive integer"),
                )
            })? as usize),
        };
        let base64_wanted = match body.get("encoding_format") {
            None | Some(Value::Null) => false,
            Some(Value::String(s)) if s == "float" => false,
            Some(Value::String(s)) if s == "base64" => true,
            Some(other) => {
                return Err(ApiError::invalid(
                    Some("encoding_format"),
                    format!("encoding_format {other}: \"float\" or \"base64\""),
                ))
            }
        };
        let (vectors, tokens) = app
            .job(|reply| Job::Embed {
                inputs,
                arrived: Instant::now(),
                reply,
            })
            .await?;
        let width = vectors.first().map_or(0, Vec::len);
        if let Some(k) = dimensions.filter(|&k| k > width) {
            return Err(ApiError::invalid(
                Some("dimensions"),
                format!("dimensions {k} is more than the model's {width}"),
            ));
        }
        let data: Vec<Value> = vectors
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let e = match dimensions {
                    Some(k) => truncate_normalised(e, k),
                    None => e.clone(),
                };
                let embedding = if base64_wanted {
                    let bytes: Vec<u8> = e.iter().flat_map(|x| x.to_le_bytes()).collect();
                    Value::from(base64(&bytes))
                } else {
                    json!(e)
                };
                json!({"object": "embedding", "index": i, "embedding": embedding})
            })
            .collect();
        Ok::<Value, ApiError>(json!({
            "object": "list", "data": data, "model": app.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }))
    }
    .await;
    guard.respond(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648() {
        let cases = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, encoded) in cases {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
        assert_eq!(base64(&[0xff, 0xfe, 0x00]), "//4A");
    }

    #[test]
    fn truncation_renormalises() {
        let e = [3.0f32, 4.0, 12.0];
        assert_eq!(truncate_normalised(&e, 2), vec![0.6, 0.8]);
        assert_eq!(truncate_normalised(&e, 3).len(), 3);
        assert_eq!(truncate_normalised(&[0.0, 0.0], 1), vec![0.0]);
    }
}
