//! Numeric kernels only, with no model knowledge: a faster kernel drops in here without touching
//! the model. Every kernel is generic over [`crate::Float`] so the f64 reference checks run the
//! same code as f32 training. The model never calls them directly: it computes through
//! [`crate::backend::Backend`], whose host implementation forwards to these functions.

pub mod activations;
pub mod attention;
#[cfg(test)]
mod attention_bias_tests;
pub mod dropout;
pub mod flash_attention;
pub mod flash_decoding;
pub mod gated_delta;
pub mod hadamard;
pub mod key_ranges;
pub mod kv_blocks;
pub mod kv_dots;
pub mod layer_norm;
pub mod linear_attention;
pub mod lowp;
pub mod matmul;
pub mod matvec;
pub mod panels;
pub mod plain_attention;
pub mod reduce;
pub mod rms_norm;
pub mod rope;
pub mod row_exact;
pub mod scores;
pub mod sinks;
pub mod softmax;
pub mod sparse_pattern;
pub mod step_attention;
pub mod step_dots;
pub mod step_softmax;
pub mod swiglu_clamped;
