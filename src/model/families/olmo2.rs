//! OLMo 2 (Team OLMo 2024) and OLMo 3 (2025): Llama-style decoders whose norms follow each
//! sublayer instead of preceding it, `h = x + PostNorm(Attn(x))`, `y = h + PostNorm(FFN(h))`
//! (no input norms: [`ModelConfig::input_norms`] false, [`ModelConfig::post_norms`]; the
//! final norm stays), with RMSNorms of the whole projected queries and keys, all heads at
//! once, before the rotation ([`ModelConfig::qk_norm_whole`]: gains `[heads·d_k]` and
//! `[kv_heads·d_k]`), SwiGLU and no biases.
//!
//! OLMo 3 adds sliding windows: `layer_types` names each layer's kind (without it, every
//! fourth layer is full and the others slide), `sliding_window` their width (4096 when absent),
//! and `rope_parameters` per kind: the full layers' base and scaling, the sliding layers' base,
//! unscaled ([`ModelConfig::sliding_rope_base`]); a config that states no base has 500000.
//!
//! Storage: Hugging Face names are Llama's with the query/key norms and the two post-norms
//! (`post_attention_layernorm`, `post_feedforward_layernorm`); GGUF: architecture `olmo2` for
//! both (llama.cpp's converter writes OLMo 3 as `olmo2` with `olmo2.attention.sliding_window`
//! and a per-layer `olmo2.attention.sliding_window_pattern`), Llama's names with
//! `attn_{q,k}_norm`, `post_attention_norm` and `post_ffw_norm`, Hugging Face's rotary halves
//! (NEOX rotation); llama.cpp rotates the sliding layers with the same base, unscaled.

use super::llama::{self, gguf_names, hf_names, LlamaConfig, Variant, WindowRule};
use super::{Family, FamilyKind, GgufDecoder, HfDecoder};
use crate::error::Result;
use crate::model::checkpoint::RenameTable;
use crate::model::config::{ModelConfig, RopeStyle};
use crate::store::ckpt_err;
use crate::store::gguf::{GgufFile, Value};
use serde::Deserialize;
use std::path::Path;

/// OLMo 2's variant of the Llama config: query and key norms, no window.
pub const OLMO2_VARIANT: Variant = Variant {
    qkv_bias: false,
    qk_norm: true,
    windows: WindowRule::Never,
};

/// OLMo 3's: OLMo 2's with the sliding layers `layer_types` names.
pub const OLMO3_VARIANT: Variant = Variant {
    windows: WindowRule::Qwen,
    ..OLMO2_VARIANT
};

/// The OLMo 2 row of [`super::FAMILIES`] (with the GGUF architecture `olmo2`, OLMo 3's too).
pub const OLMO2: Family = Family {
    name: "olmo2",
    kind: FamilyKind::Decoder,
    model_types: &["olmo2"],
    hf_names: HF_NAMES,
    hf_decoder: Some(HfDecoder {
        config: hf_config_olmo2,
        tensors: llama::hf_tensors,
    }),
    gguf: Some(GgufDecoder {
        architecture: "olmo2",
        config: gguf_config,
        names: GGUF_NAMES,
        fused: &[],
    }),
    chat_template: None,
};

/// The OLMo 3 row of [`super::FAMILIES`] (its GGUF files are `olmo2`'s).
pub const OLMO3: Family = Family {
    name: "olmo3",
    kind: FamilyKind::Decoder,
    model_types: &["olmo3"],
    hf_names: HF_NAMES,
    hf_decoder: Some(HfDecoder {
        config: hf_config_olmo3,
        tensors: llama::hf_tensors,
    }),
    gguf: None,
    chat_template: None,
};

/// Hugging Face OLMo 2 / 3 tensor names -> our module paths: Llama's with the query/key norms
/// and the norms after each sublayer in place of those before.
pub const HF_NAMES: RenameTable = RenameTable(&[
    hf_names::EMBEDDING,
    hf_names::ATTENTION,
    hf_names::QK_NORMS,
    &[
        (
            "model.layers.{i}.post_attention_layernorm.",
            "layers.{i}.self_attn_post_norm.",
        ),
        (
            "model.layers.{i}.post_feedforward_layernorm.",
            "layers.{i}.ffn_post_norm.",
        ),
    ],
    hf_names::FFN,
    hf_names::FINAL_NORM,
    hf_names::HEAD,
]);

