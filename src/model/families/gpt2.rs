//! GPT-2 (Radford et al. 2019): the paper's decoder-only stack with learned positions added to
//! unscaled token embeddings, pre-LN blocks with a final layer norm, GELU's tanh approximation
//! (`gelu_new`), biases everywhere and the output projection tied to the token embedding —
//! composed from this crate's parts as a [`LanguageModel`](crate::model::LanguageModel); this file maps a Hugging Face
//! `GPT2LMHeadModel` directory onto it.
//!
//! Two differences of storage, undone at load: GPT-2's `Conv1D` keeps weights `[in, out]`
//! (transposed here to our `[out, in]`), and one fused `c_attn` `[d, 3d]` holds the query, key
//! and value projections side by side (split here into `q_proj`, `k_proj`, `v_proj`).

use super::{Family, FamilyKind, HfDecoder};
use crate::error::{Error, Result};
use crate::model::checkpoint::RenameTable;
use crate::model::config::ROPE_BASE;
use crate::model::config::{
    Activation, ModelConfig, NormPlacement, Normalization, Positions, RopeStyle,
};
use crate::store::{ckpt_err, TensorMap};
use serde::Deserialize;
use std::path::Path;

/// The row of [`super::FAMILIES`].
pub const FAMILY: Family = Family {
    name: "gpt2",
    kind: FamilyKind::Decoder,
    model_types: &["gpt2"],
    hf_names: HF_NAMES,
    hf_decoder: Some(HfDecoder {
        config: hf_config,
        tensors: hf_tensors,
    }),
    gguf: None,
    chat_template: None,
};

/// GPT-2 tensor names (without the `transformer.` prefix, after [`unfuse`]) -> our module paths.
pub const HF_NAMES: RenameTable = RenameTable(&[&[
    // Before `wte.`, so that our `embedding.positions` is named `wpe.weight` in messages.
    ("wpe.weight", "embedding.positions"),
    ("wte.", "embedding."),
    ("h.{i}.ln_1.", "layers.{i}.self_attn_norm."),
    ("h.{i}.attn.q_proj.", "layers.{i}.self_attn.q_proj."),
    ("h.{i}.attn.k_proj.", "layers.{i}.self_attn.k_proj."),
    ("h.{i}.attn.v_proj.", "layers.{i}.self_attn.v_proj."),
    ("h.{i}.attn.c_proj.", "layers.{i}.self_attn.out_proj."),
    ("h.{i}.ln_2.", "layers.{i}.ffn_norm."),
    ("h.{i}.mlp.c_fc.", "layers.{i}.ffn.linear1."),
    ("h.{i}.mlp.c_proj.", "layers.{i}.ffn.linear2."),
    ("ln_f.", "final_norm."),
]]);

fn default_eps() -> f64 {
    1e-5
}
fn default_act() -> String {
    "gelu_new".into()
}
fn yes() -> bool {
    true
}

/// The fields of a Hugging Face GPT-2 `config.json` that shape the computation.
#[derive(Clone, Debug, Deserialize)]
pub struct Gpt2Config {
    pub vocab_size: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_layer: usize,
    pub n_positions: usize,
    #[serde(default)]
    pub n_inner: Option<usize>,
    #[serde(default = "default_eps")]
    pub layer_norm_epsilon: f64,
    #[serde(default = "default_act")]
    pub activation_function: String,
    #[serde(default = "yes")]
    pub tie_word_embeddings: bool,
    #[serde(default = "yes")]
    pub scale_attn_weights: bool,
    #[serde(default)]
    pub scale_attn_by_inverse_layer_idx: bool,
    #[serde(default)]
    // Used outside the library only (feature `internals`).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub reorder_and_upcast_attn: bool,
    #[serde(default)]
    pub add_cross_attention: bool,
}

