//! The sampling and scoring options of the OpenAI endpoints against a real server on loopback
//! with the tiny Hugging Face Llama of ../shared, each checked against numbers computed apart
//! from the server: log-probabilities against transformers' logits (`logits.safetensors`) and
//! our model's full forward in float64 log-softmax; `logit_bias`, the penalties and `min_p`
//! against the greedy / filtered choice written out here; `n` and several prompts against
//! single requests; `stream_options.include_usage` framing; embeddings' `dimensions`,
//! `base64` and token-id input on all-MiniLM-L6-v2; bad values a 400 naming the field while
//! the server keeps serving.

use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use transformer::pipeline::chat::{render_chat, ChatMessage, CHATML};
use transformer::pipeline::embed::SentenceEncoder;
use transformer::pipeline::generate::TextGenerator;
use transformer::serve::client::{request, Connection};
use transformer::serve::{ServeConfig, Server};
use transformer::store::read_tensors;

const T: Duration = Duration::from_secs(60);

pub fn shared(path: &str) -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared")
        .join(path);
    if dir.exists() {
        Some(dir)
    } else {
        eprintln!("skipped: {} is absent", dir.display());
        None
    }
}

pub fn start(dir: &Path) -> Server {
    let server = Server::start(ServeConfig::new(
        dir.to_path_buf(),
        "127.0.0.1:0".parse().unwrap(),
    ))
    .unwrap();
    server.wait_ready().unwrap();
    server
}

pub fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    let (status, _, text) = request(addr, "POST", path, Some(&body.to_string()), T).unwrap();
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (status, value)
}

pub fn ok(addr: SocketAddr, path: &str, body: &Value) -> Value {
    let (status, answer) = post(addr, path, body);
    assert_eq!(status, 200, "{body} -> {answer}");
    answer
}

/// Every event of a streamed answer up to `[DONE]`.
pub fn events(addr: SocketAddr, path: &str, body: &Value) -> Vec<Value> {
    let mut c = Connection::open(addr, "POST", path, Some(&body.to_string()), T).unwrap();
    assert_eq!(c.status, 200);
    let mut out = Vec::new();
    while let Some(data) = c.next_event().unwrap() {
        if data == "[DONE]" {
            return out;
        }
        out.push(serde_json::from_str(&data).unwrap());
    }
    panic!("no [DONE]");
}

/// Log-softmax of `row` in float64.
fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row
        .iter()
        .map(|&x| x as f64)
        .fold(f64::NEG_INFINITY, f64::max);
    let lse = max
        + row
            .iter()
            .map(|&x| (x as f64 - max).exp())
            .sum::<f64>()
            .ln();
    row.iter().map(|&x| x as f64 - lse).collect()
}

/// Our model's logits `[len, vocab]` of `ids`, by its full (non-incremental) forward.
fn logits(g: &TextGenerator, ids: &[u32]) -> Vec<Vec<f32>> {
    let v = g.model.config.vocab_size;
    let (all, _) = g.model.forward(ids, 1, None);
    all.chunks(v).map(<[f32]>::to_vec).collect()
}

fn argmax(row: &[f64]) -> (usize, f64) {
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).unwrap());
    (order[0], row[order[0]] - row[order[1]])
}

struct Tiny {
    dir: PathBuf,
    g: TextGenerator,
    /// Prompt 0's ids and transformers' logits `[len, vocab]`.
    ids: Vec<u32>,
    hf_logits: Vec<Vec<f32>>,
}

fn tiny() -> Option<Tiny> {
    let dir = shared("reference/hf-decoders/llama-tiny")?;
    let g = TextGenerator::load(&dir).unwrap();
    let reference: Value =
        serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    let ids: Vec<u32> =
        serde_json::from_value(reference["prompts"][0]["input_ids"].clone()).unwrap();
    let tensors = read_tensors(&dir.join("logits.safetensors")).unwrap();
    let v = g.model.config.vocab_size;
    let hf_logits = tensors["logits.0"]
        .1
        .chunks(v)
        .map(<[f32]>::to_vec)
        .collect();
    Some(Tiny {
        dir,
        g,
        ids,
        hf_logits,
    })
}

