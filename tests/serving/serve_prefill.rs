//! Chunked prefill shared fairly (issue 44, "one long prompt starves everyone"), on the tiny
//! Hugging Face Llama of ../shared:
//! - a long `echo` + `logprobs` scoring request fed in chunks of any size, alone or with other
//!   requests interleaved, gets the same prompt log-probabilities, tokens and token
//!   log-probabilities as fed whole (to float32 rounding, 1e-5, the prefix cache tests'
//!   tolerance; the tokens and the alternatives' ids exactly);
//! - a small request that arrives while such a request is being prefilled gets its first token
//!   at the end of the step it is admitted in, and its whole answer, long before the long one
//!   is scored: counted in engine steps, not in wall time.

use super::serve_engine::llama_tiny;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedReceiver;
use transformer::decode::sample::SamplingOptions;
use transformer::model::LanguageModel;
use transformer::serve::metrics::Metrics;
use transformer::serve::scheduler::{
    EngineConfig, Event, GenRequest, PrefillBudget, RowOptions, Scheduler, TokenLogprob,
};

/// A request: its prompt, `max_tokens`, whether it scores its prompt (`echo` + `logprobs`:
/// the prompt's and the tokens' log-probabilities with 3 alternatives), and the step before
/// which it is submitted.
#[derive(Clone)]
struct Ask {
    prompt: Vec<u32>,
    max_tokens: usize,
    scored: bool,
    at: usize,
}

/// What a request heard: each event with the step (counted from 0) whose end sent it.
type Heard = Vec<(usize, Event)>;

/// Runs `asks` through one engine of `budget` tokens per step, greedy.
fn run(model: &LanguageModel<f32>, budget: usize, asks: &[Ask]) -> Vec<Heard> {
    let config = EngineConfig {
        block_rows: 4,
        pool_blocks: 1000,
        max_batch: 16,
        prefill_budget: PrefillBudget::Fixed(budget),
        prefix_cache: true,
        max_overtakes: 16,
    };
    let metrics = Arc::new(Metrics::default());
    let mut engine = Scheduler::new(model, config, metrics.clone());
    let mut receivers: Vec<Option<UnboundedReceiver<Event>>> = asks.iter().map(|_| None).collect();
    let mut heard: Vec<Heard> = asks.iter().map(|_| Vec::new()).collect();
    let last = asks.iter().map(|a| a.at).max().unwrap_or(0);
    let mut step = 0;
    loop {
        for (i, ask) in asks.iter().enumerate().filter(|(_, a)| a.at == step) {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let now = Instant::now();
            metrics
                .queued
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let scores = ask.scored.then_some(3);
            engine.submit(GenRequest {
                prompt: ask.prompt.clone(),
                max_tokens: ask.max_tokens,
                sampling: SamplingOptions {
                    temperature: 0.0,
                    ..Default::default()
                },
                options: RowOptions {
                    logprobs: scores,
                    prompt_logprobs: scores,
                    ..Default::default()
                },
                seed: 1,
                stop_ids: vec![],
                arrived: now,
                deadline: now + Duration::from_secs(600),
                events: tx,
                constraint: None,
            });
            receivers[i] = Some(rx);
        }
        let ran = engine.step();
        for (rx, h) in receivers.iter_mut().zip(&mut heard) {
            while let Some(event) = rx.as_mut().and_then(|rx| rx.try_recv().ok()) {
                h.push((step, event));
            }
        }
        if !ran && step > last && engine.is_idle() {
            break;
        }
        step += 1;
        assert!(step < 10_000, "the engine does not finish");
    }
    assert_eq!(engine.blocks_in_use(), 0, "every block is back in the pool");
    for (h, ask) in heard.iter().zip(asks) {
        let finished = h
            .iter()
            .filter(|(_, e)| matches!(e, Event::Finished { .. }));
        assert_eq!(finished.count(), 1, "one answer per request");
        let tokens = h.iter().filter(|(_, e)| matches!(e, Event::Token(_)));
        assert_eq!(tokens.count(), ask.max_tokens);
    }
    heard
}

/// The first step at which `heard` has an event that `is`.
fn step_of(heard: &Heard, is: impl Fn(&Event) -> bool) -> usize {
    heard.iter().find(|(_, e)| is(e)).expect("heard").0
}

/// Asserts two scores equal: the token and the alternatives' ids exactly, the
/// log-probabilities within 1e-5.
fn assert_score(got: &TokenLogprob, want: &TokenLogprob, what: &str) {
    assert_eq!(got.token, want.token, "{what}");
    assert!(
        (got.logprob - want.logprob).abs() <= 1e-5,
        "{what}: {got:?} {want:?}"
    );
    let ids = |t: &[(u32, f32)]| t.iter().map(|x| x.0).collect::<Vec<_>>();
    assert_eq!(ids(&got.top), ids(&want.top), "{what}");
    for (x, y) in got.top.iter().zip(&want.top) {
        assert!((x.1 - y.1).abs() <= 1e-5, "{what}: {got:?} {want:?}");
    }
}

