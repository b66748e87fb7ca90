//! `transformer.train` and `transformer.train_lm`: the runs of `transformer train` (a
//! translation model on sentence pairs) and `transformer train-lm` (a decoder-only language
//! model on a text), with the same options and defaults, and a progress callback in place of
//! the progress bar.
//!
//! The run holds no GIL; the callback takes it for each call. It is called with one dict per
//! event: `{"event": "step", "step", "loss", "nll", "lr", "tokens_per_s", "seconds"}` after
//! every update, `{"event": "valid", "step", "loss", "nll", "bits_per_char", "bleu"}` after a
//! validation, `{"event": "time_limit", "step"}`. An exception it raises stops calling it and
//! is raised again once the run has saved.

use crate::{check_exists, py_err};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use transformer::dist::Communicator;
use transformer::kernels::lowp::bf16_train::Bf16Kernel;
use transformer::store::{clear_run, existing_run, same_or_inside, CheckpointWriter};
use transformer::text::vocab::VocabLevel;
use transformer::train::pairs::TrainConfig;
use transformer::train::run::{run as run_training, Output, Reporter, RunOptions, RunSummary};
use transformer::train::schedule::Cooldown;
use transformer::train::setup::lm::{self as lm_setup, LmModelSpec, LmPlan, LmSpec, LmText};
use transformer::train::setup::pairs::{
    self as pair_setup, ModelBase, PairCorpora, PairFiles, PairModelSpec, PairPlan, PairSpec,
    VocabSpec,
};
use transformer::train::setup::Start;
use transformer::train::trainer::StepReport;
use transformer::train::validate::{ValidReport, Validator};
use transformer::train::windows::LmTrainConfig;
use transformer::TrainPrecision;

/// A keyword's value parsed through its kebab-case config name (`gelu-tanh`, `rotary`, ...).
fn kebab<T: serde::de::DeserializeOwned>(what: &str, value: &str) -> PyResult<T> {
    serde_json::from_value(serde_json::Value::String(value.to_string()))
        .map_err(|e| PyValueError::new_err(format!("{what}={value:?}: {e}")))
}

fn bad(message: String) -> PyErr {
    PyValueError::new_err(message)
}

/// The checks both runs make of their shared options (as the command line's).
fn check_run(
    label_smoothing: f64,
    time_limit: Option<f64>,
    autosave: f64,
    resume: Option<&Path>,
    out: &Path,
    overwrite: bool,
) -> PyResult<()> {
    if !(0.0..1.0).contains(&label_smoothing) {
        return Err(bad(format!(
            "label_smoothing={label_smoothing} must be in [0, 1)"
        )));
    }
    if let Some(t) = time_limit.filter(|t| !(t.is_finite() && *t > 0.0)) {
        return Err(bad(format!(
            "time_limit={t} must be a positive number of seconds"
        )));
    }
    if !(autosave.is_finite() && autosave >= 0.0) {
        return Err(bad(format!(
            "autosave={autosave} must be 0 (off) or a positive number of seconds"
        )));
    }
    if let Some(dir) = resume {
        check_exists(dir, "resume directory")?;
    }
    if out.exists() && !out.is_dir() {
        return Err(bad(format!(
            "out={}: is a file, not a directory",
            out.display()
        )));
    }
    if let Some(found) = existing_run(out) {
        if !(overwrite || resume.is_some_and(|r| same_or_inside(r, out))) {
            return Err(bad(format!(
                "out={} already holds a run ({found}): give resume to continue it, \
                 overwrite=True to replace it, or another directory",
                out.display()
            )));
        }
    }
    Ok(())
}

/// Readies `out` for the run: with `overwrite` the run it held deleted, the directory made.
fn make_out(out: &Path, resume: Option<&Path>, overwrite: bool) -> transformer::Result<()> {
    if overwrite && !resume.is_some_and(|r| same_or_inside(r, out)) && existing_run(out).is_some() {
        clear_run(out)?;
    }
    std::fs::create_dir_all(out).map_err(|cause| transformer::Error::Write {
        path: out.to_path_buf(),
        cause,
    })
}

