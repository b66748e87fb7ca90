//! The model: one file per concept of the paper, each layer's forward and backward side by side.
//! Every numeric operation goes through [`crate::backend::Backend`] (today the host's `CPU`):
//! no file here imports the kernels.

pub mod attention;
#[cfg(test)]
mod attention_checks;
pub mod attention_approx;
pub mod attention_sinks;
pub mod attention_kind;
#[cfg(test)]
mod attention_kind_tests;
pub mod attention_step;
pub mod bert;
// Used by the binary's commands (feature `cli`) and outside the library (feature `internals`).
#[cfg_attr(not(any(feature = "cli", feature = "internals")), allow(dead_code))]
pub mod bert_train;
pub mod block;
pub mod build;
pub mod cache_stack;
pub mod checkpoint;
#[cfg_attr(not(any(feature = "cli", feature = "internals")), allow(dead_code))]
pub mod classifier_head;
pub mod config;
pub mod context;
pub mod decoder;
#[cfg(test)]
mod dense_options_tests;
mod device_block;
pub mod device_decode;
mod device_rows;
pub mod device_encoder;
pub mod device_lm;
pub mod device_seq2seq;
#[cfg(test)]
mod device_lm_tests;
pub mod embedding;
pub mod experts;
pub mod encoder;
pub mod families;
pub mod feed_forward;
pub mod gated_delta;
#[cfg(test)]
mod gemma_tests;
pub mod head;
pub mod head_gate;
pub mod kv_cache;
pub mod layer_heads;
pub mod layer_norm;
pub mod linear;
pub mod lm;

pub mod loss;
// Used by the binary's commands (feature `cli`) and outside the library (feature `internals`).
#[cfg_attr(not(any(feature = "cli", feature = "internals")), allow(dead_code))]
pub mod masked_lm;
pub mod mlm_head;
pub mod norm;
pub mod param;
#[cfg(test)]
mod prepare_alone_tests;
#[cfg(test)]
mod qk_norm_tests;
pub mod relative_bias;
pub mod residual;
pub mod rope_scaling;
pub mod seq2seq;
pub mod seq2seq_ragged;
#[cfg_attr(not(any(feature = "cli", feature = "internals")), allow(dead_code))]
pub mod sentence_classifier;
#[cfg(test)]
mod sinks_tests;
pub mod stack;
pub mod step_layout;
#[cfg(test)]
mod window_tests;

pub use checkpoint::Model;
// Used outside the library only (feature `internals`).
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use config::{
    Activation, BlockConfig, ExpertsConfig, ModelConfig, NormPlacement, Positions, SwigluClamp,
};
pub use lm::LanguageModel;
// Used outside the library only (feature `internals`).
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use param::{Init, Module, Param, ShapesOnly};
pub use seq2seq::Seq2Seq;
pub use step_layout::StepLayout;
