//! Continuous batching of a language model (Orca's iteration-level scheduling, Yu et al. 2022,
//! with vLLM's paged KV memory, Kwon et al. 2023).
//!
//! The engine holds one running batch of sequences; every iteration ([`Scheduler::step`]):
//! 1. drops the sequences whose client went away (their channel is closed) or whose deadline
//!    passed, and the waiting requests likewise;
//! 2. admits waiting requests, first come first served, while the batch has room (`max_batch`)
//!    and the pool has the blocks for the request's whole prompt plus `max_tokens`
//!    (`blocks(p + m) = ⌈(p + m) / block_rows⌉`, reserved at admission, so a running sequence
//!    never waits for memory and is never preempted);
//! 3. runs ONE forward over a ragged batch of tokens ([`LanguageModel::step`]): the next
//!    token of every decoding sequence, then chunks of the prompts being prefilled while the
//!    step's token budget (`prefill_budget`) lasts, so a long prompt cannot stall the others;
//! 4. samples the next token of every sequence whose prompt is complete ([`sample`]: greedy at
//!    temperature 0, else temperature / top-k / top-p, each sequence with its own seeded
//!    generator) and sends it to its client;
//! 5. retires finished sequences (an end token, `max_tokens`, the context full): their rows
//!    leave the state ([`DecodingState::gather_rows`]) and their blocks return to the free list
//!    at once.
//!
//! The KV memory is the state's per-layer paged caches ([`LanguageModel::start_paged`]): one
//! free list of blocks per layer, the same block table in every layer, so "a block" below means
//! `block_rows` positions in every layer (`2 · block_rows · d_kv · layers · 4` bytes).
//!
//! Rows never interact: a sequence's tokens depend only on its own prompt, options and seed,
//! not on what it is batched with (greedy results equal the single-request results).

use super::metrics::{EngineGauges, Latency, Metrics};
use crate::decode::sample::{sample, SamplingOptions};
use crate::decode::DecodingState;
use crate::model::lm::LmState;
use crate::model::LanguageModel;
use crate::model::StepLayout;
use crate::rng::Rng;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// One generation request, as the HTTP layer hands it to the engine.
#[derive(Debug)]
pub struct GenRequest {
    /// Prompt ids (checked against the vocabulary, at least one).
    pub prompt: Vec<u32>,
    /// Tokens to generate at most (at least one).
    pub max_tokens: usize,
    pub sampling: SamplingOptions,
    pub seed: u64,
    /// Tokens that end the sequence (sent, then `Finished::Stop`).
    pub stop_ids: Vec<u32>,
    /// When it arrived.
    pub arrived: Instant,
    /// When the engine gives up on it.
    pub deadline: Instant,
    /// Where its tokens go; closed by the receiver when the client goes away.
    pub events: UnboundedSender<Event>,
}

/// What the engine tells a request's handler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The next generated token.
    Token(u32),
    /// Generation ended normally.
    Finished {
        reason: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
    },
    /// The deadline passed first.
    TimedOut,
}

/// Why a sequence stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end token (or, decided by the HTTP layer, a stop string).
    Stop,
    /// `max_tokens` or the model's context.
    Length,
}

impl FinishReason {
    /// The OpenAI `finish_reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Sizes of the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Positions per KV block.
    pub block_rows: usize,
    /// Blocks in the pool (from `--kv-memory`).
    pub pool_blocks: usize,
    /// Sequences in the running batch at most.
    pub max_batch: usize,
    /// Tokens one forward feeds at most (decode tokens first, then prompt chunks).
    pub prefill_budget: usize,
}

impl EngineConfig {
    /// Blocks a request of `prompt` tokens and `max_tokens` new ones reserves.
    pub fn blocks_for(&self, prompt: usize, max_tokens: usize) -> usize {
        prompt
            .saturating_add(max_tokens)
            .div_ceil(self.block_rows.max(1))
    }

    /// Bytes of one block of `model` (keys and values, every layer, float32).
    pub fn block_bytes(model: &LanguageModel<f32>, block_rows: usize) -> usize {
        let d_kv: usize = model.blocks.layers.iter().map(|l| l.self_attn.d_kv()).sum();
        2 * block_rows * d_kv * std::mem::size_of::<f32>()
    }
}

/// A sequence of the running batch; its row in the state is its index in `running`.
struct Running {
    req: GenRequest,
    /// Prompt tokens fed so far.
    fed: usize,
    /// Tokens generated; the last one is fed at the next step unless the sequence finished.
    out: Vec<u32>,
    rng: Rng,
    first_token: Option<Instant>,
    /// Blocks reserved at admission.
    blocks: usize,
}

