//! Setting up a run of the decoder-only language model on one text (the `train-lm` command):
//! the text ([`LmText::read`], its end held out for validation), then [`prepare`]: a fresh run
//! learns a byte-level BPE on the training part and builds a GPT-style model of the given
//! shape; a resumed run loads the checkpoint's tokenizer, model and recipe. Either way both
//! parts are encoded as documents (after `<|endoftext|>`).

use super::{check_max_steps, check_vocab_size, join, resume_trainer, Notes, Start};
use crate::dist::Communicator;
use crate::error::{Error, Result};
use crate::kernels::lowp::bf16_train::Bf16Kernel;
use crate::model::config::Normalization;
use crate::model::{Activation, ModelConfig, NormPlacement, Positions};
use crate::pipeline::generate::document_tokens;
use crate::store::TOKENIZER_FILE;
use crate::text::bpe::Bpe;
use crate::text::TextError;
use crate::train::source::Recipe;
use crate::train::trainer::LmTrainer;
use crate::train::validate::TextValidation;
use crate::train::windows::LmTrainConfig;
use std::path::Path;
use std::sync::Arc;

/// Splits `text` at the start of its last `fraction` (moved forward to a character boundary):
/// `(training part, validation part)`.
pub fn split_valid(text: &str, fraction: f64) -> (&str, &str) {
    let mut at = ((text.len() as f64) * (1.0 - fraction)).floor() as usize;
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at += 1;
    }
    text.split_at(at)
}

/// A run's text: the file as read and where its validation part starts.
pub struct LmText {
    text: String,
    split: usize,
}

impl LmText {
    /// Reads `path` (UTF-8) and holds out its last `valid_fraction` ([`split_valid`]);
    /// refuses a file whose training part is blank.
    pub fn read(path: &Path, valid_fraction: f64) -> Result<LmText> {
        let bytes = std::fs::read(path).map_err(|cause| TextError::Io {
            path: path.to_path_buf(),
            cause,
        })?;
        let text = String::from_utf8(bytes).map_err(|e| {
            Error::Input(format!(
                "{}: not UTF-8 (invalid byte at offset {})",
                path.display(),
                e.utf8_error().valid_up_to()
            ))
        })?;
        let split = split_valid(&text, valid_fraction).0.len();
        let read = LmText { text, split };
        if read.train().trim().is_empty() {
            return Err(Error::Input(format!(
                "{}: no training text (the file is empty)",
                path.display()
            )));
        }
        Ok(read)
    }

    /// The part trained on.
    pub fn train(&self) -> &str {
        &self.text[..self.split]
    }

    /// The held-out end (empty when none is).
    pub fn valid(&self) -> &str {
        &self.text[self.split..]
    }
}

