//! A chat request's conversation and tools, checked and rendered into the prompt text by the
//! model's own chat template (as transformers renders `messages` and `tools`), or ChatML for a
//! model without one (which then cannot be offered tools).
//!
//! Messages are OpenAI's: `{role, content}` with content a string or a list of text parts
//! (joined; an image part is refused as image input, any other part by its type), an assistant's `tool_calls` (`[{id, type: "function", function: {name,
//! arguments}}]`, content null or absent; `arguments`, a JSON string on the wire, is given to
//! the template as the object it encodes, as llama.cpp's server does, since templates write it
//! with `tojson`), and `role: "tool"` results with their `tool_call_id`. `tools` are
//! `[{type: "function", function: {name, description, parameters}}]`; `tool_choice` `"auto"`
//! (the default), `"none"` (tools not shown to the model), `"required"` or a named function
//! `{"type": "function", "function": {"name"}}` (the reply constrained to a call:
//! [`super::forced_tools`]).
//!
//! The checks read the body as `serde_json` values; the template reads it as parsed again into
//! minijinja's values, whose objects keep their keys in the order sent (a template writes
//! `tools` and `arguments` with `tojson`, in that order, as transformers does with Python's
//! dicts), with only the text parts of a `content` joined and string `arguments` parsed.

use super::choice::OfferedTools;
use super::field;
use super::forced_tools::{forced_call, ToolSchema};
use super::tool_calls::ToolFormat;
use crate::pipeline::chat::{render_chat, ChatContext, ChatMessage, CHATML};
use crate::pipeline::jinja::Clock;
use crate::serve::api_error::ApiError;
use crate::serve::LmFront;
use minijinja::value::{Value as Ordered, ValueKind};
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
                .enumerate()
                .map(|(k, p)| text_part(i, k, p))
                .collect::<Result<Vec<_>, _>>()?
                .concat(),
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

/// The text of part `k` of message `i`'s content, or why it is refused: an image (OpenAI's
/// `image_url`, and `image` / `input_image`) named as image input, any other kind of part by
/// its type.
fn text_part(i: usize, k: usize, part: &Value) -> Result<&str, ApiError> {
    let kind = part.get("type").and_then(Value::as_str);
    match (kind, part.get("text").and_then(Value::as_str)) {
        (None | Some("text"), Some(text)) => Ok(text),
        (Some(t @ ("image_url" | "image" | "input_image")), _) => Err(bad(format!(
            "messages[{i}].content[{k}]: image input is not supported (a part of type {t:?}): \
             this server reads text"
        ))),
        (Some(t), _) if t != "text" => Err(bad(format!(
            "messages[{i}].content[{k}]: parts of type {t:?} are not supported (only text parts \
             are)"
        ))),
        _ => Err(bad(format!(
            "messages[{i}].content[{k}]: a text part needs a string text"
        ))),
    }
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

/// The tools offered (after `tool_choice`), checked: their names, `parallel_tool_calls`, and for
/// `required` or a named function the tools one of which must be called; `None` when there are
/// none to offer.
#[allow(clippy::type_complexity)]
fn tools(body: &Value) -> Result<Option<(Vec<String>, bool, Option<Vec<ToolSchema>>)>, ApiError> {
    let list = match body.get("tools") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(ApiError::invalid(Some("tools"), "tools must be a list")),
    };
    let mut names = Vec::with_capacity(list.len());
    let mut schemas = Vec::with_capacity(list.len());
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
        let parameters = match tool.pointer("/function/parameters") {
            None | Some(Value::Null) => json!({"type": "object"}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => {
                return Err(ApiError::invalid(
                    Some("tools"),
                    format!("tools[{i}].function.parameters must be a JSON schema object"),
                ))
            }
        };
        names.push(name.to_string());
        schemas.push(ToolSchema {
            name: name.to_string(),
            parameters,
        });
    }
    let parallel = field::<bool>(body, "parallel_tool_calls")?.unwrap_or(true);
    let forced = match body.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s == "auto" => None,
        Some(Value::String(s)) if s == "none" => return Ok(None),
        Some(Value::String(s)) if s == "required" => Some(schemas),
        Some(choice @ Value::Object(_))
            if choice.get("type").and_then(Value::as_str) == Some("function") =>
        {
            let name = choice.pointer("/function/name").and_then(Value::as_str);
            let Some(tool) = schemas.into_iter().find(|t| Some(t.name.as_str()) == name) else {
                return Err(ApiError::invalid(
                    Some("tool_choice"),
                    format!("tool_choice names {}, which is not among the tools", name.map_or("no function".to_string(), |n| format!("{n:?}"))),
                ));
            };
            Some(vec![tool])
        }
        Some(other) => {
            return Err(ApiError::invalid(
                Some("tool_choice"),
                format!("tool_choice {other}: \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"),
            ))
        }
    };
    if list.is_empty() {
        if forced.is_some() {
            return Err(ApiError::invalid(
                Some("tool_choice"),
                "tool_choice asks for a call, but no tools are given",
            ));
        }
        return Ok(None);
    }
    Ok(Some((names, parallel, forced)))
}

