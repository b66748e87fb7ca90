//! The continuous-batching engine without HTTP:
//! - a ragged step (sequences of different lengths, prompts fed in chunks, rows joining and
//!   leaving between steps, blocks of a few positions) gives every token the log-probabilities
//!   of the plain teacher-forced forward over its whole sequence (float64, 1e-10);
//! - batched greedy generation equals single-request greedy generation and transformers'
//!   greedy ids (the tiny Hugging Face Llama of ../shared), whatever joins when;
//! - every KV block returns to the pool.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use transformer::decode::sample::SamplingOptions;
use transformer::model::{LanguageModel, ModelConfig, Positions, StepLayout};
use transformer::pipeline::generate::{generate_ids, TextGenerator};
use transformer::rng::Rng;
use transformer::serve::metrics::Metrics;
use transformer::serve::scheduler::{
    EngineConfig, Event, FinishReason, GenRequest, PagedLm, PrefillBudget, Scheduler,
};

/// log-softmax of the teacher-forced forward over `tokens`, `[len, vocab]`, in float64.
fn full_logprobs(model: &LanguageModel<f64>, tokens: &[u32]) -> Vec<f64> {
    let (logits, _) = model.forward(tokens, 1, None);
    let v = model.config.vocab_size;
    let mut out = logits;
    for row in out.chunks_mut(v) {
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
        row.iter_mut().for_each(|x| *x -= lse);
    }
    out
}

#[test]
fn ragged_steps_equal_the_full_forward() {
    for (positions, kv_heads) in [(Positions::Rotary, Some(2)), (Positions::Learned, None)] {
        let mut c = ModelConfig::preset("tiny", 53).unwrap();
        c.n_encoder_layers = 0;
        c.n_decoder_layers = 2;
        c.d_model = 32;
        c.n_heads = 4;
        c.d_ff = 48;
        c.dropout = 0.0;
        c.max_len = 64;
        c.positions = positions;
        c.n_kv_heads = kv_heads;
        let model = LanguageModel::<f64>::new(c, &mut Rng::new(7));
        let mut rng = Rng::new(3);
        let seqs: Vec<Vec<u32>> = [13, 5, 22, 9]
            .iter()
            .map(|&n| (0..n).map(|_| (rng.uniform() * 53.0) as u32).collect())
            .collect();
        let want: Vec<Vec<f64>> = seqs.iter().map(|s| full_logprobs(&model, s)).collect();
        let v = 53;
        // Blocks of 3 positions: sequences cross blocks mid-chunk.
        let mut state = model.start_paged(3);
        // rows[r] = which sequence row r holds; fed[s] = positions of sequence s fed.
        let mut rows: Vec<usize> = Vec::new();
        let mut fed = [0usize; 4];
        let mut checked = 0;
        // Per step: (sequence joins before the step?, chunk length per running sequence).
        for step in 0..40 {
            if step < seqs.len() * 2 && step % 2 == 0 {
                rows.push(step / 2);
                state.add_row();
            }
            let (mut tokens, mut row_of, mut pos, mut outputs) = (vec![], vec![], vec![], vec![]);
            for (r, &s) in rows.iter().enumerate() {
                let n = (1 + (step + s) % 4).min(seqs[s].len() - fed[s]);
                for i in 0..n {
                    tokens.push(seqs[s][fed[s] + i]);
                    row_of.push(r);
                    pos.push(fed[s] + i);
                }
                outputs.extend(tokens.len() - n..tokens.len());
            }
            if tokens.is_empty() {
                break;
            }
            let layout = StepLayout::ragged(&row_of, &pos, &outputs);
            let lp = model.step(&mut state, &tokens, &layout);
            for (j, &i) in outputs.iter().enumerate() {
                let s = rows[row_of[i]];
                let p = pos[i];
                let expect = &want[s][p * v..(p + 1) * v];
                let got = &lp[j * v..(j + 1) * v];
                let diff = got
                    .iter()
                    .zip(expect)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f64::max);
                assert!(diff < 1e-10, "{positions:?} seq {s} pos {p}: {diff}");
                checked += 1;
            }
            for (r, &s) in rows.iter().enumerate() {
                fed[s] += row_of.iter().filter(|&&x| x == r).count();
            }
            // Finished sequences leave (in the middle of the batch too).
            let keep: Vec<usize> = (0..rows.len())
                .filter(|&r| fed[rows[r]] < seqs[rows[r]].len())
                .collect();
            state.gather_rows(&keep);
            rows = keep.iter().map(|&r| rows[r]).collect();
        }
        assert_eq!(checked, seqs.iter().map(Vec::len).sum::<usize>());
        assert_eq!(state.blocks_in_use(), 0);
    }
}

