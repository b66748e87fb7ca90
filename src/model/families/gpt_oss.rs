//! gpt-oss (OpenAI 2025; gpt-oss-20b, gpt-oss-120b): Llama's pre-norm blocks with
//!
//! - biases on the query, key, value and output projections (`attention_bias`);
//! - an attention sink per head ([`ModelConfig::attention_sinks`], `self_attn.sinks`): a logit
//!   that joins each softmax's denominator and carries no value;
//! - alternating sliding-window (128) and full layers (`layer_types`; absent: even layers
//!   slide, as transformers fills it);
//! - YaRN rotary scaling (`rope_parameters`, `truncate` false) over Hugging Face's halves;
//! - every FFN a mixture of `num_local_experts` experts of `intermediate_size`: a router with a
//!   bias picks `num_experts_per_tok` by their logits and weighs them by the softmax of those
//!   logits (our normalised routing), and each expert is a clamped SwiGLU with biases
//!   ([`SwigluClamp`]: `swiglu_alpha`, `swiglu_limit`).
//!
//! Hugging Face stores each layer's experts merged and transposed (`x W`, not `x Wᵀ`):
//! `mlp.experts.gate_up_proj [E, d_model, 2·d_ff]` with the gate in the even columns and the up
//! projection in the odd ones, `gate_up_proj_bias [E, 2·d_ff]`, `down_proj [E, d_ff, d_model]`,
//! `down_proj_bias [E, d_model]`; `hf_tensors` splits them into one `[out, in]` matrix per
//! expert. Experts stored in MXFP4 (`*_blocks`, `*_scales`, a `quantization_config`) are refused
//! by name.

use super::llama::{self, gguf_names, hf_names, LlamaConfig, Variant, WindowRule};
use super::{Family, FamilyKind, GgufDecoder, HfDecoder};
use crate::error::Result;
use crate::model::checkpoint::RenameTable;
use crate::model::config::{ExpertsConfig, ModelConfig, RopeScaling, RopeStyle, SwigluClamp};
use crate::store::gguf::GgufFile;
use crate::store::{ckpt_err, TensorMap};
use serde::Deserialize;
use std::path::Path;

/// gpt-oss's variant of the Llama config: windows from `layer_types`; its biases are all four
/// projections' ([`ModelConfig::bias`]), not Qwen2's three.
const VARIANT: Variant = Variant {
    qkv_bias: false,
    qk_norm: false,
    windows: WindowRule::Qwen,
};

/// The row of [`super::FAMILIES`].
pub const FAMILY: Family = Family {
    name: "gpt_oss",
    kind: FamilyKind::Decoder,
    model_types: &["gpt_oss"],
    hf_names: HF_NAMES,
    hf_decoder: Some(HfDecoder {
        config: hf_config,
        tensors: hf_tensors,
    }),
    gguf: Some(GgufDecoder {
        architecture: "gpt-oss",
        config: gguf_config,
        names: GGUF_NAMES,
        fused: &[],
    }),
    chat_template: None,
};

/// Hugging Face gpt-oss tensor names (the experts split by `hf_tensors`) -> our module paths.
pub const HF_NAMES: RenameTable = RenameTable(&[
    hf_names::EMBEDDING,
    hf_names::ATTENTION,
    &[(
        "model.layers.{i}.self_attn.sinks",
        "layers.{i}.self_attn.sinks",
    )],
    hf_names::NORMS,
    &[
        ("model.layers.{i}.mlp.router.", "layers.{i}.ffn.router."),
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
    ],
    hf_names::FINAL_NORM,
    hf_names::HEAD,
]);

/// llama.cpp's gpt-oss tensor names -> our module paths (the merged experts and their biases
/// split per expert at load: `super::experts::split_experts`).
pub const GGUF_NAMES: RenameTable = RenameTable(&[
    gguf_names::EMBEDDING,
    gguf_names::ATTENTION,
    &[("blk.{i}.attn_sinks.weight", "layers.{i}.self_attn.sinks")],
    &[
        ("blk.{i}.attn_norm.", "layers.{i}.self_attn_norm."),
        ("blk.{i}.post_attention_norm.", "layers.{i}.ffn_norm."),
    ],
    gguf_names::EXPERTS,
    gguf_names::FINAL_NORM,
    gguf_names::HEAD,
]);

