//! Gemma 2 and Gemma 3 (text) decoders (Gemma Team 2024, 2025): the Llama-style stack with
//! Gemma's changes, each one a plain option of [`ModelConfig`]:
//!
//! - token embeddings scaled by `√d_model`, rounded to float32 as transformers rounds its
//!   normaliser to the hidden dtype ([`ModelConfig::embedding_scale`]); the output projection
//!   tied to them;
//! - RMSNorm gains stored as `g − 1` ([`ModelConfig::norm_weight_offset`] 1), four norms a layer:
//!   `h = x + PostNorm(Attn(Norm(x)))`, `y = h + PostNorm(FFN(Norm(h)))`
//!   ([`ModelConfig::post_norms`]);
//! - GeGLU, `down(gelu_tanh(gate(x)) ⊙ up(x))` ([`Activation::GeluTanhGated`]);
//! - scores `q·k / √query_pre_attn_scalar` ([`ModelConfig::query_pre_attn_scalar`]), soft-capped
//!   in Gemma 2 (`attn_logit_softcapping`), and the logits soft-capped (`final_logit_softcapping`);
//! - local layers of a sliding window and global ones ([`ModelConfig::layer_windows`]): Gemma 2
//!   alternates them (even layers local), Gemma 3 has five local layers to one global
//!   (`sliding_window_pattern` 6) or states each layer's kind (`layer_types`); Gemma 3's local
//!   layers rotate with their own base ([`ModelConfig::sliding_rope_base`], 10000);
//! - Gemma 3: an RMSNorm of every head's queries and keys before the rotation
//!   ([`ModelConfig::qk_norm`]).
//!
//! Storage: a Hugging Face directory (`model_type` `gemma2` or `gemma3_text`) names its tensors
//! as [`HF_NAMES`] maps them and pairs rotary columns as `rotate_half` does; a GGUF file
//! (`general.architecture` `gemma2` or `gemma3`) as [`GGUF_NAMES`] maps them, also half-split
//! (llama.cpp's NeoX rotation: its Gemma converter does not permute the rows), with every norm
//! gain already `1 + w` (the converter adds the one: offset 0).

use super::llama::{gguf_names, hf_names};
use super::{Family, FamilyKind, GgufDecoder, HfDecoder};
use crate::error::{Error, Result};
use crate::model::checkpoint::{RenameTable, Renames};
use crate::model::config::{
    Activation, ModelConfig, NormPlacement, Normalization, Positions, RopeScaling, RopeStyle,
    ROPE_BASE,
};
use crate::store::gguf::GgufFile;
use crate::store::gguf_llama::LlamaGgufConfig;
use crate::store::{ckpt_err, TensorMap};
use serde::Deserialize;
use std::path::Path;

/// The Gemma 2 row of [`super::FAMILIES`].
pub const GEMMA2: Family = Family {
    name: "gemma2",
    kind: FamilyKind::Decoder,
    model_types: &["gemma2"],
    hf_names: HF_NAMES,
    hf_decoder: Some(HfDecoder {
        config: hf_config,
        tensors: hf_tensors,
    }),
    gguf: Some(GgufDecoder {
        architecture: "gemma2",
        config: gguf_config,
        names: GGUF_NAMES,
        fused: &[],
    }),
    chat_template: None,
};

/// The Gemma 3 (text) row of [`super::FAMILIES`].
pub const GEMMA3: Family = Family {
    name: "gemma3",
    kind: FamilyKind::Decoder,
    model_types: &["gemma3_text"],
    hf_names: HF_NAMES,
    hf_decoder: Some(HfDecoder {
        config: hf_config,
        tensors: hf_tensors,
    }),
    gguf: Some(GgufDecoder {
        architecture: "gemma3",
        config: gguf_config,
        names: GGUF_NAMES,
        fused: &[],
    }),
    chat_template: None,
};

/// Hugging Face Gemma 2 / 3 tensor names -> our module paths: Llama's with Gemma's four norms
/// a layer, the head always tied.
pub const HF_NAMES: RenameTable = RenameTable(&[
    hf_names::EMBEDDING,
    hf_names::ATTENTION,
    hf_names::QK_NORMS,
    HF_NORMS,
    hf_names::FFN,
    hf_names::FINAL_NORM,
]);

/// Gemma's norms before and after each sublayer.
const HF_NORMS: Renames = &[
    (
        "model.layers.{i}.input_layernorm.",
        "layers.{i}.self_attn_norm.",
    ),
    (
        "model.layers.{i}.post_attention_layernorm.",
        "layers.{i}.self_attn_post_norm.",
    ),
    (
        "model.layers.{i}.pre_feedforward_layernorm.",
        "layers.{i}.ffn_norm.",
    ),
    (
        "model.layers.{i}.post_feedforward_layernorm.",
        "layers.{i}.ffn_post_norm.",
    ),
];

