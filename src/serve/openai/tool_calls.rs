//! Tool calls read back from a model's reply, in the format its chat template taught it
//! ([`ToolFormat::of_template`]), whole ([`parse`]) or streamed ([`ToolStream`]).
//!
//! | format | what the model writes | templates |
//! |---|---|---|
//! | Hermes | `<tool_call>{"name": n, "arguments": {...}}</tool_call>`, several, prose around; Qwen3-Coder's `<tool_call><function=n><parameter=k>v</parameter></function></tool_call>` too | Hermes 2/3, Qwen 2.5/3, QwQ, SmolLM3 |
//! | Llama 3 | the whole reply one JSON object `{"name": n, "parameters": {...}}` (or several separated by `;`), after an optional `<\|python_tag\|>` | Llama 3.1/3.2/3.3 |
//! | Mistral | `[TOOL_CALLS][{"name": n, "arguments": {...}}, ...]`, or `[TOOL_CALLS]n[ARGS]{...}` (newer templates) | Mistral Nemo / Small, Devstral, Ministral |
//! | Granite | `<\|tool_call\|>[{"name": n, "arguments": {...}}]` | Granite 3.x / 4.x |
//! | Functionary 3.1 | `<function=n>{...}</function>` | functionary-medium-v3.1 |
//!
//! A reply whose call does not parse (malformed JSON, no name, arguments that are not an object)
//! or names a tool that was not offered is returned as prose, whole: a client never receives a
//! call it cannot dispatch.

use serde_json::Value;

/// How a model writes its tool calls (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Llama3,
    Mistral,
    Granite,
    Functionary31,
}

/// One call: the function's name and its arguments as JSON text (an object).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

/// A reply read as tool calls: the prose around them (trimmed, possibly empty) and the calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedReply {
    pub content: String,
    pub calls: Vec<ToolCall>,
}

impl ToolFormat {
    /// The format a chat template's text teaches, `None` when it shows no tool-call syntax we
    /// read (the reply is then prose).
    pub fn of_template(template: &str) -> Option<ToolFormat> {
        if template.contains("[TOOL_CALLS]") {
            Some(ToolFormat::Mistral)
        } else if template.contains("<|tool_call|>") {
            Some(ToolFormat::Granite)
        } else if template.contains("<tool_call>") {
            Some(ToolFormat::Hermes)
        } else if template.contains("<function=") {
            Some(ToolFormat::Functionary31)
        } else if template.contains("<|python_tag|>")
            || (template.contains("<|start_header_id|>") && template.contains("parameters"))
        {
            Some(ToolFormat::Llama3)
        } else {
            None
        }
    }

    /// The texts a call begins with.
    fn markers(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Hermes => &["<tool_call>"],
            ToolFormat::Llama3 => &["<|python_tag|>"],
            ToolFormat::Mistral => &["[TOOL_CALLS]"],
            ToolFormat::Granite => &["<|tool_call|>"],
            ToolFormat::Functionary31 => &["<function="],
        }
    }
}

/// `text` read as tool calls of `format` naming only tools of `known`; `None` when it holds no
/// call, or a call that does not parse or names another tool (the reply is prose).
pub fn parse(format: ToolFormat, text: &str, known: &[String]) -> Option<ParsedReply> {
    let parsed = match format {
        ToolFormat::Hermes => hermes(text),
        ToolFormat::Llama3 => llama3(text),
        ToolFormat::Mistral => mistral(text),
        ToolFormat::Granite => after_marker(text, "<|tool_call|>", json_list),
        ToolFormat::Functionary31 => functionary(text),
    }?;
    let named = |c: &ToolCall| known.contains(&c.name);
    (!parsed.calls.is_empty() && parsed.calls.iter().all(named)).then_some(parsed)
}

/// A call from `{"name": n, "arguments" | "parameters": {...} | "{...}"}`.
fn call_of(value: &Value) -> Option<ToolCall> {
    let name = value.get("name")?.as_str()?.to_string();
    let args = value
        .get("arguments")
        .or_else(|| value.get("parameters"))
        .cloned()
        .unwrap_or(Value::Object(Default::default()));
    let args = match args {
        Value::String(s) => serde_json::from_str::<Value>(&s).ok()?,
        other => other,
    };
    if !args.is_object() || name.is_empty() {
        return None;
    }
    Some(ToolCall {
        name,
        arguments: args.to_string(),
    })
}

