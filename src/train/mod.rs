//! The training recipe: optimizer, schedule, data sources, the step, the run and its
//! checkpoints.
//!
//! One trainer serves both model shapes: [`trainer::Trainer`] is generic over the model
//! ([`model::Trainable`]: the encoder-decoder, the decoder-only language model) and its data
//! ([`source::BatchSource`]: sentence pairs batched by token count in [`pairs`], random windows
//! of a token stream in [`windows`]); [`setup`] makes a run of each kind ready, fresh or
//! resumed; [`run::run`] is the loop the `train`, `train-lm` and `demo` commands share.

pub mod adam;
pub mod average;
pub mod batching;
pub mod checkpoint;
// Used by the binary's commands (feature `cli`) and outside the library (feature `internals`).
#[cfg_attr(not(any(feature = "cli", feature = "internals")), allow(dead_code))]
pub mod classify;
pub mod data_parallel;
pub mod distributed;
pub mod metrics;
// Used by the binary's commands (feature `cli`) and outside the library (feature `internals`).
#[cfg_attr(not(any(feature = "cli", feature = "internals")), allow(dead_code))]
pub mod mlm;
pub mod model;
pub mod pairs;
pub mod precision;
pub mod run;
pub mod schedule;
pub mod setup;
pub mod source;
pub mod state;
pub mod trainer;
pub mod validate;
pub mod windows;