/// llama.cpp's Gemma 2 / 3 tensor names -> our module paths: Llama's and the norms of the
/// sublayers' outputs.
pub const GGUF_NAMES: RenameTable = RenameTable(&[
    gguf_names::EMBEDDING,
    gguf_names::ATTENTION,
    gguf_names::QK_NORMS,
    gguf_names::NORMS,
    gguf_names::POST_NORMS,
    gguf_names::FFN,
    gguf_names::FINAL_NORM,
]);

/// Which Gemma.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Generation {
    /// Gemma 2: local and global layers alternate, soft-capped scores and logits.
    Two,
    /// Gemma 3 (text): five local layers to one global, query/key norms, a rotary base of
    /// its own for the local layers.
    Three,
}

impl Generation {
    /// The local layers when the file states no layer kinds: Gemma 2 even layers
    /// (llama.cpp's pattern 2), Gemma 3 all but every `pattern`-th (pattern 6).
    fn default_local(self, i: usize, pattern: usize) -> bool {
        match self {
            Generation::Two => i.is_multiple_of(2),
            Generation::Three => pattern == 0 || !(i + 1).is_multiple_of(pattern),
        }
    }
}

/// A Hugging Face `rope_parameters` entry (transformers 5) or a `rope_scaling` (4).
#[derive(Clone, Debug, Default, Deserialize)]
struct RopeEntry {
    #[serde(default)]
    rope_theta: Option<f64>,
    #[serde(default, alias = "type")]
    rope_type: Option<String>,
    #[serde(default)]
    factor: Option<f64>,
}

/// transformers 5's `rope_parameters`: one entry, or one per layer kind (Gemma 3).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum RopeParameters {
    PerLayerKind {
        full_attention: RopeEntry,
        sliding_attention: RopeEntry,
    },
    One(RopeEntry),
}

fn default_act() -> String {
    "gelu_pytorch_tanh".into()
}
fn yes() -> bool {
    true
}

/// The fields of a Hugging Face Gemma 2 / Gemma 3 text `config.json` that shape the
/// computation.
#[derive(Clone, Debug, Deserialize)]
struct GemmaConfig {
    model_type: String,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    #[serde(default)]
    num_key_value_heads: Option<usize>,
    #[serde(default)]
    head_dim: Option<usize>,
    rms_norm_eps: f64,
    max_position_embeddings: usize,
    #[serde(default = "default_act", alias = "hidden_act")]
    hidden_activation: String,
    #[serde(default = "yes")]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    attn_logit_softcapping: Option<f64>,
    #[serde(default)]
    final_logit_softcapping: Option<f64>,
    #[serde(default)]
    query_pre_attn_scalar: Option<f64>,
    #[serde(default)]
    sliding_window: Option<usize>,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
    #[serde(default, alias = "_sliding_window_pattern")]
    sliding_window_pattern: Option<usize>,
    #[serde(default)]
    rope_theta: Option<f64>,
    #[serde(default)]
    rope_local_base_freq: Option<f64>,
    #[serde(default)]
    rope_parameters: Option<RopeParameters>,
    #[serde(default)]
    rope_scaling: Option<RopeEntry>,
    #[serde(default)]
    use_bidirectional_attention: Option<bool>,
}

