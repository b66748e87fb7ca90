//! `transformer train`: train on `source<TAB>target` files, save checkpoints, resume exactly.

use super::{print_curves, set_threads, BarReporter};
use crate::dist::Communicator;
use crate::kernels::lowp::bf16_train::Bf16Kernel;
use crate::model::Module;
use crate::model::{ModelConfig, NormPlacement};
use crate::store::{CheckpointWriter, VOCAB_FILE};
use crate::text::corpus::{read_pairs, read_parallel, Pair};
use crate::text::vocab::{Vocab, VocabLevel};
use crate::train::pairs::{Example, TrainConfig};
use crate::train::precision::TrainPrecision;
use crate::train::run::{run as run_training, Output, RunOptions};
use crate::train::schedule::Cooldown;
use crate::train::source::{Recipe, MAX_STEP};
use crate::train::trainer::PairTrainer;
use crate::train::validate::{BleuCheck, PairValidation, Validator};
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Level {
    Char,
    Word,
    Bpe,
}

#[derive(Args, Debug)]
pub struct TrainArgs {
    /// Training pairs, one `source<TAB>target` per line (UTF-8).
    #[arg(long, required_unless_present = "src_file", conflicts_with_all = ["src_file", "tgt_file"])]
    pub train: Option<PathBuf>,
    /// Training sources, one per line, parallel to --tgt-file (instead of --train).
    #[arg(long, requires = "tgt_file")]
    pub src_file: Option<PathBuf>,
    /// Training targets, one per line, parallel to --src-file.
    #[arg(long, requires = "src_file")]
    pub tgt_file: Option<PathBuf>,
    /// Validation pairs, evaluated every --valid-every steps and at the end (loss and NLL per
    /// target token, in the run's batching and label smoothing).
    #[arg(long, conflicts_with_all = ["valid_src", "valid_tgt"])]
    pub valid: Option<PathBuf>,
    /// Validation sources, one per line, parallel to --valid-tgt (instead of --valid).
    #[arg(long, requires = "valid_tgt")]
    pub valid_src: Option<PathBuf>,
    /// Validation targets, one per line, parallel to --valid-src.
    #[arg(long, requires = "valid_src")]
    pub valid_tgt: Option<PathBuf>,
    /// The run directory: the vocabulary at the start, metrics.jsonl as it goes, checkpoints/
    /// with --save-every, and at the end the final model, optimizer and trainer state (a model
    /// directory for translate, score, attention, average and --resume) and curves.png.
    #[arg(long)]
    pub out: PathBuf,
    /// Continue the run saved in this directory (OUT or one of OUT/checkpoints/step-*), on the
    /// same training data; at the same thread count it continues bit for bit. The model, the
    /// vocabulary and the recipe (batching, schedule, smoothing, dropout, seed) come from the
    /// checkpoint: the options marked "ignored with --resume" are. What applies: the data
    /// (--train or --src-file/--tgt-file, --valid or --valid-src/--valid-tgt), --out,
    /// --max-steps, --time-limit, --threads, --max-len, --cooldown, --log-every, --save-every,
    /// --keep-last, --valid-every, --valid-bleu-lines and --bf16-kernel (the precision is the
    /// checkpoint's).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Model size: tiny, base or big. Ignored with --resume.
    #[arg(long, default_value = "tiny", conflicts_with = "config")]
    pub preset: String,
    /// A model config JSON (as written to config.json); vocab_size is taken from the data.
    /// Ignored with --resume.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Stop after this many updates in total (a resumed run counts from its checkpoint).
    #[arg(long, default_value_t = 1000)]
    pub max_steps: u64,
    /// Also stop (and save) once this many seconds of training have passed, whichever comes
    /// first. Checked after each update: the update that crosses the limit completes, so at
    /// least one runs; the step reached is printed.
    #[arg(long)]
    pub time_limit: Option<f64>,
    /// Seed for initialisation, dropout and shuffling. Ignored with --resume.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long, default_value_t = 0, help = super::TRAIN_THREADS_HELP)]
    pub threads: usize,
    /// Source + target tokens (with padding) per batch. Ignored with --resume.
    #[arg(long, default_value_t = 4000)]
    pub tokens_per_batch: usize,
    /// Batches accumulated per update. Ignored with --resume.
    #[arg(long, default_value_t = 1)]
    pub accumulate: usize,
    /// Clip the global gradient norm to this value. Ignored with --resume.
    #[arg(long)]
    pub clip_norm: Option<f64>,
    /// Warm-up steps of the learning-rate schedule. Ignored with --resume.
    #[arg(long, default_value_t = 4000)]
    pub warmup: u64,
    /// Multiplier of the learning-rate schedule. Ignored with --resume.
    #[arg(long, default_value_t = 1.0)]
    pub lr_factor: f64,
    /// Decay the learning rate linearly to zero over the last N updates before --max-steps
    /// (default and 0: none, the paper's schedule to the end). With --resume, N replaces the
    /// checkpoint's cool-down and 0 removes it; without the option the checkpoint's stays. A
    /// --time-limit that stops the run first cuts the cool-down short.
    #[arg(long)]
    pub cooldown: Option<u64>,
    /// Label smoothing ε. Ignored with --resume.
    #[arg(long, default_value_t = 0.1)]
    pub label_smoothing: f64,
    /// Override the preset's or the --config file's dropout. Ignored with --resume.
    #[arg(long)]
    pub dropout: Option<f64>,
    /// Override the config's dropout on attention weights (0 in the paper). Ignored with
    /// --resume.
    #[arg(long)]
    pub attention_dropout: Option<f64>,
    /// Override the config's dropout on FFN activations (0 in the paper). Ignored with
    /// --resume.
    #[arg(long)]
    pub activation_dropout: Option<f64>,
    /// Word dropout: replace each source and decoder-input token by UNK with this probability
    /// during training (a regulariser for small corpora). Ignored with --resume.
    #[arg(long, default_value_t = 0.0)]
    pub word_dropout: f64,
    /// The number format of the linear layers' products: f32, or bf16 (operands rounded to
    /// bf16, float32 sums, float32 weights and optimizer state; see `train::precision`).
    /// Saved with the run: ignored with --resume, which continues in the checkpoint's.
    #[arg(long, value_enum, default_value_t = TrainPrecision::F32)]
    pub precision: TrainPrecision,
    /// With --precision bf16, how the products are multiplied: gemm (the float32 gemm over
    /// bf16-rounded operands, fastest where measured), packed (bf16 panels through the AVX-512
    /// BF16 kernel where the CPU has it, else its portable twin), avx512 or portable. Not saved
    /// with the run: kernels differ in the order of the f32 sums, so a resume continues bit for
    /// bit only with the same one.
    #[arg(long, default_value = "gemm", value_parser = Bf16Kernel::parse)]
    pub bf16_kernel: Bf16Kernel,
    /// Use pre-LN residual blocks instead of the paper's post-LN. Ignored with --resume.
    #[arg(long)]
    pub pre_ln: bool,
    /// Vocabulary: characters, whitespace-separated words, or byte-level BPE subwords learnt
    /// jointly from sources and targets (saved as tokenizer.json in the model directory).
    /// Ignored with --resume.
    #[arg(long, value_enum, default_value = "char")]
    pub vocab_level: Level,
    /// With --vocab-level bpe: the size of the joint vocabulary (specials included). Ignored
    /// with --resume.
    #[arg(long, default_value_t = 8000)]
    pub vocab_size: usize,
    /// Drop training pairs with more tokens than this on either side (reported; default: the
    /// model's max_len, which also caps it on a fresh run). Validation pairs longer than the
    /// model's max_len are dropped too.
    #[arg(long)]
    pub max_len: Option<usize>,
    /// Also save a checkpoint every N steps into OUT/checkpoints/step-NNNNNNNN (0: never);
    /// each is a full model directory that `--resume`, `translate` and `average` accept.
    #[arg(long, default_value_t = 0)]
    pub save_every: u64,
    /// Keep only the last K step checkpoints (at least one).
    #[arg(long, default_value_t = 5)]
    pub keep_last: usize,
    #[arg(long, default_value_t = 600.0, help = super::AUTOSAVE_HELP)]
    pub autosave: f64,
    #[arg(long, help = super::OVERWRITE_HELP)]
    pub overwrite: bool,
    /// Append a JSON line of metrics to OUT/metrics.jsonl every N steps (0: only on validation
    /// steps and at the last step); OUT/curves.png plots the log at the end.
    #[arg(long, default_value_t = 100)]
    pub log_every: u64,
    /// Evaluate the validation loss every N steps (0: only at the end).
    #[arg(long, default_value_t = 0)]
    pub valid_every: u64,
    /// On each --valid-every validation (not the final one): also translate the first N
    /// validation sources greedily and report corpus BLEU (sacreBLEU-exact) against their
    /// targets (0: off).
    #[arg(long, default_value_t = 0)]
    pub valid_bleu_lines: usize,
}

