//! Qwen3.5-MoE (Qwen team 2026; Qwen3.5-35B-A3B): Qwen3.5's hybrid stack ([`super::qwen3_5`]:
//! Gated DeltaNet layers around gated, partially rotated full-attention layers, zero-centred
//! norms) with every FFN a mixture of experts (`crate::model::experts`): `num_experts` SwiGLU
//! experts of `moe_intermediate_size`, a softmax router picking `num_experts_per_tok` whose
//! chosen weights are always renormalised (transformers' `Qwen3_5MoeTopKRouter` divides by
//! their sum; the config has no `norm_topk_prob`), and a shared SwiGLU expert of
//! `shared_expert_intermediate_size` scaled by `σ(x w_gᵀ)`:
//!
//! `y = Σ_{e ∈ top_k} (p_e / Σ_{j ∈ top_k} p_j) FFN_e(x) + σ(x w_gᵀ) FFN_s(x)`.
//!
//! `model_type` `qwen3_5_moe_text` (`Qwen3_5MoeForCausalLM`), or the multimodal `qwen3_5_moe`
//! (`Qwen3_5MoeForConditionalGeneration`) read as its text model ([`super::multimodal`]).
//! Tensors: Qwen3.5's names ([`super::qwen3_5::HF_NAMES`]); the experts expert by expert
//! (`mlp.experts.{e}.{gate,up,down}_proj`) or whole, as transformers 5 holds them
//! (`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`), split at load. llama.cpp's
//! `qwen35moe` GGUF files do not load yet.

use super::experts::Normalise;
use super::qwen3_5::{self, HybridFfn};
use super::{Family, FamilyKind, HfDecoder};
use crate::error::Result;
use crate::model::config::ModelConfig;
use std::path::Path;

/// The row of [`super::FAMILIES`].
pub const FAMILY: Family = Family {
    name: "qwen3_5_moe",
    kind: FamilyKind::Decoder,
    model_types: &["qwen3_5_moe_text", "qwen3_5_moe"],
    hf_names: qwen3_5::HF_NAMES,
    hf_decoder: Some(HfDecoder {
        config: hf_config,
        tensors: qwen3_5::hybrid_tensors,
    }),
    gguf: None,
    chat_template: None,
};

/// A Hugging Face directory's `config.json` of `model_type` `qwen3_5_moe_text` (or the
/// multimodal `qwen3_5_moe`), as our config: the chosen experts' weights always normalised.
fn hf_config(bytes: &[u8], config_path: &Path, dir: &Path) -> Result<ModelConfig> {
    let ffn = HybridFfn::Experts(Normalise::Always);
    qwen3_5::hybrid_hf_config((bytes, config_path, dir), "qwen3_5_moe_text", ffn)
}
