//! `transformer translate --model DIR [--beam K] [--alpha A] [--nbest N] < src.txt > hyp.txt`:
//! greedy decoding by default, beam search with `--beam K` (K > 1), batched, with the KV cache.
//! Empty input lines give empty output lines, so line counts always match; with `--nbest N` each
//! input gives N lines `i<TAB>score<TAB>text`.

use super::args::{PrecisionArgs, ThreadsArgs};
use super::read_stdin_lines;
use crate::decode::beam::{BeamOptions, BeamStop, MAX_BEAM};
use crate::model::device_seq2seq::DeviceSeq2Seq;
use crate::pipeline::device::DeviceChoice;
use crate::pipeline::translate::translate_nbest_on_device;
use crate::pipeline::translate::Translator;
use anyhow::{bail, Result};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;

/// What the command reads and writes, shown by `--help`.
const AFTER_HELP: &str = "\
Reads all of stdin, then writes one line per input line: an empty or blank input line gives an
empty output line (with --nbest, N lines `i<TAB>0<TAB>`). An input line longer than the model's
max_len - 1 tokens is an error naming it, and nothing is written.";

#[derive(Args, Debug)]
#[command(after_help = AFTER_HELP)]
pub struct TranslateArgs {
    /// Model directory written by `transformer train` (its OUT or a step checkpoint), `demo
    /// --out` or `average`.
    #[arg(long)]
    pub model: PathBuf,
    /// Sentences decoded together.
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    /// Output length limit: source tokens + this, the closing EOS counted, at most the model's
    /// max_len.
    #[arg(long, default_value_t = 50)]
    pub max_extra: usize,
    /// Beam size K; greedy search when absent or 1.
    ///
    /// Beam search ranks hypotheses by log p(Y|X) / lp(Y), lp(Y) = ((5 + |Y|) / 6)^alpha, |Y|
    /// counting the emitted tokens with the closing EOS (the paper: --beam 4 --alpha 0.6).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=MAX_BEAM as i64))]
    pub beam: Option<u32>,
    /// Length-penalty exponent: hypotheses are ranked by log p / ((5 + |Y|) / 6)^alpha (beam
    /// search, and the scores of --nbest; plain greedy output ignores it).
    #[arg(long, default_value_t = 0.6)]
    pub alpha: f64,
    /// When beam search stops a sentence before its length limit: exact (once no live beam can
    /// beat the k finished hypotheses), first-k (once k are finished, like CTranslate2) or
    /// hugging-face (transformers' `generate`: ranked by log p / |Y|^alpha, its stopping
    /// heuristic; with --alpha 1 its default length_penalty). Ignored without --beam 2 or more.
    #[arg(long, value_enum, default_value = "exact")]
    pub beam_stop: BeamStop,
    /// Print the N best hypotheses per input as `i<TAB>score<TAB>text` lines (N <= --beam).
    ///
    /// Best first; i is the 0-based input line and score the length-normalised log-probability
    /// of --beam (with greedy search, its one hypothesis scored the same way). An empty input
    /// line gives N lines `i<TAB>0<TAB>`. Fewer than N lines only when the search space holds
    /// fewer hypotheses (tiny vocabularies and length limits).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=MAX_BEAM as i64))]
    pub nbest: Option<u32>,
    #[command(flatten)]
    pub languages: super::args::LanguageArgs,
    #[command(flatten)]
    pub weights: PrecisionArgs,
    #[command(flatten)]
    pub pool: ThreadsArgs,
    #[command(flatten)]
    pub device: super::args::DeviceArgs,
}

pub fn run(args: TranslateArgs) -> Result<()> {
    let beam_size = args.beam.unwrap_or(1) as usize;
    if let Some(n) = args.nbest {
        if n as usize > beam_size {
            bail!("--nbest {n} needs --beam {n} or more (got {beam_size})");
        }
    }
    if !args.alpha.is_finite() {
        bail!("--alpha must be a finite number (got {})", args.alpha);
    }
    let device = args.device.choice()?;
    let precision = args.weights.precision.float_precision()?;
    if device != DeviceChoice::Cpu && precision != crate::Precision::F32 {
        bail!("--device gpu multiplies f32 weights, not --precision bf16 or int8");
    }
    let mut translator = Translator::load(&args.model)?;
    if let Some(note) = &translator.generation_note {
        eprintln!("note: {note}");
    }
    args.languages.apply(&mut translator)?;
    // On a device the model is uploaded from its float32 values, which the CPU's one-form
    // preparation would release.
    match device {
        DeviceChoice::Cpu => translator.prepare_precision(precision)?,
        _ => translator.prepare_inference(),
    }
    let on_gpu = (device.open_gpu()?)
        .map(|gpu| DeviceSeq2Seq::new(gpu, &translator.model))
        .transpose()?;
    let lines = read_stdin_lines()?;
    // One search for every case: the library decodes greedily for a beam of 1 (the best, and
    // only, hypothesis scored the same way) and by beam search above.
    let nbest = args.nbest.map_or(1, |n| n as usize);
    let options = BeamOptions {
        beam_size,
        alpha: args.alpha,
        max_len_extra: args.max_extra,
        batch_size: args.batch_size.max(1),
        nbest,
        stop: args.beam_stop,
        // The translator forces a multilingual model's target language itself.
        forced_first: None,
        // The defaults of the runtime the model came from (CTranslate2's for its directories),
        // also on a device.
        min_len: translator.min_len,
        // A Hugging Face model's forced_eos_token_id (also on a device).
        forced_end: translator.forced_end,
        beam_rules: translator.beam_rules,
    };
    let lists = match &on_gpu {
        None => translator.translate_nbest(&lines, &options)?,
        Some(lm) => {
            translate_nbest_on_device(lm, &translator.model, &translator.vocab, &lines, &options)?
        }
    };
    let mut stdout = std::io::stdout().lock();
    for (i, list) in lists.iter().enumerate() {
        if args.nbest.is_none() {
            writeln!(stdout, "{}", list.first().map_or("", |(_, t)| t.as_str()))?;
        } else if list.is_empty() {
            for _ in 0..nbest {
                writeln!(stdout, "{i}\t0\t")?;
            }
        } else {
            for (score, text) in list {
                writeln!(stdout, "{i}\t{score:.6}\t{text}")?;
            }
        }
    }
    Ok(())
}
