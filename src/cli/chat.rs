//! `transformer chat --model M [--system TEXT]`: an interactive conversation with a chat model.
//! Each line read from stdin is a user message; the whole conversation goes through the model's
//! chat template and the reply is streamed until the end-of-turn token. An empty line or the
//! end of the input ends the session.

use super::args::{ContextArgs, DeviceArgs, PrecisionArgs, SamplingArgs, ThreadsArgs};
use super::speculative::SpeculativeArgs;
use crate::decode::speculative::SpeculativeStats;
use crate::model::device_lm::DeviceLm;
use crate::pipeline::chat::ChatMessage;
use crate::pipeline::device::generate_on_device;
use crate::pipeline::generate::TextGenerator;
use crate::pipeline::speculative::generate_ids_with;
use crate::rng::Rng;
use crate::text::decoder_tokenizer::StreamDecoder;
use anyhow::{bail, Result};
use clap::Args;
use std::io::{BufRead, Write};
use std::path::PathBuf;

#[derive(Args, Debug)]
// A reply is greedy unless asked: `--temperature` defaults to 0 here (1 in `generate`).
#[command(mut_arg("temperature", |a| a
    .default_value("0")
    .help("Softmax temperature; 0 is greedy")))]
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
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub speculative: SpeculativeArgs,
    #[command(flatten)]
    pub weights: PrecisionArgs,
    #[command(flatten)]
    pub context: ContextArgs,
    #[command(flatten)]
    pub pool: ThreadsArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
}

pub fn run(args: ChatArgs) -> Result<()> {
    let opts = args.sampling.options()?;
    let device = args.device.choice()?;
    let precision = args.device.precision(
        device,
        &args.model,
        args.weights.precision.model_precision(),
        args.speculative.draft.is_some() || args.speculative.lookup,
        &args.context.cache,
    )?;
    let mut generator = TextGenerator::load_prepared(&args.model, precision)?;
    args.context.apply(&mut generator.model)?;
    let on_gpu = (device.open_gpu()?)
        .map(|gpu| DeviceLm::new(gpu, &generator.model))
        .transpose()?;
    if generator.chat.is_none() {
        bail!("{}: this model has no chat template", args.model.display());
    }
    let draft = args.speculative.load(&generator.tokenizer)?;
    let speculation = args.speculative.speculation(&generator.model, &draft)?;
    let mut stats = SpeculativeStats::default();
    let until = generator.tokenizer.end_tokens();
    let mut rng = Rng::new(args.sampling.seed);
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
        ContextArgs::check_generation(model, prompt.len(), args.max_tokens)?;
        let emit = |id| {
            if !until.contains(&id) {
                let piece = decoder.push(id)?;
                out.write_all(piece.as_bytes())?;
                out.flush()?;
            }
            Ok::<(), anyhow::Error>(())
        };
        let ids = match &on_gpu {
            Some(lm) => {
                generate_on_device(lm, &prompt, args.max_tokens, opts, &mut rng, &until, emit)
            }
            None => generate_ids_with(
                model,
                &prompt,
                args.max_tokens,
                opts,
                &mut rng,
                &until,
                speculation.as_ref(),
                &mut stats,
                emit,
            ),
        }?;
        writeln!(out, "{}", decoder.finish()?)?;
        let reply: Vec<u32> = ids.into_iter().filter(|id| !until.contains(id)).collect();
        messages.push(ChatMessage::new(
            "assistant",
            &generator.tokenizer.decode(&reply)?,
        ));
    }
    if speculation.is_some() {
        eprintln!("{}", super::speculative::report(&stats));
    }
    Ok(())
}