/// The progress callback as a [`Reporter`]; the first exception it raises is kept.
struct Callback {
    function: Option<Py<PyAny>>,
    error: Option<PyErr>,
}

impl Callback {
    fn new(function: Option<Py<PyAny>>) -> Self {
        Callback {
            function,
            error: None,
        }
    }

    /// Calls the function with a dict of `fields` (GIL taken for the call).
    fn call(&mut self, fill: impl FnOnce(&Bound<'_, PyDict>) -> PyResult<()>) {
        let Some(function) = &self.function else {
            return;
        };
        if self.error.is_some() {
            return;
        }
        let outcome = Python::attach(|py| {
            let event = PyDict::new(py);
            fill(&event)?;
            function.call1(py, (event,)).map(|_| ())
        });
        if let Err(e) = outcome {
            self.error = Some(e);
        }
    }
}

impl Reporter for Callback {
    fn step(&mut self, r: &StepReport, tokens_per_s: f64, seconds: f64) {
        self.call(|d| {
            d.set_item("event", "step")?;
            d.set_item("step", r.step)?;
            d.set_item("loss", r.loss)?;
            d.set_item("nll", r.nll)?;
            d.set_item("lr", r.lr)?;
            d.set_item("tokens_per_s", tokens_per_s)?;
            d.set_item("seconds", seconds)
        });
    }
    fn validated(&mut self, r: &StepReport, v: &ValidReport, _tokens_per_s: f64) {
        self.call(|d| {
            d.set_item("event", "valid")?;
            d.set_item("step", r.step)?;
            d.set_item("loss", v.loss)?;
            d.set_item("nll", v.nll)?;
            d.set_item("bits_per_char", v.bits_per_char)?;
            d.set_item("bleu", v.bleu.as_ref().map(|b| b.score))
        });
    }
    fn time_limit(&mut self, step: u64) {
        self.call(|d| {
            d.set_item("event", "time_limit")?;
            d.set_item("step", step)
        });
    }
}

/// The run's summary as a dict: `step`, `start_step`, `timed_out`, `tokens`, `seconds`,
/// `valid_loss`, `valid_nll`, `valid_bits_per_char`, `out`.
fn summary_dict<'py>(py: Python<'py>, s: &RunSummary, out: &Path) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("step", s.step)?;
    d.set_item("start_step", s.start_step)?;
    d.set_item("timed_out", s.timed_out)?;
    d.set_item("tokens", s.tokens)?;
    d.set_item("seconds", s.seconds)?;
    d.set_item("valid_loss", s.valid.as_ref().map(|v| v.loss))?;
    d.set_item("valid_nll", s.valid.as_ref().map(|v| v.nll))?;
    d.set_item(
        "valid_bits_per_char",
        s.valid.as_ref().and_then(|v| v.bits_per_char),
    )?;
    d.set_item("out", out.to_path_buf())?;
    Ok(d)
}

/// The bf16 product kernel by name (`gemm`, `packed`, `avx512`, `portable`).
fn parse_bf16_kernel(name: &str) -> PyResult<Bf16Kernel> {
    Bf16Kernel::parse(name).map_err(|e| bad(format!("bf16_kernel={name:?}: {e}")))
}

/// The training precision by name (`f32`, `bf16`).
fn train_precision(name: &str) -> PyResult<TrainPrecision> {
    match name {
        "f32" => Ok(TrainPrecision::F32),
        "bf16" => Ok(TrainPrecision::Bf16),
        other => Err(bad(format!(
            "precision={other:?} is not \"f32\" or \"bf16\""
        ))),
    }
}

/// Runs `body` on `threads` workers (0: all cores) with the GIL released.
fn on_threads<R: Send>(
    py: Python<'_>,
    threads: usize,
    body: impl FnOnce() -> R + Send,
) -> PyResult<R> {
    let pool = crate::Pool::new(Some(threads))?;
    Ok(py.detach(|| pool.run(body)))
}