#[test]
fn logprobs_are_the_model_s_log_softmax() {
    let Some(t) = tiny() else { return };
    let server = start(&t.dir);
    let addr = server.addr;
    let n = t.ids.len();
    // Completions: echo + logprobs over a token-id prompt.
    let body = ok(
        addr,
        "/v1/completions",
        &json!({"prompt": t.ids, "max_tokens": 6, "temperature": 0, "echo": true, "logprobs": 5}),
    );
    let lp = &body["choices"][0]["logprobs"];
    let token_logprobs = lp["token_logprobs"].as_array().unwrap();
    assert_eq!(token_logprobs.len(), n + 6, "{lp}");
    assert!(token_logprobs[0].is_null() && lp["top_logprobs"][0].is_null());
    // The prompt's tokens against transformers' logits (the model matches them to 1e-4).
    let mut worst = 0f64;
    for k in 1..n {
        let want = log_softmax(&t.hf_logits[k - 1]);
        let got = token_logprobs[k].as_f64().unwrap();
        worst = worst.max((got - want[t.ids[k] as usize]).abs());
        let mut best: Vec<f64> = want.clone();
        best.sort_by(|a, b| b.partial_cmp(a).unwrap());
        // Keyed by token text: tokens that decode alike share an entry, so each listed value
        // is one of the 5 best, and the best is listed.
        let top: Vec<f64> = lp["top_logprobs"][k]
            .as_object()
            .unwrap()
            .values()
            .map(|x| x.as_f64().unwrap())
            .collect();
        for g in &top {
            let nearest = best[..5]
                .iter()
                .map(|w| (g - w).abs())
                .fold(f64::INFINITY, f64::min);
            worst = worst.max(nearest);
        }
        let top_max = top.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        worst = worst.max((top_max - best[0]).abs());
    }
    // The generated tokens against our full forward over prompt + output, in float64.
    let text = body["choices"][0]["text"].as_str().unwrap();
    let prompt_text = t.g.tokenizer.decode(&t.ids).unwrap();
    assert!(text.starts_with(&prompt_text), "echo: {text:?}");
    let generated = greedy_ids(&t.g, &t.ids, 6);
    let all: Vec<u32> = t.ids.iter().chain(&generated).copied().collect();
    let rows = logits(&t.g, &all);
    for (k, &id) in generated.iter().enumerate() {
        let want = log_softmax(&rows[n - 1 + k])[id as usize];
        let got = token_logprobs[n + k].as_f64().unwrap();
        worst = worst.max((got - want).abs());
    }
    assert!(worst < 2e-4, "largest logprob error {worst}");
    eprintln!("largest logprob error against transformers / our forward: {worst:.2e}");
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]) && offsets[0] == 0);

    // Chat (ChatML: the tiny model has no template): content[] with bytes and top_logprobs.
    let messages = [ChatMessage::new("user", "Speak, Romeo.")];
    let prompt =
        t.g.tokenizer
            .encode(&render_chat(CHATML, &messages, true, "", "").unwrap())
            .unwrap();
    let body = ok(
        addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Speak, Romeo."}], "max_tokens": 5,
                "temperature": 0, "logprobs": true, "top_logprobs": 3}),
    );
    let content = body["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    let generated = greedy_ids(&t.g, &prompt, content.len());
    let all: Vec<u32> = prompt.iter().chain(&generated).copied().collect();
    let rows = logits(&t.g, &all);
    let mut text = String::new();
    for (k, entry) in content.iter().enumerate() {
        let want = log_softmax(&rows[prompt.len() - 1 + k]);
        let got = entry["logprob"].as_f64().unwrap();
        assert!((got - want[generated[k] as usize]).abs() < 2e-4, "{entry}");
        let token = entry["token"].as_str().unwrap();
        let bytes: Vec<u8> = serde_json::from_value(entry["bytes"].clone()).unwrap();
        assert_eq!(bytes, token.as_bytes());
        assert_eq!(token, t.g.tokenizer.decode(&[generated[k]]).unwrap());
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        let (best, _) = argmax(&want);
        assert!((top[0]["logprob"].as_f64().unwrap() - want[best]).abs() < 2e-4);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["token"], entry["token"]);
        text.push_str(token);
    }
    assert_eq!(
        body["choices"][0]["message"]["content"].as_str().unwrap(),
        text
    );
    server.shutdown().unwrap();
}

