//! Tools on a real server: the tiny Llama of ../shared given Qwen 2.5's chat template (a model
//! directory made here: its files linked, a `tokenizer_config.json` with the template). The
//! prompt the server builds is the library's own rendering of `messages` + `tools` (counted in
//! `usage.prompt_tokens`); `tool_choice: "none"` leaves the tools out; a history with an
//! assistant's `tool_calls` and a `role: "tool"` result is accepted; the random model writes
//! no call, so its reply stays prose (no `tool_calls`), whole and streamed; what is not
//! supported is a 400 naming the field. The parsing of calls is tested over strings in
//! `src/serve/openai/tool_calls_tests.rs`.

use super::serve_options::{events, ok, post, shared, start};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use transformer::pipeline::chat::{ChatContext, ChatTemplate};
use transformer::pipeline::generate::TextGenerator;
use transformer::pipeline::jinja::Clock;

/// The tiny Llama's files linked into a fresh directory with `template` as its chat template.
fn with_template(tiny: &Path, template: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("serve-tools-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for name in [
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
    ] {
        std::os::unix::fs::symlink(tiny.join(name), dir.join(name)).unwrap();
    }
    // Room for Qwen's tool instructions (426 tokens of this vocabulary): rotary positions, so
    // the random model runs the same at any length.
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(tiny.join("config.json")).unwrap()).unwrap();
    config["max_position_embeddings"] = 2048.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let config = json!({"chat_template": template, "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    dir
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
}

#[test]
fn tools_rendered_by_the_template_and_tool_history_accepted() {
    let Some(tiny) = shared("reference/hf-decoders/llama-tiny") else {
        return;
    };
    let Some(templates) = shared("reference/chat-templates") else {
        return;
    };
    let template =
        std::fs::read_to_string(templates.join("Qwen-Qwen2.5-7B-Instruct.jinja")).unwrap();
    let dir = with_template(&tiny, &template);
    let g = TextGenerator::load(&dir).unwrap();
    let chat = ChatTemplate {
        template: template.clone(),
        bos: "<|endoftext|>".into(),
        eos: "<|endoftext|>".into(),
    };
    // The prompt's length as the library renders and tokenizes the context.
    let tokens = |context: Value| -> usize {
        let context = ChatContext::from_json(&context.to_string()).unwrap();
        let text = chat.render(&context, Clock::Now).unwrap();
        g.tokenizer.encode(&text).unwrap().len()
    };
    let server = start(&dir);
    let addr = server.addr;
    let messages = json!([{"role": "user", "content": "Weather in Paris?"}]);
    let with_tools =
        tokens(json!({"messages": messages, "tools": tools(), "add_generation_prompt": true}));
    let without = tokens(json!({"messages": messages, "add_generation_prompt": true}));
    assert!(with_tools > without + 20);
    let request =
        json!({"messages": messages, "tools": tools(), "max_tokens": 8, "temperature": 0});
    let body = ok(addr, "/v1/chat/completions", &request);
    assert_eq!(body["usage"]["prompt_tokens"], with_tools);
    // The random model writes prose: no tool_calls, an ordinary finish.
    let message = &body["choices"][0]["message"];
    assert!(message.get("tool_calls").is_none(), "{body}");
    assert!(["stop", "length"].contains(&body["choices"][0]["finish_reason"].as_str().unwrap()));
    // Streamed: the same prose.
    let mut streamed = request.clone();
    streamed["stream"] = true.into();
    let text: String = events(addr, "/v1/chat/completions", &streamed)
        .iter()
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(text, message["content"].as_str().unwrap());
    // tool_choice "none": the tools are not shown to the model.
    let mut none = request.clone();
    none["tool_choice"] = "none".into();
    assert_eq!(
        ok(addr, "/v1/chat/completions", &none)["usage"]["prompt_tokens"],
        without
    );
    // A history with the assistant's call (arguments a JSON string on the wire, an object for
    // the template) and the tool's result.
    let history = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21}"}
    ]);
    let rendered = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}}, "id": "call_1"}]},
        {"role": "tool", "content": "{\"temperature\": 21}", "tool_call_id": "call_1"}
    ]);
    let want =
        tokens(json!({"messages": rendered, "tools": tools(), "add_generation_prompt": true}));
    let body = ok(
        addr,
        "/v1/chat/completions",
        &json!({"messages": history, "tools": tools(), "max_tokens": 4, "parallel_tool_calls": false}),
    );
    assert_eq!(body["usage"]["prompt_tokens"], want);
    // Refused by name.
    let bad_history = json!([{"role": "assistant", "tool_calls": [{"type": "function",
        "function": {"name": "get_weather", "arguments": "{not json"}}]}]);
    for (extra, param) in [
        (json!({"tool_choice": "sometimes"}), "tool_choice"),
        (
            json!({"tool_choice": {"type": "function", "function": {"name": "no_such_tool"}}}),
            "tool_choice",
        ),
        (json!({"tools": {"name": "x"}}), "tools"),
        (json!({"tools": [{"type": "retrieval"}]}), "tools"),
        (
            json!({"tools": [{"type": "function", "function": {"description": "no name"}}]}),
            "tools",
        ),
        (json!({"parallel_tool_calls": "yes"}), "parallel_tool_calls"),
        (json!({"messages": bad_history}), "messages"),
        (
            json!({"messages": [{"role": "user", "tool_calls": []}]}),
            "messages",
        ),
    ] {
        let mut body = request.clone();
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, answer) = post(addr, "/v1/chat/completions", &body);
        assert_eq!(
            (status, &answer["error"]["param"]),
            (400, &json!(param)),
            "{body} -> {answer}"
        );
    }
    ok(addr, "/v1/chat/completions", &request);
    server.shutdown().unwrap();
    // A model without a chat template cannot be shown tools.
    let server = start(&tiny);
    let (status, answer) = post(server.addr, "/v1/chat/completions", &request);
    assert_eq!(
        (status, &answer["error"]["param"]),
        (400, &json!("tools")),
        "{answer}"
    );
    server.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
