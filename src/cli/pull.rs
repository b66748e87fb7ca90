//! `transformer pull hf:ORG/REPO[@REVISION][:QUANT or FILE]`: fetch a model from the Hugging
//! Face Hub into its cache (`store::hub`) and print its local path; and the same for every
//! model argument of the other commands (`--model hf:...`, `--draft hf:...`), resolved before
//! the command runs ([`resolve_model_names`]).

use super::Command;
use crate::store::hub::{Hub, HubName};
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct PullArgs {
    /// `hf:ORG/REPO` (a model directory, or a repository's Q4_K_M GGUF file), `hf:ORG/REPO:QUANT`
    /// (its GGUF file of that quantisation), `hf:ORG/REPO:FILE`; `@REVISION` after REPO for a
    /// branch, tag or commit. HF_TOKEN, HF_HOME / HF_HUB_CACHE, HF_ENDPOINT and HF_HUB_OFFLINE
    /// are read as huggingface_hub reads them.
    pub name: String,
}

pub fn run(args: PullArgs) -> Result<()> {
    let path = resolve(&args.name)?;
    super::outln!("{}", path.display())?;
    Ok(())
}

/// `hf:...` as a local path (downloading what the cache lacks, with a progress bar).
fn resolve(name: &str) -> Result<PathBuf> {
    let parsed = HubName::parse(name)?;
    let hub = Hub::from_env(true)?;
    hub.resolve(&parsed)
        .with_context(|| format!("fetching {name} (cache {})", hub.cache_dir().display()))
}

/// Replaces every model argument of `command` written `hf:...` by its local path.
pub fn resolve_model_names(command: &mut Command) -> Result<()> {
    for path in model_paths(command) {
        if let Some(name) = path.to_str().filter(|p| HubName::is_hub_name(p)) {
            *path = resolve(name)?;
        }
    }
    Ok(())
}

/// The arguments of `command` that name a model to load (a directory or a file).
fn model_paths(command: &mut Command) -> Vec<&mut PathBuf> {
    match command {
        Command::Translate(a) => vec![&mut a.model],
        Command::Score(a) => vec![&mut a.model],
        Command::Embed(a) => vec![&mut a.model],
        Command::Attention(a) => vec![&mut a.model],
        Command::Classify(a) => vec![&mut a.model],
        Command::Perplexity(a) => vec![&mut a.model],
        Command::Tokenize(a) => vec![&mut a.model],
        Command::Heads(a) => vec![&mut a.model],
        Command::Prune(a) => vec![&mut a.model],
        Command::Serve(a) => a.model.iter_mut().collect(),
        Command::Generate(a) => std::iter::once(&mut a.model)
            .chain(a.speculative.draft.as_mut())
            .collect(),
        Command::Chat(a) => std::iter::once(&mut a.model)
            .chain(a.speculative.draft.as_mut())
            .collect(),
        Command::Template(a) => a.model.as_mut().into_iter().collect(),
        Command::Bench(a) => a
            .translate
            .as_mut()
            .into_iter()
            .chain(a.generate.as_mut())
            .collect(),
        Command::TrainClassifier(a) => a.init.as_mut().into_iter().collect(),
        Command::Train(_)
        | Command::Demo(_)
        | Command::Average(_)
        | Command::Bleu(_)
        | Command::TrainLm(_)
        | Command::TrainMlm(_)
        | Command::Loadtest(_)
        | Command::Pull(_)
        | Command::Devices(_) => Vec::new(),
    }
}