/// The greedy continuation of `prompt` by our full forward (float64 argmax).
fn greedy_ids(g: &TextGenerator, prompt: &[u32], count: usize) -> Vec<u32> {
    let mut ids = prompt.to_vec();
    for _ in 0..count {
        let rows = logits(g, &ids);
        let (best, _) = argmax(&log_softmax(rows.last().unwrap()));
        ids.push(best as u32);
    }
    ids[prompt.len()..].to_vec()
}

/// The greedy continuation after `adjust(logits, generated so far, prompt)` at each step,
/// stopping before a step whose top two are closer than 1e-3 (float32 may pick either).
fn adjusted_greedy(
    g: &TextGenerator,
    prompt: &[u32],
    count: usize,
    adjust: impl Fn(&mut [f64], &[u32], &[u32]),
) -> Vec<u32> {
    let mut ids = prompt.to_vec();
    for _ in 0..count {
        let rows = logits(g, &ids);
        let mut z: Vec<f64> = rows.last().unwrap().iter().map(|&x| x as f64).collect();
        adjust(&mut z, &ids[prompt.len()..], prompt);
        let (best, margin) = argmax(&z);
        if margin < 1e-3 {
            break;
        }
        ids.push(best as u32);
    }
    ids[prompt.len()..].to_vec()
}

