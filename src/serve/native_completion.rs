//! llama.cpp's `POST /completion`: `/v1/completions` underneath (the same checks, queue and
//! engine), read and answered in llama.cpp's fields.
//!
//! Request: `prompt` (a string, token ids, a list of either, or llama.cpp's
//! `{"prompt_string": ...}`), `n_predict` (default `--n-predict`), `temperature`, `top_k`,
//! `top_p`, `min_p`, `seed`, `stop`, `json_schema`, `grammar`, the penalties, and llama.cpp's
//! own: `n_probs` (the alternatives per token, as `/v1/completions`' `logprobs`),
//! `post_sampling_probs` (probabilities instead of log-probabilities: only with plain sampling,
//! temperature 1 and no top-k / top-p / min-p, where they are the model's), `logit_bias`
//! (`[[id or text, bias or false], ...]` or `{"id or text": bias}`; a text biases each of its
//! tokens, `false` is −100), `return_tokens`, `response_fields` (`a/b` paths picked from the
//! answer), `stream`. `mirostat`, `image_data` and `lora` are refused by name.
//!
//! Answer: `{"index", "content", "tokens", "stop": true, "model", "tokens_predicted",
//! "tokens_evaluated", "generation_settings", "prompt", "has_new_line", "truncated",
//! "stop_type": "eos" | "word" | "limit", "stopping_word", "tokens_cached", "timings",
//! "completion_probabilities"?}`, a list of them for several prompts. With `stream: true`,
//! server-sent events without `[DONE]`, as llama.cpp: one `data: {"index", "content",
//! "tokens": [id], "stop": false, "tokens_predicted", "tokens_evaluated",
//! "completion_probabilities"?}` per generated token, then the final object above with
//! `content: ""` and `tokens: []` (its text went out in the chunks; text a stop string held
//! back until the end comes in the final object).

use super::api_error::ApiError;
use super::metrics::Outcome;
use super::native::object;
use super::openai::choice::ChoiceState;
use super::openai::logprobs::token_text;
use super::openai::{Accepted, Flavor, Reply};
use super::scheduler::{Event, FinishReason, TokenLogprob};
use super::{App, LmFront, OutcomeGuard};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

/// llama.cpp's `/completion` options this server does not have: refused by name.
const UNSUPPORTED: [&str; 3] = ["mirostat", "image_data", "lora"];

/// What this route reads itself, beyond `/v1/completions`' fields.
struct Native {
    n_probs: usize,
    post_sampling_probs: bool,
    return_tokens: bool,
    response_fields: Vec<String>,
    stream: bool,
}

fn flag(body: &Value, name: &'static str) -> Result<bool, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::invalid(
            Some(name),
            format!("{name} must be true or false"),
        )),
    }
}

/// Rewrites llama.cpp's request into `/v1/completions`' fields; returns the rest.
fn translate(
    lm: &LmFront,
    default_temperature: f64,
    request: &mut Map<String, Value>,
) -> Result<Native, ApiError> {
    let body = Value::Object(request.clone());
    for name in UNSUPPORTED {
        let present = match body.get(name) {
            None | Some(Value::Null) => false,
            Some(Value::Number(n)) => n.as_f64() != Some(0.0),
            Some(_) => true,
        };
        if present {
            return Err(ApiError::invalid(
                Some(name),
                format!("{name}: this server does not support llama.cpp's {name}"),
            ));
        }
    }
    let n_probs = match body.get("n_probs") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_u64()
            .filter(|&n| n <= super::openai::options::MAX_TOP_LOGPROBS as u64)
            .ok_or_else(|| ApiError::invalid(Some("n_probs"), "n_probs must be in 0..=20"))?
            as usize,
    };
    let post_sampling_probs = flag(&body, "post_sampling_probs")?;
    if post_sampling_probs && n_probs > 0 {
        let number = |name: &str, plain: f64| body.get(name).and_then(Value::as_f64).unwrap_or(plain);
        let plain = number("temperature", default_temperature) == 1.0
            && number("top_k", 0.0) <= 0.0
            && number("top_p", 1.0) == 1.0
            && number("min_p", 0.0) == 0.0;
        if !plain {
            return Err(ApiError::invalid(
                Some("post_sampling_probs"),
                "post_sampling_probs: this server reports the model's probabilities, which are the sampled ones only with temperature 1 and no top_k, top_p or min_p",
            ));
        }
    }
    let response_fields = match body.get("response_fields") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => serde_json::from_value(v.clone()).map_err(|_| {
            ApiError::invalid(
                Some("response_fields"),
                "response_fields must be a list of strings",
            )
        })?,
    };
    let native = Native {
        n_probs,
        post_sampling_probs,
        return_tokens: flag(&body, "return_tokens")?,
        response_fields,
        stream: flag(&body, "stream")?,
    };
    for name in ["n_probs", "post_sampling_probs", "return_tokens", "response_fields", "stream"] {
        request.remove(name);
    }
    if n_probs > 0 {
        request.insert("logprobs".into(), n_probs.into());
    }
    // llama.cpp's prompt object (multimodal prompts carry more fields).
    if let Some(Value::Object(prompt)) = request.get("prompt") {
        if prompt.keys().any(|k| k != "prompt_string") {
            return Err(ApiError::invalid(
                Some("prompt"),
                "prompt: only prompt_string is supported in a prompt object (no multimodal data)",
            ));
        }
        let text = prompt.get("prompt_string").cloned().unwrap_or_default();
        request.insert("prompt".into(), text);
    }
    if let Some(bias) = request.remove("logit_bias") {
        request.insert("logit_bias".into(), logit_bias(lm, &bias)?);
    }
    // ignore_eos: the end tokens banned, as llama.cpp adds them to logit_bias.
    if flag(&body, "ignore_eos")? {
        let mut bias = match request.remove("logit_bias") {
            Some(Value::Object(map)) => map,
            _ => Map::new(),
        };
        for id in &lm.end_tokens {
            bias.insert(id.to_string(), json!(-100));
        }
        request.insert("logit_bias".into(), Value::Object(bias));
    }
    request.remove("ignore_eos");
    Ok(native)
}

