//! `transformer bench`: times training steps (forward, backward, Adam) on random tokens and
//! prints `train: X tokens/s` (source + target tokens per second, median over timed steps).

use super::set_threads;
use crate::batch::Batch;
use crate::model::{ModelConfig, Seq2Seq};
use crate::rng::Rng;
use crate::train::adam::{Adam, AdamConfig};
use crate::train::schedule::NoamSchedule;
use anyhow::{Context, Result};
use clap::Args;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Model size: tiny, base or big.
    #[arg(long, default_value = "base")]
    pub preset: String,
    /// Worker threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Sentence pairs per batch.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Source tokens per sentence (EOS included).
    #[arg(long, default_value_t = 32)]
    pub src_len: usize,
    /// Target tokens per sentence (EOS included).
    #[arg(long, default_value_t = 32)]
    pub tgt_len: usize,
    /// Vocabulary size.
    #[arg(long, default_value_t = 8000)]
    pub vocab: usize,
    /// Untimed warm-up steps.
    #[arg(long, default_value_t = 2)]
    pub warmup_steps: usize,
    /// Timed steps.
    #[arg(long, default_value_t = 5)]
    pub steps: usize,
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

pub fn run(args: BenchArgs) -> Result<()> {
    let threads = set_threads(args.threads)?;
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
    let mut rng = Rng::new(1);
    let mut model = Seq2Seq::<f32>::new(config.clone(), &mut rng);
    let mut adam = Adam::new(AdamConfig::default(), &model.params_mut());
    let schedule = NoamSchedule {
        d_model: config.d_model,
        warmup: 4000,
        factor: 1.0,
    };
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
    let batch = Batch::from_pairs(&refs);
    let tokens = batch.n_src_tokens() + batch.n_tgt_tokens();
    eprintln!(
        "bench: preset {} ({} parameters), {threads} threads, batch {} x ({} + {}) tokens, vocab {}",
        args.preset, model.n_params(), args.batch, args.src_len, args.tgt_len, args.vocab
    );
    let mut times = Vec::new();
    for step in 0..args.warmup_steps + args.steps {
        let t0 = Instant::now();
        model.zero_grads();
        let stats = model.forward_backward(
            &batch,
            0.1,
            1.0 / batch.n_tgt_tokens() as f64,
            Some(&mut rng),
        );
        adam.update(&mut model.params_mut(), schedule.lr(step as u64 + 1));
        let dt = t0.elapsed().as_secs_f64();
        eprintln!(
            "step {step}: {dt:.3} s, loss {:.3}{}",
            stats.loss(),
            if step < args.warmup_steps {
                " (warm-up)"
            } else {
                ""
            }
        );
        if step >= args.warmup_steps {
            times.push(dt);
        }
    }
    let med = median(times);
    println!("train: {:.0} tokens/s", tokens as f64 / med);
    println!("step: {:.3} s median over {} steps", med, args.steps);
    Ok(())
}
