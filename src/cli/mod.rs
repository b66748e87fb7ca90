//! The command-line interface: one file per subcommand, each its arguments, its progress and
//! output, and calls into the library. Shared by several: the argument groups and the checks of
//! directory arguments ([`args`]), what the training commands print and check ([`training`]),
//! and here the command table, the thread pool and stdin.

pub mod args;
pub mod attention;
pub mod average;
pub mod bench;
pub mod bench_bandwidth;
pub mod bench_generate;
pub mod bleu;
pub mod chat;
pub mod classify;
pub mod demo;
pub mod devices;
pub mod embed;
pub mod generate;
pub mod heads;
pub mod loadtest;
pub mod loadtest_translate;
pub mod perplexity;
pub mod prune;
pub mod pull;
pub mod score;
pub mod serve;
pub mod speculative;
pub mod template;
pub mod tokenize;
pub mod train;
pub mod train_classifier;
pub mod train_lm;
pub mod train_mlm;
pub mod training;

// `src/main.rs` calls it first thing; the module `alloc` is private to the crate without the
// feature `internals`.
pub use crate::alloc::keep_freed_buffers;
pub mod translate;

/// `println!` that returns the write's error instead of panicking: a closed stdout (`| head`)
/// ends the command quietly ([`is_broken_pipe`]).
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*)
    }};
}
pub(crate) use outln;

/// Whether `error` comes from writing to a closed pipe (`transformer generate | head`): the
/// reader has what it wanted, so the command ends quietly with exit status 0.
pub fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "transformer",
    version,
    about = "The Transformer of \"Attention Is All You Need\": train, translate, score and benchmark on the CPU"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Train an encoder-decoder model on `source<TAB>target` pairs.
    Train(Box<train::TrainArgs>),
    /// Translate source lines from stdin to stdout (greedy decoding, or beam search: --beam).
    Translate(translate::TranslateArgs),
    /// Print log p(target | source) (natural log) for each `source<TAB>target` line on stdin.
    Score(score::ScoreArgs),
    /// The embedded default: learn English number words -> German number words, in minutes.
    Demo(demo::DemoArgs),
    /// Time training steps on random tokens (--lm: a decoder-only step and peak memory), or
    /// translation of a file with a trained model (--translate), or prompt and decode speed of
    /// a language model (--generate).
    Bench(bench::BenchArgs),
    /// Sentence embeddings of stdin lines with a pretrained BERT encoder (e.g. all-MiniLM-L6-v2),
    /// one JSON line each.
    Embed(embed::EmbedArgs),
    /// Average the parameters of checkpoints of one translation model into a model directory.
    Average(average::AverageArgs),
    /// Corpus BLEU (sacreBLEU defaults) of hypotheses (file or stdin) against `--ref`.
    Bleu(bleu::BleuArgs),
    /// Heat maps of every layer's and head's attention weights for one sentence pair: three
    /// PNG/SVG files.
    Attention(attention::AttentionArgs),
    /// Train a GPT-style decoder-only language model (byte-level BPE) on a text file.
    TrainLm(train_lm::TrainLmArgs),
    /// Pre-train a BERT encoder with the masked-LM objective (byte-level BPE with `[CLS]`
    /// `[SEP]` `[MASK]` `[PAD]`) on a text file; `embed` reads the result.
    TrainMlm(train_mlm::TrainMlmArgs),
    /// Fine-tune a BERT encoder (train-mlm's, a Hugging Face BERT such as all-MiniLM-L6-v2, or
    /// a fresh one) for sentence classification on `text<TAB>label` lines; `classify` reads
    /// the result.
    TrainClassifier(Box<train_classifier::TrainClassifierArgs>),
    /// Classify stdin lines with a model of train-classifier, one JSON line each (the label
    /// and every label's probability); or its accuracy on a labelled file (--eval).
    Classify(classify::ClassifyArgs),
    /// Continue a prompt with a language model (sampling, KV cache), streamed to stdout.
    Generate(generate::GenerateArgs),
    /// Talk with a chat model (a Llama-family GGUF or Hugging Face directory), line by line.
    Chat(chat::ChatArgs),
    /// Loss per token, perplexity and bits per character of stdin (one document) under a
    /// language model.
    Perplexity(perplexity::PerplexityArgs),
    /// Serve a model over HTTP: OpenAI-compatible completions and chat (streamed, continuous
    /// batching over a paged KV cache) and embeddings, LibreTranslate's /translate, a page at
    /// `/`, Prometheus `/metrics`.
    Serve(serve::ServeArgs),
    /// Load-test an OpenAI-compatible server on loopback: throughput, p50/p99 latency and
    /// time to first token at several concurrencies (or, with --translate, a translation
    /// server's /translate).
    Loadtest(loadtest::LoadtestArgs),
    /// Token ids of texts under a model's tokenizer (GGUF, as llama.cpp; tokenizer.json):
    /// `--text T`, or `--json` (a JSON array of strings on stdin).
    Tokenize(tokenize::TokenizeArgs),
    /// Render a conversation (a JSON object on stdin: messages, tools, ...) with a model's chat
    /// template (or a .jinja file) and print the prompt exactly, as transformers renders it.
    Template(template::TemplateArgs),
    /// Every attention head's importance (Michel et al. 2019: E|dL/dξ_h| of a gate on its
    /// output, normalised per layer) and what it does (attention distance, entropy, weight on
    /// the previous / same / first token), on a data file; a table, JSON or a heat map
    Heads(heads::HeadsArgs),
    /// Removes attention heads physically (the least important or random ones) and writes the
    /// smaller model, which loads wherever the unpruned one does
    Prune(prune::PruneArgs),
    /// What models can run on here: the CPU, and each GPU adapter as `--device gpu:N` names it
    /// (name, kind, API, driver, features).
    Devices(devices::DevicesArgs),
    /// Fetch a model from the Hugging Face Hub into its cache (as huggingface_hub lays it out,
    /// so transformers and llama.cpp share it) and print its local path:
    /// `hf:ORG/REPO[:QUANT or FILE]`. Every --model (and --draft) takes such a name too.
    Pull(pull::PullArgs),
}

