//! The encoder-decoder's data: sentence pairs batched by token count (section 5.1), visited in
//! a seeded order that changes every epoch ([`BatchOrder`]), with word dropout; and the
//! paper's recipe ([`TrainConfig`]: warm-up and inverse-square-root schedule, label smoothing,
//! gradient accumulation, an optional cool-down).

use crate::batch::Batch;
use crate::error::{Error, Result};
use crate::model::loss::LossStats;
use crate::model::{ModelConfig, Seq2Seq};
use crate::rng::Rng;
use crate::train::adam::AdamConfig;
use crate::train::batching::{batch_by_tokens, BatchOrder};
use crate::train::data_parallel::split;
use crate::train::precision::TrainPrecision;
use crate::train::schedule::{Cooldown, Schedule};
use crate::train::source::{
    check, BadSetting, BatchSource, Recipe, Update, MAX_ACCUMULATE, MAX_BATCH_TOKENS, MAX_STEP,
};
use crate::train::state::Fnv1a;
use serde::{Deserialize, Serialize};

/// The training recipe's hyper-parameters (saved with every checkpoint).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// ε_ls of the label-smoothed loss.
    pub label_smoothing: f64,
    /// Warm-up steps of the schedule.
    pub warmup: u64,
    /// Multiplier of the schedule.
    pub lr_factor: f64,
    /// Source + target tokens (padding included) per batch.
    pub tokens_per_batch: usize,
    /// Batches whose gradients are summed before each update.
    pub accumulate: usize,
    /// Clip the global gradient norm to this value.
    pub clip_norm: Option<f64>,
    /// Adam's β₁, β₂ and ε.
    pub adam: AdamConfig,
    /// Decides initialisation, dropout masks and shuffling.
    pub seed: u64,
    /// Word dropout: the probability of replacing each source and decoder-input token by UNK
    /// (see `Batch::drop_words`); absent in checkpoints written before the option, meaning 0.
    #[serde(default)]
    pub word_dropout: f64,
    /// A linear cool-down of the learning rate to zero at the end of the run (absent in
    /// checkpoints written before the option, meaning none).
    #[serde(default)]
    pub cooldown: Option<Cooldown>,
    /// The number format of the products (absent in checkpoints written before the option,
    /// meaning f32; f32 is not written, so such recipes keep their layout).
    #[serde(default, skip_serializing_if = "TrainPrecision::is_f32")]
    pub precision: TrainPrecision,
}

impl Default for TrainConfig {
    /// The paper's recipe (batch size scaled to a CPU).
    fn default() -> Self {
        TrainConfig {
            label_smoothing: 0.1,
            warmup: 4000,
            lr_factor: 1.0,
            tokens_per_batch: 4000,
            accumulate: 1,
            clip_norm: None,
            adam: AdamConfig::default(),
            seed: 1,
            word_dropout: 0.0,
            cooldown: None,
            precision: TrainPrecision::F32,
        }
    }
}

impl Recipe for TrainConfig {
    fn validate(&self) -> std::result::Result<(), BadSetting> {
        check::fraction("label_smoothing", self.label_smoothing)?;
        check::positive("lr_factor", self.lr_factor)?;
        check::count(
            "tokens_per_batch",
            self.tokens_per_batch,
            1,
            MAX_BATCH_TOKENS,
        )?;
        check::count("accumulate", self.accumulate, 1, MAX_ACCUMULATE)?;
        check::clip_norm(self.clip_norm)?;
        check::adam(&self.adam)?;
        check::fraction("word_dropout", self.word_dropout)?;
        match self.cooldown {
            Some(c) if c.start > c.end || c.end > MAX_STEP => Err(BadSetting {
                field: "cooldown",
                reason: format!(
                    "from step {} to {} is not a range of steps up to {MAX_STEP}",
                    c.start, c.end
                ),
            }),
            _ => Ok(()),
        }
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
    /// The paper's schedule with this recipe's warm-up and factor, and its cool-down.
    fn schedule(&self, d_model: usize) -> Schedule {
        Schedule::inverse_sqrt(d_model, self.warmup, self.lr_factor).with_cooldown(self.cooldown)
    }
}

/// One training pair in token ids, without specials.
#[derive(Clone, Debug, PartialEq)]
pub struct Example {
    pub src: Vec<u32>,
    pub tgt: Vec<u32>,
}

/// Sentence pairs cut into batches by token count ([`batch_by_tokens`]).
pub struct PairBatches {
    examples: Vec<Example>,
    batches: Vec<Vec<usize>>,
}

impl PairBatches {
    /// Batches per epoch.
    pub fn batches_per_epoch(&self) -> usize {
        self.batches.len()
    }

