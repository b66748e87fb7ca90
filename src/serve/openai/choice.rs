//! One choice of an answer as its events arrive (text through the stop strings, then through the
//! tool-call reader where tools were offered; log-probabilities beside), and the receivers of
//! all the choices of a request read as one stream.
//!
//! An answer has `prompts × n` choices, each its own row in the engine (with its own seed: `n`
//! choices of one prompt are independent rows that do not share the prompt's KV blocks), index
//! `prompt · n + choice` as OpenAI numbers them. A choice that ends early (a stop string) drops
//! its receiver at once, which frees its row; dropping the whole answer drops them all.

use super::tool_calls::{ParsedReply, ToolFormat, ToolStream};
use crate::serve::api_error::ApiError;
use crate::serve::scheduler::{Event, FinishReason, TokenLogprob};
use crate::serve::text::TextStream;
use crate::serve::LmFront;
use std::future::poll_fn;
use std::task::Poll;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedReceiver;

/// The tools a chat request offered, and how its model writes calls.
#[derive(Clone, Debug)]
pub struct OfferedTools {
    /// The format of the model's template (`None`: no syntax we read; replies are prose).
    pub format: Option<ToolFormat>,
    /// The functions' names.
    pub names: Vec<String>,
    /// `parallel_tool_calls` (false: the first call only).
    pub parallel: bool,
    /// With `tool_choice` `required` or named: the grammar of the call the reply must be.
    pub forced: Option<crate::decode::constraint::Grammar>,
}

/// One choice's state (see the module docs).
pub struct ChoiceState {
    pub index: usize,
    /// Its prompt's ids.
    pub prompt_ids: Vec<u32>,
    /// Whether its prompt's tokens count in the usage (the first choice of each prompt).
    pub counts_prompt: bool,
    /// The text `echo` puts first, not yet sent (completions).
    pub echo: Option<String>,
    text: TextStream,
    tools: Option<(ToolStream, OfferedTools)>,
    /// The content released so far.
    pub content: String,
    /// Tokens generated (end tokens included).
    pub completion: usize,
    /// The generated tokens' scores not yet taken ([`Self::take_scores`]).
    scores: Vec<TokenLogprob>,
    pending: Option<TokenLogprob>,
    /// The prompt's scores (`echo` with `logprobs`), once they came.
    pub prompt_scores: Option<Vec<TokenLogprob>>,
    pub finish: Option<FinishReason>,
    /// The reply read as tool calls, at its end.
    pub calls: Option<ParsedReply>,
    /// Prompt tokens the engine took from the prefix cache (known at the end).
    pub cached_tokens: usize,
    /// When the choice was queued, its first token came and it finished (llama.cpp's
    /// `timings`).
    pub queued_at: Instant,
    pub first_token_at: Option<Instant>,
    pub finished_at: Option<Instant>,
}

impl ChoiceState {
    /// A choice of `index` for `prompt_ids`, with the request's stop strings and tools.
    pub fn new(
        index: usize,
        prompt_ids: Vec<u32>,
        counts_prompt: bool,
        echo: Option<String>,
        stop: Vec<String>,
        tools: Option<&OfferedTools>,
    ) -> Self {
        let tools = tools.and_then(|t| Some((ToolStream::new(t.format?), t.clone())));
        ChoiceState {
            index,
            prompt_ids,
            counts_prompt,
            echo,
            text: TextStream::new(stop),
            tools,
            content: String::new(),
            completion: 0,
            scores: Vec::new(),
            pending: None,
            prompt_scores: None,
            finish: None,
            calls: None,
            cached_tokens: 0,
            queued_at: Instant::now(),
            first_token_at: None,
            finished_at: None,
        }
    }

    /// The scores gathered since the last call.
    pub fn take_scores(&mut self) -> Vec<TokenLogprob> {
        std::mem::take(&mut self.scores)
    }

