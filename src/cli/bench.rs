//! `transformer bench`: times training steps (forward, backward, Adam) on random tokens and
//! prints `train: X tokens/s` (source + target tokens per second, median over timed steps).
//! `--lm` times a decoder-only step at `--seq-len` with `--tokens` per batch and prints the peak
//! resident memory; `--translate` times greedy and beam search with a trained model;
//! `--generate` prompt and decode tokens/s of a language model (see `bench_generate`);
//! `--bandwidth` the memory read bandwidth (see `bench_bandwidth`).

use super::args::{PrecisionArg, ThreadsArgs};
use crate::batch::Batch;
use crate::kernels::lowp::bf16_train::Bf16Kernel;
use crate::model::Module;
use crate::model::{LanguageModel, ModelConfig, Seq2Seq};
use crate::rng::Rng;
use crate::train::adam::{Adam, AdamConfig};
use crate::train::data_parallel::{split, DataParallel};
use crate::train::schedule::Schedule;
use anyhow::{Context, Result};
use clap::Args;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Model size: tiny, base or big (training and --lm; --translate uses the model's own).
    #[arg(long, default_value = "base")]
    pub preset: String,
    #[command(flatten)]
    pub pool: ThreadsArgs,
    /// The widest low-precision kernel to use: portable, avx2 or avx512 (as
    /// TRANSFORMER_KERNEL; refused where the CPU lacks it). Default: the widest this CPU runs.
    #[arg(long)]
    pub kernel: Option<String>,
    /// Sentence pairs per batch (the encoder-decoder step only).
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Source tokens per sentence, EOS included (the encoder-decoder step only).
    #[arg(long, default_value_t = 32)]
    pub src_len: usize,
    /// Target tokens per sentence, EOS included (the encoder-decoder step only).
    #[arg(long, default_value_t = 32)]
    pub tgt_len: usize,
    /// Vocabulary size (training and --lm).
    #[arg(long, default_value_t = 8000)]
    pub vocab: usize,
    /// Untimed warm-up steps (training and --lm).
    #[arg(long, default_value_t = 2)]
    pub warmup_steps: usize,
    /// Timed steps (training and --lm).
    #[arg(long, default_value_t = 5)]
    pub steps: usize,
    /// Time a decoder-only (GPT-style) training step instead, on sequences of --seq-len, in one
    /// pass (not split in halves between threads like `train-lm`'s step).
    #[arg(long, conflicts_with = "translate")]
    pub lm: bool,
    /// With --lm: tokens per sequence.
    #[arg(long, default_value_t = 512)]
    pub seq_len: usize,
    /// With --lm: tokens per batch (batch = tokens / seq-len, at least one sequence).
    #[arg(long, default_value_t = 8192)]
    pub tokens: usize,
    /// Time translation (greedy, then beam search) with the model in this directory instead.
    #[arg(long, requires = "src")]
    pub translate: Option<std::path::PathBuf>,
    /// With --translate: source sentences, one per line (empty lines are skipped).
    #[arg(long, requires = "translate")]
    pub src: Option<std::path::PathBuf>,
    /// With --translate: the beam size of the second run (length penalty α 0.6).
    #[arg(long, default_value_t = 4)]
    pub beam: usize,
    /// With --translate: when beam search stops a sentence (see `translate --beam-stop`).
    #[arg(long, value_enum, default_value = "exact")]
    pub beam_stop: crate::decode::beam::BeamStop,
    /// With --translate: sentences decoded together.
    #[arg(long, default_value_t = 32)]
    pub sentences_per_batch: usize,
    /// Time prompt (prefill) and greedy decode tokens/s of the language model at this path (a
    /// train-lm or Hugging Face directory, or a llama .gguf file) instead.
    #[arg(long, conflicts_with_all = ["translate", "lm"])]
    pub generate: Option<std::path::PathBuf>,
    /// With --generate: the prompt, a JSON list of token ids (default: a fixed English text cut
    /// to --prompt-tokens).
    #[arg(long, requires = "generate")]
    pub prompt_ids: Option<std::path::PathBuf>,
    /// With --generate and no --prompt-ids: prompt tokens.
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    /// With --generate: greedy steps after the prompt (end-of-text tokens do not stop them).
    #[arg(long, default_value_t = 128)]
    pub new_tokens: usize,
    /// With --generate: print one JSON line instead (every timed repetition's tokens/s, the
    /// greedy ids, the peak memory), as benches/compare's Python scripts do. With
    /// --bandwidth: one JSON line of the passes' GB/s.
    #[arg(long)]
    pub json: bool,
    /// Measure the memory read bandwidth instead (see `bench_bandwidth`): sum a buffer far
    /// larger than the caches on --threads threads, --warmup-steps untimed and --steps timed
    /// passes, and print the median GB/s.
    #[arg(long, conflicts_with_all = ["translate", "lm", "generate"])]
    pub bandwidth: bool,
    /// With --bandwidth: the buffer's size in MiB.
    #[arg(long, default_value_t = 1024, requires = "bandwidth")]
    pub bandwidth_mib: usize,
    /// With --bandwidth: do not advise the buffer for transparent huge pages.
    #[arg(long, requires = "bandwidth")]
    pub small_pages: bool,
    /// With --generate: the key/value cache types (see `generate --cache-type-k`).
    #[command(flatten)]
    pub cache: super::args::CacheTypeArgs,
    /// With --generate: where the model runs (see `generate --device`); on a GPU the JSON adds
    /// the device's counters per step and its memory.
    #[command(flatten)]
    pub device: super::args::DeviceArgs,
    /// With --generate or --translate: the numbers the weights are multiplied in (see
    /// `generate --precision`). Training (the default, and --lm): f32 or bf16, as
    /// `train --precision`.
    #[arg(long, value_enum, default_value = "f32")]
    pub precision: PrecisionArg,
    /// Training with --precision bf16: the kernel (see `train --bf16-kernel`).
    #[arg(long, default_value = "gemm", value_parser = Bf16Kernel::parse)]
    pub bf16_kernel: Bf16Kernel,
}

