//! The compute loop of translation models and encoders.
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

use super::metrics::{Latency, Metrics};
use super::translate_engine::{TranslateConfig, TranslateRequest, TranslationEngine};
use crate::decode::beam::BeamOptions;
use crate::pipeline::embed::SentenceEncoder;
use crate::pipeline::translate::Translator;
use crate::viz::AttentionMaps;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

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
        inputs: Vec<String>,
        arrived: Instant,
        reply: Answer<(Vec<Vec<f32>>, usize)>,
    },
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

/// Answers jobs until the channel closes (see the module docs). Waits outside the rayon pool
/// when idle; steps and turns run on a pool thread.
pub fn run(
    model: &JobModel,
    mut jobs: Receiver<Job>,
    metrics: &Arc<Metrics>,
    config: TranslateConfig,
) {
    let mut engine = match model {
        JobModel::Translator(t) => Some(TranslationEngine::new(t, config, metrics.clone())),
        JobModel::Encoder(_) => None,
    };
    while let Ok(first) = jobs.recv() {
        // The receiver moves to the pool thread and back (it is Send, not Sync).
        let engine = &mut engine;
        jobs = rayon::scope(move |_| {
            busy(model, engine, first, &jobs, metrics);
            jobs
        });
    }
}

/// Takes what has arrived, runs a turn of the whole jobs and steps the engine, until nothing
/// runs or waits.
fn busy(
    model: &JobModel,
    engine: &mut Option<TranslationEngine<'_>>,
    first: Job,
    jobs: &Receiver<Job>,
    metrics: &Metrics,
) {
    let mut arrived = vec![first];
    loop {
        while let Ok(job) = jobs.try_recv() {
            arrived.push(job);
        }
        let mut whole = Vec::new();
        for job in arrived.drain(..) {
            match (job, engine.as_mut()) {
                (
                    Job::Translate {
                        lines,
                        nbest: 1,
                        arrived,
                        deadline,
                        reply,
                    },
                    Some(engine),
                ) => engine.submit(TranslateRequest {
                    lines,
                    arrived,
                    deadline,
                    reply,
                }),
                (job, _) => whole.push(job),
            }
        }
        if !whole.is_empty() {
            metrics.queued.fetch_sub(whole.len(), Ordering::Relaxed);
            let now = Instant::now();
            whole.retain(|job| !job.closed());
            for job in &whole {
                let waited = (now - job.arrived()).as_secs_f64();
                metrics.observe(Latency::QueueTime, waited);
            }
            turn(model, whole, metrics);
        }
        let Some(engine) = engine.as_mut() else {
            return;
        };
        if !engine.step() {
            if engine.is_idle() {
                return;
            }
            // Not reached: a step with sentences waiting admits at least one.
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// One turn over the jobs taken together.
fn turn(model: &JobModel, batch: Vec<Job>, metrics: &Metrics) {
    let mut translations: Vec<(Vec<String>, usize, Instant, NbestAnswer)> = Vec::new();
    for job in batch {
        match (job, model) {
            (
                Job::Translate {
                    lines,
                    nbest,
                    arrived,
                    reply,
                    ..
                },
                _,
            ) => translations.push((lines, nbest, arrived, reply)),
            (
                Job::Attention {
                    source,
                    arrived,
                    reply,
                },
                JobModel::Translator(t),
            ) => {
                let result = t
                    .attention_maps(&source, None)
                    .map(|(maps, text)| (maps, text.unwrap_or_default()))
                    .map_err(|e| e.to_string());
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
                let tokens: usize = inputs
                    .iter()
                    .map(|s| e.tokenizer.encode(s).map_or(0, |ids| ids.len()))
                    .sum();
                let result = e
                    .embed(&inputs, 32)
                    .map(|v| (v, tokens))
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
    // Requests with the same n-best size: one search over all their sentences.
    type Pending = (Vec<String>, Instant, NbestAnswer);
    let mut groups: BTreeMap<usize, Vec<Pending>> = BTreeMap::new();
    for (lines, nbest, arrived, reply) in translations {
        groups
            .entry(nbest)
            .or_default()
            .push((lines, arrived, reply));
    }
    for (nbest, group) in groups {
        let lines: Vec<String> = group.iter().flat_map(|j| j.0.iter().cloned()).collect();
        match t.translate_nbest(&lines, &beam_for(nbest)) {
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
                    let result = t.translate_nbest(&lines, &beam_for(nbest));
                    let _ = reply.send(result.map_err(|e| e.to_string()));
                    metrics.observe(Latency::EndToEnd, arrived.elapsed().as_secs_f64());
                }
            }
        }
    }
}
