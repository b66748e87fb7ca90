//! `transformer train-lm`: learn a byte-level BPE on a text file and train a GPT-style
//! decoder-only Transformer on it, with validation on the file's end and exact resume.

use super::{log_line, set_threads, training_bar};
use crate::decode::score::score_stream;
use crate::model::{Activation, ModelConfig, NormPlacement, Positions};
use crate::pipeline::generate::document_tokens;
use crate::store::TOKENIZER_FILE;
use crate::text::bpe::Bpe;
use crate::train::lm_trainer::{LmTrainConfig, LmTrainer};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
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
    /// Continue the run saved in this directory (same text and --valid-fraction; same thread
    /// count for bit-exact). Model, tokenizer and recipe come from the checkpoint; only
    /// --max-steps, --time-limit, --out, --threads and --eval-every apply.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// BPE vocabulary size (at least 257: the 256 bytes and <|endoftext|>).
    #[arg(long, default_value_t = 4096)]
    pub vocab_size: usize,
    /// Tokens per training window (also the model's max_len).
    #[arg(long, default_value_t = 128)]
    pub context: usize,
    /// Windows per update.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    #[arg(long, default_value_t = 256)]
    pub d_model: usize,
    #[arg(long, default_value_t = 4)]
    pub n_heads: usize,
    #[arg(long, default_value_t = 1024)]
    pub d_ff: usize,
    /// Transformer blocks.
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    #[arg(long, default_value_t = 0.1)]
    pub dropout: f64,
    /// Pre-LN blocks (with a final norm) instead of post-LN.
    #[arg(long)]
    pub pre_ln: bool,
    /// FFN activation: relu, gelu-erf or gelu-tanh.
    #[arg(long, default_value = "gelu-tanh", value_parser = parse_kebab::<Activation>)]
    pub activation: Activation,
    /// Positions: sinusoidal, learned or rotary.
    #[arg(long, default_value = "sinusoidal", value_parser = parse_kebab::<Positions>)]
    pub positions: Positions,
    /// Untie the output projection from the embedding.
    #[arg(long)]
    pub untied: bool,
    /// Stop after this many updates; also where the cosine schedule reaches its floor.
    #[arg(long, default_value_t = 5000)]
    pub max_steps: u64,
    /// Stop (and save) after this many seconds of training.
    #[arg(long)]
    pub time_limit: Option<f64>,
    /// Peak learning rate.
    #[arg(long, default_value_t = 5e-4)]
    pub lr: f64,
    /// Linear warm-up updates.
    #[arg(long, default_value_t = 200)]
    pub warmup: u64,
    /// Clip the global gradient norm (0: off).
    #[arg(long, default_value_t = 1.0)]
    pub clip_norm: f64,
    /// Label smoothing ε (0: plain cross-entropy).
    #[arg(long, default_value_t = 0.0)]
    pub label_smoothing: f64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Worker threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Evaluate (validation loss, bits per character) and save every N updates (0: only at
    /// the end).
    #[arg(long, default_value_t = 500)]
    pub eval_every: u64,
}

/// Splits `text` at the start of its last `fraction` (moved forward to a character boundary).
pub fn split_valid(text: &str, fraction: f64) -> (&str, &str) {
    let mut at = ((text.len() as f64) * (1.0 - fraction)).floor() as usize;
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at += 1;
    }
    text.split_at(at)
}