/// Peak resident memory of this process in MiB (Linux `VmHWM`), if the system reports it.
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Median of a non-empty list.
pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// Refuses sizes that would ask for more memory than any machine has before anything is
/// allocated: tokens per step, vocabulary, sequence length, beam.
fn check_sizes(args: &BenchArgs) -> Result<()> {
    use crate::train::setup::MAX_VOCAB;
    use crate::train::source::MAX_BATCH_TOKENS;
    let step_tokens = args
        .batch
        .saturating_mul(args.src_len.saturating_add(args.tgt_len));
    anyhow::ensure!(
        step_tokens <= MAX_BATCH_TOKENS && args.tokens <= MAX_BATCH_TOKENS,
        "--batch x (--src-len + --tgt-len) and --tokens must be at most {MAX_BATCH_TOKENS} tokens"
    );
    anyhow::ensure!(
        args.vocab <= MAX_VOCAB,
        "--vocab {} is above the supported {MAX_VOCAB}",
        args.vocab
    );
    anyhow::ensure!(
        args.seq_len <= 1 << 16,
        "--seq-len {} is above the supported 65536",
        args.seq_len
    );
    anyhow::ensure!(
        (1..=crate::decode::beam::MAX_BEAM as usize).contains(&args.beam),
        "--beam {} must be in 1..={}",
        args.beam,
        crate::decode::beam::MAX_BEAM
    );
    Ok(())
}

