//! How many tokens one step of the language-model engine feeds at most (`--prefill-budget`,
//! `--prefill-step-ms`).
//!
//! A fixed budget (`--prefill-budget N`) is used as given. Without one the budget is timed:
//! the engine measures what its steps cost and sizes the next so that a step takes about a
//! target time (`--prefill-step-ms`, [`DEFAULT_PREFILL_STEP_MS`]). A step's time bounds how
//! long a request arriving behind a long prompt waits for its own prompt to be fed (issue 44),
//! while a larger step reads the weights once for more tokens (prompt throughput), so the
//! right token count depends on the model, its precision, the threads and whether the prompt
//! is scored (`echo` + `logprobs`), which no fixed number fits.
//!
//! The rule ([`StepBudget`]): a step of `n` tokens (decode tokens included) that took `t`
//! seconds is a sample `s = t / n` seconds a token, kept when `n ≥ b / 2` for the step's
//! budget `b` (a step far below its budget is dominated by fixed costs and says little about a
//! full one). With `m` the median of the last [`SAMPLES`] samples, `s` the latest sample and
//! `T` the target,
//!
//! ```text
//! b' = clamp(min(⌊T / m⌋, ⌊2T / s⌋, 2·b), MIN_BUDGET, MAX_BUDGET)
//! ```
//!
//! The first step, with no sample yet, has [`START_PER_THREAD`] tokens a model thread (at most
//! [`MAX_BUDGET`]). The median sets the budget, so a single fast step is ignored and a single
//! slow one moves it only through the second term; the budget at most doubles a step (a
//! measurement at `b` tokens is not extrapolated far). The second term errs toward latency: at
//! the latest step's cost the next takes at most twice the target, so a scoring request (every
//! position's logits, several times a plain prompt's cost a token) arriving after a large
//! budget was learned costs one long step, not [`SAMPLES`] / 2 of them, and a machine busy for
//! one step costs a few shorter steps while the budget doubles back. Samples include a step's
//! fixed cost, so `m` overstates a token's cost at small `n` and the budget errs toward
//! shorter steps. Where chunks split changes no result
//! (`tests/serving/serve_prefill.rs`), so timing only moves the splits.

/// The target time of a timed step in milliseconds, `--prefill-step-ms`'s default: a quarter
/// of a second, so a small chat arriving behind a long scoring request waits about half a
/// second (the step under way, then its own) for its first token (issue 44's 1.5 s bound).
pub const DEFAULT_PREFILL_STEP_MS: u32 = 250;
/// The fewest tokens a timed step is given.
pub const MIN_BUDGET: usize = 16;
/// The most tokens a timed step is given (the fixed default before budgets were timed).
pub const MAX_BUDGET: usize = 512;
/// A timed budget's first step: tokens per model thread (SmolLM2-135M scoring every position
/// in float32 takes about 9 ms a token on one thread: 32 tokens, about 0.3 s).
pub const START_PER_THREAD: usize = 32;
/// Samples the median is taken over.
pub const SAMPLES: usize = 5;

/// The step budget a server is configured with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillBudget {
    /// At most this many tokens a step (`--prefill-budget`).
    Fixed(usize),
    /// Sized so a step takes about `step_ms` milliseconds (the module docs).
    Timed { step_ms: u32 },
}

impl PrefillBudget {
    /// `Fixed(n)` for `--prefill-budget n` (at least 1), else `Timed` at `step_ms` (at least 1).
    pub fn of(fixed: Option<usize>, step_ms: u32) -> Self {
        match fixed {
            Some(n) => PrefillBudget::Fixed(n.max(1)),
            None => PrefillBudget::Timed {
                step_ms: step_ms.max(1),
            },
        }
    }
}

impl Default for PrefillBudget {
    fn default() -> Self {
        PrefillBudget::Timed {
            step_ms: DEFAULT_PREFILL_STEP_MS,
        }
    }
}

/// The budget of the engine's next step (the module docs' rule).
#[derive(Clone, Debug)]
pub struct StepBudget {
    /// Fixed: never changes.
    fixed: bool,
    /// The target step time in seconds (timed).
    target_s: f64,
    /// The next step's budget.
    budget: usize,
    /// The last samples of seconds a token, oldest first.
    samples: Vec<f64>,
}

impl StepBudget {
    /// The controller of `config`; a timed one starts at `START_PER_THREAD · threads` tokens.
    pub fn new(config: PrefillBudget, threads: usize) -> Self {
        match config {
            PrefillBudget::Fixed(n) => StepBudget {
                fixed: true,
                target_s: 0.0,
                budget: n.max(1),
                samples: Vec::new(),
            },
            PrefillBudget::Timed { step_ms } => StepBudget {
                fixed: false,
                target_s: f64::from(step_ms.max(1)) / 1000.0,
                budget: START_PER_THREAD
                    .saturating_mul(threads.max(1))
                    .clamp(MIN_BUDGET, MAX_BUDGET),
                samples: Vec::with_capacity(SAMPLES),
            },
        }
    }

