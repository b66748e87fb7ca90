//! `transformer average --out DIR CKPT...`: averages the parameters of checkpoints of one model
//! (the paper averages the last 5 for base models) into a model directory.

use crate::model::checkpoint::{load_config_of, save};
use crate::model::{LanguageModel, Seq2Seq};
use crate::store::{TOKENIZER_FILE, VOCAB_FILE};
use crate::text::bpe::Bpe;
use crate::text::vocab::Vocab;
use crate::train::average::average_checkpoints;
use anyhow::Result;

use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct AverageArgs {
    /// Where the averaged model directory is written: config.json, model.safetensors and the
    /// vocabulary of the first checkpoint (a translation model's vocab.json, with tokenizer.json
    /// for BPE; a language model's tokenizer.json), or of the run directory two levels above it
    /// (OUT for OUT/checkpoints/step-*); without either, no vocabulary is written. No optimizer
    /// or trainer state: the result cannot be resumed.
    #[arg(long)]
    pub out: PathBuf,
    /// Checkpoint directories of one model (a translation model, or a language model of
    /// train-lm), identical config.json (e.g. OUT/checkpoints/step-*).
    #[arg(required = true)]
    pub checkpoints: Vec<PathBuf>,
}

pub fn run(args: AverageArgs) -> Result<()> {
    let first = &args.checkpoints[0];
    // The vocabulary travels with the model: the first checkpoint's, or its run directory's.
    let find = |name: &str| {
        [first.join(name), first.join("../..").join(name)]
            .into_iter()
            .find(|p| p.is_file())
    };
    // A decoder-only config (no encoder layers) is a language model.
    let lm = load_config_of::<LanguageModel<f32>>(first).is_ok();
    if lm {
        let mut model: LanguageModel<f32> = average_checkpoints(&args.checkpoints)?;
        save(&args.out, &mut model)?;
        if let Some(path) = find(TOKENIZER_FILE) {
            Bpe::load(&path)?.save(&args.out.join(TOKENIZER_FILE))?;
        }
    } else {
        let mut model: Seq2Seq<f32> = average_checkpoints(&args.checkpoints)?;
        save(&args.out, &mut model)?;
        if let Some(path) = find(VOCAB_FILE) {
            // Load and save rather than copy: a BPE vocabulary brings its tokenizer.json along.
            Vocab::load(&path)?.save(&args.out.join(VOCAB_FILE))?;
        }
    }
    eprintln!(
        "averaged {} checkpoints of a {} into {}",
        args.checkpoints.len(),
        if lm {
            "language model"
        } else {
            "translation model"
        },
        args.out.display()
    );
    Ok(())
}
