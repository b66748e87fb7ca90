//! Llama-family decoders (Touvron et al. 2023; SmolLM2 is one): the paper's decoder-only stack
//! with the engineering since 2017 — pre-norm blocks with RMSNorm, a SwiGLU FFN without biases,
//! rotary positions, grouped-query attention, unscaled token embeddings. Composed from this
//! crate's parts as a [`LanguageModel`](crate::model::LanguageModel) whose [`ModelConfig`] says so; this file only maps the
//! two ways such a model is stored onto it:
//!
//! - a Hugging Face directory (`config.json` with `model_type: llama`, `model.safetensors` or a
//!   sharded index): names through [`HF_NAMES`]; Hugging Face pairs the rotary columns as
//!   `rotate_half` does ([`RopeStyle::HalfSplit`]);
//! - a GGUF file of architecture `llama` (llama.cpp): names through [`GGUF_NAMES`], weights
//!   dequantised to float32 or multiplied in their stored blocks ([`super::GgufWeights`]); llama.cpp's converter permutes the query and key rows so that the
//!   rotary pairs are adjacent ([`RopeStyle::Interleaved`]). A ggml tensor of dims `[in, out]`
//!   is our row-major `[out, in]`, PyTorch's layout, so no weight is transposed.

use super::{Family, FamilyKind, GgufDecoder, HfDecoder};
use crate::error::{Error, Result};
use crate::model::checkpoint::RenameTable;
use crate::model::config::{
    Activation, ModelConfig, NormPlacement, Normalization, Positions, RopeStyle,
};
use crate::store::gguf::GgufFile;
use crate::store::gguf_llama::LlamaGgufConfig;
use crate::store::{ckpt_err, TensorMap};
use serde::Deserialize;
use std::path::Path;

/// The row of [`super::FAMILIES`].
pub const FAMILY: Family = Family {
    name: "llama",
    kind: FamilyKind::Decoder,
    model_types: &["llama"],
    hf_names: HF_NAMES,
    hf_decoder: Some(HfDecoder {
        config: hf_config,
        tensors: hf_tensors,
    }),
    gguf: Some(GgufDecoder {
        architecture: "llama",
        config: gguf_config,
        names: GGUF_NAMES,
        fused: &[],
    }),
    chat_template: None,
};

/// Hugging Face Llama tensor names -> our module paths (`lm_head` is our `output_proj`), and
/// Mixtral's experts (`super::mixtral`).
pub const HF_NAMES: RenameTable = RenameTable(&[
    hf_names::EMBEDDING,
    hf_names::ATTENTION,
    hf_names::NORMS,
    hf_names::FFN,
    hf_names::MIXTRAL_EXPERTS,
    hf_names::FINAL_NORM,
    hf_names::HEAD,
]);

/// llama.cpp's GGUF tensor names -> our module paths.
pub const GGUF_NAMES: RenameTable = RenameTable(&[
    gguf_names::EMBEDDING,
    gguf_names::ATTENTION,
    gguf_names::NORMS,
    gguf_names::FFN,
    gguf_names::EXPERTS,
    gguf_names::FINAL_NORM,
    gguf_names::HEAD,
]);

/// A dense Llama's Hugging Face names alone, without the experts' (SmolLM3, Granite).
pub const HF_DENSE_NAMES: RenameTable = RenameTable(&[
    hf_names::EMBEDDING,
    hf_names::ATTENTION,
    hf_names::NORMS,
    hf_names::FFN,
    hf_names::FINAL_NORM,
    hf_names::HEAD,
]);

/// A dense Llama's GGUF names alone, without the experts' (SmolLM3, Granite).
pub const GGUF_DENSE_NAMES: RenameTable = RenameTable(&[
    gguf_names::EMBEDDING,
    gguf_names::ATTENTION,
    gguf_names::NORMS,
    gguf_names::FFN,
    gguf_names::FINAL_NORM,
    gguf_names::HEAD,
]);

/// The groups of Hugging Face names that the Llama-style families share; each family's table
/// is composed of those it has and its own (Qwen3's query/key norms, Gemma's four norms, ...).
pub mod hf_names {
    use crate::model::checkpoint::Renames;

