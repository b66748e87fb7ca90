//! The training recipe: loss, optimizer, schedule, batching, the loop and checkpoints.

pub mod adam;
pub mod average;
pub mod batching;
pub mod checkpoint;
pub mod data_parallel;
pub mod lm_trainer;
pub mod loss;
pub mod schedule;
pub mod trainer;