/// Reads a TSV file, reporting malformed lines (with line numbers) on stderr.
pub fn read_corpus(path: &Path) -> Result<Vec<Pair>> {
    let (pairs, report) = read_pairs(path)?;
    if report.count > 0 {
        eprintln!("warning: {}: skipped {}", path.display(), report.summary());
    }
    Ok(pairs)
}

/// Reads two parallel line files, reporting skipped lines (with line numbers) on stderr.
pub fn read_parallel_corpus(source: &Path, target: &Path) -> Result<Vec<Pair>> {
    let (pairs, report) = read_parallel(source, target)?;
    if report.count > 0 {
        eprintln!(
            "warning: {} / {}: skipped {}",
            source.display(),
            target.display(),
            report.summary()
        );
    }
    Ok(pairs)
}

/// Encodes pairs, dropping (and counting) those longer than `max_len` tokens on a side.
pub fn encode_pairs(pairs: &[Pair], vocab: &Vocab, max_len: usize, what: &str) -> Vec<Example> {
    let mut too_long = Vec::new();
    let mut out = Vec::with_capacity(pairs.len());
    for p in pairs {
        let e = Example {
            src: vocab.encode(&p.source),
            tgt: vocab.encode(&p.target),
        };
        if e.src.len() + 1 > max_len || e.tgt.len() + 1 > max_len {
            too_long.push(p.line);
        } else {
            out.push(e);
        }
    }
    if !too_long.is_empty() {
        let first: Vec<String> = too_long.iter().take(5).map(|l| l.to_string()).collect();
        eprintln!(
            "warning: {what}: dropped {} pairs longer than {max_len} tokens (lines {}{})",
            too_long.len(),
            first.join(", "),
            if too_long.len() > 5 { ", ..." } else { "" }
        );
    }
    out
}

