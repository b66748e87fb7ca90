//! Constrained decoding on a real server on loopback with the tiny Llama of ../shared (random
//! weights: nothing but the constraint makes its output structured). Every reply to 22 JSON
//! schemas (objects, nesting, arrays, enums, bounded numbers, required and optional members,
//! string patterns, `anyOf`, `$ref`) parses and validates against its schema
//! ([`super::json_check`], independent of llguidance), sampled at temperature 1, batched
//! together, on both endpoints and streamed; regex, Lark and GBNF replies match; llama.cpp's
//! `/completion` takes `json_schema` and `grammar`; `tool_choice` `required` and named always
//! give a parsed call with valid arguments (nested models through `$defs`); invalid or
//! unsatisfiable schemas and grammars are a 400 naming the field while the server keeps
//! serving; an unconstrained row's tokens are the same with a constrained row beside it as
//! alone.

use super::json_check::check;
use super::serve_options::{events, ok, post, shared, start};
use super::serve_surface::metric;
use regex::Regex;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// The schemas: every string and array bounded, so a random model's walk ends.
fn schemas() -> Vec<Value> {
    let s = |n: u64| json!({"type": "string", "maxLength": n});
    vec![
        json!({"type": "object", "properties": {"name": s(12)}, "required": ["name"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["b"], "additionalProperties": false}}, "required": ["a"], "additionalProperties": false}),
        json!({"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 4}),
        json!({"enum": ["red", "green", "blue"]}),
        json!({"type": "object", "properties": {"x": {"type": "number", "minimum": -1, "maximum": 1}}, "required": ["x"], "additionalProperties": false}),
        json!({"type": "integer", "exclusiveMinimum": 10, "exclusiveMaximum": 20}),
        json!({"type": "object", "properties": {"ok": {"type": "boolean"}, "none": {"type": "null"}}, "required": ["ok", "none"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9}, "note": s(8)}, "required": ["id"], "additionalProperties": false}),
        json!({"type": "string", "pattern": "^[a-z]{2,5}$"}),
        json!({"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, s(4)]}),
        json!({"type": "array", "items": {"type": "object", "properties": {"k": s(3), "v": {"type": "boolean"}}, "required": ["k", "v"], "additionalProperties": false}, "maxItems": 3}),
        json!({"type": "object", "properties": {"version": {"const": "1.0"}, "kind": {"const": 7}}, "required": ["version", "kind"], "additionalProperties": false}),
        json!({"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}, "y": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x", "y"], "additionalProperties": false}},
               "type": "object", "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}}, "required": ["from", "to"], "additionalProperties": false}),
        json!({"type": "array", "items": {"enum": [1, 2, 3]}, "minItems": 2, "maxItems": 2}),
        json!({"enum": [0.5, 1.5, -2]}),
        json!({"type": "object", "properties": {"l1": {"type": "object", "properties": {"l2": {"type": "object", "properties": {"l3": {"enum": ["deep"]}}, "required": ["l3"], "additionalProperties": false}}, "required": ["l2"], "additionalProperties": false}}, "required": ["l1"], "additionalProperties": false}),
        json!({"type": "string", "pattern": "^[0-9]{3}-[0-9]{4}$"}),
        json!({"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "boolean"}, "c": {"type": "boolean"}}, "required": ["a", "b", "c"], "additionalProperties": false}),
        json!({"type": ["string", "null"], "maxLength": 6}),
        json!({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "pattern": "^[A-Z][a-z]{0,4}$"}, "maxItems": 3}, "count": {"type": "integer", "minimum": 0, "maximum": 1000}}, "required": ["tags", "count"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"value": {"anyOf": [{"type": "null"}, {"type": "number", "minimum": 0, "maximum": 100}, {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}]}}, "required": ["value"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"name": s(10), "age": {"type": "integer", "minimum": 0, "maximum": 150}, "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"}}, "required": ["name", "age"], "additionalProperties": false}),
    ]
}

fn chat(schema: &Value, seed: u64) -> Value {
    json!({"messages": [{"role": "user", "content": "Answer in JSON."}], "max_tokens": 200,
           "temperature": 1.0, "seed": seed,
           "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": true}}})
}

