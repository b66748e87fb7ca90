//! `transformer chat --model M [--system TEXT]`: an interactive conversation with a chat model.
//! Each line read from stdin is a user message; the whole conversation goes through the model's
//! chat template and the reply is streamed until the end-of-turn token. An empty line or the
//! end of the input ends the session.

use super::{sampling_options, set_threads};
use crate::pipeline::chat::ChatMessage;
use crate::pipeline::generate::{generate_ids, TextGenerator};
use crate::rng::Rng;
use crate::text::decoder_tokenizer::StreamDecoder;
use anyhow::{bail, Result};
use clap::Args;
use std::io::{BufRead, Write};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// A chat model: a Hugging Face directory with a chat template, or a .gguf file.
    #[arg(long)]
    pub model: PathBuf,
    /// A system message (default: the template's own, if it has one).
    #[arg(long)]
    pub system: Option<String>,
    /// Tokens of a reply at most.
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,
    /// Softmax temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
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
    /// The numbers the weights are multiplied in: f32 (a GGUF file dequantised at load), bf16,
    /// int8, or ggml (a GGUF file's own quantised blocks, as llama.cpp computes).
    #[arg(long, value_enum, default_value = "f32")]
    pub precision: super::PrecisionArg,
    /// Worker threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

pub fn run(args: ChatArgs) -> Result<()> {
    let opts = sampling_options(args.temperature, args.top_k, args.top_p)?;
    set_threads(args.threads)?;
    let generator = TextGenerator::load_prepared(&args.model, args.precision.model_precision())?;
    if generator.chat.is_none() {
        bail!("{}: this model has no chat template", args.model.display());
    }
    let until = generator.tokenizer.end_tokens();
    let mut rng = Rng::new(args.seed);
    let mut messages: Vec<ChatMessage> = Vec::new();
    if let Some(system) = &args.system {
        messages.push(ChatMessage::new("system", system));
    }
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let interactive = std::io::IsTerminal::is_terminal(&stdin);
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            write!(out, "> ")?;
            out.flush()?;
        }
        let Some(line) = lines.next() else { break };
        let line = line?;
        if line.trim().is_empty() {
            break;
        }
        messages.push(ChatMessage::new("user", &line));
        let prompt = generator.chat_prompt(&messages)?;
        let mut decoder = StreamDecoder::new(&generator.tokenizer);
        let model = &generator.model;
        let ids = generate_ids(
            model,
            &prompt,
            args.max_tokens,
            opts,
            &mut rng,
            &until,
            |id| {
                if !until.contains(&id) {
                    let piece = decoder.push(id)?;
                    out.write_all(piece.as_bytes())?;
                    out.flush()?;
                }
                Ok::<(), anyhow::Error>(())
            },
        )?;
        writeln!(out, "{}", decoder.finish()?)?;
        let reply: Vec<u32> = ids.into_iter().filter(|id| !until.contains(id)).collect();
        messages.push(ChatMessage::new(
            "assistant",
            &generator.tokenizer.decode(&reply)?,
        ));
    }
    Ok(())
}
