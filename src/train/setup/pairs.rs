//! Setting up a run of the encoder-decoder on sentence pairs (the `train` command): the
//! corpora ([`PairCorpora::read`]: a TSV file or two parallel files, for training and
//! validation), then [`prepare`]: a fresh run learns its vocabulary from the training pairs
//! (sources and targets together) and builds the model of a preset or a config file; a resumed
//! run loads the checkpoint's vocabulary, model and recipe. Either way the pairs are encoded
//! with the vocabulary, dropping those that do not fit ([`encode_pairs`]).

use super::{check_max_steps, check_vocab_size, join, resume_trainer, Notes, Start};
use crate::dist::Communicator;
use crate::error::{Error, Result};
use crate::kernels::lowp::bf16_train::Bf16Kernel;
use crate::model::attention_kind::AttentionKind;
use crate::model::{ModelConfig, NormPlacement, Seq2Seq};
use crate::store::VOCAB_FILE;
use crate::text::corpus::{read_pairs, read_parallel, Pair};
use crate::text::vocab::{Vocab, VocabLevel};
use crate::train::pairs::{Example, TrainConfig};
use crate::train::schedule::Cooldown;
use crate::train::source::Recipe;
use crate::train::trainer::PairTrainer;
use crate::train::validate::{BleuCheck, PairValidation};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where sentence pairs are read from.
#[derive(Clone, Debug)]
pub enum PairFiles {
    /// One `source<TAB>target` pair per line.
    Tsv(PathBuf),
    /// Sources and targets one per line, line `i` of one paired with line `i` of the other.
    Parallel {
        /// The source sentences.
        source: PathBuf,
        /// The target sentences.
        target: PathBuf,
    },
}

impl PairFiles {
    /// The pairs of the file(s); lines that are not a pair are skipped, with a warning naming
    /// them (and their count) in `notes`.
    pub fn read(&self, notes: Notes) -> Result<Vec<Pair>> {
        let (pairs, report) = match self {
            PairFiles::Tsv(path) => read_pairs(path)?,
            PairFiles::Parallel { source, target } => read_parallel(source, target)?,
        };
        if report.count > 0 {
            notes(&format!(
                "warning: {}: skipped {}",
                self.name(),
                report.summary()
            ));
        }
        Ok(pairs)
    }

    /// The file(s) as messages name them: `path`, or `source / target`.
    pub fn name(&self) -> String {
        match self {
            PairFiles::Tsv(path) => path.display().to_string(),
            PairFiles::Parallel { source, target } => {
                format!("{} / {}", source.display(), target.display())
            }
        }
    }
}

/// The pairs of a run as read: training and (possibly none) validation.
pub struct PairCorpora {
    /// The training pairs.
    pub train: Vec<Pair>,
    /// The training files as messages name them ([`PairFiles::name`]).
    pub train_name: String,
    /// The validation pairs (possibly none).
    pub valid: Vec<Pair>,
}

impl PairCorpora {
    /// Reads the training pairs, then the validation pairs (none without `valid`).
    pub fn read(train: &PairFiles, valid: Option<&PairFiles>, notes: Notes) -> Result<Self> {
        let train_pairs = train.read(notes)?;
        let valid = match valid {
            Some(files) => files.read(notes)?,
            None => Vec::new(),
        };
        Ok(PairCorpora {
            train: train_pairs,
            train_name: train.name(),
            valid,
        })
    }
}