    /// The token table.
    pub const EMBEDDING: Renames = &[("model.embed_tokens.", "embedding.")];
    /// The query, key, value and output projections.
    pub const ATTENTION: Renames = &[
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
    ];
    /// The query and key norms (Qwen3, Gemma 3, OLMoE, OLMo 2).
    pub const QK_NORMS: Renames = &[
        (
            "model.layers.{i}.self_attn.q_norm.",
            "layers.{i}.self_attn.q_norm.",
        ),
        (
            "model.layers.{i}.self_attn.k_norm.",
            "layers.{i}.self_attn.k_norm.",
        ),
    ];
    /// A pre-norm block's two norms: before the attention and before the FFN.
    pub const NORMS: Renames = &[
        (
            "model.layers.{i}.input_layernorm.",
            "layers.{i}.self_attn_norm.",
        ),
        (
            "model.layers.{i}.post_attention_layernorm.",
            "layers.{i}.ffn_norm.",
        ),
    ];
    /// The SwiGLU FFN.
    pub const FFN: Renames = &[
        ("model.layers.{i}.mlp.gate_proj.", "layers.{i}.ffn.gate."),
        ("model.layers.{i}.mlp.up_proj.", "layers.{i}.ffn.linear1."),
        ("model.layers.{i}.mlp.down_proj.", "layers.{i}.ffn.linear2."),
    ];
    /// Mixtral's mixtures of experts.
    pub const MIXTRAL_EXPERTS: Renames = &[
        (
            "model.layers.{i}.block_sparse_moe.gate.",
            "layers.{i}.ffn.router.",
        ),
        (
            "model.layers.{i}.block_sparse_moe.experts.{e}.w1.",
            "layers.{i}.ffn.experts.{e}.gate.",
        ),
        (
            "model.layers.{i}.block_sparse_moe.experts.{e}.w3.",
            "layers.{i}.ffn.experts.{e}.linear1.",
        ),
        (
            "model.layers.{i}.block_sparse_moe.experts.{e}.w2.",
            "layers.{i}.ffn.experts.{e}.linear2.",
        ),
    ];
    /// The final norm.
    pub const FINAL_NORM: Renames = &[("model.norm.", "final_norm.")];
    /// The head's own matrix (untied).
    pub const HEAD: Renames = &[("lm_head.", "output_proj.")];
}

/// The groups of llama.cpp's names that the Llama-style families share (see [`hf_names`]).
pub mod gguf_names {
    use crate::model::checkpoint::Renames;

    /// The token table.
    pub const EMBEDDING: Renames = &[("token_embd.", "embedding.")];
    /// The query, key, value and output projections.
    pub const ATTENTION: Renames = &[
        ("blk.{i}.attn_q.", "layers.{i}.self_attn.q_proj."),
        ("blk.{i}.attn_k.", "layers.{i}.self_attn.k_proj."),
        ("blk.{i}.attn_v.", "layers.{i}.self_attn.v_proj."),
        ("blk.{i}.attn_output.", "layers.{i}.self_attn.out_proj."),
    ];
    /// The query and key norms.
    pub const QK_NORMS: Renames = &[
        ("blk.{i}.attn_q_norm.", "layers.{i}.self_attn.q_norm."),
        ("blk.{i}.attn_k_norm.", "layers.{i}.self_attn.k_norm."),
    ];
    /// A pre-norm block's two norms.
    pub const NORMS: Renames = &[
        ("blk.{i}.attn_norm.", "layers.{i}.self_attn_norm."),
        ("blk.{i}.ffn_norm.", "layers.{i}.ffn_norm."),
    ];
    /// The norms of the sublayers' outputs (Gemma 2 and 3, OLMo 2).
    pub const POST_NORMS: Renames = &[
        (
            "blk.{i}.post_attention_norm.",
            "layers.{i}.self_attn_post_norm.",
        ),
        ("blk.{i}.post_ffw_norm.", "layers.{i}.ffn_post_norm."),
    ];
    /// The SwiGLU FFN.
    pub const FFN: Renames = &[
        ("blk.{i}.ffn_gate.", "layers.{i}.ffn.gate."),
        ("blk.{i}.ffn_up.", "layers.{i}.ffn.linear1."),
        ("blk.{i}.ffn_down.", "layers.{i}.ffn.linear2."),
    ];
    /// The mixtures of experts (merged `ffn_*_exps` tensors, split per expert at load).
    pub const EXPERTS: Renames = &[
        ("blk.{i}.ffn_gate_inp.", "layers.{i}.ffn.router."),
        (
            "blk.{i}.ffn_gate_exps.{e}.",
            "layers.{i}.ffn.experts.{e}.gate.",
        ),
        (
            "blk.{i}.ffn_up_exps.{e}.",
            "layers.{i}.ffn.experts.{e}.linear1.",
        ),
        (
            "blk.{i}.ffn_down_exps.{e}.",
            "layers.{i}.ffn.experts.{e}.linear2.",
        ),
    ];
    /// The final norm.
    pub const FINAL_NORM: Renames = &[("output_norm.", "final_norm.")];
    /// The head's own matrix (untied).
    pub const HEAD: Renames = &[("output.", "output_proj.")];
}

