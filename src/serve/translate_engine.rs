//! Continuous batching of greedy translation: sentences join and leave the running decode at
//! every step, the translation counterpart of the language model's [`super::scheduler`].
//!
//! The engine holds one running batch of decoder rows, one per sentence being translated (a
//! ragged [`DecodeState`], see [`crate::model::seq2seq_ragged`]); a request (LibreTranslate's
//! `q`, one or more sentences) is answered when all of its sentences are done. Every
//! iteration ([`TranslationEngine::step`]):
//! 1. drops the rows and waiting sentences of requests whose client went away (their reply
//!    channel is closed) or whose deadline passed; their blocks return to the free lists;
//! 2. admits waiting sentences, first come first served, while the batch has room
//!    (`max_batch` rows) and the step's encoding budget lasts (`encode_budget` source tokens,
//!    padding included; at least one sentence per step, so a burst of arrivals cannot stall the
//!    running rows for long): they are encoded together ([`Seq2Seq::start_decoding`]) and
//!    their rows appended to the running state ([`DecodeState::append`]), each to start from
//!    BOS;
//! 3. runs ONE decoder step for all rows, each at its own position
//!    ([`Seq2Seq::step`] with a one-per-row layout);
//! 4. advances each row greedily ([`advance`]: the argmax over all tokens but PAD and BOS, ties
//!    to the lowest id) and retires the rows that emitted EOS or reached their limit of
//!    `source length + max_len_extra` tokens (capped by the model's `max_len`), exactly the
//!    rules of [`crate::decode::greedy`]. A request whose last sentence is done is answered.
//!
//! Rows never interact, so every sentence gets the tokens it gets translated alone
//! ([`crate::pipeline::translate::Translator::translate`]) whatever it is batched with and
//! whenever it joins. Empty lines are answered without decoding (an empty n-best list), and a
//! request with a line longer than the model takes is refused whole at submission.
//!
//! Metrics: a request leaves the queue (`transformer_queue_length`, queue time) when its first
//! sentence is admitted; its first token is the first token of any of its sentences; its time
//! per output token is the time between the steps that gave it tokens; the running batch is
//! counted in sentences; "KV blocks used" are the blocks of `block_rows` positions held by one
//! decoder layer's self- and cross-attention caches (every layer holds as many; there is no
//! pool limit, so `free` and `reserved` stay 0).
//!
//! Requests for alternatives (beam n-best), attention maps and embeddings do not come here:
//! [`super::jobs`] runs them between steps.

use super::jobs::NbestAnswer;
use super::metrics::{EngineGauges, Latency, Metrics};
use crate::batch::{Batch, BOS};
use crate::decode::beam::{length_penalty, BeamOptions};
use crate::decode::greedy::{advance, max_output_len, Hypothesis};
use crate::decode::TokenRules;
use crate::model::seq2seq::DecodeState;
#[cfg(doc)]
use crate::model::Seq2Seq;
use crate::model::StepLayout;
use crate::pipeline::translate::{encode_sources, Translator};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// One request's sentences, as the HTTP layer hands them to the engine.
pub struct TranslateRequest {
    pub lines: Vec<String>,
    /// When it arrived.
    pub arrived: Instant,
    /// When the engine gives up on it (drops it without an answer).
    pub deadline: Instant,
    /// Per sentence its one greedy `(score, text)` (none for an empty line), or an error.
    pub reply: NbestAnswer,
}

/// Sizes of the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TranslateConfig {
    /// Positions per KV block.
    pub block_rows: usize,
    /// Sentences in the running batch at most.
    pub max_batch: usize,
    /// Source tokens (padding included) encoded per step at most, beyond the first sentence.
    pub encode_budget: usize,
    /// A sentence emits at most `source length + max_len_extra` tokens, EOS included.
    pub max_len_extra: usize,
}

/// A request being answered.
struct Request {
    reply: NbestAnswer,
    arrived: Instant,
    deadline: Instant,
    /// Per sentence its answer, once done.
    answers: Vec<Option<Vec<(f64, String)>>>,
    /// Sentences not done yet.
    left: usize,
    /// Whether a sentence has been admitted (the request has left the queue).
    admitted: bool,
    first_token: Option<Instant>,
    /// Steps that gave it tokens.
    steps: usize,
}

/// A sentence waiting to be encoded.
struct Waiting {
    request: u64,
    index: usize,
    source: Vec<u32>,
    limit: usize,
}

/// A sentence of the running batch; its row in the state is its index in `rows`.
struct Row {
    request: u64,
    index: usize,
    hyp: Hypothesis,
    limit: usize,
    /// The token it is fed at the next step.
    next: u32,
}

