//! Speculative decoding (Leviathan et al. 2023, "Fast Inference from Transformers via
//! Speculative Decoding"; Chen et al. 2023, "Accelerating Large Language Model Decoding with
//! Speculative Sampling"), exact: the tokens come from the target model's own distribution,
//! only faster when a cheap drafter guesses them.
//!
//! One step, after the context `c` whose last token `t` is not yet fed to the target:
//! 1. a drafter ([`super::drafters`]) proposes `d₁ … d_k`, each `d_i` drawn from a draft
//!    distribution `q_i(·) = q(· | c, d₁ … d_{i−1})` (a point mass for prompt lookup);
//! 2. the target runs ONE forward over `[t, d₁ … d_k]` against its KV cache, giving
//!    `p_i(·) = p(· | c, d₁ … d_{i−1})` for `i = 1 … k + 1`, each `p` after the same sampling
//!    adjustments plain sampling applies (temperature, top-k, top-p: [`Candidates`]). The
//!    forward is row-exact ([`row_exact`]): row `i` is bit for bit what a one-token step would
//!    compute after `c, d₁ … d_{i−1}`;
//! 3. for `i = 1 … k` in turn, `d_i` is accepted with probability `min(1, p_i(d_i) / q_i(d_i))`;
//!    at the first rejection the step emits instead a token drawn from the residual
//!    ```text
//!    r_i(y) = max(0, p_i(y) − q_i(y)) / Σ_z max(0, p_i(z) − q_i(z))
//!    ```
//!    and ends; if all `k` are accepted it also emits a token drawn from `p_{k+1}`;
//! 4. the KV cache is cut back past the rejected positions ([`Rollback::truncate`]).
//!
//! Each emitted token then has exactly the distribution `p_i` (the theorem of both papers: for
//! every `y`, `q(y) min(1, p(y)/q(y)) + (1 − Σ_z min(q(z), p(z))) r(y) = min(q(y), p(y)) +
//! max(0, p(y) − q(y)) = p(y)`), whatever the drafter. Greedy decoding (temperature 0 or
//! top-k 1) accepts `d_i` iff it is `argmax p_i` and otherwise emits that argmax, so its
//! output is identical to plain greedy decoding's, token for token.
//!
//! The draft length adapts (Hugging Face's "heuristic" schedule): after a step whose drafts
//! were all accepted it grows by 2, after a rejection it shrinks by 1, within `1 ..=
//! draft_max`. A step never drafts past `max_tokens`, nor past the room left in the target's
//! cache before it would have to be rebuilt (the context window), so the cache sees the same
//! positions as in plain decoding.

use super::drafters::{DraftProb, Drafted, Drafter};
use super::sample::{argmax, is_greedy, Candidates, SamplingOptions};
use super::IncrementalDecoder;
use crate::kernels::row_exact::row_exact;
use crate::model::StepLayout;
use crate::rng::Rng;
use crate::Float;

/// A decoder whose states can be cut back (speculative decoding drops rejected drafts).
pub trait Rollback<T: Float>: IncrementalDecoder<T> {
    /// Keeps the first `len` positions fed to `state`.
    fn truncate(&self, state: &mut Self::State, len: usize);

    /// Positions `state` may still take before the next feed would change how the model
    /// computes them (a context window rebuilding its cache).
    fn room(&self, state: &Self::State) -> usize;
}

/// How many tokens a step drafts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpeculativeOptions {
    /// At most this many drafted tokens a step (llama.cpp's `--draft-max`).
    pub draft_max: usize,
    /// A draft of fewer tokens is not verified: the step is a plain one (`--draft-min`).
    pub draft_min: usize,
    /// Grow the draft length after full accepts, shrink it after rejections (module docs);
    /// otherwise always ask for `draft_max`.
    pub adaptive: bool,
}

impl Default for SpeculativeOptions {
    fn default() -> Self {
        SpeculativeOptions {
            draft_max: 8,
            draft_min: 0,
            adaptive: true,
        }
    }
}

/// What a speculative generation did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpeculativeStats {
    /// Forwards of the target after the prompt (one per step).
    pub target_steps: usize,
    /// Steps that verified at least one drafted token.
    pub verify_steps: usize,
    /// Tokens drafted and verified.
    pub drafted: usize,
    /// Drafted tokens accepted.
    pub accepted: usize,
    /// Tokens emitted.
    pub emitted: usize,
}

impl SpeculativeStats {
    /// Adds `other`'s counts (several replies of a chat).
    pub fn add(&mut self, other: &SpeculativeStats) {
        self.target_steps += other.target_steps;
        self.verify_steps += other.verify_steps;
        self.drafted += other.drafted;
        self.accepted += other.accepted;
        self.emitted += other.emitted;
    }

    /// `accepted / drafted` (0 when nothing was drafted).
    pub fn acceptance(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }
}

/// The outcome of verifying one drafted token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The drafted token is emitted.
    Accept,
    /// Rejected: this token is emitted instead and the step ends.
    Reject(u32),
}

/// Verifies `drafted` against the target's log-probabilities `p_row [vocab]` under `opts`
/// (module docs, step 3): greedy, accepted iff it is the argmax; sampled, accepted with
/// probability `min(1, p(x) / q(x))` (one uniform draw), else replaced by a draw from the
/// residual `max(0, p − q)` (a second one).
pub fn verify_token<T: Float>(
    p_row: &[T],
    drafted: &Drafted,
    opts: SamplingOptions,
    rng: &mut Rng,
) -> Verdict {
    let x = drafted.token;
    if is_greedy(opts) {
        let best = argmax(p_row);
        return if best == x {
            Verdict::Accept
        } else {
            Verdict::Reject(best)
        };
    }
    let p = Candidates::new(p_row, opts);
    let p_x = probability(&p, x);
    let q_x = match &drafted.q {
        DraftProb::Certain => 1.0,
        DraftProb::Sampled(q) => probability(q, x),
    };
    // Accept iff u < p(x) / q(x), u uniform in [0, 1) (q(x) > 0: x was drawn from q).
    if rng.uniform() * q_x < p_x {
        return Verdict::Accept;
    }
    Verdict::Reject(residual(&p, &drafted.q, x, p_row.len()).draw(rng))
}

