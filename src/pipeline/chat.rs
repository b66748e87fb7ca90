//! Chat with a language model: the conversation rendered into the prompt text by the model's own
//! chat template, exactly as transformers renders it ([`super::jinja`]: `messages`, `tools`,
//! `add_generation_prompt`, `bos_token`, `eos_token`, `raise_exception`, `strftime_now`, Python
//! string methods and `tojson`), then a reply generated until the end-of-turn token.
//!
//! A conversation is any JSON the template reads ([`ChatContext`]): OpenAI-shaped `messages`
//! (with `tool_calls`, `tool_call_id`, `name`, content as text, null or a list of parts) and
//! `tools` (JSON schemas) pass through as they are, keys in the order given.

use super::jinja::{ChatTemplateEngine, Clock, Limits};
use crate::error::{Error, Result};
use crate::store::gguf::GgufFile;
use minijinja::value::{Value, ValueKind};
use serde::Serialize;

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// What was said.
    pub content: String,
}

impl ChatMessage {
    /// A message of `role` saying `content`.
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// The variables a chat template is rendered with, in the order given: `messages`, and any of
/// `tools`, `documents`, `add_generation_prompt`, `bos_token`, `eos_token` or a template's own
/// (`enable_thinking`, `date_string`, ...). What is not given takes transformers' default
/// ([`ChatTemplate::render`]).
#[derive(Clone, Debug, Default)]
pub struct ChatContext {
    variables: Vec<(String, Value)>,
}

impl ChatContext {
    /// `messages` (role and text), with or without the generation prompt.
    pub fn from_messages(messages: &[ChatMessage], add_generation_prompt: bool) -> ChatContext {
        let mut context = ChatContext::default();
        context.set("messages", Value::from_serialize(messages));
        context.set("add_generation_prompt", Value::from(add_generation_prompt));
        context
    }

    /// A JSON object of variables (its keys, and those of every object inside, kept in order).
    /// `messages` must be a list of objects; `tools` (if given and not null) a list;
    /// `add_generation_prompt` a boolean.
    pub fn from_json(text: &str) -> Result<ChatContext> {
        let bad = |why: String| Error::Input(format!("chat context: {why}"));
        let value: Value =
            serde_json::from_str(text).map_err(|e| bad(format!("invalid JSON: {e}")))?;
        if value.kind() != ValueKind::Map {
            return Err(bad(format!("expected a JSON object, not {}", value.kind())));
        }
        let mut context = ChatContext::default();
        for key in value.try_iter().map_err(|e| bad(e.to_string()))? {
            let item = value.get_item(&key).map_err(|e| bad(e.to_string()))?;
            context.set(key.as_str().unwrap_or_default(), item);
        }
        let messages = context
            .get("messages")
            .ok_or_else(|| bad("no \"messages\" (a list of messages)".into()))?;
        if messages.kind() != ValueKind::Seq {
            return Err(bad(format!(
                "\"messages\" is {}, not a list",
                messages.kind()
            )));
        }
        for (i, message) in messages.try_iter().into_iter().flatten().enumerate() {
            if message.kind() != ValueKind::Map {
                return Err(bad(format!(
                    "message {i} is {}, not an object",
                    message.kind()
                )));
            }
        }
        if let Some(tools) = context.get("tools") {
            if !matches!(tools.kind(), ValueKind::Seq | ValueKind::None) {
                return Err(bad(format!("\"tools\" is {}, not a list", tools.kind())));
            }
        }
        if let Some(flag) = context.get("add_generation_prompt") {
            if flag.kind() != ValueKind::Bool {
                return Err(bad(format!(
                    "\"add_generation_prompt\" is {}, not true or false",
                    flag.kind()
                )));
            }
        }
        Ok(context)
    }

    /// Sets (or replaces) the variable `name`.
    pub fn set(&mut self, name: &str, value: impl Serialize) {
        let value = Value::from_serialize(value);
        match self.variables.iter_mut().find(|(n, _)| n == name) {
            Some((_, v)) => *v = value,
            None => self.variables.push((name.to_string(), value)),
        }
    }

    fn get(&self, name: &str) -> Option<&Value> {
        self.variables
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }
}

/// A model's chat template with the special tokens it refers to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatTemplate {
    /// The Jinja source.
    pub template: String,
    /// The beginning-of-sequence token's text (`bos_token`).
    pub bos: String,
    /// The end-of-sequence token's text (`eos_token`).
    pub eos: String,
}

impl ChatTemplate {
    /// The prompt text of `messages`, ending where the assistant's reply begins.
    pub fn prompt(&self, messages: &[ChatMessage]) -> Result<String> {
        self.render(&ChatContext::from_messages(messages, true), Clock::Now)
    }

