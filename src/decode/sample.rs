//! Sampling: the next token drawn from a distribution with temperature, top-k and nucleus
//! (top-p) filtering, seeded ([`sample`]); and a continuation sampled token by token through any
//! [`IncrementalDecoder`] ([`sample_search`]).

use super::IncrementalDecoder;
use crate::model::StepLayout;
use crate::kernels::reduce::first_argmax;
use crate::rng::Rng;
use crate::Float;

/// How the next token is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingOptions {
    /// Divides the log-probabilities; 0 means greedy (the most likely token).
    pub temperature: f64,
    /// Keep only the k most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches p (1: all).
    pub top_p: f64,
}

impl Default for SamplingOptions {
    fn default() -> Self {
        SamplingOptions {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
        }
    }
}

/// The index of the largest entry (the first one on ties; NaNs are never chosen, and a row of
/// NaNs gives 0).
pub fn argmax<T: Float>(row: &[T]) -> u32 {
    first_argmax(row, &[]).unwrap_or(0) as u32
}

/// Whether `opts` choose the most likely token (no draw): temperature 0 or top-k 1.
pub fn is_greedy(opts: SamplingOptions) -> bool {
    opts.temperature <= 0.0 || opts.top_k == 1
}

/// The distribution [`sample`] draws from: the kept tokens by decreasing probability (lower id
/// first on ties) and their unnormalised weights `exp((z_i − z_max) / temperature)` after the
/// top-k and top-p cuts; token `ids[i]` has probability `weights[i] / total`, every other
/// token 0.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidates {
    /// Kept token ids, most likely first.
    pub ids: Vec<u32>,
    /// Their weights, in the same order.
    pub weights: Vec<f64>,
    /// `Σ weights`.
    pub total: f64,
}

impl Candidates {
    /// The distribution of `logprobs [vocab]` under `opts` (temperature > 0; any logits work:
    /// they are renormalised).
    pub fn new<T: Float>(logprobs: &[T], opts: SamplingOptions) -> Candidates {
        // Candidates by decreasing probability (stable: lower id first on ties).
        let mut order: Vec<usize> = (0..logprobs.len()).collect();
        order.sort_by(|&a, &b| {
            logprobs[b]
                .partial_cmp(&logprobs[a])
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        if opts.top_k > 0 {
            order.truncate(opts.top_k);
        }
        let max = logprobs[order[0]].f64();
        let mut weights: Vec<f64> = order
            .iter()
            .map(|&i| ((logprobs[i].f64() - max) / opts.temperature).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        if opts.top_p < 1.0 {
            let mut mass = 0.0;
            let mut keep = weights.len();
            for (n, w) in weights.iter().enumerate() {
                mass += w / total;
                if mass >= opts.top_p {
                    keep = n + 1;
                    break;
                }
            }
            weights.truncate(keep);
            order.truncate(keep);
        }
        let total: f64 = weights.iter().sum();
        Candidates {
            ids: order.into_iter().map(|i| i as u32).collect(),
            weights,
            total,
        }
    }

    /// One token drawn with one uniform draw from `rng`.
    pub fn draw(&self, rng: &mut Rng) -> u32 {
        let mut u = rng.uniform() * self.total;
        for (&i, &w) in self.ids.iter().zip(&self.weights) {
            if u < w {
                return i;
            }
            u -= w;
        }
        *self.ids.last().expect("non-empty vocabulary")
    }

    /// The probabilities of every token, `[vocab]` (0 for the tokens cut).
    pub fn dense(&self, vocab: usize) -> Vec<f64> {
        let mut p = vec![0.0; vocab];
        for (&i, &w) in self.ids.iter().zip(&self.weights) {
            p[i as usize] = w / self.total;
        }
        p
    }
}

/// Draws a token from `logprobs [vocab]` (any logits work: they are renormalised). One uniform
/// draw from `rng` per sampled token, none when greedy. Ties are broken by the lower id.
pub fn sample<T: Float>(logprobs: &[T], opts: SamplingOptions, rng: &mut Rng) -> u32 {
    if is_greedy(opts) {
        return argmax(logprobs);
    }
    Candidates::new(logprobs, opts).draw(rng)
}

/// Continues one row: feeds `prompt` (its tokens `[1, n]`) into `state`, then samples up to
/// `max_tokens` tokens, each from the distribution after the previous one, calling `emit` with
/// each (an error from it stops the search and is returned). The row ends after a token of
/// `until` (end of text, end of turn), which is emitted and returned.
#[allow(clippy::too_many_arguments)]
pub fn sample_search<T: Float, M: IncrementalDecoder<T>, E>(
    model: &M,
    state: &mut M::State,
    prompt: &[u32],
    max_tokens: usize,
    opts: SamplingOptions,
    rng: &mut Rng,
    until: &[u32],
    mut emit: impl FnMut(u32) -> Result<(), E>,
) -> Result<Vec<u32>, E> {
    let v = model.vocab_size();
    let mut out = Vec::with_capacity(max_tokens.min(1 << 16));
    if max_tokens == 0 {
        return Ok(out);
    }
    let mut logprobs = model.step(state, prompt, &StepLayout::last());
    loop {
        let last = &logprobs[logprobs.len() - v..];
        let id = sample(last, opts, rng);
        emit(id)?;
        out.push(id);
        if out.len() == max_tokens || until.contains(&id) {
            return Ok(out);
        }
        logprobs = model.step(state, &[id], &StepLayout::last());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_and_greedy() {
        let lp: Vec<f64> = [0.5f64, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
        let mut rng = Rng::new(1);
        let greedy = SamplingOptions {
            temperature: 0.0,
            ..Default::default()
        };
        assert_eq!(sample(&lp, greedy, &mut rng), 0);
        let top2 = SamplingOptions {
            top_k: 2,
            ..Default::default()
        };
        let nucleus = SamplingOptions {
            top_p: 0.7,
            ..Default::default()
        };
        let mut counts = [0usize; 4];
        for _ in 0..2000 {
            assert!(sample(&lp, top2, &mut rng) < 2);
            assert!(sample(&lp, nucleus, &mut rng) < 2);
            counts[sample(&lp, SamplingOptions::default(), &mut rng) as usize] += 1;
        }
        assert!((900..1100).contains(&counts[0]), "{counts:?}");
        assert!(counts[3] > 40, "{counts:?}");
    }
}
