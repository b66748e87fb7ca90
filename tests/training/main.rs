//! Training and the command line: exact resume, checkpoints and their averaging, data
//! parallelism (in-process and across ranks), bf16 training, pictures, and the CLI's outputs
//! against golden values (`golden`, which reads `tests/golden/*.json`).
//!
//! One test binary (cargo builds `tests/training/main.rs` as the target `training`); each module
//! was its own binary before. Run one module with `cargo test --test training MODULE::`.

#[path = "../common/mod.rs"]
mod common;

mod alloc;
mod average;
mod bf16_training;
mod checkpoint_resume;
mod cli;
mod cli_attention;
mod cli_bpe;
mod cli_checkpoints;
mod cli_classifier;
mod cli_mlm;
mod cli_prune;
mod cli_run;
mod data_parallel;
mod distributed;
mod golden;
mod train_run;
mod viz;
