//! Continuous batching of a language model: the [`RowKind`] of the [`Engine`] for language
//! models, one row per request (its sequence).
//!
//! - Admission reserves the blocks of the request's whole prompt plus `max_tokens`
//!   (`blocks(p + m) = ⌈(p + m) / block_rows⌉`, see [`EngineConfig::blocks_for`]) from the
//!   pool of `--kv-memory`.
//! - A step runs ONE forward over a ragged batch of tokens ([`LanguageModel::step`] with a ragged [`StepLayout`]):
//!   the next token of every decoding sequence, then chunks of the prompts being prefilled,
//!   the prompt with the fewest tokens left first, while the step's token budget
//!   (`prefill_budget`: `--prefill-budget`, or by default sized from measured steps so one
//!   takes about `--prefill-step-ms`, `scheduler/budget.rs`) lasts (`scheduler/feed.rs`), so a long prompt (or
//!   an `echo` + `logprobs` scoring pass) cannot stall the others: neither the decoding rows
//!   nor a short prompt admitted after it, whose first token waits for at most the step under
//!   way and its own. A request whose client went away leaves before
//!   the next step, its prefill unfinished. Every sequence whose prompt is complete samples its next token ([`sample`]:
//!   greedy at temperature 0, else temperature / top-k / top-p, each sequence with its own
//!   seeded generator), streamed to its client ([`Event::Token`]); a sequence ends at an end
//!   token, at `max_tokens` or when the context is full ([`Event::Finished`]).
//!
//! The KV memory is the state's per-layer paged caches ([`LanguageModel::start_paged`]): one
//! free list of blocks per layer, the same block table in every layer, so "a block" below means
//! `block_rows` positions in every layer (`2 · block_rows · d_kv · layers · 4` bytes).
//!
//! **Prefix caching** ([`super::prefix_cache`], unless [`EngineConfig::prefix_cache`] is off):
//! every full block a row has fed (prompt or generated tokens) is registered under its chain
//! key after the step that filled it; a sequence admitted later whose prompt starts with
//! registered blocks takes them
//! ([`CacheStack::share_blocks`](crate::model::cache_stack::CacheStack::share_blocks)) and
//! prefills only the rest. It takes
//! at most `⌊(p − 1) / block_rows⌋` of a `p`-token prompt, so at least its last token is fed (its
//! logits choose the first token) and it writes only into blocks of its own. A row asking for
//! its prompt's log-probabilities takes none (each prompt position must be computed). Blocks
//! whose rows all left stay cached until the pool needs them (the storage holds
//! `pool_blocks` at most, least recently released evicted first). Reservations are unchanged:
//! a row still reserves the blocks of its whole prompt, so the pool is never overcommitted.
//!
//! Per row, beyond plain sampling ([`RowOptions`]): the distribution adjusted before sampling
//! ([`LogitAdjustments`]: logit bias, presence / frequency / repetition penalties, `min_p`),
//! applied to a copy of that row's logits only, so rows without options sample exactly as
//! before; and the log-probabilities of the model (before any adjustment) of each chosen token
//! with its `k` most likely alternatives ([`Event::Logprob`], sent just before its
//! [`Event::Token`]) and, for a completion's `echo`, of every prompt token after the first
//! ([`Event::PromptLogprobs`], before the first token): such a row's prompt chunks ask the
//! model for the outputs of all their positions.
//!
//! A row may carry a grammar ([`Constraint`]: `response_format`, `json_schema`, `grammar`, a
//! required tool call): its logits outside the tokens the grammar allows next become `−∞`
//! before the adjustments and sampling, and the chosen token advances it; the row stops when the
//! grammar is complete, and fails alone ([`Event::Failed`]) when it cannot go on.
//!
//! Rows never interact: a sequence's tokens depend only on its own prompt, options and seed,
//! not on what it is batched with (greedy results equal the single-request results).

