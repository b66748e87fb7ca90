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
use serde::de::DeserializeOwned;
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

impl<R: Serialize + DeserializeOwned> TrainerState<R> {
    /// Reads `dir/trainer_state.json`.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join(store::TRAINER_STATE_FILE);
        let bytes = store::read_file(&path)?;
        serde_json::from_slice(&bytes).map_err(|e| Error::Checkpoint {
            path,
            reason: format!("invalid trainer state: {e}"),
        })
    }

    /// Writes `dir/trainer_state.json` (pretty-printed JSON, through a temporary file).
    pub fn save(&self, dir: &Path) -> Result<()> {
        let json = serde_json::to_string_pretty(self).expect("trainer state serialises");
        store::write_atomic(&dir.join(store::TRAINER_STATE_FILE), json.as_bytes())
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        // FNV-1a 64 of "" and of "a" (one byte fed as a value).
        assert_eq!(Fnv1a::default().value(), 0xcbf2_9ce4_8422_2325);
        let mut h = Fnv1a::default();
        h.eat(b'a' as u64);
        assert_eq!(h.value(), 0xaf63_dc4c_8601_ec8c);
    }
}