/// The continuous-batching engine over one translation model (see the module docs).
pub struct TranslationEngine<'m> {
    translator: &'m Translator,
    config: TranslateConfig,
    state: DecodeState<f32>,
    rows: Vec<Row>,
    waiting: VecDeque<Waiting>,
    requests: BTreeMap<u64, Request>,
    next_id: u64,
    metrics: Arc<Metrics>,
}

impl<'m> TranslationEngine<'m> {
    pub fn new(translator: &'m Translator, config: TranslateConfig, metrics: Arc<Metrics>) -> Self {
        let state = translator.model.start_ragged(config.block_rows.max(1));
        let engine = TranslationEngine {
            translator,
            config,
            state,
            rows: Vec::new(),
            waiting: VecDeque::new(),
            requests: BTreeMap::new(),
            next_id: 0,
            metrics,
        };
        engine.metrics.set_gauges(engine.gauges());
        engine
    }

    /// Queues a request (the HTTP layer counted it in `metrics.queued`). A line the model
    /// cannot take refuses the request at once; a request of empty lines only is answered at
    /// once.
    pub fn submit(&mut self, req: TranslateRequest) {
        let (model, vocab) = (&self.translator.model, &self.translator.vocab);
        let sources = match encode_sources(&req.lines, vocab, model) {
            Ok(s) => s,
            Err(e) => {
                self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
                let _ = req.reply.send(Err(e.to_string()));
                return;
            }
        };
        let id = self.next_id;
        self.next_id += 1;
        let mut answers = vec![None; sources.len()];
        for (index, source) in sources.into_iter().enumerate() {
            let limit = max_output_len(&model.config, source.len(), self.config.max_len_extra);
            if req.lines[index].trim().is_empty() {
                answers[index] = Some(Vec::new());
            } else if limit == 0 {
                answers[index] = Some(vec![self.answer(&Hypothesis::default())]);
            } else {
                self.waiting.push_back(Waiting {
                    request: id,
                    index,
                    source,
                    limit,
                });
            }
        }
        let left = answers.iter().filter(|a| a.is_none()).count();
        let request = Request {
            reply: req.reply,
            arrived: req.arrived,
            deadline: req.deadline,
            answers,
            left,
            admitted: false,
            first_token: None,
            steps: 0,
        };
        if left == 0 {
            self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
            let now = Instant::now();
            let waited = (now - request.arrived).as_secs_f64();
            self.metrics.observe(Latency::QueueTime, waited);
            self.finish(request, now);
        } else {
            self.requests.insert(id, request);
        }
    }

    /// Nothing running and nothing waiting.
    pub fn is_idle(&self) -> bool {
        self.rows.is_empty() && self.waiting.is_empty()
    }

    /// Sentences in the running batch.
    pub fn running(&self) -> usize {
        self.rows.len()
    }

    /// Sentences waiting to be encoded.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Blocks held by one decoder layer's caches (see the module docs).
    pub fn blocks_in_use(&self) -> usize {
        self.state.blocks_in_use()
    }

    fn gauges(&self) -> EngineGauges {
        EngineGauges {
            running: self.rows.len(),
            kv_blocks_used: self.blocks_in_use(),
            kv_blocks_free: 0,
            kv_blocks_reserved: 0,
        }
    }

    /// `(score, text)` of a finished sentence: its log-probability over the beam's length
    /// penalty, as [`Translator::translate_nbest`] scores a greedy hypothesis.
    fn answer(&self, hyp: &Hypothesis) -> (f64, String) {
        let alpha = BeamOptions::default().alpha;
        let score = hyp.score / length_penalty(hyp.n_emitted(), alpha);
        (score, self.translator.vocab.decode(&hyp.tokens))
    }

    /// Answers a request whose sentences are all done.
    fn finish(&self, request: Request, now: Instant) {
        if let Some(first) = request.first_token {
            if request.steps > 1 {
                let per_token = (now - first).as_secs_f64() / (request.steps - 1) as f64;
                self.metrics.observe(Latency::TimePerOutputToken, per_token);
            }
        }
        let e2e = (now - request.arrived).as_secs_f64();
        self.metrics.observe(Latency::EndToEnd, e2e);
        let answers = request.answers.into_iter().map(Option::unwrap_or_default);
        let _ = request.reply.send(Ok(answers.collect()));
    }

    /// Keeps the rows whose `keep` is set; the others leave the state, their blocks freed.
    fn retain_rows(&mut self, keep: &[bool]) {
        if keep.iter().all(|&k| k) {
            return;
        }
        let kept: Vec<usize> = (0..keep.len()).filter(|&r| keep[r]).collect();
        self.state.gather_rows(&kept);
        self.state.gather_sources(&kept);
        let mut k = keep.iter();
        self.rows.retain(|_| *k.next().unwrap_or(&false));
    }

