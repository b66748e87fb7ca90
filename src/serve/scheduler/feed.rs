//! What one step of the language-model engine feeds: chunked prefill beside decoding
//! (Sarathi-Serve's stall-free batching, Agrawal et al. 2024; llama.cpp's micro-batch,
//! `--ubatch-size`).
//!
//! Every decoding row brings its one generated token; then the prompts being prefilled bring
//! chunks, the prompt with the fewest tokens left first, while the step's budget (from
//! [`EngineConfig::prefill_budget`](super::EngineConfig::prefill_budget), fixed or timed,
//! decode tokens included) lasts; the prompts get at least a quarter of the budget however
//! many rows decode, so a full batch of decoding rows never holds a new prompt back. A step therefore computes
//! at most about the budget's tokens, however long a prompt is: a prompt of thousands of
//! tokens, or an `echo` + `logprobs` scoring pass (whose chunks also ask for the logits of
//! every position they feed), takes many short steps, and a request that arrives meanwhile
//! waits for the step under way, then has its prompt fed ahead of the long one (the fewest
//! tokens left first) and its first token at the end of that step.
//!
//! Chunking does not change what a row computes: each token attends to its own row's cache at
//! its own position, whichever step feeds it and whatever rows it is batched with; only the
//! products' rounding may differ with the number of rows a step holds (see BENCHMARKS.md, the
//! prefix cache's exactness).

use super::{Event, Sequence, TokenLogprob};

/// A running row as the step's plan sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Need {
    /// Whether it brings a generated token (its prompt is complete and it has one).
    pub decoding: bool,
    /// Prompt tokens not fed yet.
    pub prompt_left: usize,
}

/// Per row, the prompt tokens this step feeds (see the module docs): `budget` less one token
/// per decoding row, but at least `⌈budget / 4⌉`, shared among the prompts, the fewest tokens
/// left first (ties: the earlier row).
pub fn prompt_chunks(needs: &[Need], budget: usize) -> Vec<usize> {
    let decoding = needs.iter().filter(|n| n.decoding).count();
    let mut left = budget.saturating_sub(decoding).max(budget.div_ceil(4));
    let mut order: Vec<usize> = (0..needs.len())
        .filter(|&r| needs[r].prompt_left > 0)
        .collect();
    order.sort_by_key(|&r| (needs[r].prompt_left, r));
    let mut chunks = vec![0; needs.len()];
    for r in order {
        if left == 0 {
            break;
        }
        chunks[r] = needs[r].prompt_left.min(left);
        left -= chunks[r];
    }
    chunks
}

/// One step's ragged batch: the tokens, where each goes, and which outputs are wanted.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct StepFeed {
    pub tokens: Vec<u32>,
    /// The row of each token.
    pub rows: Vec<usize>,
    /// The position of each token in its row.
    pub positions: Vec<usize>,
    /// `(row, index of the token)` whose output chooses the row's next token: each decoding
    /// row's token and the last token of each prompt completed by this step, in that order.
    pub outputs: Vec<(usize, usize)>,
    /// `(row, index of the token, the prompt position it predicts)` whose output scores the
    /// prompt (the rows that asked for their prompt's log-probabilities).
    pub prompt_outputs: Vec<(usize, usize, usize)>,
    /// Per row, the prompt tokens fed.
    pub fed: Vec<usize>,
}

