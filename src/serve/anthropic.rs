//! Anthropic's Messages API, as llama-server offers it: `POST /v1/messages` and
//! `POST /v1/messages/count_tokens`. The request is read into `/v1/chat/completions`' fields
//! ([`to_chat`]) and runs through that route's checks, chat template, tools and engine; the
//! answer is written in Anthropic's shape.
//!
//! Request: `messages` (`{role, content}`, content a string or blocks: `text`, an assistant's
//! `tool_use` `{id, name, input}`, a user's `tool_result` `{tool_use_id, content, is_error}`,
//! each result a `tool` message after the user's text), `system` (a string or text blocks),
//! `max_tokens`, `stop_sequences`, `temperature`, `top_p`, `top_k`, `tools` (`{name,
//! description, input_schema}`), `tool_choice` (`auto`, `any`, `tool` with its `name`,
//! `none`), `stream`, `metadata` (not used). Refused by name: `image` and `document` blocks
//! (this server reads text; a 400 where llama-server answers 500), `thinking` other than
//! `disabled` and `thinking` blocks (the models served here have no reasoning mode).
//!
//! Answer: `{id, type: "message", role: "assistant", content: [text and tool_use blocks],
//! model, stop_reason: "end_turn" | "max_tokens" | "tool_use", stop_sequence: null, usage:
//! {input_tokens, output_tokens, cache_read_input_tokens, cache_creation_input_tokens}}`.
//! Streamed: `message_start`, `content_block_start` / `content_block_delta` (`text_delta`) /
//! `content_block_stop` for the text, one block per tool call (`input_json_delta`), then
//! `message_delta` (stop reason, output tokens) and `message_stop`, each an SSE event named
//! by its type. Errors keep this server's JSON error shape and status.

use super::api_error::ApiError;
use super::metrics::Outcome;
use super::native::object;
use super::openai::{Accepted, Flavor};
use super::{App, LmFront, OutcomeGuard};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

fn bad(param: &'static str, message: String) -> ApiError {
    ApiError::invalid(Some(param), message)
}

/// The text of `system` or of a tool result's `content`: a string or text blocks.
fn text_of(value: &Value, param: &'static str, at: &str) -> Result<String, ApiError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(blocks) => {
            let mut out = String::new();
            for (k, b) in blocks.iter().enumerate() {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => out.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
                    Some(kind) => return Err(unsupported(param, &format!("{at}[{k}]"), kind)),
                    None => return Err(bad(param, format!("{at}[{k}] has no type"))),
                }
            }
            Ok(out)
        }
        _ => Err(bad(param, format!("{at} must be a string or a list of blocks"))),
    }
}

/// The refusal of a block kind this server does not read.
fn unsupported(param: &'static str, at: &str, kind: &str) -> ApiError {
    let why = match kind {
        "image" | "document" => "image input is not supported: this server reads text",
        "thinking" | "redacted_thinking" => "thinking blocks are not supported: the models served here have no reasoning mode",
        _ => "only text, tool_use and tool_result blocks are supported",
    };
    bad(param, format!("{at}: a {kind} block: {why}"))
}

/// One Anthropic message as chat messages (a user's tool results become `tool` messages).
fn message(i: usize, m: &Value, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let at = format!("messages[{i}]");
    let role = m
        .get("role")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("messages", format!("{at} needs a role")))?;
    if role != "user" && role != "assistant" {
        return Err(bad("messages", format!("{at}.role {role:?}: user or assistant (system is a field of its own)")));
    }
    let blocks = match m.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        _ => return Err(bad("messages", format!("{at}.content must be a string or a list of blocks"))),
    };
    let (mut text, mut calls, mut results) = (String::new(), Vec::new(), Vec::new());
    for (k, b) in blocks.iter().enumerate() {
        let at = format!("{at}.content[{k}]");
        match b.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("tool_use") if role == "assistant" => {
                let name = b.get("name").and_then(Value::as_str).unwrap_or("");
                let input = b.get("input").cloned().unwrap_or(json!({}));
                calls.push(json!({"id": b.get("id").cloned().unwrap_or(Value::Null), "type": "function",
                                  "function": {"name": name, "arguments": input.to_string()}}));
            }
            Some("tool_result") if role == "user" => {
                let content = text_of(b.get("content").unwrap_or(&Value::Null), "messages", &format!("{at}.content"))?;
                let content = match b.get("is_error").and_then(Value::as_bool) {
                    Some(true) => format!("Error: {content}"),
                    _ => content,
                };
                results.push(json!({"role": "tool", "tool_call_id": b.get("tool_use_id").cloned().unwrap_or(Value::Null),
                                    "content": content}));
            }
            Some(kind) => return Err(unsupported("messages", &at, kind)),
            None => return Err(bad("messages", format!("{at} has no type"))),
        }
    }
    // Results answer the calls of the turn before: they come first, then the user's text.
    out.extend(results);
    if !calls.is_empty() {
        // Content as a string even when empty: templates that know no tool calls add it.
        out.push(json!({"role": role, "content": text, "tool_calls": calls}));
    } else if !text.is_empty() || out.last().is_none_or(|last| last["role"] != "tool") {
        out.push(json!({"role": role, "content": text}));
    }
    Ok(())
}