use super::engine::{Advance, Engine, Limits, Plan, Reply, RowKind, RowPlan, Stepped};
use super::metrics::{Metrics, PrefixCounts};
use super::prefix_cache::{chain_key, PrefixIndex};
use crate::decode::adjust::{top_entries, LogitAdjustments, TokenHistory};
use crate::decode::constraint::{AllowedTokens, Constraint};
use crate::decode::sample::{sample, SamplingOptions};
use crate::model::LanguageModel;
use crate::rng::Rng;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

mod budget;
mod feed;
mod mask_job;
mod paged_lm;
pub use budget::{PrefillBudget, DEFAULT_PREFILL_STEP_MS};
use budget::StepBudget;
use feed::StepFeed;
use mask_job::MaskJob;
pub use paged_lm::{PagedLm, PagedRows};

/// One generation request, as the HTTP layer hands it to the engine.
#[derive(Debug)]
pub struct GenRequest {
    /// Prompt ids (checked against the vocabulary, at least one).
    pub prompt: Vec<u32>,
    /// Tokens to generate at most (at least one).
    pub max_tokens: usize,
    pub sampling: SamplingOptions,
    /// Adjustments and log-probabilities asked for (default: none).
    pub options: RowOptions,
    /// The grammar the output must follow (default: none).
    pub constraint: Option<Constraint>,
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

/// What a request asks beyond plain sampling (see the module docs); the default asks nothing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RowOptions {
    /// The distribution's adjustments before sampling.
    pub adjust: LogitAdjustments,
    /// Each generated token's log-probability with this many alternatives (`None`: not asked).
    pub logprobs: Option<usize>,
    /// The prompt's tokens' log-probabilities with this many alternatives (`None`: not asked).
    pub prompt_logprobs: Option<usize>,
}

/// A token's log-probability under the model (before any adjustment) and the most likely
/// tokens at its position.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    /// `(token, log-probability)`, most likely first.
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprob {
    /// Token `token` of the log-probabilities `row [vocab]`, with its `k` best alternatives.
    fn of(row: &[f32], token: u32, k: usize) -> Self {
        TokenLogprob {
            token,
            logprob: row[token as usize],
            top: top_entries(row, k),
        }
    }
}

/// What the engine tells a request's handler.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The next token's log-probability (only where asked), just before its [`Event::Token`].
    Logprob(TokenLogprob),
    /// The prompt's tokens after the first, scored (only where asked), before the first token.
    PromptLogprobs(Vec<TokenLogprob>),
    /// The next generated token.
    Token(u32),
    /// Generation ended normally.
    Finished {
        reason: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
        /// Prompt tokens taken from the prefix cache (not computed).
        cached_tokens: usize,
    },
    /// The deadline passed first.
    TimedOut,
    /// The row's grammar could not go on (an unsatisfiable schema): the request fails alone.
    Failed(String),
    /// The model's device failed (lost, or out of memory): every running request ends with
    /// it, and the server refuses new ones (503).
    Unavailable(String),
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
    /// Tokens one forward feeds at most (decode tokens first, then prompt chunks; prompts
    /// get at least a quarter of it): the longest step, and so the longest a new request's
    /// prompt waits behind a long one (`scheduler/feed.rs`); fixed, or timed so a step takes
    /// about a target time (`scheduler/budget.rs`).
    pub prefill_budget: PrefillBudget,
    /// Whether prompts take the cached blocks of equal starts (see the module docs).
    pub prefix_cache: bool,
    /// Rows admitted ahead of one waiting for blocks before nothing passes it
    /// ([`Limits::max_overtakes`]; 0: strict first come, first served).
    pub max_overtakes: usize,
}

impl EngineConfig {
    /// Blocks a request of `prompt` tokens and `max_tokens` new ones reserves.
    pub fn blocks_for(&self, prompt: usize, max_tokens: usize) -> usize {
        prompt
            .saturating_add(max_tokens)
            .div_ceil(self.block_rows.max(1))
    }

    /// Bytes of one block of `model` (keys and values, every layer, in the model's cache
    /// types: float32 by default).
    pub fn block_bytes(model: &LanguageModel<f32>, block_rows: usize) -> usize {
        let d_kv: usize = model.blocks.layers.iter().map(|l| l.self_attn.d_kv()).sum();
        let position = model.kv_types().position_bytes(d_kv, std::mem::size_of::<f32>());
        (position * block_rows as f64).ceil() as usize
    }
}