    /// Drops the requests whose client went away or whose deadline passed.
    fn drop_abandoned(&mut self, now: Instant) {
        let gone: Vec<u64> = self
            .requests
            .iter()
            .filter(|(_, r)| r.reply.is_closed() || r.deadline <= now)
            .map(|(&id, _)| id)
            .collect();
        if gone.is_empty() {
            return;
        }
        for id in &gone {
            if let Some(r) = self.requests.remove(id) {
                if !r.admitted {
                    self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
                }
                let e2e = (now - r.arrived).as_secs_f64();
                self.metrics.observe(Latency::EndToEnd, e2e);
            }
        }
        let keep: Vec<bool> = self
            .rows
            .iter()
            .map(|r| !gone.contains(&r.request))
            .collect();
        self.retain_rows(&keep);
        self.waiting.retain(|w| !gone.contains(&w.request));
    }

    /// Encodes the sentences admitted now and appends their rows; returns the source tokens
    /// encoded.
    fn admit(&mut self, now: Instant) -> usize {
        let mut admitted: Vec<Waiting> = Vec::new();
        let mut longest = 0;
        while let Some(next) = self.waiting.front() {
            if self.rows.len() + admitted.len() >= self.config.max_batch.max(1) {
                break;
            }
            // The padded batch of sources, EOS included.
            let len = longest.max(next.source.len() + 1);
            if !admitted.is_empty() && (admitted.len() + 1) * len > self.config.encode_budget {
                break;
            }
            longest = len;
            let Some(next) = self.waiting.pop_front() else {
                break;
            };
            if let Some(r) = self.requests.get_mut(&next.request) {
                if !r.admitted {
                    r.admitted = true;
                    self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
                    let waited = (now - r.arrived).as_secs_f64();
                    self.metrics.observe(Latency::QueueTime, waited);
                }
            }
            admitted.push(next);
        }
        if admitted.is_empty() {
            return 0;
        }
        let pairs: Vec<(&[u32], &[u32])> =
            admitted.iter().map(|w| (&w.source[..], &[][..])).collect();
        let batch = Batch::from_pairs(&pairs);
        let model = &self.translator.model;
        let fresh = model.start_decoding(&batch.src, batch.src_len, &batch.src_lens, 1);
        self.state.append(&fresh);
        self.rows.extend(admitted.into_iter().map(|w| Row {
            request: w.request,
            index: w.index,
            hyp: Hypothesis::default(),
            limit: w.limit,
            next: BOS,
        }));
        batch.n_src_tokens()
    }

    /// One iteration (see the module docs). Returns false when there was nothing to run.
    pub fn step(&mut self) -> bool {
        let now = Instant::now();
        self.drop_abandoned(now);
        let encoded = self.admit(now);
        if self.rows.is_empty() {
            self.metrics.set_gauges(self.gauges());
            return false;
        }
        let tokens: Vec<u32> = self.rows.iter().map(|r| r.next).collect();
        let model = &self.translator.model;
        let logprobs = model.step(&mut self.state, &tokens, &StepLayout::one_per_row());
        let v = model.config.vocab_size;
        let now = Instant::now();
        let mut keep = vec![true; self.rows.len()];
        let mut done: Vec<(u64, usize, (f64, String))> = Vec::new();
        let mut stepped: Vec<u64> = Vec::new();
        for (r, row) in self.rows.iter_mut().enumerate() {
            let dist = &logprobs[r * v..(r + 1) * v];
            let (token, live) = advance(&mut row.hyp, dist, row.limit, TokenRules::TRANSLATION);
            row.next = token;
            keep[r] = live;
            if !stepped.contains(&row.request) {
                stepped.push(row.request);
            }
        }
        for id in &stepped {
            if let Some(req) = self.requests.get_mut(id) {
                req.steps += 1;
                if req.first_token.is_none() {
                    req.first_token = Some(now);
                    let ttft = (now - req.arrived).as_secs_f64();
                    self.metrics.observe(Latency::TimeToFirstToken, ttft);
                }
            }
        }
        for (r, row) in self.rows.iter().enumerate() {
            if !keep[r] {
                done.push((row.request, row.index, self.answer(&row.hyp)));
            }
        }
        let generated = self.rows.len();
        // Finished rows leave before their clients hear: one that has its answer sees the
        // running batch without it.
        self.retain_rows(&keep);
        self.metrics.step(self.gauges(), encoded, generated);
        for (id, index, answer) in done {
            let Some(req) = self.requests.get_mut(&id) else {
                continue;
            };
            req.answers[index] = Some(vec![answer]);
            req.left -= 1;
            if req.left == 0 {
                if let Some(req) = self.requests.remove(&id) {
                    self.finish(req, now);
                }
            }
        }
        true
    }
}