/// The probability of `token` under `c` (0 if it was cut).
fn probability(c: &Candidates, token: u32) -> f64 {
    c.ids
        .iter()
        .position(|&i| i == token)
        .map_or(0.0, |at| c.weights[at] / c.total)
}

/// `max(0, p − q)` over `p`'s tokens (`q` a point mass at `x`, or a draft distribution), as
/// unnormalised candidates; `p` itself if rounding left it empty (then `p ≤ q` everywhere up to
/// rounding, and a rejection had probability ~0).
fn residual(p: &Candidates, q: &DraftProb, x: u32, vocab: usize) -> Candidates {
    let q_dense = match q {
        DraftProb::Certain => None,
        DraftProb::Sampled(q) => Some(q.dense(vocab)),
    };
    let q_of = |y: u32| match &q_dense {
        None => f64::from(u8::from(y == x)),
        Some(q) => q[y as usize],
    };
    let weights: Vec<f64> = p
        .ids
        .iter()
        .zip(&p.weights)
        .map(|(&y, &w)| (w / p.total - q_of(y)).max(0.0))
        .collect();
    let total: f64 = weights.iter().sum();
    if total <= 0.0 {
        return p.clone();
    }
    Candidates {
        ids: p.ids.clone(),
        weights,
        total,
    }
}

/// Continues one row as [`super::sample::sample_search`] does (same prompt feed, same first
/// token, same stopping rules), drafting with `drafter` and verifying as the module docs say;
/// `stats` counts what happened. Greedy `opts` give plain greedy decoding's tokens exactly.
#[allow(clippy::too_many_arguments)]
pub fn speculative_search<T: Float, M: Rollback<T>, E>(
    model: &M,
    state: &mut M::State,
    prompt: &[u32],
    max_tokens: usize,
    opts: SamplingOptions,
    rng: &mut Rng,
    until: &[u32],
    drafter: &mut dyn Drafter,
    spec: SpeculativeOptions,
    stats: &mut SpeculativeStats,
    mut emit: impl FnMut(u32) -> Result<(), E>,
) -> Result<Vec<u32>, E> {
    use super::DecodingState;
    let v = model.vocab_size();
    let mut out = Vec::with_capacity(max_tokens.min(1 << 16));
    if max_tokens == 0 {
        return Ok(out);
    }
    // The prompt and the first token exactly as plain sampling.
    let logprobs = model.step(state, prompt, &StepLayout::last());
    let first = super::sample::sample(&logprobs[logprobs.len() - v..], opts, rng);
    emit(first)?;
    out.push(first);
    stats.emitted += 1;
    if out.len() == max_tokens || until.contains(&first) {
        return Ok(out);
    }
    let mut context: Vec<u32> = prompt.iter().copied().chain([first]).collect();
    let draft_max = spec.draft_max;
    let mut k = draft_max;
    loop {
        let remaining = max_tokens - out.len();
        let limit = k
            .min(remaining - 1)
            .min(model.room(state).saturating_sub(1));
        let mut drafts = if limit > 0 && limit >= spec.draft_min {
            drafter.draft(&context, limit, opts, rng)
        } else {
            Vec::new()
        };
        drafts.truncate(limit);
        if drafts.len() < spec.draft_min {
            drafts.clear();
        }
        // [pending, d₁ … d_k]: one forward, every row's distribution.
        let fed_before = state.len();
        let feed: Vec<u32> = [*context.last().expect("the context holds the first token")]
            .into_iter()
            .chain(drafts.iter().map(|d| d.token))
            .collect();
        // No draft: exactly plain decoding's step (a context window rebuilding its cache
        // refeeds the recent tokens here, with plain decoding's kernels). Drafts: every row,
        // each with the one-row kernels.
        let rows = if drafts.is_empty() {
            model.step(state, &feed, &StepLayout::last())
        } else {
            row_exact(|| model.step(state, &feed, &StepLayout::dense()))
        };
        stats.target_steps += 1;
        if !drafts.is_empty() {
            stats.verify_steps += 1;
            stats.drafted += drafts.len();
        }
        let mut accepted = 0;
        let mut replacement = None;
        for (i, d) in drafts.iter().enumerate() {
            match verify_token(&rows[i * v..(i + 1) * v], d, opts, rng) {
                Verdict::Accept => accepted += 1,
                Verdict::Reject(y) => {
                    replacement = Some(y);
                    break;
                }
            }
        }
        stats.accepted += accepted;
        let next = replacement.unwrap_or_else(|| {
            let last = &rows[drafts.len() * v..(drafts.len() + 1) * v];
            super::sample::sample(last, opts, rng)
        });
        for id in drafts[..accepted].iter().map(|d| d.token).chain([next]) {
            emit(id)?;
            out.push(id);
            context.push(id);
            stats.emitted += 1;
            if out.len() == max_tokens || until.contains(&id) {
                return Ok(out);
            }
        }
        // Keep the pending token and the accepted drafts; `next` is the new pending token.
        model.truncate(state, fed_before + 1 + accepted);
        if spec.adaptive && !drafts.is_empty() {
            k = if accepted == drafts.len() {
                (k + 2).min(draft_max)
            } else {
                k.saturating_sub(1).max(1)
            };
        }
    }
}

#[cfg(test)]
#[path = "speculative_tests.rs"]
mod tests;