/// Asserts that two requests heard the same events (steps aside), scores within 1e-5; returns
/// the largest difference of the log-probabilities.
fn assert_same(got: &Heard, want: &Heard, what: &str) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}");
    let mut worst = 0f32;
    let mut compare = |a: &TokenLogprob, b: &TokenLogprob, what: &str| {
        assert_score(a, b, what);
        worst = worst.max((a.logprob - b.logprob).abs());
    };
    for ((_, a), (_, b)) in got.iter().zip(want) {
        match (a, b) {
            (Event::PromptLogprobs(a), Event::PromptLogprobs(b)) => {
                assert_eq!(a.len(), b.len(), "{what}");
                for (k, (x, y)) in a.iter().zip(b).enumerate() {
                    compare(x, y, &format!("{what}: prompt position {}", k + 1));
                }
            }
            (Event::Logprob(a), Event::Logprob(b)) => compare(a, b, what),
            _ => assert_eq!(a, b, "{what}"),
        }
    }
    worst
}

/// A prompt of `n` ids of the tiny Llama's 1,000, from `seed`.
fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 3 + (i * 7919 + seed * 104_729) % 997)
        .collect()
}

fn long_ask(at: usize) -> Ask {
    Ask {
        prompt: prompt(200, 1),
        max_tokens: 6,
        scored: true,
        at,
    }
}

#[test]
fn a_long_scoring_request_gets_the_same_scores_however_it_is_chunked() {
    let Some(g) = llama_tiny() else { return };
    // Fed whole: one step of 200 tokens.
    let whole = run(&g.model, 256, &[long_ask(0)]);
    let scores = step_of(&whole[0], |e| matches!(e, Event::PromptLogprobs(_)));
    assert_eq!(scores, 0, "the whole prompt in one step");
    match &whole[0][0].1 {
        Event::PromptLogprobs(s) => assert_eq!(s.len(), 199),
        other => panic!("the prompt's scores come first: {other:?}"),
    }
    // Alone in chunks of 1, 7 and 64 tokens.
    for budget in [1, 7, 64] {
        let chunked = run(&g.model, budget, &[long_ask(0)]);
        let scored = step_of(&chunked[0], |e| matches!(e, Event::PromptLogprobs(_)));
        assert_eq!(scored + 1, 200usize.div_ceil(budget), "budget {budget}");
        assert_same(&chunked[0], &whole[0], &format!("alone, budget {budget}"));
    }
    // Chunks of 16 with small requests (scored or not) joining and leaving around it; each of
    // them gets what it gets alone too.
    let mut asks = vec![long_ask(0)];
    for (k, at) in [1, 2, 5, 9, 10].into_iter().enumerate() {
        asks.push(Ask {
            prompt: prompt(3 + 4 * k, 2 + k as u32),
            max_tokens: 3 + k,
            scored: k % 2 == 0,
            at,
        });
    }
    let mixed = run(&g.model, 16, &asks);
    assert_same(&mixed[0], &whole[0], "interleaved, budget 16");
    for (i, ask) in asks.iter().enumerate().skip(1) {
        let alone = run(
            &g.model,
            256,
            &[Ask {
                at: 0,
                ..ask.clone()
            }],
        );
        assert_same(&mixed[i], &alone[0], &format!("small request {i}"));
    }
}

#[test]
fn a_small_request_starts_while_a_long_one_is_scored() {
    let Some(g) = llama_tiny() else { return };
    let small = Ask {
        prompt: prompt(6, 3),
        max_tokens: 4,
        scored: false,
        at: 3,
    };
    let heard = run(&g.model, 16, &[long_ask(0), small]);
    let (long, small) = (&heard[0], &heard[1]);
    // The long prompt takes at least 200 / 16 steps; the small one is admitted at step 3,
    // its prompt fed in that step ahead of the long one's chunk, and its first token sent at
    // that step's end.
    let long_scored = step_of(long, |e| matches!(e, Event::PromptLogprobs(_)));
    assert!(
        long_scored >= 200 / 16,
        "the long prompt is chunked: {long_scored}"
    );
    let first = step_of(small, |e| matches!(e, Event::Token(_)));
    assert_eq!(
        first, 3,
        "the small request's first token at the step that admits it"
    );
    // One token a step: the small request is answered before the long one is even scored.
    let done = step_of(small, |e| matches!(e, Event::Finished { .. }));
    assert_eq!(done, 3 + 4 - 1);
    assert!(done < long_scored, "{done} < {long_scored}");
}
