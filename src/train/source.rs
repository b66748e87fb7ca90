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
use crate::train::schedule::Schedule;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A training recipe: the hyper-parameters saved with every checkpoint.
pub trait Recipe: Clone + Serialize + DeserializeOwned {
    /// Seeds initialisation and the run's generator.
    fn seed(&self) -> u64;
    fn adam(&self) -> AdamConfig;
    /// ε_ls of the loss.
    fn label_smoothing(&self) -> f64;
    /// Clip the global gradient norm to this value.
    fn clip_norm(&self) -> Option<f64>;
    /// The learning rate of every update, for a model of width `d_model`.
    fn schedule(&self, d_model: usize) -> Schedule;
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
    /// (`None`: the source keeps no position).
    fn start(recipe: &Self::Recipe) -> Option<BatchOrder>;

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