pub fn run(args: BenchArgs) -> Result<()> {
    check_sizes(&args)?;
    let threads = rayon::current_num_threads();
    anyhow::ensure!(
        !args.json || args.generate.is_some() || args.bandwidth,
        "--json is for --generate and --bandwidth"
    );
    anyhow::ensure!(
        args.device.device.is_none() || args.generate.is_some(),
        "--device is for --generate (the other benchmarks run on the CPU)"
    );
    if args.bandwidth {
        return super::bench_bandwidth::bench_bandwidth(&args, threads);
    }
    if let Some(dir) = &args.translate {
        return bench_translate(&args, dir, threads);
    }
    if let Some(path) = &args.generate {
        return super::bench_generate::bench_generate(&args, path, threads);
    }
    anyhow::ensure!(
        args.batch > 0 && args.src_len > 1 && args.tgt_len > 1 && args.steps > 0,
        "--batch, --steps must be positive and --src-len, --tgt-len at least 2"
    );
    // Random tokens are drawn above the 4 special ids.
    anyhow::ensure!(
        args.vocab > 4,
        "--vocab {} must be at least 5 (4 special tokens + 1)",
        args.vocab
    );
    let config = ModelConfig::preset(&args.preset, args.vocab).with_context(|| {
        format!(
            "unknown preset {:?} (choose one of {:?})",
            args.preset,
            ModelConfig::PRESETS
        )
    })?;
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid model config: {e}"))?;
    anyhow::ensure!(
        args.src_len <= config.max_len && args.tgt_len <= config.max_len,
        "lengths must be at most max_len {}",
        config.max_len
    );
    let bf16 = match args.precision {
        PrecisionArg::F32 => None,
        PrecisionArg::Bf16 => Some(args.bf16_kernel),
        p => anyhow::bail!("training benchmarks run in f32 or bf16, not {p:?}"),
    };
    if args.lm {
        return bench_lm(&args, config, threads, bf16);
    }
    let mut rng = Rng::new(1);
    let mut model = Seq2Seq::<f32>::new(config.clone(), &mut rng);
    model.set_bf16_products(bf16);
    let mut adam = Adam::new(AdamConfig::default(), &model.params_mut());
    let schedule = Schedule::inverse_sqrt(config.d_model, 4000, 1.0);
    let random_ids = |rng: &mut Rng, n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| 4 + rng.below(args.vocab - 4) as u32)
            .collect()
    };
    let pairs: Vec<(Vec<u32>, Vec<u32>)> = (0..args.batch)
        .map(|_| {
            (
                random_ids(&mut rng, args.src_len - 1),
                random_ids(&mut rng, args.tgt_len - 1),
            )
        })
        .collect();
    let refs: Vec<(&[u32], &[u32])> = pairs.iter().map(|(s, t)| (&s[..], &t[..])).collect();
    // Split in halves for data parallelism when the pool has two threads, as training does.
    let mut parallel = DataParallel::for_pool(&model);
    let parts: Vec<Batch> = split(&refs, parallel.parts())
        .map(Batch::from_pairs)
        .collect();
    let tokens: usize = parts
        .iter()
        .map(|b| b.n_src_tokens() + b.n_tgt_tokens())
        .sum();
    let n_tgt: usize = parts.iter().map(Batch::n_tgt_tokens).sum();
    eprintln!(
        "bench: preset {} ({} parameters), {threads} threads, batch {} x ({} + {}) tokens, vocab {}, {} part(s) per batch, {} products",
        args.preset, model.n_params(), args.batch, args.src_len, args.tgt_len, args.vocab,
        parts.len(), bf16.map_or("f32".into(), |k| format!("bf16 ({k:?})"))
    );
    let med = time_steps(&args, |step| {
        parallel.sync_weights(&mut model);
        model.zero_grads();
        let scale = 1.0 / n_tgt as f64;
        let stats = parallel.forward_backward(&mut model, &parts, 0.1, scale, &mut rng);
        parallel.gather_grads(&mut model);
        adam.update(&mut model.params_mut(), schedule.lr(step as u64 + 1));
        stats.loss()
    });
    super::outln!("train: {:.0} tokens/s", tokens as f64 / med)?;
    super::outln!("step: {:.3} s median over {} steps", med, args.steps)?;
    Ok(())
}

/// Runs `--warmup-steps` untimed and `--steps` timed calls of `step` (which returns the loss),
/// logging each on stderr; returns the median seconds of the timed ones.
fn time_steps(args: &BenchArgs, mut step: impl FnMut(usize) -> f64) -> f64 {
    let mut times = Vec::new();
    for i in 0..args.warmup_steps + args.steps {
        let t0 = Instant::now();
        let loss = step(i);
        let dt = t0.elapsed().as_secs_f64();
        let warm_up = i < args.warmup_steps;
        let note = if warm_up { " (warm-up)" } else { "" };
        eprintln!("step {i}: {dt:.3} s, loss {loss:.3}{note}");
        if !warm_up {
            times.push(dt);
        }
    }
    median(times)
}

