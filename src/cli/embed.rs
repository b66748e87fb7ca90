//! `transformer embed --model DIR < sentences.txt`: one JSON line `{"embedding":[...]}` per input
//! line, the L2-normalised mean of a pretrained BERT encoder's last hidden states (the
//! sentence-transformers recipe, e.g. all-MiniLM-L6-v2).

use super::args::{DeviceArgs, PrecisionArgs, ThreadsArgs};
use super::read_stdin_lines;
use crate::model::device_encoder::DeviceBert;
use crate::pipeline::device::DeviceChoice;
use crate::pipeline::embed::SentenceEncoder;
use anyhow::Result;
use clap::Args;
use std::io::Write;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct EmbedArgs {
    /// Hugging Face BERT directory: config.json, model.safetensors, tokenizer.json (and
    /// optionally sentence_bert_config.json); or an encoder pre-trained by train-mlm.
    #[arg(long)]
    pub model: PathBuf,
    /// Sentences embedded together (sorted by length, padded to the longest of each batch).
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    /// Word pieces kept per sentence, special tokens included; longer sentences are truncated
    /// [default: max_seq_length of the directory's sentence_bert_config.json, else 256 or the
    /// model's positions if fewer].
    #[arg(long)]
    pub max_len: Option<usize>,
    #[command(flatten)]
    pub weights: PrecisionArgs,
    #[command(flatten)]
    pub pool: ThreadsArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
}

pub fn run(args: EmbedArgs) -> Result<()> {
    let device = args.device.choice()?;
    let mut encoder = SentenceEncoder::load(&args.model, args.max_len)?;
    let precision = args.weights.precision.float_precision()?;
    if device != DeviceChoice::Cpu && precision != crate::Precision::F32 {
        anyhow::bail!("--device gpu multiplies f32 weights, not --precision bf16 or int8");
    }
    encoder
        .model
        .prepare_precision(precision)
        .map_err(|e| anyhow::anyhow!("--precision: {e}"))?;
    let on_gpu = (device.open_gpu()?)
        .map(|gpu| DeviceBert::new(gpu, &encoder.model))
        .transpose()?;
    let lines = read_stdin_lines()?;
    let start = std::time::Instant::now();
    let embeddings = match &on_gpu {
        None => encoder.embed(&lines, args.batch_size)?,
        Some(bert) => encoder.embed_on_device(bert, &lines, args.batch_size)?,
    };
    let secs = start.elapsed().as_secs_f64();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for e in &embeddings {
        serde_json::to_writer(&mut out, &serde_json::json!({ "embedding": e }))?;
        writeln!(out)?;
    }
    out.flush()?;
    eprintln!(
        "embedded {} sentences in {secs:.2} s ({:.1} sentences/s)",
        lines.len(),
        lines.len() as f64 / secs.max(1e-9)
    );
    Ok(())
}
