//! `transformer train`: train on `source<TAB>target` files, save checkpoints, resume exactly.

use super::{bar_message, set_threads, training_bar};
use crate::model::{ModelConfig, NormPlacement};
use crate::store::{list_step_checkpoints, step_checkpoint_name};
use crate::store::{CHECKPOINTS_DIR, CURVES_FILE, METRICS_FILE, VOCAB_FILE};
use crate::text::corpus::{read_pairs, read_parallel, Pair};
use crate::text::vocab::{Vocab, VocabLevel};
use crate::train::schedule::Cooldown;
use crate::train::trainer::{Example, TrainConfig, Trainer};
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use std::path::{Path, PathBuf};
use std::time::Instant;

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
    /// Validation pairs, evaluated every --valid-every steps and at the end.
    #[arg(long, conflicts_with_all = ["valid_src", "valid_tgt"])]
    pub valid: Option<PathBuf>,
    /// Validation sources, one per line, parallel to --valid-tgt (instead of --valid).
    #[arg(long, requires = "valid_tgt")]
    pub valid_src: Option<PathBuf>,
    /// Validation targets, one per line, parallel to --valid-src.
    #[arg(long, requires = "valid_src")]
    pub valid_tgt: Option<PathBuf>,
    /// Where the model directory is written.
    #[arg(long)]
    pub out: PathBuf,
    /// Continue the run saved in this directory (same data, same thread count for bit-exact).
    /// The model and the training options (batching, schedule, smoothing, ...) come from the
    /// checkpoint; only --max-steps, --out, --threads, --valid, --save-every, --valid-every,
    /// --cooldown and --max-len apply.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Model size: tiny, base or big.
    #[arg(long, default_value = "tiny", conflicts_with = "config")]
    pub preset: String,
    /// A model config JSON (as written to config.json); vocab_size is taken from the data.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Stop after this many updates in total.
    #[arg(long, default_value_t = 1000)]
    pub max_steps: u64,
    /// Also stop (and save) once this many seconds of training have passed, whichever comes
    /// first; the step reached is printed.
    #[arg(long)]
    pub time_limit: Option<f64>,
    /// Seed for initialisation, dropout and shuffling.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Worker threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Source + target tokens (with padding) per batch.
    #[arg(long, default_value_t = 4000)]
    pub tokens_per_batch: usize,
    /// Batches accumulated per update.
    #[arg(long, default_value_t = 1)]
    pub accumulate: usize,
    /// Clip the global gradient norm to this value.
    #[arg(long)]
    pub clip_norm: Option<f64>,
    /// Warm-up steps of the learning-rate schedule.
    #[arg(long, default_value_t = 4000)]
    pub warmup: u64,
    /// Multiplier of the learning-rate schedule.
    #[arg(long, default_value_t = 1.0)]
    pub lr_factor: f64,
    /// Decay the learning rate linearly to zero over the last N updates before --max-steps
    /// (0: the paper's schedule to the end). With --resume it replaces the checkpoint's
    /// cool-down. A --time-limit that stops the run first cuts the cool-down short.
    #[arg(long, default_value_t = 0)]
    pub cooldown: u64,
    /// Label smoothing ε.
    #[arg(long, default_value_t = 0.1)]
    pub label_smoothing: f64,
    /// Override the preset's dropout.
    #[arg(long)]
    pub dropout: Option<f64>,
    /// Override the config's dropout on attention weights (0 in the paper).
    #[arg(long)]
    pub attention_dropout: Option<f64>,
    /// Override the config's dropout on FFN activations (0 in the paper).
    #[arg(long)]
    pub activation_dropout: Option<f64>,
    /// Word dropout: replace each source and decoder-input token by UNK with this probability
    /// during training (a regulariser for small corpora).
    #[arg(long, default_value_t = 0.0)]
    pub word_dropout: f64,
    /// Use pre-LN residual blocks instead of the paper's post-LN.
    #[arg(long)]
    pub pre_ln: bool,
    /// Vocabulary: characters, whitespace-separated words, or byte-level BPE subwords learnt
    /// jointly from sources and targets (saved as tokenizer.json in the model directory).
    #[arg(long, value_enum, default_value = "char")]
    pub vocab_level: Level,
    /// With --vocab-level bpe: the size of the joint vocabulary (specials included).
    #[arg(long, default_value_t = 8000)]
    pub vocab_size: usize,
    /// Drop training pairs with more tokens than this on either side (reported).
    #[arg(long)]
    pub max_len: Option<usize>,
    /// Also save a checkpoint every N steps into OUT/checkpoints/step-NNNNNNNN (0: never);
    /// each is a full model directory that `--resume`, `translate` and `average` accept.
    #[arg(long, default_value_t = 0)]
    pub save_every: u64,
    /// Keep only the last K step checkpoints.
    #[arg(long, default_value_t = 5)]
    pub keep_last: usize,
    /// Append a JSON line of metrics to OUT/metrics.jsonl every N steps.
    #[arg(long, default_value_t = 100)]
    pub log_every: u64,
    /// Evaluate the validation loss every N steps (0: only at the end).
    #[arg(long, default_value_t = 0)]
    pub valid_every: u64,
    /// With validation: also translate the first N validation sources greedily and report
    /// corpus BLEU (sacreBLEU-exact) against their targets (0: off).
    #[arg(long, default_value_t = 0)]
    pub valid_bleu_lines: usize,
}