/// llama.cpp's OLMo 2 tensor names -> our module paths.
pub const GGUF_NAMES: RenameTable = RenameTable(&[
    gguf_names::EMBEDDING,
    gguf_names::ATTENTION,
    gguf_names::QK_NORMS,
    gguf_names::POST_NORMS,
    gguf_names::FFN,
    gguf_names::FINAL_NORM,
    gguf_names::HEAD,
]);

/// transformers' `Olmo3Config`: the rotary base of a config that states none, and the window.
const OLMO3_THETA: f64 = 500_000.0;
const OLMO3_WINDOW: usize = 4096;

/// The fields of an OLMo `config.json` that Llama's do not cover.
#[derive(Deserialize)]
struct OlmoFields {
    /// OLMo 1's clipping of the projections (not computed).
    #[serde(default)]
    clip_qkv: Option<f64>,
}

/// OLMo 2's blocks on a Llama-style config: norms after the sublayers only, query/key norms
/// over the whole projections.
fn olmo_blocks(mut c: ModelConfig) -> std::result::Result<ModelConfig, String> {
    (c.qk_norm, c.qk_norm_whole) = (true, true);
    (c.post_norms, c.input_norms) = (true, false);
    c.validate()?;
    Ok(c)
}

/// The Llama fields of an OLMo `config.json` (`bytes`, read from `config_path`), refusing
/// OLMo 1's `clip_qkv` by name.
fn parse(bytes: &[u8], config_path: &Path, dir: &Path) -> Result<LlamaConfig> {
    let own: OlmoFields = serde_json::from_slice(bytes)
        .map_err(|e| ckpt_err(config_path, format!("invalid OLMo config: {e}")))?;
    if let Some(c) = own.clip_qkv {
        let why =
            format!("config.json: clip_qkv {c} is not supported (unclipped projections only)");
        return Err(ckpt_err(dir, why));
    }
    llama::parse_config(bytes, config_path)
}

/// A Hugging Face directory's `config.json` of `model_type` `olmo2`, as our config.
fn hf_config_olmo2(bytes: &[u8], config_path: &Path, dir: &Path) -> Result<ModelConfig> {
    let err = |e: String| ckpt_err(dir, format!("config.json: {e}"));
    let c = parse(bytes, config_path, dir)?
        .model_config_of(&OLMO2_VARIANT)
        .map_err(err)?;
    olmo_blocks(c).map_err(err)
}

/// OLMo 3's `rope_parameters` per layer kind.
#[derive(Deserialize)]
struct RopePerKind {
    full_attention: serde_json::Value,
    #[serde(default)]
    sliding_attention: Option<serde_json::Value>,
}

/// The sliding layers' rotary base of an OLMo 3 config, its `rope_parameters` replaced by the
/// full layers' (Llama's reader then reads their base and scaling); the sliding layers must
/// rotate unscaled.
fn split_rope(llama: &mut LlamaConfig) -> std::result::Result<f64, String> {
    let theta = llama.rope_theta.unwrap_or(OLMO3_THETA);
    llama.rope_theta = Some(theta);
    let Some(params) = llama.rope_parameters.take().filter(|p| !p.is_null()) else {
        return Ok(theta);
    };
    let kinds: RopePerKind = serde_json::from_value(params).map_err(|e| {
        format!("rope_parameters is not one entry per layer kind (full_attention, sliding_attention): {e}")
    })?;
    llama.rope_parameters = Some(kinds.full_attention);
    let Some(sliding) = kinds.sliding_attention.filter(|s| !s.is_null()) else {
        return Ok(theta);
    };
    match sliding.get("rope_type").and_then(|t| t.as_str()) {
        None | Some("default") => {}
        Some(other) => {
            return Err(format!(
                "rope_parameters.sliding_attention.rope_type {other:?} is not supported (default)"
            ))
        }
    }
    match sliding.get("rope_theta") {
        None => Ok(theta),
        Some(v) => v.as_f64().ok_or_else(|| {
            format!("rope_parameters.sliding_attention.rope_theta {v} is not a number")
        }),
    }
}

