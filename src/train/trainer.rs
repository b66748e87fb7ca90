//! The training loop: batches by token count in a seeded order, forward and backward with
//! dropout, gradient accumulation and optional clipping, Adam on the warm-up schedule, and
//! checkpoints from which a run resumes exactly.

use crate::batch::Batch;
use crate::error::{Error, Result};
use crate::model::checkpoint as model_checkpoint;
use crate::model::loss::LossStats;
use crate::model::{ModelConfig, Seq2Seq};
use crate::rng::Rng;
use crate::store;
use crate::train::adam::{guarded_update, Adam, AdamConfig};
use crate::train::batching::{batch_by_tokens, BatchOrder};
use crate::train::checkpoint;
use crate::train::data_parallel::{split, DataParallel};
use crate::train::schedule::{Cooldown, NoamSchedule};
use serde::{Deserialize, Serialize};
use std::path::Path;

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
    pub adam: AdamConfig,
    /// Decides initialisation, dropout masks and shuffling.
    pub seed: u64,
    /// Word dropout: the probability of replacing each source and decoder-input token by UNK
    /// (see [`Batch::drop_words`]); absent in checkpoints written before the option, meaning 0.
    #[serde(default)]
    pub word_dropout: f64,
    /// A linear cool-down of the learning rate to zero at the end of the run (absent in
    /// checkpoints written before the option, meaning none).
    #[serde(default)]
    pub cooldown: Option<Cooldown>,
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
        }
    }
}

/// One training pair in token ids, without specials.
#[derive(Clone, Debug, PartialEq)]
pub struct Example {
    pub src: Vec<u32>,
    pub tgt: Vec<u32>,
}

/// Where a run stands: saved as `trainer_state.json` so a resumed run continues identically.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Updates applied so far.
    pub step: u64,
    /// The dropout generator.
    pub rng: Rng,
    /// Position in the shuffled batch order.
    pub order: BatchOrder,
    pub config: TrainConfig,
    /// A fingerprint of the training data, to refuse resuming on different data.
    pub data_fingerprint: u64,
}

/// What one update did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepReport {
    pub step: u64,
    pub epoch: u64,
    /// Mean label-smoothed loss per target token.
    pub loss: f64,
    /// Mean negative log-likelihood per target token.
    pub nll: f64,
    pub lr: f64,
    /// Real source + target tokens processed.
    pub tokens: usize,
    /// Global gradient norm before clipping (when clipping is on).
    pub grad_norm: Option<f64>,
}

/// A model, its optimizer and its data, stepping through the recipe.
pub struct Trainer {
    pub model: Seq2Seq<f32>,
    pub adam: Adam<f32>,
    pub schedule: NoamSchedule,
    pub state: TrainerState,
    examples: Vec<Example>,
    batches: Vec<Vec<usize>>,
    /// The replica training on the second half of each batch (when on).
    parallel: DataParallel<Seq2Seq<f32>>,
}

