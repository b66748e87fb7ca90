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

/// A schema embedded with `%json`, written compactly (no optional whitespace).
fn embedded(schema: &Value) -> String {
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
    let call = |arguments: &str| {
        let options: Vec<Value> = tools
            .iter()
            .map(|t| {
                json!({"type": "object",
                       "properties": {"name": {"const": t.name}, arguments: t.parameters},
                       "required": ["name", arguments], "additionalProperties": false})
            })
            .collect();
        match options.len() {
            1 => options[0].clone(),
            _ => json!({"anyOf": options}),
        }
    };
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