/// Encodes pairs with `vocab`, dropping those with more than `max_len - 1` tokens on a side
/// (room for the EOS), with a warning in `notes` naming the count and the first five lines;
/// `what` names the data in it (`training data`).
pub fn encode_pairs(
    pairs: &[Pair],
    vocab: &Vocab,
    max_len: usize,
    what: &str,
    notes: Notes,
) -> Vec<Example> {
    let mut too_long = Vec::new();
    let mut out = Vec::with_capacity(pairs.len());
    for p in pairs {
        let e = Example {
            src: vocab.encode(&p.source),
            tgt: vocab.encode(&p.target),
        };
        if e.src.len() + 1 > max_len || e.tgt.len() + 1 > max_len {
            too_long.push(p.line);
        } else {
            out.push(e);
        }
    }
    if !too_long.is_empty() {
        let first: Vec<String> = too_long.iter().take(5).map(|l| l.to_string()).collect();
        notes(&format!(
            "warning: {what}: dropped {} pairs longer than {max_len} tokens (lines {}{})",
            too_long.len(),
            first.join(", "),
            if too_long.len() > 5 { ", ..." } else { "" }
        ));
    }
    out
}

/// The vocabulary a fresh run learns from its training pairs.
#[derive(Clone, Copy, Debug)]
pub struct VocabSpec {
    /// Characters, whitespace-separated words, or byte-level BPE subwords.
    pub level: VocabLevel,
    /// The size of a BPE vocabulary, specials included (checked against
    /// `super::MAX_VOCAB` whatever the level).
    pub bpe_size: usize,
}

impl VocabSpec {
    /// The joint vocabulary of the pairs' sources and targets (every token seen once kept).
    pub fn learn(&self, pairs: &[Pair]) -> Result<Vocab> {
        let texts = pairs
            .iter()
            .flat_map(|p| [p.source.as_str(), p.target.as_str()]);
        match self.level {
            VocabLevel::Bpe => Vocab::build_bpe(texts, self.bpe_size).map_err(|e| {
                Error::Input(format!(
                    "--vocab-level bpe: building the joint BPE vocabulary: {e}"
                ))
            }),
            level => Ok(Vocab::build(texts, level, 1)),
        }
    }
}

/// The base of a fresh run's model.
#[derive(Clone, Debug)]
pub enum ModelBase {
    /// A named size of [`ModelConfig::preset`] (`tiny`, `base`, `big`).
    Preset(String),
    /// A model config JSON file (as written to `config.json`).
    File(PathBuf),
}

/// A fresh run's model: a base, its vocabulary size taken from the data, and overrides.
#[derive(Clone, Debug)]
pub struct PairModelSpec {
    /// The config the model starts from.
    pub base: ModelBase,
    /// Replaces the base's dropout (residual branches and embeddings).
    pub dropout: Option<f64>,
    /// Replaces the base's dropout on attention weights.
    pub attention_dropout: Option<f64>,
    /// Replaces the base's dropout on the feed-forward activations.
    pub activation_dropout: Option<f64>,
    /// Pre-LN residual blocks instead of the base's placement.
    pub pre_ln: bool,
    /// Replaces every self-attention layer's kind, the encoder's and the decoder's
    /// (`encoder_layer_attention`, `layer_attention`); cross-attention stays exact.
    pub attention: Option<AttentionKind>,
}

impl PairModelSpec {
    /// The model's config for a vocabulary of `vocab_size`, checked ([`ModelConfig::validate`];
    /// errors name the config file when there is one).
    pub fn config(&self, vocab_size: usize) -> Result<ModelConfig> {
        let mut c = match &self.base {
            ModelBase::File(path) => {
                let bytes = std::fs::read(path).map_err(|e| {
                    Error::Input(format!("cannot read config {}: {e}", path.display()))
                })?;
                serde_json::from_slice::<ModelConfig>(crate::store::strip_bom(&bytes)).map_err(
                    |e| Error::Input(format!("{}: invalid model config: {e}", path.display())),
                )?
            }
            ModelBase::Preset(name) => ModelConfig::preset(name, vocab_size).ok_or_else(|| {
                Error::Input(format!(
                    "unknown preset {name:?} (choose one of {:?})",
                    ModelConfig::PRESETS
                ))
            })?,
        };
        c.vocab_size = vocab_size;
        if let Some(p) = self.dropout {
            c.dropout = p;
        }
        if let Some(p) = self.attention_dropout {
            c.attention_dropout = p;
        }
        if let Some(p) = self.activation_dropout {
            c.activation_dropout = p;
        }
        if self.pre_ln {
            c.norm = NormPlacement::PreLn;
        }
        if let Some(kind) = self.attention {
            c.encoder_layer_attention = vec![kind; c.n_encoder_layers];
            c.layer_attention = vec![kind; c.n_decoder_layers];
        }
        c.validate().map_err(|e| match &self.base {
            ModelBase::File(path) => {
                Error::Input(format!("{}: invalid model config: {e}", path.display()))
            }
            ModelBase::Preset(_) => Error::Input(format!("invalid model config: {e}")),
        })?;
        Ok(c)
    }
}

