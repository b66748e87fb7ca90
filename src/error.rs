//! The library's error type: every message names the file or value at fault.

use std::path::PathBuf;

/// Everything that can go wrong in the library, as a clear message.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A text, corpus, vocabulary or tokenizer that cannot be read or used.
    #[error(transparent)]
    Text(#[from] crate::text::TextError),
    /// A checkpoint file that is missing, truncated, corrupt or does not match the config.
    #[error("checkpoint {path}: {reason}")]
    Checkpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A configuration value the model cannot use.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The loss became NaN or infinite: training stops before anything is saved.
    #[error("training diverged at step {step}: loss is {loss} (try a lower learning rate or gradient clipping)")]
    NonFiniteLoss {
        /// The update whose loss it was.
        step: u64,
        /// The loss: NaN or an infinity.
        loss: f64,
    },
    /// A tensor to be saved holds NaN or an infinity: nothing is saved, the directory keeps
    /// its last checkpoint.
    #[error("not saved to {path}: tensor {tensor} holds {value} at index {index} (not finite: training diverged; the last checkpoint saved there is kept)")]
    NotFinite {
        /// The directory the save was for.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// The element's index in the flat tensor.
        index: usize,
        /// The value found there.
        value: f32,
    },
    /// Training diverged: the run stopped, and what was saved last is kept.
    #[error("{reason}; the run stopped at step {step}, {kept}")]
    Diverged {
        /// The update at which it diverged.
        step: u64,
        /// What was not finite (the message of the error that stopped it).
        reason: String,
        /// Which checkpoint is kept (the last one the run saved, or none).
        kept: String,
    },
    /// The processes of a distributed run disagree (data, model) or cannot start.
    #[error("distributed training: {0}")]
    Distributed(String),
    /// A device (`--device`) that cannot run the model or failed while running it.
    #[error(transparent)]
    Device(#[from] crate::backend::DeviceError),
    /// Input that cannot be used (an over-long sentence, an empty data set, ...).
    #[error("{0}")]
    Input(String),
    /// The cause is part of the message (not a separate `source`), so it prints once.
    #[error("cannot write {path}: {cause}")]
    Write {
        /// The file concerned.
        path: PathBuf,
        /// The operating system's error.
        cause: std::io::Error,
    },
}

/// The library's result type.
pub type Result<T> = std::result::Result<T, Error>;
