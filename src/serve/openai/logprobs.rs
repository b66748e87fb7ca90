//! Log-probabilities in OpenAI's two shapes.
//!
//! Chat: `"logprobs": {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
//! "logprob", "bytes"}]}], "refusal": null}`. Completions: `"logprobs": {"tokens": [...],
//! "token_logprobs": [...], "top_logprobs": [{token: logprob}] | null, "text_offset": [...]}`,
//! where with `echo` the prompt's tokens come first, its first token with `null`s (nothing
//! predicts it).
//!
//! `token` is the token's text as the tokenizer decodes it alone, `bytes` that text's UTF-8
//! bytes (a token that holds part of a character decodes to U+FFFD, and its bytes are those of
//! U+FFFD, not the raw byte). A log-probability of −∞ is written −9999 (JSON has no infinity).

use crate::serve::scheduler::TokenLogprob;
use crate::text::decoder_tokenizer::DecoderTokenizer;
use serde_json::{json, Map, Value};

/// A token's text, decoded alone.
pub fn token_text(tokenizer: &DecoderTokenizer, id: u32) -> String {
    tokenizer.decode(&[id]).unwrap_or_default()
}

fn finite(logprob: f32) -> f64 {
    (logprob as f64).max(-9999.0)
}

fn chat_entry(tokenizer: &DecoderTokenizer, id: u32, logprob: f32) -> Map<String, Value> {
    let text = token_text(tokenizer, id);
    let bytes: Vec<u8> = text.as_bytes().to_vec();
    let mut entry = Map::new();
    entry.insert("token".into(), text.into());
    entry.insert("logprob".into(), finite(logprob).into());
    entry.insert("bytes".into(), bytes.into());
    entry
}

/// The `content` list of a chat answer's (or chunk's) `logprobs`.
pub fn chat_content(tokenizer: &DecoderTokenizer, scores: &[TokenLogprob]) -> Vec<Value> {
    scores
        .iter()
        .map(|s| {
            let mut entry = chat_entry(tokenizer, s.token, s.logprob);
            let top: Vec<Value> = s
                .top
                .iter()
                .map(|&(id, lp)| Value::Object(chat_entry(tokenizer, id, lp)))
                .collect();
            entry.insert("top_logprobs".into(), top.into());
            Value::Object(entry)
        })
        .collect()
}

/// A chat answer's `logprobs`.
pub fn chat(tokenizer: &DecoderTokenizer, scores: &[TokenLogprob]) -> Value {
    json!({"content": chat_content(tokenizer, scores), "refusal": null})
}

/// A completion's `logprobs`: `prompt` (with `echo`: the prompt's first token and the scores
/// of the others) then the generated tokens' scores; offsets count characters from
/// `offset` on.
pub fn completion(
    tokenizer: &DecoderTokenizer,
    prompt: Option<(u32, &[TokenLogprob])>,
    scores: &[TokenLogprob],
    offset: usize,
) -> Value {
    let (mut tokens, mut token_logprobs, mut top_logprobs, mut text_offset) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut at = offset;
    let mut push = |id: u32, score: Option<&TokenLogprob>| {
        let text = token_text(tokenizer, id);
        text_offset.push(Value::from(at));
        at += text.chars().count();
        tokens.push(Value::from(text));
        match score {
            None => {
                token_logprobs.push(Value::Null);
                top_logprobs.push(Value::Null);
            }
            Some(s) => {
                token_logprobs.push(finite(s.logprob).into());
                let mut top = Map::new();
                for &(alt, lp) in &s.top {
                    top.insert(token_text(tokenizer, alt), finite(lp).into());
                }
                top_logprobs.push(Value::Object(top));
            }
        }
    };
    if let Some((first, rest)) = prompt {
        push(first, None);
        for s in rest {
            push(s.token, Some(s));
        }
    }
    for s in scores {
        push(s.token, Some(s));
    }
    json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": text_offset})
}
