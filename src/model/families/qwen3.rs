//! Qwen3 (Qwen team 2025): a Llama-family decoder with an RMSNorm on each head's queries and
//! keys before the rotation ([`ModelConfig::qk_norm`]: `self_attn.{q,k}_norm.weight [d_k]`,
//! shared by the heads) and no biases. Sliding windows as Qwen2's ([`super::qwen2`]).
//!
//! GGUF: architecture `qwen3`, Llama's tensor names plus `attn_{q,k}_norm`; Hugging Face's
//! rotary halves (NEOX rotation).

use super::llama::{self, Variant, WindowRule};
use super::{Family, FamilyKind, GgufDecoder, HfDecoder};
use crate::error::Result;
use crate::model::checkpoint::RenameTable;
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

/// Hugging Face Qwen3 tensor names -> our module paths: Llama's and the two norms.
pub const HF_NAMES: RenameTable = RenameTable(&[
    ("model.embed_tokens.", "embedding."),
    (
        "model.layers.{i}.self_attn.q_proj.",
        "layers.{i}.self_attn.q_proj.",
    ),
    (
        "model.layers.{i}.self_attn.k_proj.",
        "layers.{i}.self_attn.k_proj.",
    ),
    (
        "model.layers.{i}.self_attn.v_proj.",
        "layers.{i}.self_attn.v_proj.",
    ),
    (
        "model.layers.{i}.self_attn.o_proj.",
        "layers.{i}.self_attn.out_proj.",
    ),
    (
        "model.layers.{i}.self_attn.q_norm.",
        "layers.{i}.self_attn.q_norm.",
    ),
    (
        "model.layers.{i}.self_attn.k_norm.",
        "layers.{i}.self_attn.k_norm.",
    ),
    (
        "model.layers.{i}.input_layernorm.",
        "layers.{i}.self_attn_norm.",
    ),
    (
        "model.layers.{i}.post_attention_layernorm.",
        "layers.{i}.ffn_norm.",
    ),
    ("model.layers.{i}.mlp.gate_proj.", "layers.{i}.ffn.gate."),
    ("model.layers.{i}.mlp.up_proj.", "layers.{i}.ffn.linear1."),
    ("model.layers.{i}.mlp.down_proj.", "layers.{i}.ffn.linear2."),
    // Qwen3-MoE's mixtures of experts (`super::qwen3_moe`).
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
    ("model.norm.", "final_norm."),
    ("lm_head.", "output_proj."),
]);

/// llama.cpp's Qwen3 tensor names -> our module paths: Llama's and the two norms.
pub const GGUF_NAMES: RenameTable = RenameTable(&[
    ("token_embd.", "embedding."),
    ("blk.{i}.attn_q.", "layers.{i}.self_attn.q_proj."),
    ("blk.{i}.attn_k.", "layers.{i}.self_attn.k_proj."),
    ("blk.{i}.attn_v.", "layers.{i}.self_attn.v_proj."),
    ("blk.{i}.attn_output.", "layers.{i}.self_attn.out_proj."),
    ("blk.{i}.attn_q_norm.", "layers.{i}.self_attn.q_norm."),
    ("blk.{i}.attn_k_norm.", "layers.{i}.self_attn.k_norm."),
    ("blk.{i}.attn_norm.", "layers.{i}.self_attn_norm."),
    ("blk.{i}.ffn_norm.", "layers.{i}.ffn_norm."),
    ("blk.{i}.ffn_gate.", "layers.{i}.ffn.gate."),
    ("blk.{i}.ffn_up.", "layers.{i}.ffn.linear1."),
    ("blk.{i}.ffn_down.", "layers.{i}.ffn.linear2."),
    ("blk.{i}.ffn_gate_inp.", "layers.{i}.ffn.router."),
    ("blk.{i}.ffn_gate_exps.{e}.", "layers.{i}.ffn.experts.{e}.gate."),
    ("blk.{i}.ffn_up_exps.{e}.", "layers.{i}.ffn.experts.{e}.linear1."),
    ("blk.{i}.ffn_down_exps.{e}.", "layers.{i}.ffn.experts.{e}.linear2."),
    ("output_norm.", "final_norm."),
    ("output.", "output_proj."),
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