impl Gpt2Config {
    /// Our config for this checkpoint, or what it uses that this implementation does not
    /// compute (named).
    pub fn model_config(&self) -> std::result::Result<ModelConfig, String> {
        let activation = match self.activation_function.as_str() {
            "gelu_new" | "gelu_pytorch_tanh" => Activation::GeluTanh,
            "gelu" => Activation::GeluErf,
            "relu" => Activation::Relu,
            other => return Err(format!("activation_function {other:?} is not supported")),
        };
        for (set, name) in [
            (!self.scale_attn_weights, "scale_attn_weights false"),
            (
                self.scale_attn_by_inverse_layer_idx,
                "scale_attn_by_inverse_layer_idx",
            ),
            (self.add_cross_attention, "add_cross_attention"),
            (!self.tie_word_embeddings, "tie_word_embeddings false"),
        ] {
            if set {
                return Err(format!("{name} is not supported"));
            }
        }
        let c = ModelConfig {
            vocab_size: self.vocab_size,
            d_model: self.n_embd,
            n_heads: self.n_head,
            d_ff: self.n_inner.unwrap_or(4 * self.n_embd),
            n_encoder_layers: 0,
            n_decoder_layers: self.n_layer,
            dropout: 0.0,
            norm: NormPlacement::PreLn,
            layer_norm_eps: self.layer_norm_epsilon,
            tie_embeddings: true,
            max_len: self.n_positions,
            activation,
            positions: Positions::Learned,
            attention_dropout: 0.0,
            activation_dropout: 0.0,
            bias: true,
            scale_embeddings: false,
            n_kv_heads: None,
            normalization: Normalization::LayerNorm,
            rope_base: ROPE_BASE,
            rope_style: RopeStyle::Interleaved,
            qkv_bias: false,
            qk_norm: false,
            rope_scaling: None,
            head_dim: None,
            layer_heads: Default::default(),
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
        };
        c.validate()?;
        Ok(c)
    }
}

/// `[rows, cols]` -> `[cols, rows]`.
fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; values.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = values[r * cols + c];
        }
    }
    out
}

/// GPT-2's tensors in our layout: without the `transformer.` prefix and the attention-mask
/// buffers (`attn.bias`, `attn.masked_bias`) and a tied `lm_head`; `Conv1D` weights transposed
/// to `[out, in]`; each `c_attn` split into `q_proj`, `k_proj`, `v_proj`.
pub fn unfuse(path: &Path, tensors: TensorMap) -> Result<TensorMap> {
    let mut out = TensorMap::new();
    for (name, (shape, values)) in tensors {
        let name = name
            .strip_prefix("transformer.")
            .unwrap_or(&name)
            .to_string();
        let buffer = name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
        if buffer || name == "lm_head.weight" {
            continue;
        }
        let conv1d = [
            ".attn.c_attn.",
            ".attn.c_proj.",
            ".mlp.c_fc.",
            ".mlp.c_proj.",
        ]
        .iter()
        .any(|p| name.contains(p));
        let (shape, values) = if conv1d && name.ends_with(".weight") {
            let [rows, cols] = shape[..] else {
                return Err(ckpt_err(
                    path,
                    format!("tensor {name} has shape {shape:?}, expected 2 dims"),
                ));
            };
            (vec![cols, rows], transpose(&values, rows, cols))
        } else {
            (shape, values)
        };
        match name
            .strip_suffix(".attn.c_attn.weight")
            .map(|l| (l, "weight"))
            .or_else(|| name.strip_suffix(".attn.c_attn.bias").map(|l| (l, "bias")))
        {
            None => {
                out.insert(name, (shape, values));
            }
            Some((layer, which)) => {
                // weight [3d, d] (after the transpose) or bias [3d]: q, k, v blocks in order.
                let rows = shape[0];
                if !rows.is_multiple_of(3) {
                    return Err(ckpt_err(
                        path,
                        format!("{layer}.attn.c_attn.{which} has {rows} rows, not 3 equal blocks"),
                    ));
                }
                let block = values.len() / 3;
                let mut part_shape = shape.clone();
                part_shape[0] = rows / 3;
                for (i, proj) in ["q_proj", "k_proj", "v_proj"].iter().enumerate() {
                    let part = values[i * block..(i + 1) * block].to_vec();
                    out.insert(
                        format!("{layer}.attn.{proj}.{which}"),
                        (part_shape.clone(), part),
                    );
                }
            }
        }
    }
    Ok(out)
}

/// A Hugging Face directory's `config.json` (`bytes`, read from `config_path` in `dir`) for
/// `model_type` `gpt2`, as our config.
fn hf_config(bytes: &[u8], config_path: &Path, dir: &Path) -> Result<ModelConfig> {
    parse_config(bytes, config_path)?
        .model_config()
        .map_err(|e| ckpt_err(dir, format!("config.json: {e}")))
}

/// The tensors of a Hugging Face GPT-2 directory in our layout ([`unfuse`]).
fn hf_tensors(dir: &Path, tensors: TensorMap, _config: &ModelConfig) -> Result<TensorMap> {
    unfuse(dir, tensors)
}

/// A Hugging Face directory's `config.json` for `model_type` `gpt2`.
pub fn parse_config(bytes: &[u8], path: &Path) -> Result<Gpt2Config> {
    serde_json::from_slice(bytes).map_err(|e| Error::Checkpoint {
        path: path.to_path_buf(),
        reason: format!("invalid GPT-2 config: {e}"),
    })
}