/// The continuous-batching engine over one language model (see the module docs).
pub type Scheduler<'m, M = LanguageModel<f32>> = Engine<LmRows<'m, M>>;

impl<'m> Scheduler<'m> {
    /// The engine of a model on the CPU.
    pub fn new(model: &'m LanguageModel<f32>, config: EngineConfig, metrics: Arc<Metrics>) -> Self {
        let state = model.start_paged(config.block_rows);
        Self::with_state(model, config, metrics, state)
    }
}

impl<'m, M: PagedLm> Scheduler<'m, M> {
    /// The engine of `model` wherever it runs; its pool allocated now (a device's may fail,
    /// naming the sizes). Prefix caching only where rows can share blocks.
    pub fn paged(model: &'m M, config: EngineConfig, metrics: Arc<Metrics>) -> Result<Self, String> {
        let state = model.start(&config)?;
        Ok(Self::with_state(model, config, metrics, state))
    }

    /// The engine of `model` over its empty `state`.
    fn with_state(
        model: &'m M,
        config: EngineConfig,
        metrics: Arc<Metrics>,
        mut state: M::State,
    ) -> Self {
        let limits = Limits {
            max_batch: config.max_batch,
            pool_blocks: Some(config.pool_blocks),
            max_overtakes: config.max_overtakes,
        };
        let prefix = match (config.prefix_cache, state.shared_blocks()) {
            (true, Some(shared)) => {
                shared.set_block_limit(Some(config.pool_blocks));
                Some(PrefixIndex::new(config.pool_blocks))
            }
            _ => None,
        };
        let kind = LmRows {
            model,
            config,
            state,
            prefix,
            budget: StepBudget::new(config.prefill_budget, rayon::current_num_threads()),
            metrics: metrics.clone(),
            lost: None,
        };
        Engine::with_kind(kind, limits, metrics)
    }
}

/// A request's sequence, waiting or running; its row in the state is its index in the batch.
pub struct Sequence {
    prompt: Vec<u32>,
    max_tokens: usize,
    sampling: SamplingOptions,
    options: RowOptions,
    /// The row's grammar, if any.
    constraint: Option<Constraint>,
    /// The tokens the adjustments read; `None` when the row has none.
    history: Option<TokenHistory>,
    /// Where log-probabilities go (a clone of the reply's sender), when asked.
    scores: Option<UnboundedSender<Event>>,
    /// The prompt's scores gathered over its chunks.
    prompt_scores: Vec<TokenLogprob>,
    stop_ids: Vec<u32>,
    /// Prompt tokens fed so far (taken from the prefix cache included).
    fed: usize,
    /// Prompt tokens taken from the prefix cache.
    cached: usize,
    /// Full blocks registered in the prefix cache (or taken from it), and the chain key of
    /// the last of them.
    keyed: usize,
    chain: u64,
    /// Tokens generated; the last one is fed at the next step unless the sequence finished.
    out: Vec<u32>,
    rng: Rng,
}

/// How a sequence ended, for [`Event::Finished`].
pub struct Ending {
    reason: FinishReason,
    prompt_tokens: usize,
    completion_tokens: usize,
    /// Why the row failed, if it did.
    failed: Option<Failure>,
    cached_tokens: usize,
}

/// Why a row failed.
enum Failure {
    /// Its grammar could not go on.
    Grammar(String),
    /// The model's device failed.
    Device(String),
}

impl Reply for UnboundedSender<Event> {
    type Answer = Ending;
    fn is_closed(&self) -> bool {
        UnboundedSender::is_closed(self)
    }
    fn timed_out(self) {
        let _ = self.send(Event::TimedOut);
    }
    /// Not reached: a language model refuses nothing at submission (the HTTP layer checks).
    fn refuse(self, _message: String) {}
    fn token(&self, token: u32) -> bool {
        self.send(Event::Token(token)).is_ok()
    }
    fn answer(self, answers: Vec<Ending>) {
        for e in answers {
            match e.failed {
                Some(Failure::Grammar(message)) => {
                    let _ = self.send(Event::Failed(message));
                    continue;
                }
                Some(Failure::Device(message)) => {
                    let _ = self.send(Event::Unavailable(message));
                    continue;
                }
                None => {}
            }
            let _ = self.send(Event::Finished {
                reason: e.reason,
                prompt_tokens: e.prompt_tokens,
                completion_tokens: e.completion_tokens,
                cached_tokens: e.cached_tokens,
            });
        }
    }
}

