//! What the training commands (`train`, `train-lm`, `train-mlm`, `train-classifier`, `demo`)
//! share at the command line: the checks of their run options, the run's processes, the
//! progress bar and the lines around it, and the run itself ([`drive`]).

use super::args::{check_dir, check_out, clear_out, SaveArgs};
use crate::dist::Communicator;
use crate::store::CheckpointWriter;
use crate::train::model::Trainable;
use crate::train::run::{run as run_training, Output, Reporter, RunOptions, RunSummary};
use crate::train::source::BatchSource;
use crate::train::trainer::{StepReport, Trainer};
use crate::train::validate::{ValidReport, Validator};
use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::Path;
use std::sync::Arc;

/// The checks `train` and `train-lm` share: label smoothing in [0, 1), a positive
/// `--time-limit` (seconds), an `--autosave` of 0 or more seconds, an existing `--resume`
/// directory, and an `--out` that holds no other run unless `--overwrite` (see [`check_out`]).
pub fn check_run_options(
    label_smoothing: f64,
    time_limit: Option<f64>,
    autosave: f64,
    resume: Option<&Path>,
    out: &Path,
    overwrite: bool,
) -> Result<()> {
    if !(0.0..1.0).contains(&label_smoothing) {
        anyhow::bail!("--label-smoothing {label_smoothing} must be in [0, 1)");
    }
    if let Some(t) = time_limit.filter(|t| !(t.is_finite() && *t > 0.0)) {
        anyhow::bail!("--time-limit {t} must be a positive number of seconds");
    }
    if !(autosave.is_finite() && autosave >= 0.0) {
        anyhow::bail!("--autosave {autosave} must be 0 (off) or a positive number of seconds");
    }
    if let Some(dir) = resume {
        check_dir("--resume", dir)?;
    }
    check_out(out, resume, overwrite, true)
}

/// Runs a training command's body with the run's communicator ([`crate::dist::world`]: MPI's
/// world under `mpirun`, else one process). In a distributed run an error on any rank ends every
/// rank (the others would wait for it forever): printed with the rank, then `MPI_Abort`.
pub fn with_world(body: impl FnOnce(Arc<dyn Communicator>) -> Result<()>) -> Result<()> {
    let comm = crate::dist::world()?;
    let result = body(comm.clone());
    match result {
        Err(e) if comm.size() > 1 => {
            eprintln!("error (rank {} of {}): {e:#}", comm.rank(), comm.size());
            comm.abort(1)
        }
        r => r,
    }
}

/// The part of the "model: ..." line about processes: empty for one.
pub fn ranks_note(comm: &dyn Communicator) -> String {
    match comm.size() {
        1 => String::new(),
        n => format!(" per process, {n} processes (MPI)"),
    }
}

/// Prints a line of the library's setup (a warning, the resumed run) on stderr.
pub fn print_note(line: &str) {
    eprintln!("{line}");
}

/// Makes `out` ready for the run (rank 0): the run it held deleted with `--overwrite` (see
/// [`clear_out`]), the directory created.
pub fn make_out(out: &Path, resume: Option<&Path>, overwrite: bool) -> Result<()> {
    clear_out(out, resume, overwrite)?;
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))
}

/// A progress bar for `total` training steps: step, loss, lr, tokens/s and ETA.
pub fn training_bar(total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30} step {pos}/{len} {msg} [{elapsed_precise} < {eta_precise}]",
        )
        .expect("valid template"),
    );
    bar
}

/// A training run's progress bar as a [`Reporter`]: step, loss, lr and tokens/s after every
/// update; the lines `on_valid` makes of each validation, and the time limit, above the bar.
pub struct BarReporter<F> {
    pub bar: ProgressBar,
    on_valid: F,
}

impl<F: FnMut(&StepReport, &ValidReport, f64) -> Vec<String>> BarReporter<F> {
    /// A bar for a run to `max_steps` updates that stands at `step`.
    pub fn new(max_steps: u64, step: u64, on_valid: F) -> Self {
        let bar = training_bar(max_steps);
        bar.set_position(step);
        BarReporter { bar, on_valid }
    }
}