impl Command {
    /// The `--threads` of the commands whose thread pool [`run`] sets up (once, before the
    /// command runs on it).
    fn threads(&self) -> Option<usize> {
        Some(match self {
            Command::Train(a) => a.pool.threads,
            Command::Translate(a) => a.pool.threads,
            Command::Score(a) => a.pool.threads,
            Command::Demo(a) => a.pool.threads,
            Command::Bench(a) => a.pool.threads,
            Command::Embed(a) => a.pool.threads,
            Command::Attention(a) => a.pool.threads,
            Command::TrainLm(a) => a.pool.threads,
            Command::TrainMlm(a) => a.pool.threads,
            Command::TrainClassifier(a) => a.pool.threads,
            Command::Classify(a) => a.pool.threads,
            Command::Generate(a) => a.pool.threads,
            Command::Chat(a) => a.pool.threads,
            Command::Perplexity(a) => a.pool.threads,
            Command::Heads(a) => a.pool.threads,
            Command::Prune(a) => a.pool.threads,
            // The server sizes the pool itself: its async runtime must not run on a pool worker.
            // The load test's offline engine sizes it too (it has no pool without --offline).
            Command::Average(_) | Command::Bleu(_) | Command::Serve(_) | Command::Loadtest(_) => {
                return None
            }
            Command::Tokenize(_) => return None,
            Command::Template(_) | Command::Devices(_) | Command::Pull(_) => return None,
        })
    }
}

