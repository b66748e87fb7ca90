//! The next-token distribution adjusted before sampling, per sequence: the options OpenAI's and
//! llama.cpp's / Hugging Face's APIs take ([`LogitAdjustments`]), applied to one row of logits
//! `z [vocab]` in this order:
//!
//! 1. repetition penalty θ (Keskar et al. 2019, as transformers' `RepetitionPenaltyLogitsProcessor`
//!    and llama.cpp's `penalty_repeat` compute it), for every token `j` seen in the prompt or the
//!    output so far: `z_j ← z_j / θ` if `z_j > 0`, else `z_j · θ`. It reads the raw logits
//!    (their sign matters), so it comes first;
//! 2. `logit_bias`: `z_j ← z_j + b_j` (−100 bans a token in practice, +100 forces it);
//! 3. presence and frequency penalties (OpenAI's definition), with `c_j` the times token `j`
//!    was generated so far (the prompt does not count): `z_j ← z_j − c_j · α_frequency −
//!    [c_j > 0] · α_presence`;
//! 4. `min_p` (llama.cpp's `min_p`, before the temperature as in its default sampler chain):
//!    tokens with `p_j < min_p · max_k p_k`, i.e. `z_j < max_k z_k + ln min_p`, get `−∞`.
//!
//! Every step is shift-invariant except the repetition penalty, so the same adjustments give the
//! same distribution on log-probabilities where θ = 1. A sequence with no option set is not
//! touched at all ([`LogitAdjustments::is_identity`]): its sampling is exactly the plain one.

use std::collections::{HashMap, HashSet};

/// What a request asks to change in the next-token distribution (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct LogitAdjustments {
    /// `(token, b)`: `b` added to the token's logit.
    pub logit_bias: Vec<(u32, f32)>,
    /// `α_presence`: subtracted once from every token generated at least once.
    pub presence_penalty: f32,
    /// `α_frequency`: subtracted per time a token was generated.
    pub frequency_penalty: f32,
    /// `θ` (1: none): divides positive logits and multiplies negative ones of tokens seen.
    pub repetition_penalty: f32,
    /// Tokens below `min_p` times the most likely one's probability are dropped (0: none).
    pub min_p: f32,
}

impl Default for LogitAdjustments {
    fn default() -> Self {
        LogitAdjustments {
            logit_bias: Vec::new(),
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            min_p: 0.0,
        }
    }
}

impl LogitAdjustments {
    /// Whether these change nothing (the row is sampled from the model's distribution as is).
    pub fn is_identity(&self) -> bool {
        *self == LogitAdjustments::default()
    }

    /// Whether step 1 applies: the raw logits (not log-probabilities) are needed.
    pub fn needs_raw_logits(&self) -> bool {
        self.repetition_penalty != 1.0
    }

    /// Applies the four steps (module docs) to `logits [vocab]` after `history`.
    pub fn apply(&self, logits: &mut [f32], history: &TokenHistory) {
        let theta = self.repetition_penalty;
        if theta != 1.0 {
            for &j in &history.seen {
                if let Some(z) = logits.get_mut(j as usize) {
                    *z = if *z > 0.0 { *z / theta } else { *z * theta };
                }
            }
        }
        for &(j, b) in &self.logit_bias {
            if let Some(z) = logits.get_mut(j as usize) {
                *z += b;
            }
        }
        if self.presence_penalty != 0.0 || self.frequency_penalty != 0.0 {
            for (&j, &c) in &history.generated {
                if let Some(z) = logits.get_mut(j as usize) {
                    *z -= c as f32 * self.frequency_penalty + self.presence_penalty;
                }
            }
        }
        if self.min_p > 0.0 {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let floor = max + self.min_p.ln();
            for z in logits.iter_mut() {
                if *z < floor {
                    *z = f32::NEG_INFINITY;
                }
            }
        }
    }
}

/// The tokens a sequence has seen, as the penalties read them: per token the times it was
/// generated (`c_j`) and, where a repetition penalty needs it, every token of the prompt and
/// the output.
#[derive(Clone, Debug, Default)]
pub struct TokenHistory {
    generated: HashMap<u32, u32>,
    /// Tokens of the prompt or the output (kept only when `track_seen`).
    seen: HashSet<u32>,
    track_seen: bool,
}

impl TokenHistory {
    /// The history at the end of `prompt`; `track_seen` when a repetition penalty reads it.
    pub fn new(prompt: &[u32], track_seen: bool) -> Self {
        let mut history = TokenHistory {
            track_seen,
            ..Default::default()
        };
        if track_seen {
            history.seen.extend(prompt.iter().copied());
        }
        history
    }

