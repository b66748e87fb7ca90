//! The sampling and scoring options of a text request, checked: each a 400 naming the field when
//! its type or range is wrong, and the fields this server does not implement refused by name
//! rather than ignored.
//!
//! | field | endpoint | range |
//! |---|---|---|
//! | `logprobs` | chat: `true`/`false`; completions: the alternatives per token, 0..=20 | |
//! | `top_logprobs` | chat (needs `logprobs: true`) | 0..=20 |
//! | `echo` | completions: the prompt before the completion (with `logprobs`: scored) | |
//! | `logit_bias` | both: `{"token id": bias}` | ids in the vocabulary, bias in [−100, 100] |
//! | `presence_penalty`, `frequency_penalty` | both | [−2, 2] |
//! | `repetition_penalty` | both (vLLM / llama.cpp's extension) | (0, 100] |
//! | `min_p` | both | [0, 1] |
//! | `n` | both: choices per prompt | 1..=16 |
//! | `stream_options` | both, with `stream: true`: `{"include_usage": bool}` | |
//! | `response_format` | both: `{"type": "text"}`, `{"type": "json_object"}`, `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`; extensions `{"type": "regex", "regex"}`, `{"type": "lark", "grammar"}`, `{"type": "gbnf", "grammar"}` | a schema or grammar llguidance compiles |
//! | `json_schema`, `grammar` | both (llama.cpp's): a JSON schema; a GBNF grammar | |
//!
//! A grammar is only read here ([`Scoring::grammar`]); it is compiled against the model's
//! vocabulary when the request is prepared (an invalid one: a 400 naming the field with
//! llguidance's message).

use super::super::api_error::ApiError;
use super::field;
use crate::decode::adjust::LogitAdjustments;
use crate::decode::constraint::Grammar;
use crate::serve::scheduler::RowOptions;
use serde_json::Value;

/// Alternatives per token at most (OpenAI's `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: usize = 20;
/// Choices per prompt at most.
pub const MAX_N: usize = 16;

/// Fields refused by name: OpenAI fields this server does not implement.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("suffix", "insertion (suffix) is not supported"),
    (
        "functions",
        "the deprecated functions API is not supported; use tools",
    ),
    (
        "function_call",
        "the deprecated functions API is not supported; use tool_choice",
    ),
    ("audio", "audio output is not supported"),
    ("prediction", "predicted outputs are not supported"),
    ("web_search_options", "web search is not supported"),
];

/// What a request asks beyond the basic sampling parameters.
#[derive(Clone, Debug, Default)]
pub struct Scoring {
    /// Per row: adjustments and log-probabilities.
    pub row: RowOptions,
    /// Choices per prompt.
    pub n: usize,
    /// Completions: the prompt's text before the completion.
    pub echo: bool,
    /// `stream_options.include_usage`: usage in a last chunk of its own (`choices: []`).
    pub include_usage: bool,
    /// The grammar the output must follow, and the field that asked for it.
    pub grammar: Option<(&'static str, Grammar)>,
}

/// A string member `key` of the object `field` (a 400 naming the field when absent).
fn member<'a>(object: &'a Value, field: &'static str, key: &str) -> Result<&'a str, ApiError> {
    object
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid(Some(field), format!("{field}.{key} must be a string")))
}