/// What a fresh run is made of: its vocabulary, model and recipe.
#[derive(Clone, Debug)]
pub struct PairSpec {
    /// The vocabulary to build from the training pairs.
    pub vocab: VocabSpec,
    /// The model's config.
    pub model: PairModelSpec,
    /// The training recipe (schedule, batch, optimizer, seed).
    pub recipe: TrainConfig,
}

/// Everything [`prepare`] needs besides the data.
#[derive(Clone, Debug)]
pub struct PairPlan {
    /// A fresh run from a spec, or a resumed one.
    pub start: Start<PairSpec>,
    /// Drop training pairs with more tokens than this on a side (default: the model's
    /// `max_len`, which also caps it on a fresh run).
    pub max_len: Option<usize>,
    /// Where the run stops (a resumed run's cool-down must not end before it).
    pub max_steps: u64,
    /// On `Resume`: replaces the checkpoint's cool-down by the last N updates before
    /// `max_steps` (0: none); `None` keeps it. A fresh run's is in its recipe.
    pub cooldown: Option<u64>,
    /// How bf16 products are multiplied (see `join`).
    pub bf16_kernel: Bf16Kernel,
}

impl PairPlan {
    /// Refuses settings that would give a broken run, before anything is read: a cool-down
    /// longer than the run, a run beyond `crate::train::source::MAX_STEP`, and for a fresh
    /// run a vocabulary above `super::MAX_VOCAB` and a recipe outside the rules a
    /// checkpoint's recipe is checked with on resume.
    pub fn check(&self) -> Result<()> {
        if let Some(c) = self.cooldown.filter(|&c| c > self.max_steps) {
            return Err(Error::Input(format!(
                "--cooldown {c} is longer than the run (--max-steps {})",
                self.max_steps
            )));
        }
        check_max_steps(self.max_steps)?;
        if let Start::Fresh(spec) = &self.start {
            check_vocab_size(spec.vocab.bpe_size)?;
            spec.recipe
                .validate()
                .map_err(|e| Error::Input(e.to_string()))?;
        }
        Ok(())
    }
}

/// A run ready to train: its vocabulary, its trainer (on the run's processes) and the
/// validation pairs.
pub struct PairRun {
    /// The shared source/target vocabulary: built from the pairs, or the checkpoint's.
    pub vocab: Vocab,
    /// The model, its optimizer and the training pairs' batches.
    pub trainer: PairTrainer,
    /// The validation pairs.
    pub valid: PairValid,
}

/// The validation pairs: as read (for BLEU's sources and references) and encoded (those that
/// fit the model).
pub struct PairValid {
    /// The pairs as read.
    pub pairs: Vec<Pair>,
    /// The pairs that fit the model, as token ids.
    pub examples: Vec<Example>,
}