/// The tiny random Llama of `../shared/reference/hf-decoders`, prepared for inference; `None`
/// (said on stderr) where `../shared` is absent. Shared by the engine tests of this binary.
pub(crate) fn llama_tiny() -> Option<TextGenerator> {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/hf-decoders/llama-tiny");
    if !dir.is_dir() {
        eprintln!("skipped: {} is absent", dir.display());
        return None;
    }
    let mut g = TextGenerator::load(&dir).unwrap();
    g.model.prepare_inference();
    Some(g)
}

#[derive(serde::Deserialize)]
pub(crate) struct Prompt {
    pub input_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
}

#[derive(serde::Deserialize)]
pub(crate) struct Reference {
    pub prompts: Vec<Prompt>,
}

/// Runs `requests` (prompt, max_tokens, the step before which it is submitted) through one
/// engine; returns each one's tokens and finish reason.
pub(crate) fn run_engine<M: PagedLm>(
    model: &M,
    config: EngineConfig,
    requests: &[(Vec<u32>, usize, usize)],
    sampling: SamplingOptions,
) -> Vec<(Vec<u32>, FinishReason)> {
    let metrics = Arc::new(Metrics::default());
    let mut engine = Scheduler::paged(model, config, metrics.clone()).unwrap();
    let mut receivers = Vec::new();
    let mut step = 0;
    let mut submitted = 0;
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|&i| requests[i].2);
    let mut slots: Vec<Option<_>> = (0..requests.len()).map(|_| None).collect();
    loop {
        while submitted < order.len() && requests[order[submitted]].2 <= step {
            let i = order[submitted];
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let now = Instant::now();
            metrics
                .queued
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            engine.submit(GenRequest {
                prompt: requests[i].0.clone(),
                max_tokens: requests[i].1,
                sampling,
                options: Default::default(),
                constraint: None,
                seed: 5 + i as u64,
                stop_ids: vec![],
                arrived: now,
                deadline: now + Duration::from_secs(600),
                events: tx,
            });
            slots[i] = Some(rx);
            submitted += 1;
        }
        if !engine.step() && submitted == order.len() && engine.is_idle() {
            break;
        }
        step += 1;
        assert!(step < 10_000, "the engine does not finish");
    }
    assert_eq!(engine.blocks_in_use(), 0, "every block is back in the pool");
    let gauges = metrics.gauges();
    assert_eq!(
        (
            gauges.running,
            gauges.kv_blocks_used,
            gauges.kv_blocks_reserved
        ),
        (0, 0, 0)
    );
    for rx in slots.into_iter().flatten() {
        receivers.push(rx);
    }
    receivers
        .into_iter()
        .map(|mut rx| {
            let mut ids = Vec::new();
            loop {
                match rx.try_recv().expect("an answer for every request") {
                    Event::Token(id) => ids.push(id),
                    Event::Finished {
                        reason,
                        completion_tokens,
                        ..
                    } => {
                        assert_eq!(completion_tokens, ids.len());
                        return (ids, reason);
                    }
                    Event::TimedOut => panic!("timed out"),
                    other => panic!("not asked for: {other:?}"),
                }
            }
        })
        .collect()
}

