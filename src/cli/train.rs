//! `transformer train`: train on `source<TAB>target` files, save checkpoints, resume exactly.
//! The setup (corpora, vocabulary, model, trainer, fresh or resumed) is the library's
//! [`crate::train::setup::pairs`]; here: the options, the progress and the summary lines.

use super::args::{SaveArgs, TrainPrecisionArgs, TrainThreadsArgs};
use super::training::{self, print_note, CommandRun};
use crate::dist::Communicator;
use crate::model::Module;
use crate::store::CheckpointWriter;
use crate::text::languages::LanguagePair;
use crate::text::vocab::VocabLevel;
use crate::train::pairs::TrainConfig;
use crate::train::run::RunOptions;
use crate::train::schedule::Cooldown;
use crate::train::setup::pairs::{
    self as setup, ModelBase, PairCorpora, PairFiles, PairModelSpec, PairPlan, PairRun, PairSpec,
    VocabSpec,
};
use crate::train::setup::Start;
use crate::train::validate::Validator;
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use std::path::PathBuf;
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
    /// The language code of the sources (e.g. `de`), recorded in the model's `languages.json`
    /// for `serve`'s LibreTranslate routes; with --target-lang. A resumed run keeps its
    /// checkpoint's pair unless both are given.
    #[arg(long, requires = "target_lang")]
    pub source_lang: Option<String>,
    /// The language code of the targets (e.g. `en`); with --source-lang.
    #[arg(long, requires = "source_lang")]
    pub target_lang: Option<String>,
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
    #[command(flatten)]
    pub pool: TrainThreadsArgs,
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
    #[command(flatten)]
    pub numbers: TrainPrecisionArgs,
    /// Use pre-LN residual blocks instead of the paper's post-LN. Ignored with --resume.
    #[arg(long)]
    pub pre_ln: bool,
    /// Every self-attention layer's attention, the encoder's and the decoder's (cross-attention
    /// stays exact): exact, window:W (the decoder's last W keys, the encoder's band |p − j| <
    /// W), sparse:L:S, global:L:G or linear (which needs --attention-dropout 0). Default: the
    /// preset's or the --config file's (exact). Ignored with --resume.
    #[arg(long)]
    pub attention: Option<crate::model::attention_kind::AttentionKind>,
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
    #[command(flatten)]
    pub save: SaveArgs,
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

impl TrainArgs {
    /// The training files.
    fn train_files(&self) -> Result<PairFiles> {
        Ok(match (&self.train, &self.src_file, &self.tgt_file) {
            (Some(path), _, _) => PairFiles::Tsv(path.clone()),
            (None, Some(source), Some(target)) => PairFiles::Parallel {
                source: source.clone(),
                target: target.clone(),
            },
            _ => bail!("give the training data as --train FILE.tsv or --src-file S --tgt-file T"),
        })
    }

    /// The validation files, if any.
    fn valid_files(&self) -> Option<PairFiles> {
        match (&self.valid, &self.valid_src, &self.valid_tgt) {
            (Some(path), _, _) => Some(PairFiles::Tsv(path.clone())),
            (None, Some(source), Some(target)) => Some(PairFiles::Parallel {
                source: source.clone(),
                target: target.clone(),
            }),
            _ => None,
        }
    }

    /// What a fresh run is made of (the options marked "ignored with --resume").
    fn spec(&self) -> PairSpec {
        let level = match self.vocab_level {
            Level::Char => VocabLevel::Char,
            Level::Word => VocabLevel::Word,
            Level::Bpe => VocabLevel::Bpe,
        };
        PairSpec {
            vocab: VocabSpec {
                level,
                bpe_size: self.vocab_size,
            },
            model: PairModelSpec {
                base: match &self.config {
                    Some(path) => ModelBase::File(path.clone()),
                    None => ModelBase::Preset(self.preset.clone()),
                },
                dropout: self.dropout,
                attention_dropout: self.attention_dropout,
                activation_dropout: self.activation_dropout,
                pre_ln: self.pre_ln,
                attention: self.attention,
            },
            recipe: TrainConfig {
                label_smoothing: self.label_smoothing,
                warmup: self.warmup,
                lr_factor: self.lr_factor,
                tokens_per_batch: self.tokens_per_batch,
                accumulate: self.accumulate,
                clip_norm: self.clip_norm,
                seed: self.seed,
                word_dropout: self.word_dropout,
                precision: self.numbers.precision,
                cooldown: Cooldown::last(self.cooldown.unwrap_or(0), self.max_steps),
                ..TrainConfig::default()
            },
        }
    }

