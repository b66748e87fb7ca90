//! Continuous batching of translation rows (`transformer serve`): one running
//! [`DecodeState`] whose rows were started at different steps, so each row is at its own target
//! position and reads its own source.
//!
//! - [`Seq2Seq::start_ragged`] makes the running state: no rows yet; every row may hold up to
//!   `max_len` target positions (self-attention) and a source of up to `max_len` positions
//!   (cross-attention), in blocks of `block_rows` positions from one free list per cache.
//! - [`DecodeState::append`] joins the rows of a freshly started state
//!   ([`Seq2Seq::start_decoding`] of the sentences that just arrived, encoded together) to the
//!   running one: their projected sources (padding left out) and target positions are copied
//!   into new rows.
//! - [`Seq2Seq::step`] with a one-per-row layout
//!   ([`StepLayout::one_per_row`](super::step_layout::StepLayout::one_per_row)) feeds one token
//!   per row, row `r` at its own position
//!   `t_r` (its self-attention sees its positions `0 ..= t_r`, its cross-attention the
//!   `src_lens[r]` keys of its own source), and returns `[rows, vocab]` log-probabilities.
//! - rows leave with [`DecodeState::gather_rows`] and [`DecodeState::gather_sources`] (the same
//!   rows for both), their blocks returning to the free lists.
//!
//! Rows never interact: every row's log-probabilities are those of its sentence decoded alone
//! (up to the last bits of float rounding, which differ between products of different row
//! counts; the test below checks the float64 teacher-forced forward to 1e-10).

use super::cache_stack::CacheStack;
use super::seq2seq::{DecodeState, Seq2Seq};
use crate::Float;

impl<T: Float> DecodeState<T> {
    /// Rows (sentences) of a state with one source per decoder row.
    pub fn rows(&self) -> usize {
        self.src_lens.len()
    }

    /// Target positions fed so far in row `r`.
    pub fn row_len(&self, r: usize) -> usize {
        self.self_caches.row_len(r)
    }

    /// Blocks holding keys and values, summed over the self- and cross-attention caches of one
    /// layer (every layer holds as many).
    pub fn blocks_in_use(&self) -> usize {
        self.self_caches.blocks_per_layer() + self.cross_caches.blocks_per_layer()
    }

    /// Appends the rows of `other` (one source per row, as [`Seq2Seq::start_decoding`] makes
    /// them) after the rows of `self`: the first `other.src_lens[b]` source positions of each
    /// row (not the padding of a batch) and its target positions fed so far, copied into new
    /// rows. Both states come from the same model; `self`'s capacities hold `other`'s rows.
    pub fn append(&mut self, other: &DecodeState<T>) {
        for (states, what) in [(&*self, "this state"), (other, "the appended state")] {
            assert_eq!(
                states.self_caches.rows(),
                states.rows(),
                "{what} shares sources between rows (beam search); append needs one per row"
            );
        }
        self.self_caches
            .push_rows_from(&other.self_caches, &other.self_caches.row_lens());
        self.cross_caches
            .push_rows_from(&other.cross_caches, &other.src_lens);
        self.src_lens.extend_from_slice(&other.src_lens);
    }
}

