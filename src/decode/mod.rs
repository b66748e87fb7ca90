//! Inference: greedy search ([`greedy`]), beam search ([`beam`]) and sampling ([`sample`]) for
//! outputs, speculative decoding of them ([`speculative`], drafters in [`drafters`]), and
//! scoring of given outputs ([`score`]).
//!
//! The searches are written once, over [`IncrementalDecoder`]: a model that, given a decoding
//! state, turns the next token of each row into the distribution of the token after it, and
//! whose state can re-gather its rows (beam search keeping a hypothesis' continuation, any search
//! dropping finished rows). The translator ([`Seq2Seq`], after encoding its sources) and the
//! language model ([`LanguageModel`], after its prompt) both are one; how a state starts is
//! theirs ([`Seq2Seq::start_decoding`], [`LanguageModel::start`]).
//!
//! The translation entry points ([`greedy_decode`], [`beam_search`], [`score_pairs`]) work on
//! token ids without specials (the source gets its EOS here, the decoder starts from BOS) and
//! batch their inputs by length internally; results come back in input order.

// The server's logit adjustments: used by the server (feature `serve`) and outside the
// library (feature `internals`).
#[cfg_attr(not(any(feature = "serve", feature = "internals")), allow(dead_code))]
pub mod adjust;
pub mod beam;
#[cfg(feature = "constrain")]
pub mod constraint;
pub mod drafters;
#[cfg(feature = "constrain")]
pub mod gbnf;
#[cfg(feature = "constrain")]
pub mod grammar_limits;
pub mod greedy;
pub mod sample;
pub mod score;
pub mod speculative;

// Used outside the library only (feature `internals`).

#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use beam::{beam_search, length_penalty, BeamHypothesis, BeamOptions, BeamStop};
// Used outside the library only (feature `internals`).
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use greedy::{greedy_decode, greedy_decode_full, GreedyOptions, Hypothesis};
// Used outside the library only (feature `internals`).
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use score::score_pairs;

use crate::batch::{BOS, EOS, PAD};
use crate::kernels::matmul::serial_matmuls;
use crate::model::lm::LmState;
use crate::model::seq2seq::DecodeState;
use crate::model::{LanguageModel, Seq2Seq, StepLayout};
use crate::Float;

/// A model decoded one token per row and step (see the module docs).
pub trait IncrementalDecoder<T: Float>: Sync {
    /// The keys and values cached so far, per row.
    type State: DecodingState;

    /// Entries of each distribution.
    fn vocab_size(&self) -> usize;

    /// Feeds `tokens` laid out as `layout` says at the next positions of the rows of `state`
    /// (a search: [`StepLayout::dense`], one token per row; a prompt of which only the next
    /// distribution is read: [`StepLayout::last`]); returns the log-probabilities of the token
    /// after each output the layout selects, `[outputs, vocab]`.
    fn step(&self, state: &mut Self::State, tokens: &[u32], layout: &StepLayout<'_>) -> Vec<T>;
}

/// The rows of an incremental-decoding state.
pub trait DecodingState {
    /// Positions fed so far.
    // Used outside the library only (feature `internals`).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    fn len(&self) -> usize;

    /// True before the first position.
    // Used outside the library only (feature `internals`).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Row `j` becomes the old row `rows[j]` (any order, repeats allowed).
    fn gather_rows(&mut self, rows: &[usize]);

    /// For a model that reads a source per row (the translator's cross-attention): source row
    /// `j` becomes the old source row `rows[j]`. The rows of one source may also share one
    /// source row (beam search, see `beam`). Nothing to do for a model without sources.
    fn gather_sources(&mut self, _rows: &[usize]) {}