/// Decoder-only training steps on random tokens: tokens/s and the process's peak memory.
fn bench_lm(
    args: &BenchArgs,
    mut config: ModelConfig,
    threads: usize,
    bf16: Option<Bf16Kernel>,
) -> Result<()> {
    anyhow::ensure!(args.seq_len > 1, "--seq-len must be at least 2");
    let batch = (args.tokens / args.seq_len).max(1);
    config.max_len = config.max_len.max(args.seq_len);
    let mut rng = Rng::new(1);
    let mut model = LanguageModel::<f32>::new(config.clone(), &mut rng);
    model.set_bf16_products(bf16);
    let mut adam = Adam::new(AdamConfig::default(), &model.params_mut());
    let n = batch * args.seq_len;
    // tokens and targets [batch, seq_len]: the targets are the tokens shifted by one.
    let stream: Vec<u32> = (0..n + 1)
        .map(|_| 4 + rng.below(args.vocab - 4) as u32)
        .collect();
    let (tokens, targets) = (&stream[..n], &stream[1..]);
    eprintln!(
        "bench --lm: preset {} ({} parameters), {threads} threads, {batch} x {} tokens, vocab {}",
        args.preset,
        model.n_params(),
        args.seq_len,
        args.vocab
    );
    let med = time_steps(args, |_| {
        model.zero_grads();
        let scale = 1.0 / n as f64;
        let stats = model.forward_backward(tokens, targets, batch, 0.1, scale, Some(&mut rng));
        adam.update(&mut model.params_mut(), 1e-4);
        stats.loss()
    });
    super::outln!("train-lm: {:.0} tokens/s", n as f64 / med)?;
    super::outln!("step: {:.3} s median over {} steps", med, args.steps)?;
    match peak_rss_mib() {
        Some(mib) => super::outln!("peak resident memory: {mib:.0} MiB")?,
        None => super::outln!("peak resident memory: not reported by this system")?,
    }
    Ok(())
}

/// Greedy and beam-search translation of `--src` with a trained model: sentences/s and
/// target tokens/s (emitted tokens, EOS included) for each.
fn bench_translate(args: &BenchArgs, dir: &std::path::Path, threads: usize) -> Result<()> {
    use crate::decode::beam::{beam_search, BeamOptions};
    use crate::decode::greedy::{greedy_decode, GreedyOptions};
    let mut translator = crate::pipeline::translate::Translator::load(dir)?;
    translator.prepare_precision(args.precision.float_precision()?)?;
    // A multilingual model translates between its configured languages (tokenizer_config.json).
    let languages = translator.check_languages(translator.languages)?;
    let crate::pipeline::translate::Translator {
        model,
        vocab,
        beam_rules,
        min_len,
        ..
    } = translator;
    let src = args.src.as_ref().context("--translate needs --src FILE")?;
    let file =
        std::fs::File::open(src).with_context(|| format!("cannot open {}", src.display()))?;
    let lines = crate::text::corpus::read_lines(file, &src.display().to_string())?;
    let lines: Vec<String> = lines.into_iter().filter(|l| !l.trim().is_empty()).collect();
    anyhow::ensure!(!lines.is_empty(), "{}: no source lines", src.display());
    let sources =
        crate::pipeline::translate::encode_sources(&lines, &vocab, languages.source, &model)?;
    let batch = args.sentences_per_batch.max(1);
    eprintln!(
        "bench --translate: {} sentences, {threads} threads, {batch} sentences per batch",
        sources.len()
    );
    let report = |what: &str, secs: f64, tokens: usize| {
        super::outln!(
            "{what}: {:.1} sentences/s, {:.0} target tokens/s ({tokens} tokens in {secs:.2} s)",
            sources.len() as f64 / secs,
            tokens as f64 / secs
        )
    };
    let greedy = GreedyOptions {
        batch_size: batch,
        forced_first: languages.target,
        min_len,
        ..GreedyOptions::default()
    };
    let t0 = Instant::now();
    let hyps = greedy_decode(&model, &sources, &greedy);
    let tokens = hyps.iter().map(|h| h.n_emitted()).sum();
    report("greedy", t0.elapsed().as_secs_f64(), tokens)?;
    let beam = BeamOptions {
        beam_size: args.beam,
        batch_size: batch,
        stop: args.beam_stop,
        forced_first: languages.target,
        min_len,
        beam_rules,
        ..BeamOptions::default()
    };
    let t0 = Instant::now();
    let hyps = beam_search(&model, &sources, &beam);
    let tokens = hyps.iter().map(|h| h[0].n_emitted()).sum();
    report(
        &format!("beam {}", args.beam),
        t0.elapsed().as_secs_f64(),
        tokens,
    )?;
    Ok(())
}