/// Runs one parsed command line. Commands with `--threads` run on a worker of the thread pool
/// they size, set up here and only here (the command reads its size with
/// `rayon::current_num_threads`): the many small parallel loops of a decoding step then start on a pool thread
/// instead of waking the pool from outside and sleeping until it is done (with one thread,
/// they run inline with no hand-off at all).
pub fn run(mut cli: Cli) -> Result<()> {
    // TRANSFORMER_KERNEL caps the low-precision kernels; a name this CPU cannot run is refused
    // here, before any work, rather than quietly ignored.
    if let Some(kernel) = crate::kernels::lowp::kernel_from_env().map_err(anyhow::Error::msg)? {
        crate::kernels::lowp::set_kernel_cap(kernel);
    }
    // TRANSFORMER_AVX_VNNI (the AVX2 int8 kernel reads it at first use): a value other than
    // 0 or 1 is refused here, before any work.
    crate::kernels::lowp::avx_vnni_from_env().map_err(anyhow::Error::msg)?;
    // TRANSFORMER_GGUF_MEMORY (read when a GGUF file is opened): refused here too, before any
    // work, whatever the command.
    crate::store::file_memory::FileMemory::from_env().map_err(anyhow::Error::msg)?;
    if let Command::Bench(a) = &cli.command {
        if let Some(name) = &a.kernel {
            let kernel = crate::kernels::lowp::kernel_for_this_cpu(name)
                .map_err(|e| anyhow::anyhow!("--kernel {name}: {e}"))?;
            crate::kernels::lowp::set_kernel_cap(kernel);
        }
    }
    // `hf:ORG/REPO...` model arguments become local paths (fetched into the Hub's cache).
    pull::resolve_model_names(&mut cli.command)?;
    match cli.command.threads() {
        Some(threads) => {
            set_threads(threads)?;
            rayon::scope(|_| dispatch(cli.command))
        }
        None => dispatch(cli.command),
    }
}

fn dispatch(command: Command) -> Result<()> {
    match command {
        Command::Train(a) => train::run(*a),
        Command::Translate(a) => translate::run(a),
        Command::Score(a) => score::run(a),
        Command::Demo(a) => demo::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Embed(a) => embed::run(a),
        Command::Average(a) => average::run(a),
        Command::Bleu(a) => bleu::run(a),
        Command::Attention(a) => attention::run(a),
        Command::TrainLm(a) => train_lm::run(a),
        Command::TrainMlm(a) => train_mlm::run(a),
        Command::TrainClassifier(a) => train_classifier::run(*a),
        Command::Classify(a) => classify::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Perplexity(a) => perplexity::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Loadtest(a) => loadtest::run(a),
        Command::Tokenize(a) => tokenize::run(a),
        Command::Template(a) => template::run(a),
        Command::Heads(a) => heads::run(a),
        Command::Prune(a) => prune::run(a),
        Command::Devices(a) => devices::run(a),
        Command::Pull(a) => pull::run(a),
    }
}

/// The most worker threads per available core (`--threads` above is capped, with a warning).
pub const MAX_THREADS_PER_CORE: usize = 4;

/// Sets the number of worker threads (0: all cores) for the whole process; more than
/// [`MAX_THREADS_PER_CORE`] per available core are capped with a warning (they only slow the
/// run down, and thousands of them stall it).
pub fn set_threads(threads: usize) -> Result<usize> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cap = cores.saturating_mul(MAX_THREADS_PER_CORE);
    let n = match threads {
        0 => cores,
        n if n > cap => {
            eprintln!(
                "warning: --threads {n} is more than {MAX_THREADS_PER_CORE} per available core \
                 ({cores}); using {cap}"
            );
            cap
        }
        n => n,
    };
    // A second call in the same process (tests) keeps the first pool.
    // Commands run on a worker (see `run`), so workers get a main thread's stack.
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .stack_size(8 << 20)
        .build_global();
    Ok(rayon::current_num_threads())
}

/// Reads all of stdin, naming it in errors.
pub fn read_stdin_lines() -> Result<Vec<String>> {
    let lines = crate::text::corpus::read_lines(std::io::stdin().lock(), "<stdin>")
        .context("reading standard input")?;
    Ok(lines)
}
