//! Training a decoder-only language model on one token stream: each update samples `batch`
//! random windows of `context + 1` tokens (inputs and the targets shifted by one) with the run's
//! seeded generator, runs forward and backward (mean cross-entropy over all `batch · context`
//! targets), clips the global gradient norm and applies Adam on a [`CosineSchedule`] (linear
//! warm-up, then cosine decay to 10% of the peak at the planned last step). Checkpoints hold the
//! model, Adam's moments and the state (step, generator, recipe, data fingerprint), so a resumed
//! run continues bit for bit at the same thread count. With two threads the windows of each
//! update are split between the model and a replica that run side by side
//! ([`DataParallel`]).

use crate::error::{Error, Result};
use crate::model::checkpoint as model_checkpoint;
use crate::model::{LanguageModel, ModelConfig};
use crate::rng::Rng;
use crate::store;
use crate::train::adam::{guarded_update, Adam, AdamConfig};
use crate::train::checkpoint;
use crate::train::data_parallel::DataParallel;
use crate::train::schedule::CosineSchedule;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The language-model recipe (saved with every checkpoint).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LmTrainConfig {
    /// Tokens per training window (at most the model's max_len).
    pub context: usize,
    /// Windows per update.
    pub batch: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warm-up updates.
    pub warmup: u64,
    /// The update at which the cosine reaches its floor (the planned run length).
    pub total_steps: u64,
    /// The floor as a fraction of the peak (0.1).
    pub min_lr_ratio: f64,
    /// Clip the global gradient norm to this value.
    pub clip_norm: Option<f64>,
    /// ε_ls of the loss (0: plain cross-entropy).
    pub label_smoothing: f64,
    pub adam: AdamConfig,
    /// Decides initialisation, windows and dropout.
    pub seed: u64,
}

impl Default for LmTrainConfig {
    fn default() -> Self {
        LmTrainConfig {
            context: 128,
            batch: 16,
            lr: 5e-4,
            warmup: 200,
            total_steps: 5000,
            min_lr_ratio: 0.1,
            clip_norm: Some(1.0),
            label_smoothing: 0.0,
            adam: AdamConfig::default(),
            seed: 1,
        }
    }
}

/// Where a run stands (`trainer_state.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LmTrainerState {
    pub step: u64,
    /// Draws the windows and the dropout masks.
    pub rng: Rng,
    pub config: LmTrainConfig,
    /// FNV-1a of the training tokens, to refuse resuming on other data.
    pub data_fingerprint: u64,
}

/// What one update did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LmStepReport {
    pub step: u64,
    /// Mean loss per target token (nats; equals the NLL without label smoothing).
    pub loss: f64,
    pub nll: f64,
    pub lr: f64,
    /// Target tokens of the update.
    pub tokens: usize,
    pub grad_norm: Option<f64>,
}

/// A language model, its optimizer and its token stream.
pub struct LmTrainer {
    pub model: LanguageModel<f32>,
    pub adam: Adam<f32>,
    pub schedule: CosineSchedule,
    pub state: LmTrainerState,
    tokens: Vec<u32>,
    /// The replica training on the second half of each batch's windows (when on).
    parallel: DataParallel<LanguageModel<f32>>,
}