    /// Renders `context` as transformers' `apply_chat_template(..., tokenize=False)` does:
    /// `tools` and `documents` are Python's `None` and `add_generation_prompt` false unless
    /// given; `bos_token` and `eos_token` are this template's unless given. `strftime_now`
    /// reads `clock`. A template that does not end, recurses too deep or writes too much is
    /// stopped with an error ([`Limits`]).
    pub fn render(&self, context: &ChatContext, clock: Clock) -> Result<String> {
        let none = super::jinja::python_none::python_none;
        let mut variables = vec![
            ("tools".to_string(), none()),
            ("documents".to_string(), none()),
            ("add_generation_prompt".to_string(), Value::from(false)),
            ("bos_token".to_string(), Value::from(self.bos.as_str())),
            ("eos_token".to_string(), Value::from(self.eos.as_str())),
        ];
        for (name, value) in &context.variables {
            // A null `tools` or `documents` is Python's None, as when absent.
            let value = match (name.as_str(), value.is_none()) {
                ("tools" | "documents", true) => none(),
                _ => value.clone(),
            };
            match variables.iter_mut().find(|(n, _)| n == name) {
                Some((_, v)) => *v = value,
                None => variables.push((name.clone(), value)),
            }
        }
        ChatTemplateEngine::new(&self.template, clock, Limits::default())?
            .render(&Value::from_iter(variables))
    }
}

/// The chat template of a GGUF file: `tokenizer.chat_template`, with the text of its
/// `tokenizer.ggml.bos_token_id` and `eos_token_id` tokens; `None` when it has no template.
pub fn gguf_chat_template(file: &GgufFile) -> Result<Option<ChatTemplate>> {
    let Some(template) = file.chat_template()? else {
        return Ok(None);
    };
    let tokens: Vec<&str> = file.get("tokenizer.ggml.tokens")?.unwrap_or_default();
    let token = |key: &str| -> Result<String> {
        match file.get::<u32>(key)? {
            None => Ok(String::new()),
            Some(id) => tokens
                .get(id as usize)
                .map(|t| t.to_string())
                .ok_or_else(|| Error::Checkpoint {
                    path: file.path().to_path_buf(),
                    reason: format!(
                        "{key} is {id}, but tokenizer.ggml.tokens has {} tokens",
                        tokens.len()
                    ),
                }),
        }
    };
    Ok(Some(ChatTemplate {
        template: template.to_string(),
        bos: token("tokenizer.ggml.bos_token_id")?,
        eos: token("tokenizer.ggml.eos_token_id")?,
    }))
}

/// The chat template of a Hugging Face directory: `chat_template` of `tokenizer_config.json`
/// (a string), or the file `chat_template.jinja`; `None` when it has neither.
pub fn hf_chat_template(dir: &std::path::Path) -> Result<Option<ChatTemplate>> {
    let jinja = dir.join("chat_template.jinja");
    let config_path = dir.join("tokenizer_config.json");
    let config: serde_json::Value = if config_path.is_file() {
        let bytes = crate::store::read_file(&config_path)?;
        serde_json::from_slice(&bytes).map_err(|e| Error::Checkpoint {
            path: config_path.clone(),
            reason: format!("invalid JSON: {e}"),
        })?
    } else {
        serde_json::Value::Null
    };
    // A special token is a string, or an object with its `content`.
    let token = |key: &str| -> String {
        let v = &config[key];
        v.as_str()
            .or_else(|| v["content"].as_str())
            .unwrap_or_default()
            .to_string()
    };
    let bad = |reason: String| Error::Checkpoint {
        path: config_path.clone(),
        reason,
    };
    let template = match &config["chat_template"] {
        serde_json::Value::String(t) => t.clone(),
        // Several named templates: transformers renders with "default" unless told otherwise.
        serde_json::Value::Array(named) => {
            let name_of = |t: &serde_json::Value| t["name"].as_str().unwrap_or("?").to_string();
            let default = named
                .iter()
                .find(|t| t["name"] == "default")
                .ok_or_else(|| {
                    let names: Vec<String> = named.iter().map(name_of).collect();
                    bad(format!(
                        "chat_template lists templates {names:?} but none named \"default\""
                    ))
                })?;
            default["template"]
                .as_str()
                .ok_or_else(|| bad("the \"default\" chat_template has no text".into()))?
                .to_string()
        }
        serde_json::Value::Null if jinja.is_file() => {
            String::from_utf8(crate::store::read_file(&jinja)?).map_err(|e| Error::Checkpoint {
                path: jinja.clone(),
                reason: format!("not UTF-8 (byte {})", e.utf8_error().valid_up_to()),
            })?
        }
        serde_json::Value::Null => return Ok(None),
        other => {
            return Err(bad(format!(
                "chat_template is {other}, not a string or a list of named templates"
            )))
        }
    };
    Ok(Some(ChatTemplate {
        template,
        bos: token("bos_token"),
        eos: token("eos_token"),
    }))
}

