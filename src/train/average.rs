//! Checkpoint averaging (section 6.1: "we used a single model obtained by averaging the last 5
//! checkpoints"): every parameter becomes the mean of its values across checkpoints.

use crate::error::{Error, Result};
use crate::model::checkpoint::{load, load_config_of};
use crate::model::Model;
use serde::de::DeserializeOwned;
use std::path::PathBuf;

/// Loads the models in `dirs` (same config required) and returns their parameter average.
/// The sum runs in f64 in the order given, then rounds once to f32. Any model kept in a
/// directory of ours: the translator, the language model.
// Used by the binary (feature `cli`) and outside the library (feature `internals`).
#[cfg_attr(not(any(feature = "cli", feature = "internals")), allow(dead_code))]
pub fn average_checkpoints<M: Model>(dirs: &[PathBuf]) -> Result<M>
where
    M::Config: DeserializeOwned + PartialEq,
{
    let first = dirs
        .first()
        .ok_or_else(|| Error::Input("no checkpoints to average".into()))?;
    let config = load_config_of::<M>(first)?;
    let mut sums: Option<Vec<Vec<f64>>> = None;
    for dir in dirs {
        let other = load_config_of::<M>(dir)?;
        if other != config {
            return Err(Error::Checkpoint {
                path: dir.join(crate::store::CONFIG_FILE),
                reason: format!(
                    "config differs from {}: checkpoints of different models cannot be averaged",
                    first.join(crate::store::CONFIG_FILE).display()
                ),
            });
        }
        let mut model: M = load(dir)?;
        let params = model.params_mut();
        let sums = sums.get_or_insert_with(|| {
            params
                .iter()
                .map(|(_, p)| vec![0.0; p.value.len()])
                .collect()
        });
        for (sum, (_, p)) in sums.iter_mut().zip(&params) {
            for (s, &v) in sum.iter_mut().zip(&p.value.data) {
                *s += v as f64;
            }
        }
    }
    let sums = sums.expect("at least one checkpoint");
    let mut averaged: M = load(first)?;
    let n = dirs.len() as f64;
    for (sum, (_, p)) in sums.iter().zip(averaged.params_mut()) {
        for (v, &s) in p.value.data.iter_mut().zip(sum) {
            *v = (s / n) as f32;
        }
    }
    Ok(averaged)
}
