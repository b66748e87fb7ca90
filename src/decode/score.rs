//! Scoring given outputs under teacher forcing: `log p(target | source)` of translation pairs,
//! and the negative log-likelihood of a token stream under a language model.

use super::length_sorted_chunks;
use crate::batch::Batch;
use crate::kernels::softmax::log_softmax_inplace;
use crate::model::loss::LossStats;
use crate::model::seq2seq::Seq2Seq;
use crate::model::step_layout::StepLayout;
use crate::model::LanguageModel;
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

/// The summed negative log-likelihood of `tokens[1..]`, each predicted from the tokens before it
/// within windows of `context` tokens, without dropout. Windows start every `stride` tokens
/// (`stride == context`: non-overlapping, each token sees the tokens since its window start;
/// a smaller stride gives every token at least `context − stride` tokens of history), every
/// token is scored exactly once, by the first window that contains it, and the last window is
/// moved back to end at the last token so all windows are full. `batch` windows per forward.
///
/// A model whose key/value cache is not exact (`LanguageModel::set_kv_types`) scores through
/// its cache, so that attention reads the keys and values as stored, as
/// [`score_stream_through_cache`] does.
pub fn score_stream(
    model: &LanguageModel<f32>,
    tokens: &[u32],
    context: usize,
    stride: usize,
    batch: usize,
) -> LossStats {
    score_windows(model, tokens, (context, stride, batch), false)
}

/// [`score_stream`] with each batch of windows fed at once into a fresh key/value cache (of
/// the model's types, exact ones included) instead of the training forward: the baseline a
/// quantised cache's perplexity is compared with.
pub fn score_stream_through_cache(
    model: &LanguageModel<f32>,
    tokens: &[u32],
    context: usize,
    stride: usize,
    batch: usize,
) -> LossStats {
    score_windows(model, tokens, (context, stride, batch), true)
}

fn score_windows(
    model: &LanguageModel<f32>,
    tokens: &[u32],
    (context, stride, batch): (usize, usize, usize),
    through_cache: bool,
) -> LossStats {
    let through_cache = through_cache || !model.kv_types().is_exact();
    let shape = (context.min(model.max_len()), stride, batch);
    let scored = score_windows_with(tokens, shape, model.config.vocab_size, |rows, len, inputs, targets| {
        Ok::<_, std::convert::Infallible>(match through_cache {
            // Each window fed at once into a fresh cache of the model's types: its attention
            // reads the keys and values back from the cache, as stored (llama-perplexity's way).
            true => {
                let mut state = model.start(rows, len);
                model.step(&mut state, inputs, &StepLayout::dense())
            }
            false => model.evaluate_with_logprobs(inputs, targets, rows).1,
        })
    });
    match scored {
        Ok(stats) => stats,
        Err(e) => match e {},
    }
}

/// The windows of [`score_stream`] over `tokens` (`context` already at most the model's),
/// each group of `batch` windows scored by `logprobs(windows, len, inputs [windows · len],
/// targets)`, which returns the log-probabilities `[windows · len, vocab]`: the model's own
/// forward, or a device's step.
pub fn score_windows_with<E>(
    tokens: &[u32],
    (context, stride, batch): (usize, usize, usize),
    v: usize,
    mut logprobs: impl FnMut(usize, usize, &[u32], &[u32]) -> Result<Vec<f32>, E>,
) -> Result<LossStats, E> {
    let mut stats = LossStats::default();
    if tokens.len() < 2 {
        return Ok(stats);
    }
    let n_targets = tokens.len() - 1;
    let len = context.min(n_targets).max(1);
    let stride = stride.clamp(1, len);
    // (window start, first scored row)
    let mut windows = Vec::new();
    let mut scored = 0; // targets 1..=scored are done
    let mut s = 0;
    loop {
        windows.push((s, scored - s));
        scored = s + len;
        if scored >= n_targets {
            break;
        }
        s = (s + stride).min(n_targets - len);
    }
    for group in windows.chunks(batch.max(1)) {
        let mut inputs = Vec::with_capacity(group.len() * len);
        let mut targets = Vec::with_capacity(group.len() * len);
        for &(s, _) in group {
            inputs.extend_from_slice(&tokens[s..s + len]);
            targets.extend_from_slice(&tokens[s + 1..s + len + 1]);
        }
        let logprobs = logprobs(group.len(), len, &inputs, &targets)?;
        for (w, &(_, first)) in group.iter().enumerate() {
            for r in first..len {
                let row = w * len + r;
                let nll = -(logprobs[row * v + targets[row] as usize] as f64);
                stats.loss_sum += nll;
                stats.nll_sum += nll;
                stats.n_tokens += 1;
            }
        }
    }
    Ok(stats)
}
