//! What llama.cpp's own server test suite (benches/compare/llama_server_suite) showed missing
//! or different, each checked here with the tiny Hugging Face Llama of ../shared:
//! - one model served answers any `model` name (SDKs send fixed names);
//! - llama.cpp's error types (`authentication_error`, `exceed_context_size_error`,
//!   `not_found_error`, `not_supported_error`);
//! - CORS: llama-server's `localhost` pattern and `--cors-credentials`, preflights 200;
//! - `--no-webui`, `--no-metrics`, the `llamacpp:` metric names and `Process-Start-Time-Unix`;
//! - `timings`' generation rate over the steps after the first token;
//! - `top_k <= 0` and empty stop strings, as llama.cpp takes them;
//! - `--context-shift`: a generation past `--ctx-size` goes on from the kept tokens, token for
//!   token what a request of the shifted prompt gives.

use super::serve_llama::ends;
use super::serve_surface::{get, json_of, model_dir, post, reference, start, T};
use serde_json::{json, Value};
use std::io::{Read, Write};
use transformer::serve::client::{request, request_with};
use transformer::serve::native::LlamaOptions;
use transformer::serve::ServeConfig;

fn header(headers: &[(String, String)], name: &str) -> Option<String> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.clone())
}

#[test]
fn one_model_answers_any_model_name() {
    let Some(server) = start(|c| ServeConfig {
        served_model_name: Some("tiny".into()),
        ..c
    }) else {
        return;
    };
    let addr = server.addr;
    let messages = json!([{"role": "user", "content": "Hi"}]);
    for (path, model) in [
        ("/v1/completions", "gpt-3.5-turbo-instruct"),
        ("/v1/chat/completions", "gpt-4o"),
        ("/completion", "davinci-002"),
        ("/v1/completions", "tiny"),
    ] {
        let req = match path {
            "/v1/chat/completions" => {
                json!({"model": model, "messages": messages, "max_tokens": 1})
            }
            _ => json!({"model": model, "prompt": "x", "max_tokens": 1}),
        };
        let (status, body) = post(addr, path, &req);
        assert_eq!(status, 200, "{path} {model}: {body}");
        // Responses name the model served, whatever was asked.
        if path != "/completion" {
            assert_eq!(body["model"], "tiny", "{body}");
        }
    }
    // Looking a model up is not a request to answer: an unknown id is 404, naming the served.
    let (status, body) = get(addr, "/v1/models/gpt-4o");
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["type"], "not_found_error");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("`tiny`") && message.contains("`llama-tiny`"),
        "{message}"
    );
}

#[test]
fn errors_carry_llama_cpp_types() {
    let Some(server) = start(|c| ServeConfig {
        api_key: Some("k".into()),
        llama: LlamaOptions {
            ctx_size: Some(32),
            ..Default::default()
        },
        ..c
    }) else {
        return;
    };
    let addr = server.addr;
    let json_ct = ("Content-Type", "application/json");
    let body = json!({"prompt": "hello", "max_tokens": 1}).to_string();
    for auth in [None, Some("Bearer wrong")] {
        let mut headers = vec![json_ct];
        headers.extend(auth.map(|a| ("Authorization", a)));
        let (status, _, text) =
            request_with(addr, "POST", "/completions", &headers, Some(&body), T).unwrap();
        let err = json_of(&text);
        assert_eq!(status, 401);
        assert_eq!(err["error"]["type"], "authentication_error", "{err}");
    }
    let key = ("Authorization", "Bearer k");
    let long = json!({"messages": [{"role": "user", "content": "word ".repeat(100)}]});
    for stream in [false, true] {
        let mut req = long.clone();
        req["stream"] = stream.into();
        let (status, _, text) = request_with(
            addr,
            "POST",
            "/chat/completions",
            &[json_ct, key],
            Some(&req.to_string()),
            T,
        )
        .unwrap();
        let err = json_of(&text);
        assert_eq!(status, 400, "{err}");
        assert_eq!(err["error"]["type"], "exceed_context_size_error", "{err}");
        assert_eq!(err["error"]["n_ctx"], 32);
        assert!(err["error"]["n_prompt_tokens"].as_u64().unwrap() > 32);
        let message = err["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("exceeds the available context size"),
            "{message}"
        );
    }
    let (status, _, text) = request_with(addr, "GET", "/nothing", &[key], None, T).unwrap();
    assert_eq!(status, 404);
    assert_eq!(json_of(&text)["error"]["type"], "not_found_error");
    // A plain bad request stays invalid_request_error.
    let (status, _, text) = request_with(
        addr,
        "POST",
        "/completion",
        &[json_ct, key],
        Some(&json!({"prompt": "x", "mirostat": 2}).to_string()),
        T,
    )
    .unwrap();
    assert_eq!(status, 400);
    assert_eq!(json_of(&text)["error"]["type"], "invalid_request_error");
}

