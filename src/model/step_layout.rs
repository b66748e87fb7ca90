//! The layout of one incremental step: which new tokens each row of a decoding state brings,
//! at which positions, and which positions need outputs. Every level (attention, block, layer,
//! model) has one `step(state, tokens, layout)`, and the layout decides how its attention reads
//! the caches:
//!
//! | feed | self-attention | kernel (the backend's choice: [`Backend::attention`]) |
//! |---|---|---|
//! | [`Feed::Uniform`], cache in one block per row | causal over the dense cache | [`Purpose::Decode`]: step kernel up to a few tokens a row, matrix products beyond |
//! | [`Feed::Uniform`], cache paged (the translator's decoder) | causal through the block table | [`Purpose::Decode`]: step kernel |
//! | [`Feed::Uniform`] with [`Outputs::Last`], several tokens a row | the last block queries each row's last token only | [`Purpose::Decode`]: step kernel |
//! | [`Feed::Ragged`], [`Feed::OnePerRow`] | each token through its own row's table | [`Purpose::Decode`]: step kernel |
//!
//! Cross-attention (the translator) reads its cache as is, with [`Purpose::Decode`]'s rule.
//! A dense batch is `Uniform` with [`Outputs::All`] ([`StepLayout::dense`]); a prompt of which
//! only the next-token distribution is read is `Uniform` with [`Outputs::Last`]
//! ([`StepLayout::last`]); a continuous batch is `Ragged` ([`StepLayout::ragged`]).
//!
//! [`Purpose::Decode`]: crate::backend::Purpose::Decode
//! [`Backend::attention`]: crate::backend::Backend::attention

use super::embedding::{Embedding, Side};
use crate::Float;

/// Which new tokens a step brings (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feed<'a> {
    /// Every row of the state brings the same number of tokens, `[rows, q_len]` row-major, at
    /// the next positions (all rows hold the same number).
    Uniform,
    /// One token per row, `[rows]`, each at its own row's next position (rows started at
    /// different steps).
    OnePerRow,
    /// Token `i` continues row `rows[i]` at position `positions[i]`; the tokens of one row are
    /// consecutive positions, in order, starting at the row's length.
    Ragged {
        rows: &'a [usize],
        positions: &'a [usize],
    },
}

/// Which positions of a step need outputs (log-probabilities, or a block's output rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outputs<'a> {
    /// Every token's, in token order.
    All,
    /// Each row's last token's, in row order.
    Last,
    /// The tokens at these indices, in this order.
    Tokens(&'a [usize]),
}

/// One step's layout: its feed and its outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepLayout<'a> {
    pub feed: Feed<'a>,
    pub outputs: Outputs<'a>,
}

impl<'a> StepLayout<'a> {
    /// A dense batch: every row the same number of tokens, every position's output.
    pub fn dense() -> Self {
        StepLayout {
            feed: Feed::Uniform,
            outputs: Outputs::All,
        }
    }

    /// Every row the same number of tokens (a prompt), only each row's last output.
    pub fn last() -> Self {
        StepLayout {
            feed: Feed::Uniform,
            outputs: Outputs::Last,
        }
    }

    /// One token per row at each row's own position, every output.
    pub fn one_per_row() -> Self {
        StepLayout {
            feed: Feed::OnePerRow,
            outputs: Outputs::All,
        }
    }

    /// Tokens of any rows (see [`Feed::Ragged`]), the outputs of the tokens `outputs`.
    pub fn ragged(rows: &'a [usize], positions: &'a [usize], outputs: &'a [usize]) -> Self {
        StepLayout {
            feed: Feed::Ragged { rows, positions },
            outputs: Outputs::Tokens(outputs),
        }
    }

    /// The same feed with every output (the blocks before the last one of a stack).
    pub fn all_outputs(self) -> Self {
        StepLayout {
            outputs: Outputs::All,
            ..self
        }
    }

    /// Whether this is a uniform feed whose only outputs are the last of each of its `q_len`
    /// tokens per row, with more than one token a row (a block may then compute the rest of
    /// itself on the last positions only).
    pub fn last_of_several(&self, q_len: usize) -> bool {
        self.feed == Feed::Uniform && self.outputs == Outputs::Last && q_len > 1
    }

    /// The rows `[outputs, width]` of `x [tokens, width]` this layout's outputs select, where a
    /// uniform feed has `q_len` tokens per row.
    pub fn select<T: Copy>(&self, x: Vec<T>, q_len: usize, width: usize) -> Vec<T> {
        match self.outputs {
            Outputs::All => x,
            Outputs::Last if q_len == 1 => x,
            Outputs::Last => x
                .chunks_exact(q_len * width)
                .flat_map(|row| &row[(q_len - 1) * width..])
                .copied()
                .collect(),
            Outputs::Tokens(tokens) => {
                let mut picked = Vec::with_capacity(tokens.len() * width);
                for &i in tokens {
                    picked.extend_from_slice(&x[i * width..(i + 1) * width]);
                }
                picked
            }
        }
    }
}

/// The embeddings `[tokens, d_model]` of `tokens` into the stack of `side`, token `i` at
/// position `positions[i]` of its row `rows[i]` (each run of one row's consecutive positions
/// embedded as one stretch); every position below `max_len`.
pub fn embed_ragged<T: Float>(
    embedding: &Embedding<T>,
    side: Side,
    tokens: &[u32],
    rows: &[usize],
    positions: &[usize],
    max_len: usize,
) -> Vec<T> {
    assert_eq!(tokens.len(), rows.len(), "one row per token");
    assert_eq!(tokens.len(), positions.len(), "one position per token");
    let d = embedding.d_model;
    let mut x = vec![T::zero(); tokens.len() * d];
    for (s, len) in runs(rows, positions) {
        let pos = positions[s];
        assert!(pos + len <= max_len, "sequence longer than max_len");
        let (e, _) = embedding.forward_on(side, &tokens[s..s + len], len, pos, 0.0, None);
        x[s * d..(s + len) * d].copy_from_slice(&e);
    }
    x
}

/// The rows `0 .. n` and their next positions `row_lens`: a [`Feed::OnePerRow`] written out as
/// a [`Feed::Ragged`] one.
pub fn one_per_row(row_lens: Vec<usize>) -> (Vec<usize>, Vec<usize>) {
    ((0..row_lens.len()).collect(), row_lens)
}

/// Maximal runs `(start, len)` of tokens of one row at consecutive positions (each embedded
/// and rotated as one stretch).
pub fn runs(rows: &[usize], positions: &[usize]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for i in 0..rows.len() {
        match runs.last_mut() {
            Some((s, n)) if rows[*s] == rows[i] && positions[*s] + *n == positions[i] => *n += 1,
            _ => runs.push((i, 1)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_select_rows_and_runs_group_tokens() {
        let x: Vec<u32> = (0..12).collect(); // 2 rows x 3 tokens x width 2
        assert_eq!(StepLayout::last().select(x.clone(), 3, 2), [4, 5, 10, 11]);
        assert_eq!(StepLayout::dense().select(x.clone(), 3, 2), x);
        let picked = StepLayout::ragged(&[], &[], &[5, 0]).select(x, 1, 2);
        assert_eq!(picked, [10, 11, 0, 1]);
        assert_eq!(runs(&[0, 0, 1, 0], &[3, 4, 0, 5]), [(0, 2), (2, 1), (3, 1)]);
        assert!(StepLayout::last().last_of_several(2));
        assert!(!StepLayout::last().last_of_several(1));
        assert!(!StepLayout::dense().last_of_several(2));
    }
}
