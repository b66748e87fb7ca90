//! Prefix caching in the engine, on the tiny Hugging Face Llama of ../shared: a request served
//! from cached blocks gives exactly the tokens, and the log-probabilities to float32 rounding
//! (1e-5; greedy, the five best alternatives of every token: not bit for bit, the uncached tail
//! of a prompt is fed as a shorter chunk whose products round differently), it gets alone with
//! no cache, whether it shares no
//! block, one, several, its whole prompt (then its last block is computed again), the blocks
//! of an earlier request's generated tokens (a chat's next turn), or the blocks of a request
//! still running; with a pool small enough that cached blocks are evicted too.

use super::serve_engine::llama_tiny;
use std::sync::Arc;
use std::time::{Duration, Instant};
use transformer::decode::sample::SamplingOptions;
use transformer::model::LanguageModel;
use transformer::serve::metrics::Metrics;
use transformer::serve::scheduler::{
    EngineConfig, Event, GenRequest, PrefillBudget, RowOptions, Scheduler,
};

/// One request's events with `Finished`'s cached tokens split off.
#[derive(Debug, PartialEq)]
struct Heard {
    /// Tokens and log-probabilities, in order.
    events: Vec<Event>,
    cached: usize,
}

/// Runs `requests` (prompt, max_tokens, the step before which it is submitted) through one
/// engine, greedy with the 5 best log-probabilities; each request's events, and the metrics.
fn run(
    model: &LanguageModel<f32>,
    config: EngineConfig,
    requests: &[(Vec<u32>, usize, usize)],
) -> (Vec<Heard>, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    let mut engine = Scheduler::new(model, config, metrics.clone());
    let mut receivers: Vec<Option<_>> = (0..requests.len()).map(|_| None).collect();
    let mut step = 0;
    loop {
        for (i, (prompt, max_tokens, at)) in requests.iter().enumerate() {
            if *at != step {
                continue;
            }
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let now = Instant::now();
            metrics
                .queued
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            engine.submit(GenRequest {
                prompt: prompt.clone(),
                max_tokens: *max_tokens,
                sampling: SamplingOptions {
                    temperature: 0.0,
                    ..Default::default()
                },
                options: RowOptions {
                    logprobs: Some(5),
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
        let last = requests.iter().map(|r| r.2).max().unwrap_or(0);
        if !engine.step() && step > last && engine.is_idle() {
            break;
        }
        step += 1;
        assert!(step < 10_000, "the engine does not finish");
    }
    assert_eq!(engine.blocks_in_use(), 0, "every block is back in the pool");
    let heard = receivers
        .into_iter()
        .map(|rx| {
            let mut rx = rx.expect("every request submitted");
            let mut events = Vec::new();
            loop {
                match rx.try_recv().expect("an answer for every request") {
                    Event::Finished {
                        prompt_tokens,
                        completion_tokens,
                        cached_tokens,
                        reason,
                    } => {
                        events.push(Event::Finished {
                            prompt_tokens,
                            completion_tokens,
                            cached_tokens: 0,
                            reason,
                        });
                        return Heard {
                            events,
                            cached: cached_tokens,
                        };
                    }
                    other => events.push(other),
                }
            }
        })
        .collect();
    (heard, metrics)
}

/// Asserts that `got` and `want` have the same tokens and alternatives, their
/// log-probabilities within 1e-5.
fn assert_close(got: &Heard, want: &Heard, what: &str) {
    assert_eq!(got.events.len(), want.events.len(), "{what}");
    for (a, b) in got.events.iter().zip(&want.events) {
        match (a, b) {
            (Event::Logprob(a), Event::Logprob(b)) => {
                assert_eq!(a.token, b.token, "{what}");
                assert!((a.logprob - b.logprob).abs() <= 1e-5, "{what}: {a:?} {b:?}");
                let ids = |t: &[(u32, f32)]| t.iter().map(|x| x.0).collect::<Vec<_>>();
                assert_eq!(ids(&a.top), ids(&b.top), "{what}");
                for (x, y) in a.top.iter().zip(&b.top) {
                    assert!((x.1 - y.1).abs() <= 1e-5, "{what}: {a:?} {b:?}");
                }
            }
            _ => assert_eq!(a, b, "{what}"),
        }
    }
}

/// The tokens of a request's events.
fn tokens(heard: &Heard) -> Vec<u32> {
    let token = |e: &Event| match e {
        Event::Token(t) => Some(*t),
        _ => None,
    };
    heard.events.iter().filter_map(token).collect()
}

/// The number after `name` in the metrics text.
fn metric(metrics: &Metrics, name: &str) -> u64 {
    let text = metrics.render();
    let line = text.lines().find(|l| l.starts_with(&format!("{name} ")));
    line.unwrap().rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn cached_prefixes_give_the_same_tokens_and_logprobs() {
    let Some(g) = llama_tiny() else { return };
    let bs = 4;
    let config = EngineConfig {
        block_rows: bs,
        pool_blocks: 1000,
        max_batch: 16,
        prefill_budget: PrefillBudget::Fixed(64),
        prefix_cache: true,
        max_overtakes: 16,
    };
    let no_cache = EngineConfig {
        prefix_cache: false,
        ..config
    };
    // A base prompt of 22 tokens (5 full blocks and 2 tokens).
    let base: Vec<u32> = vec![
        575, 45, 37, 47, 14, 221, 477, 368, 356, 286, 82, 751, 283, 641, 271, 264, 473, 300, 719,
        553, 83, 31,
    ];
    let l = base.len();
    let first_reply = tokens(&run(&g.model, no_cache, &[(base.clone(), 12, 0)]).0[0]);
    let with = |head: &[u32], tail: &[u32]| [head, tail].concat();
    let mut other_first = base.clone();
    other_first[0] = 576;
    let mut other_fifth = base.clone();
    other_fifth[4] = 15;
    let turn_two = with(&with(&base, &first_reply), &[5, 6, 7]);
    let running = with(&base, &[1, 2, 3]);
    // (prompt, max_tokens, step submitted, prompt tokens expected from the cache)
    let cases: Vec<(Vec<u32>, usize, usize, usize)> = vec![
        (base.clone(), 12, 0, 0),
        // No block shared: the first token differs.
        (other_first, 12, 30, 0),
        // One block.
        (other_fifth, 12, 60, bs),
        // Several: 3 blocks and a token.
        (with(&base[..13], &[9, 8, 7]), 12, 90, 3 * bs),
        // The whole prompt cached (4 full blocks): the last block is computed again.
        (base[..16].to_vec(), 12, 120, 3 * bs),
        // A chat's next turn: the first request's prompt and reply (fed: all but its last
        // token) are cached.
        (turn_two.clone(), 12, 150, (l + 11) / bs * bs),
        // A long request, and the same prompt while it runs (its blocks shared, not kept).
        (running.clone(), 40, 200, l / bs * bs),
        (running.clone(), 12, 203, (l + 2) / bs * bs),
    ];
    let requests: Vec<_> = cases.iter().map(|c| (c.0.clone(), c.1, c.2)).collect();
    let (cached, metrics) = run(&g.model, config, &requests);
    let (uncached, plain_metrics) = run(&g.model, no_cache, &requests);
    for (i, case) in cases.iter().enumerate() {
        let (alone, _) = run(&g.model, no_cache, &[(case.0.clone(), case.1, 0)]);
        assert_close(
            &cached[i],
            &alone[0],
            &format!("request {i}: cached vs alone"),
        );
        assert_close(
            &uncached[i],
            &alone[0],
            &format!("request {i}: no cache vs alone"),
        );
        assert_eq!(
            cached[i].cached, case.3,
            "request {i}: tokens from the cache"
        );
        assert_eq!(uncached[i].cached, 0);
        assert_eq!(tokens(&cached[i]).len(), case.1);
    }
    let hit: usize = cases.iter().map(|c| c.3).sum();
    let prompts: usize = cases.iter().map(|c| c.0.len()).sum();
    assert_eq!(
        metric(&metrics, "transformer_prefix_cache_hit_tokens_total"),
        hit as u64
    );
    assert_eq!(
        metric(&metrics, "transformer_prefix_cache_miss_tokens_total"),
        (prompts - hit) as u64
    );
    assert_eq!(
        metric(&metrics, "transformer_prefix_cache_hit_blocks_total"),
        (hit / bs) as u64
    );
    assert_eq!(
        metric(&plain_metrics, "transformer_prefix_cache_hit_tokens_total"),
        0
    );
    // The prompt tokens computed: those not found.
    assert_eq!(
        metric(&metrics, "transformer_prompt_tokens_total"),
        (prompts - hit) as u64
    );
    assert!(metric(&metrics, "transformer_kv_blocks_cached") > 0);
    assert_eq!(metric(&plain_metrics, "transformer_kv_blocks_cached"), 0);

    // A pool of 20 blocks (the largest request reserves ⌈(25 + 40) / 4⌉ = 17): cached blocks
    // are evicted to make room, the last two requests do not run together; the answers do not
    // change.
    let tight = EngineConfig {
        pool_blocks: 20,
        ..config
    };
    let (squeezed, squeezed_metrics) = run(&g.model, tight, &requests);
    for (i, heard) in squeezed.iter().enumerate() {
        assert_close(heard, &uncached[i], &format!("request {i}: a tight pool"));
    }
    assert!(metric(&squeezed_metrics, "transformer_kv_blocks_cached") <= 20);
}