    /// The language pair to record: --source-lang/--target-lang, else the resumed
    /// checkpoint's, else none.
    fn language_pair(&self) -> Result<Option<LanguagePair>> {
        match (&self.source_lang, &self.target_lang, &self.resume) {
            (Some(s), Some(t), _) => Ok(Some(LanguagePair::new(s, t)?)),
            (_, _, Some(dir)) => Ok(LanguagePair::read(dir)?),
            _ => Ok(None),
        }
    }

    /// The library's plan of the run.
    fn plan(&self) -> PairPlan {
        PairPlan {
            start: match &self.resume {
                Some(dir) => Start::Resume(dir.clone()),
                None => Start::Fresh(self.spec()),
            },
            max_len: self.max_len,
            max_steps: self.max_steps,
            cooldown: self.cooldown,
            bf16_kernel: self.numbers.bf16_kernel,
        }
    }
}

pub fn run(args: TrainArgs) -> Result<()> {
    let plan = args.plan();
    plan.check()?;
    args.language_pair()?;
    training::check_run_options(
        args.label_smoothing,
        args.time_limit,
        args.save.autosave,
        args.resume.as_deref(),
        &args.out,
        args.save.overwrite,
    )?;
    training::with_world(|comm| run_on(&args, &plan, comm))
}

/// The run on this process, one of `comm`'s ranks (only rank 0 prints and writes).
fn run_on(args: &TrainArgs, plan: &PairPlan, comm: Arc<dyn Communicator>) -> Result<()> {
    let root = comm.rank() == 0;
    let valid_files = args.valid_files();
    let corpora = PairCorpora::read(&args.train_files()?, valid_files.as_ref(), &mut print_note)?;
    let PairRun {
        vocab,
        mut trainer,
        valid,
    } = setup::prepare(corpora, plan, comm.clone(), &mut print_note)?;
    let n_params = trainer.model.n_params();
    if root {
        eprintln!(
            "model: {n_params} parameters, vocabulary {} ({:?}), {} batches per epoch, {} threads{}",
            vocab.len(),
            vocab.level(),
            trainer.source().batches_per_epoch(),
            rayon::current_num_threads(),
            training::ranks_note(&*comm)
        );
        training::make_out(&args.out, args.resume.as_deref(), args.save.overwrite)?;
    }
    let start_step = trainer.state.step;
    if root && start_step >= args.max_steps {
        eprintln!(
            "already at step {start_step} >= --max-steps {}",
            args.max_steps
        );
    }
    let validation = valid.into_validation(&vocab, &trainer.state.config, args.valid_bleu_lines);
    let languages = args.language_pair()?;
    let save_vocab = |w: &mut CheckpointWriter| {
        vocab.write(w)?;
        match &languages {
            Some(pair) => pair.write(w),
            None => Ok(()),
        }
    };
    let run = CommandRun {
        out: &args.out,
        options: RunOptions {
            max_steps: args.max_steps,
            time_limit: args.time_limit,
            valid_every: args.valid_every,
        },
        log_every: args.log_every,
        save_every: args.save_every,
        save_into_dir_every: 0,
        save: &args.save,
        tokens_per_s: false,
    };
    training::drive(
        &mut trainer,
        &run,
        &save_vocab,
        validation.as_ref().map(|v| v as &dyn Validator<_>),
        |r, v, _| {
            let mut lines = vec![format!(
                "step {}: valid loss {:.4} nll {:.4}",
                r.step, v.loss, v.nll
            )];
            lines.extend(v.bleu.iter().map(|b| format!("step {}: valid {b}", r.step)));
            lines
        },
        |v| format!("valid loss {:.4} nll {:.4} per token", v.loss, v.nll),
    )
}
