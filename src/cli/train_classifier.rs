//! `transformer train-classifier`: fine-tune a BERT encoder for sentence classification on a
//! `text<TAB>label` file (BERT section 4.1: a pooled sentence vector, dropout, a linear layer to
//! the labels, cross-entropy, every weight trained), from a `train-mlm` encoder, a Hugging Face
//! BERT directory (`--init`) or a fresh encoder; validation accuracy on `--valid`, exact resume.
//! `classify` reads the saved directory.

use super::args::{SaveArgs, TrainPrecisionArgs, TrainThreadsArgs};
use super::training::{self, print_note, CommandRun};
use crate::dist::Communicator;
use crate::model::classifier_head::Pooling;
use crate::model::Module;
use crate::store::CheckpointWriter;
use crate::train::classify::read_labelled;
use crate::train::run::RunOptions;
use crate::train::setup::classify::{
    self as setup, ClassifyData, ClassifyPlan, ClassifyRun, ClassifySpec, EncoderStart,
};
use crate::train::setup::Start;
use crate::train::validate::Validator;
use crate::train::windows::LmTrainConfig;
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// `--pooling`.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PoolingArg {
    /// The first token's (CLS) state, as BERT.
    Cls,
    /// The mean over the sentence's tokens, as sentence-transformers.
    Mean,
}

#[derive(Args, Debug)]
pub struct TrainClassifierArgs {
    /// Training sentences, one `text<TAB>label` per line (UTF-8); the labels seen here are the
    /// model's (saved as labels.json).
    #[arg(long)]
    pub train: PathBuf,
    /// Validation sentences (`text<TAB>label`), scored (loss and accuracy) every --eval-every
    /// updates and at the end; a label not in --train is an error.
    #[arg(long)]
    pub valid: Option<PathBuf>,
    /// The model directory to write (config.json, model.safetensors, tokenizer.json,
    /// labels.json, ...); `classify` reads it.
    #[arg(long)]
    pub out: PathBuf,
    /// Start from this pre-trained encoder: a train-mlm directory or a Hugging Face BERT
    /// directory (e.g. all-MiniLM-L6-v2), with its tokenizer.json. Without it a fresh encoder
    /// of --d-model ... --layers and a BPE of --vocab-size learnt on --train. Ignored with
    /// --resume.
    #[arg(long, conflicts_with = "resume")]
    pub init: Option<PathBuf>,
    /// Continue the run saved in this directory (OUT or one of OUT/checkpoints/step-*), on the
    /// same --train; at the same thread count it continues bit for bit.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Sentence vector: cls (BERT's pooled CLS state) or mean (the mean over the tokens,
    /// sentence-transformers'; suits encoders that never trained CLS, such as MiniLM or a
    /// train-mlm one). Ignored with --resume.
    #[arg(long, value_enum, default_value = "cls")]
    pub pooling: PoolingArg,
    /// Tokens kept per sentence, CLS and SEP included (longer ones are truncated); also
    /// the positions of a fresh encoder. Ignored with --resume.
    #[arg(long, default_value_t = 64)]
    pub max_len: usize,
    /// Sentences per update (also per validation batch). Ignored with --resume.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// A fresh encoder's BPE vocabulary (at least 260). Ignored with --init and --resume.
    #[arg(long, default_value_t = 4096)]
    pub vocab_size: usize,
    /// A fresh encoder's width. Ignored with --init and --resume.
    #[arg(long, default_value_t = 256)]
    pub d_model: usize,
    /// A fresh encoder's attention heads. Ignored with --init and --resume.
    #[arg(long, default_value_t = 4)]
    pub n_heads: usize,
    /// A fresh encoder's FFN width. Ignored with --init and --resume.
    #[arg(long, default_value_t = 1024)]
    pub d_ff: usize,
    /// A fresh encoder's blocks. Ignored with --init and --resume.
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    /// Dropout in the encoder and on the pooled vector (BERT's 0.1). Ignored with --resume.
    #[arg(long, default_value_t = 0.1)]
    pub dropout: f64,
    /// Stop after this many updates in total (on a fresh run also the schedule's length).
    #[arg(long, default_value_t = 1000)]
    pub max_steps: u64,
    /// Also stop (and save) once this many seconds of training have passed.
    #[arg(long)]
    pub time_limit: Option<f64>,
    #[command(flatten)]
    pub numbers: TrainPrecisionArgs,
    /// Peak learning rate (BERT fine-tunes at 2e-5 to 5e-5). Ignored with --resume.
    #[arg(long, default_value_t = 5e-5)]
    pub lr: f64,
    /// Linear warm-up updates. Ignored with --resume.
    #[arg(long, default_value_t = 100)]
    pub warmup: u64,
    /// Clip the global gradient norm (0: off). Ignored with --resume.
    #[arg(long, default_value_t = 1.0)]
    pub clip_norm: f64,
    /// Seed for the head's (and a fresh encoder's) initialisation, the sentences drawn and
    /// dropout. Ignored with --resume.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub pool: TrainThreadsArgs,
    /// Validate and save into OUT every N updates (0: only at the end).
    #[arg(long, default_value_t = 200)]
    pub eval_every: u64,
    /// Append a JSON line of metrics to OUT/metrics.jsonl every N steps.
    #[arg(long, default_value_t = 50)]
    pub log_every: u64,
    /// Also save a checkpoint every N steps into OUT/checkpoints/step-NNNNNNNN (0: never).
    #[arg(long, default_value_t = 0)]
    pub save_every: u64,
    #[command(flatten)]
    pub save: SaveArgs,
}

