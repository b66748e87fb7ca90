//! Inference: greedy search ([`greedy`]) and beam search ([`beam`]) for outputs, and scoring of
//! given outputs ([`score`]).
//!
//! All work on token ids without specials (the source gets its EOS here, the decoder starts
//! from BOS) and batch their inputs by length internally; results come back in input order.

pub mod beam;
pub mod greedy;
pub mod sample;
pub mod score;

pub use beam::{beam_search, length_penalty, BeamHypothesis, BeamOptions, BeamStop};
pub use greedy::{greedy_decode, greedy_decode_full, GreedyOptions, Hypothesis};
pub use score::score_pairs;

use crate::kernels::matmul::serial_matmuls;

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

/// `decode(chunk)` for every chunk, results in chunk order. With more than one thread in the
/// pool and more than one chunk, the chunks run side by side, each on one thread with
/// single-threaded matrix products ([`serial_matmuls`]): a decoding step of a few dozen rows
/// is too small for two threads to share one product well, while whole chunks are independent
/// (so the sentences keep their batches and each gets the result it gets alone: serial and
/// threaded products are bit-equal). One chunk, or one thread: the chunks in turn, each
/// product on every thread.
pub(crate) fn decode_chunks<R: Send>(
    chunks: &[Vec<usize>],
    decode: impl Fn(&[usize]) -> R + Sync,
) -> Vec<R> {
    use rayon::prelude::*;
    if chunks.len() > 1 && rayon::current_num_threads() > 1 {
        chunks
            .par_iter()
            .with_max_len(1)
            .map(|chunk| serial_matmuls(|| decode(chunk)))
            .collect()
    } else {
        chunks.iter().map(|chunk| decode(chunk)).collect()
    }
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
}