    /// The finish reason OpenAI reports.
    pub fn finish_reason(&self) -> Option<&'static str> {
        match (&self.calls, self.finish) {
            (Some(_), Some(_)) => Some("tool_calls"),
            (_, reason) => reason.map(FinishReason::as_str),
        }
    }

    /// Takes one event; returns the content that may be sent now (possibly empty). After the
    /// last one, [`Self::finish`] is set (and [`Self::calls`] where the reply was calls).
    pub fn on(&mut self, lm: &LmFront, event: Event) -> Result<String, ApiError> {
        let internal = |e: crate::error::Error| ApiError::internal(e.to_string());
        let piece = match event {
            Event::Logprob(score) => {
                self.pending = Some(score);
                return Ok(String::new());
            }
            Event::PromptLogprobs(scores) => {
                self.prompt_scores = Some(scores);
                return Ok(String::new());
            }
            Event::TimedOut => return Err(ApiError::timeout(lm.timeout_s)),
            Event::Failed(message) => {
                return Err(ApiError::limit(
                    "response_format",
                    "constraint_failed",
                    message,
                ))
            }
            Event::Unavailable(message) => {
                return Err(ApiError::unavailable(format!(
                    "the model's device failed: {message}"
                )))
            }
            Event::Token(id) => {
                self.completion += 1;
                self.first_token_at.get_or_insert_with(Instant::now);
                let score = self.pending.take();
                if lm.end_tokens.contains(&id) {
                    return Ok(String::new());
                }
                self.scores.extend(score);
                let piece = self.text.push(&lm.tokenizer, id).map_err(internal)?;
                if self.text.stopped() {
                    self.finish = Some(FinishReason::Stop);
                }
                piece
            }
            Event::Finished {
                reason,
                cached_tokens,
                ..
            } => {
                self.cached_tokens = cached_tokens;
                self.finished_at = Some(Instant::now());
                let piece = self.text.finish(&lm.tokenizer).map_err(internal)?;
                self.finish = Some(if self.text.stopped() {
                    FinishReason::Stop
                } else {
                    reason
                });
                piece
            }
        };
        let mut out = match &mut self.tools {
            Some((stream, _)) => stream.push(&piece),
            None => piece,
        };
        if self.finish.is_some() {
            if let Some((stream, offered)) = &mut self.tools {
                let (rest, calls) = stream.finish(&offered.names);
                out.push_str(&rest);
                self.calls = calls.map(|mut c| {
                    if !offered.parallel {
                        c.calls.truncate(1);
                    }
                    c
                });
            }
        }
        self.content.push_str(&out);
        Ok(out)
    }
}

/// The receivers of a request's choices, read as one stream.
pub struct Receivers {
    slots: Vec<Option<UnboundedReceiver<Event>>>,
    /// Where the next poll starts (round robin, so no choice waits behind another).
    start: usize,
}

impl Receivers {
    /// Choice `i` reads `receivers[i]`.
    pub fn new(receivers: Vec<UnboundedReceiver<Event>>) -> Self {
        Receivers {
            slots: receivers.into_iter().map(Some).collect(),
            start: 0,
        }
    }

    /// Stops listening to choice `i` (its row is dropped by the engine).
    pub fn close(&mut self, i: usize) {
        if let Some(slot) = self.slots.get_mut(i) {
            *slot = None;
        }
    }

    /// The next event of any choice: `(i, Some(event))`, `(i, None)` when choice `i`'s sender
    /// went away (its receiver is closed then), `None` when every choice is closed.
    pub async fn next(&mut self) -> Option<(usize, Option<Event>)> {
        poll_fn(|cx| {
            let n = self.slots.len();
            let mut open = false;
            for k in 0..n {
                let i = (self.start + k) % n;
                let Some(rx) = &mut self.slots[i] else {
                    continue;
                };
                open = true;
                match rx.poll_recv(cx) {
                    Poll::Ready(Some(event)) => {
                        self.start = (i + 1) % n;
                        return Poll::Ready(Some((i, Some(event))));
                    }
                    Poll::Ready(None) => {
                        self.slots[i] = None;
                        return Poll::Ready(Some((i, None)));
                    }
                    Poll::Pending => {}
                }
            }
            if open {
                Poll::Pending
            } else {
                Poll::Ready(None)
            }
        })
        .await
    }
}