/// An Anthropic request as a `/v1/chat/completions` body (see the module docs).
pub fn to_chat(body: &Value, count_only: bool) -> Result<Value, ApiError> {
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return Err(bad("messages", "messages (a list) is missing".into()));
    };
    let mut chat = Vec::new();
    if let Some(system) = body.get("system") {
        let text = text_of(system, "system", "system")?;
        if !text.is_empty() {
            chat.push(json!({"role": "system", "content": text}));
        }
    }
    for (i, m) in messages.iter().enumerate() {
        message(i, m, &mut chat)?;
    }
    let mut out = Map::new();
    out.insert("messages".into(), Value::Array(chat));
    match body.get("thinking").and_then(|t| t.get("type")).and_then(Value::as_str) {
        None | Some("disabled") => {}
        Some(_) => return Err(bad("thinking", "thinking: the models served here have no reasoning mode".into())),
    }
    match body.get("max_tokens") {
        Some(v) => {
            out.insert("max_tokens".into(), v.clone());
        }
        None if !count_only => return Err(bad("max_tokens", "max_tokens is required".into())),
        None => {}
    }
    for (from, to) in [("stop_sequences", "stop"), ("temperature", "temperature"), ("top_p", "top_p"),
                       ("top_k", "top_k"), ("stream", "stream"), ("model", "model")] {
        if let Some(v) = body.get(from).filter(|v| !v.is_null()) {
            out.insert(to.into(), v.clone());
        }
    }
    if let Some(tools) = body.get("tools").and_then(Value::as_array) {
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| json!({"type": "function", "function": {
                "name": t.get("name").cloned().unwrap_or(Value::Null),
                "description": t.get("description").cloned().unwrap_or(json!("")),
                "parameters": t.get("input_schema").cloned().unwrap_or(json!({"type": "object"})),
            }}))
            .collect();
        out.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = body.get("tool_choice").filter(|v| !v.is_null()) {
        let openai = match choice.get("type").and_then(Value::as_str) {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => json!({"type": "function", "function": {"name": choice.get("name").cloned().unwrap_or(Value::Null)}}),
            _ => return Err(bad("tool_choice", format!("tool_choice {choice}: auto, any, tool or none"))),
        };
        out.insert("tool_choice".into(), openai);
    }
    Ok(Value::Object(out))
}

/// Anthropic's stop reason for a finished choice.
fn stop_reason(c: &super::openai::choice::ChoiceState) -> &'static str {
    match c.finish_reason() {
        Some("tool_calls") => "tool_use",
        Some("length") => "max_tokens",
        _ => "end_turn",
    }
}

fn usage(c: &super::openai::choice::ChoiceState) -> Value {
    json!({"input_tokens": c.prompt_ids.len(), "output_tokens": c.completion,
           "cache_read_input_tokens": c.cached_tokens, "cache_creation_input_tokens": 0})
}

/// The tool-use blocks of a finished choice.
fn tool_blocks(c: &super::openai::choice::ChoiceState, id: &str) -> Vec<(String, String, String)> {
    c.calls.as_ref().map_or(Vec::new(), |p| {
        p.calls
            .iter()
            .enumerate()
            .map(|(k, call)| (format!("toolu_{id}_{k}"), call.name.clone(), call.arguments.clone()))
            .collect()
    })
}

