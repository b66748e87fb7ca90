//! Label-smoothed cross-entropy (section 5.4, ε_ls = 0.1), with its gradient in the same pass.
//!
//! For a target `y` and predicted `p = softmax(z)` over a vocabulary of `V`, the smoothed target
//! is `q = (1 − ε) · onehot(y) + ε / V` and the loss `−Σ_v q_v log p_v`
//! `= (1 − ε) · (−log p_y) + ε · mean_v(−log p_v)`; its gradient is `∂L/∂z = p − q`.
//! Padding targets contribute neither loss nor gradient nor token count.

use crate::batch::PAD;
use crate::backend::{Backend, CPU};
use crate::Float;

/// Sums over the non-padding tokens of a batch.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LossStats {
    /// Σ label-smoothed loss.
    pub loss_sum: f64,
    /// Σ −log p(target): the unsmoothed negative log-likelihood.
    pub nll_sum: f64,
    /// Non-padding target tokens.
    pub n_tokens: usize,
}

impl LossStats {
    /// Mean label-smoothed loss per token.
    pub fn loss(&self) -> f64 {
        self.loss_sum / self.n_tokens.max(1) as f64
    }

    /// Mean negative log-likelihood per token (nats).
    pub fn nll(&self) -> f64 {
        self.nll_sum / self.n_tokens.max(1) as f64
    }

    /// Adds another batch's sums.
    pub fn add(&mut self, other: LossStats) {
        self.loss_sum += other.loss_sum;
        self.nll_sum += other.nll_sum;
        self.n_tokens += other.n_tokens;
    }
}

/// Loss over `logits [rows, vocab]` for `targets [rows]`. When `grad_scale` is given, `logits`
/// is overwritten with `grad_scale · ∂L_sum/∂logits` (zero rows for padding); otherwise it is
/// left as log-probabilities.
// Used outside the library only (feature `internals`).
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub fn label_smoothed_cross_entropy<T: Float>(
    logits: &mut [T],
    targets: &[u32],
    vocab: usize,
    epsilon: f64,
    grad_scale: Option<f64>,
) -> LossStats {
    cross_entropy_ignoring(logits, targets, vocab, epsilon, grad_scale, Some(PAD))
}

/// [`label_smoothed_cross_entropy`] where the targets equal to `ignore` (if any) are skipped
/// instead of [`PAD`]; with `None` every row counts (language models, whose byte-level
/// vocabulary has no padding).
pub fn cross_entropy_ignoring<T: Float>(
    logits: &mut [T],
    targets: &[u32],
    vocab: usize,
    epsilon: f64,
    grad_scale: Option<f64>,
    ignore: Option<u32>,
) -> LossStats {
    let (loss_sum, nll_sum) = CPU.cross_entropy(logits, targets, vocab, epsilon, grad_scale, ignore);
    LossStats {
        loss_sum,
        nll_sum,
        n_tokens: targets.iter().filter(|&&t| Some(t) != ignore).count(),
    }
}
