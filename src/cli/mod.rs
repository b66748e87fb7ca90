//! The command-line interface: one file per subcommand.

pub mod attention;
pub mod average;
pub mod bench;
pub mod bench_generate;
pub mod bleu;
pub mod chat;
pub mod demo;
pub mod embed;
pub mod generate;
pub mod loadtest;
pub mod loadtest_translate;
pub mod perplexity;
pub mod score;
pub mod serve;
pub mod train;
pub mod train_lm;
pub mod translate;

/// `println!` that returns the write's error instead of panicking: a closed stdout (`| head`)
/// ends the command quietly ([`is_broken_pipe`]).
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*)
    }};
}
pub(crate) use outln;

/// Whether `error` comes from writing to a closed pipe (`transformer generate | head`): the
/// reader has what it wanted, so the command ends quietly with exit status 0.
pub fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

use crate::dist::Communicator;
use crate::train::run::{Reporter, RunSummary};
use crate::train::trainer::StepReport;
use crate::train::validate::ValidReport;
use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::Path;
use std::sync::Arc;

#[derive(Parser, Debug)]
#[command(
    name = "transformer",
    version,
    about = "The Transformer of \"Attention Is All You Need\": train, translate, score and benchmark on the CPU"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Train an encoder-decoder model on `source<TAB>target` pairs.
    Train(Box<train::TrainArgs>),
    /// Translate source lines from stdin to stdout (greedy decoding, or beam search: --beam).
    Translate(translate::TranslateArgs),
    /// Print log p(target | source) (natural log) for each `source<TAB>target` line on stdin.
    Score(score::ScoreArgs),
    /// The embedded default: learn English number words -> German number words, in minutes.
    Demo(demo::DemoArgs),
    /// Time training steps on random tokens (--lm: a decoder-only step and peak memory), or
    /// translation of a file with a trained model (--translate), or prompt and decode speed of
    /// a language model (--generate).
    Bench(bench::BenchArgs),
    /// Sentence embeddings of stdin lines with a pretrained BERT encoder (e.g. all-MiniLM-L6-v2),
    /// one JSON line each.
    Embed(embed::EmbedArgs),
    /// Average the parameters of checkpoints of one translation model into a model directory.
    Average(average::AverageArgs),
    /// Corpus BLEU (sacreBLEU defaults) of hypotheses (file or stdin) against `--ref`.
    Bleu(bleu::BleuArgs),
    /// Heat maps of every layer's and head's attention weights for one sentence pair: three
    /// PNG/SVG files.
    Attention(attention::AttentionArgs),
    /// Train a GPT-style decoder-only language model (byte-level BPE) on a text file.
    TrainLm(train_lm::TrainLmArgs),
    /// Continue a prompt with a language model (sampling, KV cache), streamed to stdout.
    Generate(generate::GenerateArgs),
    /// Talk with a chat model (a Llama-family GGUF or Hugging Face directory), line by line.
    Chat(chat::ChatArgs),
    /// Loss per token, perplexity and bits per character of stdin (one document) under a
    /// language model.
    Perplexity(perplexity::PerplexityArgs),
    /// Serve a model over HTTP: OpenAI-compatible completions and chat (streamed, continuous
    /// batching over a paged KV cache) and embeddings, LibreTranslate's /translate, a page at
    /// `/`, Prometheus `/metrics`.
    Serve(serve::ServeArgs),
    /// Load-test an OpenAI-compatible server on loopback: throughput, p50/p99 latency and
    /// time to first token at several concurrencies (or, with --translate, a translation
    /// server's /translate).
    Loadtest(loadtest::LoadtestArgs),
}

impl Command {
    /// The `--threads` of the commands that have one.
    fn threads(&self) -> Option<usize> {
        Some(match self {
            Command::Train(a) => a.threads,
            Command::Translate(a) => a.threads,
            Command::Score(a) => a.threads,
            Command::Demo(a) => a.threads,
            Command::Bench(a) => a.threads,
            Command::Embed(a) => a.threads,
            Command::Attention(a) => a.threads,
            Command::TrainLm(a) => a.threads,
            Command::Generate(a) => a.threads,
            Command::Chat(a) => a.threads,
            Command::Perplexity(a) => a.threads,
            // The server sizes the pool itself: its async runtime must not run on a pool worker.
            Command::Average(_) | Command::Bleu(_) | Command::Serve(_) | Command::Loadtest(_) => {
                return None
            }
        })
    }
}

