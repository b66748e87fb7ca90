//! The training run, one loop for `train`, `train-lm` and `demo`: updates until `max_steps`
//! (or the time limit), validation every N updates, the metrics log and its curves, rotating
//! step checkpoints, periodic saves (every N updates, and every so many seconds: the autosave),
//! and the final save.
//!
//! Every save is all or nothing ([`crate::store::atomic`]) and holds the model, the optimizer,
//! the trainer state and the tokenizer, so each is a complete model directory. A run that
//! diverges (a loss, gradient norm, weight or moment that is not finite) stops with
//! [`Error::Diverged`] before saving anything more: the last good checkpoint stays, and step
//! checkpoints are only rotated away after a newer one is saved.
//!
//! The time limit is checked after each update: the update during which the limit passes is
//! completed (and logged, validated and checkpointed as its step number asks), then the run
//! stops and saves. Every run therefore makes at least one update.
//!
//! Nothing is printed here: the caller sees every update, validation and the time limit
//! through a [`Reporter`].
//!
//! In a distributed run (the trainer's [`Communicator`](crate::dist::Communicator) has more
//! than one rank) every rank runs this loop, and only rank 0 writes, validates and reports: the
//! other ranks ignore `output`, `validator` and `reporter`. The time limit is then one decision
//! for all ranks: the run stops after the update during which any rank's clock passed it.

use crate::error::{Error, Result};
use crate::store::{
    atomic, list_step_checkpoints, step_checkpoint_name, CheckpointWriter, CHECKPOINTS_DIR,
    CURVES_FILE, METRICS_FILE,
};
use crate::train::metrics::MetricsLog;
use crate::train::model::Trainable;
use crate::train::source::BatchSource;
use crate::train::trainer::{StepReport, Trainer};
use crate::train::validate::{ValidReport, Validator};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// When to stop and validate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunOptions {
    /// Stop once the run has made this many updates in all (a resumed run counts from its
    /// checkpoint's step).
    pub max_steps: u64,
    /// Stop after the update during which this many seconds of training have passed.
    pub time_limit: Option<f64>,
    /// Validate after every update whose number is a multiple of this (0: only at the end).
    pub valid_every: u64,
}

/// What a run writes, and where.
pub struct Output<'a> {
    /// The model directory: the run is saved here at the end (created when missing).
    pub dir: PathBuf,
    /// Stages the tokenizer's files in every save (of `dir` and of each step checkpoint), so
    /// that each is a complete model directory.
    pub save_tokenizer: &'a dyn Fn(&mut CheckpointWriter) -> Result<()>,
    /// `Some(n)`: append a line to `dir/metrics.jsonl` every n updates (0: never by count), on
    /// every validation and at the last update, and plot `dir/curves.png` at the end.
    /// `None`: no log.
    pub log_every: Option<u64>,
    /// Save a full checkpoint into `dir/checkpoints/step-NNNNNNNN` every N updates (0: never)...
    pub save_every: u64,
    /// ... keeping the last K (at least one).
    pub keep_last: usize,
    /// Also save the run into `dir` itself every N updates (0: only at the end).
    pub save_into_dir_every: u64,
    /// Also save the run into `dir` once this many seconds have passed since it was last
    /// saved there (or since the start), so that a killed run loses at most that much.
    pub autosave: Option<f64>,
}

/// What the caller hears of a run (a progress bar, log lines). Every method does nothing by
/// default.
pub trait Reporter {
    /// After every update, with the tokens per second and the seconds since the run started.
    fn step(&mut self, _report: &StepReport, _tokens_per_s: f64, _seconds: f64) {}
    /// After a validation inside the loop (the update's report, the tokens per second).
    fn validated(&mut self, _report: &StepReport, _valid: &ValidReport, _tokens_per_s: f64) {}
    /// When the time limit stops the run, after update `step`.
    fn time_limit(&mut self, _step: u64) {}
    /// After the last update, before the final save.
    fn finish(&mut self) {}
}

/// A reporter that reports nothing.
pub struct Silent;
impl Reporter for Silent {}