fn default_act() -> String {
    "silu".into()
}

/// The fields of a Hugging Face `config.json` of a llama-style decoder (Llama, Mistral, Qwen2,
/// Qwen3, Phi-3) that shape the computation; how a family reads them is its [`Variant`].
#[derive(Clone, Debug, Deserialize)]
pub struct LlamaConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    #[serde(default)]
    pub head_dim: Option<usize>,
    pub rms_norm_eps: f64,
    pub max_position_embeddings: usize,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    /// The rotary base before transformers 5 (see [`super::rope_params::hf_rope`]).
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// transformers 5's rotary parameters (`rope_theta`, `rope_type`, the scaling's fields).
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    /// The rotary scaling before transformers 5.
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    /// Phi-3's share of each head that is rotated (before transformers 5).
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
    /// The sliding window (Mistral, Phi-3; Qwen2/Qwen3 with `use_sliding_window`).
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// Qwen2/Qwen3: whether the layers from `max_window_layers` on slide.
    #[serde(default)]
    pub use_sliding_window: Option<bool>,
    #[serde(default)]
    pub max_window_layers: Option<usize>,
    /// Per layer, `full_attention` or `sliding_attention` (transformers 5).
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
}

/// What the llama-style families do differently with the same fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    /// The query, key and value projections have biases (Qwen2), the others none.
    pub qkv_bias: bool,
    /// Per-head RMSNorm of the queries and keys (Qwen3).
    pub qk_norm: bool,
    /// Which layers slide.
    pub windows: WindowRule,
}

/// How a family's config says which layers have a sliding window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowRule {
    /// None has one (Llama: `sliding_window` is not a Llama field).
    Never,
    /// `sliding_window` (null: none) is every layer's (Mistral, Phi-3).
    EveryLayer,
    /// Qwen2/Qwen3: `layer_types` names the sliding layers; without it, the layers from
    /// `max_window_layers` on slide when `use_sliding_window` is true.
    Qwen,
}

/// Llama's variant: no biases, no query/key norms, no sliding window.
pub const LLAMA: Variant = Variant {
    qkv_bias: false,
    qk_norm: false,
    windows: WindowRule::Never,
};

