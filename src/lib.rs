//! The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), with hand-written
//! gradients, the paper's training recipe and its inference, on the CPU.
//!
//! Data flows one way: text -> tokens ([`text`]) -> batches ([`batch`], [`train::batching`]) ->
//! model ([`model`]) -> loss and gradients ([`model::loss`]) -> optimizer ([`train::adam`]);
//! model -> search ([`decode`]) -> text.

pub mod alloc;
pub mod batch;
pub mod cli;
pub mod data;
pub mod decode;
pub mod dist;
pub mod error;
pub mod eval;
pub mod rng;
pub mod store;
pub mod tensor;
pub mod text;
pub mod train;

pub use tensor::{Float, Tensor};
pub mod kernels;
pub mod model;
pub mod pipeline;
pub mod serve;
pub mod viz;