/// The ChatML template, for models that carry none: `<|im_start|>role\ncontent<|im_end|>\n` per
/// message, then `<|im_start|>assistant\n` to prompt a reply.
pub const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Renders `messages` with `template`; with `add_generation_prompt` the text ends where the
/// assistant's reply begins. `bos`/`eos` are the tokenizer's special tokens as text.
pub fn render_chat(
    template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos: &str,
    eos: &str,
) -> Result<String> {
    let template = ChatTemplate {
        template: template.to_string(),
        bos: bos.to_string(),
        eos: eos.to_string(),
    };
    template.render(
        &ChatContext::from_messages(messages, add_generation_prompt),
        Clock::Now,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_with_a_default_system_message() {
        // SmolLM2's template (a ChatML variant with a default system message).
        let t = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are helpful<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
        let m = [ChatMessage::new("user", "Hi?")];
        let out = render_chat(t, &m, true, "", "").unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n"
        );
        let plain = render_chat(CHATML, &m, false, "", "").unwrap();
        assert_eq!(plain, "<|im_start|>user\nHi?<|im_end|>\n");
        // Python string methods and raise_exception, as Hugging Face templates use them.
        let py = "{{ messages[0]['content'].strip() }}{% if messages|length > 1 %}{{ raise_exception('one only') }}{% endif %}";
        assert_eq!(
            render_chat(py, &[ChatMessage::new("user", "  x ")], false, "", "").unwrap(),
            "x"
        );
        let two = [ChatMessage::new("user", "a"), ChatMessage::new("user", "b")];
        assert!(render_chat(py, &two, false, "", "")
            .unwrap_err()
            .to_string()
            .contains("one only"));
        assert!(render_chat("{% for %}", &m, false, "", "").is_err());
    }

    #[test]
    fn contexts_carry_any_json_with_transformers_defaults() {
        let template = ChatTemplate {
            template: "{{ bos_token }}{{ tools }} {{ documents }} {{ add_generation_prompt }} \
                       {{ messages[0].tool_calls[0].function.arguments | tojson }} {{ x }}{{ eos_token }}"
                .into(),
            bos: "<s>".into(),
            eos: "</s>".into(),
        };
        let json = r#"{"messages": [{"role": "assistant", "content": null, "tool_calls":
            [{"function": {"name": "f", "arguments": {"z": 1, "a": [true, 2.0]}}}]}], "x": "é"}"#;
        let context = ChatContext::from_json(json).unwrap();
        // Keys in the order given; Python's None and False where nothing was given.
        assert_eq!(
            template.render(&context, Clock::Now).unwrap(),
            "<s>None None False {\"z\": 1, \"a\": [true, 2.0]} é</s>"
        );
        let mut context = context;
        context.set("bos_token", "[BOS]");
        context.set("tools", serde_json::json!([{"name": "t"}]));
        context.set("documents", ());
        assert!(template
            .render(&context, Clock::Now)
            .unwrap()
            .starts_with("[BOS][{'name': 't'}] None False"));
        for (json, says) in [
            ("{", "invalid JSON"),
            ("[1]", "expected a JSON object"),
            (r#"{"tools": []}"#, "no \"messages\""),
            (r#"{"messages": {}}"#, "not a list"),
            (r#"{"messages": [1]}"#, "message 0 is number"),
            (r#"{"messages": [], "tools": "x"}"#, "\"tools\" is string"),
            (
                r#"{"messages": [], "add_generation_prompt": 1}"#,
                "not true or false",
            ),
        ] {
            let e = ChatContext::from_json(json).unwrap_err().to_string();
            assert!(e.contains(says), "{json}: {e}");
        }
    }

    #[test]
    fn hugging_face_directories_name_their_template() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("tokenizer_config.json");
        let write = |json: &str| std::fs::write(&config, json).unwrap();
        // Several named templates: "default" is rendered.
        write(
            r#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default",
            "template": "D"}], "bos_token": {"content": "<s>"}, "eos_token": "</s>"}"#,
        );
        let t = hf_chat_template(dir.path()).unwrap().unwrap();
        assert_eq!(
            (t.template.as_str(), t.bos.as_str(), t.eos.as_str()),
            ("D", "<s>", "</s>")
        );
        write(r#"{"chat_template": [{"name": "tool_use", "template": "T"}]}"#);
        let e = hf_chat_template(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("[\"tool_use\"]") && e.contains("\"default\""),
            "{e}"
        );
        write(r#"{"chat_template": 3}"#);
        let e = hf_chat_template(dir.path()).unwrap_err().to_string();
        assert!(e.contains("chat_template is 3"), "{e}");
        // No template in the config: chat_template.jinja, which must be UTF-8.
        write("{}");
        assert!(hf_chat_template(dir.path()).unwrap().is_none());
        std::fs::write(dir.path().join("chat_template.jinja"), b"ok \xff").unwrap();
        let e = hf_chat_template(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not UTF-8 (byte 3)"), "{e}");
    }
}