#[test]
fn cors_localhost_pattern_and_credentials() {
    let Some(server) = start(|c| ServeConfig {
        cors_origins: vec!["localhost".into()],
        ..c
    }) else {
        return;
    };
    let preflight = |addr, origin: &str| {
        let (status, headers, _) = request_with(
            addr,
            "OPTIONS",
            "/completions",
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "POST"),
                ("Access-Control-Request-Headers", "Authorization"),
            ],
            None,
            T,
        )
        .unwrap();
        assert_eq!(status, 200, "{origin}");
        headers
    };
    for origin in [
        "http://localhost:8080",
        "http://127.0.0.1",
        "http://[::1]:3000",
    ] {
        let h = preflight(server.addr, origin);
        assert_eq!(
            header(&h, "access-control-allow-origin").as_deref(),
            Some(origin)
        );
        assert_eq!(header(&h, "access-control-allow-credentials"), None);
    }
    for origin in [
        "http://localhost.evil.com",
        "http://notlocalhost",
        "http://evil.com",
    ] {
        let h = preflight(server.addr, origin);
        assert_eq!(header(&h, "access-control-allow-origin"), None, "{origin}");
    }
    drop(server);

    // `*` with credentials: the origin is named, credentials allowed.
    let Some(server) = start(|c| ServeConfig {
        cors_origins: vec!["*".into()],
        cors_credentials: true,
        ..c
    }) else {
        return;
    };
    let h = preflight(server.addr, "http://web.mydomain.fr");
    assert_eq!(
        header(&h, "access-control-allow-origin").as_deref(),
        Some("http://web.mydomain.fr")
    );
    assert_eq!(
        header(&h, "access-control-allow-credentials").as_deref(),
        Some("true")
    );
    let (_, h, _) = request_with(
        server.addr,
        "GET",
        "/health",
        &[("Origin", "http://web.mydomain.fr")],
        None,
        T,
    )
    .unwrap();
    assert_eq!(
        header(&h, "access-control-allow-origin").as_deref(),
        Some("http://web.mydomain.fr")
    );
    // Header names go out as llama-server writes them (clients that read them into plain
    // maps look them up so).
    let mut s = std::net::TcpStream::connect(server.addr).unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nOrigin: http://a.b\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    assert!(
        raw.contains("\r\nAccess-Control-Allow-Origin: http://a.b\r\n"),
        "{raw}"
    );
    assert!(raw.contains("\r\nContent-Type: "), "{raw}");
}

#[test]
fn no_webui_no_metrics_and_llama_cpp_metric_names() {
    let Some(server) = start(|c| ServeConfig {
        llama: LlamaOptions {
            webui: false,
            metrics: false,
            ..Default::default()
        },
        ..c
    }) else {
        return;
    };
    let (status, _, text) = request(server.addr, "GET", "/", None, T).unwrap();
    assert_eq!(status, 404, "{text}");
    let (status, _, text) = request(server.addr, "GET", "/metrics", None, T).unwrap();
    assert_eq!(status, 501);
    assert_eq!(json_of(&text)["error"]["type"], "not_supported_error");
    drop(server);

    let Some(server) = start(|c| c) else {
        return;
    };
    let addr = server.addr;
    let (status, _, page) = request(addr, "GET", "/", None, T).unwrap();
    assert_eq!(status, 200);
    assert!(page.to_ascii_lowercase().contains("<!doctype html>"));
    let mut predicted = 0;
    for n in [1, 4, 16] {
        let req = json!({"prompt": "I believe", "n_predict": n, "logit_bias": ends()});
        let (status, body) = post(addr, "/completion", &req);
        assert_eq!(status, 200, "{body}");
        predicted += body["timings"]["predicted_n"].as_u64().unwrap();
    }
    assert_eq!(predicted, 21);
    let (status, headers, text) = request(addr, "GET", "/metrics", None, T).unwrap();
    assert_eq!(status, 200);
    let started: u64 = header(&headers, "process-start-time-unix")
        .unwrap()
        .parse()
        .unwrap();
    assert!(started > 1_700_000_000);
    let value = |name: &str| -> (String, f64) {
        let kind = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("# TYPE llamacpp:{name} ")))
            .unwrap_or_else(|| panic!("no {name}"));
        let v = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("llamacpp:{name} ")))
            .unwrap();
        (kind.to_string(), v.parse().unwrap())
    };
    assert_eq!(value("tokens_predicted_total"), ("counter".into(), 21.0));
    assert!(value("n_decode_total").1 >= 16.0);
    assert!(value("prompt_tokens_total").1 > 0.0);
    assert_eq!(value("requests_processing"), ("gauge".into(), 0.0));
    assert!(text.contains("# HELP llamacpp:n_busy_slots_per_decode "));
}