/// How a run ended.
#[derive(Debug)]
pub struct RunSummary {
    /// The step the run started from (0 for a fresh run, the checkpoint's on resume).
    pub start_step: u64,
    /// The step the run reached.
    pub step: u64,
    /// The time limit stopped the run.
    pub timed_out: bool,
    /// Tokens processed (see [`StepReport::tokens`]) and seconds, from the start of the run
    /// to the end of the final validation.
    pub tokens: usize,
    /// Seconds from the start of the run to the end of the final validation.
    pub seconds: f64,
    /// The final model's validation (loss and NLL, no extras), when there is a validator: the
    /// loop's own when it validated the last update, else made after the final save.
    pub valid: Option<ValidReport>,
    /// The curves' picture, or why it could not be drawn (when a metrics log was written).
    pub curves: Option<std::result::Result<PathBuf, String>>,
}

/// Draws the metrics log `log` into `picture` (the training curves), or says why not.
#[cfg(feature = "viz")]
fn plot_curves(log: &Path, picture: PathBuf) -> std::result::Result<PathBuf, String> {
    crate::viz::plot_metrics(log, &picture)
        .map(|()| picture)
        .map_err(|e| e.to_string())
}

/// Without the `viz` feature there are no pictures: the reason, naming the feature.
#[cfg(not(feature = "viz"))]
fn plot_curves(_log: &Path, picture: PathBuf) -> std::result::Result<PathBuf, String> {
    Err(format!(
        "{}: this build has no pictures (the crate's feature `viz` is off)",
        picture.display()
    ))
}

/// Trains until `options.max_steps` updates or the time limit; see the module's description.
pub fn run<M, S>(
    trainer: &mut Trainer<M, S>,
    options: &RunOptions,
    output: Option<&Output>,
    validator: Option<&dyn Validator<M>>,
    reporter: &mut dyn Reporter,
) -> Result<RunSummary>
where
    M: Trainable,
    S: BatchSource<Part = M::Part>,
{
    let ranks = trainer.communicator().size();
    let root = trainer.communicator().rank() == 0;
    let (output, validator) = if root {
        (output, validator)
    } else {
        (None, None)
    };
    let mut silent = Silent;
    let reporter: &mut dyn Reporter = if root { reporter } else { &mut silent };
    if let Some(out) = output {
        std::fs::create_dir_all(&out.dir).map_err(|cause| Error::Write {
            path: out.dir.clone(),
            cause,
        })?;
        // Leftovers of a run that was killed: finish its last save, drop half-staged ones.
        atomic::recover(&out.dir)?;
        atomic::remove_stale_staging(&out.dir.join(CHECKPOINTS_DIR))?;
    }
    let mut metrics = match output {
        Some(out) if out.log_every.is_some() => {
            Some(MetricsLog::open(&out.dir.join(METRICS_FILE))?)
        }
        _ => None,
    };
    let start_step = trainer.state.step;
    let started = Instant::now();
    let mut saved = Saved {
        at: Instant::now(),
        last: None,
    };
    let mut tokens = 0usize;
    let mut timed_out = false;
    let mut last_valid: Option<(u64, ValidReport)> = None;
    while trainer.state.step < options.max_steps {
        let report = trainer
            .step()
            .map_err(|e| saved.diverged(trainer.state.step + 1, e))?;
        tokens += report.tokens;
        let rate = tokens as f64 / started.elapsed().as_secs_f64();
        reporter.step(&report, rate, started.elapsed().as_secs_f64());
        let step = report.step;
        let valid = match validator {
            Some(v) if options.valid_every > 0 && step % options.valid_every == 0 => {
                let valid = v.validate(&trainer.model, true)?;
                reporter.validated(&report, &valid, rate);
                Some(valid)
            }
            _ => None,
        };
        timed_out = options
            .time_limit
            .is_some_and(|secs| started.elapsed().as_secs_f64() >= secs);
        if ranks > 1 && options.time_limit.is_some() {
            timed_out = !crate::dist::all_ok(trainer.communicator(), !timed_out);
        }
        let last = step == options.max_steps || timed_out;
        if let (Some(log), Some(out)) = (metrics.as_mut(), output) {
            log.add(&report);
            let every = out.log_every.unwrap_or(0);
            if (every > 0 && step % every == 0) || last || valid.is_some() {
                log.write(
                    &report,
                    valid.as_ref(),
                    rate,
                    started.elapsed().as_secs_f64(),
                )?;
            }
        }
        if let Some(out) = output {
            if out.save_every > 0 && step % out.save_every == 0 {
                save_step_checkpoint(trainer, out, &mut saved)?;
            }
            let every = out.save_into_dir_every;
            let periodic = every > 0 && step % every == 0;
            let autosave = out
                .autosave
                .is_some_and(|secs| saved.at.elapsed().as_secs_f64() >= secs);
            if (periodic || autosave) && !last {
                save_into(trainer, out, &out.dir, &mut saved)?;
            }
        }
        if let Some(valid) = valid {
            last_valid = Some((step, valid));
        }
        if timed_out {
            reporter.time_limit(step);
            break;
        }
    }
    reporter.finish();
    let mut curves = None;
    if let Some(out) = output {
        save_into(trainer, out, &out.dir, &mut saved)?;
        let log = out.dir.join(METRICS_FILE);
        if metrics.is_some() && std::fs::metadata(&log).is_ok_and(|m| m.len() > 0) {
            let picture = out.dir.join(CURVES_FILE);
            curves = Some(plot_curves(&log, picture));
        }
    }
    let valid = match (validator, last_valid) {
        (Some(_), Some((step, valid))) if step == trainer.state.step => Some(valid),
        (Some(v), _) => Some(v.validate(&trainer.model, false)?),
        (None, _) => None,
    };
    Ok(RunSummary {
        start_step,
        step: trainer.state.step,
        timed_out,
        tokens,
        seconds: started.elapsed().as_secs_f64(),
        valid,
        curves,
    })
}

