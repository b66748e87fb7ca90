//! Beam search with length normalisation, as in the paper (section 6.1: beam size 4, length
//! penalty α = 0.6, maximum output length input length + 50), batched over sentences with the
//! decoder's key/value caches.
//!
//! Conventions (shared with [`super::greedy`] where they overlap):
//! - sources are token ids without specials; EOS is appended here. A source longer than
//!   `config.max_len - 1` tokens is truncated to fit the position table.
//! - a hypothesis emits at most [`max_output_len`](super::greedy::max_output_len) tokens, EOS included.
//! - PAD and BOS are never emitted; with [`BeamOptions::forced_end`] every beam still alive at
//!   the limit ends with EOS there (transformers' `forced_eos_token_id`).
//! - the length penalty is GNMT's `lp(Y) = ((5 + |Y|) / 6)^α` ([`length_penalty`]) and a
//!   hypothesis is ranked by `log p(Y | X) / lp(Y)`. `|Y|` counts the emitted tokens **including
//!   the closing EOS** (the tokens whose log-probabilities make up `log p`); a hypothesis that
//!   reaches the length limit without EOS has `|Y|` = the limit and competes, unfinished, with
//!   the finished ones on the same footing (so that beam size 1 returns what greedy returns).
//!
//! The search, per step and per sentence (the rule of fairseq's search):
//! - every live beam's step distribution gives candidates `(beam, token)` with raw score
//!   `log p(prefix) + log p(token)`, ranked by raw score (ties: lower beam, then lower id);
//! - EOS candidates ranked within the top `k` become finished hypotheses, and so do all top-`k`
//!   candidates at the sentence's last allowed step; the `k` best other candidates are the next
//!   live beams. The `k` best finished hypotheses (by normalised score) are kept.
//! - with `k = 1` this is greedy search until greedy emits EOS; with α = 0 it stops there (see
//!   below), so it returns greedy's output (up to floating-point ties).
//!
//! Stopping: a sentence stops at its length limit, or as soon as it holds `k` finished
//! hypotheses and no live beam can still beat the worst of them. Extending a live beam only adds
//! log-probabilities `<= 0`, so a beam with raw score `r` after `t` tokens can reach at best
//! `r / max(lp(t+1), lp(limit))` (the most optimistic normalisation: for α >= 0, lp grows with
//! length and the largest is at the limit). When that bound of the best live beam is below the
//! `k`-th finished score, no continuation can enter the kept list and the sentence is done. The
//! returned n-best lists are therefore exactly the top of what the beam rule explores. That is
//! the default ([`BeamStop::Exact`]); with α > 0 the bound is loose (lp at the limit is large),
//! so sentences often run many steps past their k-th finished hypothesis.
//! [`BeamStop::FirstK`] stops as soon as `k` hypotheses are finished, as CTranslate2, fairseq
//! and Hugging Face (`early_stopping=True`) do; [`BeamStop::HuggingFace`] is `generate`'s own
//! rule (its penalty `|Y|^α` and its stopping heuristic), to give its outputs.
//!
//! Where runtimes differ in detail, [`BeamRules`] says whose search to reproduce: ours (scores
//! summed exactly) or CTranslate2's (scores summed in f32; after a forced first token, only the
//! step's best candidate may end a hypothesis).
//!
//! The search ([`search_rows`]) is written over [`IncrementalDecoder`]; [`beam_search`] is
//! translation with it (the sources encoded once per chunk, every beam from BOS).
//!
//! Batching: all live beams of all sentences of a chunk (sentences sorted by length, at most
//! `batch_size` per chunk) advance in one step, one row of the KV caches per beam. After each
//! step the rows are re-gathered so that each new beam inherits its parent's row
//! ([`KvCache::gather_rows`](crate::model::kv_cache::KvCache::gather_rows) rewrites block tables;
//! with the decoder's one position per block, no key or value is copied). The translator's
//! cross-attention caches keep one row per sentence, not per beam
//! ([`DecodingState::gather_sources`]): all beams of a sentence read the same encoder keys and
//! values, so its `g` beam rows are `g` queries against one copy (`k` times less cache to read).
//! This needs the same number of beams in every live sentence, which the rule above gives (one
//! at the first step, then `k`, or fewer on a vocabulary too small for `k`); should a step ever
//! differ, the source rows are repeated to one per beam for it. The source rows are re-gathered
//! only when that layout or the set of live sentences changes.
//! Rows never interact, so results do not depend on the batching (up to floating-point ties).
//! With two or more threads whole chunks run side by side, one per thread
//! (`decode_chunks`), bit-identical to one thread.

