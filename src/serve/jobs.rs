//! The jobs of translation models and encoders.
//!
//! Greedy translations (LibreTranslate requests without `alternatives`) go to the
//! continuous-batching engine, [`TranslationEngine`]: their sentences join the running decode
//! at the next step and leave it when done. Everything else is a whole job run between two
//! steps of that engine, in turns: each turn takes every such job that has arrived, drops those
//! whose client went away, and runs the translation jobs of the same settings (n-best size) as
//! ONE call of the batched beam search ([`Translator::translate_nbest`]: sentences sorted by
//! length and decoded in batches), so sentences of concurrent requests share decoding steps;
//! then the attention-map and embedding jobs. A beam job arriving during a turn waits for the
//! next one, and the running greedy rows wait for the turn to end (beam n-best requests are
//! micro-batched at request boundaries, not per step).

use super::compute_loop::{self, Worker};
use super::metrics::{Latency, Metrics};
use super::translate_engine::{TranslateConfig, TranslateRequest, TranslationEngine};
use crate::decode::beam::BeamOptions;
use crate::pipeline::embed::SentenceEncoder;
use crate::pipeline::translate::{Languages, Translator};
use crate::viz::AttentionMaps;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

/// Attention weights one `/attention` answer may hold at most (about 12 MB of JSON): a long
/// sentence's maps grow as tokens² × heads × layers.
pub const MAX_ATTENTION_WEIGHTS: usize = 1_000_000;

/// The attention weights of `source` (its tokens, and a translation of at most
/// `source + max_len_extra` tokens within the context) in every map, or the message of the 400
/// that refuses it over [`MAX_ATTENTION_WEIGHTS`].
fn attention_size(t: &Translator, source: &str) -> Result<usize, String> {
    let c = &t.model.config;
    let s = t.vocab.encode(source).len();
    let extra = crate::decode::GreedyOptions::default().max_len_extra;
    let n = (s + extra).min(c.max_len);
    // Encoder self-attention s x s, decoder self-attention n x n, cross-attention n x s.
    let weights = c.n_heads * (c.n_encoder_layers * s * s + c.n_decoder_layers * (n * n + n * s));
    if weights > MAX_ATTENTION_WEIGHTS {
        return Err(format!(
            "q: the attention maps of {s} source tokens (and up to {n} target tokens) would hold {weights} weights (tokens x tokens x {} heads x {} + {} layers); the limit is {MAX_ATTENTION_WEIGHTS}: send a shorter sentence",
            c.n_heads, c.n_encoder_layers, c.n_decoder_layers
        ));
    }
    Ok(weights)
}

/// What a job's answer is: its result, or the message of a 400.
pub type Answer<T> = oneshot::Sender<Result<T, String>>;

/// The answer of a translation job: per sentence, the n-best `(score, text)`, best first.
pub type NbestAnswer = Answer<Vec<Vec<(f64, String)>>>;

/// One request's work.
pub enum Job {
    /// Translations of `lines`, `nbest` best each (best first) with their scores: greedy for
    /// `nbest == 1`, beam search for more.
    Translate {
        lines: Vec<String>,
        /// A multilingual model's languages (checked by the HTTP layer).
        languages: Languages,
        nbest: usize,
        arrived: Instant,
        /// When the engine gives up on it.
        deadline: Instant,
        reply: NbestAnswer,
    },
    /// The greedy translation of `source` and every attention map.
    Attention {
        source: String,
        arrived: Instant,
        reply: Answer<(AttentionMaps, String)>,
    },
    /// Sentence embeddings, with the number of word pieces of each.
    Embed {
        inputs: EmbedInput,
        arrived: Instant,
        reply: Answer<(Vec<Vec<f32>>, usize)>,
    },
}

/// What `/v1/embeddings` embeds: texts, or sequences of the model's token ids (as given).
#[derive(Debug)]
pub enum EmbedInput {
    Texts(Vec<String>),
    Ids(Vec<Vec<u32>>),
}

impl Job {
    fn closed(&self) -> bool {
        match self {
            Job::Translate { reply, .. } => reply.is_closed(),
            Job::Attention { reply, .. } => reply.is_closed(),
            Job::Embed { reply, .. } => reply.is_closed(),
        }
    }

    fn arrived(&self) -> Instant {
        match self {
            Job::Translate { arrived, .. }
            | Job::Attention { arrived, .. }
            | Job::Embed { arrived, .. } => *arrived,
        }
    }
}

/// A loaded model that answers jobs.
pub enum JobModel {
    Translator(Box<Translator>),
    Encoder(Box<SentenceEncoder>),
}

/// Beam settings for `nbest` hypotheses: the paper's beam of 4, or wider when more are asked.
fn beam_for(nbest: usize) -> BeamOptions {
    BeamOptions {
        beam_size: nbest.max(4),
        nbest,
        ..BeamOptions::default()
    }
}

/// Answers jobs until the channel closes (see the module docs), on the compute loop that the
/// language model's engine runs on too ([`compute_loop::run`]).
pub fn run(model: &JobModel, jobs: Receiver<Job>, metrics: &Arc<Metrics>, config: TranslateConfig) {
    let engine = match model {
        JobModel::Translator(t) => Some(TranslationEngine::new(t, config, metrics.clone())),
        JobModel::Encoder(_) => None,
    };
    let mut runner = Runner {
        model,
        engine,
        whole: Vec::new(),
        metrics,
    };
    compute_loop::run(&mut runner, jobs);
}