/// An append-only JSON-lines log.
struct Metrics {
    file: std::fs::File,
    path: PathBuf,
}

impl Metrics {
    fn open(path: &Path) -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        Ok(Metrics {
            file,
            path: path.to_path_buf(),
        })
    }

    fn write(&mut self, record: &serde_json::Map<String, serde_json::Value>) -> Result<()> {
        use std::io::Write;
        writeln!(self.file, "{}", serde_json::Value::Object(record.clone()))
            .with_context(|| format!("cannot write {}", self.path.display()))
    }
}

/// Saves a full checkpoint (with its vocabulary) as OUT/checkpoints/step-NNNNNNNN and deletes
/// all but the last `keep_last` of them.
fn save_step_checkpoint(
    trainer: &mut Trainer,
    vocab: &Vocab,
    out: &Path,
    keep_last: usize,
) -> Result<()> {
    let root = out.join(CHECKPOINTS_DIR);
    let dir = root.join(step_checkpoint_name(trainer.state.step));
    trainer.save(&dir)?;
    vocab.save(&dir.join(VOCAB_FILE))?;
    let all = list_step_checkpoints(&root);
    for old in &all[..all.len().saturating_sub(keep_last.max(1))] {
        std::fs::remove_dir_all(old).with_context(|| format!("cannot remove {}", old.display()))?;
    }
    Ok(())
}

/// Greedy translations of the first `lines` validation sources, scored against their targets.
/// Hypotheses stop at source length + 10 tokens (not the search's + 50), so the runaway
/// repetitions of an early model cost little training time.
fn valid_bleu(
    trainer: &Trainer,
    vocab: &Vocab,
    pairs: &[Pair],
    lines: usize,
) -> Result<crate::eval::bleu::BleuScore> {
    let pairs = &pairs[..lines.min(pairs.len())];
    let sources: Vec<String> = pairs.iter().map(|p| p.source.clone()).collect();
    let refs: Vec<&str> = pairs.iter().map(|p| p.target.as_str()).collect();
    let hyps = crate::pipeline::translate::translate_lines(
        &trainer.model,
        vocab,
        &sources,
        &crate::decode::greedy::GreedyOptions {
            max_len_extra: 10,
            ..Default::default()
        },
    )?;
    Ok(crate::eval::bleu::corpus_bleu(&hyps, &refs)?)
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
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read config {}", path.display()))?;
            serde_json::from_str::<ModelConfig>(&text)
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
    c.validate()
        .map_err(|e| anyhow::anyhow!("invalid model config: {e}"))?;
    Ok(c)
}

