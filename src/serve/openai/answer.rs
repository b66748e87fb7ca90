//! The answers of the text endpoints: the whole answer ([`whole`]) or server-sent events
//! ([`stream`]), over every choice of a request (the shapes: [`super`]'s module docs).

use super::choice::ChoiceState;
use super::logprobs;
use super::{Accepted, Flavor};
use crate::serve::api_error::ApiError;
use crate::serve::metrics::Outcome;
use crate::serve::{LmFront, OutcomeGuard};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

/// What every answer of one request repeats.
pub struct Reply {
    pub flavor: Flavor,
    pub id: String,
    pub created: u64,
    pub model: String,
    /// `system_fingerprint`: the binary's version and the model files
    /// ([`crate::serve::system_fingerprint`]).
    pub fingerprint: String,
}

impl Reply {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.flavor, chunk) {
            (Flavor::Completion, _) => "text_completion",
            (Flavor::Chat, false) => "chat.completion",
            (Flavor::Chat, true) => "chat.completion.chunk",
        }
    }

    fn usage(choices: &[ChoiceState]) -> Value {
        let prompts = choices.iter().filter(|c| c.counts_prompt);
        let prompt: usize = prompts.clone().map(|c| c.prompt_ids.len()).sum();
        let cached: usize = prompts.map(|c| c.cached_tokens).sum();
        let completion: usize = choices.iter().map(|c| c.completion).sum();
        json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
               "prompt_tokens_details": {"cached_tokens": cached}})
    }

    /// llama.cpp's `timings` of the first choice: prompt tokens computed (`prompt_n`, the
    /// cached ones in `cache_n`) and the time from queueing to the first token, tokens
    /// generated and the time from the first token to the end.
    pub fn timings(choices: &[ChoiceState]) -> Value {
        let Some(c) = choices.first() else {
            return Value::Null;
        };
        let ms = |from: Option<Instant>, to: Option<Instant>| match (from, to) {
            (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64() * 1e3,
            _ => 0.0,
        };
        let per_second = |n: usize, ms: f64| match ms > 0.0 {
            true => n as f64 * 1e3 / ms,
            false => 0.0,
        };
        let prompt_n = c.prompt_ids.len().saturating_sub(c.cached_tokens);
        let prompt_ms = ms(Some(c.queued_at), c.first_token_at);
        let predicted_ms = ms(c.first_token_at, c.finished_at);
        // The first token comes with the prompt's last step: the generation rate is over the
        // steps after it (llama.cpp's rule), and 0 for a single token.
        let decoded = c.completion.saturating_sub(1);
        json!({"cache_n": c.cached_tokens, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
               "prompt_per_token_ms": if prompt_n > 0 { prompt_ms / prompt_n as f64 } else { 0.0 },
               "prompt_per_second": per_second(prompt_n, prompt_ms),
               "predicted_n": c.completion, "predicted_ms": predicted_ms,
               "predicted_per_token_ms": if decoded > 0 { predicted_ms / decoded as f64 } else { 0.0 },
               "predicted_per_second": per_second(decoded, predicted_ms)})
    }

    /// A chunk of `choices` (possibly none), with `usage` where given.
    fn chunk(&self, choices: Vec<Value>, usage: Option<Value>) -> Value {
        let mut out = json!({"id": self.id, "object": self.object(true), "created": self.created,
                             "model": self.model, "system_fingerprint": self.fingerprint,
                             "choices": choices});
        if let Some(u) = usage {
            out["usage"] = u;
        }
        out
    }
}

/// The `tool_calls` list of a finished choice, ids `call_<answer id>_<index>_<k>`.
fn tool_calls(reply: &Reply, choice: &ChoiceState, streamed: bool) -> Option<Vec<Value>> {
    let calls = &choice.calls.as_ref()?.calls;
    Some(
        calls
            .iter()
            .enumerate()
            .map(|(k, c)| {
                let mut call = json!({"id": format!("call_{}_{}_{k}", reply.id, choice.index), "type": "function",
                       "function": {"name": c.name, "arguments": c.arguments}});
                if streamed {
                    call["index"] = k.into();
                }
                call
            })
            .collect(),
    )
}