/// FNV-1a over the token ids.
pub fn fingerprint(tokens: &[u32]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &t in tokens {
        h ^= t as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h ^ tokens.len() as u64
}

fn check(model: &ModelConfig, config: &LmTrainConfig, tokens: &[u32]) -> Result<()> {
    if config.context == 0 || config.batch == 0 {
        return Err(Error::Config("context and batch must be positive".into()));
    }
    if config.context > model.max_len {
        return Err(Error::Config(format!(
            "context {} is longer than the model's max_len {}",
            config.context, model.max_len
        )));
    }
    if tokens.len() <= config.context {
        return Err(Error::Input(format!(
            "the training text has {} tokens; a window needs context + 1 = {} (use a longer text or a smaller --context)",
            tokens.len(),
            config.context + 1
        )));
    }
    if let Some(&t) = tokens.iter().find(|&&t| t as usize >= model.vocab_size) {
        return Err(Error::Input(format!(
            "token id {t} is outside the vocabulary of {}",
            model.vocab_size
        )));
    }
    Ok(())
}

impl LmTrainer {
    /// A fresh run: the model is initialised from `config.seed`.
    pub fn new(model_config: ModelConfig, config: LmTrainConfig, tokens: Vec<u32>) -> Result<Self> {
        model_config.validate().map_err(Error::Config)?;
        check(&model_config, &config, &tokens)?;
        let mut rng = Rng::new(config.seed);
        let mut model = LanguageModel::new(model_config, &mut rng);
        let adam = Adam::new(config.adam, &model.params_mut());
        let state = LmTrainerState {
            step: 0,
            rng,
            data_fingerprint: fingerprint(&tokens),
            config,
        };
        Ok(Self::assemble(model, adam, state, tokens))
    }

    /// Continues the run saved in `dir` on the same tokens.
    pub fn resume(dir: &Path, tokens: Vec<u32>) -> Result<Self> {
        let mut model = model_checkpoint::load_language_model(dir)?;
        let path = dir.join(store::TRAINER_STATE_FILE);
        let bytes = store::read_file(&path)?;
        let state: LmTrainerState =
            serde_json::from_slice(&bytes).map_err(|e| Error::Checkpoint {
                path: path.clone(),
                reason: format!("invalid language-model trainer state: {e}"),
            })?;
        check(&model.config, &state.config, &tokens)?;
        if state.data_fingerprint != fingerprint(&tokens) {
            return Err(Error::Checkpoint {
                path,
                reason: "the training text differs from the text this run started on".into(),
            });
        }
        let mut adam = Adam::new(state.config.adam, &model.params_mut());
        adam.step = state.step;
        checkpoint::load_optimizer_params(dir, &model.params_mut(), &mut adam)?;
        Ok(Self::assemble(model, adam, state, tokens))
    }

    fn assemble(
        model: LanguageModel<f32>,
        adam: Adam<f32>,
        state: LmTrainerState,
        tokens: Vec<u32>,
    ) -> Self {
        let c = &state.config;
        let schedule = CosineSchedule {
            lr: c.lr,
            warmup: c.warmup,
            total: c.total_steps,
            min_ratio: c.min_lr_ratio,
        };
        LmTrainer {
            parallel: DataParallel::for_pool(&model),
            model,
            adam,
            schedule,
            state,
            tokens,
        }
    }

    /// Data parallelism on or off (see `train::data_parallel`); on by default when the
    /// thread pool has more than one thread.
    pub fn set_data_parallel(&mut self, on: bool) {
        self.parallel = DataParallel::new(&self.model, on);
    }

    /// Tokens in the training stream.
    pub fn n_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// `batch` random windows: inputs and targets, each `[batch, context]`.
    fn sample_windows(&mut self) -> (Vec<u32>, Vec<u32>) {
        let (context, batch) = (self.state.config.context, self.state.config.batch);
        let starts = self.tokens.len() - context; // windows of context + 1 tokens
        let mut inputs = Vec::with_capacity(batch * context);
        let mut targets = Vec::with_capacity(batch * context);
        for _ in 0..batch {
            let s = self.state.rng.below(starts);
            inputs.extend_from_slice(&self.tokens[s..s + context]);
            targets.extend_from_slice(&self.tokens[s + 1..s + context + 1]);
        }
        (inputs, targets)
    }

    /// One update: the windows split in halves between the model and its replica under data
    /// parallelism (see `train::data_parallel`), else one pass.
    pub fn step(&mut self) -> Result<LmStepReport> {
        let (inputs, targets) = self.sample_windows();
        let context = self.state.config.context;
        self.parallel.sync_weights(&mut self.model);
        self.model.zero_grads();
        let grad_scale = 1.0 / targets.len() as f64;
        let smoothing = self.state.config.label_smoothing;
        // Whole windows per part: [windows, context] each.
        let part_len = self.state.config.batch.div_ceil(self.parallel.parts()) * context;
        let parts: Vec<(&[u32], &[u32])> = inputs
            .chunks(part_len)
            .zip(targets.chunks(part_len))
            .collect();
        // Dropout draws from a generator of its own, forked once per update, so the windows
        // sampled next do not depend on whether the update ran in halves.
        let mut dropout_rng = self.state.rng.fork();
        let stats = self.parallel.run(
            &mut self.model,
            &parts,
            &mut dropout_rng,
            |model, &(inputs, targets), rng| {
                let windows = inputs.len() / context;
                model.forward_backward(inputs, targets, windows, smoothing, grad_scale, Some(rng))
            },
        );
        self.parallel.gather_grads(&mut self.model);
        let step = self.state.step + 1;
        let lr = self.schedule.lr(step);
        let grad_norm = guarded_update(
            &mut self.adam,
            &mut self.model.params_mut(),
            self.state.config.clip_norm,
            lr,
            step,
            stats.loss(),
        )?;
        self.state.step = step;
        Ok(LmStepReport {
            step,
            loss: stats.loss(),
            nll: stats.nll(),
            lr,
            tokens: targets.len(),
            grad_norm,
        })
    }

    /// Writes model, optimizer and state into `dir` (the state last).
    pub fn save(&mut self, dir: &Path) -> Result<()> {
        model_checkpoint::save_language_model(dir, &mut self.model)?;
        checkpoint::save_optimizer_params(dir, &self.model.params_mut(), &self.adam)?;
        let state = serde_json::to_string_pretty(&self.state).expect("trainer state serialises");
        store::write_atomic(&dir.join(store::TRAINER_STATE_FILE), state.as_bytes())
    }
}
