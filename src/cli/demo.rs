//! `transformer demo`: the embedded default. Generates English number words -> German number
//! words ("three hundred twenty-one" -> "dreihunderteinundzwanzig": units before tens, so the
//! model must reorder), trains the `tiny` model with a progress bar, then reports exact-match
//! accuracy on held-out numbers and prints sample translations. No download needed.

use super::args::{check_out, clear_out, TrainThreadsArgs, OVERWRITE_HELP};
use super::training::{bar_message, log_line, training_bar};
use crate::data::numbers::{english, german_pieces, number_task};
use crate::decode::greedy::GreedyOptions;
use crate::model::ModelConfig;
use crate::model::Module;
use crate::store::CheckpointWriter;
use crate::text::vocab::{Vocab, VocabLevel};
use crate::train::pairs::{Example, TrainConfig};
use crate::train::run::{run as run_training, Output, Reporter, RunOptions};
use crate::train::trainer::{PairTrainer, StepReport};
use anyhow::Result;
use clap::Args;
use indicatif::ProgressBar;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Largest number in the task (at most 999999).
    #[arg(long, default_value_t = 999_999)]
    pub max_number: u32,
    /// Training pairs.
    #[arg(long, default_value_t = 20_000)]
    pub train_size: usize,
    /// Held-out pairs (numbers never seen in training).
    #[arg(long, default_value_t = 500)]
    pub held_out: usize,
    /// Training updates.
    #[arg(long, default_value_t = 3000)]
    pub steps: u64,
    /// Stop training early once this many seconds have passed (0: no limit), checked after
    /// each update.
    #[arg(long, default_value_t = 270)]
    pub time_limit: u64,
    /// Source + target tokens per batch.
    #[arg(long, default_value_t = 2000)]
    pub tokens_per_batch: usize,
    /// Warm-up steps.
    #[arg(long, default_value_t = 400)]
    pub warmup: u64,
    /// Learning-rate multiplier.
    #[arg(long, default_value_t = 1.0)]
    pub lr_factor: f64,
    /// Seed for data, initialisation, dropout and shuffling.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub pool: TrainThreadsArgs,
    /// Also save the trained model directory here (model, vocabulary, optimizer and trainer
    /// state: usable by translate, score, attention and average).
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[arg(long, help = OVERWRITE_HELP, requires = "out")]
    pub overwrite: bool,
    /// Dropout probability (the tiny preset's is 0.1).
    #[arg(long, default_value_t = 0.1)]
    pub dropout: f64,
    /// Pre-LN residual blocks instead of the paper's post-LN.
    #[arg(long)]
    pub pre_ln: bool,
    /// Sample translations to print: at most N, up to N/2 of them wrong ones (fewer when there
    /// are not enough right or wrong ones).
    #[arg(long, default_value_t = 8)]
    pub samples: usize,
}

/// The demo's progress: the bar, a log line every 100 updates, the time limit.
struct DemoReporter {
    bar: ProgressBar,
    time_limit: u64,
}

impl Reporter for DemoReporter {
    fn step(&mut self, r: &StepReport, tokens_per_s: f64, secs: f64) {
        self.bar.set_position(r.step);
        self.bar
            .set_message(bar_message(r.loss, r.lr, tokens_per_s));
        if r.step.is_multiple_of(100) {
            log_line(
                &self.bar,
                format!(
                    "step {:>5}  loss {:.3}  lr {:.2e}  {:.0} s",
                    r.step, r.loss, r.lr, secs
                ),
            );
        }
    }
    fn time_limit(&mut self, step: u64) {
        log_line(
            &self.bar,
            format!("time limit of {} s reached at step {step}", self.time_limit),
        );
    }
    fn finish(&mut self) {
        self.bar.finish();
    }
}