#[test]
fn timings_rate_the_steps_after_the_first_token() {
    let Some(server) = start(|c| c) else {
        return;
    };
    let addr = server.addr;
    let req = json!({"prompt": "I believe", "n_predict": 1});
    let (_, body) = post(addr, "/completion", &req);
    let t = &body["timings"];
    assert_eq!(t["predicted_n"], 1);
    assert_eq!(
        (
            t["predicted_per_second"].as_f64(),
            t["predicted_per_token_ms"].as_f64()
        ),
        (Some(0.0), Some(0.0))
    );
    assert!(t["prompt_ms"].as_f64().unwrap() > 0.0);
    let req = json!({"prompt": "I believe", "n_predict": 8, "logit_bias": ends()});
    let (_, body) = post(addr, "/completion", &req);
    let t = &body["timings"];
    assert_eq!(t["predicted_n"], 8);
    let ms = t["predicted_ms"].as_f64().unwrap();
    let rate = t["predicted_per_second"].as_f64().unwrap();
    assert!((rate - 1e3 / ms * 7.0).abs() < 1e-6 * rate.max(1.0), "{t}");
    assert!((t["predicted_per_token_ms"].as_f64().unwrap() - ms / 7.0).abs() < 1e-9);
}

#[test]
fn top_k_below_one_and_empty_stop_strings_change_nothing() {
    let Some(server) = start(|c| c) else {
        return;
    };
    let addr = server.addr;
    let r = reference(&model_dir().unwrap());
    let greedy = json!({"prompt": r.text, "max_tokens": 8, "temperature": 0, "seed": 1});
    let (status, plain) = post(addr, "/v1/completions", &greedy);
    assert_eq!(status, 200, "{plain}");
    // llama.cpp: top_k <= 0 is no top-k, an empty stop string is dropped. Sampling at
    // temperature 1 with the same seed gives the same text with and without them.
    let sampled = json!({"prompt": r.text, "max_tokens": 8, "temperature": 1, "seed": 7});
    let (_, want) = post(addr, "/v1/completions", &sampled);
    let mut odd = sampled.clone();
    odd["top_k"] = json!(-5);
    odd["stop"] = json!([""]);
    let (status, got) = post(addr, "/v1/completions", &odd);
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["choices"][0]["text"], want["choices"][0]["text"]);
    assert_eq!(
        got["usage"]["completion_tokens"],
        want["usage"]["completion_tokens"]
    );
}

