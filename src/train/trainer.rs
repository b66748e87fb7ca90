//! The training step, one for both model shapes: an update's batches from a [`BatchSource`],
//! forward and backward with dropout (each batch in two halves on the model and a replica under
//! data parallelism), gradients summed over the update and scaled to the mean over its target
//! tokens, optional clipping, then Adam at the [`Schedule`]'s rate; and checkpoints (model,
//! Adam's moments, [`TrainerState`]) from which a run resumes bit for bit at the same thread
//! count.

use crate::dist::{all_ok, broadcast_vec, Communicator, SingleProcess};
use crate::error::{Error, Result};
use crate::kernels::lowp::bf16_train::Bf16Kernel;
use crate::model::checkpoint as model_checkpoint;
use crate::model::loss::LossStats;
use crate::model::param::{count_params, ShapesOnly};
use crate::model::{LanguageModel, ModelConfig, Seq2Seq};
use crate::rng::Rng;
use crate::store;
use crate::train::adam::{guarded_update, Adam};
use crate::train::checkpoint;
use crate::train::data_parallel::DataParallel;
use crate::train::distributed::{
    all_reduce_grads, all_reduce_stats, broadcast_values, broadcast_vecs, shard,
};
use crate::train::model::Trainable;
use crate::train::pairs::PairBatches;
use crate::train::schedule::{Cooldown, Schedule};
use crate::train::source::{BatchSource, Recipe};
use crate::train::state::TrainerState;
use crate::train::windows::TokenWindows;
use std::borrow::Borrow;
use std::path::Path;
use std::sync::Arc;

/// The largest model a run trains (2³¹ parameters: 8 GiB of weights, 32 GiB with gradients
/// and Adam's moments).
pub const MAX_PARAMS: usize = 1 << 31;

/// The encoder-decoder on sentence pairs.
pub type PairTrainer = Trainer<Seq2Seq<f32>, PairBatches>;
/// The decoder-only language model on a token stream.
pub type LmTrainer = Trainer<LanguageModel<f32>, TokenWindows>;

/// The shape of a model's config (the config itself, or the encoder a classifier's holds).
fn shape_of<M: Trainable>(config: &M::Config) -> &ModelConfig {
    config.borrow()
}

/// What one update did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepReport {
    /// The update's number: updates made so far, this one included.
    pub step: u64,
    /// The epoch the batch order is in after the update (sources that keep an order).
    pub epoch: Option<u64>,
    /// Mean label-smoothed loss per target token.
    pub loss: f64,
    /// Mean negative log-likelihood per target token.
    pub nll: f64,
    /// The learning rate of this update.
    pub lr: f64,
    /// Tokens processed (see `crate::train::source::Update::tokens`).
    pub tokens: usize,
    /// Global gradient norm before clipping (when clipping is on).
    pub grad_norm: Option<f64>,
}

/// A model, its optimizer and its data, stepping through the recipe.
pub struct Trainer<M, S: BatchSource> {
    pub model: M,
    pub adam: Adam<f32>,
    pub schedule: Schedule,
    pub state: TrainerState<S::Recipe>,
    source: S,
    /// The replica training on the second part of each batch (when on).
    parallel: DataParallel<M>,
    /// The processes of the run (see `train::distributed`); one by default.
    comm: Arc<dyn Communicator>,
    /// The gradients of all parameters in one buffer, for the all-reduce (distributed only).
    flat_grads: Vec<f32>,
    /// How the products are multiplied when the recipe's precision is bf16.
    bf16_kernel: Bf16Kernel,
}