    /// Whether a step failed (a device's error, kept in the state until its caller takes it):
    /// a search stops at once, its result meaningless. Never on the CPU.
    fn failed(&self) -> bool {
        false
    }
}

/// The tokens a search treats specially.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenRules {
    /// Ends a hypothesis.
    pub end: u32,
    /// Never emitted (a translator's padding and start tokens).
    pub never: [Option<u32>; 2],
    /// The first token of every hypothesis, forced with log-probability 0 (a multilingual
    /// translator's target-language token, as transformers' `forced_bos_token_id`).
    pub first: Option<u32>,
    /// `end` is not emitted before this many tokens are (`first` counted): CTranslate2's
    /// `min_decoding_length` (0: from the first token on).
    pub min_len: usize,
    /// `end` is forced, with log-probability 0, as the last token a hypothesis may emit (the
    /// step that reaches its output limit): transformers' `forced_eos_token_id`, which forces
    /// EOS at `max_length − 1`, its last step. The forced first token gives way to it when the
    /// limit is one token, as transformers' processors do (forced EOS applied last).
    pub end_at_limit: bool,
}

impl TokenRules {
    /// Translation: EOS ends a hypothesis; PAD and BOS are never emitted.
    pub const TRANSLATION: TokenRules = TokenRules {
        end: EOS,
        never: [Some(PAD), Some(BOS)],
        first: None,
        min_len: 0,
        end_at_limit: false,
    };

    /// A language model whose documents end with `end` (`<|endoftext|>`); every token may be
    /// emitted.
    // Used outside the library only (feature `internals`).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn document(end: u32) -> TokenRules {
        TokenRules {
            end,
            never: [None, None],
            first: None,
            min_len: 0,
            end_at_limit: false,
        }
    }

    /// These rules with every hypothesis starting with `first` (when `Some`).
    pub fn forcing(self, first: Option<u32>) -> TokenRules {
        TokenRules { first, ..self }
    }

    /// These rules with `end` not emitted before `min_len` tokens are.
    pub fn ending_from(self, min_len: usize) -> TokenRules {
        TokenRules { min_len, ..self }
    }

    /// These rules with `end` forced as the last token of the output limit when `forced`.
    pub fn ending_at_limit(self, forced: bool) -> TokenRules {
        TokenRules {
            end_at_limit: forced,
            ..self
        }
    }

    /// Whether `end` is forced as the token after `emitted` tokens, with at most `limit`
    /// emitted (see [`end_at_limit`](Self::end_at_limit)).
    pub fn forces_end(&self, emitted: usize, limit: usize) -> bool {
        self.end_at_limit && emitted + 1 >= limit
    }

    /// Whether a search may emit `token`.
    pub fn allows(&self, token: u32) -> bool {
        !self.never.contains(&Some(token))
    }

    /// The tokens a search may not emit after `emitted` tokens: `never`, and `end` before
    /// `min_len` tokens.
    pub fn banned_after(&self, emitted: usize) -> impl Iterator<Item = u32> {
        let end = (emitted < self.min_len).then_some(self.end);
        self.never.into_iter().chain([end]).flatten()
    }

    /// Whether a search may emit `token` after `emitted` tokens.
    pub fn allows_after(&self, token: u32, emitted: usize) -> bool {
        !self.banned_after(emitted).any(|banned| banned == token)
    }

    /// `ln(1 − p(end))` of a step's log-probabilities `logprobs` after `emitted` tokens where
    /// `min_len` bans `end`, else 0: the searches subtract it from the other tokens'
    /// log-probabilities, which are then those of the distribution without `end`, as
    /// CTranslate2 computes them (its banned logit is −∞ before its softmax).
    pub fn log_kept_mass<T: Float>(&self, logprobs: &[T], emitted: usize) -> f64 {
        match logprobs.get(self.end as usize) {
            Some(&lp) if emitted < self.min_len => (-lp.f64().exp_m1()).ln(),
            _ => 0.0,
        }
    }
}

impl<T: Float> DecodingState for DecodeState<T> {
    fn len(&self) -> usize {
        DecodeState::len(self)
    }
    fn gather_rows(&mut self, rows: &[usize]) {
        DecodeState::gather_rows(self, rows)
    }
    fn gather_sources(&mut self, rows: &[usize]) {
        DecodeState::gather_sources(self, rows)
    }
}

