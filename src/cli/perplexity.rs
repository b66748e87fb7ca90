//! `transformer perplexity`: loss per token, perplexity and bits per character of stdin under a
//! language model written by `train-lm`.

use super::args::{ContextArgs, DeviceArgs, PrecisionArgs, ThreadsArgs};
use crate::model::device_lm::DeviceLm;
use crate::pipeline::device::score_document_on_device;
use crate::pipeline::generate::TextGenerator;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    /// A directory written by train-lm.
    #[arg(long)]
    pub model: PathBuf,
    /// Window step in tokens (default: the context length, i.e. non-overlapping windows; a
    /// smaller stride gives each token more history and costs context/stride times more).
    #[arg(long)]
    pub stride: Option<usize>,
    /// Window length in tokens (default and upper bound: --ctx-size, else the model's
    /// context length). A shorter window scores long texts faster (attention costs grow with
    /// its square) and gives each token at most that much history.
    #[arg(long)]
    pub context: Option<usize>,
    /// Windows per forward pass.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    #[command(flatten)]
    pub weights: PrecisionArgs,
    #[command(flatten)]
    pub ctx_size: ContextArgs,
    #[command(flatten)]
    pub pool: ThreadsArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
}

pub fn run(args: PerplexityArgs) -> Result<()> {
    let device = args.device.choice()?;
    let precision = args.device.precision(
        device,
        &args.model,
        args.weights.precision.model_precision(),
        false,
        &args.ctx_size.cache,
    )?;
    let mut generator = TextGenerator::load_prepared(&args.model, precision)?;
    args.ctx_size.apply(&mut generator.model)?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut bytes)
        .context("reading standard input")?;
    let text = String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "<stdin>: not UTF-8 (invalid byte at offset {})",
            e.utf8_error().valid_up_to()
        )
    })?;
    if text.is_empty() {
        bail!("<stdin>: empty text, nothing to score");
    }
    let max_len = generator.model.max_len();
    let window = args.context.unwrap_or(max_len);
    if window == 0 || window > max_len {
        bail!(
            "--context {window}: the context is 1 to {max_len} tokens (--ctx-size, else the \
             model's)"
        );
    }
    let stride = args.stride.unwrap_or(window);
    if stride == 0 {
        bail!("--stride must be positive");
    }
    // With --cache-type-k/-v (f32 included) the windows go through the key/value cache.
    let through_cache = args.ctx_size.cache.given();
    let windows = (window, stride, args.batch);
    let s = match device.open_gpu()? {
        None => generator.perplexity_in_windows(&text, windows, through_cache)?,
        Some(gpu) => {
            let lm = DeviceLm::new(gpu, &generator.model)?;
            score_document_on_device(&lm, &generator.tokenizer, &text, windows)?
        }
    };
    super::outln!(
        "tokens {} chars {} loss {:.4} nats/token perplexity {:.3} bits/char {:.4}",
        s.tokens,
        s.chars,
        s.nats_per_token,
        s.perplexity,
        s.bits_per_char
    )?;
    Ok(())
}
