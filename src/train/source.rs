//! What the trainer needs of its data and recipe: a [`BatchSource`] hands out each update's
//! batches (already split into parts for data parallelism) and fingerprints its data; its
//! [`Recipe`] (saved as `config` in `trainer_state.json`) gives the optimizer's settings and the
//! learning-rate schedule. Two sources: sentence pairs batched by token count
//! ([`crate::train::pairs`]) and random windows of one token stream
//! ([`crate::train::windows`]).

use crate::error::Result;
use crate::model::ModelConfig;
use crate::rng::Rng;
use crate::train::adam::AdamConfig;
use crate::train::batching::BatchOrder;
use crate::train::precision::TrainPrecision;
use crate::train::schedule::Schedule;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The most batches accumulated into one update (`--accumulate`).
pub const MAX_ACCUMULATE: usize = 4096;
/// The most tokens in one batch (`--tokens-per-batch`), and in one update of the language
/// model (`--batch` × `--context`).
pub const MAX_BATCH_TOKENS: usize = 1 << 24;
/// The most windows in one update of the language model (`--batch`).
pub const MAX_WINDOWS: usize = 1 << 16;
/// The most updates a run can count (Adam's bias correction takes the step as an `i32`).
pub const MAX_STEP: u64 = i32::MAX as u64;

/// A recipe value outside its range: the field (as `config` in `trainer_state.json` names it)
/// and why, e.g. `lr` and `-1 must be positive`. The same rules check the command line (which
/// names the flag, [`BadSetting::flag`]) and a checkpoint's recipe on `--resume`.
#[derive(Clone, Debug, PartialEq)]
pub struct BadSetting {
    pub field: &'static str,
    pub reason: String,
}

impl BadSetting {
    /// The command-line flag that sets the field (`--lr`, `--max-steps` for `total_steps`).
    pub fn flag(&self) -> String {
        match self.field {
            "total_steps" => "--max-steps".into(),
            f => format!("--{}", f.replace(['_', '.'], "-")),
        }
    }
}

impl std::fmt::Display for BadSetting {
    /// As the command line reports it: `--lr -1 must be positive`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.flag(), self.reason)
    }
}

/// Checks of one recipe value each, for [`Recipe::validate`].
pub mod check {
    use super::BadSetting;

    fn bad(field: &'static str, reason: String) -> BadSetting {
        BadSetting { field, reason }
    }

    /// A finite number above 0.
    pub fn positive(field: &'static str, x: f64) -> Result<(), BadSetting> {
        if x.is_finite() && x > 0.0 {
            Ok(())
        } else {
            Err(bad(field, format!("{x} must be a positive number")))
        }
    }

    /// A probability in [0, 1).
    pub fn fraction(field: &'static str, x: f64) -> Result<(), BadSetting> {
        if (0.0..1.0).contains(&x) {
            Ok(())
        } else {
            Err(bad(field, format!("{x} must be in [0, 1)")))
        }
    }

    /// An integer in `lo..=hi`.
    pub fn count(field: &'static str, n: usize, lo: usize, hi: usize) -> Result<(), BadSetting> {
        if (lo..=hi).contains(&n) {
            Ok(())
        } else {
            Err(bad(field, format!("{n} must be in {lo}..={hi}")))
        }
    }

    /// An optional finite number above 0.
    pub fn clip_norm(x: Option<f64>) -> Result<(), BadSetting> {
        x.map_or(Ok(()), |x| positive("clip_norm", x))
    }

    /// Adam's β₁, β₂ in [0, 1) and ε above 0.
    pub fn adam(a: &crate::train::adam::AdamConfig) -> Result<(), BadSetting> {
        fraction("adam.beta1", a.beta1)?;
        fraction("adam.beta2", a.beta2)?;
        positive("adam.eps", a.eps)
    }
}

/// A training recipe: the hyper-parameters saved with every checkpoint.
pub trait Recipe: Clone + Serialize + DeserializeOwned {
    /// Checks every value against the rules of the command line (a fresh run's recipe, and a
    /// checkpoint's on `--resume`).
    fn validate(&self) -> std::result::Result<(), BadSetting>;
    /// Seeds initialisation and the run's generator.
    fn seed(&self) -> u64;
    fn adam(&self) -> AdamConfig;
    /// ε_ls of the loss.
    fn label_smoothing(&self) -> f64;
    /// Clip the global gradient norm to this value.
    fn clip_norm(&self) -> Option<f64>;
    /// The learning rate of every update, for a model of width `d_model`.
    fn schedule(&self, d_model: usize) -> Schedule;
    /// The number format of the products.
    fn precision(&self) -> TrainPrecision;
}

/// The data of one update.
pub struct Update<P> {
    /// The batches whose gradients are summed into the update (several with gradient
    /// accumulation), each split into parts that run side by side under data parallelism.
    pub batches: Vec<Vec<P>>,
    /// Target tokens over all batches: the loss is the mean over them.
    pub targets: usize,
    /// Tokens processed, for the tokens-per-second rate (source + target tokens for pairs,
    /// target tokens for windows).
    pub tokens: usize,
    /// A generator of the update's own for the dropout of its passes, when the source keeps
    /// dropout apart from its data draws (else the passes draw from the run's generator).
    pub dropout_rng: Option<Rng>,
}

/// Training data as a stream of updates.
pub trait BatchSource: Sized {
    /// The recipe the source's batching comes from.
    type Recipe: Recipe;
    /// What the source is built from (sentence pairs, a token stream).
    type Data;
    /// One part of a batch, as the model takes it.
    type Part: Sync;

    /// Prepares `data` for training under `recipe`, refusing data the model of shape `model`
    /// cannot take (over-long examples, unknown token ids, an empty set).
    fn new(data: Self::Data, recipe: &Self::Recipe, model: &ModelConfig) -> Result<Self>;

    /// The data's fingerprint (FNV-1a, see [`crate::train::state::Fnv1a`]), saved with every
    /// checkpoint: a resumed run must see the same value.
    fn fingerprint(&self) -> u64;

    /// Where a fresh run of `recipe` starts in the data, for sources that walk it in order
    /// (`None`, the default: the source keeps no position and draws at random).
    fn start(_recipe: &Self::Recipe) -> Option<BatchOrder> {
        None
    }

    /// The next update's data, each batch split into `parts` parts, advancing `position` and
    /// drawing from `rng`.
    fn next(
        &mut self,
        recipe: &Self::Recipe,
        position: &mut Option<BatchOrder>,
        rng: &mut Rng,
        parts: usize,
    ) -> Update<Self::Part>;
}
