//! `transformer serve` over loopback HTTP with the tiny Hugging Face Llama of ../shared: every
//! endpoint's format, server-sent-event framing, token limits as JSON errors, 429 with
//! Retry-After under overload, blocks freed when a client disconnects (seen in /metrics),
//! graceful shutdown finishing a running request.

use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use transformer::pipeline::generate::TextGenerator;
use transformer::serve::client::{request, Connection};
use transformer::serve::{ServeConfig, Server};

const T: Duration = Duration::from_secs(60);

fn model_dir() -> Option<PathBuf> {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/hf-decoders/llama-tiny");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!("skipped: {} is absent", dir.display());
        None
    }
}

fn start(config: impl FnOnce(ServeConfig) -> ServeConfig) -> Option<Server> {
    let dir = model_dir()?;
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = Server::start(config(ServeConfig::new(dir, addr))).unwrap();
    server.wait_ready().unwrap();
    Some(server)
}

fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, Vec<(String, String)>, Value) {
    let (status, headers, text) = request(addr, "POST", path, Some(&body.to_string()), T).unwrap();
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (status, headers, value)
}

/// The value of metric line `name` (with labels, exactly as printed).
fn metric(addr: SocketAddr, name: &str) -> f64 {
    let (status, _, text) = request(addr, "GET", "/metrics", None, T).unwrap();
    assert_eq!(status, 200);
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("{name} missing in\n{text}"))
        .parse()
        .unwrap()
}

/// Reads every event of a streamed answer up to `[DONE]` (which must come last).
fn events(c: &mut Connection) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let data = c
            .next_event()
            .unwrap()
            .expect("the stream ends with [DONE]");
        if data == "[DONE]" {
            assert_eq!(c.next_event().unwrap(), None, "nothing after [DONE]");
            return out;
        }
        out.push(serde_json::from_str(&data).unwrap_or_else(|e| panic!("{e}: {data}")));
    }
}