/// The language model's side of the [`Engine`] (see the module docs).
pub struct LmRows<'m, M: PagedLm = LanguageModel<f32>> {
    model: &'m M,
    config: EngineConfig,
    /// The running sequences' caches, one row each.
    state: M::State,
    /// Cached blocks by chain key; `None`: prefix caching is off.
    prefix: Option<PrefixIndex>,
    /// The next step's token budget.
    budget: StepBudget,
    metrics: Arc<Metrics>,
    /// Why the model's device failed; from then on every row ends with it at once.
    lost: Option<String>,
}

impl<M: PagedLm> LmRows<'_, M> {
    /// Row `r` (just added, empty) takes the cached blocks its prompt starts with.
    fn take_cached_prefix(&mut self, r: usize, seq: &mut Sequence) {
        let (Some(index), Some(state)) = (&mut self.prefix, self.state.shared_blocks()) else {
            return;
        };
        let bs = self.config.block_rows;
        let p = seq.prompt.len();
        let max_blocks = match seq.options.prompt_logprobs {
            Some(_) => 0,
            None => p.saturating_sub(1) / bs,
        };
        let hit = index.lookup(&seq.prompt, bs, max_blocks, state);
        state.share_blocks(r, &hit.blocks);
        let taken = hit.blocks.len() * bs;
        (seq.fed, seq.cached, seq.keyed, seq.chain) =
            (taken, taken, hit.blocks.len(), hit.last_key);
        self.metrics.prefix_lookup(PrefixCounts {
            hit_tokens: taken as u64,
            miss_tokens: (p - taken) as u64,
            hit_blocks: hit.blocks.len() as u64,
            miss_blocks: (hit.looked_up - hit.blocks.len()) as u64,
        });
    }

    /// The device failed with `message`: every running row ends with it (and every later
    /// row, at its first step), and the server refuses new requests.
    fn fail_every_row(&mut self, running: &[Sequence], message: String) -> Stepped<Ending> {
        if self.lost.is_none() {
            eprintln!("the model's device failed: {message}");
            self.metrics.set_device_lost(&message);
            self.lost = Some(message.clone());
        }
        let rows = running
            .iter()
            .map(|seq| {
                Advance::Ended(Ending {
                    reason: FinishReason::Stop,
                    prompt_tokens: seq.prompt.len(),
                    completion_tokens: seq.out.len(),
                    failed: Some(Failure::Device(message.clone())),
                    cached_tokens: seq.cached,
                })
            })
            .collect();
        Stepped { fed: 0, rows }
    }

    /// Registers the blocks of row `r` that the last step filled.
    fn register_full_blocks(&mut self, r: usize, seq: &mut Sequence) {
        let (Some(index), Some(state)) = (&mut self.prefix, self.state.shared_blocks()) else {
            return;
        };
        let bs = self.config.block_rows;
        let full = state.row_len(r) / bs;
        let p = seq.prompt.len();
        while seq.keyed < full {
            // The tokens at the block's positions: the prompt's, then the generated ones.
            let tokens: Vec<u32> = (seq.keyed * bs..(seq.keyed + 1) * bs)
                .map(|t| match t < p {
                    true => seq.prompt[t],
                    false => seq.out[t - p],
                })
                .collect();
            let key = chain_key(seq.chain, &tokens);
            if let Some(id) = state.register_block(r, seq.keyed, key) {
                index.insert(key, id, &tokens, state);
            }
            (seq.keyed, seq.chain) = (seq.keyed + 1, key);
        }
    }
}

