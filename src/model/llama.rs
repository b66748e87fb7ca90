//! Llama-family decoders (Touvron et al. 2023; SmolLM2 is one): the paper's decoder-only stack
//! with the engineering since 2017 — pre-norm blocks with RMSNorm, a SwiGLU FFN without biases,
//! rotary positions, grouped-query attention, unscaled token embeddings. Composed from this
//! crate's parts as a [`LanguageModel`] whose [`ModelConfig`] says so; this file only maps the
//! two ways such a model is stored onto it:
//!
//! - a Hugging Face directory (`config.json` with `model_type: llama`, `model.safetensors` or a
//!   sharded index): names through [`HF_NAMES`]; Hugging Face pairs the rotary columns as
//!   `rotate_half` does ([`RopeStyle::HalfSplit`]);
//! - a GGUF file of architecture `llama` (llama.cpp): names through [`GGUF_NAMES`], weights
//!   dequantised to float32 or multiplied in their stored blocks ([`GgufWeights`]); llama.cpp's converter permutes the query and key rows so that the
//!   rotary pairs are adjacent ([`RopeStyle::Interleaved`]). A ggml tensor of dims `[in, out]`
//!   is our row-major `[out, in]`, PyTorch's layout, so no weight is transposed.

use super::block::SelfAttentionBlock;
use super::checkpoint::{build_filled, RenameTable, TensorValues};
use super::config::{Activation, ModelConfig, NormPlacement, Normalization, Positions, RopeStyle};
use super::linear::Linear;
use super::LanguageModel;
use crate::error::{Error, Result};
use crate::kernels::lowp::{BlockKind, BlockMatrix, PackedWeight};
use crate::store::gguf::{GgufFile, TensorInfo};
use crate::store::gguf_llama::LlamaGgufConfig;
use crate::store::{ckpt_err, TensorMap};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::Path;

/// Hugging Face Llama tensor names -> our module paths (`lm_head` is our `output_proj`).
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
    ("model.norm.", "final_norm."),
    ("lm_head.", "output_proj."),
]);

/// llama.cpp's GGUF tensor names -> our module paths.
pub const GGUF_NAMES: RenameTable = RenameTable(&[
    ("token_embd.", "embedding."),
    ("blk.{i}.attn_q.", "layers.{i}.self_attn.q_proj."),
    ("blk.{i}.attn_k.", "layers.{i}.self_attn.k_proj."),
    ("blk.{i}.attn_v.", "layers.{i}.self_attn.v_proj."),
    ("blk.{i}.attn_output.", "layers.{i}.self_attn.out_proj."),
    ("blk.{i}.attn_norm.", "layers.{i}.self_attn_norm."),
    ("blk.{i}.ffn_norm.", "layers.{i}.ffn_norm."),
    ("blk.{i}.ffn_gate.", "layers.{i}.ffn.gate."),
    ("blk.{i}.ffn_up.", "layers.{i}.ffn.linear1."),
    ("blk.{i}.ffn_down.", "layers.{i}.ffn.linear2."),
    ("output_norm.", "final_norm."),
    ("output.", "output_proj."),
]);

fn default_act() -> String {
    "silu".into()
}
fn default_theta() -> f64 {
    10000.0
}

/// The rotary parameters of a Hugging Face config (`rope_parameters` in transformers 5,
/// `rope_theta` at the top level before).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct RopeParameters {
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_type: Option<String>,
}

/// The fields of a Hugging Face Llama `config.json` that shape the computation.
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
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_parameters: Option<RopeParameters>,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
}

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
    }
}