/// A Hugging Face directory's `config.json` of `model_type` `olmo3`, as our config.
fn hf_config_olmo3(bytes: &[u8], config_path: &Path, dir: &Path) -> Result<ModelConfig> {
    let err = |e: String| ckpt_err(dir, format!("config.json: {e}"));
    let mut llama = parse(bytes, config_path, dir)?;
    let sliding_base = split_rope(&mut llama).map_err(err)?;
    let raw: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| ckpt_err(config_path, format!("invalid OLMo 3 config: {e}")))?;
    if raw.get("sliding_window").is_none() {
        llama.sliding_window = Some(OLMO3_WINDOW);
    }
    let n = llama.num_hidden_layers;
    llama.layer_types.get_or_insert_with(|| {
        let kind = |i: usize| match (i + 1) % 4 {
            0 => "full_attention",
            _ => "sliding_attention",
        };
        (0..n).map(|i| kind(i).to_string()).collect()
    });
    let mut c = llama.model_config_of(&OLMO3_VARIANT).map_err(err)?;
    if !c.layer_windows.is_empty() {
        c.sliding_rope_base = Some(sliding_base);
    }
    olmo_blocks(c).map_err(err)
}

/// Which of `n` layers slide in a GGUF file of architecture `olmo2`, as llama.cpp reads
/// `olmo2.attention.sliding_window_pattern`: one bool per layer, or a period `p` (layer `i`
/// slides when `i mod p < p − 1`; 0: all), 4 when absent.
fn gguf_sliding_layers(file: &GgufFile, n: usize) -> Result<Vec<bool>> {
    let key = "olmo2.attention.sliding_window_pattern";
    let bad = |why: String| ckpt_err(file.path(), format!("{key} {why}"));
    let period = |p: usize| -> Vec<bool> { (0..n).map(|i| p == 0 || i % p < p - 1).collect() };
    match file.value(key) {
        None => Ok(period(4)),
        Some(Value::Array(_, items)) => {
            if items.len() < n {
                return Err(bad(format!("has {} entries for {n} layers", items.len())));
            }
            (items[..n].iter())
                .map(|v| {
                    v.as_bool()
                        .ok_or_else(|| bad(format!("holds {}, not bools", v.describe())))
                })
                .collect()
        }
        Some(v) => match v.as_integer().and_then(|p| usize::try_from(p).ok()) {
            Some(p) => Ok(period(p)),
            None => Err(bad(format!("is {}, not bools or a period", v.describe()))),
        },
    }
}

/// The config of a GGUF file of architecture `olmo2` (OLMo 2, and OLMo 3 with its windows).
fn gguf_config(file: &GgufFile) -> Result<ModelConfig> {
    let path = file.path();
    let mut c = llama::gguf_config_of(file, &OLMO2_VARIANT, RopeStyle::HalfSplit)?;
    // Llama's reader gives a window to every layer; llama.cpp's pattern says which slide.
    if let Some(w) = c.layer_windows.first().copied().flatten() {
        let sliding = gguf_sliding_layers(file, c.n_decoder_layers)?;
        c.layer_windows = match sliding.contains(&true) {
            true => sliding.iter().map(|&s| s.then_some(w)).collect(),
            false => Vec::new(),
        };
        if let Some(b) = file
            .get::<f64>("olmo2.rope.freq_base_swa")?
            .filter(|&b| b != c.rope_base)
        {
            let why = format!(
                "olmo2.rope.freq_base_swa {b} differs from olmo2.rope.freq_base {} (llama.cpp \
                 rotates the sliding layers with the latter)",
                c.rope_base
            );
            return Err(ckpt_err(path, why));
        }
        c.sliding_rope_base = (!c.layer_windows.is_empty()).then_some(c.rope_base);
    }
    olmo_blocks(c).map_err(|e| ckpt_err(path, e))
}
