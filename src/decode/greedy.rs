//! Greedy search: at every step each sentence takes its most probable next token.
//!
//! [`greedy_search`] is the search itself, over any [`IncrementalDecoder`] whose rows are
//! started: each step feeds one token per live row through the key/value caches, so a step
//! costs one position, not the whole prefix, and finished rows leave the state.
//! [`greedy_decode`] is translation with it: the sources are encoded once
//! ([`Seq2Seq::start_decoding`]) and every row starts from BOS. [`greedy_decode_full`] runs the
//! same search by recomputing the teacher-forced forward over the whole prefix at every step; it
//! is the simple reference the cached path is tested against.
//!
//! Conventions shared by both:
//! - sources are token ids without specials; EOS is appended here. A source longer than
//!   `config.max_len - 1` tokens is truncated to fit the position table.
//! - a sentence emits at most [`max_output_len`] tokens, its EOS included; one that reaches the
//!   limit without EOS is returned with `finished == false`.
//! - the argmax never picks PAD or BOS (they are never outputs); among the other tokens ties go
//!   to the lowest id. The recorded log-probabilities are those of the model's full softmax.
//! - sentences are sorted by length and decoded in chunks of at most `batch_size`; results come
//!   back in input order. Rows never interact, so a sentence gets the same tokens whatever it
//!   is batched with (up to floating-point ties). With two or more threads the chunks run side
//!   by side, one per thread (`decode_chunks`), bit-identical to one thread.

use super::{decode_chunks, in_input_order, source_chunks, DecodingState, IncrementalDecoder, TokenRules};
use crate::batch::{Batch, BOS};
use crate::kernels::reduce::first_argmax;
use crate::kernels::softmax::log_softmax_inplace;
use crate::model::config::ModelConfig;
use crate::model::seq2seq::Seq2Seq;
use crate::model::StepLayout;
use crate::Float;

/// Search settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GreedyOptions {
    /// A sentence emits at most `source length + max_len_extra` tokens (EOS included), the
    /// paper's "input length + 50" (section 6.1); also capped by the model's `max_len`.
    pub max_len_extra: usize,
    /// Sentences decoded together (at least one is used).
    pub batch_size: usize,
    /// A token every translation starts with, forced with log-probability 0 (a multilingual
    /// model's target language; it counts as emitted).
    pub forced_first: Option<u32>,
    /// EOS is not emitted before this many tokens are (`forced_first` counted): CTranslate2's
    /// `min_decoding_length`; 0 for none.
    pub min_len: usize,
    /// EOS is forced as the last token a sentence may emit (transformers'
    /// `forced_eos_token_id`, see `TokenRules::end_at_limit`).
    pub forced_end: bool,
}

impl Default for GreedyOptions {
    fn default() -> Self {
        GreedyOptions {
            max_len_extra: 50,
            batch_size: 32,
            forced_first: None,
            min_len: 0,
            forced_end: false,
        }
    }
}

/// One decoded sentence.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Hypothesis {
    /// Output token ids, without BOS and EOS.
    pub tokens: Vec<u32>,
    /// `log p(token | source, prefix)` of each emitted token, the final EOS included when
    /// `finished`; so `len() == tokens.len() + finished as usize`.
    pub token_logprobs: Vec<f64>,
    /// The sum of `token_logprobs`.
    pub score: f64,
    /// Whether the sentence ended with EOS (false: it hit the length limit).
    pub finished: bool,
}

impl Hypothesis {
    /// Emitted tokens, EOS included.
    pub fn n_emitted(&self) -> usize {
        self.token_logprobs.len()
    }

    fn push(&mut self, token: u32, logprob: f64, end: u32) {
        self.token_logprobs.push(logprob);
        self.score += logprob;
        if token == end {
            self.finished = true;
        } else {
            self.tokens.push(token);
        }
    }
}

/// The most tokens (EOS included) a source of `src_len` tokens (without EOS) may produce.
pub fn max_output_len(config: &ModelConfig, src_len: usize, max_len_extra: usize) -> usize {
    src_len.saturating_add(max_len_extra).min(config.max_len)
}

