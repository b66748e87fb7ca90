//! Continuous batching of greedy translation: the [`RowKind`] of the [`Engine`] for
//! translation models, one row per sentence. A request (LibreTranslate's `q`, one or more
//! sentences) is answered when all of its sentences are done.
//!
//! - Admission: the running batch is a ragged [`DecodeState`] (see
//!   [`crate::model::seq2seq_ragged`]) with no pool limit; beyond `max_batch` rows, a step
//!   encodes at most `encode_budget` source tokens, padding included (at least one sentence
//!   per step, so a burst of arrivals cannot stall the running rows for long). The sentences
//!   admitted together are encoded together ([`Seq2Seq::start_decoding`]) and their rows
//!   appended to the running state ([`DecodeState::append`]), each to start from BOS.
//! - A step runs ONE decoder step for all rows, each at its own position
//!   ([`Seq2Seq::step`] with a one-per-row layout), and advances each row greedily ([`advance`]: the
//!   argmax over all tokens but PAD and BOS, ties to the lowest id); a row ends at EOS or at
//!   its limit of `source length + max_len_extra` tokens (capped by the model's `max_len`),
//!   exactly the rules of [`crate::decode::greedy`].
//!
//! Rows never interact, so every sentence gets the tokens it gets translated alone
//! ([`crate::pipeline::translate::Translator::translate`]) whatever it is batched with and
//! whenever it joins. Empty lines are answered without decoding (an empty n-best list), and a
//! request with a line longer than the model takes is refused whole at submission.
//!
//! Metrics (see [`super::engine`]): the running batch is counted in sentences; "KV blocks
//! used" are the blocks of `block_rows` positions held by one decoder layer's self- and
//! cross-attention caches (every layer holds as many; there is no pool limit, so `free` and
//! `reserved` stay 0); a request dropped while queued counts an end-to-end latency.
//!
//! Requests for alternatives (beam n-best), attention maps and embeddings do not come here:
//! [`super::jobs`] runs them between steps.

use super::engine::{Advance, Engine, Limits, Plan, Reply, RowKind, RowPlan, Stepped};
use super::jobs::NbestAnswer;
use super::metrics::Metrics;
use crate::batch::{Batch, BOS};
use crate::decode::beam::{length_penalty, BeamOptions};
use crate::decode::greedy::{advance, max_output_len, Hypothesis};
use crate::decode::TokenRules;
use crate::model::seq2seq::DecodeState;
#[cfg(doc)]
use crate::model::Seq2Seq;
use crate::model::StepLayout;
use crate::pipeline::translate::{encode_sources, Languages, Translator};
use std::sync::Arc;
use std::time::Instant;

/// One request's sentences, as the HTTP layer hands them to the engine.
pub struct TranslateRequest {
    pub lines: Vec<String>,
    /// A multilingual model's languages for this request (checked by the HTTP layer).
    pub languages: Languages,
    /// When it arrived.
    pub arrived: Instant,
    /// When the engine gives up on it (drops it without an answer).
    pub deadline: Instant,
    /// Per sentence its one greedy `(score, text)` (none for an empty line), or an error.
    pub reply: NbestAnswer,
}

/// Source tokens encoded per step (padding included) when `--prefill-budget` is not given: the
/// fixed default every model had before a language model's budget was timed, kept here (a
/// translation step's time is not measured).
pub const DEFAULT_ENCODE_BUDGET: usize = 512;

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

/// The continuous-batching engine over one translation model (see the module docs).
pub type TranslationEngine<'m> = Engine<TranslationRows<'m>>;

impl<'m> TranslationEngine<'m> {
    pub fn new(translator: &'m Translator, config: TranslateConfig, metrics: Arc<Metrics>) -> Self {
        let limits = Limits {
            max_batch: config.max_batch.max(1),
            pool_blocks: None,
            max_overtakes: 0,
        };
        let state = translator.model.start_ragged(config.block_rows.max(1));
        let kind = TranslationRows {
            translator,
            config,
            state,
        };
        Engine::with_kind(kind, limits, metrics)
    }
}

/// A sentence waiting to be encoded.
pub struct Source {
    tokens: Vec<u32>,
    /// Tokens it emits at most, EOS included.
    limit: usize,
    /// Its forced first token (a multilingual model's target language).
    first: Option<u32>,
}

/// A sentence of the running batch.
pub struct Sentence {
    hyp: Hypothesis,
    limit: usize,
    /// Its rules (EOS, the never-emitted tokens, a forced first token).
    rules: TokenRules,
    /// The token it is fed at the next step.
    next: u32,
}

/// One sentence's answer: its `(score, text)`, or nothing for an empty line.
pub type Translation = Vec<(f64, String)>;

