//! `tool_choice: "required"` and a named function (`{"type": "function", "function": {"name"}}`):
//! the reply constrained to one call in the format the model's template taught it
//! ([`ToolFormat`]), its arguments valid under the tool's `parameters` schema, so it always
//! reads back into `tool_calls` ([`super::tool_calls::parse`]).
//!
//! | format | the grammar (Lark; `%json` a JSON schema) |
//! |---|---|
//! | Hermes | `"<tool_call>\n" %json{name, arguments} "\n</tool_call>"` |
//! | Llama 3 | `%json{name, parameters}` |
//! | Mistral | `[TOOL_CALLS] "[" %json{name, arguments} "]"` |
//! | Granite | `<\|tool_call\|> "[" %json{name, arguments} "]"` |
//! | Functionary 3.1 | `"<function=" name ">" %json(arguments) "</function>"`, one alternative per tool |
//!
//! `{name, arguments}` is `{"name": {"const": n}, "arguments": parameters_n}` (both required,
//! nothing else), one alternative (`anyOf`) per tool allowed. A marker that is one special token
//! of the vocabulary (Mistral's `[TOOL_CALLS]`) is that token (`<[id]>`), else its text.
//!
//! A tool's `parameters` may hold its own definitions (`$defs`, `definitions`: pydantic's and
//! LangChain's nested models) and refer to them or to itself (`#/$defs/Address`, `#`). Inside
//! `{name, arguments}` those references would point at the wrapper, so each is rewritten to
//! where the parameters now are ([`relocate`]): `#/$defs/Address` of the second tool becomes
//! `#/anyOf/1/properties/arguments/$defs/Address`. Each tool's definitions stay its own, so two
//! tools may each define an `Address` of a different shape.

use super::tool_calls::ToolFormat;
use crate::decode::constraint::Grammar;
use crate::serve::api_error::ApiError;
use crate::serve::LmFront;
use serde_json::{json, Value};

/// A tool offered: its name and its `parameters` schema (`{"type": "object"}` when absent).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSchema {
    pub name: String,
    pub parameters: Value,
}

/// `parameters` with every reference into itself (`#` or `#/…`, a JSON pointer) pointing at the
/// same place under `base` (a JSON pointer, `/properties/arguments`), where the call's schema
/// holds them. Other references (anchors, other documents) and data (`const`, `enum`,
/// `default`, `examples`) are left as they are. Iterative.
pub fn relocate(parameters: &Value, base: &str) -> Value {
    let mut out = parameters.clone();
    let mut stack = vec![&mut out];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(map) => {
                for (k, child) in map.iter_mut() {
                    match (k.as_str(), child) {
                        ("$ref", Value::String(r)) if r.as_str() == "#" || r.starts_with("#/") => {
                            *r = format!("#{base}{}", &r[1..]);
                        }
                        ("const" | "enum" | "default" | "examples", _) => {}
                        (_, child) => stack.push(child),
                    }
                }
            }
            Value::Array(items) => stack.extend(items.iter_mut()),
            _ => {}
        }
    }
    out
}

/// The JSON schema of one call `{"name": n, key: arguments}` of one of `tools`, each tool's
/// references relocated (see the module docs).
pub fn call_schema(tools: &[ToolSchema], key: &str) -> Value {
    let one = |t: &ToolSchema, base: &str| {
        json!({"type": "object",
               "properties": {"name": {"const": t.name}, key: relocate(&t.parameters, base)},
               "required": ["name", key], "additionalProperties": false})
    };
    match tools {
        [tool] => one(tool, &format!("/properties/{key}")),
        _ => {
            let options: Vec<Value> = tools
                .iter()
                .enumerate()
                .map(|(i, t)| one(t, &format!("/anyOf/{i}/properties/{key}")))
                .collect();
            json!({ "anyOf": options })
        }
    }
}

/// A schema embedded with `%json`, written compactly (no optional whitespace).
pub fn embedded(schema: &Value) -> String {
    let mut schema = schema.clone();
    if let Value::Object(map) = &mut schema {
        map.entry("x-guidance")
            .or_insert_with(|| json!({"whitespace_flexible": false}));
    }
    format!("%json {schema}")
}

/// A marker of the format as Lark: its one special token, or its text quoted.
fn marker(lm: &LmFront, text: &str) -> String {
    let special = lm.tokenizer.token_id(text).filter(|&id| {
        lm.constraints
            .as_ref()
            .is_ok_and(|vocab| vocab.is_special(id))
    });
    match special {
        Some(id) => format!("<[{id}]>"),
        None => Value::String(text.to_string()).to_string(),
    }
}

/// The grammar of one call of a tool of `tools` (all of them allowed, or only `named`) in
/// `format`.
pub fn forced_call(
    lm: &LmFront,
    format: Option<ToolFormat>,
    tools: &[ToolSchema],
) -> Result<Grammar, ApiError> {
    let Some(format) = format else {
        return Err(ApiError::invalid(
            Some("tool_choice"),
            "tool_choice: this model's chat template shows no tool-call format this server reads",
        ));
    };
    let call = |key: &str| call_schema(tools, key);
    let lark = match format {
        ToolFormat::Hermes => format!(
            "start: {} \"\\n\" {} \"\\n\" {}",
            marker(lm, "<tool_call>"),
            embedded(&call("arguments")),
            marker(lm, "</tool_call>")
        ),
        ToolFormat::Llama3 => format!("start: {}", embedded(&call("parameters"))),
        ToolFormat::Mistral => format!(
            "start: {} \"[\" {} \"]\"",
            marker(lm, "[TOOL_CALLS]"),
            embedded(&call("arguments"))
        ),
        ToolFormat::Granite => format!(
            "start: {} \"[\" {} \"]\"",
            marker(lm, "<|tool_call|>"),
            embedded(&call("arguments"))
        ),
        ToolFormat::Functionary31 => {
            let alternatives: Vec<String> = tools
                .iter()
                .map(|t| {
                    let open = Value::String(format!("<function={}>", t.name)).to_string();
                    format!("{open} {} \"</function>\"", embedded(&t.parameters))
                })
                .collect();
            format!("start: {}", alternatives.join(" | "))
        }
    };
    Ok(Grammar::Lark(lark))
}

#[cfg(test)]
#[path = "forced_tools_tests.rs"]
mod tests;