impl LlamaConfig {
    /// Our config for this checkpoint, or what it uses that this implementation does not
    /// compute (named).
    pub fn model_config(&self) -> std::result::Result<ModelConfig, String> {
        if self.hidden_act != "silu" {
            return Err(format!(
                "hidden_act {:?} is not supported (silu)",
                self.hidden_act
            ));
        }
        if self.attention_bias || self.mlp_bias {
            return Err("attention_bias / mlp_bias true is not supported".into());
        }
        let rope_type = self
            .rope_parameters
            .as_ref()
            .and_then(|r| r.rope_type.clone());
        let scaled = self.rope_scaling.as_ref().is_some_and(|v| !v.is_null());
        if scaled || rope_type.as_deref().is_some_and(|t| t != "default") {
            return Err(format!(
                "rope scaling ({}) is not supported (default rotary positions only)",
                rope_type.unwrap_or_else(|| "rope_scaling".into())
            ));
        }
        let heads = self.num_attention_heads;
        if heads == 0 || !self.hidden_size.is_multiple_of(heads) {
            return Err(format!(
                "hidden_size {} is not divisible by num_attention_heads {heads}",
                self.hidden_size
            ));
        }
        if let Some(d) = self.head_dim.filter(|&d| d != self.hidden_size / heads) {
            return Err(format!(
                "head_dim {d} differs from hidden_size / num_attention_heads {} (not supported)",
                self.hidden_size / heads
            ));
        }
        let base = self
            .rope_parameters
            .as_ref()
            .and_then(|r| r.rope_theta)
            .unwrap_or(self.rope_theta);
        let c = llama_config(
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
        c.validate()?;
        Ok(c)
    }
}

/// Is `name` a tensor of a Hugging Face Llama checkpoint that is not a parameter: the rotary
/// frequencies some versions saved, or a tied `lm_head` written anyway?
fn hf_ignored(name: &str, tied: bool) -> bool {
    name.ends_with("rotary_emb.inv_freq") || (tied && name == "lm_head.weight")
}

/// Loads a Hugging Face Llama directory's weights (`tensors`, read by the caller from
/// `model.safetensors` or the shards) into the model its `config` describes.
pub fn from_hf(
    config: &LlamaConfig,
    path: &Path,
    mut tensors: TensorMap,
) -> Result<LanguageModel<f32>> {
    let c = config
        .model_config()
        .map_err(|e| ckpt_err(path, format!("config.json: {e}")))?;
    tensors.retain(|name, _| !hf_ignored(name, c.tie_embeddings));
    build_filled(path, c, tensors, Some(&HF_NAMES))
}

/// How a GGUF model's linear layers multiply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgufWeights {
    /// Every tensor dequantised to float32.
    Dequantised,
    /// Every linear layer and the output projection whose tensor is stored in `Q4_0` / `Q4_1` /
    /// `Q8_0` blocks multiplies the file's own blocks, as llama.cpp does (see
    /// [`crate::kernels::lowp::BlockMatrix`]), and holds no float32 copy of them; a token
    /// embedding in blocks is looked up in them (a row dequantised per token, as llama.cpp's
    /// `get_rows`), and a tied output projection multiplies them. Tensors stored as floats
    /// and the norms are float32.
    Blocks,
}

/// A llama block's linear layer (`None`: the block has no such layer).
type LinearOf = fn(&mut SelfAttentionBlock<f32>) -> Option<&mut Linear<f32>>;

/// The linear layers of a llama block: the GGUF name suffix of each (`blk.N.{suffix}.weight`)
/// and the layer it fills.
const GGUF_LINEARS: [(&str, LinearOf); 7] = [
    ("attn_q", |b| Some(&mut b.self_attn.q_proj)),
    ("attn_k", |b| Some(&mut b.self_attn.k_proj)),
    ("attn_v", |b| Some(&mut b.self_attn.v_proj)),
    ("attn_output", |b| Some(&mut b.self_attn.out_proj)),
    ("ffn_up", |b| Some(&mut b.ffn.linear1)),
    ("ffn_down", |b| Some(&mut b.ffn.linear2)),
    ("ffn_gate", |b| b.ffn.gate.as_mut()),
];