impl<M: PagedLm> RowKind for LmRows<'_, M> {
    type Request = GenRequest;
    type Reply = UnboundedSender<Event>;
    type Pending = Sequence;
    type Row = Sequence;
    type Answer = Ending;
    const LATENCY_OF_QUEUED_DROPS: bool = false;

    /// One row; an empty prompt (which the HTTP layer refuses) is refused.
    fn plan(&self, req: GenRequest) -> Plan<Self> {
        let empty = req.prompt.is_empty();
        let adjust = &req.options.adjust;
        let history = (!adjust.is_identity())
            .then(|| TokenHistory::new(&req.prompt, adjust.needs_raw_logits()));
        let scored = req.options.logprobs.is_some() || req.options.prompt_logprobs.is_some();
        let sequence = Sequence {
            rng: Rng::new(req.seed),
            prompt: req.prompt,
            max_tokens: req.max_tokens,
            sampling: req.sampling,
            options: req.options,
            constraint: req.constraint,
            history,
            scores: scored.then(|| req.events.clone()),
            prompt_scores: Vec::new(),
            stop_ids: req.stop_ids,
            fed: 0,
            cached: 0,
            keyed: 0,
            chain: 0,
            out: Vec::new(),
        };
        Plan {
            reply: req.events,
            arrived: req.arrived,
            deadline: req.deadline,
            rows: match empty {
                true => Err("the prompt is empty".to_string()),
                false => Ok(vec![RowPlan::Decode(sequence)]),
            },
        }
    }

    fn blocks(&self, seq: &Sequence) -> usize {
        self.config.blocks_for(seq.prompt.len(), seq.max_tokens)
    }

    fn fits(&self, _admitted: &[Sequence], _next: &Sequence) -> bool {
        true
    }

    fn start(&mut self, mut admitted: Vec<Sequence>) -> (Vec<Sequence>, usize) {
        for seq in &mut admitted {
            let r = self.state.add_row();
            self.take_cached_prefix(r, seq);
        }
        (admitted, 0)
    }

    /// The ragged batch: decode tokens first, then prompt chunks under the budget.
    fn step(&mut self, running: &mut [Sequence]) -> Option<Stepped<Ending>> {
        let step_start = Instant::now();
        let budget = self.budget.tokens();
        let mut feed = StepFeed::plan(running, |r| self.state.row_len(r), budget);
        if feed.tokens.is_empty() {
            return None;
        }
        let prefilled: usize = feed.fed.iter().sum();
        let outputs = std::mem::take(&mut feed.outputs);
        let picked: Vec<usize> = outputs
            .iter()
            .map(|&(_, i)| i)
            .chain(feed.prompt_outputs.iter().map(|&(_, i, _)| i))
            .collect();
        let v = self.model.vocab_size();
        // logits: [picked, vocab], then log-probabilities in place (exactly `model.step`'s).
        // The constrained rows' allowed tokens `A_t` depend only on the tokens taken so far:
        // each is a rayon task run beside the forward pass (on whichever worker is idle), so
        // the grammar's trie walk does not wait for the logits nor the logits for it.
        let mut masks: Vec<MaskJob<'_>> = {
            let mut output_of = vec![None; running.len()];
            for (j, &(r, _)) in outputs.iter().enumerate() {
                output_of[r] = Some(j);
            }
            running
                .iter_mut()
                .zip(output_of)
                .filter_map(|(seq, j)| {
                    Some(MaskJob {
                        output: j?,
                        constraint: seq.constraint.as_mut()?,
                        allowed: None,
                        seconds: 0.0,
                    })
                })
                .collect()
        };
        let (model, state, metrics) = (self.model, &mut self.state, &self.metrics);
        let fed_at = (&feed.rows[..], &feed.positions[..]);
        let logits = rayon::in_place_scope(|scope| {
            for job in masks.iter_mut() {
                scope.spawn(move |_| job.run());
            }
            let forward_start = Instant::now();
            let logits = match &self.lost {
                Some(e) => Err(e.clone()),
                None => model.step_logits(state, &feed.tokens, fed_at, &picked),
            };
            metrics.forward(forward_start.elapsed().as_secs_f64());
            logits
        });
        let mut logprobs = match logits {
            Ok(logits) => logits,
            Err(e) => return Some(self.fail_every_row(running, e)),
        };
        self.metrics.constraint_masks(
            masks.len(),
            masks.iter().map(|m| m.seconds).sum(),
        );
        let mut allowed: Vec<Option<crate::error::Result<AllowedTokens>>> =
            (0..outputs.len()).map(|_| None).collect();
        for job in masks {
            allowed[job.output] = job.allowed;
        }
        // The rows whose repetition penalty reads the raw logits keep a copy.
        let mut raw: Vec<Option<Vec<f32>>> = outputs
            .iter()
            .enumerate()
            .map(|(j, &(r, _))| {
                let adjust = &running[r].options.adjust;
                adjust
                    .needs_raw_logits()
                    .then(|| logprobs[j * v..(j + 1) * v].to_vec())
            })
            .collect();
        self.model.log_softmax_rows(&mut logprobs);
        feed.advance(running, &logprobs, outputs.len(), v);
        if self.prefix.is_some() {
            for (r, seq) in running.iter_mut().enumerate() {
                self.register_full_blocks(r, seq);
            }
        }
        // Next tokens.
        let max_len = self.model.max_len();
        let mut advances: Vec<Advance<Ending>> = running.iter().map(|_| Advance::Nothing).collect();
        for (j, &(r, _)) in outputs.iter().enumerate() {
            let seq = &mut running[r];
            let row = &logprobs[j * v..(j + 1) * v];
            let mut failed = None;
            let id = match (&mut seq.history, &seq.constraint) {
                (None, None) => sample(row, seq.sampling, &mut seq.rng),
                (history, _) => {
                    let mut z = raw[j].take().unwrap_or_else(|| row.to_vec());
                    // The grammar's mask first: the adjustments (min_p) see the allowed tokens.
                    match allowed[j].take() {
                        Some(Ok(a)) => a.mask(&mut z),
                        Some(Err(e)) => failed = Some(Failure::Grammar(e.to_string())),
                        None => {}
                    }
                    if let Some(history) = history {
                        seq.options.adjust.apply(&mut z, history);
                    }
                    let id = match failed {
                        // No token may follow: the row ends on an end token, failed.
                        Some(_) => seq.stop_ids.first().copied().unwrap_or(0),
                        None => sample(&z, seq.sampling, &mut seq.rng),
                    };
                    if let Some(history) = history {
                        history.push(id);
                    }
                    id
                }
            };
            let mut complete = false;
            if let (None, Some(c)) = (&failed, &mut seq.constraint) {
                if !seq.stop_ids.contains(&id) {
                    match c.advance(id) {
                        Ok(done) => complete = done,
                        Err(e) => failed = Some(Failure::Grammar(e.to_string())),
                    }
                }
            }
            if let (Some(k), Some(tx)) = (seq.options.logprobs, &seq.scores) {
                let _ = tx.send(Event::Logprob(TokenLogprob::of(row, id, k)));
            }
            seq.out.push(id);
            let finished = if seq.stop_ids.contains(&id) || complete || failed.is_some() {
                Some(FinishReason::Stop)
            } else if seq.out.len() >= seq.max_tokens || self.state.row_len(r) >= max_len {
                Some(FinishReason::Length)
            } else {
                None
            };
            advances[r] = match finished {
                Some(reason) => Advance::Last(
                    id,
                    Ending {
                        reason,
                        prompt_tokens: seq.prompt.len(),
                        completion_tokens: seq.out.len(),
                        failed,
                        cached_tokens: seq.cached,
                    },
                ),
                None => Advance::Token(id),
            };
        }
        self.budget.record(feed.tokens.len(), step_start.elapsed().as_secs_f64());
        Some(Stepped {
            fed: prefilled,
            rows: advances,
        })
    }

    fn keep_rows(&mut self, kept: &[usize]) {
        self.state.keep_rows(kept);
    }

    /// Blocks of `block_rows` positions in every layer.
    fn blocks_in_use(&self) -> usize {
        self.state.blocks_in_use()
    }

    fn blocks_kept(&self) -> usize {
        self.state.blocks_kept()
    }
}