impl<T: Float> DecodingState for LmState<T> {
    fn len(&self) -> usize {
        LmState::len(self)
    }
    fn gather_rows(&mut self, rows: &[usize]) {
        LmState::gather_rows(self, rows)
    }
}

/// The translator: target tokens, fed one position at a time.
impl<T: Float> IncrementalDecoder<T> for Seq2Seq<T> {
    type State = DecodeState<T>;
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }
    fn step(&self, state: &mut DecodeState<T>, tokens: &[u32], layout: &StepLayout<'_>) -> Vec<T> {
        Seq2Seq::step(self, state, tokens, layout)
    }
}

/// The language model: a prompt at once, or one token per row and step.
impl<T: Float> IncrementalDecoder<T> for LanguageModel<T> {
    type State = LmState<T>;
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }
    fn step(&self, state: &mut LmState<T>, tokens: &[u32], layout: &StepLayout<'_>) -> Vec<T> {
        LanguageModel::step(self, state, tokens, layout)
    }
}

/// Indices `0..lens.len()` stably sorted by `lens`, cut into chunks of at most `batch_size`
/// (at least one) so that each chunk holds items of similar length and pads little.
pub(crate) fn length_sorted_chunks(lens: &[usize], batch_size: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lens.len()).collect();
    order.sort_by_key(|&i| lens[i]);
    order
        .chunks(batch_size.max(1))
        .map(|c| c.to_vec())
        .collect()
}

/// One chunk of [`source_chunks`]: its sentences (indices into the input), their sources
/// (clipped) and their output limits.
pub(crate) struct SourceChunk<'a> {
    pub(crate) sentences: Vec<usize>,
    pub(crate) sources: Vec<&'a [u32]>,
    pub(crate) limits: Vec<usize>,
}

/// `sources` clipped to what the model reads (its context less the EOS), sorted by length and
/// cut into chunks of at most `batch_size` ([`length_sorted_chunks`]), each sentence with its
/// output limit ([`greedy::max_output_len`]): the chunks every translation search decodes.
pub(crate) fn source_chunks<'a>(
    config: &crate::model::config::ModelConfig,
    sources: &'a [Vec<u32>],
    batch_size: usize,
    max_len_extra: usize,
) -> Vec<SourceChunk<'a>> {
    let max_src = config.max_len.saturating_sub(1);
    let clipped: Vec<&[u32]> = sources.iter().map(|s| &s[..s.len().min(max_src)]).collect();
    let lens: Vec<usize> = clipped.iter().map(|s| s.len()).collect();
    length_sorted_chunks(&lens, batch_size)
        .into_iter()
        .map(|sentences| SourceChunk {
            sources: sentences.iter().map(|&i| clipped[i]).collect(),
            limits: (sentences.iter())
                .map(|&i| greedy::max_output_len(config, lens[i], max_len_extra))
                .collect(),
            sentences,
        })
        .collect()
}

