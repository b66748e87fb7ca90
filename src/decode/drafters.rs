//! The drafters of speculative decoding ([`super::speculative`]): who guesses the next tokens.
//!
//! - [`PromptLookup`] (Saxena 2023, "prompt lookup decoding"; llama.cpp's `lookup`): no second
//!   model. For `n` from `ngram_max` down to 1, find the most recent earlier occurrence of the
//!   context's last `n` tokens and propose the tokens that followed it. Its proposal is a point
//!   mass (`q(d) = 1`). It wins where the output copies its input: code edits, summaries
//!   quoting the text, repetitive output.
//! - [`DraftModel`]: a smaller model with the same tokenizer, decoded token by token through
//!   its own KV cache (kept in step with the accepted context: cut back to the longest common
//!   prefix, then fed what it has not seen). Greedy, it proposes its argmax; sampling, it draws
//!   from its own distribution under the same options, which is the `q` of the acceptance rule.

use super::sample::{argmax, is_greedy, Candidates, SamplingOptions};
use super::speculative::Rollback;
use super::DecodingState;
use crate::model::StepLayout;
use crate::rng::Rng;
use crate::Float;

/// The draft distribution a token was taken from.
#[derive(Clone, Debug, PartialEq)]
pub enum DraftProb {
    /// Proposed deterministically (`q(d) = 1`): prompt lookup, or any drafter when greedy.
    Certain,
    /// Drawn from these candidates.
    Sampled(Candidates),
}

/// One drafted token.
#[derive(Clone, Debug, PartialEq)]
pub struct Drafted {
    /// The proposed token.
    pub token: u32,
    /// The distribution it was drawn from.
    pub q: DraftProb,
}

impl Drafted {
    /// A token proposed with certainty.
    pub fn certain(token: u32) -> Self {
        Drafted {
            token,
            q: DraftProb::Certain,
        }
    }
}

/// Proposes continuations of a context.
pub trait Drafter {
    /// Up to `max` tokens continuing `context` (the prompt and every token emitted so far),
    /// each with the distribution it was drawn from; fewer (or none) when it has no guess.
    fn draft(
        &mut self,
        context: &[u32],
        max: usize,
        opts: SamplingOptions,
        rng: &mut Rng,
    ) -> Vec<Drafted>;
}

/// N-gram drafts taken from the context itself (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptLookup {
    /// The longest n-gram matched (tried first), at least 1.
    pub ngram_max: usize,
}

impl PromptLookup {
    /// The tokens after the most recent earlier occurrence of the context's last `n` tokens,
    /// for the largest `n ≤ ngram_max` that occurs; at most `max`.
    pub fn lookup(&self, context: &[u32], max: usize) -> Vec<u32> {
        let len = context.len();
        for n in (1..=self.ngram_max.min(len.saturating_sub(1))).rev() {
            let tail = &context[len - n..];
            // Occurrences starting at s < len - n, most recent first.
            for s in (0..len - n).rev() {
                if &context[s..s + n] == tail {
                    let from = s + n;
                    return context[from..(from + max).min(len)].to_vec();
                }
            }
        }
        Vec::new()
    }
}

impl Drafter for PromptLookup {
    fn draft(&mut self, context: &[u32], max: usize, _: SamplingOptions, _: &mut Rng) -> Vec<Drafted> {
        self.lookup(context, max)
            .into_iter()
            .map(Drafted::certain)
            .collect()
    }
}

/// A smaller model drafting token by token (module docs).
pub struct DraftModel<'a, T: Float, M: Rollback<T>> {
    model: &'a M,
    state: M::State,
    /// The tokens `state` holds.
    fed: Vec<u32>,
    _float: std::marker::PhantomData<T>,
}

impl<'a, T: Float, M: Rollback<T>> DraftModel<'a, T, M> {
    /// Drafts with `model` from the empty `state`.
    pub fn new(model: &'a M, state: M::State) -> Self {
        assert!(state.is_empty(), "a draft model starts from an empty state");
        DraftModel {
            model,
            state,
            fed: Vec::new(),
            _float: std::marker::PhantomData,
        }
    }

    /// Feeds `tokens` and returns the distribution after the last, `[vocab]`.
    fn feed(&mut self, tokens: &[u32]) -> Vec<T> {
        self.fed.extend_from_slice(tokens);
        let v = self.model.vocab_size();
        let mut lp = self.model.step(&mut self.state, tokens, &StepLayout::last());
        lp.drain(..lp.len() - v);
        lp
    }
}

impl<T: Float, M: Rollback<T>> Drafter for DraftModel<'_, T, M> {
    fn draft(
        &mut self,
        context: &[u32],
        max: usize,
        opts: SamplingOptions,
        rng: &mut Rng,
    ) -> Vec<Drafted> {
        if max == 0 || context.is_empty() {
            return Vec::new();
        }
        // Keep the longest common prefix, at most all but the context's last token (which is
        // fed again to get the next distribution).
        let common = self
            .fed
            .iter()
            .zip(context)
            .take_while(|(a, b)| a == b)
            .count()
            .min(context.len() - 1);
        debug_assert_eq!(self.fed.len(), self.state.len());
        self.model.truncate(&mut self.state, common);
        self.fed.truncate(common);
        let mut lp = self.feed(&context[common..]);
        let mut drafts = Vec::with_capacity(max);
        loop {
            let drafted = if is_greedy(opts) {
                Drafted::certain(argmax(&lp))
            } else {
                let q = Candidates::new(&lp, opts);
                Drafted {
                    token: q.draw(rng),
                    q: DraftProb::Sampled(q),
                }
            };
            let token = drafted.token;
            drafts.push(drafted);
            if drafts.len() == max {
                return drafts;
            }
            lp = self.feed(&[token]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_takes_the_most_recent_longest_match() {
        let lookup = PromptLookup { ngram_max: 3 };
        // "1 2 3" occurs at 0 and at 5; the tail "1 2 3" matches 5 (most recent) first.
        let context = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 4, 1, 2, 3];
        assert_eq!(lookup.lookup(&context, 2), vec![7, 8]);
        assert_eq!(lookup.lookup(&context, 10), vec![7, 8, 4, 1, 2, 3]);
        // No trigram or bigram match: the last unigram's most recent earlier occurrence.
        assert_eq!(lookup.lookup(&[5, 6, 7, 5], 3), vec![6, 7, 5]);
        assert_eq!(lookup.lookup(&[5, 6, 7, 8], 3), Vec::<u32>::new());
        assert_eq!(lookup.lookup(&[5], 3), Vec::<u32>::new());
        // A longer n-gram wins over a more recent shorter one.
        let context = [4, 5, 6, 1, 6, 2, 4, 5, 6];
        assert_eq!(lookup.lookup(&context, 1), vec![1]);
        assert_eq!(PromptLookup { ngram_max: 1 }.lookup(&context, 1), vec![2]);
    }
}
