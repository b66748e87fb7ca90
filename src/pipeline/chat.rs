//! Chat with a language model: the conversation rendered into the prompt text by the model's own
//! chat template (Jinja, as transformers renders it: `messages`, `add_generation_prompt`,
//! `bos_token`, `eos_token`, `raise_exception`, Python string methods), then a reply generated
//! until the end-of-turn token.

use crate::error::{Error, Result};
use serde::Serialize;

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A model's chat template with the special tokens it refers to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatTemplate {
    pub template: String,
    pub bos: String,
    pub eos: String,
}

impl ChatTemplate {
    /// The prompt text of `messages`, ending where the assistant's reply begins.
    pub fn prompt(&self, messages: &[ChatMessage]) -> Result<String> {
        render_chat(&self.template, messages, true, &self.bos, &self.eos)
    }
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
    let template = match config["chat_template"].as_str() {
        Some(t) => t.to_string(),
        None if jinja.is_file() => {
            String::from_utf8_lossy(&crate::store::read_file(&jinja)?).into_owned()
        }
        None => return Ok(None),
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
    let mut env = minijinja::Environment::new();
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |message: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                message,
            ))
        },
    );
    let bad = |e: minijinja::Error| Error::Input(format!("chat template: {e}"));
    env.add_template("chat", template).map_err(bad)?;
    let context = minijinja::context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        bos_token => bos,
        eos_token => eos,
    };
    env.get_template("chat")
        .map_err(bad)?
        .render(context)
        .map_err(bad)
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
}
