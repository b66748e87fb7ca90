//! The server's conventions, its guards and llama.cpp's native routes, over loopback HTTP with
//! the tiny Hugging Face Llama of ../shared:
//! - llama.cpp's routes (`/completion`, `/tokenize`, `/detokenize`, `/apply-template`,
//!   `/props`) and the aliases answer what the library computes (transformers' greedy ids, the
//!   tokenizer's ids, the chat template's rendering);
//! - `/v1/models/{id}` with the context, `--served-model-name`, 404 for a model not served
//!   (a lookup; requests naming any model are answered by the one served);
//! - every refusal in the JSON error shape, naming its cause: 401 (API key), 403 (Host), 405,
//!   413 (body limit), 415 (content type), 400 (a context overflow with llama.cpp's fields);
//!   and none of them runs a generation;
//! - CORS preflights, `/metrics`' model label and inter-token histogram;
//! - a flood of half-open connections past the cap while `/health` and a running stream keep
//!   being answered, and the header timeout closing them;
//! - a short prompt behind a long one in the engine starts decoding at once (shortest prompt
//!   first in the step's prefill budget).
//!
//! The LibreTranslate side is in `serve_libre`.

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use transformer::decode::sample::SamplingOptions;
use transformer::pipeline::chat::ChatMessage;
use transformer::pipeline::generate::TextGenerator;
use transformer::serve::client::{request, request_with, Connection};
use transformer::serve::metrics::Metrics;
use transformer::serve::scheduler::{EngineConfig, Event, GenRequest, PrefillBudget, Scheduler};
use transformer::serve::{ServeConfig, Server};

pub const T: Duration = Duration::from_secs(60);

pub fn model_dir() -> Option<PathBuf> {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/hf-decoders/llama-tiny");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!("skipped: {} is absent", dir.display());
        None
    }
}

pub fn start(config: impl FnOnce(ServeConfig) -> ServeConfig) -> Option<Server> {
    let dir = model_dir()?;
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = Server::start(config(ServeConfig::new(dir, addr))).unwrap();
    server.wait_ready().unwrap();
    Some(server)
}

pub fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

pub fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    let (status, _, text) = request(addr, "POST", path, Some(&body.to_string()), T).unwrap();
    (status, json_of(&text))
}

pub fn get(addr: SocketAddr, path: &str) -> (u16, Value) {
    let (status, _, text) = request(addr, "GET", path, None, T).unwrap();
    (status, json_of(&text))
}

/// The value of metric line `name` (with labels, exactly as printed).
pub fn metric(addr: SocketAddr, name: &str) -> f64 {
    let (status, _, text) = request(addr, "GET", "/metrics", None, T).unwrap();
    assert_eq!(status, 200);
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("{name} missing in\n{text}"))
        .parse()
        .unwrap()
}