/// `content` read as JSON and checked against `schema`.
fn valid(schema: &Value, content: &str) {
    let value: Value = serde_json::from_str(content)
        .unwrap_or_else(|e| panic!("{schema}: {content:?} is not JSON: {e}"));
    check(schema, schema, &value).unwrap_or_else(|e| panic!("{schema}: {e}"));
}

#[test]
fn json_schema_replies_always_parse_and_validate() {
    let Some(dir) = shared("reference/hf-decoders/llama-tiny") else {
        return;
    };
    let server = start(&dir);
    let addr = server.addr;
    let schemas = schemas();
    assert!(schemas.len() >= 20);
    // Two samples of every schema on the chat route, all at once (one batch), and one on
    // completions.
    let answers: Vec<(Value, Value)> = std::thread::scope(|scope| {
        let handles: Vec<_> = schemas
            .iter()
            .enumerate()
            .flat_map(|(i, schema)| (0..2u64).map(move |k| (i, k, schema)))
            .map(|(i, k, schema)| {
                scope.spawn(move || {
                    let body = ok(
                        addr,
                        "/v1/chat/completions",
                        &chat(schema, 100 * i as u64 + k),
                    );
                    (schema.clone(), body)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (schema, body) in &answers {
        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], "stop", "{schema}: {body}");
        valid(schema, choice["message"]["content"].as_str().unwrap());
    }
    for (i, schema) in schemas.iter().enumerate() {
        let request = json!({"prompt": "JSON:", "max_tokens": 200, "temperature": 1.0, "seed": i,
                             "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}});
        let body = ok(addr, "/v1/completions", &request);
        assert_eq!(body["choices"][0]["finish_reason"], "stop", "{body}");
        valid(schema, body["choices"][0]["text"].as_str().unwrap());
    }
    // Streamed: the deltas make a valid reply.
    let mut streamed = chat(&schemas[20], 7);
    streamed["stream"] = true.into();
    let text: String = events(addr, "/v1/chat/completions", &streamed)
        .iter()
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    valid(&schemas[20], &text);
    // json_object: an object (n = 3 choices, each its own constrained row).
    let request = json!({"messages": [{"role": "user", "content": "JSON"}], "max_tokens": 200, "n": 3,
                         "temperature": 0.7, "seed": 3, "response_format": {"type": "json_object"}});
    let body = ok(addr, "/v1/chat/completions", &request);
    for choice in body["choices"].as_array().unwrap() {
        let content = choice["message"]["content"].as_str().unwrap();
        assert!(content.starts_with('{'), "{content}");
        if choice["finish_reason"] == "stop" {
            assert!(serde_json::from_str::<Value>(content).unwrap().is_object());
        }
    }
}

#[test]
fn regex_lark_and_gbnf_replies_match() {
    let Some(dir) = shared("reference/hf-decoders/llama-tiny") else {
        return;
    };
    let server = start(&dir);
    let addr = server.addr;
    let rx = "[A-Z][a-z]{2,8}( [a-z]{1,8}){0,3}\\.";
    let whole = Regex::new(&format!("^(?:{rx})$")).unwrap();
    for seed in 0..5 {
        let body = ok(
            addr,
            "/v1/completions",
            &json!({"prompt": "Say:", "max_tokens": 60, "seed": seed,
            "response_format": {"type": "regex", "regex": rx}}),
        );
        let text = body["choices"][0]["text"].as_str().unwrap();
        assert!(whole.is_match(text), "{text:?}");
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
    }
    let lark = "start: item (\", \" item){1,2}\nitem: \"yes\" | \"no\" | /[0-9]{1,3}/";
    let item = Regex::new("^(yes|no|[0-9]{1,3})(, (yes|no|[0-9]{1,3})){1,2}$").unwrap();
    let gbnf =
        "root ::= item (\", \" item){1,2}\nitem ::= \"yes\" | \"no\" | [0-9] [0-9]? [0-9]?\n";
    for seed in 0..4 {
        let body = ok(
            addr,
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "List"}],
            "max_tokens": 60, "seed": seed, "response_format": {"type": "lark", "grammar": lark}}),
        );
        let text = body["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(item.is_match(text), "lark: {text:?}");
        // llama.cpp's /completion: GBNF, and a JSON schema.
        let body = ok(
            addr,
            "/completion",
            &json!({"prompt": "List:", "n_predict": 60, "seed": seed, "grammar": gbnf}),
        );
        let text = body["content"].as_str().unwrap();
        assert!(item.is_match(text), "gbnf: {text:?}");
        assert_eq!(body["stop_type"], "eos");
        let schema = &schemas()[1];
        let body = ok(
            addr,
            "/completion",
            &json!({"prompt": "JSON:", "n_predict": 100, "seed": seed, "json_schema": schema}),
        );
        valid(schema, body["content"].as_str().unwrap());
    }
}

/// The tiny Llama's files linked into a fresh directory with `template` as its chat template.
fn with_template(tiny: &Path, template: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("serve-constrain-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for name in [
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
    ] {
        std::os::unix::fs::symlink(tiny.join(name), dir.join(name)).unwrap();
    }
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(tiny.join("config.json")).unwrap()).unwrap();
    config["max_position_embeddings"] = 2048.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let config = json!({"chat_template": template, "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    dir
}

#[test]
fn required_and_named_tool_choice_always_give_a_valid_call() {
    let Some(tiny) = shared("reference/hf-decoders/llama-tiny") else {
        return;
    };
    let Some(templates) = shared("reference/chat-templates") else {
        return;
    };
    // Nested models as pydantic writes them (`$defs`, `#/$defs/...`), both tools defining a
    // `Place` of a different shape: each call's arguments must follow its own.
    let weather = json!({"$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                                                            "unit": {"enum": ["c", "f"]}},
                                             "required": ["city", "unit"], "additionalProperties": false}},
                         "type": "object", "properties": {"place": {"$ref": "#/$defs/Place"}},
                         "required": ["place"], "additionalProperties": false});
    let time = json!({"$defs": {"Place": {"type": "integer", "minimum": -12, "maximum": 12}},
                      "type": "object", "properties": {"zone": {"$ref": "#/$defs/Place"}},
                      "required": ["zone"], "additionalProperties": false});
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": weather}},
        {"type": "function", "function": {"name": "get_time", "description": "The time in a zone", "parameters": time}}
    ]);
    let schema_of = |name: &str| {
        if name == "get_weather" {
            &weather
        } else {
            &time
        }
    };
    for file in [
        "Qwen-Qwen2.5-7B-Instruct.jinja",
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "mistralai-Mistral-Nemo-Instruct-2407.jinja",
        "ibm-granite-granite-3.3-2B-Instruct.jinja",
        "meetkai-functionary-medium-v3.1.jinja",
    ] {
        let template = std::fs::read_to_string(templates.join(file)).unwrap();
        let dir = with_template(&tiny, &template);
        let server = start(&dir);
        let addr = server.addr;
        let messages = json!([{"role": "user", "content": "Weather in Paris?"}]);
        for (seed, choice) in [
            (1, json!("required")),
            (2, json!("required")),
            (
                3,
                json!({"type": "function", "function": {"name": "get_time"}}),
            ),
            (
                4,
                json!({"type": "function", "function": {"name": "get_weather"}}),
            ),
        ] {
            for stream in [false, true] {
                let request = json!({"messages": messages, "tools": tools, "tool_choice": choice, "seed": seed,
                                     "temperature": 1.0, "max_tokens": 200, "stream": stream});
                let calls: Vec<Value> = if stream {
                    let chunks = events(addr, "/v1/chat/completions", &request);
                    let last = chunks
                        .iter()
                        .rev()
                        .find(|c| !c["choices"][0]["finish_reason"].is_null())
                        .unwrap();
                    assert_eq!(last["choices"][0]["finish_reason"], "tool_calls", "{file}");
                    chunks
                        .iter()
                        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
                        .flatten()
                        .cloned()
                        .collect()
                } else {
                    let body = ok(addr, "/v1/chat/completions", &request);
                    assert_eq!(
                        body["choices"][0]["finish_reason"], "tool_calls",
                        "{file}: {body}"
                    );
                    body["choices"][0]["message"]["tool_calls"]
                        .as_array()
                        .unwrap()
                        .clone()
                };
                assert_eq!(calls.len(), 1, "{file}: {calls:?}");
                let name = calls[0]["function"]["name"].as_str().unwrap();
                if let Some(wanted) = choice.pointer("/function/name") {
                    assert_eq!(name, wanted);
                }
                let args: Value =
                    serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap())
                        .unwrap();
                check(schema_of(name), schema_of(name), &args)
                    .unwrap_or_else(|e| panic!("{file}: {e}"));
            }
        }
        // A named tool that is not offered, and tool_choice without tools: 400.
        for bad in [
            json!({"messages": messages, "tools": tools, "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            json!({"messages": messages, "tools": [], "tool_choice": "required"}),
        ] {
            let (status, body) = post(addr, "/v1/chat/completions", &bad);
            assert_eq!(status, 400, "{body}");
            assert_eq!(body["error"]["param"], "tool_choice");
        }
    }
}

#[test]
fn bad_schemas_and_grammars_are_400s_and_the_server_goes_on() {
    let Some(dir) = shared("reference/hf-decoders/llama-tiny") else {
        return;
    };
    let server = start(&dir);
    let addr = server.addr;
    let messages = json!([{"role": "user", "content": "x"}]);
    let cases = [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 2}}}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 12}}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema"}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "regex", "regex": "(unclosed"}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "regex"}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "lark", "grammar": "start: undefined_rule"}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "yaml"}}),
            "response_format",
        ),
        (json!({"response_format": "json"}), "response_format"),
        (json!({"grammar": "root ::= ("}), "grammar"),
        (json!({"grammar": 5}), "grammar"),
        (json!({"json_schema": "x"}), "json_schema"),
        (
            json!({"json_schema": {"type": "object"}, "grammar": "root ::= \"a\""}),
            "grammar",
        ),
    ];
    for (extra, field) in cases {
        let mut request = json!({"messages": messages, "max_tokens": 8});
        for (k, v) in extra.as_object().unwrap() {
            request[k] = v.clone();
        }
        let (status, body) = post(addr, "/v1/chat/completions", &request);
        assert_eq!(status, 400, "{request} -> {body}");
        assert_eq!(body["error"]["param"], field, "{body}");
        assert!(!body["error"]["message"].as_str().unwrap().is_empty());
    }
    // Still serving, constrained and not.
    let body = ok(
        addr,
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 40,
        "response_format": {"type": "regex", "regex": "(ab|cd){2}"}}),
    );
    let text = body["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(Regex::new("^(ab|cd){2}$").unwrap().is_match(text), "{text}");
    ok(
        addr,
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 4}),
    );
}

