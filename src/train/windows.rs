//! The decoder-only language model's data: each update samples `batch` random windows of
//! `context + 1` tokens from one token stream (inputs and the targets shifted by one) with the
//! run's generator; and its recipe ([`LmTrainConfig`]: linear warm-up, then a cosine decay to
//! 10% of the peak at the planned last step, gradient clipping).

use crate::error::{Error, Result};
use crate::model::ModelConfig;
use crate::rng::Rng;
use crate::train::adam::AdamConfig;
use crate::train::batching::BatchOrder;
use crate::train::precision::TrainPrecision;
use crate::train::schedule::Schedule;
use crate::train::source::{
    check, BadSetting, BatchSource, Recipe, Update, MAX_BATCH_TOKENS, MAX_WINDOWS,
};
use crate::train::state::Fnv1a;
use serde::{Deserialize, Serialize};

/// The longest context a language model takes (the models' `max_len` bound).
const MAX_LEN: usize = 1 << 16;

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
    /// Adam's β₁, β₂ and ε.
    pub adam: AdamConfig,
    /// Decides initialisation, windows and dropout.
    pub seed: u64,
    /// The number format of the products (absent in checkpoints written before the option,
    /// meaning f32; f32 is not written, so such recipes keep their layout).
    #[serde(default, skip_serializing_if = "TrainPrecision::is_f32")]
    pub precision: TrainPrecision,
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
            precision: TrainPrecision::F32,
        }
    }
}

impl Recipe for LmTrainConfig {
    fn validate(&self) -> std::result::Result<(), BadSetting> {
        check::count("context", self.context, 1, MAX_LEN)?;
        check::count("batch", self.batch, 1, MAX_WINDOWS)?;
        if self.batch * self.context > MAX_BATCH_TOKENS {
            return Err(BadSetting {
                field: "batch",
                reason: format!(
                    "{} x context {} = {} tokens per update, more than {MAX_BATCH_TOKENS}",
                    self.batch,
                    self.context,
                    self.batch * self.context
                ),
            });
        }
        check::positive("lr", self.lr)?;
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return Err(BadSetting {
                field: "min_lr_ratio",
                reason: format!("{} must be in [0, 1]", self.min_lr_ratio),
            });
        }
        check::clip_norm(self.clip_norm)?;
        check::fraction("label_smoothing", self.label_smoothing)?;
        check::adam(&self.adam)
    }

    fn precision(&self) -> TrainPrecision {
        self.precision
    }

    fn seed(&self) -> u64 {
        self.seed
    }
    fn adam(&self) -> AdamConfig {
        self.adam
    }
    fn label_smoothing(&self) -> f64 {
        self.label_smoothing
    }
    fn clip_norm(&self) -> Option<f64> {
        self.clip_norm
    }
    /// Warm-up and cosine decay to `min_lr_ratio · lr` at `total_steps` (whatever `d_model`).
    fn schedule(&self, _d_model: usize) -> Schedule {
        Schedule::cosine(self.lr, self.warmup, self.total_steps, self.min_lr_ratio)
    }
}

/// Whole windows of the token stream, one part of an update: `inputs` and `targets` are each
/// `[count, context]`, the targets the inputs shifted by one token.
#[derive(Clone, Debug, PartialEq)]
pub struct Windows {
    pub inputs: Vec<u32>,
    pub targets: Vec<u32>,
    pub count: usize,
}

/// One token stream, sampled in random windows.
pub struct TokenWindows {
    tokens: Vec<u32>,
}

impl TokenWindows {
    /// Tokens in the training stream.
    pub fn n_tokens(&self) -> usize {
        self.tokens.len()
    }
}

impl BatchSource for TokenWindows {
    type Recipe = LmTrainConfig;
    type Data = Vec<u32>;
    type Part = Windows;

    fn new(tokens: Vec<u32>, config: &LmTrainConfig, model: &ModelConfig) -> Result<Self> {
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
        Ok(TokenWindows { tokens })
    }

    /// FNV-1a over the token ids, xor-ed with their count.
    fn fingerprint(&self) -> u64 {
        Fnv1a::of_tokens(&self.tokens)
    }

    /// `batch` windows with starts drawn from `rng`, as one batch in `parts` parts of whole
    /// windows (halves of 3 and 2 windows for 5). Dropout then draws from a generator of its
    /// own, forked from `rng` once per update, so that the windows sampled next do not depend
    /// on whether the update ran in halves.
    fn next(
        &mut self,
        config: &LmTrainConfig,
        _: &mut Option<BatchOrder>,
        rng: &mut Rng,
        parts: usize,
    ) -> Update<Windows> {
        let (context, batch) = (config.context, config.batch);
        let starts = self.tokens.len() - context; // windows of context + 1 tokens
        let per_part = batch.div_ceil(parts.max(1));
        let mut windows = Vec::new();
        let mut left = batch;
        while left > 0 {
            let count = per_part.min(left);
            let mut part = Windows {
                inputs: Vec::with_capacity(count * context),
                targets: Vec::with_capacity(count * context),
                count,
            };
            for _ in 0..count {
                let s = rng.below(starts);
                part.inputs.extend_from_slice(&self.tokens[s..s + context]);
                part.targets
                    .extend_from_slice(&self.tokens[s + 1..s + context + 1]);
            }
            windows.push(part);
            left -= count;
        }
        Update {
            batches: vec![windows],
            targets: batch * context,
            tokens: batch * context,
            dropout_rng: Some(rng.fork()),
        }
    }
}