#[test]
fn bias_penalties_and_min_p_change_the_choice_as_their_formulas_say() {
    let Some(t) = tiny() else { return };
    let server = start(&t.dir);
    let addr = server.addr;
    let complete = |extra: Value, max_tokens: usize| -> String {
        let mut body = json!({"prompt": t.ids, "max_tokens": max_tokens, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        ok(addr, "/v1/completions", &body)["choices"][0]["text"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let text_of = |ids: &[u32]| t.g.tokenizer.decode(ids).unwrap();
    // logit_bias -100 bans the greedy token: the next best comes instead.
    let greedy = greedy_ids(&t.g, &t.ids, 1)[0];
    let banned = adjusted_greedy(&t.g, &t.ids, 1, |z, _, _| z[greedy as usize] -= 100.0);
    assert_ne!(banned[0], greedy);
    assert_eq!(complete(json!({}), 1), text_of(&[greedy]));
    assert_eq!(
        complete(json!({"logit_bias": {greedy.to_string(): -100}}), 1),
        text_of(&banned)
    );
    // +100 forces a token.
    assert_eq!(
        complete(json!({"logit_bias": {"77": 100}}), 3),
        text_of(&[77, 77, 77])
    );
    // Frequency and presence penalties (OpenAI): z_j − c_j·α_f − [c_j > 0]·α_p over the output.
    let (freq, presence) = (1.5, 0.8);
    let want = adjusted_greedy(&t.g, &t.ids, 16, |z, out, _| {
        for (j, zj) in z.iter_mut().enumerate() {
            let c = out.iter().filter(|&&x| x as usize == j).count() as f64;
            *zj -= c * freq + if c > 0.0 { presence } else { 0.0 };
        }
    });
    let got = complete(
        json!({"frequency_penalty": freq, "presence_penalty": presence}),
        want.len(),
    );
    assert_eq!(got, text_of(&want));
    assert_ne!(
        want,
        greedy_ids(&t.g, &t.ids, want.len()),
        "the penalty changes nothing here"
    );
    // Repetition penalty (HF / llama.cpp): over prompt and output, z/θ if z > 0 else z·θ.
    let theta = 1.8;
    let want = adjusted_greedy(&t.g, &t.ids, 16, |z, out, prompt| {
        for (j, zj) in z.iter_mut().enumerate() {
            if out.contains(&(j as u32)) || prompt.contains(&(j as u32)) {
                *zj = if *zj > 0.0 { *zj / theta } else { *zj * theta };
            }
        }
    });
    let got = complete(json!({"repetition_penalty": theta}), want.len());
    assert_eq!(got, text_of(&want));
    // min_p: every sampled token has p >= min_p · p_max under the model's own distribution
    // (the reported log-probabilities are the model's, before any filter).
    let body = ok(
        addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "n": 6,
                "temperature": 1.5, "seed": 3, "min_p": 0.4, "logprobs": true, "top_logprobs": 1}),
    );
    let mut checked = 0;
    for choice in body["choices"].as_array().unwrap() {
        for entry in choice["logprobs"]["content"].as_array().unwrap() {
            let top = entry["top_logprobs"][0]["logprob"].as_f64().unwrap();
            let got = entry["logprob"].as_f64().unwrap();
            assert!(got >= top + 0.4f64.ln() - 1e-5, "{entry}");
            checked += 1;
        }
    }
    assert!(checked >= 6, "{body}");
    server.shutdown().unwrap();
}

#[test]
fn choices_prompts_and_usage_framing() {
    let Some(t) = tiny() else { return };
    // Log-probabilities are compared between requests of the same prompt bit for bit: without
    // the prefix cache, whose shorter prompt chunks round the last bit differently.
    let mut config = ServeConfig::new(t.dir.clone(), "127.0.0.1:0".parse().unwrap());
    config.prefix_cache = false;
    let server = Server::start(config).unwrap();
    server.wait_ready().unwrap();
    let addr = server.addr;
    let other: Vec<u32> = t.ids[..5].to_vec();
    // Two prompts × n = 3 sampled choices: choice i equals a single request with seed + i.
    let body = ok(
        addr,
        "/v1/completions",
        &json!({"prompt": [t.ids, other], "n": 3, "max_tokens": 6, "temperature": 1, "seed": 40}),
    );
    let choices = body["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 6);
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], i);
        let prompt = if i < 3 { &t.ids } else { &other };
        let single = ok(
            addr,
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 6, "temperature": 1, "seed": 40 + i}),
        );
        assert_eq!(choice["text"], single["choices"][0]["text"], "choice {i}");
    }
    assert_eq!(body["usage"]["prompt_tokens"], t.ids.len() + 5);
    assert_eq!(body["usage"]["completion_tokens"], 36);
    // Strings as prompts too; a list of strings is one prompt each.
    let body = ok(
        addr,
        "/v1/completions",
        &json!({"prompt": ["ROMEO.", "JULIET."], "max_tokens": 2, "temperature": 0}),
    );
    assert_eq!(body["choices"].as_array().unwrap().len(), 2);
    // Greedy with no option: exactly as a single plain request, streamed or not.
    let plain = json!({"prompt": t.ids, "max_tokens": 8, "temperature": 0});
    let whole = ok(addr, "/v1/completions", &plain);
    // include_usage: every chunk has usage null, then a last chunk with choices [] and usage.
    let mut streamed = plain.clone();
    streamed["stream"] = true.into();
    streamed["stream_options"] = json!({"include_usage": true});
    let chunks = events(addr, "/v1/completions", &streamed);
    let (last, rest) = chunks.split_last().unwrap();
    assert_eq!(last["choices"], json!([]));
    // The same counts; the prompt tokens found in the prefix cache depend on what ran before.
    let counts = |u: &Value| {
        let cached = u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert!(cached <= u["prompt_tokens"].as_u64().unwrap(), "{u}");
        [
            u["prompt_tokens"].clone(),
            u["completion_tokens"].clone(),
            u["total_tokens"].clone(),
        ]
    };
    assert_eq!(counts(&last["usage"]), counts(&whole["usage"]));
    assert!(rest
        .iter()
        .all(|c| c["usage"].is_null() && c.get("usage").is_some()));
    let text: String = rest
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap());
    // Without it: usage on the finish chunk, as before.
    streamed.as_object_mut().unwrap().remove("stream_options");
    let chunks = events(addr, "/v1/completions", &streamed);
    assert_eq!(
        counts(&chunks.last().unwrap()["usage"]),
        counts(&whole["usage"])
    );
    // A streamed chat with n = 2 and logprobs: each choice reassembles to the whole answer.
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "n": 2,
                      "temperature": 0.8, "seed": 9, "logprobs": true});
    let whole = ok(addr, "/v1/chat/completions", &chat);
    let mut streamed = chat.clone();
    streamed["stream"] = true.into();
    let chunks = events(addr, "/v1/chat/completions", &streamed);
    for i in 0..2 {
        let mine: Vec<&Value> = chunks
            .iter()
            .flat_map(|c| c["choices"].as_array().unwrap())
            .filter(|c| c["index"] == i)
            .collect();
        assert_eq!(mine[0]["delta"]["role"], "assistant");
        let text: String = mine
            .iter()
            .filter_map(|c| c["delta"]["content"].as_str())
            .collect();
        let want = &whole["choices"][i]["message"]["content"];
        assert_eq!(text, want.as_str().unwrap(), "choice {i}");
        let scores: Vec<&Value> = mine
            .iter()
            .filter(|c| !c["logprobs"].is_null())
            .flat_map(|c| c["logprobs"]["content"].as_array().unwrap())
            .collect();
        let want: Vec<&Value> = whole["choices"][i]["logprobs"]["content"]
            .as_array()
            .unwrap()
            .iter()
            .collect();
        // To float32 rounding: see `json_close`.
        crate::json_close::assert_json_close(&json!(scores), &json!(want), 1e-4);
        assert_eq!(
            mine.last().unwrap()["finish_reason"],
            whole["choices"][i]["finish_reason"]
        );
    }
    server.shutdown().unwrap();
}