/// A JSON list of calls (or one call object).
fn json_list(text: &str) -> Option<Vec<ToolCall>> {
    match serde_json::from_str::<Value>(text.trim()).ok()? {
        Value::Array(items) => items.iter().map(call_of).collect(),
        one @ Value::Object(_) => Some(vec![call_of(&one)?]),
        _ => None,
    }
}

/// Prose before `marker`, then what `read` makes of the rest.
fn after_marker(
    text: &str,
    marker: &str,
    read: impl Fn(&str) -> Option<Vec<ToolCall>>,
) -> Option<ParsedReply> {
    let at = text.find(marker)?;
    Some(ParsedReply {
        content: text[..at].trim().to_string(),
        calls: read(&text[at + marker.len()..])?,
    })
}

/// `<tool_call>…</tool_call>` blocks (the last may be cut by the end of the reply).
fn hermes(text: &str) -> Option<ParsedReply> {
    let (open, close) = ("<tool_call>", "</tool_call>");
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(open) {
        content.push_str(&rest[..at]);
        let body = &rest[at + open.len()..];
        let (inside, after) = match body.find(close) {
            Some(end) => (&body[..end], &body[end + close.len()..]),
            None => (body, ""),
        };
        let inside = inside.trim();
        let call = if inside.starts_with("<function=") {
            xml_function(inside)?
        } else {
            call_of(&serde_json::from_str(inside).ok()?)?
        };
        calls.push(call);
        rest = after;
    }
    content.push_str(rest);
    Some(ParsedReply {
        content: content.trim().to_string(),
        calls,
    })
}

/// Qwen3-Coder's `<function=n><parameter=k>v</parameter>…</function>`: each value JSON where it
/// parses as JSON, else the text itself.
fn xml_function(text: &str) -> Option<ToolCall> {
    let rest = text.strip_prefix("<function=")?;
    let end = rest.find('>')?;
    let name = rest[..end].trim().to_string();
    let mut body = &rest[end + 1..];
    let mut args = serde_json::Map::new();
    while let Some(at) = body.find("<parameter=") {
        let p = &body[at + "<parameter=".len()..];
        let key_end = p.find('>')?;
        let key = p[..key_end].trim().to_string();
        let value_text = &p[key_end + 1..];
        let value_end = value_text.find("</parameter>")?;
        let raw = value_text[..value_end].trim_matches('\n');
        let value = serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()));
        args.insert(key, value);
        body = &value_text[value_end + "</parameter>".len()..];
    }
    if name.is_empty()
        || !body
            .trim()
            .trim_end_matches("</function>")
            .trim()
            .is_empty()
    {
        return None;
    }
    Some(ToolCall {
        name,
        arguments: Value::Object(args).to_string(),
    })
}

/// The whole reply JSON calls, separated by `;` or white space, after an optional
/// `<|python_tag|>`.
fn llama3(text: &str) -> Option<ParsedReply> {
    let text = text.trim();
    let text = text.strip_prefix("<|python_tag|>").unwrap_or(text).trim();
    if !text.starts_with('{') {
        return None;
    }
    let mut calls = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let value = values.next()?.ok()?;
        calls.push(call_of(&value)?);
        rest = rest[values.byte_offset()..]
            .trim_start_matches(|c: char| c == ';' || c.is_whitespace());
    }
    Some(ParsedReply {
        content: String::new(),
        calls,
    })
}

/// `[TOOL_CALLS]` then a JSON list, or `name[ARGS]{...}` (optionally `name[CALL_ID]id[ARGS]{...}`)
/// repeated, each after its own `[TOOL_CALLS]`.
fn mistral(text: &str) -> Option<ParsedReply> {
    let marker = "[TOOL_CALLS]";
    let at = text.find(marker)?;
    let content = text[..at].trim().to_string();
    let rest = text[at + marker.len()..].trim();
    if rest.starts_with('[') {
        return Some(ParsedReply {
            content,
            calls: json_list(rest)?,
        });
    }
    let mut calls = Vec::new();
    for part in rest.split(marker) {
        let (head, args) = part.split_once("[ARGS]")?;
        let name = head.split("[CALL_ID]").next()?.trim();
        let args: Value = serde_json::from_str(args.trim()).ok()?;
        if name.is_empty() || !args.is_object() {
            return None;
        }
        calls.push(ToolCall {
            name: name.to_string(),
            arguments: args.to_string(),
        });
    }
    Some(ParsedReply { content, calls })
}