/// llama.cpp's `logit_bias` as OpenAI's `{"id": bias}`.
fn logit_bias(lm: &LmFront, bias: &Value) -> Result<Value, ApiError> {
    let bad = || {
        ApiError::invalid(
            Some("logit_bias"),
            "logit_bias must be [[token id or text, bias or false], ...] or {\"token id or text\": bias}",
        )
    };
    let pairs: Vec<(Value, Value)> = match bias {
        Value::Null => return Ok(Value::Null),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| {
                let key = k.parse::<u64>().map_or(Value::from(k.as_str()), Value::from);
                (key, v.clone())
            })
            .collect(),
        Value::Array(items) => items
            .iter()
            .map(|item| match item.as_array().map(Vec::as_slice) {
                Some([key, value]) => Ok((key.clone(), value.clone())),
                _ => Err(bad()),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(bad()),
    };
    let mut out = Map::new();
    for (key, value) in pairs {
        let value = match value {
            Value::Bool(false) => Value::from(-100.0),
            v if v.is_number() => v,
            _ => return Err(bad()),
        };
        let ids = match key {
            Value::Number(n) => vec![n.as_u64().ok_or_else(bad)?],
            Value::String(text) => lm
                .tokenizer
                .encode(&text)
                .map_err(|e| ApiError::invalid(Some("logit_bias"), e.to_string()))?
                .into_iter()
                .map(u64::from)
                .collect(),
            _ => return Err(bad()),
        };
        for id in ids {
            out.insert(id.to_string(), value.clone());
        }
    }
    Ok(Value::Object(out))
}

/// One choice's llama.cpp side: its generated ids (end tokens apart) and whether an end token
/// ended it.
#[derive(Default)]
struct Tally {
    ids: Vec<u32>,
    ended_by_token: bool,
}

/// What every answer of the request repeats.
struct Frame {
    native: Native,
    model: String,
    /// `generation_settings`.
    settings: Value,
}

/// `completion_probabilities` entries for `scores`.
fn probabilities(lm: &LmFront, scores: &[TokenLogprob], post_sampling: bool) -> Vec<Value> {
    let entry = |id: u32, logprob: f32| {
        let text = token_text(&lm.tokenizer, id);
        let mut e = json!({"id": id, "bytes": text.as_bytes(), "token": text.clone()});
        match post_sampling {
            true => e["prob"] = (logprob as f64).exp().into(),
            false => e["logprob"] = (logprob as f64).max(-9999.0).into(),
        }
        e
    };
    let top_name = if post_sampling { "top_probs" } else { "top_logprobs" };
    scores
        .iter()
        .map(|s| {
            let mut e = entry(s.token, s.logprob);
            let top: Vec<Value> = s.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
            e[top_name] = top.into();
            e
        })
        .collect()
}

/// The final object of a choice (streamed: its text and tokens already went out).
fn final_object(
    lm: &LmFront,
    frame: &Frame,
    c: &ChoiceState,
    tally: &Tally,
    scores: &[TokenLogprob],
    content: &str,
    streamed: bool,
) -> Value {
    let stop_type = match (c.finish, tally.ended_by_token) {
        (Some(FinishReason::Length), _) => "limit",
        (_, true) => "eos",
        _ => "word",
    };
    let truncated = c.finish == Some(FinishReason::Length)
        && c.prompt_ids.len() + c.completion >= lm.max_len;
    let tokens = match frame.native.return_tokens && !streamed {
        true => json!(tally.ids),
        false => json!([]),
    };
    let mut out = json!({
        "index": c.index, "content": content, "tokens": tokens, "stop": true,
        "model": frame.model, "tokens_predicted": c.completion,
        "tokens_evaluated": c.prompt_ids.len(), "generation_settings": frame.settings,
        "prompt": lm.tokenizer.decode(&c.prompt_ids).unwrap_or_default(),
        "has_new_line": c.content.contains('\n'), "truncated": truncated,
        "stop_type": stop_type, "stopping_word": "", "tokens_cached": c.cached_tokens,
        "timings": Reply::timings(std::slice::from_ref(c)),
    });
    if frame.native.n_probs > 0 && !streamed {
        out["completion_probabilities"] =
            probabilities(lm, scores, frame.native.post_sampling_probs).into();
    }
    pick(out, &frame.native.response_fields)
}

/// `response_fields`: the answer's values at those `a/b` paths, keyed by the path.
fn pick(answer: Value, fields: &[String]) -> Value {
    if fields.is_empty() {
        return answer;
    }
    let mut out = Map::new();
    for path in fields {
        let found = path
            .split('/')
            .try_fold(&answer, |v, key| v.get(key))
            .cloned();
        if let Some(value) = found {
            out.insert(path.clone(), value);
        }
    }
    Value::Object(out)
}

/// Feeds one event to choice `i`: `(text released, the token id if one was generated)`.
fn on_event(
    lm: &LmFront,
    c: &mut ChoiceState,
    tally: &mut Tally,
    event: Event,
) -> Result<(String, Option<u32>), ApiError> {
    let generated = match event {
        Event::Token(id) if lm.end_tokens.contains(&id) => {
            tally.ended_by_token = true;
            None
        }
        Event::Token(id) => {
            tally.ids.push(id);
            Some(id)
        }
        _ => None,
    };
    Ok((c.on(lm, event)?, generated))
}

/// `POST /completion`: see the module docs.
pub async fn completion(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let mut guard = OutcomeGuard::new(app.metrics.clone());
    let prepared = {
        let app = app.clone();
        tokio::task::spawn_blocking(move || prepare(&app, &body))
            .await
            .unwrap_or_else(|e| Err(ApiError::internal(format!("the request failed: {e}"))))
    };
    let (lm, acc, frame) = match prepared {
        Ok(x) => x,
        Err(e) => {
            guard.set(e.outcome());
            return e.into_response();
        }
    };
    match frame.native.stream {
        true => stream(lm, acc, frame, guard).into_response(),
        false => whole(lm, acc, frame, guard).await,
    }
}

fn prepare(app: &App, body: &Bytes) -> Result<(Arc<LmFront>, Accepted, Frame), ApiError> {
    let lm = app.lm()?;
    let Value::Object(mut request) = object(body)? else {
        unreachable!("object() returns objects")
    };
    let native = translate(&lm, app.config.llama.temperature, &mut request)?;
    let openai = Bytes::from(Value::Object(request.clone()).to_string());
    let (lm, acc) = super::openai::prepare(app, Flavor::Completion, &openai)?;
    let stop = request.get("stop").cloned().unwrap_or(json!([]));
    // llama.cpp's list of `{"token", "bias"}`, a ban (-100 or less) as null (its -inf).
    let bias: Vec<Value> = request
        .get("logit_bias")
        .and_then(Value::as_object)
        .map(|map| {
            map.iter()
                .map(|(id, b)| {
                    let token = id.parse::<u64>().map_or(json!(id), |t| json!(t));
                    let b = b.as_f64().filter(|&b| b > -100.0).map_or(Value::Null, |b| json!(b));
                    json!({"token": token, "bias": b})
                })
                .collect()
        })
        .unwrap_or_default();
    let n_predict = request
        .get("n_predict")
        .or(request.get("max_tokens"))
        .and_then(Value::as_i64)
        .unwrap_or(acc.default_max_tokens as i64);
    // The adaptive-p sampler is llama.cpp's; this server does not have it: its settings are
    // llama.cpp's values for "off".
    let settings = json!({
        "n_predict": n_predict, "max_tokens": n_predict, "seed": acc.seed,
        "temperature": acc.sampling.temperature, "top_k": acc.sampling.top_k,
        "top_p": acc.sampling.top_p, "min_p": request.get("min_p").cloned().unwrap_or(json!(0.0)),
        "stop": stop, "stream": native.stream, "n_probs": native.n_probs, "logit_bias": bias,
        "post_sampling_probs": native.post_sampling_probs,
        "adaptive_target": -1.0, "adaptive_decay": 0.9,
    });
    let frame = Frame {
        native,
        model: app.model_name.clone(),
        settings,
    };
    Ok((lm, acc, frame))
}

/// The whole answer: one object, or a list for several prompts.
async fn whole(
    lm: Arc<LmFront>,
    mut acc: Accepted,
    frame: Frame,
    mut guard: OutcomeGuard,
) -> Response {
    let n = acc.choices.len();
    let mut tallies: Vec<Tally> = (0..n).map(|_| Tally::default()).collect();
    let mut scores: Vec<Vec<TokenLogprob>> = vec![Vec::new(); n];
    while let Some((i, event)) = acc.receivers.next().await {
        let Some(event) = event else {
            if acc.choices[i].finish.is_none() {
                guard.set(Outcome::Error);
                return ApiError::internal("the engine dropped the request").into_response();
            }
            continue;
        };
        if let Err(e) = on_event(&lm, &mut acc.choices[i], &mut tallies[i], event) {
            guard.set(e.outcome());
            return e.into_response();
        }
        scores[i].extend(acc.choices[i].take_scores());
        if acc.choices[i].finish.is_some() {
            acc.receivers.close(i);
        }
    }
    let answers: Vec<Value> = (0..n)
        .map(|i| {
            let c = &acc.choices[i];
            final_object(&lm, &frame, c, &tallies[i], &scores[i], &c.content, false)
        })
        .collect();
    guard.set(Outcome::Ok);
    match <[Value; 1]>::try_from(answers) {
        Ok([one]) => Json(one).into_response(),
        Err(all) => Json(Value::Array(all)).into_response(),
    }
}

/// A streamed answer between events.
struct Streaming {
    lm: Arc<LmFront>,
    acc: Accepted,
    frame: Frame,
    guard: OutcomeGuard,
    tallies: Vec<Tally>,
    queue: VecDeque<Value>,
    done: bool,
}

impl Streaming {
    /// The next object to send, `None` after the last.
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(v) = self.queue.pop_front() {
                return Some(v);
            }
            if self.done {
                return None;
            }
            let Some((i, event)) = self.acc.receivers.next().await else {
                self.done = true;
                continue;
            };
            let Some(event) = event else {
                if self.acc.choices[i].finish.is_none() {
                    return self.fail(ApiError::internal("the engine dropped the request"));
                }
                continue;
            };
            let (text, id) = match on_event(
                &self.lm,
                &mut self.acc.choices[i],
                &mut self.tallies[i],
                event,
            ) {
                Ok(x) => x,
                Err(e) => return self.fail(e),
            };
            let c = &mut self.acc.choices[i];
            let scores = c.take_scores();
            if c.finish.is_none() {
                if let Some(id) = id {
                    let mut chunk = json!({"index": c.index, "content": text, "tokens": [id],
                        "stop": false, "tokens_predicted": c.completion,
                        "tokens_evaluated": c.prompt_ids.len()});
                    if self.frame.native.n_probs > 0 {
                        let post = self.frame.native.post_sampling_probs;
                        chunk["completion_probabilities"] =
                            probabilities(&self.lm, &scores, post).into();
                    }
                    self.queue.push_back(chunk);
                }
                continue;
            }
            self.acc.receivers.close(i);
            let c = &self.acc.choices[i];
            let last = final_object(&self.lm, &self.frame, c, &self.tallies[i], &[], &text, true);
            self.queue.push_back(last);
            if self.acc.choices.iter().all(|c| c.finish.is_some()) {
                self.done = true;
                self.guard.set(Outcome::Ok);
            }
        }
    }

    fn fail(&mut self, e: ApiError) -> Option<Value> {
        self.done = true;
        self.guard.set(e.outcome());
        Some(e.body())
    }
}

/// Server-sent events: `data: {chunk}` per token, then each choice's final object.
fn stream(lm: Arc<LmFront>, acc: Accepted, frame: Frame, guard: OutcomeGuard) -> impl IntoResponse {
    let n = acc.choices.len();
    let state = Streaming {
        lm,
        acc,
        frame,
        guard,
        tallies: (0..n).map(|_| Tally::default()).collect(),
        queue: VecDeque::new(),
        done: false,
    };
    let events = futures_util::stream::unfold(state, |mut state| async move {
        let value = state.next().await?;
        let event = SseEvent::default().data(value.to_string());
        Some((Ok::<_, Infallible>(event), state))
    });
    Sse::new(events)
}
