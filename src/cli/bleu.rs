//! `transformer bleu --ref REF.txt [HYP.txt]`: corpus BLEU of hypotheses (a file, or stdin when
//! omitted) against one reference per line, equal to sacreBLEU 2.x with its defaults, printed
//! as sacreBLEU prints it.

use super::read_stdin_lines;
use crate::eval::corpus_bleu;
use crate::text::corpus::read_lines;
use anyhow::{Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct BleuArgs {
    /// Reference translations, one line per hypothesis.
    #[arg(long = "ref", value_name = "REF.txt")]
    pub reference: PathBuf,
    /// Hypotheses, one per line (standard input when omitted).
    #[arg(value_name = "HYP.txt")]
    pub hypotheses: Option<PathBuf>,
}

/// The lines of a text file; errors name the file (and the lines that are not UTF-8).
fn read_file_lines(path: &Path) -> Result<Vec<String>> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(read_lines(file, &path.display().to_string())?)
}

/// `1 line`, `2 lines`.
fn count_lines(n: usize) -> String {
    format!("{n} line{}", if n == 1 { "" } else { "s" })
}

pub fn run(args: BleuArgs) -> Result<()> {
    let refs = read_file_lines(&args.reference)?;
    let (hyps, hyp_name) = match &args.hypotheses {
        Some(path) => (read_file_lines(path)?, path.display().to_string()),
        None => (read_stdin_lines()?, "<stdin>".to_string()),
    };
    let score = corpus_bleu(&hyps, &refs).map_err(|_| {
        anyhow::anyhow!(
            "{hyp_name} has {} but {} has {}: hypotheses and references must pair up line by line",
            count_lines(hyps.len()),
            args.reference.display(),
            count_lines(refs.len())
        )
    })?;
    super::outln!("{score}")?;
    Ok(())
}
