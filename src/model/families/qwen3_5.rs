//! Qwen3.5 (Qwen team 2026), its dense text model (`Qwen3_5ForCausalLM`, `model_type`
//! `qwen3_5_text`): a hybrid stack whose `layer_types` alternate Gated DeltaNet layers
//! (`linear_attention`, `crate::model::gated_delta`: a causal short convolution, then the gated
//! delta rule, a fixed-size state per sequence) with gated full-attention layers
//! (`full_attention`). Otherwise Qwen3's pre-norm decoder ([`super::qwen3`]: per-head query and
//! key norms, SwiGLU, no biases), with
//!
//! - zero-centred RMSNorms, `(1 + w) ⊙ x / rms(x)` everywhere but the Gated DeltaNet's own
//!   gated norm ([`ModelConfig::norm_weight_offset`] 1);
//! - an output gate on the attention ([`ModelConfig::attn_output_gate`]): the checkpoint's
//!   `q_proj` holds, head by head, the query's `d_k` rows then the gate's, split at load into
//!   `q_proj` and `gate_proj`;
//! - rotary positions on a quarter of each head (`partial_rotary_factor`,
//!   [`ModelConfig::rotary_dim`]); text positions are the same in the three M-RoPE sections, so
//!   `mrope_section` changes nothing.
//!
//! The multimodal checkpoints (`Qwen3_5ForConditionalGeneration`, `model_type` `qwen3_5`) load
//! as their text model ([`super::multimodal`]: `text_config`, `model.language_model.*`, the
//! vision tower not loaded). The mixtures of experts built on the same stack are
//! [`super::qwen3_5_moe`] and [`super::qwen3_next`], which read their configs and tensors
//! through [`hybrid_hf_config`] and [`hybrid_tensors`].
//!
//! Refused by name: any other `layer_types` entry, biases, an activation other than SiLU, rope
//! scaling. llama.cpp's `qwen35` GGUF files do not load yet.

use super::experts::{self as moe, HfExperts, Normalise};
use super::llama::{self, hf_names, LlamaConfig};
use super::{multimodal, qwen3, Family, FamilyKind, HfDecoder};
use crate::error::Result;
use crate::model::checkpoint::{RenameTable, Renames};
use crate::model::config::{GatedDeltaConfig, ModelConfig};
use crate::store::{ckpt_err, TensorMap};
use serde::Deserialize;
use std::path::Path;

/// The row of [`super::FAMILIES`].
pub const FAMILY: Family = Family {
    name: "qwen3_5",
    kind: FamilyKind::Decoder,
    model_types: &["qwen3_5_text", "qwen3_5"],
    hf_names: HF_NAMES,
    hf_decoder: Some(HfDecoder {
        config: hf_config,
        tensors: hybrid_tensors,
    }),
    gguf: None,
    chat_template: None,
};

/// Hugging Face Qwen3.5 tensor names -> our module paths: Qwen3's, the attention's output gate
/// (split from `q_proj` at load), the Gated DeltaNet layers' (`linear_attn.*`, the same
/// names on both sides) and the mixtures' of Qwen3.5-MoE and Qwen3-Next (`mlp.gate`, the
/// router; `mlp.experts.{e}.*`; `mlp.shared_expert.*` and its gate `mlp.shared_expert_gate`).
pub const HF_NAMES: RenameTable = RenameTable(&[
    hf_names::EMBEDDING,
    hf_names::ATTENTION,
    &[(
        "model.layers.{i}.self_attn.gate_proj.",
        "layers.{i}.self_attn.gate_proj.",
    )],
    hf_names::QK_NORMS,
    &[("model.layers.{i}.linear_attn.", "layers.{i}.linear_attn.")],
    hf_names::NORMS,
    hf_names::FFN,
    qwen3::HF_EXPERTS,
    HF_SHARED_EXPERT,
    hf_names::FINAL_NORM,
    hf_names::HEAD,
]);

/// The shared expert of Qwen3.5-MoE's and Qwen3-Next's mixtures and its sigmoid gate.
const HF_SHARED_EXPERT: Renames = &[
    (
        "model.layers.{i}.mlp.shared_expert.gate_proj.",
        "layers.{i}.ffn.shared_expert.gate.",
    ),
    (
        "model.layers.{i}.mlp.shared_expert.up_proj.",
        "layers.{i}.ffn.shared_expert.linear1.",
    ),
    (
        "model.layers.{i}.mlp.shared_expert.down_proj.",
        "layers.{i}.ffn.shared_expert.linear2.",
    ),
    (
        "model.layers.{i}.mlp.shared_expert_gate.",
        "layers.{i}.ffn.shared_expert_gate.",
    ),
];

