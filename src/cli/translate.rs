//! `transformer translate --model DIR < src.txt > hyp.txt`: greedy decoding, batched, with the
//! KV cache. Empty input lines give empty output lines, so line counts always match.

use super::{load_model_dir, read_stdin_lines, set_threads};
use crate::decode::greedy::{greedy_decode, GreedyOptions};
use crate::model::Seq2Seq;
use crate::text::vocab::Vocab;
use anyhow::{bail, Result};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct TranslateArgs {
    /// Model directory written by `transformer train` (or `demo --out`).
    #[arg(long)]
    pub model: PathBuf,
    /// Sentences decoded together.
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    /// Output length limit: source length + this.
    #[arg(long, default_value_t = 50)]
    pub max_extra: usize,
    /// Worker threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

/// Encodes source lines, refusing any that do not fit the model (1-based line numbers).
pub fn encode_sources(
    lines: &[String],
    vocab: &Vocab,
    model: &Seq2Seq<f32>,
) -> Result<Vec<Vec<u32>>> {
    let limit = model.config.max_len - 1;
    let mut too_long = Vec::new();
    let sources: Vec<Vec<u32>> = lines
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let ids = vocab.encode(l);
            if ids.len() > limit {
                too_long.push(format!("line {} ({} tokens)", i + 1, ids.len()));
            }
            ids
        })
        .collect();
    if !too_long.is_empty() {
        bail!(
            "{} input {} longer than the model's limit of {limit} tokens: {}",
            too_long.len(),
            if too_long.len() == 1 {
                "line is"
            } else {
                "lines are"
            },
            too_long
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(sources)
}

/// Translates `lines` (empty lines stay empty).
pub fn translate_lines(
    model: &Seq2Seq<f32>,
    vocab: &Vocab,
    lines: &[String],
    options: &GreedyOptions,
) -> Result<Vec<String>> {
    let sources = encode_sources(lines, vocab, model)?;
    let non_empty: Vec<usize> = (0..lines.len())
        .filter(|&i| !lines[i].trim().is_empty())
        .collect();
    let to_decode: Vec<Vec<u32>> = non_empty.iter().map(|&i| sources[i].clone()).collect();
    let hyps = greedy_decode(model, &to_decode, options);
    let mut out = vec![String::new(); lines.len()];
    for (&i, h) in non_empty.iter().zip(hyps) {
        out[i] = vocab.decode(&h.tokens);
    }
    Ok(out)
}

pub fn run(args: TranslateArgs) -> Result<()> {
    set_threads(args.threads)?;
    let (model, vocab) = load_model_dir(&args.model)?;
    let lines = read_stdin_lines()?;
    let options = GreedyOptions {
        max_len_extra: args.max_extra,
        batch_size: args.batch_size.max(1),
    };
    let out = translate_lines(&model, &vocab, &lines, &options)?;
    let mut stdout = std::io::stdout().lock();
    for line in out {
        writeln!(stdout, "{line}")?;
    }
    Ok(())
}
