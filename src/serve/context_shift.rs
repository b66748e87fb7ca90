//! llama-server's context shift (`--context-shift`): a sequence that fills its context
//! (`--ctx-size`) goes on instead of stopping. The prompt's first `n_keep` tokens stay; of
//! the tokens after them, the older half is discarded; generation continues from what is
//! left, until the request's `n_predict` / `max_tokens` or an end token.
//!
//! Done here by recomputation rather than by moving keys in the KV cache: when the engine
//! reports the row finished at the context's end, [`relay`] queues a continuation whose
//! prompt is the kept tokens (its KV computed afresh at positions 0..; the prefix cache gives
//! back the first `n_keep` tokens' blocks where they fill whole blocks) and forwards its
//! tokens into the same stream, so that the handler sees one sequence: its tokens in order and
//! one [`Event::Finished`] with the original prompt's size and every token generated. The
//! engine itself is unchanged. llama.cpp instead shifts the cached keys' positions (RoPE),
//! which is cheaper per shift and not the same numbers: the attention over the kept tokens
//! here is exactly as if they had been the prompt.
//!
//! A row with a grammar does not shift (its grammar's state would have to be carried over):
//! it stops at the context's end, as without `--context-shift`.

use super::metrics::Metrics;
use super::scheduler::{Event, FinishReason, GenRequest, RowOptions};
use crate::decode::sample::SamplingOptions;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// What a continuation is queued with: the first row's settings and where to queue.
pub struct Continuation {
    /// The context, prompt and output (`--ctx-size`).
    pub n_ctx: usize,
    /// Prompt tokens that are never discarded.
    pub n_keep: usize,
    /// Tokens to generate in all, over every continuation.
    pub max_tokens: usize,
    pub sampling: SamplingOptions,
    /// The first row's options, without its prompt's log-probabilities (asked once).
    pub options: RowOptions,
    pub seed: u64,
    pub stop_ids: Vec<u32>,
    pub arrived: Instant,
    pub deadline: Instant,
    /// The engine's queue, its place counter and size.
    pub requests: Sender<GenRequest>,
    pub metrics: Arc<Metrics>,
    pub max_queue: usize,
}

/// The prompt a shifted sequence continues from: its first `n_keep` tokens, then the newer
/// half of the rest; `None` when nothing can be discarded (the kept tokens fill the context).
pub fn shifted(sequence: &[u32], n_keep: usize, n_ctx: usize) -> Option<Vec<u32>> {
    let keep = n_keep.min(sequence.len());
    let discard = (sequence.len() - keep) / 2;
    if discard == 0 {
        return None;
    }
    let mut out = sequence[..keep].to_vec();
    out.extend_from_slice(&sequence[keep + discard..]);
    (out.len() < n_ctx).then_some(out)
}

/// Forwards `first`'s events (the row of `prompt`) and, each time the row ends at the
/// context's end with tokens still to generate, those of a continuation (see the module
/// docs). Runs on the async runtime; ends when the sequence ends or the client goes away.
pub fn relay(
    prompt: Vec<u32>,
    first: UnboundedReceiver<Event>,
    c: Continuation,
) -> UnboundedReceiver<Event> {
    let (out, rx) = unbounded_channel();
    tokio::spawn(forward(prompt, first, c, out));
    rx
}

async fn forward(
    prompt: Vec<u32>,
    mut events: UnboundedReceiver<Event>,
    c: Continuation,
    out: UnboundedSender<Event>,
) {
    let prompt_tokens = prompt.len();
    let mut sequence = prompt;
    let mut generated = 0usize;
    let mut first_cached = None;
    let mut part = 0u64;
    while let Some(event) = events.recv().await {
        let event = match event {
            Event::Token(t) => {
                sequence.push(t);
                generated += 1;
                Event::Token(t)
            }
            Event::Finished {
                reason,
                cached_tokens,
                ..
            } => {
                let cached = *first_cached.get_or_insert(cached_tokens);
                let next = (reason == FinishReason::Length
                    && generated < c.max_tokens
                    && sequence.len() >= c.n_ctx)
                    .then(|| shifted(&sequence, c.n_keep, c.n_ctx))
                    .flatten();
                if let Some(next_prompt) = next {
                    part += 1;
                    match queue(&c, next_prompt, c.max_tokens - generated, part) {
                        Ok(rx) => {
                            events = rx;
                            continue;
                        }
                        Err(message) => Event::Failed(message),
                    }
                } else {
                    Event::Finished {
                        reason,
                        prompt_tokens,
                        completion_tokens: generated,
                        cached_tokens: cached,
                    }
                }
            }
            other => other,
        };
        if out.send(event).is_err() {
            return; // the client went away: dropping `events` tells the engine
        }
    }
}

/// Queues the continuation of `prompt` for at most `left` tokens (the `part`-th; its seed
/// follows from the first row's).
fn queue(
    c: &Continuation,
    prompt: Vec<u32>,
    left: usize,
    part: u64,
) -> Result<UnboundedReceiver<Event>, String> {
    let max_tokens = left.min(c.n_ctx - prompt.len());
    let queued = c
        .metrics
        .queued
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
            (q < c.max_queue).then_some(q + 1)
        });
    if queued.is_err() {
        return Err("the context shift's continuation found the queue full (--max-queue)".into());
    }
    let (tx, rx) = unbounded_channel();
    let request = GenRequest {
        prompt,
        max_tokens,
        sampling: c.sampling,
        options: c.options.clone(),
        constraint: None,
        seed: c.seed.wrapping_add(part.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        stop_ids: c.stop_ids.clone(),
        arrived: c.arrived,
        deadline: c.deadline,
        events: tx,
    };
    if c.requests.send(request).is_err() {
        c.metrics.queued.fetch_sub(1, Ordering::AcqRel);
        return Err("the engine has stopped".into());
    }
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shift_keeps_n_keep_and_the_newer_half() {
        let seq: Vec<u32> = (0..10).collect();
        assert_eq!(shifted(&seq, 2, 10), Some(vec![0, 1, 6, 7, 8, 9]));
        assert_eq!(shifted(&seq, 0, 10), Some(vec![5, 6, 7, 8, 9]));
        // n_keep past the sequence keeps everything: nothing to discard.
        assert_eq!(shifted(&seq, 10, 10), None);
        assert_eq!(shifted(&seq, 9, 10), None);
        assert_eq!(shifted(&seq, 8, 10), Some(vec![0, 1, 2, 3, 4, 5, 6, 7, 9]));
    }
}
