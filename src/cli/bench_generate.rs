//! `transformer bench --generate MODEL`: prompt (prefill) and single-stream decode speed of a
//! language model (a `train-lm` directory, a Hugging Face directory or a llama GGUF file).
//!
//! One repetition: an empty KV cache of `prompt + new + 1` positions; the prompt fed in one
//! step and the argmax of the log-probabilities after its last token (the prefill, timed:
//! `prompt tokens / s`); then `--new-tokens` greedy steps of one token each, the end of the text
//! not being a stop (the decode, timed: `new tokens / s`). `--warmup-steps` untimed
//! repetitions, then the median of `--steps` timed ones; the peak resident memory (loading
//! included) at the end. `benches/compare/pretrained.sh` runs it side by side with transformers
//! and llama.cpp on the same prompt ids.

use super::bench::{median, peak_rss_mib, BenchArgs};
use crate::backend::Device;
use crate::decode::sample::argmax;
use crate::model::device_lm::{DeviceLm, StepOut, Want};
use crate::model::StepLayout;
use crate::pipeline::generate::TextGenerator;
use anyhow::{Context, Result};
use std::path::Path;
use std::time::Instant;

/// The prompt without `--prompt-ids`: this text repeated, tokenized, cut to `--prompt-tokens`.
const PROMPT_TEXT: &str = "The Transformer is a model architecture that eschews recurrence and \
instead relies entirely on an attention mechanism to draw global dependencies between input \
and output. It allows for significantly more parallelization and can reach a new state of the \
art in translation quality after being trained for as little as twelve hours on eight GPUs. ";

/// At most this many prompt or new tokens (the KV cache is allocated for both).
const MAX_TOKENS: usize = 1 << 16;

/// Reads a JSON list of token ids.
fn read_ids(path: &Path) -> Result<Vec<u32>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read --prompt-ids {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "--prompt-ids {}: expected a JSON list of token ids",
            path.display()
        )
    })
}

/// CPU seconds this process's threads have run (Linux: the sum of
/// `/proc/self/task/*/schedstat`'s first field, nanoseconds on a CPU; 0 elsewhere). On a machine
/// shared with other work, where wall time depends on how often the process gets a core, CPU
/// time per token is the steadier figure.
fn cpu_seconds() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let ns: u64 = tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 * 1e-9
}

/// One repetition's wall and CPU seconds.
struct Timing {
    prefill: f64,
    decode: f64,
    prefill_cpu: f64,
    decode_cpu: f64,
}

/// The prefill's and the decode's times, and the greedy ids (the first from the prefill).
fn generate_once(
    model: &crate::model::LanguageModel<f32>,
    prompt: &[u32],
    new_tokens: usize,
) -> (Timing, Vec<u32>) {
    let mut state = model.start(1, prompt.len() + new_tokens + 1);
    let (t0, c0) = (Instant::now(), cpu_seconds());
    let mut token = argmax(&model.step(&mut state, prompt, &StepLayout::last()));
    let (t1, c1) = (Instant::now(), cpu_seconds());
    let mut ids = vec![token];
    for _ in 0..new_tokens {
        token = argmax(&model.step(&mut state, &[token], &StepLayout::last()));
        ids.push(token);
    }
    let (t2, c2) = (Instant::now(), cpu_seconds());
    let secs = |a: Instant, b: Instant| (b - a).as_secs_f64();
    let timing = Timing {
        prefill: secs(t0, t1),
        decode: secs(t1, t2),
        prefill_cpu: c1 - c0,
        decode_cpu: c2 - c1,
    };
    (timing, ids)
}

/// [`generate_once`] on a device: the same steps, the arg-max taken there (4 bytes read back a
/// token).
fn generate_once_on<D: Device>(
    lm: &DeviceLm<D>,
    prompt: &[u32],
    new_tokens: usize,
) -> Result<(Timing, Vec<u32>)> {
    let mut state = lm.start(1, prompt.len() + new_tokens + 1)?;
    let next = |feed: &[u32], state: &mut _| -> Result<u32> {
        let rows = vec![0; feed.len()];
        match lm.step(state, feed, &rows, &[feed.len() - 1], Want::Argmax)? {
            StepOut::Ids(ids) => Ok(ids[0]),
            StepOut::Logits(_) => unreachable!("ids asked"),
        }
    };
    let (t0, c0) = (Instant::now(), cpu_seconds());
    let mut token = next(prompt, &mut state)?;
    let (t1, c1) = (Instant::now(), cpu_seconds());
    let mut ids = vec![token];
    for _ in 0..new_tokens {
        token = next(&[token], &mut state)?;
        ids.push(token);
    }
    let (t2, c2) = (Instant::now(), cpu_seconds());
    let secs = |a: Instant, b: Instant| (b - a).as_secs_f64();
    let timing = Timing {
        prefill: secs(t0, t1),
        decode: secs(t1, t2),
        prefill_cpu: c1 - c0,
        decode_cpu: c2 - c1,
    };
    Ok((timing, ids))
}

