//! The training recipe: optimizer, schedule, batching, the loop and its checkpoints.

pub mod adam;
pub mod average;
pub mod batching;
pub mod checkpoint;
pub mod data_parallel;
pub mod lm_trainer;
pub mod schedule;
pub mod trainer;