use super::{decode_chunks, in_input_order, source_chunks, DecodingState, IncrementalDecoder, TokenRules};
use crate::batch::{Batch, BOS};
use crate::model::seq2seq::Seq2Seq;
use crate::model::StepLayout;
use crate::Float;
use rayon::prelude::*;

/// The largest beam the command line accepts (`--beam`, `--nbest`): a sentence decodes up to
/// this many rows, each with its cache.
// Used by the binary (feature `cli`) and outside the library (feature `internals`).
#[cfg_attr(not(any(feature = "cli", feature = "internals")), allow(dead_code))]
pub const MAX_BEAM: u32 = 256;

/// Search settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BeamOptions {
    /// Beams per sentence, `k` (at least one is used).
    pub beam_size: usize,
    /// Length-penalty exponent α (0: rank by raw log-probability).
    pub alpha: f64,
    /// A hypothesis emits at most `source length + max_len_extra` tokens (EOS included), also
    /// capped by the model's `max_len`.
    pub max_len_extra: usize,
    /// Sentences decoded together (each with up to `beam_size` rows); at least one.
    pub batch_size: usize,
    /// Hypotheses returned per sentence, clamped to `1..=beam_size`.
    pub nbest: usize,
    /// When a sentence stops before its length limit.
    pub stop: BeamStop,
    /// A token every hypothesis starts with, forced with log-probability 0 (a multilingual
    /// model's target language; it counts as emitted).
    pub forced_first: Option<u32>,
    /// EOS is not emitted before this many tokens are (`forced_first` counted): CTranslate2's
    /// `min_decoding_length`; 0 for none.
    pub min_len: usize,
    /// EOS is forced as the last token a hypothesis may emit (transformers'
    /// `forced_eos_token_id`, see `TokenRules::end_at_limit`): every beam alive at the
    /// limit ends there, finished.
    pub forced_end: bool,
    /// Whose search to reproduce where runtimes differ in detail (ours, or CTranslate2's).
    pub beam_rules: BeamRules,
}

/// Whose beam search to reproduce where runtimes differ in detail: how a beam's score adds up,
/// and what the step after a forced first token lets EOS do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BeamRules {
    /// Ours: a beam's score is the exact sum (in f64) of its tokens' log-probabilities, and the
    /// step after a forced first token is like any other (transformers' `forced_bos_token_id`).
    #[default]
    Ours,
    /// CTranslate2's: a beam's score is summed in f32, rounded at every step as it adds it
    /// (near ties between beams fall as they fall there); and after a forced first token (its
    /// `target_prefix`, returned with the output) only the step's best candidate may be EOS,
    /// ending the empty translation: an EOS ranked below it ends nothing and takes the place of
    /// one of the step's `k` beams, which that step then lacks (it gives such candidates a
    /// score of −10¹⁰, so that short translations do not crowd out the others without a length
    /// penalty: its issue #277).
    CTranslate2,
}

impl BeamRules {
    /// A beam's score `raw` after a token of log-probability `lp`.
    fn add(self, raw: f64, lp: f64) -> f64 {
        match self {
            BeamRules::Ours => raw + lp,
            BeamRules::CTranslate2 => f64::from(raw as f32 + lp as f32),
        }
    }
}

