//! `transformer attention --model DIR --src "..." [--tgt "..."] --out FILE.png|.svg`: heat maps
//! of the attention weights of every layer and head for one sentence pair.

use super::args::ThreadsArgs;
use crate::pipeline::translate::Translator;
use crate::viz::draw_attention_grid_with_columns;
use anyhow::{bail, Result};
use clap::Args;
use std::path::{Path, PathBuf};

/// What the command writes, shown by `--help`.
const AFTER_HELP: &str = "\
Writes three pictures, named after --out with a suffix before the extension:
  FILE-encoder.EXT  encoder self-attention (source x source)
  FILE-decoder.EXT  decoder self-attention (target x target, causal: future keys are 0)
  FILE-cross.EXT    encoder-decoder attention (target rows x source columns)
Each is a grid with one row per layer and one column per head. Query tokens run down the left
side, key tokens along the top; the source ends with </s>, the decoder input starts with <s>,
a space is shown as \u{2423}. Without --tgt the target is the model's greedy translation of --src.";

#[derive(Args, Debug)]
#[command(after_help = AFTER_HELP)]
pub struct AttentionArgs {
    /// Model directory written by `transformer train`, `demo --out` or `average`.
    #[arg(long)]
    pub model: PathBuf,
    /// The source sentence.
    #[arg(long)]
    pub src: String,
    /// The target sentence (default: the greedy translation of --src).
    #[arg(long)]
    pub tgt: Option<String>,
    /// Output picture, .png or .svg; the files written are FILE-encoder, FILE-decoder and
    /// FILE-cross with the same extension.
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub languages: super::args::LanguageArgs,
    #[command(flatten)]
    pub pool: ThreadsArgs,
}

/// `FILE.ext` -> `FILE-suffix.ext`.
pub fn with_suffix(out: &Path, suffix: &str) -> PathBuf {
    let stem = out
        .file_stem()
        .map(|s| s.to_string_lossy())
        .unwrap_or_default();
    let name = match out.extension() {
        Some(ext) => format!("{stem}-{suffix}.{}", ext.to_string_lossy()),
        None => format!("{stem}-{suffix}"),
    };
    out.with_file_name(name)
}

pub fn run(args: AttentionArgs) -> Result<()> {
    // Refuse a bad file name before any work.
    crate::viz::PictureFormat::from_path(&args.out)?;
    if let Some(parent) = args.out.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.is_dir() {
            bail!(
                "cannot write {}: directory {} does not exist",
                args.out.display(),
                parent.display()
            );
        }
    }
    let mut translator = Translator::load(&args.model)?;
    args.languages.apply(&mut translator)?;
    let (maps, greedy) = translator.attention_maps(&args.src, args.tgt.as_deref())?;
    if let Some(target) = greedy {
        eprintln!("target (greedy): {target}");
    }
    let heads = maps.heads;
    let kinds = [
        ("encoder", "Encoder self-attention", &maps.encoder),
        ("decoder", "Decoder self-attention (causal)", &maps.decoder),
        ("cross", "Encoder-decoder attention", &maps.cross),
    ];
    for (suffix, title, panels) in kinds {
        let path = with_suffix(&args.out, suffix);
        draw_attention_grid_with_columns(&path, title, panels, heads)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