    /// Tokens the next step feeds at most.
    pub fn tokens(&self) -> usize {
        self.budget
    }

    /// Records a step that fed `tokens` in `seconds` and sizes the next one.
    pub fn record(&mut self, tokens: usize, seconds: f64) {
        if self.fixed || tokens == 0 || 2 * tokens < self.budget {
            return;
        }
        if !(seconds.is_finite() && seconds >= 0.0) {
            return;
        }
        if self.samples.len() == SAMPLES {
            self.samples.remove(0);
        }
        self.samples.push(seconds / tokens as f64);
        let latest = seconds / tokens as f64;
        let mut sorted = self.samples.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        // `⌊target / per_token⌋`; a step too fast to measure: as many as the doubling allows.
        let fit = |target: f64, per_token: f64| {
            if per_token > 0.0 {
                (target / per_token).min(MAX_BUDGET as f64) as usize
            } else {
                MAX_BUDGET
            }
        };
        self.budget = fit(self.target_s, median)
            .min(fit(2.0 * self.target_s, latest))
            .min(self.budget.saturating_mul(2))
            .clamp(MIN_BUDGET, MAX_BUDGET);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// About a millisecond, exact in binary.
    const MS: f64 = 1.0 / 1024.0;

    fn timed(ms: u32) -> PrefillBudget {
        PrefillBudget::Timed { step_ms: ms }
    }

    /// Steps of a full budget at `per_token` seconds a token until the budget settles.
    fn run(b: &mut StepBudget, per_token: f64, steps: usize) {
        for _ in 0..steps {
            let n = b.tokens();
            b.record(n, n as f64 * per_token);
        }
    }

    #[test]
    fn the_first_step_has_the_safe_start_and_a_fixed_budget_never_moves() {
        assert_eq!(StepBudget::new(timed(250), 1).tokens(), 32);
        assert_eq!(StepBudget::new(timed(250), 4).tokens(), 128);
        assert_eq!(StepBudget::new(timed(250), 64).tokens(), MAX_BUDGET);
        let mut fixed = StepBudget::new(PrefillBudget::Fixed(7), 1);
        run(&mut fixed, 1e-6, 10);
        run(&mut fixed, 1.0, 10);
        assert_eq!(fixed.tokens(), 7);
        assert_eq!(PrefillBudget::of(Some(0), 250), PrefillBudget::Fixed(1));
        assert_eq!(PrefillBudget::of(None, 0), timed(1));
        assert_eq!(PrefillBudget::default(), timed(DEFAULT_PREFILL_STEP_MS));
    }

    #[test]
    fn the_budget_converges_to_the_target_over_a_token_s_cost() {
        // About 1 ms (2^-10 s, exact in binary) a token, 250 ms a step: 256 tokens, by doubling.
        let mut b = StepBudget::new(timed(250), 1);
        let mut seen = vec![b.tokens()];
        for _ in 0..4 {
            run(&mut b, MS, 1);
            seen.push(b.tokens());
        }
        assert_eq!(seen, vec![32, 64, 128, 256, 256]);
        // Slower steps (a scoring pass, 4 times the cost a token): a step of at most twice the target at
        // once, the target once most samples say so.
        run(&mut b, 4.0 * MS, 1);
        assert_eq!(b.tokens(), 128);
        run(&mut b, 4.0 * MS, SAMPLES);
        assert_eq!(b.tokens(), 64);
    }

    #[test]
    fn the_budget_is_clamped_at_both_ends() {
        let mut fast = StepBudget::new(timed(250), 1);
        run(&mut fast, 1e-6, 20);
        assert_eq!(fast.tokens(), MAX_BUDGET);
        run(&mut fast, 0.0, 3);
        assert_eq!(fast.tokens(), MAX_BUDGET);
        let mut slow = StepBudget::new(timed(250), 1);
        run(&mut slow, 0.1, 3);
        assert_eq!(slow.tokens(), MIN_BUDGET);
    }

    #[test]
    fn a_single_outlier_and_small_steps_are_ignored() {
        let mut b = StepBudget::new(timed(250), 1);
        run(&mut b, MS, 10);
        assert_eq!(b.tokens(), 256);
        // One step 16 times faster: ignored.
        b.record(256, 256.0 * MS / 16.0);
        assert_eq!(b.tokens(), 256);
        // One step 16 times slower (the machine busy elsewhere): the next step is shortened to
        // twice the target at that cost, then the budget doubles back.
        b.record(256, 256.0 * MS * 16.0);
        assert_eq!(b.tokens(), 32);
        let mut seen = Vec::new();
        for _ in 0..4 {
            run(&mut b, MS, 1);
            seen.push(b.tokens());
        }
        assert_eq!(seen, vec![64, 128, 256, 256]);
        // A step of a few decode tokens, mostly fixed cost, is not a sample.
        b.record(3, 0.2);
        assert_eq!(b.tokens(), 256);
        // Nor a time that is no time.
        b.record(256, f64::NAN);
        assert_eq!(b.tokens(), 256);
    }
}