/// When a sentence's search ends before its length limit (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum BeamStop {
    /// Once `k` hypotheses are finished and no live beam can still beat the worst of them: the
    /// n-best list is exactly the top of what the beam rule explores.
    #[default]
    Exact,
    /// As soon as `k` hypotheses are finished, as CTranslate2 (patience 1), fairseq and
    /// Hugging Face's `early_stopping=True` do: fewer steps, at the price of a better hypothesis
    /// a live beam would still have reached.
    FirstK,
    /// Hugging Face `generate`'s rule (`num_beams`, `length_penalty` α, `early_stopping=False`,
    /// its default): hypotheses ranked by `log p / |Y|^α` instead of GNMT's penalty, and a
    /// sentence stops once `k` are finished and its best live beam's raw score over `t^α` (`t`
    /// tokens emitted so far) is no better than the worst of them.
    HuggingFace,
}

impl Default for BeamOptions {
    /// The paper's settings: beam 4, α = 0.6, input length + 50; the best hypothesis only.
    fn default() -> Self {
        BeamOptions {
            beam_size: 4,
            alpha: 0.6,
            max_len_extra: 50,
            batch_size: 32,
            nbest: 1,
            stop: BeamStop::Exact,
            forced_first: None,
            min_len: 0,
            forced_end: false,
            beam_rules: BeamRules::Ours,
        }
    }
}

/// One hypothesis of an n-best list.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BeamHypothesis {
    /// Output token ids, without BOS and EOS.
    pub tokens: Vec<u32>,
    /// `log p(tokens [EOS] | source)`: the sum of the emitted tokens' log-probabilities, the
    /// closing EOS included when `finished`.
    pub logprob: f64,
    /// `logprob / length_penalty(n_emitted, alpha)`, the ranking score.
    pub score: f64,
    /// Whether the hypothesis ended with EOS (false: it reached the length limit).
    pub finished: bool,
}

impl BeamHypothesis {
    /// Emitted tokens, EOS included: the `|Y|` of the length penalty.
    // Used by the binary (feature `cli`) and outside the library (feature `internals`).
    #[cfg_attr(not(any(feature = "cli", feature = "internals")), allow(dead_code))]
    pub fn n_emitted(&self) -> usize {
        self.tokens.len() + self.finished as usize
    }
}

/// GNMT's length penalty `((5 + len) / 6)^alpha`.
pub fn length_penalty(len: usize, alpha: f64) -> f64 {
    ((5.0 + len as f64) / 6.0).powf(alpha)
}

/// The length penalty of a stopping rule: Hugging Face's `len^alpha` for its rule, GNMT's
/// otherwise.
pub fn length_penalty_of(stop: Option<BeamStop>, len: usize, alpha: f64) -> f64 {
    match stop {
        Some(BeamStop::HuggingFace) => (len as f64).powf(alpha),
        _ => length_penalty(len, alpha),
    }
}

/// Beam search over `sources`; per sentence (in input order) its n-best list, best first,
/// sorted by normalised score and free of duplicates. See the module docs.
pub fn beam_search<T: Float>(
    model: &Seq2Seq<T>,
    sources: &[Vec<u32>],
    opts: &BeamOptions,
) -> Vec<Vec<BeamHypothesis>> {
    let k = opts.beam_size.max(1);
    let (batch, extra) = (opts.batch_size, opts.max_len_extra);
    let chunks = source_chunks(&model.config, sources, batch, extra);
    let searched = decode_chunks(&chunks, |c| {
        let rules = (TokenRules::TRANSLATION.forcing(opts.forced_first))
            .ending_from(opts.min_len)
            .ending_at_limit(opts.forced_end);
        let search = (opts.alpha, Some(opts.stop), opts.beam_rules);
        let lists = search_chunk(model, &c.sources, &c.limits, k, search, rules).0;
        n_best(lists, opts)
    });
    in_input_order(&chunks, searched, sources.len())
}