/// Qwen3.5's own fields of `config.json` (the rest are Llama's, [`LlamaConfig`]).
#[derive(Deserialize)]
struct HybridFields {
    linear_conv_kernel_dim: usize,
    linear_key_head_dim: usize,
    linear_value_head_dim: usize,
    linear_num_key_heads: usize,
    linear_num_value_heads: usize,
    /// Per layer, `linear_attention` or `full_attention`.
    layer_types: Vec<String>,
    /// The share of each attention head that is rotated (also read from `rope_parameters`).
    #[serde(default)]
    partial_rotary_factor: Option<f64>,
    #[serde(default)]
    attn_output_gate: Option<bool>,
    /// Mixture-of-experts fields (a dense family refuses them).
    #[serde(default)]
    num_experts: Option<usize>,
    #[serde(default)]
    moe_intermediate_size: Option<usize>,
}

/// What follows each mixing layer of a hybrid family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HybridFfn {
    /// Qwen3.5's SwiGLU of `intermediate_size` (`num_experts` refused).
    Dense,
    /// A mixture of experts with a shared expert (`num_experts` required), its chosen weights
    /// normalised as the family says.
    Experts(Normalise),
}

/// A Hugging Face directory's `config.json` of `model_type` `qwen3_5_text` (or the multimodal
/// `qwen3_5`), as our config.
fn hf_config(bytes: &[u8], config_path: &Path, dir: &Path) -> Result<ModelConfig> {
    hybrid_hf_config((bytes, config_path, dir), "qwen3_5_text", HybridFfn::Dense)
}

/// The config of a hybrid family's `config.json` (`bytes`, read from `config_path` in `dir`):
/// a multimodal checkpoint's `text_config` (of `model_type` `text_type`), Qwen3's fields,
/// Qwen3.5's hybrid ones ([`hybrid_config`]) and the FFNs `ffn` says. A mixture whose config
/// has no dense `intermediate_size` (Qwen3.5-MoE: every FFN is a mixture) reads the experts'.
pub fn hybrid_hf_config(
    (bytes, config_path, dir): (&[u8], &Path, &Path),
    text_type: &str,
    ffn: HybridFfn,
) -> Result<ModelConfig> {
    let err = |e: String| ckpt_err(dir, format!("config.json: {e}"));
    let invalid = |e: serde_json::Error| ckpt_err(config_path, format!("invalid config: {e}"));
    let json: serde_json::Value = serde_json::from_slice(bytes).map_err(invalid)?;
    let mut json = multimodal::text_config(json, config_path, text_type)?;
    let hybrid: HybridFields = serde_json::from_value(json.clone()).map_err(invalid)?;
    if let (HybridFfn::Experts(_), Some(o), Some(width)) = (
        ffn,
        json.as_object_mut(),
        hybrid.moe_intermediate_size,
    ) {
        o.entry("intermediate_size").or_insert(width.into());
    }
    let bytes = serde_json::to_vec(&json).map_err(invalid)?;
    let mut llama: LlamaConfig = llama::parse_config(&bytes, config_path)?;
    let rotary_share =
        take_partial_rotary(&mut llama, hybrid.partial_rotary_factor).map_err(err)?;
    // Our own reading of the layer types; Llama's reads sliding windows from them.
    llama.layer_types = None;
    let mut c = llama.model_config_of(&qwen3::VARIANT).map_err(err)?;
    hybrid_config(&mut c, &hybrid, rotary_share).map_err(err)?;
    match ffn {
        HybridFfn::Dense => {
            if let Some(n) = hybrid.num_experts.filter(|&n| n > 0) {
                return Err(err(format!(
                    "num_experts {n} is not supported by the dense {text_type} (Qwen3.5-MoE is \
                     qwen3_5_moe_text)"
                )));
            }
        }
        HybridFfn::Experts(normalise) => {
            c.experts = HfExperts::parse(&bytes)
                .and_then(|h| h.config_with_shared(llama.intermediate_size, normalise))
                .map_err(err)?;
            if c.experts.is_none() {
                return Err(err("num_experts is missing (the family has experts)".into()));
            }
        }
    }
    c.validate().map_err(err)?;
    Ok(c)
}

/// Removes the rotated share of each head from `llama`'s rotary fields (Llama's reader refuses
/// it) and the M-RoPE sections (equal positions for text), returning the share (default 1;
/// transformers' default for Qwen3.5 is 0.25, which its configs write out).
fn take_partial_rotary(
    llama: &mut LlamaConfig,
    top: Option<f64>,
) -> std::result::Result<f64, String> {
    let mut share = top;
    llama.partial_rotary_factor = None;
    if let Some(serde_json::Value::Object(p)) = llama.rope_parameters.as_mut() {
        if let Some(v) = p.remove("partial_rotary_factor") {
            share = Some(v.as_f64().ok_or(format!(
                "rope_parameters.partial_rotary_factor {v} is not a number"
            ))?);
        }
        p.remove("mrope_section");
        p.remove("mrope_interleaved");
    }
    Ok(share.unwrap_or(1.0))
}