#[test]
fn batched_greedy_equals_single_request_greedy() {
    let Some(g) = llama_tiny() else { return };
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/hf-decoders/llama-tiny");
    let reference: Reference =
        serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    let greedy = SamplingOptions {
        temperature: 0.0,
        ..Default::default()
    };
    let prompts: Vec<&Prompt> = reference.prompts.iter().collect();
    assert!(prompts.len() >= 3);
    // Each prompt twice: once with the reference's 16 tokens, once longer; joining at steps
    // 0, 3, 7, ...; a prefill budget of 7 tokens so prompts are fed in chunks beside decoding.
    let mut requests = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        requests.push((p.input_ids.clone(), 16, 4 * i));
        requests.push((p.input_ids.clone(), 40, 4 * i + 3));
    }
    let config = EngineConfig {
        block_rows: 4,
        pool_blocks: 1000,
        max_batch: 64,
        prefill_budget: PrefillBudget::Fixed(7),
        prefix_cache: true,
        max_overtakes: 16,
    };
    let batched = run_engine(&g.model, config, &requests, greedy);
    for (i, (prompt, max_tokens, _)) in requests.iter().enumerate() {
        let alone = run_engine(
            &g.model,
            config,
            &[(prompt.clone(), *max_tokens, 0)],
            greedy,
        );
        assert_eq!(batched[i], alone[0], "request {i}: batched vs alone");
        // The plain single-sequence path of `transformer generate`.
        let plain = generate_ids(
            &g.model,
            prompt,
            *max_tokens,
            greedy,
            &mut Rng::new(1),
            &[],
            |_| Ok::<(), ()>(()),
        )
        .unwrap();
        assert_eq!(batched[i].0, plain, "request {i}: engine vs generate");
        assert_eq!(batched[i].1, FinishReason::Length);
        // transformers' greedy ids.
        let hf = &prompts[i / 2].greedy_ids;
        assert_eq!(
            &batched[i].0[..hf.len()],
            &hf[..],
            "request {i}: vs transformers"
        );
    }
    // A pool of 12 blocks of 4 positions: requests wait for blocks (never more reserved than
    // the pool), and still get the same tokens.
    let small = EngineConfig {
        pool_blocks: 12,
        ..config
    };
    let squeezed: Vec<_> = requests
        .iter()
        .filter(|(p, m, _)| small.blocks_for(p.len(), *m) <= 12)
        .cloned()
        .collect();
    assert!(squeezed.len() >= 3);
    let got = run_engine(&g.model, small, &squeezed, greedy);
    for (r, out) in squeezed.iter().zip(&got) {
        let i = requests.iter().position(|q| q == r).unwrap();
        assert_eq!(out, &batched[i]);
    }
}

#[test]
fn seeded_sampling_does_not_depend_on_the_batch() {
    let Some(g) = llama_tiny() else { return };
    let sampling = SamplingOptions {
        temperature: 0.9,
        top_k: 50,
        top_p: 0.95,
    };
    let prompt: Vec<u32> = (10..30).collect();
    let config = EngineConfig {
        block_rows: 16,
        pool_blocks: 1000,
        max_batch: 8,
        prefill_budget: PrefillBudget::Fixed(64),
        prefix_cache: true,
        max_overtakes: 16,
    };
    let requests: Vec<_> = (0..5).map(|i| (prompt[..10 + i].to_vec(), 20, i)).collect();
    let batched = run_engine(&g.model, config, &requests, sampling);
    for (i, r) in requests.iter().enumerate() {
        // run_engine seeds request i with 5 + i: the same request at the same index, among
        // other prompts joining at other steps, draws the same tokens.
        let mut other: Vec<_> = (0..5).map(|j| (vec![7 + j as u32; 3 + j], 5, 0)).collect();
        other[i] = (r.0.clone(), r.1, 0);
        let shuffled = run_engine(&g.model, config, &other, sampling);
        assert_eq!(shuffled[i], batched[i], "request {i}");
    }
    // Different seeds give different samples somewhere.
    assert!(batched.windows(2).any(|w| w[0].0 != w[1].0));
}