fn read_text(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{}: not UTF-8 (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

fn check_train_args(a: &TrainLmArgs) -> Result<()> {
    if !(0.0..1.0).contains(&a.valid_fraction) {
        bail!("--valid-fraction {} must be in [0, 1)", a.valid_fraction);
    }
    if !(a.lr.is_finite() && a.lr > 0.0) {
        bail!("--lr {} must be positive", a.lr);
    }
    if !(a.clip_norm.is_finite() && a.clip_norm >= 0.0) {
        bail!("--clip-norm {} must be >= 0", a.clip_norm);
    }
    if a.context == 0 || a.batch == 0 || a.layers == 0 {
        bail!("--context, --batch and --layers must be positive");
    }
    super::check_run_options(a.label_smoothing, a.time_limit, a.resume.as_deref())
}

pub fn run(args: TrainLmArgs) -> Result<()> {
    check_train_args(&args)?;
    let threads = set_threads(args.threads)?;
    let text = read_text(&args.text)?;
    let (train_text, valid_text) = split_valid(&text, args.valid_fraction);
    if train_text.trim().is_empty() {
        bail!(
            "{}: no training text (the file is empty)",
            args.text.display()
        );
    }
    let started = Instant::now();
    let (bpe, mut trainer) = match &args.resume {
        Some(dir) => {
            let bpe = Bpe::load(&dir.join(TOKENIZER_FILE))?;
            let tokens = document_tokens(&bpe, train_text)?;
            let trainer = LmTrainer::resume(dir, tokens)?;
            eprintln!("resumed {} at step {}", dir.display(), trainer.state.step);
            (bpe, trainer)
        }
        None => {
            let bpe = Bpe::train(train_text.split_inclusive('\n'), args.vocab_size)?;
            let tokens = document_tokens(&bpe, train_text)?;
            let model_config = ModelConfig {
                vocab_size: bpe.vocab_size(),
                d_model: args.d_model,
                n_heads: args.n_heads,
                d_ff: args.d_ff,
                n_encoder_layers: 0,
                n_decoder_layers: args.layers,
                dropout: args.dropout,
                norm: if args.pre_ln {
                    NormPlacement::PreLn
                } else {
                    NormPlacement::PostLn
                },
                layer_norm_eps: 1e-5,
                tie_embeddings: !args.untied,
                max_len: args.context,
                activation: args.activation,
                positions: args.positions,
                attention_dropout: 0.0,
                activation_dropout: 0.0,
            };
            model_config
                .validate()
                .map_err(|e| anyhow::anyhow!("invalid model: {e}"))?;
            let config = LmTrainConfig {
                context: args.context,
                batch: args.batch,
                lr: args.lr,
                warmup: args.warmup,
                total_steps: args.max_steps,
                clip_norm: (args.clip_norm > 0.0).then_some(args.clip_norm),
                label_smoothing: args.label_smoothing,
                seed: args.seed,
                ..LmTrainConfig::default()
            };
            (bpe, LmTrainer::new(model_config, config, tokens)?)
        }
    };
    let valid_tokens = document_tokens(&bpe, valid_text)?;
    let valid_chars = valid_text.chars().count();
    let n_params = trainer.model.n_params();
    eprintln!(
        "model: {n_params} parameters, BPE vocabulary {}, {} training tokens ({:.2} chars/token), {} validation tokens, {threads} threads ({:.1} s to prepare)",
        bpe.vocab_size(),
        trainer.n_tokens(),
        train_text.chars().count() as f64 / trainer.n_tokens() as f64,
        valid_tokens.len() - 1,
        started.elapsed().as_secs_f64()
    );
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    bpe.save(&args.out.join(TOKENIZER_FILE))?;

    let batch = trainer.state.config.batch;
    let evaluate = |trainer: &LmTrainer| -> Option<(f64, f64)> {
        if valid_chars == 0 {
            return None;
        }
        let ctx = trainer.model.max_len();
        let s = score_stream(&trainer.model, &valid_tokens, ctx, ctx, batch);
        Some((
            s.nll(),
            s.nll_sum / valid_chars as f64 / std::f64::consts::LN_2,
        ))
    };
    let bar = training_bar(args.max_steps);
    bar.set_position(trainer.state.step);
    let started = Instant::now();
    let mut tokens = 0usize;
    let mut timed_out = false;
    while trainer.state.step < args.max_steps {
        if args
            .time_limit
            .is_some_and(|t| started.elapsed().as_secs_f64() >= t)
        {
            timed_out = true;
            break;
        }
        let r = trainer.step()?;
        tokens += r.tokens;
        let rate = tokens as f64 / started.elapsed().as_secs_f64();
        bar.set_position(r.step);
        bar.set_message(super::bar_message(r.loss, r.lr, rate));
        if args.eval_every > 0 && r.step % args.eval_every == 0 && r.step < args.max_steps {
            if let Some((nll, bpc)) = evaluate(&trainer) {
                log_line(
                    &bar,
                    format!(
                        "step {}: train loss {:.4} valid loss {nll:.4} nats/token, {bpc:.4} bits/char, {rate:.0} tok/s",
                        r.step, r.loss
                    ),
                );
            }
            trainer.save(&args.out)?;
        }
    }
    bar.finish();
    if timed_out {
        eprintln!("time limit reached at step {}", trainer.state.step);
    }
    trainer.save(&args.out)?;
    if let Some((nll, bpc)) = evaluate(&trainer) {
        eprintln!(
            "valid loss {nll:.4} nats/token, perplexity {:.2}, {bpc:.4} bits/char",
            nll.exp()
        );
    }
    eprintln!(
        "saved {} at step {} ({:.1} s, {:.0} tokens/s)",
        args.out.display(),
        trainer.state.step,
        started.elapsed().as_secs_f64(),
        tokens as f64 / started.elapsed().as_secs_f64().max(1e-9)
    );
    Ok(())
}