impl StepFeed {
    /// The feed of `running` (row `r` holding `row_len(r)` positions) under `budget`: decode
    /// tokens first, then the chunks of [`prompt_chunks`].
    pub fn plan(running: &[Sequence], row_len: impl Fn(usize) -> usize, budget: usize) -> Self {
        let mut feed = StepFeed {
            fed: vec![0; running.len()],
            ..StepFeed::default()
        };
        let needs: Vec<Need> = running
            .iter()
            .map(|seq| Need {
                decoding: seq.fed == seq.prompt.len() && !seq.out.is_empty(),
                prompt_left: seq.prompt.len() - seq.fed,
            })
            .collect();
        for (r, seq) in running.iter().enumerate() {
            if let (true, Some(&last)) = (needs[r].decoding, seq.out.last()) {
                feed.outputs.push((r, feed.tokens.len()));
                feed.push(r, row_len(r), &[last]);
            }
        }
        // In the order of the chunks' sizes: the shortest prompts' first.
        let chunks = prompt_chunks(&needs, budget);
        let mut order: Vec<usize> = (0..running.len()).filter(|&r| chunks[r] > 0).collect();
        order.sort_by_key(|&r| (needs[r].prompt_left, r));
        for r in order {
            let (seq, n) = (&running[r], chunks[r]);
            let first = feed.tokens.len();
            feed.push(r, row_len(r), &seq.prompt[seq.fed..seq.fed + n]);
            feed.fed[r] = n;
            if seq.options.prompt_logprobs.is_some() {
                for k in 0..n {
                    let predicts = seq.fed + k + 1;
                    if predicts < seq.prompt.len() {
                        feed.prompt_outputs.push((r, first + k, predicts));
                    }
                }
            }
            if n == needs[r].prompt_left {
                feed.outputs.push((r, feed.tokens.len() - 1));
            }
        }
        feed
    }

    /// Records the step in `running`: the scores of the prompt positions fed (the
    /// log-probabilities `logprobs [outputs, vocab]`, where the prompt outputs follow the
    /// `decoded` outputs that choose tokens), the prompt tokens fed, and a prompt's scores sent
    /// ([`Event::PromptLogprobs`]) once it is complete.
    pub fn advance(&self, running: &mut [Sequence], logprobs: &[f32], decoded: usize, v: usize) {
        for (o, &(r, _, predicts)) in self.prompt_outputs.iter().enumerate() {
            let j = decoded + o;
            let seq = &mut running[r];
            let k = seq.options.prompt_logprobs.unwrap_or(0);
            let row = &logprobs[j * v..(j + 1) * v];
            seq.prompt_scores
                .push(TokenLogprob::of(row, seq.prompt[predicts], k));
        }
        for (seq, &n) in running.iter_mut().zip(&self.fed) {
            seq.fed += n;
            let scored = seq.options.prompt_logprobs.is_some();
            if n > 0 && seq.fed == seq.prompt.len() && scored && seq.out.is_empty() {
                if let Some(tx) = &seq.scores {
                    let _ = tx.send(Event::PromptLogprobs(std::mem::take(
                        &mut seq.prompt_scores,
                    )));
                }
            }
        }
    }

    /// Appends `tokens` to row `r`, the first at position `start`.
    fn push(&mut self, r: usize, start: usize, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
        self.rows.extend(std::iter::repeat_n(r, tokens.len()));
        self.positions.extend(start..start + tokens.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn need(decoding: bool, prompt_left: usize) -> Need {
        Need {
            decoding,
            prompt_left,
        }
    }

    #[test]
    fn a_long_prompt_is_fed_in_chunks_of_the_budget() {
        let mut left = 3000;
        let mut steps = 0;
        while left > 0 {
            let chunks = prompt_chunks(&[need(false, left)], 64);
            assert!(chunks[0] <= 64 && chunks[0] > 0);
            left -= chunks[0];
            steps += 1;
        }
        assert_eq!(steps, 3000usize.div_ceil(64));
    }

    #[test]
    fn decode_tokens_come_first_and_short_prompts_before_long_ones() {
        // Two decoding rows, a long prompt, then a short one that arrived after it.
        let needs = [need(true, 0), need(false, 3000), need(true, 0), need(false, 20)];
        assert_eq!(prompt_chunks(&needs, 64), vec![0, 42, 0, 20]);
        // The short prompt alone fills a small budget; the long one waits a step.
        assert_eq!(prompt_chunks(&needs, 16), vec![0, 0, 0, 14]);
        // Equal prompts: the earlier row first.
        assert_eq!(
            prompt_chunks(&[need(false, 50), need(false, 50)], 64),
            vec![50, 14]
        );
    }

    #[test]
    fn many_decoding_rows_leave_prompts_a_quarter_of_the_budget() {
        let mut needs = vec![need(true, 0); 64];
        needs.push(need(false, 500));
        let chunks = prompt_chunks(&needs, 32);
        assert_eq!(chunks[64], 8);
        assert_eq!(chunks[..64].iter().sum::<usize>(), 0);
        // A budget of one still feeds a token of a prompt every step.
        assert_eq!(prompt_chunks(&needs, 1)[64], 1);
    }
}