#[test]
fn context_shift_continues_from_the_kept_tokens() {
    let r = match model_dir() {
        Some(dir) => reference(&dir),
        None => return,
    };
    let prompt = r.input_ids.clone();
    let n = prompt.len();
    let n_ctx = n + 20;
    let Some(server) = start(|c| ServeConfig {
        llama: LlamaOptions {
            ctx_size: Some(n_ctx),
            ctx_shift: true,
            ..Default::default()
        },
        prefix_cache: false,
        ..c
    }) else {
        return;
    };
    let addr = server.addr;
    let ask = |prompt: &[u32], n_predict: usize, n_keep: usize| -> Value {
        let req = json!({"prompt": prompt, "n_predict": n_predict, "n_keep": n_keep,
                         "temperature": 0, "return_tokens": true, "logit_bias": ends()});
        let (status, body) = post(addr, "/completion", &req);
        assert_eq!(status, 200, "{body}");
        body
    };
    let ids = |v: &Value| -> Vec<u32> { serde_json::from_value(v["tokens"].clone()).unwrap() };
    let body = ask(&prompt, 30, 2);
    let tokens = ids(&body);
    assert_eq!(tokens.len(), 30, "{body}");
    assert_eq!(body["tokens_predicted"], 30);
    assert_eq!(body["tokens_evaluated"], n);
    assert_eq!(body["truncated"], true);
    // The first 20 tokens fill the context: a request for them alone gives them.
    assert_eq!(ids(&ask(&prompt, 20, 2)), tokens[..20]);
    // Then the first 2 tokens are kept, half of the rest dropped, and the other 10 tokens
    // are what that shifted prompt gives.
    let mut sequence = prompt.clone();
    sequence.extend_from_slice(&tokens[..20]);
    let discard = (n_ctx - 2) / 2;
    let mut shifted = sequence[..2].to_vec();
    shifted.extend_from_slice(&sequence[2 + discard..]);
    assert_eq!(ids(&ask(&shifted, 10, 2)), tokens[20..]);
    // Without --context-shift the same request stops at the context's end.
    drop(server);
    let Some(server) = start(|c| ServeConfig {
        llama: LlamaOptions {
            ctx_size: Some(n_ctx),
            ..Default::default()
        },
        ..c
    }) else {
        return;
    };
    let req = json!({"prompt": prompt, "n_predict": 30, "temperature": 0, "logit_bias": ends()});
    let (status, body) = post(server.addr, "/completion", &req);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["tokens_predicted"], 20);
    assert_eq!(body["truncated"], true);
}

#[test]
fn prompts_mix_token_ids_and_texts_as_llama_cpp_reads_them() {
    let Some(server) = start(|c| c) else {
        return;
    };
    let addr = server.addr;
    let g = transformer::pipeline::generate::TextGenerator::load(&model_dir().unwrap()).unwrap();
    let text = "I believe the meaning of life is";
    let (_, body) = post(
        addr,
        "/tokenize",
        &json!({"content": text, "add_special": true}),
    );
    let ids = body["tokens"].clone();
    let greedy = |prompt: Value| {
        let (status, body) = post(
            addr,
            "/completion",
            &json!({"prompt": prompt, "n_predict": 4, "temperature": 0}),
        );
        assert_eq!(status, 200, "{body}");
        body
    };
    // A list of a token list, a text and a prompt object: three prompts, the same sequence.
    let three = greedy(json!([ids, text, {"prompt_string": text}]));
    let three = three.as_array().unwrap();
    assert_eq!(three.len(), 3);
    for answer in three {
        assert_eq!(answer["content"], three[0]["content"]);
        assert_eq!(answer["tokens_evaluated"], ids.as_array().unwrap().len());
    }
    // Ids and texts in one list: one sequence, the texts tokenized in place (no BOS inside).
    let one = greedy(json!([1, 2, 3, text, 4, text]));
    let piece = g.tokenizer.encode(text).unwrap().len();
    assert_eq!(one["tokens_evaluated"], 4 + 2 * piece, "{one}");
    let (status, body) = post(addr, "/completion", &json!({"prompt": [1, {"x": 1}]}));
    assert_eq!(status, 400, "{body}");
}

