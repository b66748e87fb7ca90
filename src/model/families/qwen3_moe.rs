//! Qwen3-MoE (Qwen team 2025; Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention ([`super::qwen3`]:
//! per-head query and key norms, no biases) with every FFN a mixture of experts
//! (`crate::model::experts`): `num_experts` SwiGLU experts of `moe_intermediate_size`, a
//! softmax router picking `num_experts_per_tok`, their weights renormalised when
//! `norm_topk_prob`.
//!
//! Hugging Face: `mlp.gate` (the router) and `mlp.experts.{e}.{gate,up,down}_proj`, in Qwen3's
//! table. GGUF: architecture `qwen3moe`, `ffn_gate_inp` and the merged `ffn_*_exps` tensors;
//! llama.cpp always renormalises the chosen weights there.

use super::experts::{self, Normalise};
use super::{llama, qwen3, Family, FamilyKind, GgufDecoder, HfDecoder};
use crate::error::Result;
use crate::model::config::{ModelConfig, RopeStyle};
use crate::store::gguf::GgufFile;
use std::path::Path;

/// The row of [`super::FAMILIES`].
pub const FAMILY: Family = Family {
    name: "qwen3_moe",
    kind: FamilyKind::Decoder,
    model_types: &["qwen3_moe"],
    hf_names: qwen3::HF_NAMES,
    hf_decoder: Some(HfDecoder {
        config: hf_config,
        tensors: llama::hf_tensors,
    }),
    gguf: Some(GgufDecoder {
        architecture: "qwen3moe",
        config: gguf_config,
        names: qwen3::GGUF_NAMES,
        fused: &[],
    }),
    chat_template: None,
};

/// A Hugging Face directory's `config.json` of `model_type` `qwen3_moe`, as our config
/// (transformers 5 writes `num_experts` as `num_local_experts`: either name).
fn hf_config(bytes: &[u8], config_path: &Path, dir: &Path) -> Result<ModelConfig> {
    let what = (Normalise::AsConfigured { default: false }, "num_experts");
    experts::hf_config((bytes, config_path, dir), &qwen3::VARIANT, what, |_| {})
}

/// The config of a GGUF file of architecture `qwen3moe`.
fn gguf_config(file: &GgufFile) -> Result<ModelConfig> {
    llama::gguf_config_of(file, &qwen3::VARIANT, RopeStyle::HalfSplit)
}