/// Runs one parsed command line. Commands with `--threads` run on a worker of the thread pool
/// they size: the many small parallel loops of a decoding step then start on a pool thread
/// instead of waking the pool from outside and sleeping until it is done (with one thread,
/// they run inline with no hand-off at all).
pub fn run(cli: Cli) -> Result<()> {
    match cli.command.threads() {
        Some(threads) => {
            set_threads(threads)?;
            rayon::scope(|_| dispatch(cli.command))
        }
        None => dispatch(cli.command),
    }
}

fn dispatch(command: Command) -> Result<()> {
    match command {
        Command::Train(a) => train::run(*a),
        Command::Translate(a) => translate::run(a),
        Command::Score(a) => score::run(a),
        Command::Demo(a) => demo::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Embed(a) => embed::run(a),
        Command::Average(a) => average::run(a),
        Command::Bleu(a) => bleu::run(a),
        Command::Attention(a) => attention::run(a),
        Command::TrainLm(a) => train_lm::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Perplexity(a) => perplexity::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Loadtest(a) => loadtest::run(a),
    }
}

/// The most worker threads per available core (`--threads` above is capped, with a warning).
pub const MAX_THREADS_PER_CORE: usize = 4;

/// The sampling settings of `generate` and `chat`, checked: `--temperature` finite and >= 0,
/// `--top-p` in (0, 1].
pub fn sampling_options(
    temperature: f64,
    top_k: usize,
    top_p: f64,
) -> Result<crate::decode::sample::SamplingOptions> {
    if !(temperature.is_finite() && temperature >= 0.0) {
        anyhow::bail!("--temperature {temperature} must be >= 0");
    }
    if !(top_p > 0.0 && top_p <= 1.0) {
        anyhow::bail!("--top-p {top_p} must be in (0, 1]");
    }
    Ok(crate::decode::sample::SamplingOptions {
        temperature,
        top_k,
        top_p,
    })
}

/// Sets the number of worker threads (0: all cores) for the whole process; more than
/// [`MAX_THREADS_PER_CORE`] per available core are capped with a warning (they only slow the
/// run down, and thousands of them stall it).
pub fn set_threads(threads: usize) -> Result<usize> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cap = cores.saturating_mul(MAX_THREADS_PER_CORE);
    let n = match threads {
        0 => cores,
        n if n > cap => {
            // Once per process (the pool is set up before the command and by it).
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                eprintln!(
                    "warning: --threads {n} is more than {MAX_THREADS_PER_CORE} per available \
                     core ({cores}); using {cap}"
                )
            });
            cap
        }
        n => n,
    };
    // A second call in the same process (tests) keeps the first pool.
    // Commands run on a worker (see `run`), so workers get a main thread's stack.
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .stack_size(8 << 20)
        .build_global();
    Ok(rayon::current_num_threads())
}

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

/// Refuses a directory argument that is missing or a file, naming the flag.
pub fn check_dir(flag: &str, dir: &Path) -> Result<()> {
    if dir.is_dir() {
        Ok(())
    } else if dir.exists() {
        anyhow::bail!("{flag} {}: is a file, not a directory", dir.display())
    } else {
        anyhow::bail!("{flag} {}: directory does not exist", dir.display())
    }
}

/// Refuses an `--out` that already holds a run or a model, unless it is the run being resumed
/// (`--resume` is `--out` or inside it) or `--overwrite` is given; an `--out` that is a file is
/// refused always. `resumable`: the command has `--resume` (the message suggests it).
pub fn check_out(
    out: &Path,
    resume: Option<&Path>,
    overwrite: bool,
    resumable: bool,
) -> Result<()> {
    if out.exists() && !out.is_dir() {
        anyhow::bail!("--out {}: is a file, not a directory", out.display());
    }
    let Some(found) = crate::store::existing_run(out) else {
        return Ok(());
    };
    if resume.is_some_and(|r| crate::store::same_or_inside(r, out)) || overwrite {
        return Ok(());
    }
    let resume = if resumable {
        format!("give --resume {} to continue it, ", out.display())
    } else {
        String::new()
    };
    anyhow::bail!(
        "--out {} already holds a run or a model ({found}); {resume}give --overwrite to \
         replace it, or another --out",
        out.display()
    )
}

