//! llama.cpp's `/completion` in its own framing and fields, `/slots`, and llama-server's
//! settings (`--ctx-size`, `--n-predict`, `--seed`, `--no-slots`), with the tiny Hugging Face
//! Llama of ../shared against transformers' greedy ids and logits (`serve_surface` has the
//! harness and the other native routes).

use super::serve_surface::{assert_error, get, model_dir, post, reference, start, T};
use serde_json::{json, Value};
use std::net::SocketAddr;
use transformer::pipeline::generate::TextGenerator;
use transformer::serve::client::Connection;
use transformer::serve::native::LlamaOptions;
use transformer::serve::ServeConfig;
use transformer::store::read_tensors;

/// Every event of a `/completion` stream (llama.cpp sends no `[DONE]`: the body ends).
fn native_events(addr: SocketAddr, body: &Value) -> Vec<Value> {
    let mut c = Connection::open(addr, "POST", "/completion", Some(&body.to_string()), T).unwrap();
    assert_eq!(c.status, 200);
    let mut out = Vec::new();
    while let Some(data) = c.next_event().unwrap() {
        assert_ne!(data, "[DONE]");
        out.push(serde_json::from_str(&data).unwrap());
    }
    out
}

fn with(llama: LlamaOptions) -> impl FnOnce(ServeConfig) -> ServeConfig {
    move |c| ServeConfig { llama, ..c }
}

/// llama.cpp's `logit_bias` banning the model's end tokens (so that a generation runs to its
/// limit).
pub fn ends() -> Value {
    let g = TextGenerator::load(&model_dir().unwrap()).unwrap();
    let ends: Vec<Value> = g
        .tokenizer
        .end_tokens()
        .iter()
        .map(|&id| json!([id, false]))
        .collect();
    Value::Array(ends)
}

fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn completion_streams_llama_cpp_chunks_of_the_greedy_tokens() {
    let llama = LlamaOptions {
        n_predict: Some(16),
        seed: Some(42),
        temperature: 0.0,
        ..Default::default()
    };
    let Some(server) = start(with(llama)) else {
        return;
    };
    let (addr, dir) = (server.addr, model_dir().unwrap());
    let g = TextGenerator::load(&dir).unwrap();
    let r = reference(&dir);
    let greedy_text = g.tokenizer.decode(&r.greedy).unwrap();

    // --n-predict and --temp are the defaults of a request that gives neither.
    let events = native_events(addr, &json!({"prompt": r.text, "stream": true}));
    let (last, chunks) = events.split_last().unwrap();
    assert_eq!(chunks.len(), 16, "one chunk per token");
    let mut streamed = Vec::new();
    let mut content = String::new();
    for (k, chunk) in chunks.iter().enumerate() {
        assert_eq!(chunk["stop"], false, "{chunk}");
        assert_eq!(chunk["tokens_predicted"], k + 1);
        assert_eq!(chunk["tokens_evaluated"], r.input_ids.len());
        streamed.extend(ids(&chunk["tokens"]));
        content.push_str(chunk["content"].as_str().unwrap());
    }
    assert_eq!(streamed, r.greedy);
    assert_eq!(content + last["content"].as_str().unwrap(), greedy_text);
    assert_eq!(last["stop"], true);
    assert_eq!(last["stop_type"], "limit");
    assert_eq!(last["tokens"], json!([]));
    assert_eq!(last["tokens_predicted"], 16);
    assert_eq!(last["timings"]["predicted_n"], 16);
    assert_eq!(last["has_new_line"], greedy_text.contains('\n'));
    assert_eq!(last["generation_settings"]["n_predict"], 16);
    assert_eq!(last["generation_settings"]["seed"], 42);

    // The whole answer: the same text; return_tokens; response_fields; several prompts.
    let req = json!({"prompt": r.text, "return_tokens": true});
    let (status, whole) = post(addr, "/completion", &req);
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["content"], greedy_text);
    assert_eq!(ids(&whole["tokens"]), r.greedy);
    assert_eq!(whole["truncated"], false);
    let req = json!({"prompt": r.text, "n_predict": 3,
                     "response_fields": ["content", "generation_settings/n_predict"]});
    let (_, picked) = post(addr, "/completion", &req);
    let want = g.tokenizer.decode(&r.greedy[..3]).unwrap();
    assert_eq!(
        picked,
        json!({"content": want, "generation_settings/n_predict": 3})
    );
    let req = json!({"prompt": [r.input_ids, r.input_ids], "n_predict": 3});
    let (_, both) = post(addr, "/completion", &req);
    let both = both.as_array().unwrap();
    assert_eq!(both.len(), 2);
    assert_eq!(
        (&both[0]["content"], &both[1]["content"]),
        (&json!(want), &json!(want))
    );
    let req = json!({"prompt": {"prompt_string": r.text}, "n_predict": 3});
    assert_eq!(post(addr, "/completion", &req).1["content"], want);
}

