//! `transformer heads --model M --data FILE`: every head's importance (Michel et al. 2019,
//! `E|∂L/∂ξ_h|` normalised per layer) and what it does (attention distance, entropy, weight on
//! the previous / same / first token), as a table or JSON, and a heat map of the scores.

use super::args::ThreadsArgs;
use crate::heads::report::{rows, text_table, HeadRow};
use crate::heads::run::{measure, DataSize, HeadsModel};
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use std::path::PathBuf;

/// How the table is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

#[derive(Args, Debug)]
pub struct HeadsArgs {
    /// A model directory of train or train-lm, a Hugging Face decoder directory or a GGUF file.
    #[arg(long)]
    pub model: PathBuf,
    /// The data: UTF-8 text (a language model) or lines of a source, a tab and a target
    /// (translation).
    #[arg(long)]
    pub data: PathBuf,
    /// Batches read from the data (each one term of the expectation).
    #[arg(long, default_value_t = 8)]
    pub batches: usize,
    /// Windows (language model) or sentence pairs per batch.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Tokens per language-model window (at most the model's context).
    #[arg(long, default_value_t = 128)]
    pub context: usize,
    /// text: an aligned table; json: one array of head objects.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// A heat map of the normalised scores (.png or .svg): one panel per attention site,
    /// layers down, heads across.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    #[command(flatten)]
    pub pool: ThreadsArgs,
}

pub fn run(args: HeadsArgs) -> Result<()> {
    if let Some(plot) = &args.plot {
        crate::viz::PictureFormat::from_path(plot)?;
    }
    let mut model = HeadsModel::load(&args.model)?;
    let size = DataSize {
        batches: args.batches,
        batch: args.batch,
        context: args.context,
    };
    let (importance, behaviour) = measure(&mut model, &args.data, size)?;
    let table = rows(&importance, &behaviour);
    match args.format {
        Format::Text => {
            eprintln!(
                "importance: E|dL/dξ_h| over {} batches, normalised per layer by the l2 norm of \
                 its heads' scores",
                importance.batches
            );
            super::outln!("{}", text_table(&table).trim_end())?;
        }
        Format::Json => super::outln!("{}", serde_json::to_string_pretty(&table)?)?,
    }
    if let Some(plot) = &args.plot {
        draw(plot, &table)?;
        eprintln!("wrote {}", plot.display());
    }
    Ok(())
}

/// One panel per site: layers × heads, each cell the normalised importance (0 where a pruned
/// layer has fewer heads).
fn draw(out: &std::path::Path, table: &[HeadRow]) -> Result<()> {
    use crate::viz::attention_map::AttentionPanel;
    let mut panels = Vec::new();
    for site in ["encoder", "decoder", "cross"] {
        let site_rows: Vec<&HeadRow> = table.iter().filter(|r| r.site == site).collect();
        let Some(layers) = site_rows.iter().map(|r| r.layer + 1).max() else {
            continue;
        };
        let heads = site_rows.iter().map(|r| r.head + 1).max().unwrap_or(1);
        let mut weights = vec![vec![0f32; heads]; layers];
        for r in &site_rows {
            weights[r.layer][r.head] = r.importance as f32;
        }
        panels.push(AttentionPanel {
            label: format!("{site}: importance (layers down, heads across)"),
            rows: (0..layers).map(|l| format!("L{l}")).collect(),
            cols: (0..heads).map(|h| format!("H{h}")).collect(),
            weights,
        });
    }
    if panels.is_empty() {
        bail!("no heads to draw");
    }
    let title = "Head importance";
    crate::viz::draw_attention_grid_with_columns(out, title, &panels, panels.len())?;
    Ok(())
}
