//! Phi-3 (Abdin et al. 2024): a Llama-family decoder stored with fused projections — one
//! `qkv_proj [(h + 2·h_kv)·d_k, d_model]` holding the query, key and value rows one after
//! another, and one `gate_up_proj [2·d_ff, d_model]` holding the SwiGLU gate then the up
//! projection (`gate, up = chunk(x W_gate_upᵀ, 2)`, `FFN = (silu(gate) ⊙ up) W_downᵀ`). They
//! are split at load into Llama's tensors ([`super::FusedTensor`]), so that the model is
//! Llama's ([`super::llama`]). A `sliding_window` is every layer's (null in the released
//! checkpoints); LongRoPE scaling (`longrope`, `su`) is refused by name.
//!
//! GGUF: architecture `phi3`, `attn_qkv` and a fused `ffn_up` (gate rows first) split the
//! same way; Hugging Face's rotary halves (NEOX rotation). llama.cpp writes
//! `phi3.attention.sliding_window`; a positive one is every layer's window.

use super::llama::{self, Variant, WindowRule};
use super::{split_fused_hf, Family, FamilyKind, FusedTensor, GgufDecoder, HfDecoder};
use crate::error::Result;
use crate::model::config::{ModelConfig, RopeStyle};
use crate::store::gguf::GgufFile;
use crate::store::{ckpt_err, TensorMap};
use std::path::Path;

/// Phi-3's variant of the Llama config: a sliding window in every layer when set.
pub const VARIANT: Variant = Variant {
    qkv_bias: false,
    qk_norm: false,
    windows: WindowRule::EveryLayer,
};

/// The row of [`super::FAMILIES`].
pub const FAMILY: Family = Family {
    name: "phi3",
    kind: FamilyKind::Decoder,
    model_types: &["phi3"],
    hf_names: llama::HF_NAMES,
    hf_decoder: Some(HfDecoder {
        config: hf_config,
        tensors: hf_tensors,
    }),
    gguf: Some(GgufDecoder {
        architecture: "phi3",
        config: gguf_config,
        names: llama::GGUF_NAMES,
        fused: GGUF_FUSED,
    }),
    chat_template: None,
};

/// Rows of the query projection, `h · d_k`.
fn q_rows(c: &ModelConfig) -> usize {
    c.n_heads * c.d_head()
}

/// Rows of the key (and of the value) projection, `h_kv · d_k`.
fn kv_rows(c: &ModelConfig) -> usize {
    c.n_kv_heads.unwrap_or(c.n_heads) * c.d_head()
}

/// Rows of the gate (and of the up projection), `d_ff`.
fn ff_rows(c: &ModelConfig) -> usize {
    c.d_ff
}

/// Phi-3's fused tensors in a Hugging Face checkpoint, split into Llama's names.
pub const HF_FUSED: &[FusedTensor] = &[
    FusedTensor {
        name: "model.layers.{i}.self_attn.qkv_proj.weight",
        parts: &[
            ("model.layers.{i}.self_attn.q_proj.weight", q_rows),
            ("model.layers.{i}.self_attn.k_proj.weight", kv_rows),
            ("model.layers.{i}.self_attn.v_proj.weight", kv_rows),
        ],
    },
    FusedTensor {
        name: "model.layers.{i}.mlp.gate_up_proj.weight",
        parts: &[
            ("model.layers.{i}.mlp.gate_proj.weight", ff_rows),
            ("model.layers.{i}.mlp.up_proj.weight", ff_rows),
        ],
    },
];

/// Phi-3's fused tensors in a GGUF file, split into llama.cpp's Llama names.
pub const GGUF_FUSED: &[FusedTensor] = &[
    FusedTensor {
        name: "blk.{i}.attn_qkv.weight",
        parts: &[
            ("blk.{i}.attn_q.weight", q_rows),
            ("blk.{i}.attn_k.weight", kv_rows),
            ("blk.{i}.attn_v.weight", kv_rows),
        ],
    },
    FusedTensor {
        name: "blk.{i}.ffn_up.weight",
        parts: &[
            ("blk.{i}.ffn_gate.weight", ff_rows),
            ("blk.{i}.ffn_up.weight", ff_rows),
        ],
    },
];

/// A Hugging Face directory's `config.json` of `model_type` `phi3`, as our config.
fn hf_config(bytes: &[u8], config_path: &Path, dir: &Path) -> Result<ModelConfig> {
    llama::parse_config(bytes, config_path)?
        .model_config_of(&VARIANT)
        .map_err(|e| ckpt_err(dir, format!("config.json: {e}")))
}

/// The tensors of a Phi-3 directory with the fused ones split, named as Llama's.
fn hf_tensors(dir: &Path, mut tensors: TensorMap, config: &ModelConfig) -> Result<TensorMap> {
    split_fused_hf(dir, &mut tensors, HF_FUSED, config)?;
    llama::hf_tensors(dir, tensors, config)
}

/// The config of a GGUF file of architecture `phi3`.
fn gguf_config(file: &GgufFile) -> Result<ModelConfig> {
    llama::gguf_config_of(file, &VARIANT, RopeStyle::HalfSplit)
}
