//! Learning-rate schedules: one [`Schedule`] whose rate is a warm-up-and-decay [`Shape`] times an
//! optional linear [`Cooldown`].
//!
//! - The paper's (section 5.3), [`Shape::InverseSqrt`]:
//!   `lr = factor · d_model^−0.5 · min(step^−0.5, step · warmup^−1.5)`, rising linearly for
//!   `warmup` steps, then decaying with the inverse square root of the step.
//! - The language model's, [`Shape::Cosine`]: a linear warm-up to `peak`, then a cosine decay to
//!   `min_ratio · peak` at update `total`, constant after it.
//! - Either may end with a linear cool-down to zero over the last updates of a run of known
//!   length (the `train` recipe's `--cooldown`).

use serde::{Deserialize, Serialize};

/// How the rate warms up and decays, before any cool-down.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Shape {
    /// `factor · d_model^−0.5 · min(step^−0.5, step · warmup^−1.5)`.
    InverseSqrt {
        d_model: usize,
        warmup: u64,
        factor: f64,
    },
    /// `peak · step / warmup` for `step ≤ warmup`, else
    /// `peak · (min_ratio + (1 − min_ratio) · ½ (1 + cos(π · min(1, (step − warmup) / (total − warmup)))))`.
    Cosine {
        peak: f64,
        warmup: u64,
        total: u64,
        min_ratio: f64,
    },
}

/// A linear cool-down of the learning rate to zero over the updates after `start` up to `end`
/// (the decay phase of "warm-up, stable, decay" schedules, which anneals a run of fixed length
/// the way the paper's checkpoint averaging does in part):
/// `lr'(t) = lr(t) · (end − t) / (end − start)` for `start < t ≤ end`, 0 after `end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cooldown {
    /// The last update at the full rate.
    pub start: u64,
    /// The update at which the rate reaches 0.
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

/// The learning rate of every update: `shape(step) · cooldown.factor(step)` (factor 1 without
/// a cool-down).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Schedule {
    pub shape: Shape,
    pub cooldown: Option<Cooldown>,
}

impl Schedule {
    /// The paper's warm-up then inverse-square-root schedule, without a cool-down.
    pub fn inverse_sqrt(d_model: usize, warmup: u64, factor: f64) -> Schedule {
        Schedule {
            shape: Shape::InverseSqrt {
                d_model,
                warmup,
                factor,
            },
            cooldown: None,
        }
    }

    /// Linear warm-up to `peak`, cosine decay to `min_ratio · peak` at `total`, no cool-down.
    pub fn cosine(peak: f64, warmup: u64, total: u64, min_ratio: f64) -> Schedule {
        Schedule {
            shape: Shape::Cosine {
                peak,
                warmup,
                total,
                min_ratio,
            },
            cooldown: None,
        }
    }

    /// The same schedule ending with `cooldown`.
    pub fn with_cooldown(self, cooldown: Option<Cooldown>) -> Schedule {
        Schedule { cooldown, ..self }
    }

    /// Learning rate for update number `step` (1-based; step 0 is treated as 1).
    pub fn lr(&self, step: u64) -> f64 {
        let s = step.max(1);
        self.shape.lr(s) * self.cooldown.map_or(1.0, |c| c.factor(s))
    }
}

impl Shape {
    /// The rate at update `s >= 1`.
    fn lr(&self, s: u64) -> f64 {
        match *self {
            Shape::InverseSqrt {
                d_model,
                warmup,
                factor,
            } => {
                let (s, w) = (s as f64, warmup.max(1) as f64);
                factor * (d_model as f64).powf(-0.5) * s.powf(-0.5).min(s * w.powf(-1.5))
            }
            Shape::Cosine {
                peak,
                warmup,
                total,
                min_ratio,
            } => {
                if s <= warmup {
                    return peak * s as f64 / warmup as f64;
                }
                let span = total.saturating_sub(warmup).max(1) as f64;
                let progress = ((s - warmup) as f64 / span).min(1.0);
                let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
                peak * (min_ratio + (1.0 - min_ratio) * cosine)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warms_up_linearly_peaks_at_warmup_then_decays() {
        let s = Schedule::inverse_sqrt(512, 4000, 1.0);
        let peak = 512f64.powf(-0.5) * 4000f64.powf(-0.5);
        assert!((s.lr(4000) - peak).abs() < 1e-15);
        assert!((s.lr(2000) - peak / 2.0).abs() < 1e-12);
        assert!((s.lr(16000) - peak / 2.0).abs() < 1e-12);
        assert!((s.lr(1) - 512f64.powf(-0.5) * 4000f64.powf(-1.5)).abs() < 1e-18);
        assert_eq!(s.lr(0), s.lr(1));
    }

    #[test]
    fn cooldown_decays_linearly_to_zero_over_the_last_steps() {
        let plain = Schedule::inverse_sqrt(256, 400, 0.5);
        let cooled = plain.with_cooldown(Cooldown::last(1000, 11_000));
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
        let s = Schedule::cosine(1e-3, 10, 110, 0.1);
        assert!((s.lr(5) - 5e-4).abs() < 1e-15);
        assert!((s.lr(10) - 1e-3).abs() < 1e-15);
        assert!((s.lr(60) - 1e-3 * 0.55).abs() < 1e-12);
        assert!((s.lr(110) - 1e-4).abs() < 1e-15);
        assert!((s.lr(1000) - 1e-4).abs() < 1e-15);
        // A quarter of the way through the decay (step 35 of 10..110) the cosine is ½(1 + cos π/4).
        let quarter = 0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI / 4.0).cos());
        assert!((s.lr(35) - 1e-3 * quarter).abs() < 1e-15);
        assert_eq!(s.lr(0), s.lr(1));
    }

    #[test]
    fn a_cooldown_also_ends_the_cosine() {
        let plain = Schedule::cosine(1e-3, 10, 110, 0.1);
        let cooled = plain.with_cooldown(Cooldown::last(20, 100));
        assert_eq!(cooled.lr(80), plain.lr(80));
        assert!((cooled.lr(90) - plain.lr(90) * 0.5).abs() < 1e-18);
        assert_eq!(cooled.lr(100), 0.0);
    }
}