/// Greedy decoding with the incremental (KV-cached) decoder. See the module docs.
pub fn greedy_decode<T: Float>(
    model: &Seq2Seq<T>,
    sources: &[Vec<u32>],
    options: &GreedyOptions,
) -> Vec<Hypothesis> {
    decode_in_chunks(model, sources, options, decode_chunk_cached)
}

/// The same search as [`greedy_decode`], recomputing the full teacher-forced forward over the
/// prefix at every step (quadratic; for tests and as the reference).
// Used outside the library only (feature `internals`).
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub fn greedy_decode_full<T: Float>(
    model: &Seq2Seq<T>,
    sources: &[Vec<u32>],
    options: &GreedyOptions,
) -> Vec<Hypothesis> {
    decode_in_chunks(model, sources, options, decode_chunk_full)
}

/// [`greedy_decode`]'s chunks (sources clipped to the model's length, sorted by length, at
/// most `options.batch_size` together, each sentence's output limit) decoded by `decode_chunk`
/// (another device's search), in input order; the first error stops it.
pub fn greedy_decode_with<E>(
    config: &ModelConfig,
    sources: &[Vec<u32>],
    options: &GreedyOptions,
    mut decode_chunk: impl FnMut(&[&[u32]], &[usize]) -> Result<Vec<Hypothesis>, E>,
) -> Result<Vec<Hypothesis>, E> {
    let chunks = source_chunks(config, sources, options.batch_size, options.max_len_extra);
    let decoded = (chunks.iter())
        .map(|c| decode_chunk(&c.sources, &c.limits))
        .collect::<Result<Vec<_>, E>>()?;
    Ok(in_input_order(&chunks, decoded, sources.len()))
}

/// Decodes one chunk: (model, sources, per-sentence output limits, rules) -> hypotheses.
type ChunkDecoder<T> = fn(&Seq2Seq<T>, &[&[u32]], &[usize], TokenRules) -> Vec<Hypothesis>;

/// Clips, sorts and chunks the sources, decodes each chunk, restores input order.
fn decode_in_chunks<T: Float>(
    model: &Seq2Seq<T>,
    sources: &[Vec<u32>],
    options: &GreedyOptions,
    decode_chunk: ChunkDecoder<T>,
) -> Vec<Hypothesis> {
    let (batch, extra) = (options.batch_size, options.max_len_extra);
    let chunks = source_chunks(&model.config, sources, batch, extra);
    let rules = (TokenRules::TRANSLATION.forcing(options.forced_first))
        .ending_from(options.min_len)
        .ending_at_limit(options.forced_end);
    let decoded = decode_chunks(&chunks, |c| decode_chunk(model, &c.sources, &c.limits, rules));
    in_input_order(&chunks, decoded, sources.len())
}

/// The argmax of one log-probability row over the tokens `rules` allows after `emitted`
/// tokens, ties to the lowest id; returns the token and its log-probability (among the tokens
/// left where `rules.min_len` bans EOS, see [`TokenRules::log_kept_mass`]). A row of NaNs
/// (broken weights) gives the first allowed token, with its NaN: the search goes on and the
/// score says so.
fn pick<T: Float>(logprobs: &[T], rules: TokenRules, emitted: usize) -> (u32, f64) {
    let banned: Vec<u32> = rules.banned_after(emitted).collect();
    let id = first_argmax(logprobs, &banned)
        .or_else(|| (0..logprobs.len()).find(|&id| rules.allows_after(id as u32, emitted)))
        .expect("the vocabulary holds an allowed token");
    let kept = rules.log_kept_mass(logprobs, emitted);
    (id as u32, logprobs[id].f64() - kept)
}

