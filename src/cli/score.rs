//! `transformer score --model DIR < pairs.tsv`: for each `source<TAB>target` line, the
//! log-probability of the target given the source (sum over target tokens including EOS).

use super::set_threads;
use crate::pipeline::translate::Translator;
use crate::text::corpus::parse_pairs;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct ScoreArgs {
    /// Model directory written by `transformer train`.
    #[arg(long)]
    pub model: PathBuf,
    /// Pairs scored together.
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    /// Worker threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

pub fn run(args: ScoreArgs) -> Result<()> {
    set_threads(args.threads)?;
    let translator = Translator::load(&args.model)?;
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
