//! The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), with hand-written
//! gradients, the paper's training recipe and its inference, on the CPU.
//!
//! Data flows one way: text -> tokens (`text`) -> batches (`batch`, `train::batching`) ->
//! model (`model`) -> loss and gradients (`model::loss`) -> optimizer (`train::adam`);
//! model -> search (`decode`) -> text. The model computes through one interface, `backend`
//! (its host implementation runs `kernels`). Those modules are the crate's internals (below).
//!
//! # Use as a library
//!
//! The public API is what this page lists: the names at the crate root and in [`prelude`], the
//! pipelines' module ([`pipeline`]), the training entry points ([`training`]), the pictures
//! ([`viz`], feature `viz`) and the one error type ([`Error`], [`Result`], module [`error`]):
//! - the pipelines that load a model and run a whole task: [`Translator`], [`TextGenerator`]
//!   with [`ChatMessage`] and [`ChatTemplate`], [`SentenceEncoder`], [`generate_ids`];
//! - their options: [`GreedyOptions`], [`BeamOptions`], [`SamplingOptions`], [`Precision`],
//!   [`ModelPrecision`];
//! - the models and their configs: [`LanguageModel`], [`Seq2Seq`], [`ModelConfig`] and the
//!   types of its fields ([`NormPlacement`], [`Activation`], [`Normalization`], [`Positions`],
//!   [`RopeStyle`], [`RopeScaling`]);
//! - the tokenizers: [`Vocab`], [`Bpe`], [`DecoderTokenizer`], [`StreamDecoder`];
//! - training: [`training::run`] with the setups of [`training::pairs`] and [`training::lm`];
//! - the server (feature `serve`): [`Server`] started with a [`ServeConfig`].
//!
//! ```no_run
//! use transformer::prelude::*;
//! # fn main() -> transformer::Result<()> {
//! let encoder = SentenceEncoder::load("../shared/models/all-MiniLM-L6-v2".as_ref(), None)?;
//! let vectors = encoder.embed(&["A sentence.".to_string()], 32)?; // [1][384], L2-normalised
//! # Ok(()) }
//! ```
//!
//! With `default-features = false` the crate is the models, tokenizers, decoding and training
//! only; the features add the rest (`serve`, `cli` and `viz` are on by default, as the binary
//! needs them):
//! - `viz`: training curves and attention heat maps (the module [`viz`], plotters);
//! - `serve`: the HTTP server and its load test ([`Server`], tokio and axum; implies `viz`);
//! - `cli`: the binary's command modules (clap and progress bars; implies both);
//! - `mpi`: data parallelism across processes (off by default; needs an MPI library);
//! - `internals`: exposes the layers, kernels and readers (the modules `model`, `kernels`,
//!   `text`, `store`, `train`, ...) for this crate's own tests, benchmarks, fuzz targets and
//!   Python package; not a stable API, and hidden from these docs.
//!
//! Without `internals` those modules are private to the crate: they follow the paper's parts
//! and may change between versions, the names re-exported here less so.

#![warn(missing_docs)]

/// Declares the crate's internal modules: public but hidden with the feature `internals` (for
/// the tests, benchmarks, fuzz targets and the Python package), private to the crate without
/// it. Missing docs are allowed inside them: they are not the public API.
macro_rules! internal_modules {
    ($($(#[$attr:meta])* mod $name:ident;)*) => {$(
        $(#[$attr])*
        #[cfg(feature = "internals")]
        #[doc(hidden)]
        #[allow(missing_docs)]
        pub mod $name;
        $(#[$attr])*
        #[cfg(not(feature = "internals"))]
        pub(crate) mod $name;
    )*};
}

internal_modules! {
    // Used by the binary (feature `cli`) and outside the library (feature `internals`).
    #[cfg_attr(not(any(feature = "cli", feature = "internals")), allow(dead_code))]
    mod alloc;
    mod backend;
    mod batch;
    // The demo's number task: used by the binary (feature `cli`) and outside the library
    // (feature `internals`).
    #[cfg_attr(not(any(feature = "cli", feature = "internals")), allow(dead_code))]
    mod data;
    mod decode;
    mod dist;
    mod eval;
    // `transformer heads` and `prune`: used by the binary (feature `cli`) and outside the
    // library (feature `internals`).
    #[cfg_attr(not(any(feature = "cli", feature = "internals")), allow(dead_code))]
    mod heads;
    mod kernels;
    mod model;
    mod rng;
    mod store;
    mod tensor;
    mod text;
    mod train;
    #[cfg(feature = "serve")]
    mod serve;
}

// The binary's command modules: `src/main.rs` is another crate and reaches them (and through
// them what it needs of the internals), so they stay public, hidden from the docs.
#[cfg(feature = "cli")]
#[doc(hidden)]
#[allow(missing_docs)]
pub mod cli;
pub mod error;
pub mod pipeline;
#[cfg(feature = "viz")]
pub mod viz;

pub use decode::beam::{BeamOptions, BeamStop};
pub use decode::greedy::GreedyOptions;
pub use decode::sample::SamplingOptions;
pub use error::{Error, Result};
pub use kernels::lowp::Precision;
pub use model::attention_kind::AttentionKind;
pub use model::config::{
    Activation, AttentionSite, LayerHeads, NormPlacement, Normalization, Positions, RopeScaling,
    RopeStyle,
};
pub use model::{LanguageModel, ModelConfig, Seq2Seq};
pub use pipeline::chat::{ChatContext, ChatMessage, ChatTemplate};
pub use pipeline::embed::SentenceEncoder;
pub use pipeline::generate::{generate_ids, ModelPrecision, ModelSource, TextGenerator};
pub use pipeline::translate::Translator;
pub use rng::Rng;
#[cfg(feature = "serve")]
pub use serve::{ServeConfig, Server};
pub use tensor::{Float, Tensor};
pub use text::bpe::Bpe;
pub use text::decoder_tokenizer::{DecoderTokenizer, StreamDecoder};
pub use text::vocab::Vocab;
pub use text::TextError;
pub use train::precision::TrainPrecision;

pub mod training {
    //! Training a model from the library: the one training loop ([`run`]) and the setups that
    //! build what it runs, for a translation model on sentence pairs ([`pairs`]) or a
    //! decoder-only language model on a text ([`lm`]), as `transformer train` and
    //! `transformer train-lm` do.

    pub use crate::dist::{world, Communicator, SingleProcess};
    pub use crate::kernels::lowp::bf16_train::Bf16Kernel;
    pub use crate::store::CheckpointWriter;
    pub use crate::text::vocab::VocabLevel;
    pub use crate::train::pairs::TrainConfig;
    pub use crate::train::run::{run, Output, Reporter, RunOptions, RunSummary, Silent};
    pub use crate::train::schedule::Cooldown;
    pub use crate::train::setup::{lm, pairs, Start};
    pub use crate::train::trainer::StepReport;
    pub use crate::train::validate::{ValidReport, Validator};
    pub use crate::train::windows::LmTrainConfig;
}

/// The names most programs need, for `use transformer::prelude::*`: the pipelines, their
/// options, the tokenizers and the error type (not [`Result`], which would shadow the
/// standard one).
pub mod prelude {
    pub use crate::{
        generate_ids, BeamOptions, BeamStop, ChatMessage, DecoderTokenizer, Error, GreedyOptions,
        ModelPrecision, Precision, Rng, SamplingOptions, SentenceEncoder, StreamDecoder,
        TextGenerator, Translator,
    };
}
