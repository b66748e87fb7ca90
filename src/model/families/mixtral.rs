//! Mixtral (Jiang et al. 2024, "Mixtral of Experts"): Mistral's decoder ([`super::mistral`]:
//! Llama's blocks, a sliding window when `sliding_window` is set) with every FFN a mixture of
//! `num_local_experts` SwiGLU experts of `intermediate_size`, of which a softmax router picks
//! `num_experts_per_tok` (two), their weights renormalised (`crate::model::experts`).
//!
//! Hugging Face: `block_sparse_moe.gate` (the router) and `block_sparse_moe.experts.{e}.w1`
//! (gate), `w3` (up), `w2` (down), in Llama's table. GGUF: llama.cpp's converter writes
//! Mixtral as architecture `llama` with `llama.expert_count` and merged `ffn_*_exps` tensors,
//! which the Llama row reads.

use super::experts::{self, Normalise};
use super::{llama, mistral, Family, FamilyKind, HfDecoder};
use crate::error::Result;
use crate::model::config::ModelConfig;
use std::path::Path;

/// The row of [`super::FAMILIES`].
pub const FAMILY: Family = Family {
    name: "mixtral",
    kind: FamilyKind::Decoder,
    model_types: &["mixtral"],
    hf_names: llama::HF_NAMES,
    hf_decoder: Some(HfDecoder {
        config: hf_config,
        tensors: llama::hf_tensors,
    }),
    gguf: None,
    chat_template: None,
};

/// A Hugging Face directory's `config.json` of `model_type` `mixtral`, as our config.
fn hf_config(bytes: &[u8], config_path: &Path, dir: &Path) -> Result<ModelConfig> {
    let what = (Normalise::Always, "num_local_experts");
    experts::hf_config((bytes, config_path, dir), &mistral::VARIANT, what, |_| {})
}