/// Updates the hypothesis of one row with its step distribution `logprobs [vocab]` (the
/// argmax over the tokens `rules` allows, ties to the lowest id; `rules.first` for its first
/// token, when set; `rules.end` at its limit when `TokenRules::end_at_limit`); returns the
/// token and whether
/// the row goes on (no end token yet, fewer than `limit` tokens emitted). The step of every
/// greedy search, also the serving engine's (`serve::translate_engine`).
pub fn advance<T: Float>(
    hyp: &mut Hypothesis,
    logprobs: &[T],
    limit: usize,
    rules: TokenRules,
) -> (u32, bool) {
    let (token, lp) = match rules.first {
        _ if rules.forces_end(hyp.n_emitted(), limit) => (rules.end, 0.0),
        Some(first) if hyp.n_emitted() == 0 => (first, 0.0),
        _ => pick(logprobs, rules, hyp.n_emitted()),
    };
    hyp.push(token, lp, rules.end);
    (token, !hyp.finished && hyp.n_emitted() < limit)
}

/// Keeps the rows of `state` whose `keep` is set (their sources too).
fn retain_rows<S: DecodingState>(state: &mut S, keep: &[bool]) {
    let kept: Vec<usize> = (0..keep.len()).filter(|&b| keep[b]).collect();
    state.gather_rows(&kept);
    state.gather_sources(&kept);
}

/// Greedy search over the rows of a started `state`: row `r` is fed `first[r]`, then its own
/// most probable token at every step, until it emits `rules.end` or `limits[r]` tokens. Rows that
/// finish leave the state, so later steps compute live rows only.
pub fn greedy_search<T: Float, M: IncrementalDecoder<T>>(
    model: &M,
    state: &mut M::State,
    first: &[u32],
    limits: &[usize],
    rules: TokenRules,
) -> Vec<Hypothesis> {
    let v = model.vocab_size();
    let mut hyps = vec![Hypothesis::default(); first.len()];
    // rows[r]: the hypothesis in row r of the state.
    let mut rows: Vec<usize> = (0..first.len()).collect();
    let keep: Vec<bool> = limits.iter().map(|&l| l > 0).collect();
    if keep.contains(&false) {
        retain_rows(state, &keep);
        rows.retain(|&i| limits[i] > 0);
    }
    let mut inputs: Vec<u32> = rows.iter().map(|&i| first[i]).collect();
    while !rows.is_empty() {
        let logprobs = model.step(state, &inputs, &StepLayout::dense());
        if state.failed() {
            break;
        }
        let mut keep = vec![true; rows.len()];
        for (r, &i) in rows.iter().enumerate() {
            let row = &logprobs[r * v..(r + 1) * v];
            let (token, live) = advance(&mut hyps[i], row, limits[i], rules);
            inputs[r] = token;
            keep[r] = live;
        }
        if keep.contains(&false) {
            retain_rows(state, &keep);
            let mut k = keep.iter();
            rows.retain(|_| *k.next().unwrap());
            let mut k = keep.iter();
            inputs.retain(|_| *k.next().unwrap());
        }
    }
    hyps
}

/// Cached greedy translation of one chunk: the sources encoded once, every row from BOS.
fn decode_chunk_cached<T: Float>(
    model: &Seq2Seq<T>,
    sources: &[&[u32]],
    limits: &[usize],
    rules: TokenRules,
) -> Vec<Hypothesis> {
    let capacity = limits.iter().copied().max().unwrap_or(0);
    if capacity == 0 {
        return vec![Hypothesis::default(); sources.len()];
    }
    let pairs: Vec<(&[u32], &[u32])> = sources.iter().map(|&s| (s, &[][..])).collect();
    let batch = Batch::from_pairs(&pairs);
    let mut state = model.start_decoding(&batch.src, batch.src_len, &batch.src_lens, capacity);
    let first = vec![BOS; sources.len()];
    greedy_search(model, &mut state, &first, limits, rules)
}