/// gpt-oss's own fields of `config.json`.
#[derive(Deserialize)]
struct GptOssFields {
    num_local_experts: usize,
    num_experts_per_tok: usize,
    #[serde(default = "default_alpha")]
    swiglu_alpha: f64,
    #[serde(default = "default_limit")]
    swiglu_limit: f64,
    /// transformers' default is true.
    #[serde(default = "default_true")]
    attention_bias: bool,
    #[serde(default)]
    quantization_config: Option<serde_json::Value>,
}

fn default_alpha() -> f64 {
    1.702
}

fn default_limit() -> f64 {
    7.0
}

fn default_true() -> bool {
    true
}

/// The clamped SwiGLU of gpt-oss's experts as llama.cpp and transformers' defaults compute it.
pub const GPT_OSS_CLAMP: SwigluClamp = SwigluClamp {
    alpha: 1.702,
    limit: 7.0,
};

/// A Hugging Face directory's `config.json` of `model_type` `gpt_oss`, as our config.
fn hf_config(bytes: &[u8], config_path: &Path, dir: &Path) -> Result<ModelConfig> {
    let err = |e: String| ckpt_err(dir, format!("config.json: {e}"));
    let own: GptOssFields = serde_json::from_slice(bytes)
        .map_err(|e| ckpt_err(config_path, format!("invalid gpt-oss config: {e}")))?;
    if let Some(q) = &own.quantization_config {
        let method = q.get("quant_method").and_then(|m| m.as_str()).unwrap_or("?");
        return Err(err(format!(
            "quantization_config (quant_method {method}: experts stored as *_blocks/*_scales) is \
             not supported in a Hugging Face directory; a dequantised (bf16) checkpoint or a GGUF \
             file loads"
        )));
    }
    let mut config: LlamaConfig = llama::parse_config(bytes, config_path)?;
    // transformers fills `layer_types` so: the even layers slide.
    if config.layer_types.is_none() {
        let types = (0..config.num_hidden_layers).map(|i| match i % 2 {
            0 => "sliding_attention".to_string(),
            _ => "full_attention".to_string(),
        });
        config.layer_types = Some(types.collect());
    }
    // The Llama reader refuses biases: gpt-oss's are all four projections', set below.
    config.attention_bias = false;
    let mut c = config.model_config_of(&VARIANT).map_err(err)?;
    c.bias = own.attention_bias;
    c.attention_sinks = true;
    c.experts = Some(ExpertsConfig {
        shared_d_ff: None,
        n_experts: own.num_local_experts,
        top_k: own.num_experts_per_tok,
        d_ff: config.intermediate_size,
        normalise: true,
        bias: true,
        swiglu_clamp: Some(SwigluClamp {
            alpha: own.swiglu_alpha,
            limit: own.swiglu_limit,
        }),
    });
    c.validate().map_err(err)?;
    Ok(c)
}