impl PairValid {
    /// The run's validation, none without validation pairs: loss and NLL in the run's batching
    /// and label smoothing (`recipe`'s), and with `bleu_lines` > 0 greedy BLEU of the first
    /// `bleu_lines` pairs as read.
    pub fn into_validation<'a>(
        self,
        vocab: &'a Vocab,
        recipe: &TrainConfig,
        bleu_lines: usize,
    ) -> Option<PairValidation<'a>> {
        if self.examples.is_empty() {
            return None;
        }
        let bleu_pairs = &self.pairs[..bleu_lines.min(self.pairs.len())];
        Some(PairValidation {
            examples: self.examples,
            tokens_per_batch: recipe.tokens_per_batch,
            label_smoothing: recipe.label_smoothing,
            bleu: (!bleu_pairs.is_empty()).then(|| BleuCheck {
                vocab,
                sources: bleu_pairs.iter().map(|p| p.source.clone()).collect(),
                references: bleu_pairs.iter().map(|p| p.target.clone()).collect(),
            }),
        })
    }
}

/// Sets up the run of `plan` on `corpora` with the processes of `comm`: the vocabulary and
/// trainer, fresh or resumed (see the module's description), then the validation pairs
/// encoded (those longer than the model's `max_len` dropped). Warnings and the resumed line go
/// to `notes`.
pub fn prepare(
    corpora: PairCorpora,
    plan: &PairPlan,
    comm: Arc<dyn Communicator>,
    notes: Notes,
) -> Result<PairRun> {
    let (vocab, mut trainer) = match &plan.start {
        Start::Resume(dir) => resume(plan, dir, &corpora.train, &*comm, notes)?,
        Start::Fresh(spec) => start(plan, spec, &corpora, notes)?,
    };
    join(&mut trainer, comm, plan.bf16_kernel)?;
    let max_len = trainer.model.config.max_len;
    let examples = encode_pairs(&corpora.valid, &vocab, max_len, "validation data", notes);
    Ok(PairRun {
        vocab,
        trainer,
        valid: PairValid {
            pairs: corpora.valid,
            examples,
        },
    })
}

/// Continues the run saved in `dir`: its vocabulary, model and recipe, with the cool-down
/// replaced when the plan gives one; refuses a cool-down that ends before `max_steps`.
fn resume(
    plan: &PairPlan,
    dir: &Path,
    train_pairs: &[Pair],
    comm: &dyn Communicator,
    notes: Notes,
) -> Result<(Vocab, PairTrainer)> {
    let vocab = Vocab::load(&dir.join(VOCAB_FILE))?;
    let model_config = crate::model::checkpoint::load_config_of::<Seq2Seq<f32>>(dir)?;
    let max_len = plan.max_len.unwrap_or(model_config.max_len);
    let examples = encode_pairs(train_pairs, &vocab, max_len, "training data", notes);
    let mut trainer: PairTrainer = resume_trainer(dir, examples, comm, notes)?;
    if let Some(steps) = plan.cooldown {
        trainer.set_cooldown(Cooldown::last(steps, plan.max_steps));
    }
    if let Some(c) = trainer.state.config.cooldown {
        if c.end < plan.max_steps {
            return Err(Error::Input(format!(
                "{}: the run's learning-rate cool-down ends at step {} (rate 0 after it), \
                 before --max-steps {}; give --cooldown N to decay over the last N updates of \
                 the longer run (or --cooldown 0 for none)",
                dir.display(),
                c.end,
                plan.max_steps
            )));
        }
    }
    Ok((vocab, trainer))
}

