//! Setting up the fine-tuning of a BERT encoder for sentence classification (the
//! `train-classifier` command) on `text<TAB>label` files ([`read_labelled`]): the label set
//! comes from the training file; [`prepare`] then makes the tokenizer and the model —
//! a fresh encoder learns the byte-level BPE with BERT's specials on the training sentences
//! ([`MlmTokenizer`]); a pre-trained one (a `train-mlm` directory or a Hugging Face BERT
//! directory such as all-MiniLM-L6-v2, see [`Bert::load`]) brings its `tokenizer.json` and its
//! weights, and only the head starts from random; a resumed run loads the checkpoint's
//! tokenizer, labels, model and recipe. Sentences are encoded as `[CLS] … [SEP]`, truncated to
//! the recipe's `context`.

use super::{check_max_steps, check_vocab_size, join, resume_trainer, Notes, Start};
use crate::dist::Communicator;
use crate::error::{Error, Result};
use crate::kernels::lowp::bf16_train::Bf16Kernel;
use crate::model::bert::Bert;
use crate::model::checkpoint::load_config_of;
use crate::model::classifier_head::Pooling;
use crate::model::masked_lm::mlm_config;
use crate::model::sentence_classifier::{encoder_config_of, ClassifierConfig, SentenceClassifier};
use crate::store::{read_file, TOKENIZER_FILE};
use crate::text::mlm_tokenizer::MlmTokenizer;
use crate::text::tokenizer::Tokenizer;
use crate::train::classify::{
    ClassifyExample, ClassifyTrainer, ClassifyValidation, Labelled, Labels,
};
use crate::train::source::Recipe;
use crate::train::windows::LmTrainConfig;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a fresh run's encoder comes from.
#[derive(Clone, Debug)]
pub enum EncoderStart {
    /// A new encoder of these sizes (width, heads, FFN width, blocks) with a BPE of
    /// `vocab_size` learnt on the training sentences.
    New {
        vocab_size: usize,
        sizes: (usize, usize, usize, usize),
    },
    /// The encoder and `tokenizer.json` of this directory.
    Pretrained(PathBuf),
}

/// What a fresh run is made of.
#[derive(Clone, Debug)]
pub struct ClassifySpec {
    pub encoder: EncoderStart,
    /// Dropout in the encoder (embeddings, residual branches, attention weights) and on the
    /// pooled vector.
    pub dropout: f64,
    pub pooling: Pooling,
    /// The recipe; its `context` is the truncation length.
    pub recipe: LmTrainConfig,
}

/// Everything [`prepare`] needs besides the data.
#[derive(Clone, Debug)]
pub struct ClassifyPlan {
    pub start: Start<ClassifySpec>,
    pub max_steps: u64,
    pub bf16_kernel: Bf16Kernel,
}

impl ClassifyPlan {
    /// Refuses a run beyond the step limit and, fresh, a vocabulary, dropout or recipe out of
    /// range.
    pub fn check(&self) -> Result<()> {
        check_max_steps(self.max_steps)?;
        if let Start::Fresh(spec) = &self.start {
            if let EncoderStart::New { vocab_size, .. } = spec.encoder {
                check_vocab_size(vocab_size)?;
            }
            if !(0.0..1.0).contains(&spec.dropout) {
                return Err(Error::Input(format!(
                    "--dropout {} must be in [0, 1)",
                    spec.dropout
                )));
            }
            spec.recipe
                .validate()
                .map_err(|e| Error::Input(e.to_string()))?;
            if spec.recipe.context < 3 {
                return Err(Error::Input(format!(
                    "--max-len {} must be at least 3 ([CLS], a token, [SEP])",
                    spec.recipe.context
                )));
            }
        }
        Ok(())
    }
}

/// The labelled sentences of a run: the training file's and, optionally, the validation
/// file's, each with its path (named in errors).
pub struct ClassifyData<'a> {
    pub train: (&'a [Labelled], &'a Path),
    pub valid: Option<(&'a [Labelled], &'a Path)>,
}

/// A run ready to train.
pub struct ClassifyRun {
    /// The `tokenizer.json` the model directory keeps.
    pub tokenizer_json: Vec<u8>,
    pub labels: Labels,
    pub trainer: ClassifyTrainer,
    /// The validation sentences; `None` without a validation file.
    pub validation: Option<ClassifyValidation>,
}

