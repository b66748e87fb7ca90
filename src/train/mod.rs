//! The training recipe: loss, optimizer, schedule, batching, the loop and checkpoints.

pub mod batching;
pub mod loss;