/// A fresh run: the vocabulary learnt from the training pairs, the model and recipe from the
/// spec; refuses a run left without training pairs.
fn start(
    plan: &PairPlan,
    spec: &PairSpec,
    corpora: &PairCorpora,
    notes: Notes,
) -> Result<(Vocab, PairTrainer)> {
    let vocab = spec.vocab.learn(&corpora.train)?;
    let model_config = spec.model.config(vocab.len())?;
    let max_len = plan
        .max_len
        .unwrap_or(model_config.max_len)
        .min(model_config.max_len);
    let examples = encode_pairs(&corpora.train, &vocab, max_len, "training data", notes);
    if examples.is_empty() {
        return Err(Error::Input(format!(
            "{}: no training pairs left",
            corpora.train_name
        )));
    }
    let trainer = PairTrainer::new(model_config, spec.recipe.clone(), examples)?;
    Ok((vocab, trainer))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(line: usize, source: &str, target: &str) -> Pair {
        Pair {
            line,
            source: source.into(),
            target: target.into(),
        }
    }

    #[test]
    fn long_pairs_are_dropped_with_their_lines() {
        let pairs: Vec<Pair> = (1..=7)
            .map(|i| pair(i, &"ab".repeat(i), "c"))
            .chain([pair(8, "a", "b")])
            .collect();
        let vocab = Vocab::build(["ab", "c"], VocabLevel::Char, 1);
        let mut notes = Vec::new();
        let kept = encode_pairs(&pairs, &vocab, 4, "training data", &mut |l: &str| {
            notes.push(l.to_string())
        });
        // "ab" (2 tokens + EOS) and "a" fit 4 positions; "abab" and longer do not.
        assert_eq!(kept.len(), 2);
        assert_eq!(
            notes,
            [
                "warning: training data: dropped 6 pairs longer than 4 tokens (lines 2, 3, 4, 5, \
              6, ...)"
            ]
        );
    }

    #[test]
    fn a_fresh_plan_is_checked_before_reading() {
        let spec = PairSpec {
            vocab: VocabSpec {
                level: VocabLevel::Char,
                bpe_size: 8000,
            },
            model: PairModelSpec {
                base: ModelBase::Preset("tiny".into()),
                dropout: None,
                attention_dropout: None,
                activation_dropout: None,
                pre_ln: false,
                attention: None,
            },
            recipe: TrainConfig::default(),
        };
        let mut plan = PairPlan {
            start: Start::Fresh(spec),
            max_len: None,
            max_steps: 10,
            cooldown: Some(11),
            bf16_kernel: Bf16Kernel::default(),
        };
        let e = plan.check().unwrap_err().to_string();
        assert_eq!(e, "--cooldown 11 is longer than the run (--max-steps 10)");
        plan.cooldown = None;
        assert!(plan.check().is_ok());
        if let Start::Fresh(spec) = &mut plan.start {
            spec.recipe.tokens_per_batch = 0;
        }
        let e = plan.check().unwrap_err().to_string();
        assert!(e.starts_with("--tokens-per-batch 0"), "{e}");
    }

    #[test]
    fn an_unknown_preset_lists_the_known_ones() {
        let spec = PairModelSpec {
            base: ModelBase::Preset("huge".into()),
            dropout: None,
            attention_dropout: None,
            activation_dropout: None,
            pre_ln: true,
            attention: None,
        };
        let e = spec.config(100).unwrap_err().to_string();
        assert!(
            e.starts_with("unknown preset \"huge\" (choose one of"),
            "{e}"
        );
        let mut tiny = spec.clone();
        tiny.base = ModelBase::Preset("tiny".into());
        tiny.dropout = Some(0.25);
        let c = tiny.config(100).unwrap();
        assert_eq!(
            (c.vocab_size, c.dropout, c.norm),
            (100, 0.25, NormPlacement::PreLn)
        );
        // --attention: every encoder and decoder self-attention layer; linear attention
        // refuses the attention dropout it has no weights for.
        let window = AttentionKind::Window { window: 3 };
        tiny.attention = Some(window);
        let c = tiny.config(100).unwrap();
        assert_eq!(c.encoder_layer_attention, vec![window; c.n_encoder_layers]);
        assert_eq!(c.layer_attention, vec![window; c.n_decoder_layers]);
        assert!(c.n_encoder_layers > 0 && c.n_decoder_layers > 0);
        tiny.attention = Some(AttentionKind::Linear);
        tiny.attention_dropout = Some(0.1);
        let e = tiny.config(100).unwrap_err().to_string();
        assert!(e.contains("linear attention") && e.contains("attention_dropout"), "{e}");
        tiny.attention_dropout = Some(0.0);
        assert!(tiny.config(100).is_ok());
    }
}