#[test]
fn endpoints_formats_and_streaming() {
    let Some(server) = start(|c| c) else { return };
    let addr = server.addr;
    let (status, _, text) = request(addr, "GET", "/health", None, T).unwrap();
    assert_eq!((status, text.trim()), (200, "ok"));
    let (status, _, text) = request(addr, "GET", "/v1/models", None, T).unwrap();
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "llama-tiny");
    assert_eq!(models["data"][0]["object"], "model");
    let (status, headers, page) = request(addr, "GET", "/", None, T).unwrap();
    assert_eq!(status, 200);
    assert!(headers
        .iter()
        .any(|(k, v)| k == "content-type" && v.starts_with("text/html")));
    assert!(page.contains("/v1/chat/completions"));

    // A greedy completion: the reference's continuation of its first prompt, as text.
    let dir = model_dir().unwrap();
    let g = TextGenerator::load(&dir).unwrap();
    let reference: Value =
        serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    let p0 = &reference["prompts"][0];
    let greedy: Vec<u32> = serde_json::from_value(p0["greedy_ids"].clone()).unwrap();
    let n_prompt = p0["input_ids"].as_array().unwrap().len();
    let req =
        json!({"model": "llama-tiny", "prompt": p0["text"], "max_tokens": 16, "temperature": 0});
    let (status, _, body) = post(addr, "/v1/completions", &req);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "text_completion");
    assert!(body["id"].as_str().unwrap().starts_with("cmpl-"));
    assert!(body["created"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(body["model"], "llama-tiny");
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["text"], g.tokenizer.decode(&greedy).unwrap());
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": n_prompt, "completion_tokens": 16, "total_tokens": n_prompt + 16,
               "prompt_tokens_details": {"cached_tokens": 0}})
    );
    let fingerprint = body["system_fingerprint"].as_str().unwrap().to_string();
    assert!(fingerprint.starts_with("fp_"), "{fingerprint}");
    let timings = &body["timings"];
    assert_eq!(
        (
            &timings["prompt_n"],
            &timings["cache_n"],
            &timings["predicted_n"]
        ),
        (&json!(n_prompt), &json!(0), &json!(16))
    );
    assert!(timings["prompt_ms"].as_f64().unwrap() > 0.0, "{timings}");
    // Again: the prompt's full blocks of 16 positions come from the prefix cache (at least
    // its last token is computed), the answer is the same.
    let (_, _, again) = post(addr, "/v1/completions", &req);
    assert_eq!(again["choices"], body["choices"]);
    let cached = (n_prompt - 1) / 16 * 16;
    assert_eq!(
        again["usage"]["prompt_tokens_details"]["cached_tokens"],
        cached
    );
    assert_eq!(again["timings"]["cache_n"], cached);
    assert_eq!(again["timings"]["prompt_n"], n_prompt - cached);
    assert_eq!(again["system_fingerprint"], fingerprint);
    assert_eq!(
        metric(addr, "transformer_prefix_cache_hit_tokens_total"),
        cached as f64
    );

    // The same streamed: text_completion chunks whose texts concatenate to the same text, the
    // last with the finish reason and usage, then [DONE].
    let mut stream_req = req.clone();
    stream_req["stream"] = json!(true);
    let mut c = Connection::open(
        addr,
        "POST",
        "/v1/completions",
        Some(&stream_req.to_string()),
        T,
    )
    .unwrap();
    assert_eq!(c.status, 200);
    assert!(c
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let chunks = events(&mut c);
    assert!(chunks.len() >= 3, "{chunks:?}");
    let mut text = String::new();
    for (i, chunk) in chunks.iter().enumerate() {
        assert_eq!(chunk["object"], "text_completion");
        assert_eq!(chunk["id"], chunks[0]["id"]);
        let last = i + 1 == chunks.len();
        assert_eq!(
            chunk["choices"][0]["finish_reason"].is_null(),
            !last,
            "{chunk}"
        );
        text.push_str(chunk["choices"][0]["text"].as_str().unwrap());
    }
    assert_eq!(text, choice["text"].as_str().unwrap());
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 16);

    // A stop string: the text ends before it, finish_reason stop, streamed or not.
    let full = choice["text"].as_str().unwrap();
    let cut = full.char_indices().nth(full.chars().count() / 2).unwrap().0;
    let stop: String = full[cut..].chars().take(3).collect();
    let before = &full[..full.find(&stop).unwrap()];
    let mut stop_req = req.clone();
    stop_req["stop"] = json!([stop, "never appears"]);
    let (status, _, body) = post(addr, "/v1/completions", &stop_req);
    assert_eq!(status, 200);
    assert_eq!(body["choices"][0]["text"], before);
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    stop_req["stream"] = json!(true);
    let mut c = Connection::open(
        addr,
        "POST",
        "/v1/completions",
        Some(&stop_req.to_string()),
        T,
    )
    .unwrap();
    let chunks = events(&mut c);
    let text: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, before);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );

    // Chat: the whole answer and the streamed chunks (role first, then content deltas).
    let chat = json!({"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 8, "temperature": 0});
    let (status, _, body) = post(addr, "/v1/chat/completions", &chat);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    let reply = body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(body["usage"]["completion_tokens"], 8);
    let mut chat_stream = chat.clone();
    chat_stream["stream"] = json!(true);
    let mut c = Connection::open(
        addr,
        "POST",
        "/v1/chat/completions",
        Some(&chat_stream.to_string()),
        T,
    )
    .unwrap();
    let chunks = events(&mut c);
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks[1..]
        .iter()
        .all(|c| c["choices"][0]["delta"].get("role").is_none()));
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, reply);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );

    // Seeded sampling repeats.
    let sampled = json!({"prompt": "To be", "max_tokens": 12, "temperature": 1.0, "top_p": 0.9, "top_k": 40, "seed": 42});
    let a = post(addr, "/v1/completions", &sampled).2;
    let b = post(addr, "/v1/completions", &sampled).2;
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);

    // Errors: JSON bodies naming the problem.
    let cases = [
        (
            json!({"prompt": "x", "max_tokens": 100000}),
            "max_tokens",
            "--max-output-tokens",
        ),
        (
            json!({"prompt": "x ".repeat(400), "max_tokens": 1}),
            "prompt",
            "exceeds the available context size (255 tokens",
        ),
        (
            json!({"prompt": "x", "max_tokens": 256}),
            "max_tokens",
            "context of 256",
        ),
        (
            json!({"prompt": "x", "temperature": -1}),
            "temperature",
            "must be >= 0",
        ),
        (json!({"prompt": "x", "top_p": 0}), "top_p", "(0, 1]"),
        (
            json!({"prompt": "x", "max_tokens": "many"}),
            "max_tokens",
            "max_tokens: invalid type",
        ),
        (json!({"prompt": "x", "n": 17}), "n", "1..=16"),
        (json!({"max_tokens": 3}), "prompt", "prompt is missing"),
    ];
    for (req, param, says) in cases {
        let (status, _, body) = post(addr, "/v1/completions", &req);
        assert_eq!(status, 400, "{req} -> {body}");
        assert_eq!(body["error"]["param"], param, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    }
    let (status, _, text) = request(addr, "POST", "/v1/completions", Some("{not json"), T).unwrap();
    assert_eq!(status, 400);
    assert!(text.contains("not valid JSON"));
    let (status, _, body) = post(
        addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user"}]}),
    );
    assert_eq!(status, 400);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("messages[0]"));
    let (status, _, text) = request(addr, "GET", "/nothing", None, T).unwrap();
    assert_eq!(status, 404);
    assert!(text.contains("no such route"));

    // Metrics: the outcomes so far, and every family.
    assert_eq!(
        metric(addr, "transformer_requests_total{outcome=\"ok\"}"),
        9.0
    );
    assert_eq!(
        metric(addr, "transformer_requests_total{outcome=\"invalid\"}"),
        10.0
    );
    assert_eq!(metric(addr, "transformer_kv_blocks_used"), 0.0);
    assert_eq!(metric(addr, "transformer_running_batch"), 0.0);
    assert_eq!(metric(addr, "transformer_queue_length"), 0.0);
    assert_eq!(metric(addr, "transformer_ttft_seconds_count"), 9.0);
    assert_eq!(metric(addr, "transformer_e2e_latency_seconds_count"), 9.0);
    assert_eq!(metric(addr, "transformer_queue_time_seconds_count"), 9.0);
    assert!(metric(addr, "transformer_time_per_output_token_seconds_count") >= 6.0);
    assert!(metric(addr, "transformer_kv_blocks_free") > 0.0);
    server.shutdown().unwrap();
}

