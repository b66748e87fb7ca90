//! Mistral (Jiang et al. 2023): a Llama-family decoder whose self-attention slides — the
//! query at position `p` sees the keys `max(0, p + 1 − w) ..= p`, `w` = `sliding_window` of
//! `config.json`, in every layer ([`ModelConfig::layer_windows`]; null: the whole prefix).
//! Everything else, names included, is Llama's ([`super::llama`]).
//!
//! GGUF: llama.cpp's converter writes Mistral as architecture `llama` and keeps no window, so
//! such a file loads through the Llama row and attends to the whole prefix, as llama.cpp
//! computes it; a file with a `llama.attention.sliding_window` key gets that window.

use super::llama::{self, Variant, WindowRule};
use super::{Family, FamilyKind, HfDecoder};
use crate::error::Result;
use crate::model::config::ModelConfig;
use crate::store::ckpt_err;
use std::path::Path;

/// Mistral's variant of the Llama config: a sliding window in every layer.
pub const VARIANT: Variant = Variant {
    qkv_bias: false,
    qk_norm: false,
    windows: WindowRule::EveryLayer,
};

/// The row of [`super::FAMILIES`].
pub const FAMILY: Family = Family {
    name: "mistral",
    kind: FamilyKind::Decoder,
    model_types: &["mistral"],
    hf_names: llama::HF_NAMES,
    hf_decoder: Some(HfDecoder {
        config: hf_config,
        tensors: llama::hf_tensors,
    }),
    gguf: None,
    chat_template: None,
};

/// A Hugging Face directory's `config.json` of `model_type` `mistral`, as our config.
fn hf_config(bytes: &[u8], config_path: &Path, dir: &Path) -> Result<ModelConfig> {
    llama::parse_config(bytes, config_path)?
        .model_config_of(&VARIANT)
        .map_err(|e| ckpt_err(dir, format!("config.json: {e}")))
}
