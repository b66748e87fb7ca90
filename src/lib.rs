//! The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), with hand-written
//! gradients, the paper's training recipe and its inference, on the CPU.
//!
//! Data flows one way: text -> tokens ([`text`]) -> batches ([`batch`], [`train::batching`]) ->
//! model ([`model`]) -> loss and gradients ([`model::loss`]) -> optimizer ([`train::adam`]);
//! model -> search ([`decode`]) -> text.
//!
//! # Use as a library
//!
//! The names a program needs are at the crate root and in [`prelude`]: the pipelines that
//! load a model and run a whole task ([`Translator`], [`TextGenerator`] with [`ChatMessage`],
//! [`SentenceEncoder`]), their options ([`GreedyOptions`], [`BeamOptions`],
//! [`SamplingOptions`]), the model configs ([`ModelConfig`]), the tokenizers ([`Vocab`],
//! [`Bpe`], [`DecoderTokenizer`]), training ([`train::run::run`] and its setups) and the one
//! error type ([`Error`], [`Result`]):
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
//! only; the features add the rest (all on by default, as the binary needs them):
//! - `viz`: training curves and attention heat maps (the module `viz`, plotters);
//! - `serve`: the HTTP server and its load test (the module `serve`, tokio and axum; implies `viz`);
//! - `cli`: the binary's command modules (the module `cli`, clap and progress bars; implies both);
//! - `mpi`: data parallelism across processes (off by default; needs an MPI library).
//!
//! The other modules are public so that the tests, benchmarks and fuzz targets can reach the
//! layers and kernels they check; they follow the paper's parts and may change between
//! versions, the names re-exported here less so.

pub mod alloc;
pub mod batch;
#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod cli;
pub mod data;
pub mod decode;
pub mod dist;
pub mod error;
pub mod eval;
pub mod heads;
pub mod rng;
pub mod store;
pub mod tensor;
pub mod text;
pub mod train;

pub use tensor::{Float, Tensor};
pub mod kernels;
pub mod model;
pub mod pipeline;
#[cfg(feature = "serve")]
pub mod serve;
#[cfg(feature = "viz")]
pub mod viz;

pub use decode::beam::{BeamOptions, BeamStop};
pub use decode::greedy::GreedyOptions;
pub use decode::sample::SamplingOptions;
pub use error::{Error, Result};
pub use kernels::lowp::Precision;
pub use model::{LanguageModel, ModelConfig, Seq2Seq};
pub use pipeline::chat::{ChatContext, ChatMessage, ChatTemplate};
pub use pipeline::embed::SentenceEncoder;
pub use pipeline::generate::{generate_ids, ModelPrecision, ModelSource, TextGenerator};
pub use pipeline::translate::Translator;
pub use rng::Rng;
pub use text::bpe::Bpe;
pub use text::decoder_tokenizer::{DecoderTokenizer, StreamDecoder};
pub use text::vocab::Vocab;
pub use train::precision::TrainPrecision;

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
