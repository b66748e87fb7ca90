//! `transformer average --out DIR CKPT...`: averages the parameters of checkpoints of one model
//! (the paper averages the last 5 for base models) into a model directory.

use crate::model::checkpoint::save_model;
use crate::store::VOCAB_FILE;
use crate::train::average::average_checkpoints;
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct AverageArgs {
    /// Where the averaged model directory is written: config.json, model.safetensors and the
    /// vocabulary (vocab.json, with tokenizer.json for BPE) of the first checkpoint, or of the
    /// run directory two levels above it (OUT for OUT/checkpoints/step-*); without either, no
    /// vocabulary is written. No optimizer or trainer state: the result cannot be resumed.
    #[arg(long)]
    pub out: PathBuf,
    /// Checkpoint directories of one translation model, identical config.json (e.g.
    /// OUT/checkpoints/step-*).
    #[arg(required = true)]
    pub checkpoints: Vec<PathBuf>,
}

pub fn run(args: AverageArgs) -> Result<()> {
    let mut model = average_checkpoints(&args.checkpoints)?;
    save_model(&args.out, &mut model)?;
    // The vocabulary travels with the model: take the first checkpoint's (or its parent's).
    let first = &args.checkpoints[0];
    let vocab = [first.join(VOCAB_FILE), first.join("../..").join(VOCAB_FILE)]
        .into_iter()
        .find(|p| p.is_file());
    if let Some(vocab) = vocab {
        // Load and save rather than copy: a BPE vocabulary brings its tokenizer.json along.
        crate::text::vocab::Vocab::load(&vocab)?.save(&args.out.join(VOCAB_FILE))?;
    }
    eprintln!(
        "averaged {} checkpoints into {}",
        args.checkpoints.len(),
        args.out.display()
    );
    Ok(())
}