/// Reference greedy search over one chunk: the full forward over source and prefix per step.
// Used outside the library only (feature `internals`).
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
fn decode_chunk_full<T: Float>(
    model: &Seq2Seq<T>,
    sources: &[&[u32]],
    limits: &[usize],
    rules: TokenRules,
) -> Vec<Hypothesis> {
    let v = model.config.vocab_size;
    let mut hyps = vec![Hypothesis::default(); sources.len()];
    let mut live: Vec<usize> = (0..sources.len()).filter(|&i| limits[i] > 0).collect();
    while !live.is_empty() {
        let pairs: Vec<(&[u32], &[u32])> = live
            .iter()
            .map(|&i| (sources[i], &hyps[i].tokens[..]))
            .collect();
        let batch = Batch::from_pairs(&pairs);
        let (mut logits, _) = model.forward(&batch, None);
        let mut keep = vec![true; live.len()];
        for (r, &i) in live.iter().enumerate() {
            // the distribution after the last fed token (BOS y1 .. yt -> position t)
            let pos = r * batch.tgt_len + batch.tgt_lens[r] - 1;
            let row = &mut logits[pos * v..(pos + 1) * v];
            log_softmax_inplace(row);
            keep[r] = advance(&mut hyps[i], row, limits[i], rules).1;
        }
        let mut k = keep.iter();
        live.retain(|_| *k.next().unwrap());
    }
    hyps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pick_skips_pad_and_bos_and_breaks_ties_low() {
        let row = [0.0f32, 0.0, -3.0, -1.0, -1.0, -2.0];
        let rules = TokenRules::TRANSLATION;
        assert_eq!(pick(&row, rules, 0), (3, -1.0));
        assert_eq!(pick(&row, TokenRules::document(5), 0), (0, 0.0));
        // EOS (2) the best: not before `min_len` tokens (CTranslate2's min_decoding_length).
        let eos_best = [0.0f32, 0.0, -0.5, -1.0, -1.0, -2.0];
        assert_eq!(pick(&eos_best, rules, 0), (2, -0.5));
        // The others' log-probabilities without EOS: ln(e^-1 / (1 - e^-0.5)).
        let (id, lp) = pick(&eos_best, rules.ending_from(1), 0);
        assert_eq!(id, 3);
        assert!((lp - (-1.0 - (1.0 - (-0.5f64).exp()).ln())).abs() < 1e-12, "{lp}");
        assert_eq!(pick(&eos_best, rules.ending_from(1), 1), (2, -0.5));
        let hyp_tokens = {
            let mut h = Hypothesis::default();
            h.push(5, -0.5, rules.end);
            h.push(rules.end, -0.25, rules.end);
            h
        };
        assert_eq!(hyp_tokens.tokens, vec![5]);
        assert_eq!(hyp_tokens.n_emitted(), 2);
        assert!(hyp_tokens.finished && hyp_tokens.score == -0.75);
        // NaNs are never the maximum; a row of them gives the first allowed token.
        let nan = f32::NAN;
        assert_eq!(pick(&[0.0f32, 0.0, -3.0, nan, -1.0], rules, 0), (4, -1.0));
        let (id, lp) = pick(&[nan; 4], rules, 0);
        assert!(id == 2 && lp.is_nan());
    }

    /// transformers' `forced_eos_token_id`: EOS, with log-probability 0, as the last token of
    /// the limit (also over a forced first token); without the rule the limit ends the
    /// hypothesis unfinished.
    #[test]
    fn the_end_is_forced_at_the_limit_when_the_rules_say() {
        let row = [0.0f32, 0.0, -3.0, -0.5, -1.0];
        let rules = TokenRules::TRANSLATION.ending_at_limit(true);
        let mut hyp = Hypothesis::default();
        assert_eq!(advance(&mut hyp, &row, 2, rules), (3, true));
        assert_eq!(advance(&mut hyp, &row, 2, rules), (2, false));
        assert!(hyp.finished && hyp.tokens == [3] && hyp.token_logprobs == [-0.5, 0.0]);
        let mut hyp = Hypothesis::default();
        assert_eq!(advance(&mut hyp, &row, 1, rules.forcing(Some(4))), (2, false));
        let mut hyp = Hypothesis::default();
        assert_eq!(advance(&mut hyp, &row, 1, TokenRules::TRANSLATION), (3, false));
        assert!(!hyp.finished);
    }
}
