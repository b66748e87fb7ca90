//! What the language model's engine needs of a model and of the paged key/value memory of its
//! running rows, so that one engine serves the model wherever it runs: on the CPU
//! ([`LanguageModel`] over its per-layer caches, [`LmState`]) or on a device ([`DeviceLm`]
//! over its blocks in the device's memory, [`DeviceLmState`]).
//!
//! A step feeds token `i` to row `rows[i]` at position `positions[i]` (the row's length when
//! fed, a row's tokens in order) and returns the logits `[picked, vocab]` of the tokens
//! `picked`. A device's step can fail (the device was lost, or ran out of memory): the
//! engine then ends its rows with the error and refuses new requests.

use super::EngineConfig;
use crate::backend::{Backend, Device, CPU};
use crate::model::device_lm::{DeviceLm, DeviceLmState, StepOut, Want, BLOCK_SIZE};
use crate::model::lm::LmState;
use crate::model::{LanguageModel, StepLayout};

/// A language model the engine steps (see the module docs).
pub trait PagedLm {
    /// The running rows' keys and values.
    type State: PagedRows;
    /// Entries of each distribution.
    fn vocab_size(&self) -> usize;
    /// The longest sequence a row may hold.
    fn max_len(&self) -> usize;
    /// An empty state whose pool holds `config.pool_blocks` blocks of `config.block_rows`
    /// positions.
    fn start(&self, config: &EngineConfig) -> Result<Self::State, String>;
    /// One step (see the module docs): the logits `[picked.len(), vocab]`.
    fn step_logits(
        &self,
        state: &mut Self::State,
        tokens: &[u32],
        fed_at: (&[usize], &[usize]),
        picked: &[usize],
    ) -> Result<Vec<f32>, String>;
    /// `logits [rows, vocab]` → their log-softmax, in place.
    fn log_softmax_rows(&self, logits: &mut [f32]) {
        CPU.log_softmax_rows(logits, self.vocab_size());
    }
}

/// The running rows' paged memory: row `r` is the engine's running row `r`.
pub trait PagedRows {
    /// Adds an empty row at the end; its index.
    fn add_row(&mut self) -> usize;
    /// Positions row `r` holds.
    fn row_len(&self, r: usize) -> usize;
    /// Keeps the rows `kept` (ascending); the others' blocks return to the pool.
    fn keep_rows(&mut self, kept: &[usize]);
    /// Blocks the rows hold (of `block_rows` positions in every layer).
    fn blocks_in_use(&self) -> usize;
    /// Blocks no row holds, kept for prefix caching.
    fn blocks_kept(&self) -> usize {
        0
    }
    /// The CPU's caches, whose rows can share a prompt's blocks (prefix caching); `None`:
    /// rows cannot share blocks here.
    fn shared_blocks(&mut self) -> Option<&mut LmState<f32>> {
        None
    }
}

impl PagedLm for LanguageModel<f32> {
    type State = LmState<f32>;
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }
    fn max_len(&self) -> usize {
        LanguageModel::max_len(self)
    }
    fn start(&self, config: &EngineConfig) -> Result<LmState<f32>, String> {
        Ok(self.start_paged(config.block_rows))
    }
    fn step_logits(
        &self,
        state: &mut LmState<f32>,
        tokens: &[u32],
        (rows, positions): (&[usize], &[usize]),
        picked: &[usize],
    ) -> Result<Vec<f32>, String> {
        let layout = StepLayout::ragged(rows, positions, picked);
        Ok(LanguageModel::step_logits(self, state, tokens, &layout))
    }
    /// The head's (the same kernel).
    fn log_softmax_rows(&self, logits: &mut [f32]) {
        self.head.log_softmax_rows(logits);
    }
}

impl PagedRows for LmState<f32> {
    fn add_row(&mut self) -> usize {
        LmState::add_row(self)
    }
    fn row_len(&self, r: usize) -> usize {
        LmState::row_len(self, r)
    }
    fn keep_rows(&mut self, kept: &[usize]) {
        self.gather_rows(kept);
    }
    /// Every layer's blocks counted once.
    fn blocks_in_use(&self) -> usize {
        LmState::blocks_in_use(self) / self.caches.len().max(1)
    }
    fn blocks_kept(&self) -> usize {
        self.kept_blocks()
    }
    fn shared_blocks(&mut self) -> Option<&mut LmState<f32>> {
        Some(self)
    }
}

impl<D: Device> PagedLm for DeviceLm<D> {
    type State = DeviceLmState<D>;
    fn vocab_size(&self) -> usize {
        DeviceLm::vocab_size(self)
    }
    fn max_len(&self) -> usize {
        DeviceLm::max_len(self)
    }
    /// The pool allocated in the device's memory now; its blocks hold [`BLOCK_SIZE`]
    /// positions (another `block_rows` is refused).
    fn start(&self, config: &EngineConfig) -> Result<DeviceLmState<D>, String> {
        if config.block_rows != BLOCK_SIZE {
            return Err(format!(
                "a device's key/value blocks hold {BLOCK_SIZE} positions, not {}",
                config.block_rows
            ));
        }
        self.start_pool(config.pool_blocks).map_err(|e| e.to_string())
    }
    fn step_logits(
        &self,
        state: &mut DeviceLmState<D>,
        tokens: &[u32],
        (rows, positions): (&[usize], &[usize]),
        picked: &[usize],
    ) -> Result<Vec<f32>, String> {
        // The device step feeds each row at its own length: the engine's positions are those.
        let mut next: Vec<usize> = (0..state.rows()).map(|r| state.row_len(r)).collect();
        for (&r, &p) in rows.iter().zip(positions) {
            match next.get_mut(r) {
                Some(len) if *len == p => *len += 1,
                _ => return Err(format!("row {r} fed at position {p} out of order")),
            }
        }
        match DeviceLm::step(self, state, tokens, rows, picked, Want::Logits) {
            Ok(StepOut::Logits(logits)) => Ok(logits),
            Ok(StepOut::Ids(_)) => Err("the device step gave ids where logits were asked".into()),
            Err(e) => Err(e.to_string()),
        }
    }
}

impl<D: Device> PagedRows for DeviceLmState<D> {
    fn add_row(&mut self) -> usize {
        DeviceLmState::add_row(self)
    }
    fn row_len(&self, r: usize) -> usize {
        DeviceLmState::row_len(self, r)
    }
    fn keep_rows(&mut self, kept: &[usize]) {
        DeviceLmState::keep_rows(self, kept);
    }
    fn blocks_in_use(&self) -> usize {
        DeviceLmState::blocks_in_use(self)
    }
}
