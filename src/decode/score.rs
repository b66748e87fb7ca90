//! Scoring given outputs: `log p(target | source)` under teacher forcing.

use super::length_sorted_chunks;
use crate::batch::Batch;
use crate::kernels::softmax::log_softmax_inplace;
use crate::model::seq2seq::Seq2Seq;
use crate::Float;

/// For each `(source, target)` pair (ids without specials) the log-probability of the target
/// given the source, `Σ_t log p(y_t | x, y_<t)` over the target tokens and the closing EOS:
/// one teacher-forced forward per batch, without dropout or label smoothing.
///
/// Pairs are sorted by length and scored in batches of at most `batch_size` (at least one);
/// results are in input order. Panics when a source or target with its EOS (or BOS) exceeds
/// the model's `max_len`.
pub fn score_pairs<T: Float>(
    model: &Seq2Seq<T>,
    pairs: &[(Vec<u32>, Vec<u32>)],
    batch_size: usize,
) -> Vec<f64> {
    let (v, max_len) = (model.config.vocab_size, model.config.max_len);
    for (i, (s, t)) in pairs.iter().enumerate() {
        assert!(
            s.len() < max_len && t.len() < max_len,
            "pair {i}: source ({}) or target ({}) does not fit max_len {max_len} with its EOS",
            s.len(),
            t.len()
        );
    }
    let lens: Vec<usize> = pairs.iter().map(|(s, t)| s.len().max(t.len())).collect();
    let mut out = vec![0.0; pairs.len()];
    for chunk in length_sorted_chunks(&lens, batch_size) {
        let refs: Vec<(&[u32], &[u32])> = chunk
            .iter()
            .map(|&i| (&pairs[i].0[..], &pairs[i].1[..]))
            .collect();
        let batch = Batch::from_pairs(&refs);
        let (mut logits, _) = model.forward(&batch, None);
        for (r, &i) in chunk.iter().enumerate() {
            let mut sum = 0.0;
            for t in 0..batch.tgt_lens[r] {
                let pos = r * batch.tgt_len + t;
                let row = &mut logits[pos * v..(pos + 1) * v];
                log_softmax_inplace(row);
                sum += row[batch.tgt_out[pos] as usize].f64();
            }
            out[i] = sum;
        }
    }
    out
}