/// The engine of greedy translations, and the whole jobs waiting for the next turn.
struct Runner<'m> {
    model: &'m JobModel,
    engine: Option<TranslationEngine<'m>>,
    whole: Vec<Job>,
    metrics: &'m Metrics,
}

impl Worker for Runner<'_> {
    type Input = Job;

    /// A greedy translation joins the engine; anything else waits for the next turn.
    fn take(&mut self, job: Job) {
        match (job, self.engine.as_mut()) {
            (
                Job::Translate {
                    lines,
                    languages,
                    nbest: 1,
                    arrived,
                    deadline,
                    reply,
                },
                Some(engine),
            ) => engine.submit(TranslateRequest {
                lines,
                // A model of one pair with tokens of its own (BART) gets them here.
                languages: match self.model {
                    JobModel::Translator(t) => t.check_languages(languages).unwrap_or(languages),
                    JobModel::Encoder(_) => languages,
                },
                arrived,
                deadline,
                reply,
            }),
            (job, _) => self.whole.push(job),
        }
    }

    /// A turn of the whole jobs taken, then a step of the engine.
    fn work(&mut self) -> bool {
        if !self.whole.is_empty() {
            let mut whole = std::mem::take(&mut self.whole);
            let metrics = self.metrics;
            metrics.queued.fetch_sub(whole.len(), Ordering::Relaxed);
            let now = Instant::now();
            whole.retain(|job| !job.closed());
            for job in &whole {
                let waited = (now - job.arrived()).as_secs_f64();
                metrics.observe(Latency::QueueTime, waited);
            }
            turn(self.model, whole, metrics);
        }
        self.engine.as_mut().is_some_and(TranslationEngine::step)
    }

    fn is_idle(&self) -> bool {
        self.whole.is_empty() && self.engine.as_ref().is_none_or(TranslationEngine::is_idle)
    }
}

/// One turn over the jobs taken together.
fn turn(model: &JobModel, batch: Vec<Job>, metrics: &Metrics) {
    let mut translations: Vec<(Vec<String>, Languages, usize, Instant, NbestAnswer)> = Vec::new();
    for job in batch {
        match (job, model) {
            (
                Job::Translate {
                    lines,
                    languages,
                    nbest,
                    arrived,
                    reply,
                    ..
                },
                _,
            ) => translations.push((lines, languages, nbest, arrived, reply)),
            (
                Job::Attention {
                    source,
                    arrived,
                    reply,
                },
                JobModel::Translator(t),
            ) => {
                let result = attention_size(t, &source).and_then(|_| {
                    t.attention_maps(&source, None)
                        .map(|(maps, text)| (maps, text.unwrap_or_default()))
                        .map_err(|e| e.to_string())
                });
                let _ = reply.send(result);
                metrics.observe(Latency::EndToEnd, arrived.elapsed().as_secs_f64());
            }
            (
                Job::Embed {
                    inputs,
                    arrived,
                    reply,
                },
                JobModel::Encoder(e),
            ) => {
                let ids = match inputs {
                    EmbedInput::Texts(texts) => texts
                        .iter()
                        .map(|s| e.tokenizer.encode(s))
                        .collect::<crate::error::Result<Vec<_>>>(),
                    EmbedInput::Ids(ids) => Ok(ids),
                };
                let result = ids
                    .and_then(|ids| {
                        let tokens: usize = ids.iter().map(Vec::len).sum();
                        e.embed_ids(&ids, 32).map(|v| (v, tokens))
                    })
                    .map_err(|e| e.to_string());
                let _ = reply.send(result);
                metrics.observe(Latency::EndToEnd, arrived.elapsed().as_secs_f64());
            }
            (Job::Attention { reply, .. }, _) => {
                let _ = reply.send(Err("this model is not a translation model".into()));
            }
            (Job::Embed { reply, .. }, _) => {
                let _ = reply.send(Err("this model is not an encoder".into()));
            }
        }
    }
    let JobModel::Translator(t) = model else {
        for (.., reply) in translations {
            let _ = reply.send(Err("this model is not a translation model".into()));
        }
        return;
    };
    // Requests with the same n-best size and languages: one search over all their sentences.
    type Pending = (Vec<String>, Instant, NbestAnswer);
    let mut groups: BTreeMap<(usize, Languages), Vec<Pending>> = BTreeMap::new();
    for (lines, languages, nbest, arrived, reply) in translations {
        groups
            .entry((nbest, languages))
            .or_default()
            .push((lines, arrived, reply));
    }
    for ((nbest, languages), group) in groups {
        let lines: Vec<String> = group.iter().flat_map(|j| j.0.iter().cloned()).collect();
        match t.translate_nbest_in(languages, &lines, &beam_for(nbest)) {
            Ok(all) => {
                let mut start = 0;
                for (lines, arrived, reply) in group {
                    let n = lines.len();
                    let _ = reply.send(Ok(all[start..start + n].to_vec()));
                    start += n;
                    metrics.observe(Latency::EndToEnd, arrived.elapsed().as_secs_f64());
                }
            }
            // A sentence that does not fit refuses the whole search: each request alone, so
            // only the one that sent it gets the error.
            Err(_) => {
                for (lines, arrived, reply) in group {
                    let result = t.translate_nbest_in(languages, &lines, &beam_for(nbest));
                    let _ = reply.send(result.map_err(|e| e.to_string()));
                    metrics.observe(Latency::EndToEnd, arrived.elapsed().as_secs_f64());
                }
            }
        }
    }
}