/// The continuous-batching engine over one language model (see the module docs).
pub struct Scheduler<'m> {
    model: &'m LanguageModel<f32>,
    config: EngineConfig,
    state: LmState<f32>,
    running: Vec<Running>,
    waiting: VecDeque<GenRequest>,
    reserved: usize,
    metrics: Arc<Metrics>,
}

impl<'m> Scheduler<'m> {
    pub fn new(model: &'m LanguageModel<f32>, config: EngineConfig, metrics: Arc<Metrics>) -> Self {
        let state = model.start_paged(config.block_rows);
        let scheduler = Scheduler {
            model,
            config,
            state,
            running: Vec::new(),
            waiting: VecDeque::new(),
            reserved: 0,
            metrics,
        };
        scheduler.metrics.set_gauges(scheduler.gauges());
        scheduler
    }

    /// Queues a request (the HTTP layer counted it in `metrics.queued` and checked its
    /// limits: `blocks_for` within the pool, prompt plus `max_tokens` within the context).
    pub fn submit(&mut self, req: GenRequest) {
        self.waiting.push_back(req);
    }

    /// Nothing running and nothing waiting.
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// Blocks in use now (each `block_rows` positions in every layer).
    pub fn blocks_in_use(&self) -> usize {
        self.state.blocks_in_use() / self.state.caches.len().max(1)
    }

    fn gauges(&self) -> EngineGauges {
        let used = self.blocks_in_use();
        EngineGauges {
            running: self.running.len(),
            kv_blocks_used: used,
            kv_blocks_free: self.config.pool_blocks.saturating_sub(used),
            kv_blocks_reserved: self.reserved,
        }
    }

    /// Drops the rows whose `keep` is false from the batch and the state, returning their
    /// blocks.
    fn retire(&mut self, keep: &[bool]) {
        if keep.iter().all(|&k| k) {
            return;
        }
        let rows: Vec<usize> = (0..keep.len()).filter(|&r| keep[r]).collect();
        DecodingState::gather_rows(&mut self.state, &rows);
        let mut i = 0;
        self.running.retain(|seq| {
            let kept = keep[i];
            i += 1;
            if !kept {
                self.reserved -= seq.blocks;
            }
            kept
        });
    }