pub fn run(args: DemoArgs) -> Result<()> {
    if let Some(out) = &args.out {
        check_out(out, None, args.overwrite, false)?;
    }
    let threads = rayon::current_num_threads();
    let started = Instant::now();
    anyhow::ensure!(
        args.max_number <= crate::data::numbers::MAX_NUMBER,
        "--max-number {} is above the largest spelled number, {}",
        args.max_number,
        crate::data::numbers::MAX_NUMBER
    );
    let task = number_task(args.max_number, args.train_size, args.held_out, args.seed);
    anyhow::ensure!(
        !task.train.is_empty() && !task.held_out.is_empty(),
        "--max-number {} is too small for {} training and {} held-out pairs",
        args.max_number,
        args.train_size,
        args.held_out
    );
    // Source: English words. Target: German morphemes separated by spaces (one shared
    // vocabulary), joined back into one word before comparing.
    let tokenized = |n: &u32| (english(*n), german_pieces(*n).join(" "));
    let train_pairs: Vec<(String, String)> = task.train_numbers.iter().map(tokenized).collect();
    let texts = train_pairs
        .iter()
        .flat_map(|(s, t)| [s.as_str(), t.as_str()]);
    let vocab = Vocab::build(texts, VocabLevel::Word, 1);
    let train: Vec<Example> = train_pairs
        .iter()
        .map(|(s, t)| Example {
            src: vocab.encode(s),
            tgt: vocab.encode(t),
        })
        .collect();
    let mut model_config = ModelConfig::preset("tiny", vocab.len()).expect("tiny preset");
    model_config.dropout = args.dropout;
    if args.pre_ln {
        model_config.norm = crate::model::NormPlacement::PreLn;
    }
    let config = TrainConfig {
        tokens_per_batch: args.tokens_per_batch,
        warmup: args.warmup,
        lr_factor: args.lr_factor,
        seed: args.seed,
        ..TrainConfig::default()
    };
    let mut trainer = PairTrainer::new(model_config, config, train)?;
    eprintln!(
        "demo: English -> German number words up to {}, {} training / {} held-out pairs, \
         shared word/morpheme vocabulary of {}, tiny model ({} parameters), {threads} threads",
        args.max_number,
        task.train.len(),
        task.held_out.len(),
        vocab.len(),
        trainer.model.n_params()
    );
    if let Some(out) = &args.out {
        clear_out(out, None, args.overwrite)?;
    }
    let (s, t) = &train_pairs[0];
    eprintln!("example: {s:?} -> {t:?} -> {:?}", t.replace(' ', ""));
    let save_vocab = |w: &mut CheckpointWriter| vocab.write(w);
    // With --out: the model directory, written at the end (no metrics log, no checkpoints).
    let output = args.out.as_ref().map(|dir| Output {
        dir: dir.clone(),
        save_tokenizer: &save_vocab,
        log_every: None,
        save_every: 0,
        keep_last: 1,
        save_into_dir_every: 0,
        autosave: None,
    });
    let options = RunOptions {
        max_steps: args.steps,
        time_limit: (args.time_limit > 0).then_some(args.time_limit as f64),
        valid_every: 0,
    };
    let mut reporter = DemoReporter {
        bar: training_bar(args.steps),
        time_limit: args.time_limit,
    };
    let summary = run_training(&mut trainer, &options, output.as_ref(), None, &mut reporter)?;
    let train_secs = summary.seconds;

    let sources: Vec<String> = task.held_out_numbers.iter().map(|&n| english(n)).collect();
    let options = GreedyOptions {
        max_len_extra: 50,
        batch_size: 64,
        forced_first: None,
        min_len: 0,
        forced_end: false,
    };
    let hyps: Vec<String> = crate::pipeline::translate::translate_lines(
        &trainer.model,
        &vocab,
        None,
        &sources,
        &options,
    )?
    .into_iter()
    .map(|h| h.replace(' ', ""))
    .collect();
    let correct = hyps
        .iter()
        .zip(&task.held_out)
        .filter(|(h, (_, t))| *h == t)
        .count();
    let accuracy = 100.0 * correct as f64 / task.held_out.len() as f64;
    super::outln!("samples (held-out):")?;
    // Show some right and (if any) some wrong translations.
    let (right, wrong): (Vec<_>, Vec<_>) = hyps
        .iter()
        .zip(&task.held_out)
        .partition(|(h, (_, t))| *h == t);
    let n_wrong = wrong.len().min(args.samples / 2);
    let shown = right
        .into_iter()
        .take(args.samples - n_wrong)
        .chain(wrong.into_iter().take(n_wrong));
    for (h, (s, t)) in shown {
        let mark = if h == t { "ok " } else { "BAD" };
        super::outln!(
            "  {mark} {s:<60} -> {h}{}",
            if h == t {
                String::new()
            } else {
                format!("   (want {t})")
            }
        )?;
    }
    super::outln!(
        "exact match on {} held-out numbers: {correct}/{} = {accuracy:.1}% after {} steps \
         ({train_secs:.0} s training, {:.0} s in all)",
        task.held_out.len(),
        task.held_out.len(),
        trainer.state.step,
        started.elapsed().as_secs_f64()
    )?;
    if let Some(dir) = &args.out {
        super::outln!("model saved to {}", dir.display())?;
    }
    Ok(())
}