/// The shape every Gemma shares (before the generation's own options): pre-norm RMSNorm blocks
/// with post-norms, gains stored as `g − 1` (`norm_offset`), GeGLU, half-split rotary
/// positions, no biases, embeddings scaled by `√d_model` in float32, tied output projection.
#[allow(clippy::too_many_arguments)]
fn gemma_config(
    vocab_size: usize,
    d_model: usize,
    d_ff: usize,
    layers: usize,
    n_heads: usize,
    n_kv_heads: usize,
    eps: f64,
    max_len: usize,
    norm_offset: f64,
) -> ModelConfig {
    ModelConfig {
        vocab_size,
        d_model,
        n_heads,
        d_ff,
        n_encoder_layers: 0,
        n_decoder_layers: layers,
        dropout: 0.0,
        norm: NormPlacement::PreLn,
        layer_norm_eps: eps,
        tie_embeddings: true,
        max_len,
        activation: Activation::GeluTanhGated,
        positions: Positions::Rotary,
        attention_dropout: 0.0,
        activation_dropout: 0.0,
        bias: false,
        scale_embeddings: false,
        n_kv_heads: (n_kv_heads != n_heads).then_some(n_kv_heads),
        normalization: Normalization::RmsNorm,
        rope_base: ROPE_BASE,
        rope_style: RopeStyle::HalfSplit,
        rope_scaling: None,
        head_dim: None,
        layer_heads: Default::default(),
        qkv_bias: false,
        qk_norm: false,
        attn_logit_softcap: None,
        final_logit_softcap: None,
        output_bias: false,
        norm_weight_offset: norm_offset,
        // transformers: `hidden * torch.tensor(hidden_size**0.5, dtype=hidden.dtype)`.
        embedding_scale: Some((d_model as f32).sqrt() as f64),
        layer_windows: Vec::new(),
        query_pre_attn_scalar: None,
        post_norms: true,
        sliding_rope_base: None,
        layer_rope: Vec::new(),
        residual_scale: None,
        logit_divisor: None,
        input_norms: true,
        layer_attention: Vec::new(),
        encoder_layer_attention: Vec::new(),
        experts: None,
        embedding_norm: false,
        target_positions: false,
        source_eos: true,
        relative_buckets: crate::model::config::T5_BUCKETS,
        attn_output_gate: false,
        rotary_dim: None,
        gated_delta: None,
        qk_norm_whole: false,
        attention_sinks: false,
    }
}

/// The rotary base of the global layers, of the local ones, and the linear scaling factor of
/// the global ones, from whichever way the config states them (Gemma 3's local base defaults
/// to 10000, as transformers' `rope_local_base_freq`; Gemma 2's layers share one base).
fn hf_rope(
    c: &GemmaConfig,
    generation: Generation,
) -> std::result::Result<(f64, f64, Option<f64>), String> {
    let local_default = |global: f64| match generation {
        Generation::Two => global,
        Generation::Three => ROPE_BASE,
    };
    let linear = |e: &RopeEntry, kind: &str| -> std::result::Result<Option<f64>, String> {
        match e.rope_type.as_deref() {
            None | Some("default") => Ok(None),
            Some("linear") => {
                Ok(Some(e.factor.ok_or_else(|| {
                    format!("{kind} rope type linear has no factor")
                })?))
            }
            Some(other) => Err(format!(
                "{kind} rope type {other:?} is not supported (default or linear)"
            )),
        }
    };
    let theta = c.rope_theta.unwrap_or(ROPE_BASE);
    match &c.rope_parameters {
        Some(RopeParameters::PerLayerKind {
            full_attention,
            sliding_attention,
        }) => {
            if linear(sliding_attention, "sliding_attention")?.is_some() {
                return Err(
                    "a scaled rotary embedding on the sliding layers is not supported".into(),
                );
            }
            Ok((
                full_attention.rope_theta.unwrap_or(theta),
                sliding_attention.rope_theta.unwrap_or(ROPE_BASE),
                linear(full_attention, "full_attention")?,
            ))
        }
        Some(RopeParameters::One(e)) => {
            let global = e.rope_theta.unwrap_or(theta);
            let local = c.rope_local_base_freq.unwrap_or(local_default(global));
            Ok((global, local, linear(e, "rope_parameters")?))
        }
        None => {
            let factor = match &c.rope_scaling {
                Some(e) => linear(e, "rope_scaling")?,
                None => None,
            };
            let local = c.rope_local_base_freq.unwrap_or(local_default(theta));
            Ok((theta, local, factor))
        }
    }
}

