//! Granite 3 (IBM 2024): a Llama-family decoder with four scalars of its own, each a general
//! option of [`ModelConfig`]:
//!
//! - the token embeddings multiplied by `embedding_multiplier` ([`ModelConfig::embedding_scale`]);
//! - every sublayer's output by `residual_multiplier` before the residual sum,
//!   `h = x + m · Attn(Norm(x))`, `y = h + m · FFN(Norm(h))` ([`ModelConfig::residual_scale`]);
//! - the attention scores `q·kᵀ · attention_multiplier` in place of `q·kᵀ / √d_k`: a
//!   [`ModelConfig::query_pre_attn_scalar`] of `1 / attention_multiplier²` (the scores are
//!   `q·kᵀ / √query_pre_attn_scalar`);
//! - the logits divided by `logits_scaling` ([`ModelConfig::logit_divisor`]).
//!
//! Names are Llama's (a Granite checkpoint's Llama variant: no biases, no query/key norms, no
//! window). GGUF: architecture `granite`, Llama's names and rotary pairing (the
//! converter permutes the query and key rows); the scalars as `granite.embedding_scale`,
//! `granite.residual_scale`, `granite.attention.scale` and `granite.logit_scale` (llama.cpp
//! requires the last); `granite.rope.scaling.finetuned` false turns the rotation off in every
//! layer, as llama.cpp reads it.

use super::llama::{self, LLAMA};
use super::{Family, FamilyKind, GgufDecoder, HfDecoder};
use crate::error::Result;
use crate::model::config::{ModelConfig, RopeStyle};
use crate::store::ckpt_err;
use crate::store::gguf::GgufFile;
use serde::Deserialize;
use std::path::Path;

/// The row of [`super::FAMILIES`].
pub const FAMILY: Family = Family {
    name: "granite",
    kind: FamilyKind::Decoder,
    model_types: &["granite"],
    hf_names: llama::HF_DENSE_NAMES,
    hf_decoder: Some(HfDecoder {
        config: hf_config,
        tensors: llama::hf_tensors,
    }),
    gguf: Some(GgufDecoder {
        architecture: "granite",
        config: gguf_config,
        names: llama::GGUF_DENSE_NAMES,
        fused: &[],
    }),
    chat_template: None,
};

fn one() -> f64 {
    1.0
}

/// Granite's multipliers in `config.json` (1: none, `GraniteConfig`'s defaults).
#[derive(Deserialize)]
struct Multipliers {
    #[serde(default = "one")]
    embedding_multiplier: f64,
    #[serde(default = "one")]
    residual_multiplier: f64,
    #[serde(default = "one")]
    attention_multiplier: f64,
    #[serde(default = "one")]
    logits_scaling: f64,
}

/// `c` with Granite's four scalars (`what`: the names they go by, for messages): the
/// embeddings', the residual's and the logits' set where they are not 1, the scores' scale
/// always (it replaces `1/√d_k`). Each must be a positive finite number.
fn with_multipliers(
    mut c: ModelConfig,
    [embedding, residual, attention, logits]: [f64; 4],
    what: [&str; 4],
) -> std::result::Result<ModelConfig, String> {
    for (v, name) in [embedding, residual, attention, logits]
        .into_iter()
        .zip(what)
    {
        if !(v.is_finite() && v > 0.0) {
            return Err(format!("{name} {v} must be a positive number"));
        }
    }
    let unless_one = |v: f64| (v != 1.0).then_some(v);
    c.embedding_scale = unless_one(embedding);
    c.residual_scale = unless_one(residual);
    c.query_pre_attn_scalar = Some(1.0 / (attention * attention));
    c.logit_divisor = unless_one(logits);
    c.validate()?;
    Ok(c)
}

/// A Hugging Face directory's `config.json` of `model_type` `granite`, as our config.
fn hf_config(bytes: &[u8], config_path: &Path, dir: &Path) -> Result<ModelConfig> {
    let err = |e: String| ckpt_err(dir, format!("config.json: {e}"));
    let m: Multipliers = serde_json::from_slice(bytes)
        .map_err(|e| ckpt_err(config_path, format!("invalid Granite config: {e}")))?;
    let c = llama::parse_config(bytes, config_path)?
        .model_config_of(&LLAMA)
        .map_err(err)?;
    let values = [
        m.embedding_multiplier,
        m.residual_multiplier,
        m.attention_multiplier,
        m.logits_scaling,
    ];
    let names = [
        "embedding_multiplier",
        "residual_multiplier",
        "attention_multiplier",
        "logits_scaling",
    ];
    with_multipliers(c, values, names).map_err(err)
}

/// The config of a GGUF file of architecture `granite`.
fn gguf_config(file: &GgufFile) -> Result<ModelConfig> {
    let path = file.path();
    let mut c = llama::gguf_config_of(file, &LLAMA, RopeStyle::Interleaved)?;
    let key = |k: &str| format!("granite.{k}");
    // llama.cpp: an embedding or residual scale of 0 (or none) is none.
    let optional = |k: &str| -> Result<f64> {
        Ok(file
            .get::<f64>(&key(k))?
            .filter(|&s| s != 0.0)
            .unwrap_or(1.0))
    };
    let logits = file.get::<f64>(&key("logit_scale"))?.ok_or_else(|| {
        ckpt_err(
            path,
            "granite.logit_scale is missing (llama.cpp requires it)",
        )
    })?;
    // llama.cpp: an attention scale of 0 (or none) is 1/√d_k.
    let attention = match file.get::<f64>(&key("attention.scale"))? {
        Some(s) if s != 0.0 => s,
        _ => 1.0 / (c.d_head() as f64).sqrt(),
    };
    if file.get::<bool>(&key("rope.scaling.finetuned"))? == Some(false) {
        c.layer_rope = vec![false; c.n_decoder_layers];
    }
    let values = [
        optional("embedding_scale")?,
        optional("residual_scale")?,
        attention,
        logits,
    ];
    let names = [
        "granite.embedding_scale",
        "granite.residual_scale",
        "granite.attention.scale",
        "granite.logit_scale",
    ];
    with_multipliers(c, values, names).map_err(|e| ckpt_err(path, e))
}