/// An OpenAI-shaped error with `status`, `code` and `param`.
pub fn assert_error(status: u16, body: &Value, want_status: u16, code: &str, param: Option<&str>) {
    assert_eq!(status, want_status, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert_eq!(body["error"]["param"], json!(param), "{body}");
    assert!(!body["error"]["message"].as_str().unwrap().is_empty());
}

pub struct Reference {
    pub text: String,
    pub input_ids: Vec<u32>,
    pub greedy: Vec<u32>,
}

pub fn reference(dir: &Path) -> Reference {
    let r: Value =
        serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    let p0 = &r["prompts"][0];
    Reference {
        text: p0["text"].as_str().unwrap().to_string(),
        input_ids: serde_json::from_value(p0["input_ids"].clone()).unwrap(),
        greedy: serde_json::from_value(p0["greedy_ids"].clone()).unwrap(),
    }
}

#[test]
fn llama_cpp_routes_answer_what_the_library_computes() {
    let Some(server) = start(|c| ServeConfig {
        served_model_name: Some("tiny".into()),
        ..c
    }) else {
        return;
    };
    let addr = server.addr;
    let dir = model_dir().unwrap();
    let g = TextGenerator::load(&dir).unwrap();
    let r = reference(&dir);
    let n_ctx = g.model.max_len();

    let (status, _, text) = request(addr, "GET", "/v1/health", None, T).unwrap();
    assert_eq!((status, text.trim()), (200, "ok"));
    for path in ["/v1/models", "/models"] {
        let (status, models) = get(addr, path);
        assert_eq!(status, 200);
        assert_eq!(models["data"][0]["id"], "tiny");
        assert_eq!(models["data"][0]["context_length"], n_ctx);
    }
    for id in ["tiny", "llama-tiny"] {
        let (status, model) = get(addr, &format!("/v1/models/{id}"));
        assert_eq!(status, 200, "{model}");
        assert_eq!(
            (model["id"].clone(), model["max_model_len"].clone()),
            (json!("tiny"), json!(n_ctx))
        );
    }
    let (status, body) = get(addr, "/v1/models/gpt-4o");
    assert_error(status, &body, 404, "model_not_found", Some("model"));

    // /tokenize: the prompt's ids as transformers gives them (add_special: the BOS first).
    let (status, body) = post(
        addr,
        "/tokenize",
        &json!({"content": r.text, "add_special": true}),
    );
    assert_eq!(status, 200, "{body}");
    let ids: Vec<u32> = serde_json::from_value(body["tokens"].clone()).unwrap();
    assert_eq!(ids, r.input_ids);
    let (_, body) = post(addr, "/tokenize", &json!({"content": r.text}));
    let plain: Vec<u32> = serde_json::from_value(body["tokens"].clone()).unwrap();
    assert_eq!(plain, g.tokenizer.encode(&r.text).unwrap());
    let (_, body) = post(
        addr,
        "/tokenize",
        &json!({"content": "hello world", "with_pieces": true}),
    );
    let pieces = body["tokens"].as_array().unwrap();
    let want = g.tokenizer.encode("hello world").unwrap();
    assert_eq!(pieces.len(), want.len());
    for (p, &id) in pieces.iter().zip(&want) {
        assert_eq!(p["id"], id);
        assert_eq!(p["piece"], g.tokenizer.decode(&[id]).unwrap());
    }
    let (status, body) = post(addr, "/tokenize", &json!({"content": 7}));
    assert_error(status, &body, 400, "invalid_request", Some("content"));
    let (status, body) = post(addr, "/detokenize", &json!({"tokens": plain}));
    assert_eq!(status, 200);
    assert_eq!(body["content"], g.tokenizer.decode(&plain).unwrap());
    let (status, body) = post(addr, "/detokenize", &json!({"tokens": [1, 99_999_999]}));
    assert_error(status, &body, 400, "invalid_request", Some("tokens"));

    // /apply-template: what /v1/chat/completions feeds.
    let messages = json!([{"role": "user", "content": "Hi there"}]);
    let (status, body) = post(addr, "/apply-template", &json!({"messages": messages}));
    assert_eq!(status, 200, "{body}");
    let want = match &g.chat {
        Some(t) => t.prompt(&[ChatMessage::new("user", "Hi there")]).unwrap(),
        None => transformer::pipeline::chat::render_chat(
            transformer::pipeline::chat::CHATML,
            &[ChatMessage::new("user", "Hi there")],
            true,
            "",
            "",
        )
        .unwrap(),
    };
    assert_eq!(body["prompt"], want);

    let (status, props) = get(addr, "/props");
    assert_eq!(status, 200);
    assert_eq!(props["default_generation_settings"]["n_ctx"], n_ctx);
    assert_eq!(props["model_alias"], "tiny");

    // /completion with n_predict: transformers' greedy continuation.
    let (status, body) = post(
        addr,
        "/completion",
        &json!({"prompt": r.text, "n_predict": 16, "temperature": 0}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["content"], g.tokenizer.decode(&r.greedy).unwrap());
    assert_eq!(body["tokens_predicted"], 16);
    assert_eq!(body["tokens_evaluated"], r.input_ids.len());
    assert_eq!(
        (body["stop"].clone(), body["stop_type"].clone()),
        (json!(true), json!("limit"))
    );
    // n_predict on the OpenAI route, the served and the own name.
    for (path, model) in [
        ("/v1/completions", "tiny"),
        ("/v1/completions", "llama-tiny"),
    ] {
        let req = json!({"model": model, "prompt": r.text, "n_predict": 16, "temperature": 0});
        let (status, body) = post(addr, path, &req);
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            body["choices"][0]["text"],
            g.tokenizer.decode(&r.greedy).unwrap()
        );
        assert_eq!(body["usage"]["completion_tokens"], 16);
    }
    let chat = json!({"messages": messages, "max_tokens": 2});
    let (status, body) = post(addr, "/chat/completions", &chat);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    let chat_tokens = body["usage"]["completion_tokens"].as_u64().unwrap();

    // Refusals naming the field; no generation runs for them.
    let generated = metric(addr, "transformer_generated_tokens_total");
    let (status, body) = post(addr, "/completion", &json!({"prompt": "x", "mirostat": 2}));
    assert_error(status, &body, 400, "invalid_request", Some("mirostat"));
    let (status, body) = post(
        addr,
        "/completion",
        &json!({"prompt": "x", "grammar": "root ::= undefined-rule"}),
    );
    assert_error(status, &body, 400, "invalid_request", Some("grammar"));
    // One model served: any name is answered by it (serve_llama_compat has the 200s).
    let (status, body) = post(
        addr,
        "/completion",
        &json!({"model": "gpt-4o", "mirostat": 2}),
    );
    assert_error(status, &body, 400, "invalid_request", Some("mirostat"));
    let long = "word ".repeat(n_ctx * 2);
    let (status, body) = post(
        addr,
        "/chat/completions",
        &json!({"messages": [{"role": "user", "content": long}]}),
    );
    assert_error(
        status,
        &body,
        400,
        "context_length_exceeded",
        Some("prompt"),
    );
    assert!(body["error"]["n_prompt_tokens"].as_u64().unwrap() > n_ctx as u64);
    assert_eq!(body["error"]["n_ctx"], n_ctx);
    assert_eq!(
        metric(addr, "transformer_generated_tokens_total"),
        generated
    );

    // /metrics names the model and has every gap between tokens: 3 requests of 16 tokens
    // and the chat's, each gap once.
    assert_eq!(
        metric(addr, "transformer_model_info{model_name=\"tiny\"}"),
        1.0
    );
    assert_eq!(
        metric(addr, "transformer_inter_token_latency_seconds_count"),
        (3 * 15 + chat_tokens - 1) as f64
    );
}

#[test]
fn refusals_are_json_and_name_their_cause() {
    let Some(server) = start(|c| ServeConfig {
        max_body_bytes: 4096,
        allowed_hosts: vec!["my.box".into()],
        ..c
    }) else {
        return;
    };
    let addr = server.addr;
    let body = json!({"prompt": "hello", "max_tokens": 2}).to_string();
    let as_json = |status: u16, text: &str| (status, json_of(text));

    // A cross-origin no-cors POST can only send text/plain (or a form): refused, nothing runs.
    for media in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data",
    ] {
        let (status, _, text) = request_with(
            addr,
            "POST",
            "/v1/completions",
            &[("Content-Type", media)],
            Some(&body),
            T,
        )
        .unwrap();
        let (status, err) = as_json(status, &text);
        assert_error(status, &err, 415, "unsupported_media_type", None);
        assert!(err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("application/json"));
    }
    let (status, _, text) =
        request_with(addr, "POST", "/v1/completions", &[], Some(&body), T).unwrap();
    assert_error(status, &json_of(&text), 415, "unsupported_media_type", None);
    // application/json with a charset is JSON.
    let (status, _, text) = request_with(
        addr,
        "POST",
        "/v1/completions",
        &[("Content-Type", "application/json; charset=utf-8")],
        Some(&body),
        T,
    )
    .unwrap();
    assert_eq!(status, 200, "{text}");
    assert_eq!(metric(addr, "transformer_generated_tokens_total"), 2.0);

    // Host: a domain name not allowed is refused (DNS rebinding); localhost, IPs and
    // --allowed-host pass.
    for (host, want) in [
        ("evil.example:8080", 403),
        ("localhost.evil.example", 403),
        ("localhost:1234", 200),
        ("127.0.0.1", 200),
        ("[::1]:80", 200),
        ("MY.BOX:8080", 200),
    ] {
        let (status, _, text) =
            request_with(addr, "GET", "/v1/models", &[("Host", host)], None, T).unwrap();
        assert_eq!(status, want, "{host}: {text}");
        if want == 403 {
            assert_error(status, &json_of(&text), 403, "host_not_allowed", None);
        }
    }

    // Over the body limit: 413 in the JSON shape; the server goes on.
    let big = json!({"prompt": "x".repeat(5000)}).to_string();
    let (status, _, text) = request(addr, "POST", "/v1/completions", Some(&big), T).unwrap();
    let err = json_of(&text);
    assert_error(status, &err, 413, "request_too_large", None);
    assert!(err["error"]["message"].as_str().unwrap().contains("4096"));
    // A wrong method: 405 in the JSON shape.
    let (status, _, text) = request(addr, "GET", "/v1/completions", None, T).unwrap();
    assert_error(status, &json_of(&text), 405, "method_not_allowed", None);
    let (status, _, text) = request(addr, "GET", "/health", None, T).unwrap();
    assert_eq!((status, text.trim()), (200, "ok"));
}