impl GemmaConfig {
    /// Our config, or what the checkpoint uses that is not computed (named).
    fn model_config(&self) -> std::result::Result<ModelConfig, String> {
        let generation = match self.model_type.as_str() {
            "gemma2" => Generation::Two,
            "gemma3_text" => Generation::Three,
            other => {
                return Err(format!(
                    "model_type {other:?} is not a Gemma 2 / 3 text model"
                ))
            }
        };
        if self.hidden_activation != "gelu_pytorch_tanh" {
            return Err(format!(
                "hidden_activation {:?} is not supported (gelu_pytorch_tanh)",
                self.hidden_activation
            ));
        }
        if self.attention_bias {
            return Err("attention_bias true is not supported".into());
        }
        if self.use_bidirectional_attention == Some(true) {
            return Err("use_bidirectional_attention true is not supported (causal only)".into());
        }
        if !self.tie_word_embeddings {
            return Err("tie_word_embeddings false is not supported for Gemma".into());
        }
        let heads = self.num_attention_heads;
        if heads == 0 {
            return Err("num_attention_heads is 0".into());
        }
        // Heads of their own width (Gemma 2 2B: 8 of 256 over hidden_size 2304).
        let head_dim = self
            .head_dim
            .filter(|&d| !self.hidden_size.is_multiple_of(heads) || d != self.hidden_size / heads);
        if head_dim.is_none() && !self.hidden_size.is_multiple_of(heads) {
            return Err(format!(
                "hidden_size {} is not divisible by num_attention_heads {heads}",
                self.hidden_size
            ));
        }
        let n = self.num_hidden_layers;
        let local: Vec<bool> = match &self.layer_types {
            Some(types) => {
                if types.len() != n {
                    return Err(format!(
                        "layer_types has {} entries for {n} layers",
                        types.len()
                    ));
                }
                types
                    .iter()
                    .map(|t| match t.as_str() {
                        "sliding_attention" => Ok(true),
                        "full_attention" => Ok(false),
                        other => Err(format!("layer type {other:?} is not supported")),
                    })
                    .collect::<std::result::Result<_, _>>()?
            }
            None => {
                let pattern = self.sliding_window_pattern.unwrap_or(6);
                (0..n)
                    .map(|i| generation.default_local(i, pattern))
                    .collect()
            }
        };
        let window = match (self.sliding_window, local.contains(&true)) {
            (Some(w), _) => Some(w),
            (None, false) => None,
            (None, true) => return Err("sliding layers without a sliding_window".into()),
        };
        let (global_base, local_base, factor) = hf_rope(self, generation)?;
        let mut c = gemma_config(
            self.vocab_size,
            self.hidden_size,
            self.intermediate_size,
            n,
            heads,
            self.num_key_value_heads.unwrap_or(heads),
            self.rms_norm_eps,
            self.max_position_embeddings,
            1.0,
        );
        c.head_dim = head_dim;
        c.layer_windows = local
            .iter()
            .map(|&l| if l { window } else { None })
            .collect();
        c.rope_base = global_base;
        c.sliding_rope_base = (local_base != global_base).then_some(local_base);
        c.attn_logit_softcap = self.attn_logit_softcapping;
        c.final_logit_softcap = self.final_logit_softcapping;
        c.query_pre_attn_scalar = self.query_pre_attn_scalar;
        c.qk_norm = generation == Generation::Three;
        set_linear_rope_scaling(&mut c, factor)?;
        c.validate()?;
        Ok(c)
    }
}

/// Linear scaling of the global layers' rotary positions by `factor` (transformers'
/// `rope_type: linear`, llama.cpp's `rope.scaling.type linear`): every frequency divided by
/// it, `θᵢ / factor` ([`RopeScaling::FreqFactors`], which the layers of
/// [`ModelConfig::sliding_rope_base`] do not use).
fn set_linear_rope_scaling(
    c: &mut ModelConfig,
    factor: Option<f64>,
) -> std::result::Result<(), String> {
    if let Some(f) = factor {
        if !(f.is_finite() && f > 0.0) {
            return Err(format!(
                "linear rope scaling factor {f} must be a positive number"
            ));
        }
        if c.layer_windows.iter().all(Option::is_some) && c.sliding_rope_base.is_some() {
            return Ok(()); // no layer rotates with the scaled base
        }
        c.rope_scaling = Some(RopeScaling::FreqFactors {
            factors: vec![f; c.d_head() / 2],
        });
    }
    Ok(())
}

/// A Hugging Face directory's `config.json` (`bytes`, read from `config_path` in `dir`) for
/// `model_type` `gemma2` or `gemma3_text`, as our config.
fn hf_config(bytes: &[u8], config_path: &Path, dir: &Path) -> Result<ModelConfig> {
    let parsed: GemmaConfig = serde_json::from_slice(bytes).map_err(|e| Error::Checkpoint {
        path: config_path.to_path_buf(),
        reason: format!("invalid Gemma config: {e}"),
    })?;
    parsed
        .model_config()
        .map_err(|e| ckpt_err(dir, format!("config.json: {e}")))
}

/// The tensors of a Hugging Face Gemma directory without a tied `lm_head` written anyway.
fn hf_tensors(_dir: &Path, mut tensors: TensorMap, _config: &ModelConfig) -> Result<TensorMap> {
    tensors.retain(|name, _| name != "lm_head.weight");
    Ok(tensors)
}