#[test]
fn n_probs_are_transformers_log_softmax_and_logit_bias_takes_llama_cpp_shapes() {
    let Some(server) = start(|c| c) else {
        return;
    };
    let (addr, dir) = (server.addr, model_dir().unwrap());
    let g = TextGenerator::load(&dir).unwrap();
    let r = reference(&dir);
    let tensors = read_tensors(&dir.join("logits.safetensors")).unwrap();
    let v = g.model.config.vocab_size;
    let last = &tensors["logits.0"].1[(r.input_ids.len() - 1) * v..r.input_ids.len() * v];
    let max = last.iter().fold(f64::MIN, |m, &x| m.max(x as f64));
    let lse = max
        + last
            .iter()
            .map(|&x| (x as f64 - max).exp())
            .sum::<f64>()
            .ln();
    let mut want: Vec<f64> = last.iter().map(|&x| x as f64 - lse).collect();

    for stream in [false, true] {
        let req = json!({"prompt": r.text, "n_probs": 3, "n_predict": 2, "temperature": 0,
                         "stream": stream});
        let first = match stream {
            false => ok(addr, &req)["completion_probabilities"][0].clone(),
            true => native_events(addr, &req)[0]["completion_probabilities"][0].clone(),
        };
        assert_eq!(first["id"], r.greedy[0], "{first}");
        let logprob = first["logprob"].as_f64().unwrap();
        assert!(
            (logprob - want[r.greedy[0] as usize]).abs() < 1e-3,
            "{first}"
        );
        let top = first["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        let mut sorted = want.clone();
        sorted.sort_by(|a, b| b.partial_cmp(a).unwrap());
        for (t, w) in top.iter().zip(&sorted) {
            assert!(
                (t["logprob"].as_f64().unwrap() - w).abs() < 1e-3,
                "{t} vs {w}"
            );
            let id = t["id"].as_u64().unwrap() as u32;
            assert_eq!(t["token"], g.tokenizer.decode(&[id]).unwrap());
        }
    }
    // post_sampling_probs: probabilities, only where they are the model's.
    let req = json!({"prompt": r.text, "n_probs": 2, "n_predict": 1, "temperature": 1,
                     "post_sampling_probs": true});
    let p = ok(addr, &req)["completion_probabilities"][0].clone();
    let id = p["id"].as_u64().unwrap() as usize;
    assert!(
        (p["prob"].as_f64().unwrap() - want[id].exp()).abs() < 1e-3,
        "{p}"
    );
    assert_eq!(p["top_probs"].as_array().unwrap().len(), 2);
    let req = json!({"prompt": "x", "n_probs": 2, "temperature": 0.5, "post_sampling_probs": true});
    let (status, body) = post(addr, "/completion", &req);
    assert_error(
        status,
        &body,
        400,
        "invalid_request",
        Some("post_sampling_probs"),
    );

    // logit_bias: [[id, false]] bans the greedy token; the next best comes, as OpenAI's shape.
    want[r.greedy[0] as usize] = f64::MIN;
    let second = (0..v)
        .max_by(|&a, &b| want[a].partial_cmp(&want[b]).unwrap())
        .unwrap();
    let mut openai_style = serde_json::Map::new();
    openai_style.insert(r.greedy[0].to_string(), json!(-100));
    for bias in [json!([[r.greedy[0], false]]), Value::Object(openai_style)] {
        let req = json!({"prompt": r.text, "n_predict": 1, "temperature": 0, "logit_bias": bias,
                         "return_tokens": true});
        assert_eq!(
            ids(&ok(addr, &req)["tokens"]),
            vec![second as u32],
            "{bias}"
        );
    }
    let text = g.tokenizer.decode(&[r.greedy[0]]).unwrap();
    let req = json!({"prompt": r.text, "n_predict": 1, "temperature": 0,
                     "logit_bias": [[text, -100]], "return_tokens": true});
    assert_ne!(ids(&ok(addr, &req)["tokens"]), vec![r.greedy[0]]);
}

fn ok(addr: SocketAddr, body: &Value) -> Value {
    let (status, answer) = post(addr, "/completion", body);
    assert_eq!(status, 200, "{body} -> {answer}");
    answer
}

#[test]
fn slots_ctx_size_and_no_slots() {
    let llama = LlamaOptions {
        ctx_size: Some(64),
        ..Default::default()
    };
    let Some(server) = start(|c| ServeConfig {
        max_batch: 2,
        ..with(llama)(c)
    }) else {
        return;
    };
    let addr = server.addr;
    let (status, slots) = get(addr, "/slots");
    assert_eq!(status, 200);
    assert_eq!(
        slots,
        json!([{"id": 0, "n_ctx": 64, "speculative": false, "is_processing": false},
               {"id": 1, "n_ctx": 64, "speculative": false, "is_processing": false}])
    );
    let (_, props) = get(addr, "/props");
    assert_eq!(props["default_generation_settings"]["n_ctx"], 64);
    // A stream holds a slot while it runs. The tiny model can finish its 60 tokens before
    // the GET arrives on a loaded machine, so it gets several attempts to be caught running.
    let body = json!({"prompt": "a", "n_predict": 60, "stream": true});
    let mut seen_processing = false;
    for _attempt in 0..20 {
        let mut c =
            Connection::open(addr, "POST", "/completion", Some(&body.to_string()), T).unwrap();
        c.next_event().unwrap().unwrap();
        let (_, slots) = get(addr, "/slots");
        assert_eq!(slots[1]["is_processing"], false, "{slots}");
        if slots[0]["is_processing"] == true {
            seen_processing = true;
            break;
        }
        // The stream had finished; drain it so the next attempt starts from idle slots.
        while c.next_event().unwrap().is_some() {}
    }
    assert!(seen_processing, "no attempt saw slot 0 processing");
    // --ctx-size bounds the prompt plus its tokens: max_tokens past it is refused (OpenAI's
    // field, vLLM's rule); n_predict past it stops there, truncated (llama.cpp's field and
    // rule), and so does n_predict -1.
    let (status, body) = post(
        addr,
        "/completion",
        &json!({"prompt": "a b c", "max_tokens": 64}),
    );
    assert_error(
        status,
        &body,
        400,
        "context_length_exceeded",
        Some("max_tokens"),
    );
    for n_predict in [64, -1] {
        let req = json!({"prompt": "a b c", "n_predict": n_predict, "logit_bias": ends()});
        let (status, body) = post(addr, "/completion", &req);
        assert_eq!(status, 200, "{body}");
        let prompt = body["tokens_evaluated"].as_u64().unwrap();
        assert_eq!(
            body["tokens_predicted"].as_u64().unwrap() + prompt,
            64,
            "{body}"
        );
        assert_eq!(
            (&body["truncated"], &body["stop_type"]),
            (&json!(true), &json!("limit"))
        );
    }
    drop(server);

    let Some(server) = start(with(LlamaOptions {
        slots: false,
        ..Default::default()
    })) else {
        return;
    };
    let (status, body) = get(server.addr, "/slots");
    assert_error(status, &body, 501, "not_supported", None);
}