/// Refuses option values that would silently give a broken run.
fn check_options(args: &TrainArgs) -> Result<()> {
    if !(args.lr_factor.is_finite() && args.lr_factor > 0.0) {
        bail!("--lr-factor {} must be positive", args.lr_factor);
    }
    if let Some(c) = args.clip_norm.filter(|c| !(c.is_finite() && *c > 0.0)) {
        bail!("--clip-norm {c} must be positive");
    }
    if args.cooldown > args.max_steps {
        bail!(
            "--cooldown {} is longer than the run (--max-steps {})",
            args.cooldown,
            args.max_steps
        );
    }
    if !(0.0..1.0).contains(&args.word_dropout) {
        bail!("--word-dropout {} must be in [0, 1)", args.word_dropout);
    }
    super::check_run_options(
        args.label_smoothing,
        args.time_limit,
        args.resume.as_deref(),
    )
}

pub fn run(args: TrainArgs) -> Result<()> {
    check_options(&args)?;
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
    let (vocab, mut trainer) = match &args.resume {
        Some(dir) => {
            let vocab = Vocab::load(&dir.join(VOCAB_FILE))?;
            let model_config = crate::model::checkpoint::load_config(dir)?;
            let max_len = args.max_len.unwrap_or(model_config.max_len);
            let examples = encode_pairs(&train_pairs, &vocab, max_len, "training data");
            let mut trainer = Trainer::resume(dir, examples)?;
            eprintln!("resumed {} at step {}", dir.display(), trainer.state.step);
            if args.cooldown > 0 {
                trainer.set_cooldown(Cooldown::last(args.cooldown, args.max_steps));
            }
            if let Some(c) = trainer.state.config.cooldown {
                if c.end < args.max_steps {
                    bail!(
                        "{}: the run's learning-rate cool-down ends at step {} (rate 0 after \
                         it), before --max-steps {}; give --cooldown N to decay over the last N \
                         updates of the longer run",
                        dir.display(),
                        c.end,
                        args.max_steps
                    );
                }
            }
            (vocab, trainer)
        }
        None => {
            let texts = train_pairs
                .iter()
                .flat_map(|p| [p.source.as_str(), p.target.as_str()]);
            let vocab = match args.vocab_level {
                Level::Char => Vocab::build(texts, VocabLevel::Char, 1),
                Level::Word => Vocab::build(texts, VocabLevel::Word, 1),
                Level::Bpe => Vocab::build_bpe(texts, args.vocab_size)
                    .context("--vocab-level bpe: building the joint BPE vocabulary")?,
            };
            let model_config = model_config(&args, vocab.len())?;
            let max_len = args
                .max_len
                .unwrap_or(model_config.max_len)
                .min(model_config.max_len);
            let examples = encode_pairs(&train_pairs, &vocab, max_len, "training data");
            if examples.is_empty() {
                bail!("{train_name}: no training pairs left");
            }
            let config = TrainConfig {
                label_smoothing: args.label_smoothing,
                warmup: args.warmup,
                lr_factor: args.lr_factor,
                tokens_per_batch: args.tokens_per_batch,
                accumulate: args.accumulate,
                clip_norm: args.clip_norm,
                seed: args.seed,
                word_dropout: args.word_dropout,
                cooldown: Cooldown::last(args.cooldown, args.max_steps),
                ..TrainConfig::default()
            };
            (vocab, Trainer::new(model_config, config, examples)?)
        }
    };
    let max_len = trainer.model.config.max_len;
    let valid = encode_pairs(&valid_pairs, &vocab, max_len, "validation data");
    let n_params = trainer.model.n_params();
    eprintln!(
        "model: {n_params} parameters, vocabulary {} ({:?}), {} batches per epoch, {threads} threads",
        vocab.len(),
        vocab.level(),
        trainer.batches_per_epoch()
    );
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    vocab.save(&args.out.join(VOCAB_FILE))?;

    let start_step = trainer.state.step;
    if start_step >= args.max_steps {
        eprintln!(
            "already at step {start_step} >= --max-steps {}",
            args.max_steps
        );
    }
    let bar = training_bar(args.max_steps);
    bar.set_position(start_step);
    let started = Instant::now();
    let mut tokens = 0usize;
    let mut metrics = Metrics::open(&args.out.join(METRICS_FILE))?;
    let mut window = (0.0, 0.0, 0usize); // (loss sum, nll sum, steps) since the last log line
    while trainer.state.step < args.max_steps {
        let report = trainer.step()?;
        tokens += report.tokens;
        let rate = tokens as f64 / started.elapsed().as_secs_f64();
        bar.set_position(report.step);
        bar.set_message(bar_message(report.loss, report.lr, rate));
        window = (window.0 + report.loss, window.1 + report.nll, window.2 + 1);
        let mut record = serde_json::Map::new();
        if args.valid_every > 0 && report.step % args.valid_every == 0 && !valid.is_empty() {
            let s = trainer.evaluate(&valid);
            super::log_line(
                &bar,
                format!(
                    "step {}: valid loss {:.4} nll {:.4}",
                    report.step,
                    s.loss(),
                    s.nll()
                ),
            );
            record.insert("valid_loss".into(), s.loss().into());
            record.insert("valid_nll".into(), s.nll().into());
            if args.valid_bleu_lines > 0 {
                let bleu = valid_bleu(&trainer, &vocab, &valid_pairs, args.valid_bleu_lines)?;
                super::log_line(&bar, format!("step {}: valid {bleu}", report.step));
                record.insert("valid_bleu".into(), bleu.score.into());
            }
        }
        let time_up = args
            .time_limit
            .is_some_and(|secs| started.elapsed().as_secs_f64() >= secs);
        let last = report.step == args.max_steps || time_up;
        if (args.log_every > 0 && report.step % args.log_every == 0) || last || !record.is_empty() {
            let n = window.2.max(1) as f64;
            record.insert("step".into(), report.step.into());
            record.insert("epoch".into(), report.epoch.into());
            record.insert("loss".into(), (window.0 / n).into());
            record.insert("nll".into(), (window.1 / n).into());
            record.insert("lr".into(), report.lr.into());
            record.insert("tokens_per_s".into(), rate.into());
            record.insert("elapsed_s".into(), started.elapsed().as_secs_f64().into());
            metrics.write(&record)?;
            window = (0.0, 0.0, 0);
        }
        if args.save_every > 0 && report.step % args.save_every == 0 {
            save_step_checkpoint(&mut trainer, &vocab, &args.out, args.keep_last)?;
        }
        if time_up {
            let message = format!("--time-limit reached at step {}", report.step);
            super::log_line(&bar, message);
            break;
        }
    }
    bar.finish();
    trainer.save(&args.out)?;
    let metrics_path = args.out.join(METRICS_FILE);
    if std::fs::metadata(&metrics_path).is_ok_and(|m| m.len() > 0) {
        let curves = args.out.join(CURVES_FILE);
        match crate::viz::plot_metrics(&metrics_path, &curves) {
            Ok(()) => eprintln!("training curves: {}", curves.display()),
            Err(e) => eprintln!("warning: no training curves: {e}"),
        }
    }
    if !valid.is_empty() {
        let s = trainer.evaluate(&valid);
        eprintln!("valid loss {:.4} nll {:.4} per token", s.loss(), s.nll());
    }
    eprintln!(
        "saved {} at step {} ({:.1} s)",
        args.out.display(),
        trainer.state.step,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