/// The config of a GGUF file of architecture `gemma2` or `gemma3`, read as llama.cpp reads
/// it: the llama-style keys, then `{arch}.attention.sliding_window` (Gemma 2: 4096 when
/// absent), `{arch}.attention.sliding_window_pattern` (Gemma 2: 2, Gemma 3: 6 when absent),
/// `{arch}.attn_logit_softcapping` (Gemma 2: 50 when absent),
/// `{arch}.final_logit_softcapping` (Gemma 2: 30 when absent),
/// `{arch}.rope.freq_base_swa` (the local layers' base: Gemma 2 the global one, Gemma 3 10000
/// when absent) and `{arch}.rope.scaling.type` / `.factor` (the global layers'). The scores
/// are scaled by `1/√d_k`, as llama.cpp scales them for every size but Gemma 2's 27B.
fn gguf_config(file: &GgufFile) -> Result<ModelConfig> {
    let g = LlamaGgufConfig::from_gguf(file)?;
    let path = file.path();
    let arch = file.architecture()?;
    let key = |k: &str| format!("{arch}.{k}");
    let bad = |reason: String| ckpt_err(path, reason);
    let generation = match arch {
        "gemma2" => Generation::Two,
        _ => Generation::Three,
    };
    if g.rope_dim != g.head_dim() {
        return Err(bad(format!(
            "rope.dimension_count {} differs from the head size {} (partial rotary is not supported)",
            g.rope_dim,
            g.head_dim()
        )));
    }
    if let Some(d) = file
        .get::<usize>(&key("attention.value_length"))?
        .filter(|&d| d != g.head_dim())
    {
        return Err(bad(format!(
            "{} {d} differs from the key size {} (not supported)",
            key("attention.value_length"),
            g.head_dim()
        )));
    }
    let output = GGUF_NAMES.export("output_proj.weight");
    if let Some(name) = output {
        if file.tensors().iter().any(|t| t.name == name) {
            return Err(bad(format!(
                "an untied output tensor {name} is not supported for Gemma"
            )));
        }
    }
    let window: Option<usize> = match generation {
        Generation::Two => Some(file.get(&key("attention.sliding_window"))?.unwrap_or(4096)),
        Generation::Three => file
            .get::<usize>(&key("attention.sliding_window"))?
            .filter(|&w| w > 0),
    };
    let default_pattern = match generation {
        Generation::Two => 2,
        Generation::Three => 6,
    };
    let pattern: usize = file
        .get(&key("attention.sliding_window_pattern"))?
        .unwrap_or(default_pattern);
    let local_base = match generation {
        Generation::Two => g.rope_freq_base,
        Generation::Three => ROPE_BASE,
    };
    let local_base: f64 = file.get(&key("rope.freq_base_swa"))?.unwrap_or(local_base);
    let factor = match file.get::<&str>(&key("rope.scaling.type"))? {
        None | Some("none") => None,
        Some("linear") => match file.get::<f64>(&key("rope.scaling.factor"))? {
            Some(f) if f != 1.0 && f != 0.0 => Some(f),
            _ => None,
        },
        Some(other) => {
            return Err(bad(format!(
                "{} {other:?} is not supported (linear)",
                key("rope.scaling.type")
            )))
        }
    };
    let mut c = gemma_config(
        g.vocab_size,
        g.d_model,
        g.d_ff,
        g.n_layers,
        g.n_heads,
        g.n_kv_heads,
        g.rms_norm_eps,
        g.context_length,
        0.0,
    );
    c.head_dim = (g.head_dim() * g.n_heads != g.d_model).then_some(g.head_dim());
    c.layer_windows = (0..g.n_layers)
        .map(|i| {
            let local = pattern == 0 || i % pattern < pattern - 1;
            if local {
                window
            } else {
                None
            }
        })
        .collect();
    if window.is_none() {
        c.layer_windows.clear();
    }
    c.rope_base = g.rope_freq_base;
    c.sliding_rope_base =
        (local_base != g.rope_freq_base && window.is_some()).then_some(local_base);
    // llama.cpp's defaults: Gemma 2 caps scores at 50 and logits at 30, Gemma 3 neither.
    let (attn_cap, final_cap) = match generation {
        Generation::Two => (50.0, 30.0),
        Generation::Three => (0.0, 0.0),
    };
    c.attn_logit_softcap = match generation {
        Generation::Two => Some(
            file.get::<f64>(&key("attn_logit_softcapping"))?
                .unwrap_or(attn_cap),
        )
        .filter(|&s| s != 0.0),
        Generation::Three => None,
    };
    c.final_logit_softcap = Some(
        file.get::<f64>(&key("final_logit_softcapping"))?
            .unwrap_or(final_cap),
    )
    .filter(|&s| s != 0.0);
    c.qk_norm = generation == Generation::Three;
    set_linear_rope_scaling(&mut c, factor).map_err(&bad)?;
    c.validate().map_err(bad)?;
    Ok(c)
}

#[cfg(test)]
#[path = "gemma_tests.rs"]
mod tests;