    /// One iteration (see the module docs). Returns false when there was nothing to run.
    pub fn step(&mut self) -> bool {
        let now = Instant::now();
        // 1. Clients gone, deadlines passed.
        let keep: Vec<bool> = self
            .running
            .iter()
            .map(|seq| {
                let gone = seq.req.events.is_closed();
                if seq.req.deadline <= now {
                    let _ = seq.req.events.send(Event::TimedOut);
                }
                let leaves = gone || seq.req.deadline <= now;
                if leaves {
                    let e2e = (now - seq.req.arrived).as_secs_f64();
                    self.metrics.observe(Latency::EndToEnd, e2e);
                }
                !leaves
            })
            .collect();
        self.retire(&keep);
        let before = self.waiting.len();
        self.waiting.retain(|req| {
            if req.deadline <= now {
                let _ = req.events.send(Event::TimedOut);
                return false;
            }
            !req.events.is_closed()
        });
        self.metrics
            .queued
            .fetch_sub(before - self.waiting.len(), Ordering::Relaxed);
        // 2. Admission.
        while let Some(req) = self.waiting.front() {
            let blocks = self.config.blocks_for(req.prompt.len(), req.max_tokens);
            if self.running.len() >= self.config.max_batch
                || self.reserved + blocks > self.config.pool_blocks
            {
                break;
            }
            let Some(req) = self.waiting.pop_front() else {
                break;
            };
            self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
            self.metrics
                .observe(Latency::QueueTime, (now - req.arrived).as_secs_f64());
            self.state.add_row();
            self.reserved += blocks;
            self.running.push(Running {
                rng: Rng::new(req.seed),
                req,
                fed: 0,
                out: Vec::new(),
                first_token: None,
                blocks,
            });
        }
        if self.running.is_empty() {
            self.metrics.set_gauges(self.gauges());
            return false;
        }
        // 3. The ragged batch: decode tokens first, then prompt chunks under the budget.
        let (mut tokens, mut rows, mut positions) = (Vec::new(), Vec::new(), Vec::new());
        // (row, index of the token whose output is wanted)
        let mut outputs: Vec<(usize, usize)> = Vec::new();
        for (r, seq) in self.running.iter().enumerate() {
            if seq.fed == seq.req.prompt.len() {
                outputs.push((r, tokens.len()));
                tokens.push(*seq.out.last().expect("a fed prompt has sampled a token"));
                rows.push(r);
                positions.push(self.state.row_len(r));
            }
        }
        let mut prefilled = 0;
        for (r, seq) in self.running.iter().enumerate() {
            let left = seq.req.prompt.len() - seq.fed;
            let budget = self.config.prefill_budget.saturating_sub(tokens.len());
            if left == 0 || budget == 0 {
                continue;
            }
            let n = left.min(budget);
            let start = self.state.row_len(r);
            tokens.extend_from_slice(&seq.req.prompt[seq.fed..seq.fed + n]);
            rows.extend(std::iter::repeat_n(r, n));
            positions.extend(start..start + n);
            prefilled += n;
            if n == left {
                outputs.push((r, tokens.len() - 1));
            }
        }
        if tokens.is_empty() {
            return false;
        }
        let picked: Vec<usize> = outputs.iter().map(|&(_, i)| i).collect();
        let layout = StepLayout::ragged(&rows, &positions, &picked);
        let logprobs = self.model.step(&mut self.state, &tokens, &layout);
        // Gauges before any token goes out: a client that reads its first token and then
        // /metrics sees its sequence running and its blocks held.
        self.metrics.set_gauges(self.gauges());
        // Prompts fed.
        for (r, seq) in self.running.iter_mut().enumerate() {
            let n = rows.iter().filter(|&&x| x == r).count();
            if seq.fed < seq.req.prompt.len() {
                seq.fed += n;
            }
        }
        // 4. Next tokens.
        let v = self.model.config.vocab_size;
        let max_len = self.model.max_len();
        let now = Instant::now();
        let mut keep = vec![true; self.running.len()];
        let mut endings = Vec::new();
        for (j, &(r, _)) in outputs.iter().enumerate() {
            let seq = &mut self.running[r];
            let id = sample(
                &logprobs[j * v..(j + 1) * v],
                seq.req.sampling,
                &mut seq.rng,
            );
            seq.out.push(id);
            if seq.first_token.is_none() {
                seq.first_token = Some(now);
                let ttft = (now - seq.req.arrived).as_secs_f64();
                self.metrics.observe(Latency::TimeToFirstToken, ttft);
            }
            let finished = if seq.req.stop_ids.contains(&id) {
                Some(FinishReason::Stop)
            } else if seq.out.len() >= seq.req.max_tokens || self.state.row_len(r) >= max_len {
                Some(FinishReason::Length)
            } else {
                None
            };
            if finished.is_some() {
                // Observed before the events go out: a client that has its answer sees it
                // counted.
                let first = seq.first_token.unwrap_or(now);
                if seq.out.len() > 1 {
                    let per_token = (now - first).as_secs_f64() / (seq.out.len() - 1) as f64;
                    self.metrics.observe(Latency::TimePerOutputToken, per_token);
                }
                let e2e = (now - seq.req.arrived).as_secs_f64();
                self.metrics.observe(Latency::EndToEnd, e2e);
            }
            let mut alive = seq.req.events.send(Event::Token(id)).is_ok();
            if let Some(reason) = finished {
                endings.push((
                    seq.req.events.clone(),
                    Event::Finished {
                        reason,
                        prompt_tokens: seq.req.prompt.len(),
                        completion_tokens: seq.out.len(),
                    },
                ));
                alive = false;
            } else if !alive {
                // The client went away during this step.
                let e2e = (now - seq.req.arrived).as_secs_f64();
                self.metrics.observe(Latency::EndToEnd, e2e);
            }
            keep[r] = alive;
        }
        // 5. Finished sequences leave; their blocks are free for the next admission. Their
        // clients hear of the end only then: one that has its answer sees its blocks freed.
        self.retire(&keep);
        self.metrics.step(self.gauges(), prefilled, outputs.len());
        for (events, ending) in endings {
            let _ = events.send(ending);
        }
        true
    }

    /// Runs until `requests` is closed and everything submitted is answered. Waits for a
    /// request outside the rayon pool when idle (so an idle server holds no pool thread), and
    /// steps on a pool thread while busy (the many small parallel loops of a step then start
    /// without a hand-off).
    pub fn run(&mut self, mut requests: Receiver<GenRequest>) {
        while let Ok(req) = requests.recv() {
            self.submit(req);
            // The receiver moves to the pool thread and back (it is Send, not Sync).
            let this = &mut *self;
            requests = rayon::scope(move |_| {
                this.run_busy(&requests);
                requests
            });
        }
    }

    /// Takes what has arrived and steps, until nothing runs or waits.
    fn run_busy(&mut self, requests: &Receiver<GenRequest>) {
        loop {
            while let Ok(req) = requests.try_recv() {
                self.submit(req);
            }
            if !self.step() {
                if self.is_idle() {
                    return;
                }
                // Everything waiting waits for blocks or a batch slot that only a finishing
                // sequence frees, and nothing runs: cannot happen while the HTTP layer checks
                // each request against the pool; avoid spinning if it does.
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }
}
