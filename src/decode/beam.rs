//! Beam search with length normalisation, as in the paper (section 6.1: beam size 4, length
//! penalty α = 0.6, maximum output length input length + 50), batched over sentences with the
//! decoder's key/value caches.
//!
//! Conventions (shared with [`super::greedy`] where they overlap):
//! - sources are token ids without specials; EOS is appended here. A source longer than
//!   `config.max_len - 1` tokens is truncated to fit the position table.
//! - a hypothesis emits at most [`max_output_len`](super::greedy::max_output_len) tokens, EOS included.
//! - PAD and BOS are never emitted.
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
        let rules = TokenRules::TRANSLATION.forcing(opts.forced_first);
        let search = (opts.alpha, Some(opts.stop));
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

/// The `n` most probable tokens of one log-probability row that `rules` allows, best first,
/// ties to the lower id.
///
/// Once `n` tokens are held, a block of sixteen none of whose entries beats the worst held is
/// passed over whole (one vector compare instead of sixteen branches; the same list).
fn top_tokens<T: Float>(logprobs: &[T], n: usize, rules: TokenRules) -> Vec<(f64, u32)> {
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
            if !rules.allows(id) {
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
    (alpha, stop): (f64, Option<BeamStop>),
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
    search_rows(model, &mut state, &first, limits, k, alpha, stop, rules)
}

/// Beam search over the rows of a started `state`, one row per sentence: sentence `i` is fed
/// `first[i]`, then each of its beams its own last token, emitting at most `limits[i]` tokens
/// (`rules.end` included). Per sentence the `k` best hypotheses, and how many sentences the
/// stopping criterion ended before their limit. Without a `stop` rule every sentence runs to its
/// limit (the reference [`BeamStop::Exact`] is tested against: it must not change the result).
#[allow(clippy::too_many_arguments)]
pub fn search_rows<T: Float, M: IncrementalDecoder<T>>(
    model: &M,
    state: &mut M::State,
    first: &[u32],
    limits: &[usize],
    k: usize,
    alpha: f64,
    stop: Option<BeamStop>,
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
                .map(|row| top_tokens(row, k + 1, rules))
                .collect(),
        };
        t += 1;
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
                    cands.push((beam.raw + lp, r, tok));
                }
            }
            cands.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
            let last = t >= limits[s];
            let first = next.len();
            for (rank, &(raw, r, tok)) in cands.iter().enumerate() {
                let n_live = next.len() - first;
                if rank >= k && (last || n_live >= k) {
                    break;
                }
                if tok == rules.end || last {
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
mod tests {
    use super::*;

    #[test]
    fn top_tokens_skip_pad_and_bos_and_break_ties_low() {
        let row = [0.0f32, 0.0, -3.0, -1.0, -1.0, -2.0, -0.5];
        let rules = TokenRules::TRANSLATION;
        assert_eq!(
            top_tokens(&row, 3, rules),
            vec![(-0.5, 6), (-1.0, 3), (-1.0, 4)]
        );
        assert_eq!(top_tokens(&row, 10, rules).len(), 5);
        let all = TokenRules::document(9);
        assert_eq!(top_tokens(&row, 2, all), vec![(0.0, 0), (0.0, 1)]);
    }

    /// The blocked scan against the plain one it replaced (every allowed entry compared), on
    /// rows of few distinct values (ties across blocks) and lengths around the block width.
    #[test]
    fn top_tokens_equal_the_entry_by_entry_scan() {
        fn scan(row: &[f32], n: usize, rules: TokenRules) -> Vec<(f64, u32)> {
            let mut all: Vec<(f64, u32)> = (row.iter().enumerate())
                .filter(|&(id, _)| rules.allows(id as u32))
                .map(|(id, &lp)| (lp as f64, id as u32))
                .collect();
            all.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            all.truncate(n);
            all
        }
        let mut rng = crate::rng::Rng::new(3);
        for len in [3, 15, 16, 17, 40, 500] {
            for n in [1, 2, 8] {
                let row: Vec<f32> = (0..len).map(|_| -(rng.below(5) as f32)).collect();
                for rules in [TokenRules::TRANSLATION, TokenRules::document(2)] {
                    assert_eq!(top_tokens(&row, n, rules), scan(&row, n, rules), "{len} {n}");
                }
            }
        }
    }

    #[test]
    fn length_penalty_is_gnmt() {
        assert_eq!(length_penalty(1, 0.6), 1.0);
        assert_eq!(length_penalty(7, 0.0), 1.0);
        assert!((length_penalty(7, 0.6) - 2f64.powf(0.6)).abs() < 1e-12);
    }

    #[test]
    fn stopping_early_does_not_change_the_result() {
        use crate::model::{ModelConfig, NormPlacement};
        let mut stopped_early = 0;
        // A likely EOS, so that k hypotheses finish well before the limit; with a likely token 6
        // too, long cheap continuations that α > 0 favours (the case an unsafe bound gets wrong).
        for (seed, norm, eos, six) in [
            (1, NormPlacement::PostLn, 2.5, 1.0),
            (2, NormPlacement::PreLn, 2.5, 1.0),
            (5, NormPlacement::PostLn, 2.5, 3.0),
            (7, NormPlacement::PreLn, 1.5, 3.0),
            (7, NormPlacement::PostLn, 2.0, 5.0),
        ] {
            let config = ModelConfig {
                vocab_size: 12,
                d_model: 16,
                n_heads: 2,
                d_ff: 32,
                n_encoder_layers: 1,
                n_decoder_layers: 2,
                dropout: 0.0,
                norm,
                layer_norm_eps: 1e-6,
                tie_embeddings: true,
                max_len: 32,
                ..ModelConfig::preset("tiny", 12).unwrap()
            };
            let mut model = Seq2Seq::<f64>::new(config, &mut crate::rng::Rng::new(seed));
            let w = &mut model.embedding.weight.value.data;
            for (token, factor) in [(crate::batch::EOS as usize, eos), (6, six)] {
                w[token * 16..(token + 1) * 16]
                    .iter_mut()
                    .for_each(|x| *x *= factor);
            }
            let sources: Vec<Vec<u32>> = (0..6u32)
                .map(|n| (0..n).map(|j| 4 + (j * 5 + n) % 8).collect())
                .collect();
            let srcs: Vec<&[u32]> = sources.iter().map(|s| &s[..]).collect();
            let limits: Vec<usize> = srcs.iter().map(|s| s.len() + 12).collect();
            for k in [1, 2, 4] {
                for alpha in [0.0, 0.6, 1.0, 2.0] {
                    let exact = Some(BeamStop::Exact);
                    let rules = TokenRules::TRANSLATION;
                    let (early, n) = search_chunk(&model, &srcs, &limits, k, (alpha, exact), rules);
                    let (full, _) = search_chunk(&model, &srcs, &limits, k, (alpha, None), rules);
                    stopped_early += n;
                    // Equal up to rounding: dropping stopped rows changes the batch shapes.
                    let name = format!("seed {seed}, k {k}, alpha {alpha}");
                    for (a, b) in early.iter().zip(&full) {
                        assert_eq!(a.len(), b.len(), "{name}");
                        for (x, y) in a.iter().zip(b) {
                            assert_eq!((&x.tokens, x.finished), (&y.tokens, y.finished), "{name}");
                            assert!((x.score - y.score).abs() < 1e-9, "{name}");
                        }
                    }
                }
            }
        }
        assert!(stopped_early >= 20, "{stopped_early}");
    }

    #[test]
    fn finished_list_keeps_the_k_best_in_order() {
        let h = |score: f64, tok: u32| BeamHypothesis {
            tokens: vec![tok],
            logprob: score,
            score,
            finished: true,
        };
        let mut list = Vec::new();
        for (s, t) in [(-3.0, 3), (-1.0, 4), (-2.0, 5), (-1.0, 6), (-5.0, 7)] {
            keep_finished(&mut list, h(s, t), 3);
        }
        let toks: Vec<u32> = list.iter().map(|h| h.tokens[0]).collect();
        assert_eq!(toks, vec![4, 6, 5]);
    }

    #[test]
    fn cross_rows_follow_sentences_or_beams() {
        let config = crate::model::ModelConfig::preset("tiny", 12).unwrap();
        let model = Seq2Seq::<f64>::new(config, &mut crate::rng::Rng::new(3));
        let sources: [&[u32]; 3] = [&[4, 5], &[6, 7, 8], &[9]];
        let pairs: Vec<(&[u32], &[u32])> = sources.iter().map(|&s| (s, &[][..])).collect();
        let batch = Batch::from_pairs(&pairs);
        let mut state = model.start_decoding(&batch.src, batch.src_len, &batch.src_lens, 8);
        let original = state.cross_caches.clone();
        let src_len = batch.src_len;
        let beams = |sentences: &[usize]| -> Vec<Live> {
            sentences
                .iter()
                .map(|&sentence| Live {
                    sentence,
                    tokens: Vec::new(),
                    raw: 0.0,
                })
                .collect()
        };
        let mut cross_of = vec![0, 1, 2];
        // Uneven beams per sentence: one cross row per beam, copies of its sentence's row.
        for (live, want) in [
            (vec![0, 0, 1, 2, 2], vec![0, 0, 1, 2, 2]),
            (vec![0, 0, 2, 2], vec![0, 2]), // even again: one row per sentence
            (vec![2, 2, 2], vec![2]),
        ] {
            gather_cross(&mut state, &mut cross_of, &beams(&live));
            assert_eq!(cross_of, want);
            let lens: Vec<usize> = want.iter().map(|&s| batch.src_lens[s]).collect();
            assert_eq!(state.src_lens, lens);
            for (cache, orig) in state.cross_caches.iter().zip(&original) {
                assert_eq!(cache.batch, want.len());
                for (row, &s) in want.iter().enumerate() {
                    for t in 0..src_len {
                        assert_eq!(cache.row(row, t, false), orig.row(s, t, false));
                        assert_eq!(cache.row(row, t, true), orig.row(s, t, true));
                    }
                }
            }
        }
    }
}