pub fn bench_generate(args: &BenchArgs, path: &Path, threads: usize) -> Result<()> {
    anyhow::ensure!(
        args.steps > 0 && args.new_tokens > 0 && args.new_tokens <= MAX_TOKENS,
        "--steps must be positive and --new-tokens in 1..={MAX_TOKENS}"
    );
    let device = args.device.choice()?;
    let precision = args.device.precision(
        device,
        path,
        args.precision.model_precision(),
        false,
        &args.cache,
    )?;
    let t0 = Instant::now();
    let TextGenerator {
        mut model,
        tokenizer,
        ..
    } = TextGenerator::load_prepared(path, precision)?;
    // Counted on a shapes-only twin: a mutable visit of the model itself would drop its
    // transposed and packed copies.
    let n_params = crate::model::param::count_params(&mut crate::model::LanguageModel::<f32>::new(
        model.config.clone(),
        &mut crate::model::param::ShapesOnly,
    ))
    .unwrap_or(0);
    model.prepare_inference();
    args.cache.apply(&mut model)?;
    let on_gpu = device
        .open_gpu()?
        .map(|gpu| DeviceLm::new(gpu, &model))
        .transpose()?;
    let weight_bytes = on_gpu.as_ref().map(|lm| lm.device.gpu.allocated_bytes());
    let load_secs = t0.elapsed().as_secs_f64();
    let prompt = match &args.prompt_ids {
        Some(file) => read_ids(file)?,
        None => {
            anyhow::ensure!(
                (1..=MAX_TOKENS).contains(&args.prompt_tokens),
                "--prompt-tokens must be in 1..={MAX_TOKENS}"
            );
            let text = PROMPT_TEXT.repeat(args.prompt_tokens / 40 + 1);
            let mut ids = tokenizer.document(&text)?;
            ids.truncate(args.prompt_tokens);
            ids
        }
    };
    anyhow::ensure!(!prompt.is_empty(), "the prompt has no tokens");
    model.embedding.check_ids(&prompt)?;
    let positions = prompt.len() + args.new_tokens + 1;
    anyhow::ensure!(
        positions <= model.max_len(),
        "{} prompt + {} new tokens do not fit the model's context of {}",
        prompt.len(),
        args.new_tokens,
        model.max_len()
    );
    eprintln!(
        "bench --generate: {} ({} parameters, loaded in {load_secs:.2} s), {threads} threads, \
         {} prompt tokens, {} new tokens",
        path.display(),
        n_params,
        prompt.len(),
        args.new_tokens
    );
    let (mut prefill, mut decode) = (Vec::new(), Vec::new());
    let (mut prefill_cpu, mut decode_cpu) = (Vec::new(), Vec::new());
    let mut ids = Vec::new();
    for i in 0..args.warmup_steps + args.steps {
        if let Some(lm) = &on_gpu {
            lm.device.gpu.counters().reset();
        }
        let (t, new) = match &on_gpu {
            Some(lm) => generate_once_on(lm, &prompt, args.new_tokens)?,
            None => generate_once(&model, &prompt, args.new_tokens),
        };
        let (p, d) = (
            prompt.len() as f64 / t.prefill,
            args.new_tokens as f64 / t.decode,
        );
        let warm_up = i < args.warmup_steps;
        let note = if warm_up { " (warm-up)" } else { "" };
        eprintln!("run {i}: prefill {p:.1} tokens/s, decode {d:.1} tokens/s{note}");
        if !warm_up {
            prefill.push(p);
            decode.push(d);
            prefill_cpu.push(t.prefill_cpu);
            decode_cpu.push(t.decode_cpu);
        }
        ids = new;
    }
    let peak = peak_rss_mib();
    if args.json {
        let mut json = serde_json::json!({
            "impl": "ours",
            "version": format!("transformer {}", env!("CARGO_PKG_VERSION")),
            "threads": threads,
            "prompt_tokens": prompt.len(),
            "new_tokens": args.new_tokens,
            "prefill_tps": prefill,
            "decode_tps": decode,
            "prefill_cpu_s": prefill_cpu,
            "decode_cpu_s": decode_cpu,
            "new_ids": ids,
            "peak_rss_mib": peak,
            "device": on_gpu.as_ref().map_or("cpu".to_string(), |lm| lm.device.name()),
            "kv_types": model.kv_types().to_string(),
            "kv_bytes_per_token": model.kv_bytes_per_position(),
            "load_s": load_secs,
        });
        if let (Some(lm), Some(weights)) = (&on_gpu, weight_bytes) {
            // The last repetition's counters: 1 + new_tokens steps.
            let c = lm.device.gpu.counters().get();
            let steps = (args.new_tokens + 1) as u64;
            json["gpu"] = serde_json::json!({
                "adapter": lm.device.gpu.label(),
                "weight_bytes": weights,
                "file_bytes": std::fs::metadata(path).map(|m| m.len()).ok().filter(|_| path.is_file()),
                "kv_bytes_per_token": lm.kv_bytes_per_position(),
                "steps": steps,
                "submissions_per_step": c.submissions as f64 / steps as f64,
                "dispatches_per_step": c.dispatches as f64 / steps as f64,
                "dispatches_per_layer": lm.dispatches_per_layer(),
                "bytes_up_per_step": c.bytes_up as f64 / steps as f64,
                "bytes_down_per_step": c.bytes_down as f64 / steps as f64,
            });
        }
        super::outln!("{json}")?;
        return Ok(());
    }
    let n = args.steps;
    super::outln!("prefill: {:.1} tokens/s (median of {n})", median(prefill))?;
    super::outln!("decode: {:.1} tokens/s (median of {n})", median(decode))?;
    super::outln!("new ids: {ids:?}")?;
    match peak {
        Some(mib) => super::outln!("peak resident memory: {mib:.0} MiB")?,
        None => super::outln!("peak resident memory: not reported by this system")?,
    }
    Ok(())
}