/// A finished choice of the whole answer.
fn whole_choice(lm: &LmFront, reply: &Reply, acc: &Accepted, c: &mut ChoiceState) -> Value {
    let scores = c.take_scores();
    match reply.flavor {
        Flavor::Completion => {
            let echo = c.echo.take().unwrap_or_default();
            let logprobs = match acc.scoring.row.logprobs {
                None => Value::Null,
                Some(_) => {
                    let prompt = match (&c.prompt_scores, c.prompt_ids.first()) {
                        (Some(p), Some(&first)) => Some((first, &p[..])),
                        _ => None,
                    };
                    logprobs::completion(&lm.tokenizer, prompt, &scores, 0)
                }
            };
            json!({"index": c.index, "text": format!("{echo}{}", c.content), "logprobs": logprobs,
                   "finish_reason": c.finish_reason()})
        }
        Flavor::Chat => {
            let logprobs = match acc.scoring.row.logprobs {
                None => Value::Null,
                Some(_) => logprobs::chat(&lm.tokenizer, &scores),
            };
            let mut message = json!({"role": "assistant", "content": c.content});
            if let Some(calls) = tool_calls(reply, c, false) {
                let content = &c
                    .calls
                    .as_ref()
                    .map(|p| p.content.clone())
                    .unwrap_or_default();
                message["content"] = if content.is_empty() {
                    Value::Null
                } else {
                    content.as_str().into()
                };
                message["tool_calls"] = calls.into();
            }
            json!({"index": c.index, "message": message, "logprobs": logprobs,
                   "finish_reason": c.finish_reason()})
        }
    }
}

fn fail(guard: &mut OutcomeGuard, e: ApiError) -> Response {
    guard.set(e.outcome());
    e.into_response()
}

/// Collects the whole answer. Dropping this future (the client went away) drops the receivers,
/// which the engine sees at its next step: the sequences leave and their blocks are freed.
pub async fn whole(
    lm: Arc<LmFront>,
    mut acc: Accepted,
    reply: Reply,
    mut guard: OutcomeGuard,
) -> Response {
    while let Some((i, event)) = acc.receivers.next().await {
        let Some(event) = event else {
            if acc.choices[i].finish.is_none() {
                return fail(
                    &mut guard,
                    ApiError::internal("the engine dropped the request"),
                );
            }
            continue;
        };
        if let Err(e) = acc.choices[i].on(&lm, event) {
            return fail(&mut guard, e);
        }
        if acc.choices[i].finish.is_some() {
            acc.receivers.close(i);
        }
    }
    let mut choices = std::mem::take(&mut acc.choices);
    let body: Vec<Value> = choices
        .iter_mut()
        .map(|c| whole_choice(&lm, &reply, &acc, c))
        .collect();
    guard.set(Outcome::Ok);
    Json(
        json!({"id": reply.id, "object": reply.object(false), "created": reply.created,
                "model": reply.model, "system_fingerprint": reply.fingerprint, "choices": body,
                "usage": Reply::usage(&choices), "timings": Reply::timings(&choices)}),
    )
    .into_response()
}

/// The state of a streamed answer between events.
struct Streaming {
    lm: Arc<LmFront>,
    acc: Accepted,
    reply: Reply,
    guard: OutcomeGuard,
    /// Per choice: whether its role went out (chat), its characters sent so far (completions'
    /// text offsets).
    role_sent: Vec<bool>,
    sent_chars: Vec<usize>,
    /// Events to send before reading more.
    queue: VecDeque<SseEvent>,
    done: bool,
}

impl Streaming {
    fn data(value: Value) -> SseEvent {
        SseEvent::default().data(value.to_string())
    }

    fn error(&mut self, e: ApiError) -> Option<SseEvent> {
        self.done = true;
        self.guard.set(e.outcome());
        Some(Self::data(e.body()))
    }

    /// Choice `i`'s chunk of `text` (with the scores of its tokens) and, once it is done, its
    /// tool calls and finish.
    fn choice_chunk(&mut self, i: usize, text: String) -> Value {
        let lm = &self.lm;
        let c = &mut self.acc.choices[i];
        let scores = c.take_scores();
        let finished = c.finish.is_some();
        let reason = if finished { c.finish_reason() } else { None };
        match self.reply.flavor {
            Flavor::Completion => {
                let echo = c.echo.take().unwrap_or_default();
                let logprobs = match self.acc.scoring.row.logprobs {
                    None => Value::Null,
                    Some(_) => {
                        let prompt = match (echo.is_empty(), &c.prompt_scores, c.prompt_ids.first())
                        {
                            (false, Some(p), Some(&first)) => Some((first, &p[..])),
                            _ => None,
                        };
                        logprobs::completion(&lm.tokenizer, prompt, &scores, self.sent_chars[i])
                    }
                };
                let text = format!("{echo}{text}");
                self.sent_chars[i] += text.chars().count();
                json!({"index": c.index, "text": text, "logprobs": logprobs, "finish_reason": reason})
            }
            Flavor::Chat => {
                let mut delta = Map::new();
                if !self.role_sent[i] {
                    self.role_sent[i] = true;
                    delta.insert("role".into(), "assistant".into());
                }
                if !text.is_empty() {
                    delta.insert("content".into(), text.into());
                }
                if let Some(calls) = tool_calls(&self.reply, c, true) {
                    delta.insert("tool_calls".into(), calls.into());
                }
                let logprobs = match self.acc.scoring.row.logprobs {
                    Some(_) if !scores.is_empty() => {
                        json!({"content": logprobs::chat_content(&lm.tokenizer, &scores), "refusal": null})
                    }
                    _ => Value::Null,
                };
                json!({"index": c.index, "delta": delta, "logprobs": logprobs, "finish_reason": reason})
            }
        }
    }