/// When and where the run last saved, for the autosave and for what a diverged run keeps.
struct Saved {
    at: Instant,
    last: Option<(u64, PathBuf)>,
}

impl Saved {
    /// `error` as the run's end when it is a divergence (a loss, gradient norm, weight or
    /// moment that is not finite, at update `step`), saying which checkpoint is kept.
    fn diverged(&self, step: u64, error: Error) -> Error {
        let reason = match &error {
            Error::NonFiniteLoss { .. } | Error::NotFinite { .. } => error.to_string(),
            _ => return error,
        };
        let kept = match &self.last {
            Some((s, dir)) => format!(
                "and the last checkpoint it saved (step {s}, {}) is kept",
                dir.display()
            ),
            None => "before this run saved anything (checkpoints saved earlier are kept)".into(),
        };
        Error::Diverged { step, reason, kept }
    }
}

/// Saves the run (model, optimizer, state, tokenizer) as the checkpoint of `dir`, all or
/// nothing.
fn save_into<M, S>(
    trainer: &mut Trainer<M, S>,
    out: &Output,
    dir: &Path,
    saved: &mut Saved,
) -> Result<()>
where
    M: Trainable,
    S: BatchSource<Part = M::Part>,
{
    let step = trainer.state.step;
    let result = (|| {
        let mut writer = CheckpointWriter::begin(dir)?;
        trainer.write(&mut writer)?;
        (out.save_tokenizer)(&mut writer)?;
        writer.commit()
    })();
    result.map_err(|e| saved.diverged(step, e))?;
    saved.at = Instant::now();
    saved.last = Some((step, dir.to_path_buf()));
    Ok(())
}

/// Saves a full checkpoint (with the tokenizer) as `OUT/checkpoints/step-NNNNNNNN` and, once
/// it is complete, deletes all but the last `keep_last` of them.
fn save_step_checkpoint<M, S>(
    trainer: &mut Trainer<M, S>,
    out: &Output,
    saved: &mut Saved,
) -> Result<()>
where
    M: Trainable,
    S: BatchSource<Part = M::Part>,
{
    let root = out.dir.join(CHECKPOINTS_DIR);
    let dir = root.join(step_checkpoint_name(trainer.state.step));
    let at = saved.at;
    save_into(trainer, out, &dir, saved)?;
    // A step checkpoint does not reset the autosave of the run directory.
    saved.at = at;
    atomic::remove_stale_staging(&root)?;
    let all = list_step_checkpoints(&root);
    for old in &all[..all.len().saturating_sub(out.keep_last.max(1))] {
        atomic::remove_checkpoint(old)?;
    }
    Ok(())
}