#[test]
fn api_key_and_cors() {
    let Some(server) = start(|c| ServeConfig {
        api_key: Some("s3cret".into()),
        cors_origins: vec!["http://app.example".into()],
        ..c
    }) else {
        return;
    };
    let addr = server.addr;
    let (status, _, _) = request(addr, "GET", "/health", None, T).unwrap();
    assert_eq!(status, 200, "/health stays open");
    let body = json!({"prompt": "hello", "max_tokens": 2}).to_string();
    let json_ct = ("Content-Type", "application/json");
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Bearer s3cre"),
        Some("s3cret"),
    ] {
        let mut headers = vec![json_ct];
        if let Some(a) = auth {
            headers.push(("Authorization", a));
        }
        let (status, _, text) =
            request_with(addr, "POST", "/v1/completions", &headers, Some(&body), T).unwrap();
        assert_error(status, &json_of(&text), 401, "invalid_api_key", None);
        let (status, _, _) = request_with(addr, "GET", "/v1/models", &headers, None, T).unwrap();
        assert_eq!(status, 401);
    }
    assert_eq!(
        metric_keyed(addr, "transformer_generated_tokens_total"),
        0.0
    );
    for key in [("Authorization", "Bearer s3cret"), ("X-Api-Key", "s3cret")] {
        let (status, _, text) = request_with(
            addr,
            "POST",
            "/v1/completions",
            &[json_ct, key],
            Some(&body),
            T,
        )
        .unwrap();
        assert_eq!(status, 200, "{text}");
    }

    // CORS: a preflight from the allowed origin is answered with what it may send; another
    // origin gets no Allow-Origin; answers to the allowed origin carry it.
    let preflight = |origin: &str| {
        request_with(
            addr,
            "OPTIONS",
            "/v1/chat/completions",
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "POST"),
                (
                    "Access-Control-Request-Headers",
                    "authorization, content-type",
                ),
            ],
            None,
            T,
        )
        .unwrap()
    };
    let header = |h: &[(String, String)], name: &str| {
        h.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    };
    let (status, headers, _) = preflight("http://app.example");
    assert_eq!(status, 200);
    assert_eq!(
        header(&headers, "access-control-allow-origin").as_deref(),
        Some("http://app.example")
    );
    assert!(header(&headers, "access-control-allow-methods")
        .unwrap()
        .contains("POST"));
    assert!(header(&headers, "access-control-allow-headers")
        .unwrap()
        .contains("authorization"));
    let (status, headers, _) = preflight("http://evil.example");
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "access-control-allow-origin"), None);
    let (_, headers, _) = request_with(
        addr,
        "GET",
        "/health",
        &[("Origin", "http://app.example")],
        None,
        T,
    )
    .unwrap();
    assert_eq!(
        header(&headers, "access-control-allow-origin").as_deref(),
        Some("http://app.example")
    );
}