impl<M, S> Trainer<M, S>
where
    M: Trainable,
    S: BatchSource<Part = M::Part>,
{
    /// A fresh run: the model is initialised from the recipe's seed, whose generator then
    /// draws the run's dropout (and windows).
    pub fn new(model_config: M::Config, recipe: S::Recipe, data: S::Data) -> Result<Self> {
        let shape = shape_of::<M>(&model_config);
        shape.validate().map_err(Error::Config)?;
        shape.check_trainable().map_err(Error::Config)?;
        recipe
            .validate()
            .map_err(|e| Error::Config(e.to_string()))?;
        // Count before allocating: a config of huge sizes is an error, not an OOM.
        match count_params(&mut M::build(model_config.clone(), &mut ShapesOnly)) {
            Some(n) if n <= MAX_PARAMS => {}
            n => {
                return Err(Error::Config(format!(
                    "the model would have {} parameters, more than the supported {MAX_PARAMS}",
                    n.map_or("too many".to_string(), |n| n.to_string())
                )))
            }
        }
        let source = S::new(data, &recipe, shape_of::<M>(&model_config))?;
        let mut rng = Rng::new(recipe.seed());
        let mut model = M::build(model_config, &mut rng);
        let adam = Adam::new(recipe.adam(), &model.params_mut());
        let state = TrainerState {
            step: 0,
            rng,
            order: S::start(&recipe),
            data_fingerprint: source.fingerprint(),
            config: recipe,
        };
        Ok(Self::assemble(model, adam, state, source))
    }

    /// Continues the run saved in `dir` on the same data. Every file is checked against the
    /// directory's manifest, and the manifest must not change while they are read: model,
    /// optimizer and state always come from one save.
    pub fn resume(dir: &Path, data: S::Data) -> Result<Self> {
        let manifest = || -> Result<_> { Ok(store::atomic::manifest_in_force(dir)?.map(|m| m.0)) };
        let before = manifest()?;
        let trainer = Self::resume_from(dir, data)?;
        if manifest()? != before {
            return Err(Error::Checkpoint {
                path: dir.to_path_buf(),
                reason: "was saved into while it was read (another run writes there); try again"
                    .into(),
            });
        }
        Ok(trainer)
    }

    fn resume_from(dir: &Path, data: S::Data) -> Result<Self> {
        let mut model: M = model_checkpoint::load(dir)?;
        shape_of::<M>(model.config())
            .check_trainable()
            .map_err(Error::Config)?;
        let state = TrainerState::<S::Recipe>::load(dir)?;
        let path = dir.join(store::TRAINER_STATE_FILE);
        if state.order.is_some() != S::start(&state.config).is_some() {
            return Err(Error::Checkpoint {
                path,
                reason: "the trainer state is for another kind of training data".into(),
            });
        }
        let source = S::new(data, &state.config, shape_of::<M>(model.config()))?;
        if state.data_fingerprint != source.fingerprint() {
            return Err(Error::Checkpoint {
                path,
                reason: "the training data differ from the data this run started on".into(),
            });
        }
        let mut adam = Adam::new(state.config.adam(), &model.params_mut());
        adam.step = state.step;
        checkpoint::load_optimizer_params(dir, &model.params_mut(), &mut adam)?;
        Ok(Self::assemble(model, adam, state, source))
    }

    fn assemble(model: M, adam: Adam<f32>, state: TrainerState<S::Recipe>, source: S) -> Self {
        let mut trainer = Trainer {
            schedule: state.config.schedule(shape_of::<M>(model.config()).d_model),
            parallel: DataParallel::for_pool(&model),
            model,
            adam,
            state,
            source,
            comm: Arc::new(SingleProcess),
            flat_grads: Vec::new(),
            bf16_kernel: Bf16Kernel::default(),
        };
        trainer.apply_precision();
        trainer
    }

    /// The training data.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// The processes this trainer trains with.
    pub fn communicator(&self) -> &dyn Communicator {
        &*self.comm
    }

    /// Trains with the processes of `comm` from now on (a collective: every rank calls it):
    /// rank 0's parameters, Adam moments and trainer state (step, generator, batch order,
    /// recipe) replace every other rank's. Fails on every rank when the ranks' models differ in
    /// shape or their training data differ (their fingerprints).
    pub fn set_communicator(&mut self, comm: Arc<dyn Communicator>) -> Result<()> {
        self.comm = comm;
        let comm = &*self.comm;
        if comm.size() == 1 {
            return Ok(());
        }
        let mine = serde_json::to_vec(self.model.config()).unwrap_or_default();
        let mut root = mine.clone();
        broadcast_vec(comm, &mut root);
        if !all_ok(comm, root == mine) {
            return Err(Error::Distributed(
                "the ranks' models differ: give every rank the same options (and with --resume \
                 the same checkpoint)"
                    .into(),
            ));
        }
        broadcast_values(comm, &mut self.model.params_mut());
        broadcast_vecs(comm, &mut self.adam.m);
        broadcast_vecs(comm, &mut self.adam.v);
        let mut bytes = self.state.to_bytes();
        broadcast_vec(comm, &mut bytes);
        let state =
            TrainerState::<S::Recipe>::from_bytes(&bytes, Path::new("<rank 0's trainer state>"))?;
        if !all_ok(comm, state.data_fingerprint == self.source.fingerprint()) {
            return Err(Error::Distributed(
                "the ranks' training data differ: every rank must read the same files (the same \
                 corpus at the same path on every machine)"
                    .into(),
            ));
        }
        self.adam.step = state.step;
        self.schedule = state.config.schedule(shape_of::<M>(self.model.config()).d_model);
        self.state = state;
        self.apply_precision();
        Ok(())
    }

    /// Multiplies with `kernel` when the recipe's precision is bf16 (the default:
    /// [`Bf16Kernel::Gemm`]). Not saved: the kernels differ in the order of the f32 sums, so a
    /// run resumed with another kernel does not continue bit for bit.
    pub fn set_bf16_kernel(&mut self, kernel: Bf16Kernel) {
        self.bf16_kernel = kernel;
        self.apply_precision();
    }

    /// Sets the recipe's precision (and the bf16 kernel) on the model and its replica.
    fn apply_precision(&mut self) {
        let kernel = (self.state.config.precision().bf16_products()).then_some(self.bf16_kernel);
        self.model.set_bf16_products(kernel);
        self.parallel.for_replica(|r| r.set_bf16_products(kernel));
    }

    /// Data parallelism on or off (see `train::data_parallel`); on by default when the
    /// thread pool has more than one thread.
    pub fn set_data_parallel(&mut self, on: bool) {
        self.parallel = DataParallel::new(&self.model, on);
    }

    /// One update: the source's batches forward and backward (each split in two parts that run
    /// concurrently under data parallelism), then Adam.
    pub fn step(&mut self) -> Result<StepReport> {
        // Each rank's own parts, and those of the whole update over all ranks.
        let local = self.parallel.parts();
        let (rank, ranks) = (self.comm.rank(), self.comm.size());
        let mut update = self.source.next(
            &self.state.config,
            &mut self.state.order,
            &mut self.state.rng,
            local * ranks,
        );
        // The replica starts from the model's weights (copied here, not after the update, so
        // that a change made to the public `model` between steps reaches it too).
        self.parallel.sync_weights(&mut self.model);
        self.model.zero_grads();
        // The loss is the mean over every target token of the update.
        let grad_scale = 1.0 / update.targets as f64;
        let smoothing = self.state.config.label_smoothing();
        let rng = match update.dropout_rng.as_mut() {
            Some(own) => own,
            None => &mut self.state.rng,
        };
        let mut stats = LossStats::default();
        for batch in &update.batches {
            if ranks == 1 {
                stats.add(self.parallel.forward_backward(
                    &mut self.model,
                    batch,
                    smoothing,
                    grad_scale,
                    rng,
                ));
            } else {
                // A generator for every part of every rank, so that all ranks stay in step.
                let mut rngs: Vec<Rng> = batch.iter().map(|_| rng.fork()).collect();
                let mine = shard(batch.len(), rank, local);
                stats.add(self.parallel.run_forked(
                    &mut self.model,
                    &batch[mine.clone()],
                    &mut rngs[mine],
                    |m, part, rng| m.forward_backward(part, smoothing, grad_scale, rng),
                ));
            }
        }
        self.parallel.gather_grads(&mut self.model);
        if ranks > 1 {
            all_reduce_grads(
                &*self.comm,
                &mut self.model.params_mut(),
                &mut self.flat_grads,
            );
            stats = all_reduce_stats(&*self.comm, stats);
        }
        let step = self.state.step + 1;
        let lr = self.schedule.lr(step);
        let grad_norm = guarded_update(
            &mut self.adam,
            &mut self.model.params_mut(),
            self.state.config.clip_norm(),
            lr,
            step,
            stats.loss(),
        )?;
        self.state.step = step;
        Ok(StepReport {
            step,
            epoch: self.state.order.as_ref().map(|o| o.epoch),
            loss: stats.loss(),
            nll: stats.nll(),
            lr,
            tokens: update.tokens,
            grad_norm,
        })
    }

    /// Saves a full checkpoint (model, optimizer, trainer state) as the checkpoint of `dir`,
    /// all or nothing (see [`crate::store::atomic`]).
    pub fn save(&mut self, dir: &Path) -> Result<()> {
        let mut writer = store::CheckpointWriter::begin(dir)?;
        self.write(&mut writer)?;
        writer.commit()
    }

    /// Stages the model, the optimizer and the trainer state in a save; nothing is staged
    /// when a weight or a moment is not finite (an error naming it).
    pub fn write(&mut self, writer: &mut store::CheckpointWriter) -> Result<()> {
        model_checkpoint::write_model(writer, &mut self.model)?;
        checkpoint::write_optimizer_params(writer, &self.model.params_mut(), &self.adam)?;
        self.state.write(writer)
    }
}

impl<M> Trainer<M, PairBatches>
where
    M: Trainable<Part = crate::batch::Batch>,
{
    /// Replaces the learning-rate cool-down (saved with the next checkpoint).
    pub fn set_cooldown(&mut self, cooldown: Option<Cooldown>) {
        self.state.config.cooldown = cooldown;
        self.schedule.cooldown = cooldown;
    }
}
