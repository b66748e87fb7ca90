//! The answer of a reply that calls a tool, whole and streamed, from the events the engine
//! would send (the tiny Llama's real tokenizer of ../shared turning the reply text into ids):
//! `message.tool_calls` with the name and JSON arguments, `finish_reason: "tool_calls"`, the
//! prose before the call as content; streamed, the prose in content deltas, then one
//! `delta.tool_calls` chunk (`index`, `id`, `type`, `function`), then the finish. A call of a
//! tool not offered stays prose, whole and streamed.

use super::super::choice::{ChoiceState, OfferedTools, Receivers};
use super::super::options::Scoring;
use super::super::tool_calls::ToolFormat;
use super::*;
use crate::serve::metrics::Metrics;
use crate::serve::scheduler::{EngineConfig, Event, FinishReason, PrefillBudget};
use crate::text::decoder_tokenizer::DecoderTokenizer;
use std::path::Path;

fn front() -> Option<Arc<LmFront>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/reference/hf-decoders/llama-tiny/tokenizer.json");
    if !path.is_file() {
        eprintln!("skipped: {} is absent", path.display());
        return None;
    }
    Some(Arc::new(LmFront {
        tokenizer: DecoderTokenizer::hugging_face(&path, Some(0)).unwrap(),
        chat: None,
        end_tokens: vec![0],
        vocab_size: 1000,
        max_len: 256,
        engine: EngineConfig {
            block_rows: 16,
            pool_blocks: 64,
            max_batch: 8,
            prefill_budget: PrefillBudget::Fixed(64),
            prefix_cache: true,
            max_overtakes: 16,
        },
        timeout_s: 60.0,
        requests: std::sync::mpsc::channel().0,
        constraints: Err("not needed here".into()),
        fingerprint: "fp_test".into(),
    }))
}

/// The answer (whole or streamed: its body text) to a reply of `text`, then the end token.
fn answer(lm: &Arc<LmFront>, text: &str, streamed: bool) -> String {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let ids = lm.tokenizer.encode(text).unwrap();
    for &id in &ids {
        tx.send(Event::Token(id)).unwrap();
    }
    tx.send(Event::Token(0)).unwrap();
    tx.send(Event::Finished {
        reason: FinishReason::Stop,
        prompt_tokens: 2,
        completion_tokens: ids.len() + 1,
        cached_tokens: 0,
    })
    .unwrap();
    let offered = OfferedTools {
        format: Some(ToolFormat::Hermes),
        names: vec!["get_weather".into()],
        parallel: true,
        forced: None,
    };
    let accepted = Accepted {
        choices: vec![ChoiceState::new(
            0,
            vec![5, 6],
            true,
            None,
            vec![],
            Some(&offered),
        )],
        receivers: Receivers::new(vec![rx]),
        stream: streamed,
        scoring: Scoring {
            n: 1,
            ..Default::default()
        },
        seed: 0,
        sampling: Default::default(),
        default_max_tokens: 16,
    };
    let reply = Reply {
        flavor: Flavor::Chat,
        id: "chatcmpl-7".into(),
        created: 0,
        model: "m".into(),
        fingerprint: "fp_test".into(),
    };
    let guard = OutcomeGuard::new(Arc::new(Metrics::default()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let response = match streamed {
            true => stream(lm.clone(), accepted, reply, guard).into_response(),
            false => whole(lm.clone(), accepted, reply, guard).await,
        };
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        String::from_utf8(body.to_vec()).unwrap()
    })
}

/// The `data:` payloads of a streamed body, `[DONE]` last.
fn chunks(body: &str) -> Vec<Value> {
    let data: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{body}");
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[test]
fn a_tool_call_reply_whole_and_streamed() {
    let Some(lm) = front() else { return };
    let text = "Sure. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let whole: Value = serde_json::from_str(&answer(&lm, text, false)).unwrap();
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{whole}");
    let message = &choice["message"];
    assert_eq!(message["content"], "Sure.");
    let call = &message["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["id"], "call_chatcmpl-7_0_0");
    assert_eq!(call["function"]["name"], "get_weather");
    let arguments: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"city": "Paris"}));
    assert_eq!(message["tool_calls"].as_array().unwrap().len(), 1);

    let streamed = chunks(&answer(&lm, text, true));
    let deltas: Vec<&Value> = streamed.iter().map(|c| &c["choices"][0]).collect();
    assert_eq!(deltas[0]["delta"]["role"], "assistant");
    let content: String = deltas
        .iter()
        .filter_map(|d| d["delta"]["content"].as_str())
        .collect();
    assert_eq!(content.trim(), "Sure.");
    let calls: Vec<&Value> = deltas
        .iter()
        .filter_map(|d| d["delta"].get("tool_calls"))
        .collect();
    assert_eq!(calls.len(), 1, "{streamed:?}");
    assert_eq!(calls[0][0]["index"], 0);
    assert_eq!(calls[0][0]["id"], call["id"]);
    assert_eq!(calls[0][0]["function"], call["function"]);
    assert_eq!(deltas.last().unwrap()["finish_reason"], "tool_calls");
    assert!(deltas[..deltas.len() - 1]
        .iter()
        .all(|d| d["finish_reason"].is_null()));
}

#[test]
fn a_call_of_a_tool_not_offered_stays_prose() {
    let Some(lm) = front() else { return };
    let text = "<tool_call>{\"name\": \"launch\", \"arguments\": {}}</tool_call>";
    let whole: Value = serde_json::from_str(&answer(&lm, text, false)).unwrap();
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["message"]["content"], text);
    assert!(choice["message"].get("tool_calls").is_none());
    let streamed = chunks(&answer(&lm, text, true));
    let content: String = streamed
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, text);
    assert!(streamed
        .iter()
        .all(|c| c["choices"][0]["delta"].get("tool_calls").is_none()));
}