impl TrainClassifierArgs {
    fn plan(&self) -> ClassifyPlan {
        let spec = ClassifySpec {
            encoder: match &self.init {
                Some(dir) => EncoderStart::Pretrained(dir.clone()),
                None => EncoderStart::New {
                    vocab_size: self.vocab_size,
                    sizes: (self.d_model, self.n_heads, self.d_ff, self.layers),
                },
            },
            dropout: self.dropout,
            pooling: match self.pooling {
                PoolingArg::Cls => Pooling::Cls,
                PoolingArg::Mean => Pooling::Mean,
            },
            recipe: LmTrainConfig {
                context: self.max_len,
                batch: self.batch,
                lr: self.lr,
                warmup: self.warmup,
                total_steps: self.max_steps,
                clip_norm: (self.clip_norm > 0.0).then_some(self.clip_norm),
                label_smoothing: 0.0,
                seed: self.seed,
                precision: self.numbers.precision,
                ..LmTrainConfig::default()
            },
        };
        ClassifyPlan {
            start: match &self.resume {
                Some(dir) => Start::Resume(dir.clone()),
                None => Start::Fresh(spec),
            },
            max_steps: self.max_steps,
            bf16_kernel: self.numbers.bf16_kernel,
        }
    }
}

pub fn run(args: TrainClassifierArgs) -> Result<()> {
    if !(args.clip_norm.is_finite() && args.clip_norm >= 0.0) {
        bail!("--clip-norm {} must be >= 0", args.clip_norm);
    }
    if args.batch == 0 || args.layers == 0 {
        bail!("--batch and --layers must be positive");
    }
    let plan = args.plan();
    plan.check()?;
    training::check_run_options(
        0.0,
        args.time_limit,
        args.save.autosave,
        args.resume.as_deref(),
        &args.out,
        args.save.overwrite,
    )?;
    training::with_world(|comm| run_on(&args, &plan, comm))
}

/// The run on this process, one of `comm`'s ranks (only rank 0 prints and writes).
fn run_on(
    args: &TrainClassifierArgs,
    plan: &ClassifyPlan,
    comm: Arc<dyn Communicator>,
) -> Result<()> {
    let root = comm.rank() == 0;
    let train = read_labelled(&args.train)?;
    let valid = args.valid.as_deref().map(read_labelled).transpose()?;
    let data = ClassifyData {
        train: (&train, &args.train),
        valid: valid.as_deref().zip(args.valid.as_deref()),
    };
    let started = Instant::now();
    let ClassifyRun {
        tokenizer_json,
        labels,
        mut trainer,
        validation,
    } = setup::prepare(&data, plan, comm.clone(), &mut print_note)?;
    if root {
        eprintln!(
            "model: {} parameters, {} labels ({}), {} training sentences, {} validation sentences, {} threads{} ({:.1} s to prepare)",
            trainer.model.n_params(),
            labels.names.len(),
            labels.names.join(", "),
            trainer.source().n_sentences(),
            validation.as_ref().map_or(0, |v| v.n_sentences()),
            rayon::current_num_threads(),
            training::ranks_note(&*comm),
            started.elapsed().as_secs_f64()
        );
        training::make_out(&args.out, args.resume.as_deref(), args.save.overwrite)?;
    }
    let save_files = |w: &mut CheckpointWriter| {
        w.add(crate::store::TOKENIZER_FILE, &tokenizer_json)?;
        labels.write(w)
    };
    let run = CommandRun {
        out: &args.out,
        options: RunOptions {
            max_steps: args.max_steps,
            time_limit: args.time_limit,
            valid_every: args.eval_every,
        },
        log_every: args.log_every,
        save_every: args.save_every,
        save_into_dir_every: args.eval_every,
        save: &args.save,
        tokens_per_s: true,
    };
    training::drive(
        &mut trainer,
        &run,
        &save_files,
        validation.as_ref().map(|v| v as &dyn Validator<_>),
        |r, v, rate| {
            vec![format!(
                "step {}: train loss {:.4} valid loss {:.4} nats/sentence, accuracy {:.4}, {rate:.0} tok/s",
                r.step,
                r.loss,
                v.nll,
                v.accuracy.unwrap_or(f64::NAN)
            )]
        },
        |v| {
            format!(
                "valid loss {:.4} nats/sentence, accuracy {:.4}",
                v.nll,
                v.accuracy.unwrap_or(f64::NAN)
            )
        },
    )
}