/// Encodes `lines` with `tokenizer` and their labels' ids.
pub fn encode(
    tokenizer: &Tokenizer,
    labels: &Labels,
    lines: &[Labelled],
    path: &Path,
) -> Result<Vec<ClassifyExample>> {
    let ids = labels.ids(lines, path)?;
    lines
        .iter()
        .zip(ids)
        .map(|(l, label)| {
            Ok(ClassifyExample {
                ids: tokenizer.encode(&l.text)?,
                label,
            })
        })
        .collect()
}

/// Sets up the run of `plan` on `data` with the processes of `comm` (see the module's
/// description). The resumed line goes to `notes`.
pub fn prepare(
    data: &ClassifyData,
    plan: &ClassifyPlan,
    comm: Arc<dyn Communicator>,
    notes: Notes,
) -> Result<ClassifyRun> {
    let (train, train_path) = data.train;
    let (tokenizer_json, labels, tokenizer, mut trainer) = match &plan.start {
        Start::Resume(dir) => {
            let config = load_config_of::<SentenceClassifier<f32>>(dir)?;
            let labels = Labels::load(dir, config.n_labels)?;
            let path = dir.join(TOKENIZER_FILE);
            let json = read_file(&path)?;
            let tokenizer = Tokenizer::from_bytes(&json, &path, config.max_tokens)?;
            let examples = encode(&tokenizer, &labels, train, train_path)?;
            let trainer: ClassifyTrainer = resume_trainer(dir, examples, &*comm, notes)?;
            (json, labels, tokenizer, trainer)
        }
        Start::Fresh(spec) => {
            let labels = Labels::collect(train);
            if labels.names.len() < 2 {
                return Err(Error::Input(format!(
                    "{}: one label ({}); a classifier needs at least two",
                    train_path.display(),
                    labels.names.join(", ")
                )));
            }
            let max_tokens = spec.recipe.context;
            let (json, encoder, pretrained) = match &spec.encoder {
                EncoderStart::New { vocab_size, sizes } => {
                    let texts: Vec<String> = train.iter().map(|l| format!("{}\n", l.text)).collect();
                    let bpe = MlmTokenizer::train(texts.iter().map(String::as_str), *vocab_size)?;
                    let config = mlm_config(bpe.vocab_size(), *sizes, max_tokens, spec.dropout);
                    (bpe.to_json()?.into_bytes(), config, None)
                }
                EncoderStart::Pretrained(dir) => {
                    crate::pipeline::check_model_dir(dir)?;
                    let bert = Bert::load(dir)?;
                    let config = encoder_config_of(&bert.config, spec.dropout).map_err(|e| {
                        Error::Input(format!("{}: not a BERT encoder to fine-tune: {e}", dir.display()))
                    })?;
                    let json = read_file(&dir.join(TOKENIZER_FILE))?;
                    (json, config, Some(bert))
                }
            };
            let positions = encoder.max_len;
            if max_tokens > positions {
                return Err(Error::Input(format!(
                    "--max-len {max_tokens} is longer than the encoder's {positions} positions"
                )));
            }
            let config = ClassifierConfig {
                encoder,
                n_labels: labels.names.len(),
                pooling: spec.pooling,
                classifier_dropout: spec.dropout,
                max_tokens,
            };
            config
                .check()
                .map_err(|e| Error::Input(format!("invalid model: {e}")))?;
            let path = match &spec.encoder {
                EncoderStart::Pretrained(dir) => dir.join(TOKENIZER_FILE),
                EncoderStart::New { .. } => PathBuf::from(TOKENIZER_FILE),
            };
            let tokenizer = Tokenizer::from_bytes(&json, &path, max_tokens)?;
            crate::pipeline::check_vocab(
                &path,
                tokenizer.vocab_size(),
                config.encoder.vocab_size,
                false,
            )?;
            let examples = encode(&tokenizer, &labels, train, train_path)?;
            let mut trainer = ClassifyTrainer::new(config, spec.recipe.clone(), examples)?;
            if let Some(bert) = pretrained {
                trainer.model.load_encoder(bert)?;
            }
            (json, labels, tokenizer, trainer)
        }
    };
    join(&mut trainer, comm, plan.bf16_kernel)?;
    let validation = match data.valid {
        None => None,
        Some((lines, path)) => {
            let examples = encode(&tokenizer, &labels, lines, path)?;
            let config = &trainer.model.config;
            Some(ClassifyValidation::new(
                &examples,
                trainer.state.config.batch,
                config.max_tokens,
                config.encoder.vocab_size,
            )?)
        }
    };
    Ok(ClassifyRun {
        tokenizer_json,
        labels,
        trainer,
        validation,
    })
}