/// [`beam_search`]'s chunks (sources clipped to the model's length, sorted by length, at most
/// `opts.batch_size` together, each sentence's output limit) searched by `search_chunk` (another
/// device's search: sources, limits → each sentence's hypotheses, best first), each list cut
/// to `opts.nbest`, in input order; the first error stops it.
pub fn beam_search_with<E>(
    config: &crate::model::ModelConfig,
    sources: &[Vec<u32>],
    opts: &BeamOptions,
    mut search_chunk: impl FnMut(&[&[u32]], &[usize]) -> Result<Vec<Vec<BeamHypothesis>>, E>,
) -> Result<Vec<Vec<BeamHypothesis>>, E> {
    let chunks = source_chunks(config, sources, opts.batch_size, opts.max_len_extra);
    let searched = (chunks.iter())
        .map(|c| Ok(n_best(search_chunk(&c.sources, &c.limits)?, opts)))
        .collect::<Result<Vec<_>, E>>()?;
    Ok(in_input_order(&chunks, searched, sources.len()))
}

/// Each sentence's list cut to `opts.nbest` (at least 1, at most the beam).
fn n_best(mut lists: Vec<Vec<BeamHypothesis>>, opts: &BeamOptions) -> Vec<Vec<BeamHypothesis>> {
    let nbest = opts.nbest.clamp(1, opts.beam_size.max(1));
    lists.iter_mut().for_each(|l| l.truncate(nbest));
    lists
}

/// A live beam: one row of the decoding state.
struct Live {
    sentence: usize,
    tokens: Vec<u32>,
    raw: f64,
}

/// The `n` most probable tokens of one log-probability row that `rules` allows after `emitted`
/// tokens, best first, ties to the lower id.
///
/// Once `n` tokens are held, a block of sixteen none of whose entries beats the worst held is
/// passed over whole (one vector compare instead of sixteen branches; the same list).
fn top_tokens<T: Float>(logprobs: &[T], n: usize, rules: TokenRules, emitted: usize) -> Vec<(f64, u32)> {
    const BLOCK: usize = 16;
    let mut top: Vec<(f64, u32)> = Vec::with_capacity(n + 1);
    for (b, block) in logprobs.chunks(BLOCK).enumerate() {
        if let (true, Some(&(worst, _))) = (top.len() == n, top.last()) {
            // `worst` came from a `T`, so it converts back exactly.
            let worst = T::of(worst);
            if block.iter().fold(true, |none_beats, &x| none_beats & (x <= worst)) {
                continue;
            }
        }
        for (i, &lp) in block.iter().enumerate() {
            let id = (b * BLOCK + i) as u32;
            if !rules.allows_after(id, emitted) {
                continue;
            }
            let lp = lp.f64();
            if top.len() == n && top.last().is_none_or(|&(worst, _)| lp <= worst) {
                continue;
            }
            let at = top.partition_point(|&(s, _)| s >= lp);
            top.insert(at, (lp, id));
            top.truncate(n);
        }
    }
    top
}

/// Inserts `hyp` into the `k` best finished hypotheses (sorted by score, earlier first on ties).
fn keep_finished(list: &mut Vec<BeamHypothesis>, hyp: BeamHypothesis, k: usize) {
    let at = list.partition_point(|h| h.score >= hyp.score);
    if at < k {
        list.insert(at, hyp);
        list.truncate(k);
    }
}

/// Lays the source rows out for the live beams: one row per sentence when every live sentence
/// has the same number of beams, else one per beam. `cross_of[i]` is the sentence of source row
/// `i` (updated); rows of one sentence are copies.
fn gather_cross<S: DecodingState>(state: &mut S, cross_of: &mut Vec<usize>, live: &[Live]) {
    let mut per_sentence: Vec<usize> = live.iter().map(|b| b.sentence).collect();
    per_sentence.dedup();
    let uniform = live.len().is_multiple_of(per_sentence.len());
    let uniform = uniform && {
        let g = live.len() / per_sentence.len();
        live.chunks_exact(g)
            .all(|c| c.iter().all(|b| b.sentence == c[0].sentence))
    };
    let want: Vec<usize> = if uniform {
        per_sentence
    } else {
        live.iter().map(|b| b.sentence).collect()
    };
    if want == *cross_of {
        return;
    }
    let rows: Vec<usize> = want
        .iter()
        .map(|s| {
            cross_of
                .iter()
                .position(|x| x == s)
                .expect("a live sentence keeps its cross row")
        })
        .collect();
    state.gather_sources(&rows);
    *cross_of = want;
}