fn model_config(args: &TrainArgs, vocab_size: usize) -> Result<ModelConfig> {
    let mut c = match &args.config {
        Some(path) => {
            let bytes = std::fs::read(path)
                .with_context(|| format!("cannot read config {}", path.display()))?;
            serde_json::from_slice::<ModelConfig>(crate::store::strip_bom(&bytes))
                .with_context(|| format!("{}: invalid model config", path.display()))?
        }
        None => ModelConfig::preset(&args.preset, vocab_size).with_context(|| {
            format!(
                "unknown preset {:?} (choose one of {:?})",
                args.preset,
                ModelConfig::PRESETS
            )
        })?,
    };
    c.vocab_size = vocab_size;
    if let Some(p) = args.dropout {
        c.dropout = p;
    }
    if let Some(p) = args.attention_dropout {
        c.attention_dropout = p;
    }
    if let Some(p) = args.activation_dropout {
        c.activation_dropout = p;
    }
    if args.pre_ln {
        c.norm = NormPlacement::PreLn;
    }
    c.validate().map_err(|e| match &args.config {
        Some(path) => anyhow::anyhow!("{}: invalid model config: {e}", path.display()),
        None => anyhow::anyhow!("invalid model config: {e}"),
    })?;
    Ok(c)
}

/// The recipe of a fresh run, from the options.
fn recipe(args: &TrainArgs) -> TrainConfig {
    TrainConfig {
        label_smoothing: args.label_smoothing,
        warmup: args.warmup,
        lr_factor: args.lr_factor,
        tokens_per_batch: args.tokens_per_batch,
        accumulate: args.accumulate,
        clip_norm: args.clip_norm,
        seed: args.seed,
        word_dropout: args.word_dropout,
        precision: args.precision,
        cooldown: Cooldown::last(args.cooldown.unwrap_or(0), args.max_steps),
        ..TrainConfig::default()
    }
}

