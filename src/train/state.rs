//! Where a run stands, saved as `trainer_state.json` so that a resumed run continues
//! identically: the update count, the generator, the position in the data (for sources that
//! walk it in order), the recipe and a fingerprint of the training data.
//!
//! The file's layout is fixed by the checkpoints already written: for the encoder-decoder
//! `{"step", "rng", "order", "config", "data_fingerprint"}`, for the language model the same
//! without `"order"`; `config` is the shape's recipe (`TrainConfig`, `LmTrainConfig`).

use crate::error::{Error, Result};
use crate::rng::Rng;
use crate::store;
use crate::train::batching::BatchOrder;
use crate::train::source::{Recipe, MAX_STEP};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The trainer's state for a recipe of type `R`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainerState<R> {
    /// Updates applied so far.
    pub step: u64,
    /// The run's generator: dropout masks, word dropout, sampled windows.
    pub rng: Rng,
    /// Position in the shuffled batch order, for sources that keep one (sentence pairs);
    /// absent from the file otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<BatchOrder>,
    /// The recipe (saved with every checkpoint).
    pub config: R,
    /// A fingerprint of the training data ([`Fnv1a`]), to refuse resuming on different data.
    pub data_fingerprint: u64,
}

impl<R: Recipe> TrainerState<R> {
    /// Reads `dir/trainer_state.json`; see [`TrainerState::from_bytes`].
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join(store::TRAINER_STATE_FILE);
        Self::from_bytes(&store::read_file(&path)?, &path)
    }

    /// Parses and checks the bytes of a `trainer_state.json` read from `path`: the recipe with
    /// the command line's rules ([`Recipe::validate`]), the step count and epoch within range,
    /// a generator that is not stuck at zero. A leading UTF-8 byte order mark is accepted.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self> {
        let bad = |reason: String| Error::Checkpoint {
            path: path.to_path_buf(),
            reason,
        };
        let state: Self = serde_json::from_slice(store::strip_bom(bytes))
            .map_err(|e| bad(format!("invalid trainer state: {e}")))?;
        state.config.validate().map_err(|e| {
            bad(format!(
                "config.{} {} (the recipe is checked with the command line's rules)",
                e.field, e.reason
            ))
        })?;
        if state.step > MAX_STEP {
            return Err(bad(format!(
                "step {} is beyond the supported {MAX_STEP}",
                state.step
            )));
        }
        if let Some(o) = state.order.as_ref().filter(|o| o.epoch > MAX_STEP) {
            return Err(bad(format!(
                "order.epoch {} is beyond the supported {MAX_STEP}",
                o.epoch
            )));
        }
        if state.rng.is_degenerate() {
            return Err(bad(
                "rng: the generator's state is all zeros (it would draw 0 forever)".into(),
            ));
        }
        Ok(state)
    }

    /// The file's bytes (pretty-printed JSON).
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_string_pretty(self)
            .expect("trainer state serialises")
            .into_bytes()
    }

    /// Stages `trainer_state.json` in a save.
    pub fn write(&self, writer: &mut store::CheckpointWriter) -> Result<()> {
        writer.add(store::TRAINER_STATE_FILE, &self.to_bytes())
    }
}

/// The 64-bit FNV-1a hash the data fingerprints are made of: for each value `x` fed,
/// `h = (h ^ x) · 0x100000001b3` (wrapping), from `h = 0xcbf29ce484222325`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv1a {
    /// Mixes in one value.
    pub fn eat(&mut self, x: u64) {
        self.0 ^= x;
        self.0 = self.0.wrapping_mul(0x100_0000_01b3);
    }

    /// The hash of everything fed so far.
    pub fn value(&self) -> u64 {
        self.0
    }

    /// A token stream's fingerprint: the hash of its ids, xor-ed with their count.
    pub fn of_tokens(tokens: &[u32]) -> u64 {
        let mut h = Fnv1a::default();
        tokens.iter().for_each(|&t| h.eat(t as u64));
        h.value() ^ tokens.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::pairs::TrainConfig;
    use crate::train::windows::LmTrainConfig;

    /// Both layouts read and write back byte for byte: with `order` for sentence pairs, without
    /// it for the language model (tests/cli_checkpoints.rs checks whole files from runs).
    #[test]
    fn both_layouts_round_trip_byte_for_byte() {
        let rng = r#""rng": {
    "inner": {
      "s": [
        1,
        2,
        3,
        4
      ]
    }
  },"#;
        let adam = r#""adam": {
      "beta1": 0.9,
      "beta2": 0.98,
      "eps": 1e-9
    },"#;
        let pairs = format!(
            r#"{{
  "step": 7,
  {rng}
  "order": {{
    "seed": 3,
    "epoch": 2,
    "position": 5
  }},
  "config": {{
    "label_smoothing": 0.1,
    "warmup": 4000,
    "lr_factor": 0.5,
    "tokens_per_batch": 2000,
    "accumulate": 1,
    "clip_norm": null,
    {adam}
    "seed": 3,
    "word_dropout": 0.0,
    "cooldown": null
  }},
  "data_fingerprint": 18446744073709551615
}}"#
        );
        let state: TrainerState<TrainConfig> = serde_json::from_str(&pairs).unwrap();
        assert_eq!(state.order.as_ref().map(|o| o.position), Some(5));
        assert_eq!(state.data_fingerprint, u64::MAX);
        assert_eq!(serde_json::to_string_pretty(&state).unwrap(), pairs);
        let lm = format!(
            r#"{{
  "step": 7,
  {rng}
  "config": {{
    "context": 64,
    "batch": 8,
    "lr": 0.0005,
    "warmup": 200,
    "total_steps": 80,
    "min_lr_ratio": 0.1,
    "clip_norm": 1.0,
    "label_smoothing": 0.0,
    {adam}
    "seed": 1
  }},
  "data_fingerprint": 12
}}"#
        );
        let state: TrainerState<LmTrainConfig> = serde_json::from_str(&lm).unwrap();
        assert_eq!(state.order, None);
        assert_eq!(serde_json::to_string_pretty(&state).unwrap(), lm);
    }

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        // FNV-1a 64 of "" and of "a" (one byte fed as a value).
        assert_eq!(Fnv1a::default().value(), 0xcbf2_9ce4_8422_2325);
        let mut h = Fnv1a::default();
        h.eat(b'a' as u64);
        assert_eq!(h.value(), 0xaf63_dc4c_8601_ec8c);
    }
}
