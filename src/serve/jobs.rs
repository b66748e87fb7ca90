//! The compute loop of translation models and encoders: whole jobs (a request's sentences),
//! not token streams.
//!
//! Each turn takes every job that has arrived, drops those whose client went away, and runs
//! the translation jobs of the same settings (n-best size) as ONE call of the existing batched
//! search ([`Translator::translate_nbest`]: beam search, sentences sorted by length and decoded
//! in batches), so sentences of concurrent requests share decoding steps; then the attention-map
//! and embedding jobs. Sentences arriving during a turn join the next turn (micro-batching at
//! request boundaries; the language model's engine, [`super::scheduler`], admits at every
//! step).

use super::metrics::{Latency, Metrics};
use crate::decode::beam::BeamOptions;
use crate::pipeline::embed::SentenceEncoder;
use crate::pipeline::translate::Translator;
use crate::viz::AttentionMaps;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::time::Instant;
use tokio::sync::oneshot;

/// What a job's answer is: its result, or the message of a 400.
pub type Answer<T> = oneshot::Sender<Result<T, String>>;

/// The answer of a translation job: per sentence, the n-best `(score, text)`, best first.
pub type NbestAnswer = Answer<Vec<Vec<(f64, String)>>>;

/// One request's work.
pub enum Job {
    /// Translations of `lines`, `nbest` best each (best first) with their scores.
    Translate {
        lines: Vec<String>,
        nbest: usize,
        arrived: Instant,
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

/// Answers jobs until the channel closes (see the module docs). Waits outside the rayon pool;
/// each turn runs on a pool thread.
pub fn run(model: &JobModel, jobs: Receiver<Job>, metrics: &Metrics) {
    loop {
        let Ok(first) = jobs.recv() else { return };
        let mut batch = vec![first];
        while let Ok(job) = jobs.try_recv() {
            batch.push(job);
        }
        metrics.queued.fetch_sub(batch.len(), Ordering::Relaxed);
        let now = Instant::now();
        batch.retain(|job| !job.closed());
        for job in &batch {
            let waited = (now - job.arrived()).as_secs_f64();
            metrics.observe(Latency::QueueTime, waited);
        }
        rayon::scope(|_| turn(model, batch, metrics));
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