/// A Llama-family [`ModelConfig`]: pre-norm RMSNorm blocks, SwiGLU, rotary positions of the
/// given base and pairing, grouped-query attention, no biases, unscaled embeddings.
#[allow(clippy::too_many_arguments)]
fn llama_config(
    vocab_size: usize,
    d_model: usize,
    d_ff: usize,
    layers: usize,
    n_heads: usize,
    n_kv_heads: usize,
    eps: f64,
    max_len: usize,
    tied: bool,
    rope_base: f64,
    rope_style: RopeStyle,
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
        tie_embeddings: tied,
        max_len,
        activation: Activation::SiluGated,
        positions: Positions::Rotary,
        attention_dropout: 0.0,
        activation_dropout: 0.0,
        bias: false,
        scale_embeddings: false,
        n_kv_heads: (n_kv_heads != n_heads).then_some(n_kv_heads),
        normalization: Normalization::RmsNorm,
        rope_base,
        rope_style,
        qk_norm: false,
        rope_scaling: None,
        head_dim: None,
        layer_heads: Default::default(),
        qkv_bias: false,
        attn_logit_softcap: None,
        final_logit_softcap: None,
        output_bias: false,
        norm_weight_offset: 0.0,
        embedding_scale: None,
        layer_windows: Vec::new(),
        query_pre_attn_scalar: None,
        post_norms: false,
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

impl LlamaConfig {
    /// Our config for this Llama checkpoint, or what it uses that this implementation does
    /// not compute (named).
    pub fn model_config(&self) -> std::result::Result<ModelConfig, String> {
        self.model_config_of(&LLAMA)
    }

    /// Our config for this checkpoint of a family of variant `v`, or what it uses that this
    /// implementation does not compute (named).
    pub fn model_config_of(&self, v: &Variant) -> std::result::Result<ModelConfig, String> {
        if self.hidden_act != "silu" {
            return Err(format!(
                "hidden_act {:?} is not supported (silu)",
                self.hidden_act
            ));
        }
        if self.attention_bias || self.mlp_bias {
            return Err("attention_bias / mlp_bias true is not supported".into());
        }
        if let Some(p) = self.partial_rotary_factor.filter(|&p| p != 1.0) {
            return Err(format!(
                "partial_rotary_factor {p} is not supported (rotary over the whole head only)"
            ));
        }
        let (base, rope_scaling) = super::rope_params::hf_rope(
            self.rope_parameters.as_ref(),
            self.rope_theta,
            self.rope_scaling.as_ref(),
            self.max_position_embeddings,
        )?;
        let heads = self.num_attention_heads;
        if heads == 0 {
            return Err("num_attention_heads is 0".into());
        }
        // Heads of their own width (Qwen3-0.6B: 16 of 128 over hidden_size 1024).
        let head_dim = self
            .head_dim
            .filter(|&d| !self.hidden_size.is_multiple_of(heads) || d != self.hidden_size / heads);
        if head_dim.is_none() && !self.hidden_size.is_multiple_of(heads) {
            return Err(format!(
                "hidden_size {} is not divisible by num_attention_heads {heads}",
                self.hidden_size
            ));
        }
        let mut c = llama_config(
            self.vocab_size,
            self.hidden_size,
            self.intermediate_size,
            self.num_hidden_layers,
            heads,
            self.num_key_value_heads.unwrap_or(heads),
            self.rms_norm_eps,
            self.max_position_embeddings,
            self.tie_word_embeddings,
            base,
            RopeStyle::HalfSplit,
        );
        (c.rope_scaling, c.qkv_bias, c.qk_norm) = (rope_scaling, v.qkv_bias, v.qk_norm);
        c.head_dim = head_dim;
        c.layer_windows = self.layer_windows(v.windows)?;
        c.validate()?;
        Ok(c)
    }

    /// Each layer's sliding window under `rule` (empty: none slides).
    fn layer_windows(&self, rule: WindowRule) -> std::result::Result<Vec<Option<usize>>, String> {
        let n = self.num_hidden_layers;
        let window = || {
            self.sliding_window
                .ok_or("a sliding layer without sliding_window".to_string())
        };
        let windows: Vec<Option<usize>> = match rule {
            WindowRule::Never => Vec::new(),
            WindowRule::EveryLayer => match self.sliding_window {
                Some(w) => vec![Some(w); n],
                None => Vec::new(),
            },
            WindowRule::Qwen => match (&self.layer_types, self.use_sliding_window) {
                (Some(types), _) => {
                    if types.len() != n {
                        return Err(format!(
                            "layer_types has {} entries for {n} layers",
                            types.len()
                        ));
                    }
                    types
                        .iter()
                        .map(|t| match t.as_str() {
                            "full_attention" => Ok(None),
                            "sliding_attention" => window().map(Some),
                            other => Err(format!("layer_types entry {other:?} is not supported")),
                        })
                        .collect::<std::result::Result<_, _>>()?
                }
                (None, Some(true)) => {
                    let from = self.max_window_layers.unwrap_or(0);
                    (0..n)
                        .map(|i| {
                            if i >= from {
                                window().map(Some)
                            } else {
                                Ok(None)
                            }
                        })
                        .collect::<std::result::Result<_, _>>()?
                }
                (None, _) => Vec::new(),
            },
        };
        Ok(if windows.iter().all(Option::is_none) {
            Vec::new()
        } else {
            windows
        })
    }
}

/// Is `name` a tensor of a Hugging Face Llama checkpoint that is not a parameter: the rotary
/// frequencies some versions saved, or a tied `lm_head` written anyway?
fn hf_ignored(name: &str, tied: bool) -> bool {
    name.ends_with("rotary_emb.inv_freq") || (tied && name == "lm_head.weight")
}

/// A Hugging Face directory's `config.json` (`bytes`, read from `config_path` in `dir`) for
/// `model_type` `llama`, as our config.
fn hf_config(bytes: &[u8], config_path: &Path, dir: &Path) -> Result<ModelConfig> {
    parse_config(bytes, config_path)?
        .model_config()
        .map_err(|e| ckpt_err(dir, format!("config.json: {e}")))
}

/// The tensors of a Hugging Face Llama directory without those that are not parameters.
pub(super) fn hf_tensors(
    _dir: &Path,
    mut tensors: TensorMap,
    config: &ModelConfig,
) -> Result<TensorMap> {
    tensors.retain(|name, _| !hf_ignored(name, config.tie_embeddings));
    Ok(tensors)
}

/// The config of a GGUF file of architecture `llama` (Llama, and Mistral, which llama.cpp
/// stores as `llama`).
fn gguf_config(file: &GgufFile) -> Result<ModelConfig> {
    gguf_config_of(file, &LLAMA, RopeStyle::Interleaved)
}

/// The config of a GGUF file of a llama-style family of variant `v`, whose query and key rows
/// pair the rotary columns as `rope_style` says (llama.cpp's converter permutes Llama's into
/// adjacent pairs; Qwen2, Qwen3 and Phi-3 keep Hugging Face's halves, llama.cpp's NEOX
/// rotation). The projection is tied when the file has no tensor of its own for it; the
/// rotary frequencies are scaled by a `rope_freqs.weight` tensor when there is one; a positive
/// `{arch}.attention.sliding_window` is every layer's window; `{arch}.expert_count` makes every
/// FFN a mixture of experts ([`super::experts::gguf_experts`]).
pub fn gguf_config_of(file: &GgufFile, v: &Variant, rope_style: RopeStyle) -> Result<ModelConfig> {
    let g = LlamaGgufConfig::from_gguf(file)?;
    let path = file.path();
    if g.rope_dim != g.head_dim() {
        return Err(ckpt_err(
            path,
            format!(
                "rope.dimension_count {} differs from the head size {} (partial rotary is not supported)",
                g.rope_dim,
                g.head_dim()
            ),
        ));
    }
    let output = GGUF_NAMES.export("output_proj.weight");
    let tied = file
        .tensors()
        .iter()
        .all(|t| Some(&t.name) != output.as_ref());
    let mut c = llama_config(
        g.vocab_size,
        g.d_model,
        g.d_ff,
        g.n_layers,
        g.n_heads,
        g.n_kv_heads,
        g.rms_norm_eps,
        g.context_length,
        tied,
        g.rope_freq_base,
        rope_style,
    );
    (c.qkv_bias, c.qk_norm) = (v.qkv_bias, v.qk_norm);
    c.head_dim = (g.head_dim() * g.n_heads != g.d_model).then_some(g.head_dim());
    c.rope_scaling = super::rope_params::gguf_rope_scaling(file)?;
    // Mixtures of experts (Mixtral as `llama`, `qwen3moe`): llama.cpp normalises the chosen
    // experts' weights for both.
    c.experts = super::experts::gguf_experts(file, g.d_ff, true)?;
    let window_key = format!("{}.attention.sliding_window", file.architecture()?);
    if let Some(w) = file.get::<usize>(&window_key)?.filter(|&w| w > 0) {
        c.layer_windows = vec![Some(w); g.n_layers];
    }
    c.validate().map_err(|e| ckpt_err(path, e))?;
    Ok(c)
}

/// A Hugging Face directory's `config.json` for `model_type` `llama`.
pub fn parse_config(bytes: &[u8], path: &Path) -> Result<LlamaConfig> {
    serde_json::from_slice(bytes).map_err(|e| Error::Checkpoint {
        path: path.to_path_buf(),
        reason: format!("invalid Llama config: {e}"),
    })
}
