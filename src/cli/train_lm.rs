//! `transformer train-lm`: learn a byte-level BPE on a text file and train a GPT-style
//! decoder-only Transformer on it, with validation on the file's end and exact resume.

use super::args::{SaveArgs, TrainPrecisionArgs, TrainThreadsArgs};
use super::training::{self, print_note, CommandRun};
use crate::dist::Communicator;
use crate::model::config::Normalization;
use crate::model::Module;
use crate::model::{Activation, Positions};
use crate::store::CheckpointWriter;
use crate::train::run::RunOptions;
use crate::train::setup::lm::{self as setup, LmModelSpec, LmPlan, LmRun, LmSpec, LmText};
use crate::train::setup::Start;
use crate::train::validate::Validator;
use crate::train::windows::LmTrainConfig;
use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Parses a kebab-case config value (`gelu-erf`, `rotary`, ...) through its serde name.
fn parse_kebab<T: serde::de::DeserializeOwned>(s: &str) -> Result<T, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string())).map_err(|e| e.to_string())
}

#[derive(Args, Debug)]
pub struct TrainLmArgs {
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
    /// same --text and --valid-fraction; at the same thread count it continues bit for bit.
    /// Model, tokenizer and recipe come from the checkpoint: the options marked "ignored with
    /// --resume" are. What applies: --text, --valid-fraction, --out, --max-steps (where to stop
    /// only), --time-limit, --threads, --eval-every, --log-every, --save-every, --keep-last and
    /// --bf16-kernel (the precision is the checkpoint's).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// BPE vocabulary size (at least 257: the 256 bytes and <|endoftext|>). Ignored with
    /// --resume.
    #[arg(long, default_value_t = 4096)]
    pub vocab_size: usize,
    /// Tokens per training window (also the model's max_len). Ignored with --resume.
    #[arg(long, default_value_t = 128)]
    pub context: usize,
    /// Windows per update (also per validation batch). Ignored with --resume.
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
    /// Transformer blocks. Ignored with --resume.
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    /// Dropout probability. Ignored with --resume.
    #[arg(long, default_value_t = 0.1)]
    pub dropout: f64,
    /// Pre-LN blocks (with a final norm) instead of post-LN. Ignored with --resume.
    #[arg(long)]
    pub pre_ln: bool,
    /// FFN activation: relu, gelu-erf, gelu-tanh, silu-gated (SwiGLU, a gated FFN of three matrices, as Llama) or gelu-tanh-gated (GeGLU, as Gemma). Ignored with --resume.
    #[arg(long, default_value = "gelu-tanh", value_parser = parse_kebab::<Activation>)]
    pub activation: Activation,
    /// Positions: sinusoidal, learned or rotary. Ignored with --resume.
    #[arg(long, default_value = "sinusoidal", value_parser = parse_kebab::<Positions>)]
    pub positions: Positions,
    /// Normalisation in every residual connection and the final norm: layer-norm or rms-norm
    /// (Llama's). Ignored with --resume.
    #[arg(long, default_value = "layer-norm", value_parser = parse_kebab::<Normalization>)]
    pub normalization: Normalization,
    /// Key/value heads of grouped-query attention, dividing --n-heads (default: --n-heads).
    /// Ignored with --resume.
    #[arg(long)]
    pub n_kv_heads: Option<usize>,
    /// Linear layers without biases (as Llama). Ignored with --resume.
    #[arg(long)]
    pub no_bias: bool,
    /// With --positions rotary: the base of the rotation angles. Ignored with --resume.
    #[arg(long, default_value_t = crate::model::config::ROPE_BASE)]
    pub rope_base: f64,
    /// Untie the output projection from the embedding. Ignored with --resume.
    #[arg(long)]
    pub untied: bool,
    /// Biases on the query, key and value projections even with --no-bias (as Qwen2).
    /// Ignored with --resume.
    #[arg(long)]
    pub qkv_bias: bool,
    /// RMSNorm of each head's queries and keys before the scores (as Qwen3). Ignored with
    /// --resume.
    #[arg(long)]
    pub qk_norm: bool,
    /// Sliding-window attention in every layer: a query sees its last N keys (as Mistral).
    /// Ignored with --resume.
    #[arg(long, value_name = "N")]
    pub sliding_window: Option<usize>,
    /// Every layer's attention: exact, window:W (the last W keys), sparse:L:S (local L and
    /// every S-th key, Child et al. 2019), global:L:G (local L and G global tokens) or linear
    /// (elu + 1 features, Katharopoulos et al. 2020). Ignored with --resume.
    #[arg(long, default_value = "exact")]
    pub attention: crate::model::attention_kind::AttentionKind,
    /// Stop after this many updates in total. On a fresh run also where the cosine schedule
    /// reaches its floor; with --resume the floor stays at the checkpoint's planned length.
    #[arg(long, default_value_t = 5000)]
    pub max_steps: u64,
    /// Also stop (and save) once this many seconds of training have passed. Checked after each
    /// update: the update that crosses the limit completes, so at least one runs.
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
    /// Label smoothing ε (0: plain cross-entropy). Ignored with --resume.
    #[arg(long, default_value_t = 0.0)]
    pub label_smoothing: f64,
    /// Seed for initialisation, windows and dropout. Ignored with --resume.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub pool: TrainThreadsArgs,
    /// Evaluate (validation loss, bits per character) and save into OUT every N updates (0:
    /// only at the end).
    #[arg(long, default_value_t = 500)]
    pub eval_every: u64,
    /// Append a JSON line of metrics to OUT/metrics.jsonl every N steps (0: only on evaluation
    /// steps and at the last step); OUT/curves.png plots the log at the end.
    #[arg(long, default_value_t = 100)]
    pub log_every: u64,
    /// Also save a checkpoint every N steps into OUT/checkpoints/step-NNNNNNNN (0: never);
    /// each is a full model directory that `--resume`, `generate` and `perplexity` accept.
    #[arg(long, default_value_t = 0)]
    pub save_every: u64,
    #[command(flatten)]
    pub save: SaveArgs,
}