/// Trains a decoder-only language model on the UTF-8 text file `text` (its last
/// `valid_fraction` held out), as `transformer train-lm`, saving into `out`; returns the
/// run's summary.
#[pyfunction]
#[pyo3(signature = (text, out, *, valid_fraction = 0.05, resume = None, vocab_size = 4096,
    context = 128, batch = 16, d_model = 256, n_heads = 4, d_ff = 1024, layers = 4,
    dropout = 0.1, pre_ln = false, activation = "gelu-tanh", positions = "sinusoidal",
    normalization = "layer-norm", n_kv_heads = None, no_bias = false, rope_base = 10000.0,
    untied = false, qkv_bias = false, qk_norm = false, sliding_window = None,
    max_steps = 5000, time_limit = None, precision = "f32", bf16_kernel = "gemm", lr = 5e-4,
    warmup = 200, clip_norm = 1.0, label_smoothing = 0.0, seed = 1, threads = 0,
    eval_every = 500, log_every = 100, save_every = 0, keep_last = 5, autosave = 600.0,
    overwrite = false, progress = None))]
#[allow(clippy::too_many_arguments)]
pub fn train_lm<'py>(
    py: Python<'py>,
    text: PathBuf,
    out: PathBuf,
    valid_fraction: f64,
    resume: Option<PathBuf>,
    vocab_size: usize,
    context: usize,
    batch: usize,
    d_model: usize,
    n_heads: usize,
    d_ff: usize,
    layers: usize,
    dropout: f64,
    pre_ln: bool,
    activation: &str,
    positions: &str,
    normalization: &str,
    n_kv_heads: Option<usize>,
    no_bias: bool,
    rope_base: f64,
    untied: bool,
    qkv_bias: bool,
    qk_norm: bool,
    sliding_window: Option<usize>,
    max_steps: u64,
    time_limit: Option<f64>,
    precision: &str,
    bf16_kernel: &str,
    lr: f64,
    warmup: u64,
    clip_norm: f64,
    label_smoothing: f64,
    seed: u64,
    threads: usize,
    eval_every: u64,
    log_every: u64,
    save_every: u64,
    keep_last: usize,
    autosave: f64,
    overwrite: bool,
    progress: Option<Py<PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    check_exists(&text, "text file")?;
    if !(0.0..1.0).contains(&valid_fraction) {
        return Err(bad(format!(
            "valid_fraction={valid_fraction} must be in [0, 1)"
        )));
    }
    if !(clip_norm.is_finite() && clip_norm >= 0.0) {
        return Err(bad(format!("clip_norm={clip_norm} must be >= 0")));
    }
    if context == 0 || batch == 0 || layers == 0 {
        return Err(bad("context, batch and layers must be positive".into()));
    }
    let spec = LmSpec {
        vocab_size,
        model: LmModelSpec {
            d_model,
            n_heads,
            d_ff,
            layers,
            dropout,
            pre_ln,
            activation: kebab("activation", activation)?,
            positions: kebab("positions", positions)?,
            normalization: kebab("normalization", normalization)?,
            n_kv_heads,
            bias: !no_bias,
            rope_base,
            tied: !untied,
            qkv_bias,
            qk_norm,
            sliding_window,
            // The Python API trains exact attention (train-lm --attention is the CLI's).
            attention: transformer::AttentionKind::Exact,
        },
        recipe: LmTrainConfig {
            context,
            batch,
            lr,
            warmup,
            total_steps: max_steps,
            clip_norm: (clip_norm > 0.0).then_some(clip_norm),
            label_smoothing,
            seed,
            precision: train_precision(precision)?,
            ..LmTrainConfig::default()
        },
    };
    let plan = LmPlan {
        start: match &resume {
            Some(dir) => Start::Resume(dir.clone()),
            None => Start::Fresh(spec),
        },
        max_steps,
        bf16_kernel: parse_bf16_kernel(bf16_kernel)?,
    };
    plan.check().map_err(py_err)?;
    let autosave = (autosave > 0.0).then_some(autosave);
    check_run(
        label_smoothing,
        time_limit,
        autosave.unwrap_or(0.0),
        resume.as_deref(),
        &out,
        overwrite,
    )?;
    let mut reporter = Callback::new(progress);
    let summary = on_threads(py, threads, || {
        let comm: Arc<dyn Communicator> = transformer::dist::world()?;
        let read = LmText::read(&text, valid_fraction)?;
        let run = lm_setup::prepare(&read, &plan, comm, &mut |_| {})?;
        let (bpe, mut trainer, validation) = (run.bpe, run.trainer, run.validation);
        make_out(&out, resume.as_deref(), overwrite)?;
        let save_tokenizer = |w: &mut CheckpointWriter| bpe.write(w);
        let output = Output {
            dir: out.clone(),
            save_tokenizer: &save_tokenizer,
            log_every: Some(log_every),
            save_every,
            keep_last,
            save_into_dir_every: eval_every,
            autosave,
        };
        let options = RunOptions {
            max_steps,
            time_limit,
            valid_every: eval_every,
        };
        let validator = validation.as_ref().map(|v| v as &dyn Validator<_>);
        run_training(
            &mut trainer,
            &options,
            Some(&output),
            validator,
            &mut reporter,
        )
    })?
    .map_err(py_err)?;
    if let Some(e) = reporter.error {
        return Err(e);
    }
    summary_dict(py, &summary, &out)
}