#[test]
fn bad_values_are_400_naming_the_field() {
    let Some(t) = tiny() else { return };
    let server = start(&t.dir);
    let addr = server.addr;
    let chat = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let cases = [
        (
            "/v1/chat/completions",
            chat(json!({"logprobs": "yes"})),
            "logprobs",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"top_logprobs": 3})),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logprobs": true, "top_logprobs": 21})),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logit_bias": {"999999": 5}})),
            "logit_bias",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logit_bias": {"12": 500}})),
            "logit_bias",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logit_bias": {"x": 1}})),
            "logit_bias",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logit_bias": [1]})),
            "logit_bias",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"presence_penalty": 3})),
            "presence_penalty",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"frequency_penalty": "high"})),
            "frequency_penalty",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"repetition_penalty": 0})),
            "repetition_penalty",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"repetition_penalty": 1e300})),
            "repetition_penalty",
        ),
        ("/v1/chat/completions", chat(json!({"min_p": 1.5})), "min_p"),
        ("/v1/chat/completions", chat(json!({"n": 0})), "n"),
        ("/v1/chat/completions", chat(json!({"n": 1000000})), "n"),
        (
            "/v1/chat/completions",
            chat(json!({"stream_options": {"include_usage": true}})),
            "stream_options",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"stream": true, "stream_options": {"include_usage": 3}})),
            "stream_options",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"response_format": {"type": "xml"}})),
            "response_format",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"functions": [{"name": "f"}]})),
            "functions",
        ),
        ("/v1/chat/completions", chat(json!({"echo": true})), "echo"),
        (
            "/v1/completions",
            json!({"prompt": "x", "logprobs": true}),
            "logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "logprobs": 50}),
            "logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "suffix": "y"}),
            "suffix",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "best_of": 3}),
            "best_of",
        ),
        ("/v1/completions", json!({"prompt": [1, -2]}), "prompt"),
        ("/v1/completions", json!({"prompt": [[1, 2], 7]}), "prompt"),
        ("/v1/completions", json!({"prompt": [5000000]}), "prompt"),
        (
            "/v1/completions",
            json!({"prompt": vec!["a"; 17]}),
            "prompt",
        ),
        (
            "/v1/completions",
            json!({"prompt": vec!["a"; 8], "n": 9}),
            "n",
        ),
    ];
    for (path, body, param) in cases {
        let (status, answer) = post(addr, path, &body);
        assert_eq!(status, 400, "{body} -> {answer}");
        assert_eq!(answer["error"]["param"], param, "{body} -> {answer}");
    }
    // Still serving.
    ok(
        addr,
        "/v1/chat/completions",
        &chat(json!({"logprobs": true, "top_logprobs": 2, "n": 2})),
    );
    server.shutdown().unwrap();
}