/// Loads a GGUF file of architecture `llama`: its hyper-parameters and weights, dequantised or
/// kept in blocks (`weights`).
pub fn from_gguf(file: &GgufFile, weights: GgufWeights) -> Result<LanguageModel<f32>> {
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
    let tied = file.tensors().iter().all(|t| t.name != "output.weight");
    let c = llama_config(
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
        RopeStyle::Interleaved,
    );
    c.validate().map_err(|e| ckpt_err(path, e))?;
    // Whether a tensor is multiplied as stored: a block-format weight of a linear layer or of
    // an untied output projection.
    let stays_packed = |info: &TensorInfo| {
        let multiplied = info.name == "output.weight"
            || info.name.strip_prefix("blk.").is_some_and(|rest| {
                GGUF_LINEARS
                    .iter()
                    .any(|(l, _)| rest.ends_with(&format!(".{l}.weight")))
            });
        let looked_up = info.name == "token_embd.weight";
        weights == GgufWeights::Blocks
            && (multiplied || looked_up)
            && BlockKind::of(info.ggml_type).is_some()
    };
    // Each tensor is decoded straight into its parameter: no map of every tensor in float32.
    let tensors: HashMap<String, (Vec<usize>, GgufTensor)> = file
        .tensors()
        .iter()
        .map(|info| {
            let t = GgufTensor {
                file,
                info,
                packed: stays_packed(info),
            };
            (info.name.clone(), (info.shape(), t))
        })
        .collect();
    let mut model = build_filled(path, c, tensors, Some(&GGUF_NAMES))?;
    if weights == GgufWeights::Blocks {
        use_gguf_blocks(&mut model, file)?;
    }
    Ok(model)
}

/// Makes every linear layer of `model` (loaded by [`from_gguf`] from `file`, its block
/// tensors left without float32 values) and its output projection multiply the file's own
/// blocks. Returns how many matrices use blocks.
fn use_gguf_blocks(model: &mut LanguageModel<f32>, file: &GgufFile) -> Result<usize> {
    let path = file.path();
    let blocks = |name: &str| -> Result<Option<PackedWeight>> {
        let info = file.tensor(name)?;
        if BlockKind::of(info.ggml_type).is_none() {
            return Ok(None);
        }
        let (rows, cols) = info.rows_cols();
        let data = file.tensor_data(info)?;
        BlockMatrix::from_ggml(info.ggml_type, data, rows, cols)
            .map(|m| Some(PackedWeight::Blocks(m)))
            .map_err(|e| ckpt_err(path, format!("tensor {name}: {e}")))
    };
    let mut used = 0;
    for (i, block) in model.blocks.layers.iter_mut().enumerate() {
        for (short, linear_of) in GGUF_LINEARS {
            let Some(linear) = linear_of(block) else {
                continue;
            };
            let name = format!("blk.{i}.{short}.weight");
            if let Some(packed) = blocks(&name)? {
                linear
                    .set_packed(packed)
                    .map_err(|e| ckpt_err(path, format!("tensor {name}: {e}")))?;
                used += 1;
            }
        }
    }
    // The token embedding left in blocks is looked up in them, row by row.
    if model.embedding.weight.value.data.is_empty() {
        let info = file.tensor("token_embd.weight")?;
        let data = file.tensor_data(info)?.to_vec();
        model
            .embedding
            .set_stored_rows(info.ggml_type, data)
            .map_err(|e| ckpt_err(path, format!("tensor token_embd.weight: {e}")))?;
    }
    // Tied: the projection multiplies the token embedding's blocks too.
    let head_name = match model.head.output_proj {
        Some(_) => "output.weight",
        None => "token_embd.weight",
    };
    if let Some(packed) = blocks(head_name)? {
        let only_copy = match &model.head.output_proj {
            Some(p) => p.value.data.is_empty(),
            None => model.embedding.has_stored_rows(),
        };
        let head = &mut model.head;
        match only_copy {
            true => head.set_packed_only(packed),
            false => head.set_packed(packed),
        }
        .map_err(|e| ckpt_err(path, format!("tensor {head_name}: {e}")))?;
        used += 1;
    }
    Ok(used)
}

/// A tensor of a GGUF file, dequantised when its parameter is filled, or kept in its blocks
/// (`packed`).
struct GgufTensor<'a> {
    file: &'a GgufFile,
    info: &'a TensorInfo,
    packed: bool,
}

impl TensorValues for GgufTensor<'_> {
    fn n_values(&self) -> usize {
        self.info.n_elements
    }
    fn write_into(self, out: &mut [f32]) -> Result<()> {
        self.file.dequantize_into(self.info, out)
    }
    fn stays_packed(&self) -> bool {
        self.packed
    }
}

/// A Hugging Face directory's `config.json` for `model_type` `llama`.
pub fn parse_config(bytes: &[u8], path: &Path) -> Result<LlamaConfig> {
    serde_json::from_slice(bytes).map_err(|e| Error::Checkpoint {
        path: path.to_path_buf(),
        reason: format!("invalid Llama config: {e}"),
    })
}
