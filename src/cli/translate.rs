//! `transformer translate --model DIR [--beam K] [--alpha A] [--nbest N] < src.txt > hyp.txt`:
//! greedy decoding by default, beam search with `--beam K` (K > 1), batched, with the KV cache.
//! Empty input lines give empty output lines, so line counts always match; with `--nbest N` each
//! input gives N lines `i<TAB>score<TAB>text`.

use super::{load_model_dir, read_stdin_lines, set_threads};
use crate::decode::beam::{beam_search, length_penalty, BeamOptions, BeamStop};
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
    /// Beam size K; greedy search when absent or 1.
    ///
    /// Beam search ranks hypotheses by log p(Y|X) / lp(Y), lp(Y) = ((5 + |Y|) / 6)^alpha, |Y|
    /// counting the emitted tokens with the closing EOS (the paper: --beam 4 --alpha 0.6).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub beam: Option<u32>,
    /// Length-penalty exponent: hypotheses are ranked by log p / ((5 + |Y|) / 6)^alpha.
    #[arg(long, default_value_t = 0.6)]
    pub alpha: f64,
    /// When beam search stops a sentence before its length limit: exact (once no live beam can
    /// beat the k finished hypotheses) or first-k (once k are finished, like CTranslate2).
    #[arg(long, value_enum, default_value = "exact")]
    pub beam_stop: BeamStop,
    /// Print the N best hypotheses per input as `i<TAB>score<TAB>text` lines (N <= --beam).
    ///
    /// Best first; i is the 0-based input line and score the length-normalised log-probability
    /// of --beam (with greedy search, its one hypothesis scored the same way). An empty input
    /// line gives N lines `i<TAB>0<TAB>`. Fewer than N lines only when the search space holds
    /// fewer hypotheses (tiny vocabularies and length limits).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub nbest: Option<u32>,
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

/// The n-best translations `(score, text)` of `lines`, best first: beam search when
/// `options.beam_size > 1`, else greedy search (its one hypothesis scored the same way,
/// `log p / lp`). Empty lines get no hypotheses.
pub fn translate_nbest(
    model: &Seq2Seq<f32>,
    vocab: &Vocab,
    lines: &[String],
    options: &BeamOptions,
) -> Result<Vec<Vec<(f64, String)>>> {
    let sources = encode_sources(lines, vocab, model)?;
    let non_empty: Vec<usize> = (0..lines.len())
        .filter(|&i| !lines[i].trim().is_empty())
        .collect();
    let to_decode: Vec<Vec<u32>> = non_empty.iter().map(|&i| sources[i].clone()).collect();
    let lists: Vec<Vec<(f64, Vec<u32>)>> = if options.beam_size > 1 {
        beam_search(model, &to_decode, options)
            .into_iter()
            .map(|l| l.into_iter().map(|h| (h.score, h.tokens)).collect())
            .collect()
    } else {
        let greedy = GreedyOptions {
            max_len_extra: options.max_len_extra,
            batch_size: options.batch_size,
        };
        greedy_decode(model, &to_decode, &greedy)
            .into_iter()
            .map(|h| {
                let score = h.score / length_penalty(h.n_emitted(), options.alpha);
                vec![(score, h.tokens)]
            })
            .collect()
    };
    let mut out = vec![Vec::new(); lines.len()];
    for (&i, list) in non_empty.iter().zip(lists) {
        out[i] = list
            .into_iter()
            .map(|(score, tokens)| (score, vocab.decode(&tokens)))
            .collect();
    }
    Ok(out)
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
    set_threads(args.threads)?;
    let (mut model, vocab) = load_model_dir(&args.model)?;
    model.prepare_inference();
    let lines = read_stdin_lines()?;
    let mut stdout = std::io::stdout().lock();
    if beam_size <= 1 && args.nbest.is_none() {
        let options = GreedyOptions {
            max_len_extra: args.max_extra,
            batch_size: args.batch_size.max(1),
        };
        for line in translate_lines(&model, &vocab, &lines, &options)? {
            writeln!(stdout, "{line}")?;
        }
        return Ok(());
    }
    let nbest = args.nbest.map_or(1, |n| n as usize);
    let options = BeamOptions {
        beam_size,
        alpha: args.alpha,
        max_len_extra: args.max_extra,
        batch_size: args.batch_size.max(1),
        nbest,
        stop: args.beam_stop,
    };
    let lists = translate_nbest(&model, &vocab, &lines, &options)?;
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