/// Decodes standard base64.
fn unbase64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let mut out = Vec::new();
    for chunk in text.as_bytes().chunks(4) {
        let digits: Vec<u8> = chunk
            .iter()
            .filter(|&&c| c != b'=')
            .map(|&c| value(c))
            .collect();
        let n = digits.iter().fold(0u32, |n, &d| n << 6 | d as u32) << (6 * (4 - digits.len()));
        out.extend_from_slice(&n.to_be_bytes()[1..digits.len()]);
    }
    out
}

#[test]
fn embeddings_dimensions_base64_and_token_ids() {
    let Some(dir) = shared("models/all-MiniLM-L6-v2") else {
        return;
    };
    let server = start(&dir);
    let addr = server.addr;
    let encoder = SentenceEncoder::load(&dir, None).unwrap();
    let texts = ["A man is eating food.", "The weather is lovely today."];
    let owned: Vec<String> = texts.iter().map(|s| s.to_string()).collect();
    let full = encoder.embed(&owned, 8).unwrap();
    let embedding = |body: &Value, i: usize| -> Vec<f32> {
        serde_json::from_value(body["data"][i]["embedding"].clone()).unwrap()
    };
    // dimensions: the first k, divided by their norm (float64 here).
    let body = ok(
        addr,
        "/v1/embeddings",
        &json!({"input": texts, "dimensions": 64}),
    );
    for (i, e) in full.iter().enumerate() {
        let got = embedding(&body, i);
        assert_eq!(got.len(), 64);
        let norm = e[..64]
            .iter()
            .map(|&x| x as f64 * x as f64)
            .sum::<f64>()
            .sqrt();
        for (g, &x) in got.iter().zip(&e[..64]) {
            assert!((*g as f64 - x as f64 / norm).abs() < 1e-6);
        }
        let length: f64 = got.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
        assert!((length - 1.0).abs() < 1e-5);
    }
    // base64: little-endian float32, the same numbers.
    let body = ok(
        addr,
        "/v1/embeddings",
        &json!({"input": texts, "encoding_format": "base64"}),
    );
    for (i, e) in full.iter().enumerate() {
        let bytes = unbase64(body["data"][i]["embedding"].as_str().unwrap());
        let got: Vec<f32> = bytes
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(&got, e);
    }
    // Token ids (the model's own, as given): the text's ids embed to the text's embedding.
    let ids: Vec<Vec<u32>> = owned
        .iter()
        .map(|s| encoder.tokenizer.encode(s).unwrap())
        .collect();
    let body = ok(addr, "/v1/embeddings", &json!({"input": ids}));
    for (i, e) in full.iter().enumerate() {
        assert_eq!(&embedding(&body, i), e);
    }
    let body = ok(addr, "/v1/embeddings", &json!({"input": ids[0]}));
    assert_eq!(&embedding(&body, 0), &full[0]);
    assert_eq!(body["usage"]["prompt_tokens"], ids[0].len());
    for (body, param) in [
        (json!({"input": "x", "dimensions": 0}), "dimensions"),
        (json!({"input": "x", "dimensions": 100000}), "dimensions"),
        (
            json!({"input": "x", "encoding_format": "hex"}),
            "encoding_format",
        ),
        (json!({"input": [1, "x"]}), "input"),
        (json!({"input": [[1, 2], [-1]]}), "input"),
    ] {
        let (status, answer) = post(addr, "/v1/embeddings", &body);
        assert_eq!(
            (status, &answer["error"]["param"]),
            (400, &json!(param)),
            "{body} -> {answer}"
        );
    }
    // Ids outside the vocabulary or too many: 400 from the encoder, the server keeps serving.
    let (status, _) = post(addr, "/v1/embeddings", &json!({"input": [[1, 99999999]]}));
    assert_eq!(status, 400);
    let (status, _) = post(
        addr,
        "/v1/embeddings",
        &json!({"input": [vec![101u32; 5000]]}),
    );
    assert_eq!(status, 400);
    ok(addr, "/v1/embeddings", &json!({"input": "still here"}));
    server.shutdown().unwrap();
}