impl<F: FnMut(&StepReport, &ValidReport, f64) -> Vec<String>> Reporter for BarReporter<F> {
    fn step(&mut self, r: &StepReport, tokens_per_s: f64, _seconds: f64) {
        self.bar.set_position(r.step);
        self.bar
            .set_message(bar_message(r.loss, r.lr, tokens_per_s));
    }
    fn validated(&mut self, r: &StepReport, valid: &ValidReport, tokens_per_s: f64) {
        for line in (self.on_valid)(r, valid, tokens_per_s) {
            log_line(&self.bar, line);
        }
    }
    fn time_limit(&mut self, step: u64) {
        log_line(&self.bar, format!("--time-limit reached at step {step}"));
    }
    fn finish(&mut self) {
        self.bar.finish();
    }
}

/// What a training command asks of its run besides the trainer: where it writes, when it
/// stops, validates, logs and saves (see [`Output`] and [`RunOptions`]).
pub struct CommandRun<'a> {
    /// `--out`: the model directory.
    pub out: &'a Path,
    pub options: RunOptions,
    /// `--log-every`.
    pub log_every: u64,
    /// `--save-every`.
    pub save_every: u64,
    /// Save into `out` itself every N updates (0: only at the end and on autosave).
    pub save_into_dir_every: u64,
    /// `--keep-last`, `--autosave`.
    pub save: &'a SaveArgs,
    /// Whether the final "saved" line gives the tokens per second.
    pub tokens_per_s: bool,
}

/// Runs a training command's run on its trainer: the progress bar (with the lines `on_valid`
/// makes of each validation), the loop of [`crate::train::run::run`] writing into `run.out`
/// (every save with the files `save_tokenizer` stages), then on rank 0 the curves, the
/// `final_valid` line of the final validation and the "saved" line.
pub fn drive<M, S>(
    trainer: &mut Trainer<M, S>,
    run: &CommandRun,
    save_tokenizer: &dyn Fn(&mut CheckpointWriter) -> crate::Result<()>,
    validator: Option<&dyn Validator<M>>,
    on_valid: impl FnMut(&StepReport, &ValidReport, f64) -> Vec<String>,
    final_valid: impl FnOnce(&ValidReport) -> String,
) -> Result<()>
where
    M: Trainable,
    S: BatchSource<Part = M::Part>,
{
    let output = Output {
        dir: run.out.to_path_buf(),
        save_tokenizer,
        log_every: Some(run.log_every),
        save_every: run.save_every,
        keep_last: run.save.keep_last,
        save_into_dir_every: run.save_into_dir_every,
        autosave: run.save.autosave_seconds(),
    };
    let mut reporter = BarReporter::new(run.options.max_steps, trainer.state.step, on_valid);
    let summary = run_training(
        trainer,
        &run.options,
        Some(&output),
        validator,
        &mut reporter,
    )?;
    if trainer.communicator().rank() != 0 {
        return Ok(());
    }
    print_curves(&summary);
    if let Some(v) = &summary.valid {
        eprintln!("{}", final_valid(v));
    }
    let rate = match run.tokens_per_s {
        true => format!(
            ", {:.0} tokens/s",
            summary.tokens as f64 / summary.seconds.max(1e-9)
        ),
        false => String::new(),
    };
    eprintln!(
        "saved {} at step {} ({:.1} s{rate})",
        run.out.display(),
        summary.step,
        summary.seconds
    );
    Ok(())
}

/// Prints where a run's training curves went, or why there are none.
pub fn print_curves(summary: &RunSummary) {
    match &summary.curves {
        Some(Ok(path)) => eprintln!("training curves: {}", path.display()),
        Some(Err(e)) => eprintln!("warning: no training curves: {e}"),
        None => {}
    }
}

/// Formats the per-step fields of the progress bar.
pub fn bar_message(loss: f64, lr: f64, tokens_per_s: f64) -> String {
    format!("loss {loss:.3} lr {lr:.2e} {tokens_per_s:.0} tok/s")
}

/// Prints a line above the progress bar, or plainly on stderr when the bar is hidden (not a
/// terminal), so logs keep every line.
pub fn log_line(bar: &ProgressBar, line: String) {
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
}
