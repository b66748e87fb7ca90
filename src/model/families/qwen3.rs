//! Qwen3 (Qwen team 2025): a Llama-family decoder with an RMSNorm on each head's queries and
//! keys before the rotation ([`ModelConfig::qk_norm`]: `self_attn.{q,k}_norm.weight [d_k]`,
//! shared by the heads) and no biases. Sliding windows as Qwen2's ([`super::qwen2`]).
//!
//! GGUF: architecture `qwen3`, Llama's tensor names plus `attn_{q,k}_norm`; Hugging Face's
//! rotary halves (NEOX rotation).

use super::llama::{self, gguf_names, hf_names, Variant, WindowRule};
use super::{Family, FamilyKind, GgufDecoder, HfDecoder};
use crate::error::Result;
use crate::model::checkpoint::{RenameTable, Renames};
use crate::model::config::{ModelConfig, RopeStyle};
use crate::store::ckpt_err;
use crate::store::gguf::GgufFile;
use std::path::Path;

/// Qwen3's variant of the Llama config: query and key norms.
pub const VARIANT: Variant = Variant {
    qkv_bias: false,
    qk_norm: true,
    windows: WindowRule::Qwen,
};

/// The row of [`super::FAMILIES`].
pub const FAMILY: Family = Family {
    name: "qwen3",
    kind: FamilyKind::Decoder,
    model_types: &["qwen3"],
    hf_names: HF_NAMES,
    hf_decoder: Some(HfDecoder {
        config: hf_config,
        tensors: llama::hf_tensors,
    }),
    gguf: Some(GgufDecoder {
        architecture: "qwen3",
        config: gguf_config,
        names: GGUF_NAMES,
        fused: &[],
    }),
    chat_template: None,
};

/// Hugging Face Qwen3 tensor names -> our module paths: Llama's and the two norms, and
/// Qwen3-MoE's experts (`super::qwen3_moe`).
pub const HF_NAMES: RenameTable = RenameTable(&[
    hf_names::EMBEDDING,
    hf_names::ATTENTION,
    hf_names::QK_NORMS,
    hf_names::NORMS,
    hf_names::FFN,
    HF_EXPERTS,
    hf_names::FINAL_NORM,
    hf_names::HEAD,
]);

/// Qwen3-MoE's mixtures of experts.
pub(super) const HF_EXPERTS: Renames = &[
    ("model.layers.{i}.mlp.gate.", "layers.{i}.ffn.router."),
    (
        "model.layers.{i}.mlp.experts.{e}.gate_proj.",
        "layers.{i}.ffn.experts.{e}.gate.",
    ),
    (
        "model.layers.{i}.mlp.experts.{e}.up_proj.",
        "layers.{i}.ffn.experts.{e}.linear1.",
    ),
    (
        "model.layers.{i}.mlp.experts.{e}.down_proj.",
        "layers.{i}.ffn.experts.{e}.linear2.",
    ),
];

/// llama.cpp's Qwen3 tensor names -> our module paths: Llama's and the two norms.
pub const GGUF_NAMES: RenameTable = RenameTable(&[
    gguf_names::EMBEDDING,
    gguf_names::ATTENTION,
    gguf_names::QK_NORMS,
    gguf_names::NORMS,
    gguf_names::FFN,
    gguf_names::EXPERTS,
    gguf_names::FINAL_NORM,
    gguf_names::HEAD,
]);

/// A Hugging Face directory's `config.json` of `model_type` `qwen3`, as our config.
fn hf_config(bytes: &[u8], config_path: &Path, dir: &Path) -> Result<ModelConfig> {
    llama::parse_config(bytes, config_path)?
        .model_config_of(&VARIANT)
        .map_err(|e| ckpt_err(dir, format!("config.json: {e}")))
}

/// The config of a GGUF file of architecture `qwen3`.
fn gguf_config(file: &GgufFile) -> Result<ModelConfig> {
    llama::gguf_config_of(file, &VARIANT, RopeStyle::HalfSplit)
}
