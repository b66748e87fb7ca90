//! `transformer score --model DIR < pairs.tsv`: for each `source<TAB>target` line, the
//! log-probability of the target given the source (sum over target tokens including EOS).

use super::args::ThreadsArgs;
use crate::pipeline::translate::Translator;
use crate::text::corpus::parse_pairs;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// What the command reads and writes, shown by `--help`.
const AFTER_HELP: &str = "\
Prints one number per input line, to 6 decimals: the natural-log probability of the target given
the source, summed over the target tokens and the closing </s>. Every line must be a pair: a
malformed line (no tab, more than one tab, an empty side, an empty line, invalid UTF-8) or a side
longer than the model's max_len - 1 tokens is an error naming the line, and nothing is printed.";

#[derive(Args, Debug)]
#[command(after_help = AFTER_HELP)]
pub struct ScoreArgs {
    /// Model directory written by `transformer train`, `demo --out` or `average`.
    #[arg(long)]
    pub model: PathBuf,
    /// Pairs scored together.
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    #[command(flatten)]
    pub languages: super::args::LanguageArgs,
    #[command(flatten)]
    pub pool: ThreadsArgs,
}

pub fn run(args: ScoreArgs) -> Result<()> {
    let mut translator = Translator::load(&args.model)?;
    args.languages.apply(&mut translator)?;
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .read_to_end(&mut bytes)
        .context("reading standard input")?;
    let (pairs, report) = parse_pairs(&bytes, Path::new("<stdin>"))?;
    if report.count > 0 {
        // One number per input line: a line we cannot parse has no score to print.
        bail!("<stdin>: {}", report.summary());
    }
    let scores = translator.score(&pairs, args.batch_size, "<stdin>")?;
    let mut out = std::io::stdout().lock();
    for s in scores {
        writeln!(out, "{s:.6}")?;
    }
    Ok(())
}