impl TrainLmArgs {
    /// What a fresh run is made of (the options marked "ignored with --resume").
    fn spec(&self) -> LmSpec {
        LmSpec {
            vocab_size: self.vocab_size,
            model: LmModelSpec {
                d_model: self.d_model,
                n_heads: self.n_heads,
                d_ff: self.d_ff,
                layers: self.layers,
                dropout: self.dropout,
                pre_ln: self.pre_ln,
                activation: self.activation,
                positions: self.positions,
                normalization: self.normalization,
                n_kv_heads: self.n_kv_heads,
                bias: !self.no_bias,
                rope_base: self.rope_base,
                tied: !self.untied,
                qkv_bias: self.qkv_bias,
                qk_norm: self.qk_norm,
                sliding_window: self.sliding_window,
                attention: self.attention,
            },
            recipe: LmTrainConfig {
                context: self.context,
                batch: self.batch,
                lr: self.lr,
                warmup: self.warmup,
                total_steps: self.max_steps,
                clip_norm: (self.clip_norm > 0.0).then_some(self.clip_norm),
                label_smoothing: self.label_smoothing,
                seed: self.seed,
                precision: self.numbers.precision,
                ..LmTrainConfig::default()
            },
        }
    }

    /// The library's plan of the run.
    fn plan(&self) -> LmPlan {
        LmPlan {
            start: match &self.resume {
                Some(dir) => Start::Resume(dir.clone()),
                None => Start::Fresh(self.spec()),
            },
            max_steps: self.max_steps,
            bf16_kernel: self.numbers.bf16_kernel,
        }
    }

    /// The checks of the options the plan does not hold as given.
    fn check(&self) -> Result<()> {
        if !(0.0..1.0).contains(&self.valid_fraction) {
            bail!("--valid-fraction {} must be in [0, 1)", self.valid_fraction);
        }
        if !(self.clip_norm.is_finite() && self.clip_norm >= 0.0) {
            bail!("--clip-norm {} must be >= 0", self.clip_norm);
        }
        if self.context == 0 || self.batch == 0 || self.layers == 0 {
            bail!("--context, --batch and --layers must be positive");
        }
        Ok(())
    }
}

pub fn run(args: TrainLmArgs) -> Result<()> {
    args.check()?;
    let plan = args.plan();
    plan.check()?;
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
fn run_on(args: &TrainLmArgs, plan: &LmPlan, comm: Arc<dyn Communicator>) -> Result<()> {
    let root = comm.rank() == 0;
    let text = LmText::read(&args.text, args.valid_fraction)?;
    let started = Instant::now();
    let run = setup::prepare(&text, plan, comm.clone(), &mut print_note)?;
    let valid_tokens = run.valid_tokens();
    let LmRun {
        bpe,
        mut trainer,
        validation,
    } = run;
    let n_params = trainer.model.n_params();
    let n_tokens = trainer.source().n_tokens();
    if root {
        eprintln!(
            "model: {n_params} parameters, BPE vocabulary {}, {} training tokens ({:.2} chars/token), {} validation tokens, {} threads{} ({:.1} s to prepare)",
            bpe.vocab_size(),
            n_tokens,
            text.train().chars().count() as f64 / n_tokens as f64,
            valid_tokens,
            rayon::current_num_threads(),
            training::ranks_note(&*comm),
            started.elapsed().as_secs_f64()
        );
        training::make_out(&args.out, args.resume.as_deref(), args.save.overwrite)?;
    }
    let save_tokenizer = |w: &mut CheckpointWriter| bpe.write(w);
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
                "step {}: train loss {:.4} valid loss {:.4} nats/token, {:.4} bits/char, {rate:.0} tok/s",
                r.step,
                r.loss,
                v.nll,
                v.bits_per_char.unwrap_or(f64::NAN)
            )]
        },
        |v| {
            format!(
                "valid loss {:.4} nats/token, perplexity {:.2}, {:.4} bits/char",
                v.nll,
                v.nll.exp(),
                v.bits_per_char.unwrap_or(f64::NAN)
            )
        },
    )
}