    /// The padded batch of the given example indices.
    pub fn make_batch(&self, indices: &[usize]) -> Batch {
        let pairs: Vec<(&[u32], &[u32])> = indices
            .iter()
            .map(|&i| (&self.examples[i].src[..], &self.examples[i].tgt[..]))
            .collect();
        Batch::from_pairs(&pairs)
    }
}

impl BatchSource for PairBatches {
    type Recipe = TrainConfig;
    type Data = Vec<Example>;
    type Part = Batch;

    fn new(examples: Vec<Example>, recipe: &TrainConfig, model: &ModelConfig) -> Result<Self> {
        check_examples(&examples, model)?;
        let batches = batch_by_tokens(&lengths(&examples), recipe.tokens_per_batch);
        Ok(PairBatches { examples, batches })
    }

    /// FNV-1a over each example's source length, source ids, target length and target ids.
    fn fingerprint(&self) -> u64 {
        let mut h = Fnv1a::default();
        for e in &self.examples {
            h.eat(e.src.len() as u64);
            e.src.iter().for_each(|&t| h.eat(t as u64));
            h.eat(e.tgt.len() as u64);
            e.tgt.iter().for_each(|&t| h.eat(t as u64));
        }
        h.value()
    }

    fn start(recipe: &TrainConfig) -> Option<BatchOrder> {
        Some(BatchOrder::new(recipe.seed))
    }

    /// `accumulate` batches in the seeded order, each split into `parts` halves by pairs, word
    /// dropout drawn from `rng` part by part; the passes' dropout then draws from `rng` too.
    fn next(
        &mut self,
        recipe: &TrainConfig,
        position: &mut Option<BatchOrder>,
        rng: &mut Rng,
        parts: usize,
    ) -> Update<Batch> {
        let order = position
            .as_mut()
            .expect("sentence-pair training keeps a batch order");
        let batches: Vec<Vec<Batch>> = (0..recipe.accumulate.max(1))
            .map(|_| {
                let (b, _) = order.next(self.batches.len());
                split(&self.batches[b], parts)
                    .map(|part| {
                        let mut batch = self.make_batch(part);
                        batch.drop_words(recipe.word_dropout, rng);
                        batch
                    })
                    .collect()
            })
            .collect();
        let all = || batches.iter().flatten();
        Update {
            targets: all().map(Batch::n_tgt_tokens).sum(),
            tokens: all().map(|b| b.n_src_tokens() + b.n_tgt_tokens()).sum(),
            batches,
            dropout_rng: None,
        }
    }
}

/// (source, target) lengths with their EOS, as batches count them.
fn lengths(examples: &[Example]) -> Vec<(usize, usize)> {
    examples
        .iter()
        .map(|e| (e.src.len() + 1, e.tgt.len() + 1))
        .collect()
}

fn check_examples(examples: &[Example], model: &ModelConfig) -> Result<()> {
    if examples.is_empty() {
        return Err(Error::Input("no training examples".into()));
    }
    for (i, e) in examples.iter().enumerate() {
        let longest = e.src.len().max(e.tgt.len()) + 1;
        if longest > model.max_len {
            return Err(Error::Input(format!(
                "training example {} has {} tokens, more than the model's max_len {}",
                i + 1,
                longest,
                model.max_len
            )));
        }
        if let Some(&t) = e
            .src
            .iter()
            .chain(&e.tgt)
            .find(|&&t| t as usize >= model.vocab_size)
        {
            return Err(Error::Input(format!(
                "training example {} has token id {t} outside the vocabulary of {}",
                i + 1,
                model.vocab_size
            )));
        }
    }
    Ok(())
}

/// Loss sums of `model` over `examples` without dropout, batched by `tokens_per_batch`.
pub fn evaluate(
    model: &Seq2Seq<f32>,
    examples: &[Example],
    tokens_per_batch: usize,
    label_smoothing: f64,
) -> LossStats {
    let mut stats = LossStats::default();
    for indices in batch_by_tokens(&lengths(examples), tokens_per_batch) {
        let pairs: Vec<(&[u32], &[u32])> = indices
            .iter()
            .map(|&i| (&examples[i].src[..], &examples[i].tgt[..]))
            .collect();
        stats.add(model.evaluate(&Batch::from_pairs(&pairs), label_smoothing));
    }
    stats
}