/// The tensors of a Hugging Face gpt-oss directory with each layer's merged experts split into
/// one `[out, in]` matrix (and bias) per expert, named as [`HF_NAMES`] reads them (module docs).
pub(super) fn hf_tensors(dir: &Path, tensors: TensorMap, config: &ModelConfig) -> Result<TensorMap> {
    let mut tensors = llama::hf_tensors(dir, tensors, config)?;
    if let Some(name) = tensors
        .keys()
        .find(|n| n.ends_with("_blocks") || n.ends_with("_scales"))
    {
        return Err(ckpt_err(
            dir,
            format!(
                "tensor {name}: experts stored in MXFP4 (*_blocks/*_scales) are not supported in \
                 a Hugging Face directory; a dequantised (bf16) checkpoint or a GGUF file loads"
            ),
        ));
    }
    let (d, d_ff) = (config.d_model, config.experts.map_or(0, |e| e.d_ff));
    let n_experts = config.experts.map_or(0, |e| e.n_experts);
    for i in 0..config.n_decoder_layers {
        let stem = format!("model.layers.{i}.mlp.experts");
        let mut take = |what: &str, shape: &[usize]| -> Result<Vec<f32>> {
            let name = format!("{stem}.{what}");
            let (got, data) = tensors
                .remove(&name)
                .ok_or_else(|| ckpt_err(dir, format!("tensor {name} is missing")))?;
            if got != shape {
                return Err(ckpt_err(
                    dir,
                    format!("tensor {name} has shape {got:?}, not {shape:?}"),
                ));
            }
            Ok(data)
        };
        let e = n_experts;
        // [E, d_model, 2·d_ff], [E, 2·d_ff], [E, d_ff, d_model], [E, d_model]
        let gate_up = take("gate_up_proj", &[e, d, 2 * d_ff])?;
        let gate_up_bias = take("gate_up_proj_bias", &[e, 2 * d_ff])?;
        let down = take("down_proj", &[e, d_ff, d])?;
        let down_bias = take("down_proj_bias", &[e, d])?;
        for k in 0..e {
            let w = &gate_up[k * d * 2 * d_ff..(k + 1) * d * 2 * d_ff];
            // gate, up: [d_ff, d_model], row j the even (gate) or odd (up) column 2j(+1) of w
            let column = |c: usize| (0..d).map(move |m| w[m * 2 * d_ff + c]);
            let gate: Vec<f32> = (0..d_ff).flat_map(|j| column(2 * j)).collect();
            let up: Vec<f32> = (0..d_ff).flat_map(|j| column(2 * j + 1)).collect();
            let b = &gate_up_bias[k * 2 * d_ff..(k + 1) * 2 * d_ff];
            let gate_b: Vec<f32> = b.iter().step_by(2).copied().collect();
            let up_b: Vec<f32> = b.iter().skip(1).step_by(2).copied().collect();
            // down: [d_model, d_ff], the transpose of the stored [d_ff, d_model]
            let w = &down[k * d_ff * d..(k + 1) * d_ff * d];
            let down_w: Vec<f32> = (0..d)
                .flat_map(|m| (0..d_ff).map(move |j| w[j * d + m]))
                .collect();
            let down_b = down_bias[k * d..(k + 1) * d].to_vec();
            let name = |p: &str, t: &str| format!("{stem}.{k}.{p}.{t}");
            tensors.insert(name("gate_proj", "weight"), (vec![d_ff, d], gate));
            tensors.insert(name("gate_proj", "bias"), (vec![d_ff], gate_b));
            tensors.insert(name("up_proj", "weight"), (vec![d_ff, d], up));
            tensors.insert(name("up_proj", "bias"), (vec![d_ff], up_b));
            tensors.insert(name("down_proj", "weight"), (vec![d, d_ff], down_w));
            tensors.insert(name("down_proj", "bias"), (vec![d], down_b));
        }
    }
    Ok(tensors)
}

/// The config of a GGUF file of architecture `gpt-oss`: Llama's keys, NEOX rotation, YaRN as
/// transformers computes gpt-oss's (an untruncated ramp: `truncate` false), every attention with
/// biases and sinks, the even layers sliding (`attention.sliding_window`, llama.cpp's pattern of
/// two; another `attention.sliding_window_pattern` or `rope.freq_base_swa` refused by key), the router and experts with biases and the clamped SwiGLU of [`GPT_OSS_CLAMP`]
/// (llama.cpp's constants: the file states none), the chosen logits' softmax as weights.
fn gguf_config(file: &GgufFile) -> Result<ModelConfig> {
    let path = file.path();
    let mut c = llama::gguf_config_of(file, &VARIANT, RopeStyle::HalfSplit)?;
    // llama.cpp's keys for other layouts of the sliding layers: refused unless they say ours.
    let pattern_key = "gpt-oss.attention.sliding_window_pattern";
    if let Some(n) = file.get::<usize>(pattern_key)?.filter(|&n| n != 2) {
        let why = format!("{pattern_key} {n} is not supported (every other layer slides)");
        return Err(ckpt_err(path, why));
    }
    let base_key = "gpt-oss.rope.freq_base_swa";
    if let Some(b) = file.get::<f64>(base_key)?.filter(|&b| b != c.rope_base) {
        let why = format!("{base_key} {b} is not supported (one rotary base for every layer)");
        return Err(ckpt_err(path, why));
    }
    let window = c.layer_windows.iter().flatten().next().copied();
    c.layer_windows = match window {
        Some(w) => (0..c.n_decoder_layers).map(|i| (i % 2 == 0).then_some(w)).collect(),
        None => Vec::new(),
    };
    if let Some(RopeScaling::Yarn { truncate, .. }) = &mut c.rope_scaling {
        *truncate = false;
    }
    (c.bias, c.attention_sinks) = (true, true);
    let e = c.experts.as_mut().ok_or_else(|| {
        ckpt_err(path, "gpt-oss.expert_count is missing (the family has experts)")
    })?;
    (e.normalise, e.bias, e.swiglu_clamp) = (true, true, Some(GPT_OSS_CLAMP));
    c.validate().map_err(|e| ckpt_err(path, e))?;
    Ok(c)
}