    /// Records a generated token.
    pub fn push(&mut self, token: u32) {
        *self.generated.entry(token).or_insert(0) += 1;
        if self.track_seen {
            self.seen.insert(token);
        }
    }
}

/// The `k` largest entries of `row` as `(index, value)`, largest first (the lower index first on
/// ties); `O(vocab · k)`, for the few alternatives a response lists.
pub fn top_entries(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    if k == 0 {
        return top;
    }
    for (i, &v) in row.iter().enumerate() {
        if top.len() == k && top.last().is_some_and(|&(_, w)| v <= w || v.is_nan()) {
            continue;
        }
        let at = top.partition_point(|&(_, w)| w >= v);
        top.insert(at, (i as u32, v));
        top.truncate(k);
    }
    top
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// The four steps written out in float64, one token at a time.
    fn reference(z: &[f32], a: &LogitAdjustments, prompt: &[u32], generated: &[u32]) -> Vec<f64> {
        let mut out: Vec<f64> = z.iter().map(|&v| v as f64).collect();
        let theta = a.repetition_penalty as f64;
        for (j, o) in out.iter_mut().enumerate() {
            let seen = prompt.contains(&(j as u32)) || generated.contains(&(j as u32));
            if seen && theta != 1.0 {
                *o = if *o > 0.0 { *o / theta } else { *o * theta };
            }
            for &(t, b) in &a.logit_bias {
                if t as usize == j {
                    *o += b as f64;
                }
            }
            let c = generated.iter().filter(|&&t| t as usize == j).count() as f64;
            *o -= c * a.frequency_penalty as f64
                + if c > 0.0 {
                    a.presence_penalty as f64
                } else {
                    0.0
                };
        }
        if a.min_p > 0.0 {
            let max = out.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = out.iter().map(|&o| (o - max).exp()).sum();
            let p_max = 1.0 / total;
            for o in out.iter_mut() {
                if (*o - max).exp() / total < a.min_p as f64 * p_max {
                    *o = f64::NEG_INFINITY;
                }
            }
        }
        out
    }

    #[test]
    fn adjustments_match_the_float64_definitions() {
        let mut rng = Rng::new(7);
        let v = 50;
        let prompt = [3u32, 4, 4, 10];
        let generated = [10u32, 11, 11, 11, 20, 3];
        let options = [
            LogitAdjustments {
                repetition_penalty: 1.3,
                ..Default::default()
            },
            LogitAdjustments {
                presence_penalty: 0.7,
                frequency_penalty: -0.4,
                ..Default::default()
            },
            LogitAdjustments {
                logit_bias: vec![(0, -100.0), (7, 2.5), (49, 100.0)],
                ..Default::default()
            },
            LogitAdjustments {
                min_p: 0.05,
                ..Default::default()
            },
            LogitAdjustments {
                logit_bias: vec![(11, 1.0)],
                presence_penalty: 1.5,
                frequency_penalty: 0.5,
                repetition_penalty: 0.8,
                min_p: 0.2,
            },
        ];
        for a in &options {
            for trial in 0..20 {
                // Logits of both signs, some large.
                let z: Vec<f32> = (0..v)
                    .map(|_| ((rng.uniform() - 0.5) * 8.0 * (1 + trial % 3) as f64) as f32)
                    .collect();
                let mut history = TokenHistory::new(&prompt, a.needs_raw_logits());
                for &t in &generated {
                    history.push(t);
                }
                let mut got = z.clone();
                a.apply(&mut got, &history);
                let want = reference(&z, a, &prompt, &generated);
                for (j, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    if w == f64::NEG_INFINITY {
                        assert_eq!(g, f32::NEG_INFINITY, "{a:?} token {j}");
                    } else {
                        assert!((g as f64 - w).abs() < 1e-4, "{a:?} token {j}: {g} vs {w}");
                    }
                }
            }
        }
        assert!(LogitAdjustments::default().is_identity());
        assert!(!options[3].is_identity());
    }

    #[test]
    fn top_entries_are_the_largest_in_order() {
        let row = [0.5f32, -1.0, 3.0, 3.0, 2.0, f32::NEG_INFINITY, 7.0];
        assert_eq!(top_entries(&row, 3), vec![(6, 7.0), (2, 3.0), (3, 3.0)]);
        assert_eq!(top_entries(&row, 0), vec![]);
        assert_eq!(top_entries(&row, 10).len(), 7);
        let mut sorted: Vec<(u32, f32)> = row
            .iter()
            .enumerate()
            .map(|(i, &v)| (i as u32, v))
            .collect();
        sorted.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap());
        assert_eq!(top_entries(&row, 7), sorted);
    }
}