/// Qwen3.5's options on a Qwen3 config `c`: zero-centred norms, the gated attention rotating
/// `rotary_share` of each head, the Gated DeltaNet layers; what is not computed named.
fn hybrid_config(
    c: &mut ModelConfig,
    h: &HybridFields,
    rotary_share: f64,
) -> std::result::Result<(), String> {
    if c.rope_scaling.is_some() {
        return Err("rope scaling is not supported with Qwen3.5's partial rotation".into());
    }
    if h.attn_output_gate == Some(false) {
        return Err(
            "attn_output_gate false is not supported (Qwen3.5's attention is gated)".into(),
        );
    }
    let d_head = c.d_head();
    let rotary = (d_head as f64 * rotary_share) as usize;
    if !(rotary_share > 0.0 && rotary_share <= 1.0) || rotary == 0 || !rotary.is_multiple_of(2) {
        return Err(format!(
            "partial_rotary_factor {rotary_share} of heads of {d_head} is not an even number of \
             rotated columns"
        ));
    }
    if h.layer_types.len() != c.n_decoder_layers {
        return Err(format!(
            "layer_types has {} entries for {} layers",
            h.layer_types.len(),
            c.n_decoder_layers
        ));
    }
    let layers = h
        .layer_types
        .iter()
        .map(|t| match t.as_str() {
            "linear_attention" => Ok(true),
            "full_attention" => Ok(false),
            other => Err(format!(
                "layer_types entry {other:?} is not supported (linear_attention and \
                 full_attention are)"
            )),
        })
        .collect::<std::result::Result<Vec<bool>, String>>()?;
    c.norm_weight_offset = 1.0;
    c.attn_output_gate = true;
    c.rotary_dim = (rotary < d_head).then_some(rotary);
    c.gated_delta = Some(GatedDeltaConfig {
        layers,
        key_heads: h.linear_num_key_heads,
        d_key: h.linear_key_head_dim,
        value_heads: h.linear_num_value_heads,
        d_value: h.linear_value_head_dim,
        conv_kernel: h.linear_conv_kernel_dim,
    });
    Ok(())
}

/// The tensors of a hybrid family's directory in our layout: a multimodal checkpoint's
/// language model as a text model's ([`multimodal::language_model_tensors`]); Llama's dropped
/// (rotary buffers, a tied `lm_head`) and the multi-token-prediction head (`mtp.*`, not used
/// for decoding) with them; each convolution `[conv_dim, 1, K]` as `[conv_dim, K]`; each
/// attention's `q_proj` `[heads · 2·d_k, d_model]` split head by head into `q_proj` and
/// `gate_proj` `[heads · d_k, d_model]` each; experts stored whole split one by one
/// ([`moe::split_whole_experts_hf`]).
pub fn hybrid_tensors(dir: &Path, tensors: TensorMap, config: &ModelConfig) -> Result<TensorMap> {
    let tensors = multimodal::language_model_tensors(dir, tensors)?;
    let mut tensors = llama::hf_tensors(dir, tensors, config)?;
    tensors.retain(|name, _| !name.starts_with("mtp."));
    moe::split_whole_experts_hf(dir, &mut tensors, config)?;
    let d_head = config.d_head();
    for i in 0..config.n_decoder_layers {
        let conv = format!("model.layers.{i}.linear_attn.conv1d.weight");
        if let Some((shape, _)) = tensors.get_mut(&conv) {
            match shape[..] {
                [c, 1, k] => *shape = vec![c, k],
                _ => {
                    return Err(ckpt_err(
                        dir,
                        format!("tensor {conv} has shape {shape:?}, not [channels, 1, taps]"),
                    ))
                }
            }
        }
        let q = format!("model.layers.{i}.self_attn.q_proj.weight");
        let Some((shape, data)) = tensors.remove(&q) else {
            continue;
        };
        let [rows, cols] = shape[..] else {
            return Err(ckpt_err(
                dir,
                format!("tensor {q} has shape {shape:?}, not a matrix"),
            ));
        };
        if !rows.is_multiple_of(2 * d_head) {
            return Err(ckpt_err(
                dir,
                format!("tensor {q} has {rows} rows, not a query and a gate of {d_head} per head"),
            ));
        }
        // Head h's rows: the query's d_k, then the gate's d_k.
        let (mut query, mut gate) = (
            Vec::with_capacity(data.len() / 2),
            Vec::with_capacity(data.len() / 2),
        );
        for head in data.chunks(2 * d_head * cols) {
            query.extend_from_slice(&head[..d_head * cols]);
            gate.extend_from_slice(&head[d_head * cols..]);
        }
        tensors.insert(q, (vec![rows / 2, cols], query));
        let g = format!("model.layers.{i}.self_attn.gate_proj.weight");
        tensors.insert(g, (vec![rows / 2, cols], gate));
    }
    Ok(tensors)
}
