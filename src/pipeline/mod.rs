//! What the command line (and, next, the server) runs: whole tasks over a model directory, text
//! in and text out. Each pipeline loads a model with its tokenizer, checks what it is given, and
//! calls the model, the search (`crate::decode`) and the tokenizer; the CLI only parses
//! arguments and prints.
//!
//! - [`translate`]: a translation model directory (`train`, `demo --out`, `average`): greedy
//!   and beam translation, n-best lists, scoring of given pairs, attention maps;
//! - [`generate`]: a language-model directory (`train-lm`): sampling continuations through the
//!   KV cache, and the perplexity of a text;
//! - [`embed`]: a pretrained BERT encoder (e.g. all-MiniLM-L6-v2): sentence embeddings;
//! - [`chat`]: conversations through a model's chat template, rendered in [`jinja`] as
//!   transformers renders them.

pub mod argos;
pub mod chat;
pub mod device;
pub mod embed;
pub mod generate;
pub mod jinja;
pub mod lm_dir;
pub mod speculative;
pub mod translate;

use crate::error::{Error, Result};
use std::path::Path;

/// Refuses a model path that is not a directory, naming what it is instead.
pub fn check_model_dir(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        Ok(())
    } else if dir.exists() {
        Err(Error::Input(format!(
            "{} is a file, not a model directory",
            dir.display()
        )))
    } else {
        Err(Error::Input(format!(
            "model directory {} does not exist",
            dir.display()
        )))
    }
}

/// Refuses a tokenizer (or vocabulary) of `n` tokens at `path` for a model whose config says
/// `vocab_size` (`exact`: the sizes must be equal; otherwise the tokenizer may be smaller, as a
/// Hugging Face model's embedding table may be padded).
pub fn check_vocab(path: &Path, n: usize, vocab_size: usize, exact: bool) -> Result<()> {
    if n == vocab_size || (!exact && n < vocab_size) {
        return Ok(());
    }
    Err(Error::Input(format!(
        "{}: {n} tokens but config.json says vocab_size {vocab_size}",
        path.display()
    )))
}