/// The entries of the map `value` in their order.
fn entries(value: &Ordered) -> Vec<(String, Ordered)> {
    value
        .try_iter()
        .into_iter()
        .flatten()
        .map(|key| {
            let item = value.get_item(&key).unwrap_or_default();
            (key.as_str().unwrap_or_default().to_string(), item)
        })
        .collect()
}

/// Message `original` (in the order sent) as the template reads it: `checked`'s content, and
/// each tool call's `arguments` as an object (keys in the order sent).
fn ordered_message(original: &Ordered, checked: &Value) -> Ordered {
    let call = |call: Ordered| -> Ordered {
        let fields = entries(&call).into_iter().map(|(key, value)| {
            if key != "function" {
                return (key, value);
            }
            let function = entries(&value).into_iter().map(|(k, v)| {
                let v = match (k.as_str(), v.as_str()) {
                    ("arguments", Some(text)) => serde_json::from_str(text).unwrap_or(v),
                    _ => v,
                };
                (k, v)
            });
            (key, Ordered::from_iter(function))
        });
        Ordered::from_iter(fields)
    };
    let fields = entries(original)
        .into_iter()
        .map(|(key, value)| match key.as_str() {
            "content" if value.kind() == ValueKind::Seq => {
                let text = checked["content"].as_str().unwrap_or_default().to_string();
                (key, Ordered::from(text))
            }
            "tool_calls" if value.kind() == ValueKind::Seq => {
                let calls: Vec<Ordered> =
                    value.try_iter().into_iter().flatten().map(call).collect();
                (key, Ordered::from(calls))
            }
            _ => (key, value),
        });
    Ordered::from_iter(fields)
}

/// The prompt text of a chat request (`raw`: its body as sent), and the tools it offers.
pub fn chat_prompt(
    lm: &LmFront,
    body: &Value,
    raw: &[u8],
) -> Result<(String, Option<OfferedTools>), ApiError> {
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
    let ordered: Ordered = serde_json::from_slice(raw)
        .map_err(|e| ApiError::invalid(None, format!("the body is not valid JSON: {e}")))?;
    let original = ordered.get_attr("messages").unwrap_or_default();
    let messages: Vec<Ordered> = original
        .try_iter()
        .into_iter()
        .flatten()
        .zip(&messages)
        .map(|(m, checked)| ordered_message(&m, checked))
        .collect();
    let mut context = ChatContext::default();
    context.set("messages", messages);
    if offered.is_some() {
        context.set("tools", ordered.get_attr("tools").unwrap_or_default());
    }
    context.set("add_generation_prompt", true);
    let text = template
        .render(&context, Clock::Now)
        .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
    let format = ToolFormat::of_template(&template.template);
    let tools = match offered {
        None => None,
        Some((names, parallel, forced)) => Some(OfferedTools {
            forced: forced.map(|t| forced_call(lm, format, &t)).transpose()?,
            format,
            names,
            parallel,
        }),
    };
    Ok((text, tools))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_parts_are_joined_and_images_refused_by_name() {
        let m = json!({"role": "user", "content": [
            {"type": "text", "text": "Describe "}, {"type": "text", "text": "this."}]});
        assert_eq!(message(0, &m).unwrap()["content"], "Describe this.");
        for (part, named) in [
            (json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}),
             "messages[1].content[1]: image input is not supported (a part of type \"image_url\")"),
            (json!({"type": "input_image", "image_url": "https://example.com/a.png"}),
             "image input is not supported"),
            (json!({"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}),
             "parts of type \"input_audio\" are not supported"),
            (json!({"type": "text", "text": 3}), "a text part needs a string text"),
        ] {
            let m = json!({"role": "user", "content": [{"type": "text", "text": "Hi"}, part]});
            let e = message(1, &m).unwrap_err();
            assert!(e.message.contains(named), "{}", e.message);
        }
    }
}