/// Refuses option values that would silently give a broken run: the recipe's with the rules a
/// checkpoint's recipe is checked with on --resume.
fn check_options(args: &TrainArgs) -> Result<()> {
    if let Some(c) = args.cooldown.filter(|&c| c > args.max_steps) {
        bail!(
            "--cooldown {c} is longer than the run (--max-steps {})",
            args.max_steps
        );
    }
    if args.max_steps > MAX_STEP {
        bail!(
            "--max-steps {} is beyond the supported {MAX_STEP}",
            args.max_steps
        );
    }
    if args.resume.is_none() {
        let max_vocab = super::train_lm::MAX_VOCAB;
        if args.vocab_size > max_vocab {
            bail!(
                "--vocab-size {} is above the supported {max_vocab}",
                args.vocab_size
            );
        }
        recipe(args)
            .validate()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    super::check_run_options(
        args.label_smoothing,
        args.time_limit,
        args.autosave,
        args.resume.as_deref(),
        &args.out,
        args.overwrite,
    )
}

pub fn run(args: TrainArgs) -> Result<()> {
    check_options(&args)?;
    super::with_world(|comm| run_on(args, comm))
}

/// The run on this process, one of `comm`'s ranks (only rank 0 prints and writes).
fn run_on(args: TrainArgs, comm: Arc<dyn Communicator>) -> Result<()> {
    let root = comm.rank() == 0;
    let threads = set_threads(args.threads)?;
    let (train_pairs, train_name) = match (&args.train, &args.src_file, &args.tgt_file) {
        (Some(p), _, _) => (read_corpus(p)?, p.display().to_string()),
        (None, Some(s), Some(t)) => (
            read_parallel_corpus(s, t)?,
            format!("{} / {}", s.display(), t.display()),
        ),
        _ => bail!("give the training data as --train FILE.tsv or --src-file S --tgt-file T"),
    };
    let valid_pairs = match (&args.valid, &args.valid_src, &args.valid_tgt) {
        (Some(p), _, _) => read_corpus(p)?,
        (None, Some(s), Some(t)) => read_parallel_corpus(s, t)?,
        _ => Vec::new(),
    };
    let (vocab, trainer) = match &args.resume {
        Some(dir) => resume(&args, dir, &train_pairs, root)?,
        None => start(&args, &train_pairs, &train_name)?,
    };
    let mut trainer = trainer;
    trainer.set_communicator(comm.clone())?;
    trainer.set_bf16_kernel(args.bf16_kernel);
    let max_len = trainer.model.config.max_len;
    let valid = encode_pairs(&valid_pairs, &vocab, max_len, "validation data");
    let n_params = trainer.model.n_params();
    if root {
        eprintln!(
            "model: {n_params} parameters, vocabulary {} ({:?}), {} batches per epoch, {threads} threads{}",
            vocab.len(),
            vocab.level(),
            trainer.source().batches_per_epoch(),
            super::ranks_note(&*comm)
        );
        super::clear_out(&args.out, args.resume.as_deref(), args.overwrite)?;
        std::fs::create_dir_all(&args.out)
            .with_context(|| format!("cannot create {}", args.out.display()))?;
    }
    let start_step = trainer.state.step;
    if root && start_step >= args.max_steps {
        eprintln!(
            "already at step {start_step} >= --max-steps {}",
            args.max_steps
        );
    }
    // Validation in the run's batching and smoothing; BLEU on the first lines as read.
    let bleu_pairs = &valid_pairs[..args.valid_bleu_lines.min(valid_pairs.len())];
    let validation = (!valid.is_empty()).then(|| PairValidation {
        examples: valid,
        tokens_per_batch: trainer.state.config.tokens_per_batch,
        label_smoothing: trainer.state.config.label_smoothing,
        bleu: (!bleu_pairs.is_empty()).then(|| BleuCheck {
            vocab: &vocab,
            sources: bleu_pairs.iter().map(|p| p.source.clone()).collect(),
            references: bleu_pairs.iter().map(|p| p.target.clone()).collect(),
        }),
    });
    let save_vocab = |w: &mut CheckpointWriter| vocab.write(w);
    let output = Output {
        dir: args.out.clone(),
        save_tokenizer: &save_vocab,
        log_every: Some(args.log_every),
        save_every: args.save_every,
        keep_last: args.keep_last,
        save_into_dir_every: 0,
        autosave: (args.autosave > 0.0).then_some(args.autosave),
    };
    let mut reporter = BarReporter::new(args.max_steps, start_step, |r, v, _| {
        let mut lines = vec![format!(
            "step {}: valid loss {:.4} nll {:.4}",
            r.step, v.loss, v.nll
        )];
        lines.extend(v.bleu.iter().map(|b| format!("step {}: valid {b}", r.step)));
        lines
    });
    let options = RunOptions {
        max_steps: args.max_steps,
        time_limit: args.time_limit,
        valid_every: args.valid_every,
    };
    let validator = validation.as_ref().map(|v| v as &dyn Validator<_>);
    let summary = run_training(
        &mut trainer,
        &options,
        Some(&output),
        validator,
        &mut reporter,
    )?;
    if !root {
        return Ok(());
    }
    print_curves(&summary);
    if let Some(v) = &summary.valid {
        eprintln!("valid loss {:.4} nll {:.4} per token", v.loss, v.nll);
    }
    eprintln!(
        "saved {} at step {} ({:.1} s)",
        args.out.display(),
        summary.step,
        summary.seconds
    );
    Ok(())
}

/// Continues the run saved in `dir`: its vocabulary, model and recipe, with the cool-down
/// replaced when --cooldown is given.
fn resume(
    args: &TrainArgs,
    dir: &Path,
    train_pairs: &[Pair],
    root: bool,
) -> Result<(Vocab, PairTrainer)> {
    let vocab = Vocab::load(&dir.join(VOCAB_FILE))?;
    let model_config = crate::model::checkpoint::load_config_of::<crate::model::Seq2Seq<f32>>(dir)?;
    let max_len = args.max_len.unwrap_or(model_config.max_len);
    let examples = encode_pairs(train_pairs, &vocab, max_len, "training data");
    let mut trainer = PairTrainer::resume(dir, examples)?;
    if root {
        eprintln!("{}", super::resumed_line(dir, &trainer.state));
    }
    if let Some(steps) = args.cooldown {
        trainer.set_cooldown(Cooldown::last(steps, args.max_steps));
    }
    if let Some(c) = trainer.state.config.cooldown {
        if c.end < args.max_steps {
            bail!(
                "{}: the run's learning-rate cool-down ends at step {} (rate 0 after it), \
                 before --max-steps {}; give --cooldown N to decay over the last N updates of \
                 the longer run (or --cooldown 0 for none)",
                dir.display(),
                c.end,
                args.max_steps
            );
        }
    }
    Ok((vocab, trainer))
}

/// A fresh run: the vocabulary learnt from the training pairs, the model and recipe from the
/// options.
fn start(args: &TrainArgs, train_pairs: &[Pair], train_name: &str) -> Result<(Vocab, PairTrainer)> {
    let texts = train_pairs
        .iter()
        .flat_map(|p| [p.source.as_str(), p.target.as_str()]);
    let vocab = match args.vocab_level {
        Level::Char => Vocab::build(texts, VocabLevel::Char, 1),
        Level::Word => Vocab::build(texts, VocabLevel::Word, 1),
        Level::Bpe => Vocab::build_bpe(texts, args.vocab_size)
            .context("--vocab-level bpe: building the joint BPE vocabulary")?,
    };
    let model_config = model_config(args, vocab.len())?;
    let max_len = args
        .max_len
        .unwrap_or(model_config.max_len)
        .min(model_config.max_len);
    let examples = encode_pairs(train_pairs, &vocab, max_len, "training data");
    if examples.is_empty() {
        bail!("{train_name}: no training pairs left");
    }
    Ok((
        vocab,
        PairTrainer::new(model_config, recipe(args), examples)?,
    ))
}