/// `<function=name>{...}</function>` blocks.
fn functionary(text: &str) -> Option<ParsedReply> {
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("<function=") {
        content.push_str(&rest[..at]);
        let body = &rest[at + "<function=".len()..];
        let name_end = body.find('>')?;
        let name = body[..name_end].trim().to_string();
        let after_name = &body[name_end + 1..];
        let (args, after) = match after_name.find("</function>") {
            Some(end) => (&after_name[..end], &after_name[end + "</function>".len()..]),
            None => (after_name, ""),
        };
        let args: Value = serde_json::from_str(args.trim()).ok()?;
        if name.is_empty() || !args.is_object() {
            return None;
        }
        calls.push(ToolCall {
            name,
            arguments: args.to_string(),
        });
        rest = after;
    }
    content.push_str(rest);
    Some(ParsedReply {
        content: content.trim().to_string(),
        calls,
    })
}

/// A streamed reply watched for tool calls: prose goes out as it comes, except text that may
/// begin a call (a prefix of a marker is held back until it is clear); from a call's marker on,
/// everything is held and read at the end ([`ToolStream::finish`]).
pub struct ToolStream {
    format: ToolFormat,
    /// Text not yet released: a possible marker's beginning, or the call(s) from the marker on.
    held: String,
    /// Prose released so far (the content a failed parse falls back to includes it).
    released: String,
    capturing: bool,
}

impl ToolStream {
    /// Watches a reply in `format`.
    pub fn new(format: ToolFormat) -> Self {
        ToolStream {
            format,
            held: String::new(),
            released: String::new(),
            capturing: false,
        }
    }

    /// Adds a piece of the reply; returns the prose that may be sent now.
    pub fn push(&mut self, piece: &str) -> String {
        self.held.push_str(piece);
        if self.capturing {
            return String::new();
        }
        // Llama 3 writes a bare JSON object as the whole reply.
        if self.format == ToolFormat::Llama3 && self.released.trim().is_empty() {
            let start = self.held.trim_start();
            if start.is_empty() {
                return String::new();
            }
            if start.starts_with('{') {
                self.capturing = true;
                return String::new();
            }
        }
        let markers = self.format.markers();
        if let Some(at) = markers.iter().filter_map(|m| self.held.find(m)).min() {
            let prose: String = self.held.drain(..at).collect();
            self.capturing = true;
            self.released.push_str(&prose);
            return prose;
        }
        // Hold back the longest end of `held` that begins a marker.
        let keep = markers
            .iter()
            .flat_map(|m| {
                (1..m.len())
                    .filter(|&k| m.is_char_boundary(k))
                    .map(move |k| &m[..k])
            })
            .filter(|prefix| self.held.ends_with(prefix))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let prose: String = self.held.drain(..cut).collect();
        self.released.push_str(&prose);
        prose
    }

    /// At the end of the reply: the prose still to send, and the calls (with the prose around
    /// them) when what was held reads as calls of tools in `known`.
    pub fn finish(&mut self, known: &[String]) -> (String, Option<ParsedReply>) {
        let held = std::mem::take(&mut self.held);
        if !self.capturing {
            return (held, None);
        }
        let whole = format!("{}{held}", self.released);
        match parse(self.format, &whole, known) {
            Some(parsed) => {
                // The prose before the marker is out already; what follows the calls is sent.
                let after = parsed
                    .content
                    .strip_prefix(self.released.trim())
                    .unwrap_or("")
                    .trim()
                    .to_string();
                (after, Some(parsed))
            }
            None => (held, None),
        }
    }
}

#[cfg(test)]
#[path = "tool_calls_tests.rs"]
mod tests;
