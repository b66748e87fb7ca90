//! `transformer train-mlm`: learn a byte-level BPE with BERT's special tokens on a text file and
//! pre-train a BERT encoder on it with the masked-LM objective (15% of tokens chosen, 80/10/10
//! mask/random/keep), with validation on the file's end (NLL and masked-token accuracy) and
//! exact resume. The saved directory is read by `embed` (see `train::setup::mlm`).

use super::args::{SaveArgs, TrainPrecisionArgs, TrainThreadsArgs};
use super::training::{self, print_note, CommandRun};
use crate::dist::Communicator;
use crate::model::Module;
use crate::store::CheckpointWriter;
use crate::train::run::RunOptions;
use crate::train::setup::lm::LmText;
use crate::train::setup::mlm::{self as setup, MlmPlan, MlmRun, MlmSpec};
use crate::train::setup::Start;
use crate::train::validate::Validator;
use crate::train::windows::LmTrainConfig;
use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct TrainMlmArgs {
    /// The training text (UTF-8); its last --valid-fraction is held out for validation.
    #[arg(long)]
    pub text: PathBuf,
    /// Fraction of the file, at its end, held out for validation (0: none).
    #[arg(long, default_value_t = 0.05)]
    pub valid_fraction: f64,
    /// The model directory to write (config.json, model.safetensors, tokenizer.json, ...).
    #[arg(long)]
    pub out: PathBuf,
    /// Continue the run saved in this directory (OUT or one of OUT/checkpoints/step-*), on the
    /// same --text and --valid-fraction. Model, tokenizer and recipe come from the checkpoint.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// BPE vocabulary size (at least 260: `[PAD]` `[CLS]` `[SEP]` `[MASK]` and the 256 bytes).
    /// Ignored with --resume.
    #[arg(long, default_value_t = 4096)]
    pub vocab_size: usize,
    /// Tokens per sequence, `[CLS]` and `[SEP]` included (also the model's positions). Ignored
    /// with --resume.
    #[arg(long, default_value_t = 128)]
    pub context: usize,
    /// Sequences per update (also per validation batch). Ignored with --resume.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Model width. Ignored with --resume.
    #[arg(long, default_value_t = 256)]
    pub d_model: usize,
    /// Attention heads. Ignored with --resume.
    #[arg(long, default_value_t = 4)]
    pub n_heads: usize,
    /// FFN hidden width. Ignored with --resume.
    #[arg(long, default_value_t = 1024)]
    pub d_ff: usize,
    /// Encoder blocks. Ignored with --resume.
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    /// Dropout on embeddings, residual branches and attention weights (BERT's 0.1). Ignored
    /// with --resume.
    #[arg(long, default_value_t = 0.1)]
    pub dropout: f64,
    /// Stop after this many updates in total (on a fresh run also the schedule's length).
    #[arg(long, default_value_t = 5000)]
    pub max_steps: u64,
    /// Also stop (and save) once this many seconds of training have passed.
    #[arg(long)]
    pub time_limit: Option<f64>,
    #[command(flatten)]
    pub numbers: TrainPrecisionArgs,
    /// Peak learning rate. Ignored with --resume.
    #[arg(long, default_value_t = 5e-4)]
    pub lr: f64,
    /// Linear warm-up updates. Ignored with --resume.
    #[arg(long, default_value_t = 200)]
    pub warmup: u64,
    /// Clip the global gradient norm (0: off). Ignored with --resume.
    #[arg(long, default_value_t = 1.0)]
    pub clip_norm: f64,
    /// Seed for initialisation, spans, masks and dropout. Ignored with --resume.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub pool: TrainThreadsArgs,
    /// Evaluate (masked-token NLL and accuracy) and save into OUT every N updates (0: only at
    /// the end).
    #[arg(long, default_value_t = 500)]
    pub eval_every: u64,
    /// Append a JSON line of metrics to OUT/metrics.jsonl every N steps.
    #[arg(long, default_value_t = 100)]
    pub log_every: u64,
    /// Also save a checkpoint every N steps into OUT/checkpoints/step-NNNNNNNN (0: never).
    #[arg(long, default_value_t = 0)]
    pub save_every: u64,
    #[command(flatten)]
    pub save: SaveArgs,
}

impl TrainMlmArgs {
    fn plan(&self) -> MlmPlan {
        let spec = MlmSpec {
            vocab_size: self.vocab_size,
            d_model: self.d_model,
            n_heads: self.n_heads,
            d_ff: self.d_ff,
            layers: self.layers,
            dropout: self.dropout,
            recipe: LmTrainConfig {
                context: self.context,
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
        MlmPlan {
            start: match &self.resume {
                Some(dir) => Start::Resume(dir.clone()),
                None => Start::Fresh(spec),
            },
            max_steps: self.max_steps,
            bf16_kernel: self.numbers.bf16_kernel,
        }
    }
}

pub fn run(args: TrainMlmArgs) -> Result<()> {
    if !(0.0..1.0).contains(&args.valid_fraction) {
        bail!("--valid-fraction {} must be in [0, 1)", args.valid_fraction);
    }
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
fn run_on(args: &TrainMlmArgs, plan: &MlmPlan, comm: Arc<dyn Communicator>) -> Result<()> {
    let root = comm.rank() == 0;
    let text = LmText::read(&args.text, args.valid_fraction)?;
    let started = Instant::now();
    let MlmRun {
        tokenizer,
        mut trainer,
        validation,
    } = setup::prepare(&text, plan, comm.clone(), &mut print_note)?;
    if root {
        eprintln!(
            "model: {} parameters, BPE vocabulary {}, {} training tokens, {} held-out masked tokens, {} threads{} ({:.1} s to prepare)",
            trainer.model.n_params(),
            tokenizer.vocab_size(),
            trainer.source().n_tokens(),
            validation.as_ref().map_or(0, |v| v.n_targets()),
            rayon::current_num_threads(),
            training::ranks_note(&*comm),
            started.elapsed().as_secs_f64()
        );
        training::make_out(&args.out, args.resume.as_deref(), args.save.overwrite)?;
    }
    let save_tokenizer = |w: &mut CheckpointWriter| tokenizer.write(w);
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
        &save_tokenizer,
        validation.as_ref().map(|v| v as &dyn Validator<_>),
        |r, v, rate| {
            vec![format!(
                "step {}: train loss {:.4} valid loss {:.4} nats/masked token, masked accuracy {:.4}, {rate:.0} tok/s",
                r.step,
                r.loss,
                v.nll,
                v.accuracy.unwrap_or(f64::NAN)
            )]
        },
        |v| {
            format!(
                "valid loss {:.4} nats/masked token, masked-token accuracy {:.4}",
                v.nll,
                v.accuracy.unwrap_or(f64::NAN)
            )
        },
    )
}