impl<T: Float> Seq2Seq<T> {
    /// An empty running state for continuous batching (see the module docs).
    pub fn start_ragged(&self, block_rows: usize) -> DecodeState<T> {
        let cap = self.config.max_len;
        let layers = &self.decoder.layers;
        let self_widths = layers.iter().map(|l| l.self_attn.d_kv());
        let cross_widths = layers.iter().map(|l| l.cross_attn.d_kv());
        DecodeState {
            self_caches: CacheStack::new(self_widths, 0, cap, block_rows),
            cross_caches: CacheStack::new(cross_widths, 0, cap, block_rows),
            src_lens: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{Batch, BOS};
    use crate::model::step_layout::StepLayout;
    use crate::model::{ModelConfig, Positions};
    use crate::rng::Rng;

    /// log-softmax of the teacher-forced forward of one pair, `[tgt_len + 1, vocab]` in
    /// float64: the distribution after BOS and after each target token.
    fn full_logprobs(model: &Seq2Seq<f64>, src: &[u32], tgt: &[u32]) -> Vec<f64> {
        let batch = Batch::from_pairs(&[(src, tgt)]);
        let (mut logits, _) = model.forward(&batch, None);
        for row in logits.chunks_mut(model.config.vocab_size) {
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
            row.iter_mut().for_each(|x| *x -= lse);
        }
        logits
    }

    /// Sentences join a running state at different steps (alone, and two of different lengths
    /// started together, padded), are fed their targets, and leave when done: every
    /// distribution equals the teacher-forced forward of that sentence alone, for additive and
    /// rotary positions and blocks of several sizes; every block returns at the end.
    #[test]
    fn rows_started_at_different_steps_decode_as_if_alone() {
        let v = 23;
        for (positions, block_rows) in [(Positions::Sinusoidal, 3), (Positions::Rotary, 1)] {
            let mut c = ModelConfig::preset("tiny", v).unwrap();
            (c.d_model, c.n_heads, c.d_ff, c.dropout, c.max_len) = (16, 2, 24, 0.0, 32);
            c.positions = positions;
            let model = Seq2Seq::<f64>::new(c, &mut Rng::new(5));
            let mut rng = Rng::new(9);
            let mut draw = |n: usize| -> Vec<u32> {
                (0..n).map(|_| 3 + (rng.uniform() * 20.0) as u32).collect()
            };
            // (source, target, the step before which it joins); 1 and 2 join together.
            let sentences: Vec<(Vec<u32>, Vec<u32>, usize)> = vec![
                (draw(7), draw(9), 0),
                (draw(3), draw(4), 2),
                (draw(11), draw(6), 2),
                (draw(5), draw(8), 5),
            ];
            let want: Vec<Vec<f64>> = sentences
                .iter()
                .map(|(s, t, _)| full_logprobs(&model, s, t))
                .collect();
            let mut state = model.start_ragged(block_rows);
            // held[r]: the sentence in row r; fed[i]: tokens sentence i has been fed.
            let (mut held, mut fed) = (Vec::<usize>::new(), vec![0usize; sentences.len()]);
            let mut checked = 0;
            for step in 0..40 {
                let joining: Vec<usize> = (0..sentences.len())
                    .filter(|&i| sentences[i].2 == step)
                    .collect();
                if !joining.is_empty() {
                    let pairs: Vec<(&[u32], &[u32])> = joining
                        .iter()
                        .map(|&i| (&sentences[i].0[..], &[][..]))
                        .collect();
                    let b = Batch::from_pairs(&pairs);
                    let fresh = model.start_decoding(&b.src, b.src_len, &b.src_lens, 20);
                    state.append(&fresh);
                    held.extend(&joining);
                }
                if held.is_empty() {
                    continue;
                }
                let tokens: Vec<u32> = held
                    .iter()
                    .map(|&i| match fed[i] {
                        0 => BOS,
                        n => sentences[i].1[n - 1],
                    })
                    .collect();
                let got = model.step(&mut state, &tokens, &StepLayout::one_per_row());
                assert_eq!(got.len(), held.len() * v);
                for (r, &i) in held.iter().enumerate() {
                    let want = &want[i][fed[i] * v..(fed[i] + 1) * v];
                    for (a, b) in got[r * v..(r + 1) * v].iter().zip(want) {
                        assert!((a - b).abs() < 1e-10, "sentence {i} position {}", fed[i]);
                    }
                    fed[i] += 1;
                    checked += 1;
                }
                // A sentence fed BOS and its whole target leaves.
                let kept: Vec<usize> = (0..held.len())
                    .filter(|&r| fed[held[r]] <= sentences[held[r]].1.len())
                    .collect();
                state.gather_rows(&kept);
                state.gather_sources(&kept);
                held = kept.iter().map(|&r| held[r]).collect();
                assert_eq!(state.rows(), held.len());
            }
            let total: usize = sentences.iter().map(|s| s.1.len() + 1).sum();
            assert_eq!(checked, total);
            assert_eq!(state.blocks_in_use(), 0);
        }
    }
}