/// The results of each chunk of `chunks` (one per sentence, in the chunk's order) put back in
/// input order, `n` sentences.
pub(crate) fn in_input_order<R: Clone + Default>(
    chunks: &[SourceChunk<'_>],
    results: Vec<Vec<R>>,
    n: usize,
) -> Vec<R> {
    let mut out = vec![R::default(); n];
    for (chunk, results) in chunks.iter().zip(results) {
        for (&i, r) in chunk.sentences.iter().zip(results) {
            out[i] = r;
        }
    }
    out
}

/// `decode(chunk)` for every chunk, results in chunk order. With more than one thread in the
/// pool and more than one chunk, the chunks run side by side, each on one thread with
/// single-threaded matrix products ([`serial_matmuls`]): a decoding step of a few dozen rows
/// is too small for two threads to share one product well, while whole chunks are independent
/// (so the sentences keep their batches and each gets the result it gets alone: serial and
/// threaded products are bit-equal). The threads take chunks from one queue, last chunk first:
/// [`length_sorted_chunks`] puts the longest sentences last, so the long chunks start first and
/// the threads finish together (longest-first scheduling) rather than one thread decoding the
/// longest chunk alone at the end. One chunk, or one thread: the chunks in turn, each product
/// on every thread.
pub(crate) fn decode_chunks<C: Sync, R: Send>(
    chunks: &[C],
    decode: impl Fn(&C) -> R + Sync,
) -> Vec<R> {
    use rayon::prelude::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let threads = rayon::current_num_threads();
    if chunks.len() <= 1 || threads <= 1 {
        return chunks.iter().map(&decode).collect();
    }
    let taken = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<R>>> = chunks.iter().map(|_| Mutex::new(None)).collect();
    // One worker per thread, each taking the next chunk until none is left (a worker rayon
    // starts late finds the queue empty and returns at once).
    (0..threads.min(chunks.len()))
        .into_par_iter()
        .with_max_len(1)
        .for_each(|_| loop {
            let i = taken.fetch_add(1, Ordering::Relaxed);
            if i >= chunks.len() {
                break;
            }
            let c = chunks.len() - 1 - i;
            let decoded = serial_matmuls(|| decode(&chunks[c]));
            *results[c].lock().unwrap_or_else(|e| e.into_inner()) = Some(decoded);
        });
    results
        .into_iter()
        .map(|slot| {
            let decoded = slot.into_inner().unwrap_or_else(|e| e.into_inner());
            decoded.expect("every chunk is taken by one worker")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_length_sorted_and_cover_every_index_once() {
        let chunks = length_sorted_chunks(&[5, 1, 3, 1, 9], 2);
        assert_eq!(chunks, vec![vec![1, 3], vec![2, 0], vec![4]]);
        assert_eq!(length_sorted_chunks(&[2, 2], 0), vec![vec![0], vec![1]]);
        assert!(length_sorted_chunks(&[], 4).is_empty());
    }

    #[test]
    fn chunks_decoded_on_two_threads_come_back_in_chunk_order() {
        let chunks: Vec<Vec<usize>> = (0..7).map(|c| vec![c, c + 10]).collect();
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let sums = pool.install(|| decode_chunks(&chunks, |c| c.iter().sum::<usize>()));
        assert_eq!(sums, vec![10, 12, 14, 16, 18, 20, 22]);
        assert_eq!(decode_chunks(&chunks[..1], |c| c.len()), vec![2]);
        assert!(decode_chunks(&[], |c: &Vec<usize>| c.len()).is_empty());
    }

    /// Greedy and beam translations are the same on one thread and on two (chunks side by
    /// side, longest first), to the bit: each chunk's result does not depend on its thread.
    #[test]
    fn translations_on_two_threads_equal_one_thread() {
        use crate::decode::beam::{beam_search, BeamOptions};
        use crate::decode::greedy::{greedy_decode, GreedyOptions};
        let config = crate::model::ModelConfig {
            max_len: 40,
            ..crate::model::ModelConfig::preset("tiny", 12).unwrap()
        };
        let model = Seq2Seq::<f32>::new(config, &mut crate::rng::Rng::new(11));
        // Eleven sentences of 1 to 11 tokens, in no length order: six chunks of two.
        let sources: Vec<Vec<u32>> = (0..11u32)
            .map(|i| (i * 7) % 11 + 1)
            .map(|n| (0..n).map(|j| 4 + (j * 3 + n) % 8).collect())
            .collect();
        let greedy = GreedyOptions {
            batch_size: 2,
            ..GreedyOptions::default()
        };
        let beam = BeamOptions {
            beam_size: 3,
            batch_size: 2,
            ..BeamOptions::default()
        };
        let on = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                (
                    greedy_decode(&model, &sources, &greedy),
                    beam_search(&model, &sources, &beam),
                )
            })
        };
        let (one, two) = (on(1), on(2));
        assert_eq!(one.0.len(), 11);
        assert!(one.0.iter().any(|h| !h.tokens.is_empty()));
        assert_eq!(one, two);
    }
}
