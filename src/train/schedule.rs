//! The learning-rate schedule of section 5.3:
//! `lr = factor · d_model^−0.5 · min(step^−0.5, step · warmup^−1.5)`,
//! rising linearly for `warmup` steps, then decaying with the inverse square root of the step;
//! optionally ending with a linear cool-down to zero (see [`Cooldown`]).

use serde::{Deserialize, Serialize};

/// The paper's warm-up then inverse-square-root schedule.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct NoamSchedule {
    pub d_model: usize,
    pub warmup: u64,
    pub factor: f64,
    /// An optional linear decay to zero at the end of a run of known length.
    #[serde(default)]
    pub cooldown: Option<Cooldown>,
}

/// A linear cool-down of the learning rate to zero over the updates after `start` up to `end`
/// (the decay phase of "warm-up, stable, decay" schedules, which anneals a run of fixed length
/// the way the paper's checkpoint averaging does in part):
/// `lr'(t) = lr(t) · (end − t) / (end − start)` for `start < t ≤ end`, 0 after `end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cooldown {
    pub start: u64,
    pub end: u64,
}

impl Cooldown {
    /// The last `steps` updates of a run of `total` updates (`None` when `steps` is 0).
    pub fn last(steps: u64, total: u64) -> Option<Cooldown> {
        (steps > 0).then(|| Cooldown {
            start: total.saturating_sub(steps),
            end: total,
        })
    }

    /// The factor in [0, 1] applied at update `step`.
    pub fn factor(&self, step: u64) -> f64 {
        if step <= self.start {
            1.0
        } else if step >= self.end {
            0.0
        } else {
            (self.end - step) as f64 / (self.end - self.start) as f64
        }
    }
}

impl NoamSchedule {
    /// Learning rate for update number `step` (1-based; step 0 is treated as 1).
    pub fn lr(&self, step: u64) -> f64 {
        let s = step.max(1) as f64;
        let w = self.warmup.max(1) as f64;
        let noam =
            self.factor * (self.d_model as f64).powf(-0.5) * s.powf(-0.5).min(s * w.powf(-1.5));
        noam * self.cooldown.map_or(1.0, |c| c.factor(step.max(1)))
    }
}

/// Linear warm-up to `lr` over `warmup` updates, then a cosine decay to `min_ratio · lr` at
/// update `total`, constant after it (the language-model recipe; `min_ratio` 0.1 by default):
/// `lr(t) = lr · t / warmup` for `t ≤ warmup`, else
/// `lr · (min_ratio + (1 − min_ratio) · ½ (1 + cos(π · min(1, (t − warmup) / (total − warmup)))))`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CosineSchedule {
    pub lr: f64,
    pub warmup: u64,
    pub total: u64,
    pub min_ratio: f64,
}

impl CosineSchedule {
    /// Learning rate for update number `step` (1-based; step 0 is treated as 1).
    pub fn lr(&self, step: u64) -> f64 {
        let s = step.max(1);
        if s <= self.warmup {
            return self.lr * s as f64 / self.warmup as f64;
        }
        let span = self.total.saturating_sub(self.warmup).max(1) as f64;
        let progress = ((s - self.warmup) as f64 / span).min(1.0);
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.lr * (self.min_ratio + (1.0 - self.min_ratio) * cosine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warms_up_linearly_peaks_at_warmup_then_decays() {
        let s = NoamSchedule {
            d_model: 512,
            warmup: 4000,
            factor: 1.0,
            cooldown: None,
        };
        let peak = 512f64.powf(-0.5) * 4000f64.powf(-0.5);
        assert!((s.lr(4000) - peak).abs() < 1e-15);
        assert!((s.lr(2000) - peak / 2.0).abs() < 1e-12);
        assert!((s.lr(16000) - peak / 2.0).abs() < 1e-12);
        assert!((s.lr(1) - 512f64.powf(-0.5) * 4000f64.powf(-1.5)).abs() < 1e-18);
        assert_eq!(s.lr(0), s.lr(1));
    }

    #[test]
    fn cooldown_decays_linearly_to_zero_over_the_last_steps() {
        let plain = NoamSchedule {
            d_model: 256,
            warmup: 400,
            factor: 0.5,
            cooldown: None,
        };
        let cooled = NoamSchedule {
            cooldown: Cooldown::last(1000, 11_000),
            ..plain
        };
        assert_eq!(Cooldown::last(0, 11_000), None);
        for step in [1, 400, 5000, 10_000] {
            assert_eq!(cooled.lr(step), plain.lr(step), "step {step}");
        }
        // A quarter, half and all of the way through the last 1,000 updates.
        for (step, left) in [
            (10_250, 0.75),
            (10_500, 0.5),
            (10_999, 0.001),
            (11_000, 0.0),
        ] {
            let want = plain.lr(step) * left;
            assert!((cooled.lr(step) - want).abs() < 1e-15, "step {step}");
        }
        assert_eq!(cooled.lr(12_000), 0.0);
    }

    #[test]
    fn cosine_warms_up_then_decays_to_the_floor() {
        let s = CosineSchedule {
            lr: 1e-3,
            warmup: 10,
            total: 110,
            min_ratio: 0.1,
        };
        assert!((s.lr(5) - 5e-4).abs() < 1e-15);
        assert!((s.lr(10) - 1e-3).abs() < 1e-15);
        assert!((s.lr(60) - 1e-3 * 0.55).abs() < 1e-12);
        assert!((s.lr(110) - 1e-4).abs() < 1e-15);
        assert!((s.lr(1000) - 1e-4).abs() < 1e-15);
    }
}