/// SmolLM2 (the Q4_1 GGUF of ../shared) served in float32: the prompt's log-probabilities
/// (`echo`) against transformers' logits of every position, the chat reply's first token and
/// its top 5 against transformers' last logits, and `logit_bias` banning " The" (the greedy
/// first token, margin 0.08) so that the second best comes.
#[test]
fn smollm2_logprobs_match_transformers() {
    let Some(file) = shared("models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let Some(refs) = shared("reference/smollm2") else {
        return;
    };
    let reference: Value =
        serde_json::from_slice(&std::fs::read(refs.join("reference.json")).unwrap()).unwrap();
    let p0 = &reference["prompts"][0];
    let ids: Vec<u32> = serde_json::from_value(p0["input_ids"].clone()).unwrap();
    let top5: Vec<u32> = serde_json::from_value(p0["top5_ids"].clone()).unwrap();
    let tensors = read_tensors(&refs.join("logits.safetensors")).unwrap();
    let v = 49152;
    let all: Vec<&[f32]> = tensors["all_logits.0"].1.chunks(v).collect();
    assert_eq!(all.len(), ids.len());
    let server = start(&file);
    let addr = server.addr;
    let body = ok(
        addr,
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 1, "temperature": 0, "echo": true, "logprobs": 5}),
    );
    let token_logprobs = body["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(token_logprobs.len(), ids.len() + 1);
    let mut worst = 0f64;
    for k in 1..ids.len() {
        let want = log_softmax(all[k - 1])[ids[k] as usize];
        worst = worst.max((token_logprobs[k].as_f64().unwrap() - want).abs());
    }
    let last = log_softmax(all[ids.len() - 1]);
    worst = worst.max((token_logprobs[ids.len()].as_f64().unwrap() - last[top5[0] as usize]).abs());
    assert!(
        worst < 2e-3,
        "largest logprob error against transformers {worst}"
    );
    eprintln!("SmolLM2 logprobs: largest error against transformers {worst:.2e}");
    // Chat: the template renders the reference's prompt; the top 5 are transformers' top 5.
    let chat = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "What is the capital of France?"}],
                              "max_tokens": 1, "temperature": 0, "logprobs": true, "top_logprobs": 5});
        for (k, x) in extra.as_object().unwrap() {
            body[k] = x.clone();
        }
        ok(addr, "/v1/chat/completions", &body)
    };
    let body = chat(json!({}));
    assert_eq!(body["usage"]["prompt_tokens"], ids.len());
    let first = &body["choices"][0]["logprobs"]["content"][0];
    for (entry, &id) in first["top_logprobs"].as_array().unwrap().iter().zip(&top5) {
        assert!(
            (entry["logprob"].as_f64().unwrap() - last[id as usize]).abs() < 2e-3,
            "{entry}"
        );
    }
    let text_of = |id: u32| {
        let g = TextGenerator::load(&file).unwrap();
        g.tokenizer.decode(&[id]).unwrap()
    };
    assert_eq!(first["token"], text_of(top5[0]));
    let banned = chat(json!({"logit_bias": {top5[0].to_string(): -100}}));
    assert_eq!(
        banned["choices"][0]["logprobs"]["content"][0]["token"],
        text_of(top5[1])
    );
    server.shutdown().unwrap();
}
