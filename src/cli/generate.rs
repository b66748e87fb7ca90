//! `transformer generate`: continue a prompt with a language model (a `train-lm` directory, a
//! Hugging Face Llama or GPT-2 directory, or a llama GGUF file), sampling through the KV cache,
//! streamed to stdout; `--chat` sends the prompt as a user message through the model's chat
//! template and stops at the end of the reply.

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
use anyhow::Result;
use clap::{Args, ValueEnum};
use std::io::Write;
use std::path::PathBuf;

/// How `generate` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// The prompt, then the continuation as it is sampled.
    Text,
    /// One JSON object at the end: prompt_ids, new_ids, text (the continuation),
    /// prefill_seconds (to the first new token), decode_seconds (first to last), and with
    /// speculative decoding the draft counts (speculative).
    Json,
}

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// A directory written by train-lm, a Hugging Face directory (config.json model_type llama
    /// or gpt2), or a llama .gguf file.
    #[arg(long)]
    pub model: PathBuf,
    /// The text to continue (printed first). A train-lm model reads it after <|endoftext|>, as
    /// documents are trained; the others as their tokenizer encodes a text.
    #[arg(long, default_value = "")]
    pub prompt: String,
    /// Send --prompt as a user message through the model's chat template (and --system first)
    /// and generate the assistant's reply, up to its end-of-turn token.
    #[arg(long)]
    pub chat: bool,
    /// With --chat: a system message (default: the template's own, if it has one).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Tokens to sample at most. A train-lm model always samples this many (a sampled
    /// <|endoftext|> is printed as text); the others stop after their end-of-sequence or
    /// end-of-turn token. Past the model's context the cache restarts from the last half of it.
    #[arg(long, default_value_t = 200)]
    pub max_tokens: usize,
    /// Output: text (streamed) or json.
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
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

pub fn run(args: GenerateArgs) -> Result<()> {
    let opts = args.sampling.options()?;
    let device = args.device.choice()?;
    let precision = args.device.precision(
        device,
        &args.model,
        args.weights.precision.model_precision(),
        args.speculative.draft.is_some() || args.speculative.lookup,
        &args.context.cache,
    )?;
    let TextGenerator {
        mut model,
        tokenizer,
        chat,
        ..
    } = TextGenerator::load_prepared(&args.model, precision)?;
    args.context.apply(&mut model)?;
    let draft = args.speculative.load(&tokenizer)?;
    let speculation = args.speculative.speculation(&model, &draft)?;
    let on_gpu = device
        .open_gpu()?
        .map(|gpu| DeviceLm::new(gpu, &model))
        .transpose()?;
    // Device memory of the weights (before any KV block), and the counters from here on.
    let weight_bytes = on_gpu.as_ref().map(|lm| {
        lm.device.gpu.counters().reset();
        lm.device.gpu.allocated_bytes()
    });
    // Continues the prompt on the CPU (with the draft model when speculating) or the GPU.
    let continue_prompt = |rng: &mut Rng,
                           stats: &mut SpeculativeStats,
                           prompt: &[u32],
                           until: &[u32],
                           emit: &mut dyn FnMut(u32) -> Result<()>|
     -> Result<Vec<u32>> {
        match &on_gpu {
            Some(lm) => generate_on_device(lm, prompt, args.max_tokens, opts, rng, until, emit),
            None => generate_ids_with(
                &model,
                prompt,
                args.max_tokens,
                opts,
                rng,
                until,
                speculation.as_ref(),
                stats,
                emit,
            ),
        }
    };
    let mut stats = SpeculativeStats::default();
    let prompt = if args.chat {
        let template = chat
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("--chat: this model has no chat template"))?;
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage::new("system", system));
        }
        messages.push(ChatMessage::new("user", &args.prompt));
        tokenizer.encode(&template.prompt(&messages)?)?
    } else {
        tokenizer.document(&args.prompt)?
    };
    let until = tokenizer.end_tokens();
    model.embedding.check_ids(&prompt)?;
    ContextArgs::check_generation(&model, prompt.len(), args.max_tokens)?;
    let mut rng = Rng::new(args.sampling.seed);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.format == Format::Json {
        let start = std::time::Instant::now();
        let mut first_token = None;
        let ids = continue_prompt(&mut rng, &mut stats, &prompt, &until, &mut |_| {
            first_token.get_or_insert_with(std::time::Instant::now);
            Ok(())
        })?;
        let shown: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|id| !until.contains(id))
            .collect();
        let end = std::time::Instant::now();
        let first = first_token.unwrap_or(end);
        let mut json = serde_json::json!({
            "prompt_ids": prompt,
            "new_ids": ids,
            "text": tokenizer.decode(&shown)?,
            "prefill_seconds": (first - start).as_secs_f64(),
            "decode_seconds": (end - first).as_secs_f64(),
        });
        if speculation.is_some() {
            json["speculative"] = super::speculative::json(&stats);
        }
        if let (Some(lm), Some(weights)) = (&on_gpu, weight_bytes) {
            let c = lm.device.gpu.counters().get();
            json["device"] = serde_json::json!({
                "adapter": lm.device.gpu.label(),
                "weight_bytes": weights,
                "steps": ids.len(),
                "submissions": c.submissions,
                "dispatches": c.dispatches,
                "bytes_up": c.bytes_up,
                "bytes_down": c.bytes_down,
            });
        }
        writeln!(out, "{json}")?;
        return Ok(());
    }
    if !args.chat {
        write!(out, "{}", args.prompt)?;
        out.flush()?;
    }
    let mut decoder = StreamDecoder::new(&tokenizer);
    continue_prompt(&mut rng, &mut stats, &prompt, &until, &mut |id| -> Result<
        (),
    > {
        if until.contains(&id) {
            return Ok(());
        }
        let piece = decoder.push(id)?;
        if !piece.is_empty() {
            out.write_all(piece.as_bytes())?;
            out.flush()?;
        }
        Ok(())
    })?;
    let rest = decoder.finish()?;
    writeln!(out, "{rest}")?;
    out.flush()?;
    if speculation.is_some() {
        eprintln!("{}", super::speculative::report(&stats));
    }
    Ok(())
}