/// `POST /v1/messages`.
pub async fn messages(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let mut guard = OutcomeGuard::new(app.metrics.clone());
    let prepared = {
        let app = app.clone();
        tokio::task::spawn_blocking(move || {
            let chat = to_chat(&object(&body)?, false)?;
            let bytes = Bytes::from(chat.to_string());
            super::openai::prepare(&app, Flavor::Chat, &bytes)
        })
        .await
        .unwrap_or_else(|e| Err(ApiError::internal(format!("preparing the request failed: {e}"))))
    };
    let (lm, acc) = match prepared {
        Ok(x) => x,
        Err(e) => {
            guard.set(e.outcome());
            return e.into_response();
        }
    };
    let id = app.next_id.fetch_add(1, Ordering::Relaxed).to_string();
    let state = Answer { lm, acc, id, model: app.model_name.clone(), guard, queue: VecDeque::new(), started: false, done: false };
    if state.acc.stream {
        let events = futures_util::stream::unfold(state, |mut state| async move {
            let (kind, data) = state.next().await?;
            Some((Ok::<_, Infallible>(SseEvent::default().event(kind).data(data.to_string())), state))
        });
        Sse::new(events).into_response()
    } else {
        state.whole().await
    }
}

/// One Anthropic answer being produced.
struct Answer {
    lm: Arc<LmFront>,
    acc: Accepted,
    id: String,
    model: String,
    guard: OutcomeGuard,
    /// Streamed events not yet sent: `(type, data)`.
    queue: VecDeque<(&'static str, Value)>,
    started: bool,
    done: bool,
}

impl Answer {
    /// The next piece of text of the (single) choice, `Ok(None)` once it finished.
    async fn piece(&mut self) -> Result<Option<String>, ApiError> {
        loop {
            if self.acc.choices[0].finish.is_some() {
                return Ok(None);
            }
            let Some((i, event)) = self.acc.receivers.next().await else {
                return Err(ApiError::internal("the engine dropped the request"));
            };
            let Some(event) = event else {
                continue;
            };
            let text = self.acc.choices[i].on(&self.lm, event)?;
            if self.acc.choices[i].finish.is_some() {
                self.acc.receivers.close(i);
            }
            return Ok(Some(text));
        }
    }

    async fn whole(mut self) -> Response {
        loop {
            match self.piece().await {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => {
                    self.guard.set(e.outcome());
                    return e.into_response();
                }
            }
        }
        let c = &self.acc.choices[0];
        let mut content = Vec::new();
        let text = c.calls.as_ref().map_or(c.content.clone(), |p| p.content.clone());
        if !text.is_empty() || c.calls.is_none() {
            content.push(json!({"type": "text", "text": text}));
        }
        for (id, name, arguments) in tool_blocks(c, &self.id) {
            let input: Value = serde_json::from_str(&arguments).unwrap_or(json!({}));
            content.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
        }
        self.guard.set(Outcome::Ok);
        Json(json!({"id": format!("msg_{}", self.id), "type": "message", "role": "assistant",
                    "content": content, "model": self.model, "stop_reason": stop_reason(c),
                    "stop_sequence": null, "usage": usage(c)}))
        .into_response()
    }

