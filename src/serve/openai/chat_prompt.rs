//! A chat request's conversation and tools, checked and rendered into the prompt text by the
//! model's own chat template (as transformers renders `messages` and `tools`), or ChatML for a
//! model without one (which then cannot be offered tools).
//!
//! Messages are OpenAI's: `{role, content}` with content a string or a list of text parts
//! (joined), an assistant's `tool_calls` (`[{id, type: "function", function: {name,
//! arguments}}]`, content null or absent; `arguments`, a JSON string on the wire, is given to
//! the template as the object it encodes, as llama.cpp's server does, since templates write it
//! with `tojson`), and `role: "tool"` results with their `tool_call_id`. `tools` are
//! `[{type: "function", function: {name, description, parameters}}]`; `tool_choice` `"auto"`
//! (the default) or `"none"` (tools not shown to the model); `"required"` and a named function
//! need constrained decoding and are refused by name.

use super::choice::OfferedTools;
use super::field;
use super::tool_calls::ToolFormat;
use crate::pipeline::chat::{render_chat, ChatContext, ChatMessage, CHATML};
use crate::pipeline::jinja::Clock;
use crate::serve::api_error::ApiError;
use crate::serve::LmFront;
use serde_json::{json, Map, Value};

fn bad(message: String) -> ApiError {
    ApiError::invalid(Some("messages"), message)
}

/// Message `i`, checked, in the shape templates read.
fn message(i: usize, m: &Value) -> Result<Value, ApiError> {
    let Some(object) = m.as_object() else {
        return Err(bad(format!("messages[{i}] is not an object")));
    };
    let Some(role) = object.get("role").and_then(Value::as_str) else {
        return Err(bad(format!("messages[{i}] needs a string role")));
    };
    // content: a string, or OpenAI's list of parts `[{"type": "text", "text": ...}]`.
    let content = match object.get("content") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(parts)) => Some(
            parts
                .iter()
                .map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Option<Vec<_>>>()
                .map(|t| t.concat())
                .ok_or_else(|| {
                    bad(format!(
                        "messages[{i}].content: only text parts are supported"
                    ))
                })?,
        ),
        None | Some(Value::Null) => None,
        Some(_) => {
            return Err(bad(format!(
                "messages[{i}].content must be a string or a list of text parts"
            )))
        }
    };
    let mut out = Map::new();
    out.insert("role".into(), role.into());
    let calls = match object.get("tool_calls") {
        None | Some(Value::Null) => None,
        Some(Value::Array(calls)) if role == "assistant" => Some(
            calls
                .iter()
                .enumerate()
                .map(|(k, c)| tool_call(i, k, c))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Some(_) => {
            return Err(bad(format!(
                "messages[{i}].tool_calls must be a list, on an assistant message"
            )))
        }
    };
    match (content, &calls) {
        (Some(text), _) => {
            out.insert("content".into(), text.into());
        }
        (None, Some(_)) => {
            out.insert("content".into(), Value::Null);
        }
        (None, None) => return Err(bad(format!("messages[{i}] needs a text content"))),
    }
    if let Some(calls) = calls {
        out.insert("tool_calls".into(), calls.into());
    }
    for key in ["tool_call_id", "name"] {
        match object.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => {
                out.insert(key.into(), s.clone().into());
            }
            Some(_) => return Err(bad(format!("messages[{i}].{key} must be a string"))),
        }
    }
    Ok(Value::Object(out))
}

/// An assistant's tool call `k` of message `i`, its arguments an object.
fn tool_call(i: usize, k: usize, call: &Value) -> Result<Value, ApiError> {
    let where_ = format!("messages[{i}].tool_calls[{k}]");
    let function = call
        .get("function")
        .filter(|f| f.is_object())
        .ok_or_else(|| bad(format!("{where_} needs a function object")))?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("{where_}.function needs a string name")))?;
    let arguments = match function.get("arguments") {
        Some(Value::String(text)) => serde_json::from_str::<Value>(text)
            .ok()
            .filter(Value::is_object)
            .ok_or_else(|| bad(format!("{where_}.function.arguments is not a JSON object")))?,
        Some(object @ Value::Object(_)) => object.clone(),
        _ => {
            return Err(bad(format!(
                "{where_}.function.arguments must be a JSON string"
            )))
        }
    };
    let mut out = json!({"type": "function", "function": {"name": name, "arguments": arguments}});
    if let Some(id) = call.get("id").and_then(Value::as_str) {
        out["id"] = id.into();
    }
    Ok(out)
}

/// The tools offered (after `tool_choice`), checked; `None` when there are none to offer.
fn tools(body: &Value) -> Result<Option<(Value, Vec<String>, bool)>, ApiError> {
    let list = match body.get("tools") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(ApiError::invalid(Some("tools"), "tools must be a list")),
    };
    let mut names = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::invalid(
                Some("tools"),
                format!("tools[{i}]: only {{\"type\": \"function\"}} tools are supported"),
            ));
        }
        let name = tool
            .pointer("/function/name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                ApiError::invalid(Some("tools"), format!("tools[{i}].function needs a name"))
            })?;
        if let Some(p) = tool.pointer("/function/parameters") {
            if !(p.is_object() || p.is_null()) {
                return Err(ApiError::invalid(
                    Some("tools"),
                    format!("tools[{i}].function.parameters must be a JSON schema object"),
                ));
            }
        }
        names.push(name.to_string());
    }
    let parallel = field::<bool>(body, "parallel_tool_calls")?.unwrap_or(true);
    match body.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "auto" => {}
        Some(Value::String(s)) if s == "none" => return Ok(None),
        Some(other) => {
            return Err(ApiError::invalid(
                Some("tool_choice"),
                format!("tool_choice {other}: only \"auto\" and \"none\" are supported (\"required\" and a named function need constrained decoding)"),
            ))
        }
    }
    if list.is_empty() {
        return Ok(None);
    }
    Ok(Some((Value::Array(list.clone()), names, parallel)))
}

/// The prompt text of a chat request, and the tools it offers.
pub fn chat_prompt(lm: &LmFront, body: &Value) -> Result<(String, Option<OfferedTools>), ApiError> {
    let Some(list) = body.get("messages").and_then(Value::as_array) else {
        return Err(bad("messages must be a list of {role, content}".into()));
    };
    if list.is_empty() {
        return Err(bad("messages is empty".into()));
    }
    let messages = list
        .iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let offered = tools(body)?;
    let Some(template) = &lm.chat else {
        if offered.is_some() {
            return Err(ApiError::invalid(
                Some("tools"),
                "tools: this model has no chat template to show them to it",
            ));
        }
        let plain: Vec<ChatMessage> = messages
            .iter()
            .map(|m| {
                ChatMessage::new(
                    m["role"].as_str().unwrap_or_default(),
                    m["content"].as_str().unwrap_or_default(),
                )
            })
            .collect();
        let text = render_chat(CHATML, &plain, true, "", "")
            .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
        return Ok((text, None));
    };
    let mut context = json!({"messages": messages});
    if let Some((list, _, _)) = &offered {
        context["tools"] = list.clone();
    }
    context["add_generation_prompt"] = true.into();
    let context = ChatContext::from_json(&context.to_string())
        .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
    let text = template
        .render(&context, Clock::Now)
        .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
    let tools = offered.map(|(_, names, parallel)| OfferedTools {
        format: ToolFormat::of_template(&template.template),
        names,
        parallel,
    });
    Ok((text, tools))
}
