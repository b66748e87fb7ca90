//! `transformer average --out DIR CKPT...`: averages the parameters of checkpoints of one model
//! (the paper averages the last 5 for base models) into a model directory.

use crate::model::checkpoint::{load_config_of, write_model};
use crate::model::{LanguageModel, Model, Seq2Seq};
use crate::store::{same_or_inside, CheckpointWriter, TOKENIZER_FILE, VOCAB_FILE};
use crate::text::bpe::Bpe;
use crate::text::languages::LanguagePair;
use crate::text::vocab::Vocab;
use crate::train::average::average_checkpoints;
use anyhow::{bail, Result};

use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct AverageArgs {
    /// Where the averaged model directory is written: config.json, model.safetensors and the
    /// vocabulary of the checkpoints (a translation model's vocab.json, with tokenizer.json for
    /// BPE; a language model's tokenizer.json), each read from the checkpoint or from the run
    /// directory two levels above it (OUT for OUT/checkpoints/step-*); every checkpoint's must
    /// be the same. No optimizer or trainer state: the result cannot be resumed. It cannot be
    /// one of the checkpoints or hold one of them.
    #[arg(long)]
    pub out: PathBuf,
    /// Checkpoint directories of one model (a translation model, or a language model of
    /// train-lm), identical config.json and vocabulary (e.g. OUT/checkpoints/step-*).
    #[arg(required = true)]
    pub checkpoints: Vec<PathBuf>,
    #[arg(long, help = super::args::OVERWRITE_HELP)]
    pub overwrite: bool,
}

/// The file `name` of checkpoint `dir`: its own, or its run directory's (two levels above).
fn find(dir: &Path, name: &str) -> Option<PathBuf> {
    [dir.join(name), dir.join("../..").join(name)]
        .into_iter()
        .find(|p| p.is_file())
}

/// The vocabulary every checkpoint has (`load` reads one from its path), the same for all;
/// `None` when none has one.
fn common_vocabulary<V>(
    dirs: &[PathBuf],
    name: &str,
    load: impl Fn(&Path) -> Result<V>,
    same: impl Fn(&V, &V) -> bool,
) -> Result<Option<V>> {
    let found: Vec<Option<PathBuf>> = dirs.iter().map(|d| find(d, name)).collect();
    if found.iter().all(Option::is_none) {
        return Ok(None);
    }
    if let Some(i) = found.iter().position(Option::is_none) {
        bail!(
            "{}: no {name} (in it or in its run directory), but {} has one: the checkpoints \
             must share one vocabulary",
            dirs[i].display(),
            found.iter().flatten().next().expect("one found").display()
        );
    }
    let paths: Vec<PathBuf> = found.into_iter().flatten().collect();
    let first = load(&paths[0])?;
    for path in &paths[1..] {
        if !same(&first, &load(path)?) {
            bail!(
                "{} differs from {}: checkpoints with different vocabularies cannot be averaged",
                path.display(),
                paths[0].display()
            );
        }
    }
    Ok(Some(first))
}

/// The language pair the checkpoints record (`languages.json`), when they all record the same
/// one; checkpoints that disagree (one without a pair, or another pair) are refused.
fn common_languages(paths: &[PathBuf]) -> Result<Option<LanguagePair>> {
    let first = LanguagePair::read(&paths[0])?;
    for path in &paths[1..] {
        if LanguagePair::read(path)? != first {
            bail!(
                "{} and {} record different language pairs ({})",
                path.display(),
                paths[0].display(),
                crate::text::languages::LANGUAGES_FILE
            );
        }
    }
    Ok(first)
}

/// Saves `model` into `out` with the vocabulary staged by `vocab`, in one save.
fn save_average<M: Model>(
    out: &Path,
    model: &mut M,
    vocab: impl FnOnce(&mut CheckpointWriter) -> crate::error::Result<()>,
) -> Result<()>
where
    M::Config: serde::Serialize,
{
    let mut writer = CheckpointWriter::begin(out)?;
    write_model(&mut writer, model)?;
    vocab(&mut writer)?;
    writer.commit()?;
    Ok(())
}

pub fn run(args: AverageArgs) -> Result<()> {
    for dir in &args.checkpoints {
        super::args::check_dir("checkpoint", dir)?;
        if same_or_inside(dir, &args.out) {
            bail!(
                "--out {} is (or holds) the checkpoint {}: write the average elsewhere",
                args.out.display(),
                dir.display()
            );
        }
    }
    super::args::check_out(&args.out, None, args.overwrite, false)?;
    let first = &args.checkpoints[0];
    // A decoder-only config (no encoder layers) is a language model.
    let lm = load_config_of::<LanguageModel<f32>>(first).is_ok();
    let vocabulary;
    if lm {
        let mut model: LanguageModel<f32> = average_checkpoints(&args.checkpoints)?;
        let bpe = common_vocabulary(
            &args.checkpoints,
            TOKENIZER_FILE,
            |p| Ok(Bpe::load(p)?),
            |a, b| a.to_bytes().ok() == b.to_bytes().ok(),
        )?;
        vocabulary = bpe.is_some();
        save_average(&args.out, &mut model, |w| match &bpe {
            Some(bpe) => bpe.write(w),
            None => Ok(()),
        })?;
    } else {
        let mut model: Seq2Seq<f32> = average_checkpoints(&args.checkpoints)?;
        let vocab = common_vocabulary(
            &args.checkpoints,
            VOCAB_FILE,
            |p| Ok(Vocab::load(p)?),
            |a, b| a == b,
        )?;
        vocabulary = vocab.is_some();
        let languages = common_languages(&args.checkpoints)?;
        save_average(&args.out, &mut model, |w| {
            if let Some(vocab) = &vocab {
                vocab.write(w)?;
            }
            match &languages {
                Some(pair) => pair.write(w),
                None => Ok(()),
            }
        })?;
    }
    if !vocabulary {
        eprintln!("warning: no vocabulary found beside the checkpoints: none written");
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
