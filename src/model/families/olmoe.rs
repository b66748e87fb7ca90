//! OLMoE (Muennighoff et al. 2024, OLMoE-1B-7B): Llama's pre-norm blocks with RMSNorms of the
//! queries and keys over each row's whole projection (all heads at once,
//! [`ModelConfig::qk_norm_whole`]) and every FFN a mixture of `num_experts` SwiGLU experts of
//! `intermediate_size`, `num_experts_per_tok` a token, their softmax weights used as they are
//! (`norm_topk_prob` false; `crate::model::experts`).
//!
//! Hugging Face names are Qwen3-MoE's (`self_attn.{q,k}_norm`, `mlp.gate`,
//! `mlp.experts.{e}.*_proj`); GGUF: architecture `olmoe`, llama.cpp's names and merged expert
//! tensors, NEOX rotation, weights not renormalised (as llama.cpp computes it).

use super::experts::{self, Normalise};
use super::llama::{self, Variant, WindowRule};
use super::{qwen3, Family, FamilyKind, GgufDecoder, HfDecoder};
use crate::error::Result;
use crate::model::config::{ModelConfig, RopeStyle};
use crate::store::ckpt_err;
use crate::store::gguf::GgufFile;
use serde::Deserialize;
use std::path::Path;

/// OLMoE's variant of the Llama config: query and key norms, no window.
pub const VARIANT: Variant = Variant {
    qkv_bias: false,
    qk_norm: true,
    windows: WindowRule::Never,
};

/// The row of [`super::FAMILIES`].
pub const FAMILY: Family = Family {
    name: "olmoe",
    kind: FamilyKind::Decoder,
    model_types: &["olmoe"],
    hf_names: qwen3::HF_NAMES,
    hf_decoder: Some(HfDecoder {
        config: hf_config,
        tensors: llama::hf_tensors,
    }),
    gguf: Some(GgufDecoder {
        architecture: "olmoe",
        config: gguf_config,
        names: qwen3::GGUF_NAMES,
        fused: &[],
    }),
    chat_template: None,
};

/// OLMoE's own field that we do not compute.
#[derive(Deserialize)]
struct Clip {
    #[serde(default)]
    clip_qkv: Option<f64>,
}

/// A Hugging Face directory's `config.json` of `model_type` `olmoe`, as our config.
fn hf_config(bytes: &[u8], config_path: &Path, dir: &Path) -> Result<ModelConfig> {
    let clip: Clip = serde_json::from_slice(bytes)
        .map_err(|e| ckpt_err(config_path, format!("invalid OLMoE config: {e}")))?;
    if let Some(c) = clip.clip_qkv {
        let why = format!("config.json: clip_qkv {c} is not supported (unclipped projections only)");
        return Err(ckpt_err(dir, why));
    }
    let what = (Normalise::AsConfigured { default: false }, "num_experts");
    experts::hf_config((bytes, config_path, dir), &VARIANT, what, |c| {
        c.qk_norm_whole = true
    })
}

/// The config of a GGUF file of architecture `olmoe`: llama.cpp does not renormalise the
/// chosen experts' weights there.
fn gguf_config(file: &GgufFile) -> Result<ModelConfig> {
    let mut c = llama::gguf_config_of(file, &VARIANT, RopeStyle::HalfSplit)?;
    c.qk_norm_whole = true;
    if let Some(e) = c.experts.as_mut() {
        e.normalise = false;
    }
    c.validate().map_err(|e| ckpt_err(file.path(), e))?;
    Ok(c)
}
