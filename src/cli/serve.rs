//! `transformer serve --model PATH [--addr 127.0.0.1:8080]`: the model behind an HTTP server
//! (OpenAI-compatible endpoints, LibreTranslate's `/translate`, a web page at `/`, Prometheus
//! metrics); see [`crate::serve`].

use super::args::PrecisionArg;
use super::set_threads;
use crate::serve::{ServeConfig, Server};
use anyhow::{bail, Result};
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// A language model (a `train-lm` directory, a Hugging Face Llama/GPT-2 directory, a
    /// Llama-family .gguf file), a translation model directory (`train`, `demo --out`) or a
    /// BERT encoder directory (all-MiniLM-L6-v2).
    #[arg(long)]
    pub model: PathBuf,
    /// Address and port to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// Memory of the paged KV cache pool, in MiB: a request is admitted only when the blocks
    /// for its prompt plus max_tokens are free.
    #[arg(long, default_value_t = 512)]
    pub kv_memory: usize,
    /// Sequences decoded together at most (the running batch; a translation model: sentences).
    #[arg(long, default_value_t = 64)]
    pub max_batch: usize,
    /// Requests waiting for admission at most; more get 429 with Retry-After.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
    /// Prompt tokens at most (default: the model's context less one).
    #[arg(long)]
    pub max_input_tokens: Option<usize>,
    /// max_tokens at most.
    #[arg(long, default_value_t = 2048)]
    pub max_output_tokens: usize,
    /// Seconds a request may take, waiting included (then 504, or an error event).
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,
    /// Tokens one forward pass feeds at most (decode tokens plus prompt chunks; a translation
    /// model: source tokens encoded per step, padding included).
    #[arg(long, default_value_t = 512)]
    pub prefill_budget: usize,
    /// Positions per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// A translation model's source language code (`/languages`, LibreTranslate's `source`).
    #[arg(long, default_value = "src")]
    pub source_lang: String,
    /// A translation model's target language code.
    #[arg(long, default_value = "tgt")]
    pub target_lang: String,
    /// The numbers the model's products use (see `generate --precision`).
    #[arg(long, value_enum, default_value_t)]
    pub precision: PrecisionArg,
    /// Worker threads for the model (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

pub fn run(args: ServeArgs) -> Result<()> {
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        bail!(
            "--timeout {} must be a positive number of seconds",
            args.timeout
        );
    }
    for (name, v) in [
        ("--kv-memory", args.kv_memory),
        ("--max-batch", args.max_batch),
        ("--max-output-tokens", args.max_output_tokens),
        ("--prefill-budget", args.prefill_budget),
        ("--block-size", args.block_size),
    ] {
        if v == 0 {
            bail!("{name} must be at least 1");
        }
    }
    let threads = set_threads(args.threads)?;
    let config = ServeConfig {
        kv_memory_mib: args.kv_memory,
        max_batch: args.max_batch,
        max_queue: args.max_queue,
        max_input_tokens: args.max_input_tokens,
        max_output_tokens: args.max_output_tokens,
        timeout_s: args.timeout,
        block_rows: args.block_size,
        prefill_budget: args.prefill_budget,
        source_lang: args.source_lang.clone(),
        target_lang: args.target_lang.clone(),
        precision: args.precision.model_precision(),
        ..ServeConfig::new(args.model.clone(), args.addr)
    };
    let server = Server::start(config)?;
    eprintln!(
        "listening on http://{} ({threads} threads); loading {}",
        server.addr,
        args.model.display()
    );
    if let Err(e) = server.wait_ready() {
        let _ = server.shutdown();
        bail!("{}: {e}", args.model.display());
    }
    eprintln!(
        "ready: open http://{}/ in a browser (SIGTERM or Ctrl-C stops)",
        server.addr
    );
    server.wait()?;
    eprintln!("stopped");
    Ok(())
}