/// The grammar of `response_format` (OpenAI's, with the extensions of the module docs) or of
/// llama.cpp's `json_schema` / `grammar`; `None` for plain text.
pub fn grammar(body: &Value) -> Result<Option<(&'static str, Grammar)>, ApiError> {
    let mut found = Vec::new();
    if let Some(format) = body.get("response_format").filter(|v| !v.is_null()) {
        const F: &str = "response_format";
        if !format.is_object() {
            return Err(ApiError::invalid(
                Some(F),
                "response_format must be an object {\"type\": ...}",
            ));
        }
        let grammar = match member(format, F, "type")? {
            "text" => None,
            "json_object" => Some(Grammar::JsonObject),
            "json_schema" => {
                let spec = format.get("json_schema").filter(|v| v.is_object()).ok_or_else(|| {
                    ApiError::invalid(Some(F), "response_format.json_schema must be an object {\"name\", \"schema\", \"strict\"}")
                })?;
                match spec.get("schema") {
                    // OpenAI's default: any JSON object.
                    None | Some(Value::Null) => Some(Grammar::JsonObject),
                    Some(schema @ (Value::Object(_) | Value::Bool(_))) => Some(Grammar::JsonSchema(schema.clone())),
                    Some(_) => return Err(ApiError::invalid(Some(F), "response_format.json_schema.schema must be a JSON schema (an object)")),
                }
            }
            "regex" => Some(Grammar::Regex(member(format, F, "regex")?.to_string())),
            "lark" => Some(Grammar::Lark(member(format, F, "grammar")?.to_string())),
            "gbnf" => Some(Grammar::Gbnf(member(format, F, "grammar")?.to_string())),
            other => {
                return Err(ApiError::invalid(
                    Some(F),
                    format!("response_format type {other:?}: one of text, json_object, json_schema, regex, lark, gbnf"),
                ))
            }
        };
        found.extend(grammar.map(|g| (F, g)));
    }
    match body.get("json_schema") {
        None | Some(Value::Null) => {}
        Some(schema @ (Value::Object(_) | Value::Bool(_))) => {
            found.push(("json_schema", Grammar::JsonSchema(schema.clone())))
        }
        Some(_) => {
            return Err(ApiError::invalid(
                Some("json_schema"),
                "json_schema must be a JSON schema (an object)",
            ))
        }
    }
    match body.get("grammar") {
        None | Some(Value::Null) => {}
        Some(Value::String(g)) if g.trim().is_empty() => {}
        Some(Value::String(g)) => found.push(("grammar", Grammar::Gbnf(g.clone()))),
        Some(_) => {
            return Err(ApiError::invalid(
                Some("grammar"),
                "grammar must be a string (GBNF)",
            ))
        }
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|(f, _)| *f).collect();
        return Err(ApiError::invalid(
            Some(found[1].0),
            format!(
                "{}: give one of response_format, json_schema and grammar",
                names.join(" and ")
            ),
        ));
    }
    Ok(found.pop())
}

fn number(
    body: &Value,
    name: &'static str,
    lo: f64,
    hi: f64,
    open_lo: bool,
) -> Result<Option<f32>, ApiError> {
    let Some(x) = field::<f64>(body, name)? else {
        return Ok(None);
    };
    let inside = x.is_finite() && (x > lo || (!open_lo && x == lo)) && x <= hi;
    if !inside {
        let low = if open_lo { "(" } else { "[" };
        return Err(ApiError::invalid(
            Some(name),
            format!("{name} {x} must be in {low}{lo}, {hi}]"),
        ));
    }
    Ok(Some(x as f32))
}

fn count(body: &Value, name: &'static str, max: usize) -> Result<Option<usize>, ApiError> {
    match field::<i64>(body, name)? {
        None => Ok(None),
        Some(k) if (0..=max as i64).contains(&k) => Ok(Some(k as usize)),
        Some(k) => Err(ApiError::invalid(
            Some(name),
            format!("{name} {k} must be in 0..={max}"),
        )),
    }
}

