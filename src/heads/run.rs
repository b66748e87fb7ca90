//! What `transformer heads` and `transformer prune` run on a model directory: load it (a
//! translation model of `train`, or a language model: `train-lm`'s, a Hugging Face decoder
//! directory or a GGUF file), cut a data file into batches, and measure every head.

use super::behaviour::Behaviour;
use super::importance::{lm_importance, seq2seq_importance, Importance};
use crate::batch::Batch;
use crate::error::{Error, Result};
use crate::pipeline::generate::TextGenerator;
use crate::pipeline::translate::Translator;
use crate::store::VOCAB_FILE;
use crate::text::corpus::read_pairs_strict;
use std::path::Path;

/// A loaded model whose heads are measured.
pub enum HeadsModel {
    /// A language model (ours or a pretrained decoder) with its tokenizer.
    Lm(Box<TextGenerator>),
    /// A translation model of `train` with its vocabulary.
    Translation(Box<Translator>),
}

impl HeadsModel {
    /// A translation model directory (it holds `vocab.json`), or any model `generate` loads.
    pub fn load(path: &Path) -> Result<HeadsModel> {
        if !path.exists() {
            return Err(Error::Input(format!("{}: no such model", path.display())));
        }
        if path.join(VOCAB_FILE).is_file() {
            return Ok(HeadsModel::Translation(Box::new(Translator::load(path)?)));
        }
        Ok(HeadsModel::Lm(Box::new(TextGenerator::load(path)?)))
    }
}

/// The first `limit` windows of `context + 1` tokens of the UTF-8 text `data`, tokenized by
/// `g`'s tokenizer (inputs and next tokens); refuses a text shorter than one window.
pub fn lm_windows(
    g: &TextGenerator,
    data: &Path,
    context: usize,
    limit: usize,
) -> Result<Vec<Vec<u32>>> {
    let text = std::fs::read(data).map_err(|e| Error::Input(format!("{}: {e}", data.display())))?;
    let text = String::from_utf8(text).map_err(|e| {
        Error::Input(format!(
            "{}: not UTF-8 (invalid byte at offset {})",
            data.display(),
            e.utf8_error().valid_up_to()
        ))
    })?;
    let tokens = g.tokenizer.encode(&text)?;
    g.model.embedding.check_ids(&tokens)?;
    let windows: Vec<Vec<u32>> = tokens
        .chunks_exact(context + 1)
        .take(limit)
        .map(<[u32]>::to_vec)
        .collect();
    if windows.is_empty() {
        return Err(Error::Input(format!(
            "{}: {} tokens, fewer than one window of {} (give a longer text or a smaller \
             --context)",
            data.display(),
            tokens.len(),
            context + 1
        )));
    }
    Ok(windows)
}

/// Refuses a language model whose weights the backward cannot differentiate: a hybrid's
/// inference-only layers ([`ModelConfig::check_trainable`](crate::model::ModelConfig::check_trainable)), a token table
/// kept in a GGUF file's quantised blocks (load it dequantised to float32, as
/// [`TextGenerator::load`] does) or linear layers packed for low-precision inference.
pub fn check_backward(model: &crate::model::LanguageModel<f32>) -> Result<()> {
    // A hybrid stack's Gated DeltaNet layers have no backward.
    model.config.check_trainable().map_err(Error::Input)?;
    if model.embedding.has_stored_rows() {
        return Err(Error::Input(
            "the token embedding is held in quantised GGUF blocks, which the backward does not \
             differentiate (load the model dequantised to float32)"
                .into(),
        ));
    }
    Ok(())
}

/// The first `limit` sentence pairs of the `source<TAB>target` file `data`, encoded by `t`'s
/// vocabulary; refuses a malformed line, a pair longer than the model's positions, and a file
/// without pairs.
pub fn encoded_pairs(
    t: &Translator,
    data: &Path,
    limit: usize,
) -> Result<Vec<(Vec<u32>, Vec<u32>)>> {
    let pairs = read_pairs_strict(data)?;
    let longest = t.model.config.max_len - 1;
    let mut encoded = Vec::new();
    for p in pairs.iter().take(limit) {
        let (s, g) = (t.vocab.encode(&p.source), t.vocab.encode(&p.target));
        if s.len() > longest || g.len() > longest {
            return Err(Error::Input(format!(
                "{} line {}: longer than the model's {longest} tokens",
                data.display(),
                p.line
            )));
        }
        encoded.push((s, g));
    }
    if encoded.is_empty() {
        return Err(Error::Input(format!(
            "{}: no sentence pairs",
            data.display()
        )));
    }
    Ok(encoded)
}

/// How much of the data file is read.
#[derive(Clone, Copy, Debug)]
pub struct DataSize {
    /// Batches (each one importance term).
    pub batches: usize,
    /// Windows (language model) or sentence pairs (translation) per batch.
    pub batch: usize,
    /// Tokens per language-model window (at most the model's context).
    pub context: usize,
}

/// The importance and behaviour of every head of `model` on the data file `data` (UTF-8 text
/// for a language model, `source<TAB>target` lines for a translation model).
pub fn measure(
    model: &mut HeadsModel,
    data: &Path,
    size: DataSize,
) -> Result<(Importance, Behaviour)> {
    if size.batches == 0 || size.batch == 0 {
        return Err(Error::Input(
            "--batches and --batch must be positive".into(),
        ));
    }
    match model {
        HeadsModel::Lm(g) => {
            let context = size.context.min(g.model.max_len() - 1).max(1);
            let windows = lm_windows(g, data, context, size.batches * size.batch)?;
            check_backward(&g.model)?;
            let importance = lm_importance(&mut g.model, &windows, size.batch);
            let mut behaviour = Behaviour::new(&g.model);
            for group in windows.chunks(size.batch) {
                let tokens: Vec<u32> = group.iter().flat_map(|w| w[..context].to_vec()).collect();
                behaviour.add_lm(&g.model, &tokens, group.len());
            }
            Ok((importance, behaviour))
        }
        HeadsModel::Translation(t) => {
            let encoded = encoded_pairs(t, data, size.batches * size.batch)?;
            let batches: Vec<Batch> = encoded
                .chunks(size.batch)
                .map(|c| {
                    let pairs: Vec<(&[u32], &[u32])> =
                        c.iter().map(|(s, g)| (&s[..], &g[..])).collect();
                    Batch::from_pairs(&pairs)
                })
                .collect();
            let importance = seq2seq_importance(&mut t.model, &batches);
            let mut behaviour = Behaviour::new(&t.model);
            for b in &batches {
                behaviour.add_seq2seq(&t.model, b);
            }
            Ok((importance, behaviour))
        }
    }
}