/// FNV-1a over the token ids of all examples.
fn fingerprint(examples: &[Example]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut eat = |x: u64| {
        h ^= x;
        h = h.wrapping_mul(0x100_0000_01b3);
    };
    for e in examples {
        eat(e.src.len() as u64);
        e.src.iter().for_each(|&t| eat(t as u64));
        eat(e.tgt.len() as u64);
        e.tgt.iter().for_each(|&t| eat(t as u64));
    }
    h
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

impl Trainer {
    /// A fresh run: the model is initialised from `config.seed`.
    pub fn new(
        model_config: ModelConfig,
        config: TrainConfig,
        examples: Vec<Example>,
    ) -> Result<Self> {
        model_config.validate().map_err(Error::Config)?;
        check_examples(&examples, &model_config)?;
        let mut rng = Rng::new(config.seed);
        let mut model = Seq2Seq::new(model_config, &mut rng);
        let adam = Adam::new(config.adam, &model.params_mut());
        let state = TrainerState {
            step: 0,
            rng,
            order: BatchOrder::new(config.seed),
            data_fingerprint: fingerprint(&examples),
            config,
        };
        Ok(Self::assemble(model, adam, state, examples))
    }

    /// Continues the run saved in `dir` on the same `examples`.
    pub fn resume(dir: &Path, examples: Vec<Example>) -> Result<Self> {
        let mut model = model_checkpoint::load_model(dir)?;
        let path = dir.join(store::TRAINER_STATE_FILE);
        let bytes = store::read_file(&path)?;
        let state: TrainerState =
            serde_json::from_slice(&bytes).map_err(|e| Error::Checkpoint {
                path: path.clone(),
                reason: format!("invalid trainer state: {e}"),
            })?;
        check_examples(&examples, &model.config)?;
        if state.data_fingerprint != fingerprint(&examples) {
            return Err(Error::Checkpoint {
                path,
                reason: "the training data differ from the data this run started on".into(),
            });
        }
        let mut adam = Adam::new(state.config.adam, &model.params_mut());
        adam.step = state.step;
        checkpoint::load_optimizer(dir, &mut model, &mut adam)?;
        Ok(Self::assemble(model, adam, state, examples))
    }

    fn assemble(
        model: Seq2Seq<f32>,
        adam: Adam<f32>,
        state: TrainerState,
        examples: Vec<Example>,
    ) -> Self {
        let lengths: Vec<(usize, usize)> = examples
            .iter()
            .map(|e| (e.src.len() + 1, e.tgt.len() + 1))
            .collect();
        let batches = batch_by_tokens(&lengths, state.config.tokens_per_batch);
        let schedule = NoamSchedule {
            d_model: model.config.d_model,
            warmup: state.config.warmup,
            factor: state.config.lr_factor,
            cooldown: state.config.cooldown,
        };
        Trainer {
            parallel: DataParallel::for_pool(&model),
            model,
            adam,
            schedule,
            state,
            examples,
            batches,
        }
    }

    /// Replaces the learning-rate cool-down (saved with the next checkpoint).
    pub fn set_cooldown(&mut self, cooldown: Option<Cooldown>) {
        self.state.config.cooldown = cooldown;
        self.schedule.cooldown = cooldown;
    }

    /// Data parallelism on or off (see `train::data_parallel`); on by default when the
    /// thread pool has more than one thread.
    pub fn set_data_parallel(&mut self, on: bool) {
        self.parallel = DataParallel::new(&self.model, on);
    }

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

    /// One update: `accumulate` batches forward and backward (each split in two halves that run
    /// concurrently under data parallelism), then Adam.
    pub fn step(&mut self) -> Result<StepReport> {
        let accumulate = self.state.config.accumulate.max(1);
        let n_parts = self.parallel.parts();
        // Each accumulated batch in parts (halves by pairs), word dropout drawn in order.
        let batches: Vec<Vec<Batch>> = (0..accumulate)
            .map(|_| {
                let (b, _) = self.state.order.next(self.batches.len());
                let indices = self.batches[b].clone();
                split(&indices, n_parts)
                    .map(|part| {
                        let mut batch = self.make_batch(part);
                        batch.drop_words(self.state.config.word_dropout, &mut self.state.rng);
                        batch
                    })
                    .collect()
            })
            .collect();
        let all = || batches.iter().flatten();
        let n_tgt: usize = all().map(Batch::n_tgt_tokens).sum();
        let tokens: usize = all().map(|b| b.n_src_tokens() + b.n_tgt_tokens()).sum();
        // The replica starts from the model's weights (copied here, not after the update, so
        // that a change made to the public `model` between steps reaches it too).
        self.parallel.sync_weights(&mut self.model);
        self.model.zero_grads();
        let mut stats = LossStats::default();
        // The loss is the mean over every target token of the update.
        let grad_scale = 1.0 / n_tgt as f64;
        let smoothing = self.state.config.label_smoothing;
        for parts in &batches {
            stats.add(self.parallel.forward_backward(
                &mut self.model,
                parts,
                smoothing,
                grad_scale,
                &mut self.state.rng,
            ));
        }
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
        Ok(StepReport {
            step,
            epoch: self.state.order.epoch,
            loss: stats.loss(),
            nll: stats.nll(),
            lr,
            tokens,
            grad_norm,
        })
    }

    /// Writes a full checkpoint (model, optimizer, trainer state) into `dir`. The trainer state
    /// is written last, so a directory with it is complete.
    pub fn save(&mut self, dir: &Path) -> Result<()> {
        model_checkpoint::save_model(dir, &mut self.model)?;
        checkpoint::save_optimizer(dir, &mut self.model, &self.adam)?;
        let state = serde_json::to_string_pretty(&self.state).expect("trainer state serialises");
        store::write_atomic(&dir.join(store::TRAINER_STATE_FILE), state.as_bytes())
    }

    /// Mean loss and NLL per token over `examples` without dropout, batched by tokens.
    pub fn evaluate(&self, examples: &[Example]) -> LossStats {
        evaluate(
            &self.model,
            examples,
            self.state.config.tokens_per_batch,
            self.state.config.label_smoothing,
        )
    }
}

/// Loss sums of `model` over `examples` without dropout, batched by `tokens_per_batch`.
pub fn evaluate(
    model: &Seq2Seq<f32>,
    examples: &[Example],
    tokens_per_batch: usize,
    label_smoothing: f64,
) -> LossStats {
    let lengths: Vec<(usize, usize)> = examples
        .iter()
        .map(|e| (e.src.len() + 1, e.tgt.len() + 1))
        .collect();
    let mut stats = LossStats::default();
    for indices in batch_by_tokens(&lengths, tokens_per_batch) {
        let pairs: Vec<(&[u32], &[u32])> = indices
            .iter()
            .map(|&i| (&examples[i].src[..], &examples[i].tgt[..]))
            .collect();
        stats.add(model.evaluate(&Batch::from_pairs(&pairs), label_smoothing));
    }
    stats
}