/// [`metric`] on a server with the API key `s3cret`.
fn metric_keyed(addr: SocketAddr, name: &str) -> f64 {
    let (status, _, text) = request_with(
        addr,
        "GET",
        "/metrics",
        &[("Authorization", "Bearer s3cret")],
        None,
        T,
    )
    .unwrap();
    assert_eq!(status, 200);
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("{name} missing in\n{text}"))
        .parse()
        .unwrap()
}

/// Whether the server has closed `stream` (reads end of file or a reset within `wait`).
fn closed(mut stream: &TcpStream, wait: Duration) -> bool {
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut buf = [0u8; 512];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue, // a 503 before the close
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
    }
}

#[test]
fn half_open_connections_neither_starve_health_nor_a_running_stream() {
    let Some(server) = start(|c| ServeConfig {
        max_connections: 32,
        header_timeout_s: 1.5,
        ..c
    }) else {
        return;
    };
    let addr = server.addr;
    // A stream running through the flood.
    let req =
        json!({"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "stream": true});
    let mut stream =
        Connection::open(addr, "POST", "/v1/completions", Some(&req.to_string()), T).unwrap();
    assert_eq!(stream.status, 200);
    let first = stream.next_event().unwrap().unwrap();
    assert!(first.contains("text_completion"));

    // 300 connections that never finish their request head (ten times the cap).
    let mut half_open = Vec::new();
    for _ in 0..300 {
        let mut s = TcpStream::connect_timeout(&addr, T).unwrap();
        s.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
            .unwrap();
        half_open.push(s);
    }
    for _ in 0..5 {
        let start = Instant::now();
        let (status, _, text) = request(addr, "GET", "/health", None, T).unwrap();
        assert_eq!((status, text.trim()), (200, "ok"));
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
    }
    // The stream goes on to its end.
    let mut rest = 0;
    loop {
        let data = stream.next_event().unwrap().unwrap();
        if data == "[DONE]" {
            break;
        }
        rest += 1;
    }
    assert!(rest > 0);
    // At most the cap is held: the others were closed at once, and the header timeout closes
    // the rest.
    let early = half_open
        .iter()
        .filter(|s| closed(s, Duration::from_millis(20)))
        .count();
    assert!(early >= 300 - 32, "{early} closed early");
    std::thread::sleep(Duration::from_millis(1600));
    let late = half_open
        .iter()
        .filter(|s| closed(s, Duration::from_millis(200)))
        .count();
    assert_eq!(late, 300);
    let (status, _, _) = request(addr, "GET", "/health", None, T).unwrap();
    assert_eq!(status, 200);
}

#[test]
fn a_short_prompt_behind_a_long_one_starts_at_once() {
    let Some(dir) = model_dir() else { return };
    let mut g = TextGenerator::load(&dir).unwrap();
    g.model.prepare_inference();
    let config = EngineConfig {
        block_rows: 4,
        pool_blocks: 1024,
        max_batch: 8,
        prefill_budget: PrefillBudget::Fixed(8),
        prefix_cache: true,
        max_overtakes: 16,
    };
    let metrics = Arc::new(Metrics::default());
    let mut engine = Scheduler::new(&g.model, config, metrics.clone());
    let long: Vec<u32> = (0..96).map(|i| 10 + (i * 7) % 200).collect();
    let short: Vec<u32> = vec![11, 12, 13];
    let mut receivers = Vec::new();
    for prompt in [long, short] {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let now = Instant::now();
        metrics
            .queued
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        engine.submit(GenRequest {
            prompt,
            max_tokens: 4,
            sampling: SamplingOptions {
                temperature: 0.0,
                top_k: 0,
                top_p: 1.0,
            },
            seed: 1,
            stop_ids: vec![],
            arrived: now,
            deadline: now + Duration::from_secs(600),
            events: tx,
            options: Default::default(),
            constraint: None,
        });
        receivers.push(rx);
    }
    // The step at which each request got its first token.
    let mut first: [Option<usize>; 2] = [None, None];
    let mut step = 0;
    while engine.step() {
        step += 1;
        for (i, rx) in receivers.iter_mut().enumerate() {
            while let Ok(event) = rx.try_recv() {
                if matches!(event, Event::Token(_)) && first[i].is_none() {
                    first[i] = Some(step);
                }
            }
        }
    }
    // Budget 8 a step: the short prompt's 3 tokens go first, the long one's 96 take 12 or 13
    // steps beside the short one's decoding.
    assert_eq!(first[1], Some(1), "{first:?}");
    let long_first = first[0].unwrap();
    assert!((12..=14).contains(&long_first), "{first:?}");
}