/// Beam search over one chunk of sources; per sentence the `k` best hypotheses, and how many
/// sentences the stopping criterion ended before their limit (see [`search_rows`]).
fn search_chunk<T: Float>(
    model: &Seq2Seq<T>,
    sources: &[&[u32]],
    limits: &[usize],
    k: usize,
    (alpha, stop, beam_rules): (f64, Option<BeamStop>, BeamRules),
    rules: TokenRules,
) -> (Vec<Vec<BeamHypothesis>>, usize) {
    let capacity = limits.iter().copied().max().unwrap_or(0);
    if capacity == 0 {
        // Nothing may be emitted: the empty, unfinished hypothesis.
        return (vec![vec![BeamHypothesis::default()]; sources.len()], 0);
    }
    let pairs: Vec<(&[u32], &[u32])> = sources.iter().map(|&s| (s, &[][..])).collect();
    let batch = Batch::from_pairs(&pairs);
    let mut state = model.start_decoding(&batch.src, batch.src_len, &batch.src_lens, capacity);
    let first = vec![BOS; sources.len()];
    let search = (alpha, stop, beam_rules);
    search_rows(model, &mut state, &first, limits, k, search, rules)
}

/// Beam search over the rows of a started `state`, one row per sentence: sentence `i` is fed
/// `first[i]`, then each of its beams its own last token, emitting at most `limits[i]` tokens
/// (`rules.end` included), ranked with the length penalty `alpha`, stopped by `stop` and
/// searched by `beam_rules`. Per sentence the `k` best hypotheses, and how many sentences the
/// stopping criterion ended before their limit. Without a `stop` rule every sentence runs to its
/// limit (the reference [`BeamStop::Exact`] is tested against: it must not change the result).
pub fn search_rows<T: Float, M: IncrementalDecoder<T>>(
    model: &M,
    state: &mut M::State,
    first: &[u32],
    limits: &[usize],
    k: usize,
    (alpha, stop, beam_rules): (f64, Option<BeamStop>, BeamRules),
    rules: TokenRules,
) -> (Vec<Vec<BeamHypothesis>>, usize) {
    let v = model.vocab_size();
    let n_sentences = first.len();
    let mut finished: Vec<Vec<BeamHypothesis>> = vec![Vec::new(); n_sentences];
    for (i, _) in limits.iter().enumerate().filter(|(_, &l)| l == 0) {
        // Nothing may be emitted: the empty, unfinished hypothesis.
        finished[i].push(BeamHypothesis::default());
    }
    let mut n_stopped = 0;
    // One row per sentence to start with: the empty prefix.
    let mut live: Vec<Live> = (0..n_sentences)
        .filter(|&i| limits[i] > 0)
        .map(|sentence| Live {
            sentence,
            tokens: Vec::new(),
            raw: 0.0,
        })
        .collect();
    if live.len() != n_sentences {
        let rows: Vec<usize> = live.iter().map(|b| b.sentence).collect();
        state.gather_rows(&rows);
    }
    let mut cross_of: Vec<usize> = (0..n_sentences).collect();
    let mut t = 0; // tokens emitted by every live beam
    while !live.is_empty() {
        gather_cross(state, &mut cross_of, &live);
        let inputs: Vec<u32> = live
            .iter()
            .map(|b| b.tokens.last().copied().unwrap_or(first[b.sentence]))
            .collect();
        let logprobs = model.step(state, &inputs, &StepLayout::dense());
        if state.failed() {
            break;
        }
        // k + 1 per beam: at least k of them do not end the hypothesis (the first token
        // alone, with log-probability 0, when the rules force it).
        let tops: Vec<Vec<(f64, u32)>> = match rules.first {
            Some(first) if t == 0 => vec![vec![(0.0, first)]; live.len()],
            _ => logprobs
                .par_chunks(v)
                .with_min_len(8)
                .map(|row| {
                    let kept = rules.log_kept_mass(row, t);
                    let top = top_tokens(row, k + 1, rules, t);
                    top.into_iter().map(|(lp, id)| (lp - kept, id)).collect()
                })
                .collect(),
        };
        // At a sentence's limit, the end token alone when the rules force it there (and over
        // a forced first token, as transformers applies its forced EOS last).
        let tops: Vec<Vec<(f64, u32)>> = (tops.into_iter().zip(&live))
            .map(|(top, b)| match rules.forces_end(t, limits[b.sentence]) {
                true => vec![(0.0, rules.end)],
                false => top,
            })
            .collect();
        t += 1;
        // The step right after a forced first token, where CTranslate2 lets only the best
        // candidate end a hypothesis.
        let best_only_end = rules.first.is_some() && t == 2 && beam_rules == BeamRules::CTranslate2;
        let mut next: Vec<Live> = Vec::with_capacity(live.len().max(k));
        let mut parents: Vec<usize> = Vec::with_capacity(live.len().max(k));
        // The rows of a sentence are contiguous.
        let mut start = 0;
        while start < live.len() {
            let s = live[start].sentence;
            let end = start + live[start..].iter().take_while(|b| b.sentence == s).count();
            let mut cands: Vec<(f64, usize, u32)> = Vec::with_capacity((end - start) * (k + 1));
            for (r, beam) in live.iter().enumerate().take(end).skip(start) {
                for &(lp, tok) in &tops[r] {
                    cands.push((beam_rules.add(beam.raw, lp), r, tok));
                }
            }
            cands.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
            let last = t >= limits[s];
            let first = next.len();
            // Beams of this step an end token below the best candidate left empty (see
            // [`BeamRules::CTranslate2`]).
            let mut empty = 0;
            for (rank, &(raw, r, tok)) in cands.iter().enumerate() {
                let n_live = next.len() - first + empty;
                if rank >= k && (last || n_live >= k) {
                    break;
                }
                if tok == rules.end && rank > 0 && best_only_end {
                    empty += usize::from(n_live < k);
                } else if tok == rules.end || last {
                    if rank < k {
                        let mut tokens = live[r].tokens.clone();
                        if tok != rules.end {
                            tokens.push(tok);
                        }
                        let hyp = BeamHypothesis {
                            tokens,
                            logprob: raw,
                            score: raw / length_penalty_of(stop, t, alpha),
                            finished: tok == rules.end,
                        };
                        keep_finished(&mut finished[s], hyp, k);
                    }
                } else if n_live < k {
                    let mut tokens = Vec::with_capacity(t + 1);
                    tokens.extend_from_slice(&live[r].tokens);
                    tokens.push(tok);
                    next.push(Live {
                        sentence: s,
                        tokens,
                        raw,
                    });
                    parents.push(r);
                }
            }
            // Exact: the best live beam's most optimistic final score against the k-th finished
            // one. First-k: k finished are enough.
            let bound_met = !last
                && next.len() > first
                && finished[s].len() >= k
                && match stop {
                    None => false,
                    Some(BeamStop::FirstK) => true,
                    Some(BeamStop::Exact) => {
                        let lp_max =
                            length_penalty(t + 1, alpha).max(length_penalty(limits[s], alpha));
                        next[first].raw / lp_max < finished[s][k - 1].score
                    }
                    Some(BeamStop::HuggingFace) => {
                        let best = next[first].raw / length_penalty_of(stop, t, alpha);
                        best <= finished[s][k - 1].score
                    }
                };
            n_stopped += bound_met as usize;
            if last || next.len() == first || bound_met {
                next.truncate(first);
                parents.truncate(first);
            }
            start = end;
        }
        if next.is_empty() {
            break;
        }
        state.gather_rows(&parents);
        live = next;
    }
    (finished, n_stopped)
}

#[cfg(test)]
#[path = "beam_tests.rs"]
mod tests;