#[test]
fn unconstrained_rows_are_the_same_beside_a_constrained_row() {
    let Some(dir) = shared("reference/hf-decoders/llama-tiny") else {
        return;
    };
    let server = start(&dir);
    let addr = server.addr;
    let plain = json!({"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0.9, "seed": 42, "logprobs": 2});
    let alone = ok(addr, "/v1/completions", &plain);
    let constrained = json!({"prompt": "JSON:", "max_tokens": 32, "temperature": 0.9, "seed": 1,
                             "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schemas()[10]}}});
    let mut constrained_tokens = 0;
    for _ in 0..3 {
        let (beside, c) = std::thread::scope(|scope| {
            let c = scope.spawn(|| ok(addr, "/v1/completions", &constrained));
            let p = scope.spawn(|| ok(addr, "/v1/completions", &plain));
            (p.join().unwrap(), c.join().unwrap())
        });
        assert_eq!(beside["choices"][0]["text"], alone["choices"][0]["text"]);
        // Same tokens and log-probabilities to float32 rounding (`json_close`: batched beside
        // another row, a step may take the matrix product instead of the matrix-vector kernel).
        crate::json_close::assert_json_close(
            &beside["choices"][0]["logprobs"],
            &alone["choices"][0]["logprobs"],
            1e-4,
        );
        constrained_tokens += c["usage"]["completion_tokens"].as_u64().unwrap();
    }
    // One mask per token of the constrained rows (computed beside the forward pass), none for
    // the plain rows.
    let masks = metric(addr, "transformer_constraint_masks_total");
    assert_eq!(masks, constrained_tokens as f64);
    assert!(metric(addr, "transformer_constraint_mask_seconds_total") > 0.0);
    assert!(metric(addr, "transformer_forward_seconds_total") > 0.0);
}
