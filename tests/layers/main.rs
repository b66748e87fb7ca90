//! The layers, one by one and assembled: values against plain f64 loops written from the
//! paper's formulas, and hand-written backward passes against central finite differences.
//!
//! One test binary (cargo builds `tests/layers/main.rs` as the target `layers`); each module was
//! its own binary before. Run one module with `cargo test --test layers MODULE::`.

#[path = "../common/mod.rs"]
mod common;

mod activations;
mod classifier;
mod flash_attention;
mod gpu_ops;
mod gpu_products;
mod gqa_attention;
mod layer_gradients;
mod layer_reference;
mod masked_lm;
mod model_gradient;
mod positions;
mod rms_norm_swiglu;
mod rope_styles;
