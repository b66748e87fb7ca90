//! Setting up a masked-LM pre-training run of a BERT encoder on one text (the `train-mlm`
//! command): the text as `train-lm` reads it ([`LmText`], its end held out), then [`prepare`]:
//! a fresh run learns the byte-level BPE with BERT's specials
//! ([`MlmTokenizer`]) on the training part and builds the encoder of the given sizes
//! ([`mlm_config`]); a resumed run loads the checkpoint's tokenizer, model and recipe. Both
//! parts are encoded without special tokens; the held-out part is masked once
//! ([`MlmValidation`]).

use super::lm::LmText;
use super::{check_max_steps, check_vocab_size, join, resume_trainer, Notes, Start};
use crate::dist::Communicator;
use crate::error::{Error, Result};
use crate::kernels::lowp::bf16_train::Bf16Kernel;
use crate::model::masked_lm::mlm_config;
use crate::store::TOKENIZER_FILE;
use crate::text::mlm_tokenizer::MlmTokenizer;
use crate::train::mlm::{MlmTrainer, MlmValidation};
use crate::train::source::Recipe;
use crate::train::windows::LmTrainConfig;
use std::sync::Arc;

/// What a fresh run is made of.
#[derive(Clone, Debug)]
pub struct MlmSpec {
    /// BPE entries, at least 260 (4 specials and 256 bytes).
    pub vocab_size: usize,
    /// Width, heads, FFN width and blocks of the encoder.
    pub d_model: usize,
    pub n_heads: usize,
    pub d_ff: usize,
    pub layers: usize,
    /// Dropout on embeddings, residual branches and attention weights.
    pub dropout: f64,
    /// The recipe; its `context` is the sequence length (and the model's positions).
    pub recipe: LmTrainConfig,
}

/// Everything [`prepare`] needs besides the text.
#[derive(Clone, Debug)]
pub struct MlmPlan {
    pub start: Start<MlmSpec>,
    pub max_steps: u64,
    pub bf16_kernel: Bf16Kernel,
}

impl MlmPlan {
    /// Refuses a run beyond the step limit and, fresh, a vocabulary or recipe out of range.
    pub fn check(&self) -> Result<()> {
        check_max_steps(self.max_steps)?;
        if let Start::Fresh(spec) = &self.start {
            check_vocab_size(spec.vocab_size)?;
            spec.recipe
                .validate()
                .map_err(|e| Error::Input(e.to_string()))?;
            if spec.recipe.context < 3 {
                return Err(Error::Input(format!(
                    "--context {} must be at least 3 ([CLS], a token, [SEP])",
                    spec.recipe.context
                )));
            }
        }
        Ok(())
    }
}

/// A run ready to train.
pub struct MlmRun {
    pub tokenizer: MlmTokenizer,
    pub trainer: MlmTrainer,
    /// The held-out text, masked; `None` when nothing is held out.
    pub validation: Option<MlmValidation>,
}

/// Sets up the run of `plan` on `text` with the processes of `comm` (see the module's
/// description). The resumed line goes to `notes`.
pub fn prepare(
    text: &LmText,
    plan: &MlmPlan,
    comm: Arc<dyn Communicator>,
    notes: Notes,
) -> Result<MlmRun> {
    let train_text = text.train();
    let (tokenizer, mut trainer) = match &plan.start {
        Start::Resume(dir) => {
            let tokenizer = MlmTokenizer::load(&dir.join(TOKENIZER_FILE))?;
            let tokens = tokenizer.encode_plain(train_text)?;
            let trainer = resume_trainer(dir, tokens, &*comm, notes)?;
            (tokenizer, trainer)
        }
        Start::Fresh(spec) => {
            let tokenizer = MlmTokenizer::train(train_text.split_inclusive('\n'), spec.vocab_size)?;
            let tokens = tokenizer.encode_plain(train_text)?;
            let config = mlm_config(
                tokenizer.vocab_size(),
                (spec.d_model, spec.n_heads, spec.d_ff, spec.layers),
                spec.recipe.context,
                spec.dropout,
            );
            config
                .validate()
                .map_err(|e| Error::Input(format!("invalid model: {e}")))?;
            let trainer = MlmTrainer::new(config, spec.recipe.clone(), tokens)?;
            (tokenizer, trainer)
        }
    };
    join(&mut trainer, comm, plan.bf16_kernel)?;
    let valid = tokenizer.encode_plain(text.valid())?;
    let recipe = &trainer.state.config;
    let validation = (!valid.is_empty()).then(|| {
        MlmValidation::new(
            &valid,
            recipe.context,
            recipe.batch,
            trainer.model.config.vocab_size,
        )
    });
    Ok(MlmRun {
        tokenizer,
        trainer,
        validation,
    })
}
