//! The prompts of a completions request, as OpenAI and llama.cpp write them.

use super::MAX_PROMPTS;
use crate::serve::api_error::ApiError;
use crate::serve::LmFront;
use serde_json::Value;

/// A completions request's prompts: `(ids, text echo shows)`, from a string, a list of strings,
/// a list of token ids with texts mixed in (one sequence), or a list of those, of strings and
/// of llama.cpp's `{"prompt_string"}` objects (one prompt each).
pub(super) fn completion_prompts(lm: &LmFront, body: &Value) -> Result<Vec<(Vec<u32>, String)>, ApiError> {
    let bad = |why: &str| ApiError::invalid(Some("prompt"), why.to_string());
    let shape = "prompt must be a string, a list of token ids (texts may be mixed in), or a list of those";
    let id = |v: &Value| {
        v.as_u64()
            .filter(|&x| x <= u32::MAX as u64)
            .map(|x| x as u32)
    };
    let text = |s: &str| -> Result<(Vec<u32>, String), ApiError> {
        let ids = lm
            .tokenizer
            .document(s)
            .map_err(|e| ApiError::invalid(Some("prompt"), e.to_string()))?;
        Ok((ids, s.to_string()))
    };
    let tokens = |ids: Vec<u32>| -> (Vec<u32>, String) {
        let shown = lm.tokenizer.decode(&ids).unwrap_or_default();
        (ids, shown)
    };
    // One sequence from ids and texts mixed, as llama.cpp reads `[12, 34, "text", 56]`: ids as
    // given, texts tokenized (the document's special tokens only for a text that starts it).
    let mixed = |items: &[Value]| -> Result<(Vec<u32>, String), ApiError> {
        let mut out = Vec::new();
        for (k, v) in items.iter().enumerate() {
            match v {
                Value::String(s) => {
                    let piece = match k {
                        0 => lm.tokenizer.document(s),
                        _ => lm.tokenizer.encode(s),
                    };
                    out.extend(piece.map_err(|e| ApiError::invalid(Some("prompt"), e.to_string()))?);
                }
                v => out.push(id(v).ok_or_else(|| bad(shape))?),
            }
        }
        Ok(tokens(out))
    };
    let one = |v: &Value| -> Result<(Vec<u32>, String), ApiError> {
        match v {
            Value::String(s) => text(s),
            Value::Array(items) if !items.is_empty() => mixed(items),
            // llama.cpp's prompt object, text only.
            Value::Object(o) if o.len() == 1 => match o.get("prompt_string") {
                Some(Value::String(s)) => text(s),
                _ => Err(bad(shape)),
            },
            _ => Err(bad(shape)),
        }
    };
    let prompts = match body.get("prompt") {
        None | Some(Value::Null) => return Err(bad("prompt is missing")),
        Some(Value::String(s)) => vec![text(s)?],
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(bad("prompt is an empty list"))
        }
        // Numbers (with texts or not): one sequence; otherwise each item is a prompt.
        Some(Value::Array(items))
            if items.iter().any(Value::is_number)
                && items.iter().all(|v| v.is_number() || v.is_string()) =>
        {
            vec![mixed(items)?]
        }
        Some(Value::Array(items)) => items.iter().map(one).collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(bad(shape)),
    };
    if prompts.len() > MAX_PROMPTS {
        return Err(ApiError::limit(
            "prompt",
            "too_many_prompts",
            format!(
                "{} prompts; at most {MAX_PROMPTS} per request",
                prompts.len()
            ),
        ));
    }
    Ok(prompts)
}