/// With `--overwrite`, deletes the run or model `out` holds (its checkpoint files, metrics,
/// curves and step checkpoints; nothing else), unless the run resumes from inside it.
pub fn clear_out(out: &Path, resume: Option<&Path>, overwrite: bool) -> Result<()> {
    if overwrite && !resume.is_some_and(|r| crate::store::same_or_inside(r, out)) {
        if let Some(found) = crate::store::existing_run(out) {
            eprintln!(
                "--overwrite: deleting the run in {} ({found}, ...)",
                out.display()
            );
            crate::store::clear_run(out)?;
        }
    }
    Ok(())
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

/// The `--autosave` help of the training commands.
pub const AUTOSAVE_HELP: &str = "Also save the run into OUT whenever this many seconds have \
    passed since it was last saved there (0: off), so that a run that is killed loses at most \
    that much; resume it with --resume OUT --out OUT";

/// The `--overwrite` help of the commands that write a model directory.
pub const OVERWRITE_HELP: &str = "Replace the run or model that --out already holds (its \
    checkpoint files, metrics and step checkpoints are deleted first); without it such an \
    --out is refused, unless it is the run being resumed";

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

/// Prints where a run's training curves went, or why there are none.
pub fn print_curves(summary: &RunSummary) {
    match &summary.curves {
        Some(Ok(path)) => eprintln!("training curves: {}", path.display()),
        Some(Err(e)) => eprintln!("warning: no training curves: {e}"),
        None => {}
    }
}

/// The `--threads` help of the training commands.
pub const TRAIN_THREADS_HELP: &str = "Worker threads (0: all cores). With 2 or more, training \
    splits every batch in two halves that run side by side on the model and a replica (data \
    parallelism, each half's matrix products on a single thread): always two halves, whatever \
    the count beyond 2; extra threads only serve the other parallel loops (attention, the \
    optimizer, validation). Under mpirun (a build with --features mpi): the threads of each \
    process, which splits its share of every batch the same way. Runs are reproducible bit for \
    bit at the same thread and process count";

/// Formats the per-step fields of the progress bar.
pub fn bar_message(loss: f64, lr: f64, tokens_per_s: f64) -> String {
    format!("loss {loss:.3} lr {lr:.2e} {tokens_per_s:.0} tok/s")
}

/// Reads all of stdin, naming it in errors.
pub fn read_stdin_lines() -> Result<Vec<String>> {
    let lines = crate::text::corpus::read_lines(std::io::stdin().lock(), "<stdin>")
        .context("reading standard input")?;
    Ok(lines)
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

/// What `train --resume` and `train-lm --resume` print: the run, its step and its precision.
pub fn resumed_line<R: crate::train::source::Recipe>(
    dir: &std::path::Path,
    state: &crate::train::state::TrainerState<R>,
) -> String {
    format!(
        "resumed {} at step {} (precision {})",
        dir.display(),
        state.step,
        state.config.precision()
    )
}

/// `--precision` of the inference commands: the numbers the weights are multiplied in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PrecisionArg {
    /// float32 (a GGUF file dequantised at load): the default.
    #[default]
    F32,
    /// bf16 weights and activations, float32 sums.
    Bf16,
    /// int8 weights per output row, activations quantised per row on the fly.
    Int8,
    /// A GGUF file's Q4_0/Q4_1/Q8_0 blocks as stored (GGUF only).
    Ggml,
}

impl PrecisionArg {
    /// For a decoder language model.
    pub fn model_precision(self) -> crate::pipeline::generate::ModelPrecision {
        use crate::pipeline::generate::ModelPrecision as M;
        match self {
            PrecisionArg::F32 => M::F32,
            PrecisionArg::Bf16 => M::Bf16,
            PrecisionArg::Int8 => M::Int8,
            PrecisionArg::Ggml => M::Ggml,
        }
    }

    /// For a model of float weights (translation, embeddings): `ggml` is refused.
    pub fn float_precision(self) -> anyhow::Result<crate::kernels::lowp::Precision> {
        use crate::kernels::lowp::Precision as P;
        Ok(match self {
            PrecisionArg::F32 => P::F32,
            PrecisionArg::Bf16 => P::Bf16,
            PrecisionArg::Int8 => P::Int8,
            PrecisionArg::Ggml => anyhow::bail!("--precision ggml is for .gguf models only"),
        })
    }
}
