//! `transformer train-lm`: learn a byte-level BPE on a text file and train a GPT-style
//! decoder-only Transformer on it, with validation on the file's end and exact resume.

use super::{print_curves, set_threads, BarReporter};
use crate::dist::Communicator;
use crate::kernels::lowp::bf16_train::Bf16Kernel;
use crate::model::config::Normalization;
use crate::model::Module;
use crate::model::{Activation, ModelConfig, NormPlacement, Positions};
use crate::pipeline::generate::document_tokens;
use crate::store::{CheckpointWriter, TOKENIZER_FILE};
use crate::text::bpe::Bpe;
use crate::train::precision::TrainPrecision;
use crate::train::run::{run as run_training, Output, RunOptions};
use crate::train::source::{Recipe, MAX_STEP};
use crate::train::trainer::LmTrainer;
use crate::train::validate::{TextValidation, Validator};
use crate::train::windows::LmTrainConfig;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// The largest BPE vocabulary `--vocab-size` asks for.
pub const MAX_VOCAB: usize = 1 << 20;

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
    /// FFN activation: relu, gelu-erf, gelu-tanh, or silu-gated (SwiGLU, a gated FFN of three matrices, as Llama). Ignored with --resume.
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
    /// Stop after this many updates in total. On a fresh run also where the cosine schedule
    /// reaches its floor; with --resume the floor stays at the checkpoint's planned length.
    #[arg(long, default_value_t = 5000)]
    pub max_steps: u64,
    /// Also stop (and save) once this many seconds of training have passed. Checked after each
    /// update: the update that crosses the limit completes, so at least one runs.
    #[arg(long)]
    pub time_limit: Option<f64>,
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
    #[arg(long, default_value_t = 0, help = super::TRAIN_THREADS_HELP)]
    pub threads: usize,
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
    /// Keep only the last K step checkpoints (at least one).
    #[arg(long, default_value_t = 5)]
    pub keep_last: usize,
    #[arg(long, default_value_t = 600.0, help = super::AUTOSAVE_HELP)]
    pub autosave: f64,
    #[arg(long, help = super::OVERWRITE_HELP)]
    pub overwrite: bool,
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

/// The recipe of a fresh run, from the options.
fn recipe(args: &TrainLmArgs) -> LmTrainConfig {
    LmTrainConfig {
        context: args.context,
        batch: args.batch,
        lr: args.lr,
        warmup: args.warmup,
        total_steps: args.max_steps,
        clip_norm: (args.clip_norm > 0.0).then_some(args.clip_norm),
        label_smoothing: args.label_smoothing,
        seed: args.seed,
        precision: args.precision,
        ..LmTrainConfig::default()
    }
}

fn check_train_args(a: &TrainLmArgs) -> Result<()> {
    if !(0.0..1.0).contains(&a.valid_fraction) {
        bail!("--valid-fraction {} must be in [0, 1)", a.valid_fraction);
    }
    if !(a.clip_norm.is_finite() && a.clip_norm >= 0.0) {
        bail!("--clip-norm {} must be >= 0", a.clip_norm);
    }
    if a.context == 0 || a.batch == 0 || a.layers == 0 {
        bail!("--context, --batch and --layers must be positive");
    }
    if a.max_steps > MAX_STEP {
        bail!(
            "--max-steps {} is beyond the supported {MAX_STEP}",
            a.max_steps
        );
    }
    if a.resume.is_none() {
        if a.vocab_size > MAX_VOCAB {
            bail!(
                "--vocab-size {} is above the supported {MAX_VOCAB}",
                a.vocab_size
            );
        }
        recipe(a).validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    super::check_run_options(
        a.label_smoothing,
        a.time_limit,
        a.autosave,
        a.resume.as_deref(),
        &a.out,
        a.overwrite,
    )
}

/// A fresh run: a BPE learnt on the training text, the model and recipe from the options.
fn start(args: &TrainLmArgs, train_text: &str) -> Result<(Bpe, LmTrainer)> {
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
        bias: !args.no_bias,
        scale_embeddings: true,
        n_kv_heads: args.n_kv_heads,
        normalization: args.normalization,
        rope_base: args.rope_base,
        rope_style: Default::default(),
        qkv_bias: false,
        qk_norm: false,
        attn_logit_softcap: None,
        final_logit_softcap: None,
        norm_weight_offset: 0.0,
        embedding_scale: None,
        layer_windows: Vec::new(),
    };
    model_config
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid model: {e}"))?;
    Ok((bpe, LmTrainer::new(model_config, recipe(args), tokens)?))
}

pub fn run(args: TrainLmArgs) -> Result<()> {
    check_train_args(&args)?;
    super::with_world(|comm| run_on(args, comm))
}

/// The run on this process, one of `comm`'s ranks (only rank 0 prints and writes).
fn run_on(args: TrainLmArgs, comm: Arc<dyn Communicator>) -> Result<()> {
    let root = comm.rank() == 0;
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
            if root {
                eprintln!("{}", super::resumed_line(dir, &trainer.state));
            }
            (bpe, trainer)
        }
        None => start(&args, train_text)?,
    };
    trainer.set_communicator(comm.clone())?;
    trainer.set_bf16_kernel(args.bf16_kernel);
    let valid_tokens = document_tokens(&bpe, valid_text)?;
    let valid_chars = valid_text.chars().count();
    let n_params = trainer.model.n_params();
    let n_tokens = trainer.source().n_tokens();
    if root {
        eprintln!(
            "model: {n_params} parameters, BPE vocabulary {}, {} training tokens ({:.2} chars/token), {} validation tokens, {threads} threads{} ({:.1} s to prepare)",
            bpe.vocab_size(),
            n_tokens,
            train_text.chars().count() as f64 / n_tokens as f64,
            valid_tokens.len() - 1,
            super::ranks_note(&*comm),
            started.elapsed().as_secs_f64()
        );
        super::clear_out(&args.out, args.resume.as_deref(), args.overwrite)?;
        std::fs::create_dir_all(&args.out)
            .with_context(|| format!("cannot create {}", args.out.display()))?;
    }
    let validation = (valid_chars > 0).then_some(TextValidation {
        tokens: valid_tokens,
        chars: valid_chars,
        batch: trainer.state.config.batch,
    });
    let save_tokenizer = |w: &mut CheckpointWriter| bpe.write(w);
    let output = Output {
        dir: args.out.clone(),
        save_tokenizer: &save_tokenizer,
        log_every: Some(args.log_every),
        save_every: args.save_every,
        keep_last: args.keep_last,
        save_into_dir_every: args.eval_every,
        autosave: (args.autosave > 0.0).then_some(args.autosave),
    };
    let mut reporter = BarReporter::new(args.max_steps, trainer.state.step, |r, v, rate| {
        vec![format!(
            "step {}: train loss {:.4} valid loss {:.4} nats/token, {:.4} bits/char, {rate:.0} tok/s",
            r.step,
            r.loss,
            v.nll,
            v.bits_per_char.unwrap_or(f64::NAN)
        )]
    });
    let options = RunOptions {
        max_steps: args.max_steps,
        time_limit: args.time_limit,
        valid_every: args.eval_every,
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
        eprintln!(
            "valid loss {:.4} nats/token, perplexity {:.2}, {:.4} bits/char",
            v.nll,
            v.nll.exp(),
            v.bits_per_char.unwrap_or(f64::NAN)
        );
    }
    eprintln!(
        "saved {} at step {} ({:.1} s, {:.0} tokens/s)",
        args.out.display(),
        summary.step,
        summary.seconds,
        summary.tokens as f64 / summary.seconds.max(1e-9)
    );
    Ok(())
}