    /// Queues the chunks of choice `i` after an event that released `text`.
    fn queue_choice(&mut self, i: usize, text: String) {
        let include_usage = self.acc.scoring.include_usage;
        let usage_field = include_usage.then_some(Value::Null);
        let finished = self.acc.choices[i].finish.is_some();
        if !finished {
            if !text.is_empty() {
                let chunk = self.choice_chunk(i, text);
                self.queue
                    .push_back(Self::data(self.reply.chunk(vec![chunk], usage_field)));
            }
            return;
        }
        // The last text (with any tool calls) and the finish chunk, as separate chunks when
        // there is text, as before.
        let has_text = !text.is_empty() || self.acc.choices[i].echo.is_some();
        let calls = self.acc.choices[i].calls.is_some();
        let mut last = self.choice_chunk(i, text);
        if has_text || calls {
            let reason = last["finish_reason"].take();
            self.queue.push_back(Self::data(
                self.reply.chunk(vec![last], usage_field.clone()),
            ));
            last = self.choice_chunk(i, String::new());
            last["finish_reason"] = reason;
            if let Some(delta) = last.get_mut("delta").and_then(Value::as_object_mut) {
                delta.remove("tool_calls");
            }
        }
        let all_done = self.acc.choices.iter().all(|c| c.finish.is_some());
        let usage = Reply::usage(&self.acc.choices);
        let on_finish = match (include_usage, all_done) {
            (true, _) => Some(Value::Null),
            (false, true) => Some(usage.clone()),
            (false, false) => None,
        };
        let mut finish_chunk = self.reply.chunk(vec![last], on_finish);
        if all_done && !include_usage {
            finish_chunk["timings"] = Reply::timings(&self.acc.choices);
        }
        self.queue.push_back(Self::data(finish_chunk));
        if all_done {
            if include_usage {
                let mut usage_chunk = self.reply.chunk(vec![], Some(usage));
                usage_chunk["timings"] = Reply::timings(&self.acc.choices);
                self.queue.push_back(Self::data(usage_chunk));
            }
            self.done = true;
            self.guard.set(Outcome::Ok);
        }
    }

    /// The next event to send, `None` after the last.
    async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(event) = self.queue.pop_front() {
                return Some(event);
            }
            if self.done {
                return None;
            }
            let Some((i, event)) = self.acc.receivers.next().await else {
                return self.error(ApiError::internal("the engine dropped the request"));
            };
            let Some(event) = event else {
                if self.acc.choices[i].finish.is_none() {
                    return self.error(ApiError::internal("the engine dropped the request"));
                }
                continue;
            };
            let text = match self.acc.choices[i].on(&self.lm, event) {
                Ok(text) => text,
                Err(e) => return self.error(e),
            };
            if self.acc.choices[i].finish.is_some() {
                // The stop string ends it here; the engine frees the sequence now.
                self.acc.receivers.close(i);
            }
            self.queue_choice(i, text);
        }
    }
}

/// Server-sent events: `data: {chunk}` per piece, the finish chunks, `data: [DONE]`.
pub fn stream(
    lm: Arc<LmFront>,
    acc: Accepted,
    reply: Reply,
    guard: OutcomeGuard,
) -> impl IntoResponse {
    let n = acc.choices.len();
    // A chat stream opens with each choice's role and no content, as OpenAI and llama.cpp send.
    let mut queue = VecDeque::new();
    let chat = reply.flavor == Flavor::Chat;
    if chat {
        let roles: Vec<Value> = (0..n)
            .map(|i| json!({"index": acc.choices[i].index, "logprobs": null, "finish_reason": null,
                            "delta": {"role": "assistant", "content": null}}))
            .collect();
        queue.push_back(Streaming::data(reply.chunk(roles, None)));
    }
    let state = Streaming {
        lm,
        acc,
        reply,
        guard,
        role_sent: vec![chat; n],
        sent_chars: vec![0; n],
        queue,
        done: false,
    };
    let events = futures_util::stream::unfold(Some(state), |state| async move {
        let mut state = state?;
        match state.next().await {
            Some(event) => Some((Ok::<_, Infallible>(event), Some(state))),
            None => Some((Ok(SseEvent::default().data("[DONE]")), None)),
        }
    });
    Sse::new(events)
}

#[cfg(test)]
#[path = "answer_tests.rs"]
mod tests;
