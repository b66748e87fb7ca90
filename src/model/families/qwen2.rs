//! Qwen2 and Qwen2.5 (Qwen team 2024): a Llama-family decoder whose query, key and value
//! projections have biases (`q = x W_qᵀ + b_q`; the output projection and the FFN none:
//! [`ModelConfig::qkv_bias`]), rotary base 10⁶ in most checkpoints. Names are Llama's
//! ([`super::llama`]); the biases follow their weights' prefixes.
//!
//! Sliding windows: with `layer_types` (transformers 5) its `sliding_attention` layers slide
//! by `sliding_window`; without, the layers from `max_window_layers` on when
//! `use_sliding_window` is true (false in the released checkpoints).
//!
//! GGUF: architecture `qwen2`, Llama's tensor names plus `attn_{q,k,v}.bias`; llama.cpp keeps
//! Hugging Face's rotary halves (NEOX rotation: [`RopeStyle::HalfSplit`]).

use super::llama::{self, Variant, WindowRule};
use super::{Family, FamilyKind, GgufDecoder, HfDecoder};
use crate::error::Result;
use crate::model::config::{ModelConfig, RopeStyle};
use crate::store::ckpt_err;
use crate::store::gguf::GgufFile;
use std::path::Path;

/// Qwen2's variant of the Llama config: biases on Q, K and V.
pub const VARIANT: Variant = Variant {
    qkv_bias: true,
    qk_norm: false,
    windows: WindowRule::Qwen,
};

/// The row of [`super::FAMILIES`].
pub const FAMILY: Family = Family {
    name: "qwen2",
    kind: FamilyKind::Decoder,
    model_types: &["qwen2"],
    hf_names: llama::HF_NAMES,
    hf_decoder: Some(HfDecoder {
        config: hf_config,
        tensors: llama::hf_tensors,
    }),
    gguf: Some(GgufDecoder {
        architecture: "qwen2",
        config: gguf_config,
        names: llama::GGUF_NAMES,
        fused: &[],
    }),
    chat_template: None,
};

/// A Hugging Face directory's `config.json` of `model_type` `qwen2`, as our config.
fn hf_config(bytes: &[u8], config_path: &Path, dir: &Path) -> Result<ModelConfig> {
    llama::parse_config(bytes, config_path)?
        .model_config_of(&VARIANT)
        .map_err(|e| ckpt_err(dir, format!("config.json: {e}")))
}

/// The config of a GGUF file of architecture `qwen2`.
fn gguf_config(file: &GgufFile) -> Result<ModelConfig> {
    llama::gguf_config_of(file, &VARIANT, RopeStyle::HalfSplit)
}