impl Reply for NbestAnswer {
    type Answer = Translation;
    fn is_closed(&self) -> bool {
        tokio::sync::oneshot::Sender::is_closed(self)
    }
    /// Dropped without an answer.
    fn timed_out(self) {}
    fn refuse(self, message: String) {
        let _ = self.send(Err(message));
    }
    /// Not streamed: the answer comes whole.
    fn token(&self, _token: u32) -> bool {
        true
    }
    fn answer(self, answers: Vec<Translation>) {
        let _ = self.send(Ok(answers));
    }
}

/// The translation model's side of the [`Engine`] (see the module docs).
pub struct TranslationRows<'m> {
    translator: &'m Translator,
    config: TranslateConfig,
    /// The running sentences' decoder caches and sources, one row each.
    state: DecodeState<f32>,
}

impl TranslationRows<'_> {
    /// `(score, text)` of a finished sentence: its log-probability over the beam's length
    /// penalty, as [`Translator::translate_nbest`] scores a greedy hypothesis.
    fn answer(&self, hyp: &Hypothesis) -> Translation {
        let alpha = BeamOptions::default().alpha;
        let score = hyp.score / length_penalty(hyp.n_emitted(), alpha);
        vec![(score, self.translator.vocab.decode(&hyp.tokens))]
    }
}

impl RowKind for TranslationRows<'_> {
    type Request = TranslateRequest;
    type Reply = NbestAnswer;
    type Pending = Source;
    type Row = Sentence;
    type Answer = Translation;
    const LATENCY_OF_QUEUED_DROPS: bool = true;

    /// A row per non-empty line; refused whole when a line does not fit the model.
    fn plan(&self, req: TranslateRequest) -> Plan<Self> {
        let (model, vocab) = (&self.translator.model, &self.translator.vocab);
        let first = req.languages.target;
        let rows = encode_sources(&req.lines, vocab, req.languages.source, model)
            .map_err(|e| e.to_string())
            .map(|sources| {
                let lines = sources.into_iter().zip(&req.lines);
                lines
                    .map(|(tokens, line)| {
                        let extra = self.config.max_len_extra;
                        let limit = max_output_len(&model.config, tokens.len(), extra);
                        if line.trim().is_empty() {
                            RowPlan::Answered(Vec::new())
                        } else if limit == 0 {
                            RowPlan::Answered(self.answer(&Hypothesis::default()))
                        } else {
                            RowPlan::Decode(Source {
                                tokens,
                                limit,
                                first,
                            })
                        }
                    })
                    .collect()
            });
        Plan {
            reply: req.reply,
            arrived: req.arrived,
            deadline: req.deadline,
            rows,
        }
    }

    fn blocks(&self, _source: &Source) -> usize {
        0
    }

    /// Within the encoding budget: the padded batch of sources, EOS included.
    fn fits(&self, admitted: &[Source], next: &Source) -> bool {
        let longest = admitted.iter().map(|s| s.tokens.len() + 1).max();
        let len = longest.unwrap_or(0).max(next.tokens.len() + 1);
        admitted.is_empty() || (admitted.len() + 1) * len <= self.config.encode_budget
    }

    /// Encodes the sentences together and appends their rows; the source tokens encoded.
    fn start(&mut self, admitted: Vec<Source>) -> (Vec<Sentence>, usize) {
        let pairs: Vec<(&[u32], &[u32])> =
            admitted.iter().map(|s| (&s.tokens[..], &[][..])).collect();
        let batch = Batch::from_pairs(&pairs);
        let model = &self.translator.model;
        let fresh = model.start_decoding(&batch.src, batch.src_len, &batch.src_lens, 1);
        self.state.append(&fresh);
        let rows = admitted.into_iter().map(|s| Sentence {
            hyp: Hypothesis::default(),
            limit: s.limit,
            rules: (TokenRules::TRANSLATION.forcing(s.first))
                .ending_from(self.translator.min_len)
                .ending_at_limit(self.translator.forced_end),
            next: BOS,
        });
        (rows.collect(), batch.n_src_tokens())
    }

    fn step(&mut self, rows: &mut [Sentence]) -> Option<Stepped<Translation>> {
        let tokens: Vec<u32> = rows.iter().map(|r| r.next).collect();
        let model = &self.translator.model;
        let logprobs = model.step(&mut self.state, &tokens, &StepLayout::one_per_row());
        let v = model.config.vocab_size;
        let mut advances = Vec::with_capacity(rows.len());
        for (r, row) in rows.iter_mut().enumerate() {
            let dist = &logprobs[r * v..(r + 1) * v];
            let (token, live) = advance(&mut row.hyp, dist, row.limit, row.rules);
            row.next = token;
            advances.push(match live {
                true => Advance::Token(token),
                false => Advance::Last(token, self.answer(&row.hyp)),
            });
        }
        Some(Stepped {
            fed: 0,
            rows: advances,
        })
    }

    fn keep_rows(&mut self, kept: &[usize]) {
        self.state.gather_rows(kept);
        self.state.gather_sources(kept);
    }

    /// Blocks held by one decoder layer's caches (see the module docs).
    fn blocks_in_use(&self) -> usize {
        self.state.blocks_in_use()
    }
}