#[test]
fn ignore_eos_a_role_chunk_first_and_refused_template_switches() {
    let Some(server) = start(|c| c) else {
        return;
    };
    let addr = server.addr;
    let g = transformer::pipeline::generate::TextGenerator::load(&model_dir().unwrap()).unwrap();
    // ignore_eos bans the end tokens, listed in generation_settings.logit_bias as null (-inf).
    let req = json!({"prompt": "I believe", "n_predict": 4, "ignore_eos": true});
    let (status, body) = post(addr, "/completion", &req);
    assert_eq!(status, 200, "{body}");
    let bias = body["generation_settings"]["logit_bias"]
        .as_array()
        .unwrap();
    let ends = g.tokenizer.end_tokens();
    assert_eq!(bias.len(), ends.len(), "{body}");
    for (entry, id) in bias.iter().zip(&ends) {
        assert_eq!(entry, &json!({"token": id, "bias": null}));
    }
    let (_, body) = post(
        addr,
        "/completion",
        &json!({"prompt": "I believe", "n_predict": 2}),
    );
    assert_eq!(body["generation_settings"]["logit_bias"], json!([]));
    // A chat stream opens with the role and no content.
    let req =
        json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": true});
    let mut c = transformer::serve::client::Connection::open(
        addr,
        "POST",
        "/v1/chat/completions",
        Some(&req.to_string()),
        T,
    )
    .unwrap();
    let first: Value = serde_json::from_str(&c.next_event().unwrap().unwrap()).unwrap();
    assert_eq!(
        first["choices"][0]["delta"],
        json!({"role": "assistant", "content": null})
    );
    let second: Value = serde_json::from_str(&c.next_event().unwrap().unwrap()).unwrap();
    assert!(
        second["choices"][0]["delta"].get("role").is_none(),
        "{second}"
    );
    // Continuing the last message is not done here: refused by name.
    let messages =
        json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]);
    for (field, value) in [
        ("continue_final_message", true),
        ("add_generation_prompt", false),
    ] {
        let mut req = json!({"messages": messages, "max_tokens": 2});
        req[field] = value.into();
        let (status, body) = post(addr, "/v1/chat/completions", &req);
        assert_eq!(
            (status, body["error"]["param"].as_str()),
            (400, Some(field)),
            "{body}"
        );
    }
}

#[test]
fn anthropic_messages_over_the_chat_route() {
    let Some(server) = start(|c| c) else {
        return;
    };
    let addr = server.addr;
    let messages = json!([{"role": "user", "content": [{"type": "text", "text": "Say"},
                                                       {"type": "text", "text": " hello"}]}]);
    let req = json!({"model": "claude-x", "max_tokens": 5, "system": "Be brief.",
                     "messages": messages, "temperature": 0});
    let (status, body) = post(addr, "/v1/messages", &req);
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (&body["type"], &body["role"]),
        (&json!("message"), &json!("assistant"))
    );
    assert_eq!(body["content"][0]["type"], "text");
    assert_eq!(body["stop_reason"], "max_tokens");
    assert_eq!(body["usage"]["output_tokens"], 5);
    // The same conversation through the chat route: the same text and prompt size.
    let chat = json!({"max_tokens": 5, "temperature": 0, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello"}]});
    let (_, want) = post(addr, "/v1/chat/completions", &chat);
    assert_eq!(
        body["content"][0]["text"],
        want["choices"][0]["message"]["content"]
    );
    assert_eq!(
        body["usage"]["input_tokens"],
        want["usage"]["prompt_tokens"]
    );
    let (status, count) = post(
        addr,
        "/v1/messages/count_tokens",
        &json!({"system": "Be brief.", "messages": messages}),
    );
    assert_eq!(status, 200, "{count}");
    assert_eq!(
        count,
        json!({"input_tokens": want["usage"]["prompt_tokens"]})
    );
    let (_, count) = post(addr, "/chat/completions/input_tokens", &chat);
    assert_eq!(count["input_tokens"], want["usage"]["prompt_tokens"]);
    // Streamed: Anthropic's events in order, the text the same.
    let mut streamed = req.clone();
    streamed["stream"] = true.into();
    let mut c = transformer::serve::client::Connection::open(
        addr,
        "POST",
        "/v1/messages",
        Some(&streamed.to_string()),
        T,
    )
    .unwrap();
    let mut kinds = Vec::new();
    let mut text = String::new();
    while let Some(data) = c.next_event().unwrap() {
        let event: Value = serde_json::from_str(&data).unwrap();
        if event["type"] == "content_block_delta" {
            text.push_str(event["delta"]["text"].as_str().unwrap());
        }
        kinds.push(event["type"].as_str().unwrap().to_string());
    }
    kinds.dedup();
    assert_eq!(
        kinds,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(text, body["content"][0]["text"].as_str().unwrap());
    // An image block is refused by name.
    let image = json!({"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]});
    let (status, body) = post(addr, "/v1/messages", &image);
    assert_eq!(status, 400);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("image input is not supported"));
}