/// The shape of a fresh run's model; its vocabulary is the learnt BPE's and its context the
/// recipe's window.
#[derive(Clone, Copy, Debug)]
pub struct LmModelSpec {
    /// Width of the residual stream (d_model).
    pub d_model: usize,
    /// Attention heads per layer (h).
    pub n_heads: usize,
    /// Inner width of the feed-forward networks (d_ff).
    pub d_ff: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Dropout on the residual branches and embeddings (none on attention weights or FFN
    /// activations).
    pub dropout: f64,
    /// Pre-LN blocks (with a final norm) instead of post-LN.
    pub pre_ln: bool,
    /// The feed-forward networks' activation.
    pub activation: Activation,
    /// How token positions enter the model.
    pub positions: Positions,
    /// LayerNorm or RMSNorm.
    pub normalization: Normalization,
    /// Key/value heads of grouped-query attention (default: `n_heads`).
    pub n_kv_heads: Option<usize>,
    /// Biases in the linear layers.
    pub bias: bool,
    /// Rotary positions: the base of the angles (10000 in RoFormer).
    pub rope_base: f64,
    /// The output projection tied to the embedding.
    pub tied: bool,
    /// Biases on the query, key and value projections even without `bias` (Qwen2's).
    pub qkv_bias: bool,
    /// RMSNorm of each head's queries and keys (Qwen3's).
    pub qk_norm: bool,
    /// Every layer's sliding window: a query sees its last `w` keys (Mistral's).
    pub sliding_window: Option<usize>,
    /// Every layer's attention (`model::attention_kind`): exact unless stated.
    pub attention: crate::model::attention_kind::AttentionKind,
}

impl LmModelSpec {
    /// The decoder-only config for a vocabulary of `vocab_size` and a context of `context`
    /// tokens, checked (layer-norm ε 1e-5, embeddings scaled by √d_model).
    pub fn config(&self, vocab_size: usize, context: usize) -> Result<ModelConfig> {
        let config = ModelConfig {
            vocab_size,
            d_model: self.d_model,
            n_heads: self.n_heads,
            d_ff: self.d_ff,
            n_encoder_layers: 0,
            n_decoder_layers: self.layers,
            dropout: self.dropout,
            norm: if self.pre_ln {
                NormPlacement::PreLn
            } else {
                NormPlacement::PostLn
            },
            layer_norm_eps: 1e-5,
            tie_embeddings: self.tied,
            max_len: context,
            activation: self.activation,
            positions: self.positions,
            attention_dropout: 0.0,
            activation_dropout: 0.0,
            bias: self.bias,
            scale_embeddings: true,
            n_kv_heads: self.n_kv_heads,
            normalization: self.normalization,
            rope_base: self.rope_base,
            rope_style: Default::default(),
            qkv_bias: self.qkv_bias,
            qk_norm: self.qk_norm,
            rope_scaling: None,
            head_dim: None,
            layer_heads: Default::default(),
            attn_logit_softcap: None,
            final_logit_softcap: None,
            output_bias: false,
            norm_weight_offset: 0.0,
            embedding_scale: None,
            layer_windows: match self.sliding_window {
                Some(w) => vec![Some(w); self.layers],
                None => Vec::new(),
            },
            query_pre_attn_scalar: None,
            post_norms: false,
            sliding_rope_base: None,
            layer_rope: Vec::new(),
            residual_scale: None,
            logit_divisor: None,
            input_norms: true,
            layer_attention: match self.attention {
                crate::model::attention_kind::AttentionKind::Exact => Vec::new(),
                kind => vec![kind; self.layers],
            },
            encoder_layer_attention: Vec::new(),
            experts: None,
            source_eos: true,
            qk_norm_whole: false,
            attention_sinks: false,
            embedding_norm: false,
            target_positions: false,
            relative_buckets: crate::model::config::T5_BUCKETS,
            attn_output_gate: false,
            rotary_dim: None,
            gated_delta: None,
        };
        config
            .validate()
            .map_err(|e| Error::Input(format!("invalid model: {e}")))?;
        Ok(config)
    }
}

/// What a fresh run is made of: the size of the BPE to learn, the model and the recipe.
#[derive(Clone, Debug)]
pub struct LmSpec {
    /// At least 257: the 256 bytes and `<|endoftext|>`.
    pub vocab_size: usize,
    /// The model's shape.
    pub model: LmModelSpec,
    /// The training recipe (schedule, batch, optimizer, seed).
    pub recipe: LmTrainConfig,
}

/// Everything [`prepare`] needs besides the text.
#[derive(Clone, Debug)]
pub struct LmPlan {
    /// A fresh run from a spec, or a resumed one.
    pub start: Start<LmSpec>,
    /// Where the run stops.
    pub max_steps: u64,
    /// How bf16 products are multiplied (see `join`).
    pub bf16_kernel: Bf16Kernel,
}

impl LmPlan {
    /// Refuses settings that would give a broken run, before anything is read: a run beyond
    /// `crate::train::source::MAX_STEP`, and for a fresh run a BPE above
    /// `super::MAX_VOCAB` and a recipe outside the rules a checkpoint's recipe is checked
    /// with on resume.
    pub fn check(&self) -> Result<()> {
        check_max_steps(self.max_steps)?;
        if let Start::Fresh(spec) = &self.start {
            check_vocab_size(spec.vocab_size)?;
            spec.recipe
                .validate()
                .map_err(|e| Error::Input(e.to_string()))?;
        }
        Ok(())
    }
}

/// A run ready to train: its tokenizer, its trainer (on the run's processes) and the
/// validation of the held-out text.
pub struct LmRun {
    /// The tokenizer: learnt on the training text, or the checkpoint's.
    pub bpe: Bpe,
    /// The model, its optimizer and the training text's windows.
    pub trainer: LmTrainer,
    /// The held-out text as tokens (starting with `<|endoftext|>`), its characters and the
    /// run's batch; `None` when nothing is held out.
    pub validation: Option<TextValidation>,
}

impl LmRun {
    /// Tokens of the held-out text (`<|endoftext|>` not counted).
    pub fn valid_tokens(&self) -> usize {
        self.validation.as_ref().map_or(0, |v| v.tokens.len() - 1)
    }
}

/// Sets up the run of `plan` on `text` with the processes of `comm`: the tokenizer and
/// trainer, fresh or resumed (see the module's description), then the held-out text encoded.
/// The resumed line goes to `notes`.
pub fn prepare(
    text: &LmText,
    plan: &LmPlan,
    comm: Arc<dyn Communicator>,
    notes: Notes,
) -> Result<LmRun> {
    let train_text = text.train();
    let (bpe, mut trainer) = match &plan.start {
        Start::Resume(dir) => {
            let bpe = Bpe::load(&dir.join(TOKENIZER_FILE))?;
            let tokens = document_tokens(&bpe, train_text)?;
            let trainer = resume_trainer(dir, tokens, &*comm, notes)?;
            (bpe, trainer)
        }
        Start::Fresh(spec) => start(spec, train_text)?,
    };
    join(&mut trainer, comm, plan.bf16_kernel)?;
    let valid_text = text.valid();
    let valid_chars = valid_text.chars().count();
    let validation = (valid_chars > 0)
        .then(|| -> Result<TextValidation> {
            Ok(TextValidation {
                tokens: document_tokens(&bpe, valid_text)?,
                chars: valid_chars,
                batch: trainer.state.config.batch,
            })
        })
        .transpose()?;
    Ok(LmRun {
        bpe,
        trainer,
        validation,
    })
}

/// A fresh run: a BPE learnt on the training text (line by line), the model and recipe from
/// the spec, the context the recipe's.
fn start(spec: &LmSpec, train_text: &str) -> Result<(Bpe, LmTrainer)> {
    let bpe = Bpe::train(train_text.split_inclusive('\n'), spec.vocab_size)?;
    let tokens = document_tokens(&bpe, train_text)?;
    let model_config = spec.model.config(bpe.vocab_size(), spec.recipe.context)?;
    let trainer = LmTrainer::new(model_config, spec.recipe.clone(), tokens)?;
    Ok((bpe, trainer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_split_moves_to_a_character_boundary() {
        assert_eq!(split_valid("abcdefghij", 0.2), ("abcdefgh", "ij"));
        assert_eq!(split_valid("abc", 0.0), ("abc", ""));
        // "é" is two bytes: a cut inside it moves past it.
        assert_eq!(split_valid("aéb", 0.5), ("aé", "b"));
    }

    #[test]
    fn a_blank_training_part_is_refused() {
        let dir = std::env::temp_dir().join(format!("lm-setup-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("blank.txt");
        std::fs::write(&path, "  \n\n").unwrap();
        let e = LmText::read(&path, 0.0).err().unwrap().to_string();
        assert!(e.ends_with("no training text (the file is empty)"), "{e}");
        std::fs::write(&path, "some text\nto learn\n").unwrap();
        let text = LmText::read(&path, 0.5).unwrap();
        assert_eq!(
            format!("{}{}", text.train(), text.valid()),
            "some text\nto learn\n"
        );
        assert!(!text.valid().is_empty());
        std::fs::write(&path, [b'a', 0xff]).unwrap();
        let e = LmText::read(&path, 0.0).err().unwrap().to_string();
        assert!(e.ends_with("not UTF-8 (invalid byte at offset 1)"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