/// The options of `body` for the chat endpoint (`chat`) or completions, against a vocabulary of
/// `vocab` tokens.
pub fn scoring(body: &Value, chat: bool, vocab: usize, stream: bool) -> Result<Scoring, ApiError> {
    for &(name, why) in UNSUPPORTED {
        if body.get(name).is_some_and(|v| !v.is_null()) {
            return Err(ApiError::invalid(Some(name), format!("{name}: {why}")));
        }
    }
    // The chat template's switches of vLLM and llama.cpp: a reply here always starts a new
    // assistant turn (the template's generation prompt added, the last message closed).
    if body.get("continue_final_message").and_then(Value::as_bool) == Some(true)
        || body.get("add_generation_prompt").and_then(Value::as_bool) == Some(false)
    {
        let name = match body.get("continue_final_message").and_then(Value::as_bool) {
            Some(true) => "continue_final_message",
            _ => "add_generation_prompt",
        };
        return Err(ApiError::invalid(
            Some(name),
            format!("{name}: continuing the last message is not supported; the reply is a new assistant turn"),
        ));
    }
    if let Some(best_of) = field::<i64>(body, "best_of")? {
        let n = field::<i64>(body, "n")?.unwrap_or(1);
        if best_of != n {
            return Err(ApiError::invalid(
                Some("best_of"),
                format!("best_of {best_of}: only best_of = n ({n}) is supported (no reranking)"),
            ));
        }
    }
    let grammar = grammar(body)?;
    let (logprobs, prompt_logprobs, echo) = if chat {
        let wanted = field::<bool>(body, "logprobs")?.unwrap_or(false);
        let top = count(body, "top_logprobs", MAX_TOP_LOGPROBS)?;
        if top.is_some_and(|k| k > 0) && !wanted {
            return Err(ApiError::invalid(
                Some("top_logprobs"),
                "top_logprobs needs logprobs: true",
            ));
        }
        if body.get("echo").is_some_and(|v| !v.is_null()) {
            return Err(ApiError::invalid(
                Some("echo"),
                "echo is a completions option",
            ));
        }
        (wanted.then(|| top.unwrap_or(0)), None, false)
    } else {
        if body.get("top_logprobs").is_some_and(|v| !v.is_null()) {
            return Err(ApiError::invalid(
                Some("top_logprobs"),
                "top_logprobs is a chat option; completions take logprobs (an integer)",
            ));
        }
        let k = count(body, "logprobs", MAX_TOP_LOGPROBS)?;
        let echo = field::<bool>(body, "echo")?.unwrap_or(false);
        (k, k.filter(|_| echo), echo)
    };
    let logit_bias = match body.get("logit_bias") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(map)) => {
            let mut bias = Vec::with_capacity(map.len());
            for (key, value) in map {
                let id: u32 = key.trim().parse().ok().filter(|&id| (id as usize) < vocab).ok_or_else(|| {
                    ApiError::invalid(
                        Some("logit_bias"),
                        format!("logit_bias: {key:?} is not a token id of the vocabulary (0..{vocab})"),
                    )
                })?;
                let b = value
                    .as_f64()
                    .filter(|b| (-100.0..=100.0).contains(b))
                    .ok_or_else(|| {
                        ApiError::invalid(
                            Some("logit_bias"),
                            format!("logit_bias[{key:?}]: {value} must be a number in [-100, 100]"),
                        )
                    })?;
                bias.push((id, b as f32));
            }
            bias
        }
        Some(_) => {
            return Err(ApiError::invalid(
                Some("logit_bias"),
                "logit_bias must be an object {\"token id\": bias}",
            ))
        }
    };
    let adjust = LogitAdjustments {
        logit_bias,
        presence_penalty: number(body, "presence_penalty", -2.0, 2.0, false)?.unwrap_or(0.0),
        frequency_penalty: number(body, "frequency_penalty", -2.0, 2.0, false)?.unwrap_or(0.0),
        repetition_penalty: number(body, "repetition_penalty", 0.0, 100.0, true)?.unwrap_or(1.0),
        min_p: number(body, "min_p", 0.0, 1.0, false)?.unwrap_or(0.0),
    };
    let n = match field::<i64>(body, "n")? {
        None => 1,
        Some(n) if (1..=MAX_N as i64).contains(&n) => n as usize,
        Some(n) => {
            return Err(ApiError::invalid(
                Some("n"),
                format!("n {n} must be in 1..={MAX_N}"),
            ))
        }
    };
    let include_usage = match body.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(options @ Value::Object(map)) => {
            if !stream {
                return Err(ApiError::invalid(
                    Some("stream_options"),
                    "stream_options is only allowed with stream: true",
                ));
            }
            if let Some(other) = map.keys().find(|k| k.as_str() != "include_usage") {
                return Err(ApiError::invalid(
                    Some("stream_options"),
                    format!("stream_options.{other} is not supported"),
                ));
            }
            field::<bool>(options, "include_usage")
                .map_err(|_| {
                    ApiError::invalid(
                        Some("stream_options"),
                        "stream_options.include_usage must be true or false",
                    )
                })?
                .unwrap_or(false)
        }
        Some(_) => {
            return Err(ApiError::invalid(
                Some("stream_options"),
                "stream_options must be an object",
            ))
        }
    };
    Ok(Scoring {
        row: RowOptions {
            adjust,
            logprobs,
            prompt_logprobs,
        },
        n,
        echo,
        include_usage,
        grammar,
    })
}