/// With SmolLM2 (about 0.1 s a token on two cores, so a long request is still running when
/// the test looks; the tiny model would finish it first).
#[test]
fn overload_disconnect_and_shutdown() {
    let smol = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !smol.is_file() {
        eprintln!("skipped: {} is absent", smol.display());
        return;
    }
    // One sequence at a time, one waiting: the third concurrent request is refused.
    let config = ServeConfig {
        max_batch: 1,
        max_queue: 1,
        ..ServeConfig::new(smol, "127.0.0.1:0".parse().unwrap())
    };
    let server = Server::start(config).unwrap();
    server.wait_ready().unwrap();
    let addr = server.addr;
    let long = json!({"prompt": "ROMEO.", "max_tokens": 200, "temperature": 0, "stream": true, "stop": "never"});
    let short = json!({"prompt": "ROMEO.", "max_tokens": 4, "temperature": 0, "stream": true});
    let mut running =
        Connection::open(addr, "POST", "/v1/completions", Some(&long.to_string()), T).unwrap();
    assert_eq!(running.status, 200);
    let first = running.next_event().unwrap();
    assert!(first.is_some(), "the first request runs");
    assert_eq!(metric(addr, "transformer_running_batch"), 1.0);
    assert!(metric(addr, "transformer_kv_blocks_used") > 0.0);
    let mut waiting =
        Connection::open(addr, "POST", "/v1/completions", Some(&short.to_string()), T).unwrap();
    assert_eq!(waiting.status, 200);
    // The second is queued (its stream has not started yet).
    let deadline = Instant::now() + T;
    while metric(addr, "transformer_queue_length") < 1.0 {
        assert!(Instant::now() < deadline, "the second request never queued");
        std::thread::sleep(Duration::from_millis(5));
    }
    let (status, headers, body) = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 2}),
    );
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "queue_full");
    assert!(headers.iter().any(|(k, v)| k == "retry-after" && v == "1"));
    assert_eq!(
        metric(addr, "transformer_requests_total{outcome=\"rejected\"}"),
        1.0
    );

    // The running client goes away: its sequence leaves, its blocks are freed, and the queued
    // request is admitted and answered in full.
    drop(running);
    let chunks = events(&mut waiting);
    assert!(chunks.last().unwrap()["choices"][0]["finish_reason"].is_string());
    assert!(
        chunks.last().unwrap()["usage"]["completion_tokens"]
            .as_u64()
            .unwrap()
            <= 4
    );
    let deadline = Instant::now() + T;
    // Each handler counts its outcome when its stream is dropped, a moment after the last chunk.
    while metric(addr, "transformer_requests_total{outcome=\"cancelled\"}") < 1.0
        || metric(addr, "transformer_requests_total{outcome=\"ok\"}") < 1.0
        || metric(addr, "transformer_kv_blocks_used") > 0.0
    {
        assert!(
            Instant::now() < deadline,
            "the disconnected request was not cancelled, or the queued one not counted"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(metric(addr, "transformer_running_batch"), 0.0);
    assert_eq!(
        metric(addr, "transformer_requests_total{outcome=\"ok\"}"),
        1.0
    );

    // A client that disconnects from a non-streamed request frees its blocks too.
    let whole = json!({"prompt": "ROMEO.", "max_tokens": 200, "temperature": 0});
    let c = Connection::open(
        addr,
        "POST",
        "/v1/completions",
        Some(&whole.to_string()),
        Duration::from_millis(1),
    );
    drop(c);
    let deadline = Instant::now() + T;
    while metric(addr, "transformer_requests_total{outcome=\"cancelled\"}") < 2.0 {
        assert!(
            Instant::now() < deadline,
            "the abandoned request was not cancelled"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // The handler counts the cancellation when the client goes; the engine frees the request's
    // queue place and blocks when it next looks at its queue, a moment later.
    while metric(addr, "transformer_kv_blocks_used") > 0.0
        || metric(addr, "transformer_queue_length") > 0.0
    {
        assert!(
            Instant::now() < deadline,
            "blocks or a queue place still held"
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    // Graceful shutdown: a running request finishes; new connections are refused after.
    let mut last = Connection::open(
        addr,
        "POST",
        "/v1/completions",
        Some(
            &json!({"prompt": "ROMEO.", "max_tokens": 12, "temperature": 0, "stream": true})
                .to_string(),
        ),
        T,
    )
    .unwrap();
    let status = last.status;
    if status != 200 {
        panic!("status {status}: {:?}", last.text());
    }
    assert!(last.next_event().unwrap().is_some());
    let stopper = std::thread::spawn(move || server.shutdown());
    let chunks = events(&mut last);
    assert!(chunks.last().unwrap()["choices"][0]["finish_reason"].is_string());
    stopper.join().unwrap().unwrap();
    assert!(request(addr, "GET", "/health", None, Duration::from_secs(2)).is_err());
}