/// Trains a translation model on sentence pairs, as `transformer train`: `train_file` a
/// `source<TAB>target` file (or `src_file` and `tgt_file`, parallel line files), validation
/// on `valid` (or `valid_src` / `valid_tgt`), saving into `out`; returns the run's summary.
#[pyfunction]
#[pyo3(signature = (out, train_file = None, *, src_file = None, tgt_file = None, valid = None,
    valid_src = None, valid_tgt = None, resume = None, preset = "tiny", config = None,
    max_steps = 1000, time_limit = None, seed = 1, threads = 0, tokens_per_batch = 4000,
    accumulate = 1, clip_norm = None, warmup = 4000, lr_factor = 1.0, cooldown = None,
    label_smoothing = 0.1, dropout = None, attention_dropout = None,
    activation_dropout = None, word_dropout = 0.0, precision = "f32", bf16_kernel = "gemm",
    pre_ln = false, vocab_level = "char", vocab_size = 8000, max_len = None, save_every = 0,
    keep_last = 5, autosave = 600.0, overwrite = false, log_every = 100, valid_every = 0,
    valid_bleu_lines = 0, progress = None))]
#[allow(clippy::too_many_arguments)]
pub fn train<'py>(
    py: Python<'py>,
    out: PathBuf,
    train_file: Option<PathBuf>,
    src_file: Option<PathBuf>,
    tgt_file: Option<PathBuf>,
    valid: Option<PathBuf>,
    valid_src: Option<PathBuf>,
    valid_tgt: Option<PathBuf>,
    resume: Option<PathBuf>,
    preset: &str,
    config: Option<PathBuf>,
    max_steps: u64,
    time_limit: Option<f64>,
    seed: u64,
    threads: usize,
    tokens_per_batch: usize,
    accumulate: usize,
    clip_norm: Option<f64>,
    warmup: u64,
    lr_factor: f64,
    cooldown: Option<u64>,
    label_smoothing: f64,
    dropout: Option<f64>,
    attention_dropout: Option<f64>,
    activation_dropout: Option<f64>,
    word_dropout: f64,
    precision: &str,
    bf16_kernel: &str,
    pre_ln: bool,
    vocab_level: &str,
    vocab_size: usize,
    max_len: Option<usize>,
    save_every: u64,
    keep_last: usize,
    autosave: f64,
    overwrite: bool,
    log_every: u64,
    valid_every: u64,
    valid_bleu_lines: usize,
    progress: Option<Py<PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let files = |tsv: Option<PathBuf>, src: Option<PathBuf>, tgt: Option<PathBuf>, what: &str| {
        match (tsv, src, tgt) {
            (Some(path), None, None) => Ok(Some(PairFiles::Tsv(path))),
            (None, Some(source), Some(target)) => Ok(Some(PairFiles::Parallel { source, target })),
            (None, None, None) => Ok(None),
            _ => Err(bad(format!(
                "give the {what} data as one tab-separated file or as a source and a target file, not both or half"
            ))),
        }
    };
    let train_files = files(train_file, src_file, tgt_file, "training")?.ok_or_else(|| {
        bad("give train_file (source<TAB>target) or src_file and tgt_file".into())
    })?;
    let valid_files = files(valid, valid_src, valid_tgt, "validation")?;
    for f in std::iter::once(&train_files).chain(valid_files.as_ref()) {
        match f {
            PairFiles::Tsv(p) => check_exists(p, "data file")?,
            PairFiles::Parallel { source, target } => {
                check_exists(source, "data file")?;
                check_exists(target, "data file")?;
            }
        }
    }
    if let Some(c) = &config {
        check_exists(c, "config file")?;
    }
    let level = match vocab_level {
        "char" => VocabLevel::Char,
        "word" => VocabLevel::Word,
        "bpe" => VocabLevel::Bpe,
        other => {
            return Err(bad(format!(
                "vocab_level={other:?} is not \"char\", \"word\" or \"bpe\""
            )))
        }
    };
    let spec = PairSpec {
        vocab: VocabSpec {
            level,
            bpe_size: vocab_size,
        },
        model: PairModelSpec {
            base: match &config {
                Some(path) => ModelBase::File(path.clone()),
                None => ModelBase::Preset(preset.to_string()),
            },
            dropout,
            attention_dropout,
            activation_dropout,
            pre_ln,
            // The Python API trains exact attention (train --attention is the CLI's).
            attention: None,
        },
        recipe: TrainConfig {
            label_smoothing,
            warmup,
            lr_factor,
            tokens_per_batch,
            accumulate,
            clip_norm,
            seed,
            word_dropout,
            precision: train_precision(precision)?,
            cooldown: Cooldown::last(cooldown.unwrap_or(0), max_steps),
            ..TrainConfig::default()
        },
    };
    let plan = PairPlan {
        start: match &resume {
            Some(dir) => Start::Resume(dir.clone()),
            None => Start::Fresh(spec),
        },
        max_len,
        max_steps,
        cooldown,
        bf16_kernel: parse_bf16_kernel(bf16_kernel)?,
    };
    plan.check().map_err(py_err)?;
    let autosave = (autosave > 0.0).then_some(autosave);
    check_run(
        label_smoothing,
        time_limit,
        autosave.unwrap_or(0.0),
        resume.as_deref(),
        &out,
        overwrite,
    )?;
    let mut reporter = Callback::new(progress);
    let summary = on_threads(py, threads, || {
        let comm: Arc<dyn Communicator> = transformer::dist::world()?;
        let corpora = PairCorpora::read(&train_files, valid_files.as_ref(), &mut |_| {})?;
        let run = pair_setup::prepare(corpora, &plan, comm, &mut |_| {})?;
        let (vocab, mut trainer, valid) = (run.vocab, run.trainer, run.valid);
        make_out(&out, resume.as_deref(), overwrite)?;
        let validation = valid.into_validation(&vocab, &trainer.state.config, valid_bleu_lines);
        let save_vocab = |w: &mut CheckpointWriter| vocab.write(w);
        let output = Output {
            dir: out.clone(),
            save_tokenizer: &save_vocab,
            log_every: Some(log_every),
            save_every,
            keep_last,
            save_into_dir_every: 0,
            autosave,
        };
        let options = RunOptions {
            max_steps,
            time_limit,
            valid_every,
        };
        let validator = validation.as_ref().map(|v| v as &dyn Validator<_>);
        run_training(
            &mut trainer,
            &options,
            Some(&output),
            validator,
            &mut reporter,
        )
    })?
    .map_err(py_err)?;
    if let Some(e) = reporter.error {
        return Err(e);
    }
    summary_dict(py, &summary, &out)
}