    /// The next streamed event, `None` after `message_stop`.
    async fn next(&mut self) -> Option<(&'static str, Value)> {
        loop {
            if let Some(event) = self.queue.pop_front() {
                return Some(event);
            }
            if self.done {
                return None;
            }
            if !self.started {
                self.started = true;
                let c = &self.acc.choices[0];
                let mut u = usage(c);
                u["output_tokens"] = 0.into();
                self.queue.push_back(("message_start", json!({"type": "message_start", "message": {
                    "id": format!("msg_{}", self.id), "type": "message", "role": "assistant", "content": [],
                    "model": self.model, "stop_reason": null, "stop_sequence": null, "usage": u}})));
                self.queue.push_back(("content_block_start", json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}})));
                continue;
            }
            match self.piece().await {
                Ok(Some(text)) => {
                    if !text.is_empty() {
                        self.queue.push_back(("content_block_delta", json!({"type": "content_block_delta", "index": 0,
                            "delta": {"type": "text_delta", "text": text}})));
                    }
                }
                Ok(None) => self.finish(),
                Err(e) => {
                    self.done = true;
                    self.guard.set(e.outcome());
                    return Some(("error", json!({"type": "error", "error": {"type": e.kind(), "message": e.message}})));
                }
            }
        }
    }

    /// The closing events: the text block's stop, the tool-use blocks, the stop reason.
    fn finish(&mut self) {
        let c = &self.acc.choices[0];
        let mut events = vec![("content_block_stop", json!({"type": "content_block_stop", "index": 0}))];
        for (k, (id, name, arguments)) in tool_blocks(c, &self.id).into_iter().enumerate() {
            let index = k + 1;
            events.push(("content_block_start", json!({"type": "content_block_start", "index": index,
                "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}})));
            events.push(("content_block_delta", json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "input_json_delta", "partial_json": arguments}})));
            events.push(("content_block_stop", json!({"type": "content_block_stop", "index": index})));
        }
        events.push(("message_delta", json!({"type": "message_delta",
            "delta": {"stop_reason": stop_reason(c), "stop_sequence": null},
            "usage": {"output_tokens": c.completion}})));
        events.push(("message_stop", json!({"type": "message_stop"})));
        self.queue.extend(events);
        self.done = true;
        self.guard.set(Outcome::Ok);
    }
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens"}`, the prompt `/v1/messages` would feed.
pub async fn count_tokens(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let result = async {
        let lm = app.lm()?;
        let parsed = object(&body)?;
        app.check_model(&parsed)?;
        tokio::task::spawn_blocking(move || {
            let chat = to_chat(&parsed, true)?;
            let raw = Bytes::from(chat.to_string());
            let (prompt, _) = super::openai::chat_prompt(&lm, &chat, &raw)?;
            let ids = lm
                .tokenizer
                .encode(&prompt)
                .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
            Ok(json!({"input_tokens": ids.len()}))
        })
        .await
        .unwrap_or_else(|e| Err(ApiError::internal(format!("the request failed: {e}"))))
    };
    match result.await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_with_tools_reads_as_chat() {
        let body = json!({
            "model": "claude", "max_tokens": 9, "system": [{"type": "text", "text": "Be brief."}],
            "stop_sequences": ["END"], "top_k": 4, "metadata": {"user_id": "u"},
            "tools": [{"name": "w", "description": "weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "w"},
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Let me see."},
                    {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "text", "text": "Thanks"},
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "sunny"}],
                     "is_error": false}]},
            ]});
        let chat = to_chat(&body, false).unwrap();
        assert_eq!(chat["messages"], json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "Let me see.", "tool_calls": [{"id": "t1", "type": "function",
                "function": {"name": "w", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "t1", "content": "sunny"},
            {"role": "user", "content": "Thanks"},
        ]));
        assert_eq!(chat["stop"], json!(["END"]));
        assert_eq!(chat["top_k"], 4);
        assert_eq!(chat["max_tokens"], 9);
        assert_eq!(chat["tools"][0]["function"]["parameters"], json!({"type": "object"}));
        assert_eq!(chat["tool_choice"], json!({"type": "function", "function": {"name": "w"}}));
        assert!(chat.get("metadata").is_none());
    }

    #[test]
    fn what_is_not_read_is_refused_by_name() {
        let image = json!({"max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]});
        let e = to_chat(&image, false).unwrap_err();
        assert!(e.message.contains("image input is not supported"), "{}", e.message);
        let thinking = json!({"max_tokens": 5, "thinking": {"type": "enabled", "budget_tokens": 9},
                              "messages": []});
        assert_eq!(to_chat(&thinking, false).unwrap_err().param, Some("thinking"));
        assert_eq!(to_chat(&json!({"max_tokens": 5}), false).unwrap_err().param, Some("messages"));
        let no_max = json!({"messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(to_chat(&no_max, false).unwrap_err().param, Some("max_tokens"));
        assert!(to_chat(&no_max, true).is_ok());
    }
}
