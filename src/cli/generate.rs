//! `transformer generate`: continue a prompt with a language model written by `train-lm`,
//! sampling through the KV cache, streamed to stdout.

use super::set_threads;
use crate::decode::sample::SamplingOptions;
use crate::pipeline::generate::{document_tokens, generate_ids, TextGenerator};
use crate::rng::Rng;
use crate::text::bpe::StreamDecoder;
use anyhow::{bail, Result};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// A directory written by train-lm.
    #[arg(long)]
    pub model: PathBuf,
    /// The text to continue (printed first; fed after <|endoftext|>, as documents are trained).
    #[arg(long, default_value = "")]
    pub prompt: String,
    /// Tokens to sample, always this many (a sampled <|endoftext|> is printed as text and does
    /// not stop it). Past the model's context the cache restarts from the last half of it.
    #[arg(long, default_value_t = 200)]
    pub max_tokens: usize,
    /// Softmax temperature; 0 is greedy.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f64,
    /// Sample among the k most likely tokens only (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling: the smallest set of tokens with this much probability (1: all).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    /// Seed of the sampling generator.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Worker threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

pub fn run(args: GenerateArgs) -> Result<()> {
    if !(args.temperature.is_finite() && args.temperature >= 0.0) {
        bail!("--temperature {} must be >= 0", args.temperature);
    }
    if !(args.top_p > 0.0 && args.top_p <= 1.0) {
        bail!("--top-p {} must be in (0, 1]", args.top_p);
    }
    set_threads(args.threads)?;
    let TextGenerator { mut model, bpe } = TextGenerator::load(&args.model)?;
    model.prepare_inference();
    let prompt = document_tokens(&bpe, &args.prompt)?;
    model.embedding.check_ids(&prompt)?;
    let opts = SamplingOptions {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    write!(out, "{}", args.prompt)?;
    out.flush()?;
    let mut decoder = StreamDecoder::new(&bpe);
    let mut rng = Rng::new(args.seed);
    generate_ids(
        &model,
        &prompt,
        args.max_tokens,
        opts,
        &mut rng,
        |id| -> Result<()> {
            let piece = decoder.push(id)?;
            if !piece.is_empty() {
                out.write_all(piece.as_bytes())?;
                out.flush()?;
            }
            Ok(())
        },
    )?;
    let rest = decoder.finish()?;
    writeln!(out, "{rest}")?;
    out.flush()?;
    Ok(())
}
