//! What Hugging Face's encoder-decoders (Marian, M2M100 / NLLB) configure and store alike: the
//! FFN's `activation_function` and one `eos_token_id` in `config.json`; tensors under a
//! `model.` prefix, and one token table (`shared.weight`) that both stacks read and the head
//! is tied to, also saved under its tied names (`encoder.embed_tokens.weight`,
//! `decoder.embed_tokens.weight`, `lm_head.weight`) or only under one of them.

use crate::error::Result;
use crate::model::config::{Activation, NormPlacement, Positions};
use crate::model::ModelConfig;
use crate::store::{ckpt_err, TensorMap};
use crate::text::id_map::IdMap;
use serde::Deserialize;
use std::path::Path;

/// A rename table's rows: the family's own `rows`, then the names every Hugging Face
/// (BART-style) encoder-decoder shares (the shared table, the head and its logit bias; each
/// layer's `self_attn`, `encoder_attn`, `fc1` / `fc2` and their norms) -> ours.
macro_rules! with_layer_names {
    ($($row:expr),* $(,)?) => {
        [
            $($row,)*
            ("shared.", "embedding."),
            ("final_logits_bias", "output_proj.bias"),
            ("lm_head.", "output_proj."),
            (
                "encoder.layers.{i}.self_attn_layer_norm.",
                "encoder.layers.{i}.self_attn_norm.",
            ),
            (
                "encoder.layers.{i}.self_attn.",
                "encoder.layers.{i}.self_attn.",
            ),
            ("encoder.layers.{i}.fc1.", "encoder.layers.{i}.ffn.linear1."),
            ("encoder.layers.{i}.fc2.", "encoder.layers.{i}.ffn.linear2."),
            (
                "encoder.layers.{i}.final_layer_norm.",
                "encoder.layers.{i}.ffn_norm.",
            ),
            (
                "decoder.layers.{i}.self_attn_layer_norm.",
                "decoder.layers.{i}.self_attn_norm.",
            ),
            (
                "decoder.layers.{i}.self_attn.",
                "decoder.layers.{i}.self_attn.",
            ),
            (
                "decoder.layers.{i}.encoder_attn_layer_norm.",
                "decoder.layers.{i}.cross_attn_norm.",
            ),
            (
                "decoder.layers.{i}.encoder_attn.",
                "decoder.layers.{i}.cross_attn.",
            ),
            ("decoder.layers.{i}.fc1.", "decoder.layers.{i}.ffn.linear1."),
            ("decoder.layers.{i}.fc2.", "decoder.layers.{i}.ffn.linear2."),
            (
                "decoder.layers.{i}.final_layer_norm.",
                "decoder.layers.{i}.ffn_norm.",
            ),
        ]
    };
}
pub(crate) use with_layer_names;

/// The fields of a BART-style `config.json` we read (`MarianConfig`, `M2M100Config`,
/// `MBartConfig` and `BartConfig` share them), with the defaults the classes share; the fields
/// whose defaults differ are options, filled by the family's [`BartDefaults`]. Others are
/// generic or change nothing at inference (`init_std`, `encoder_layerdrop`, `use_cache`, ...).
#[derive(Deserialize)]
pub struct HfBartConfig {
    pub vocab_size: usize,
    /// Marian's: a target vocabulary of its own (refused where it differs).
    decoder_vocab_size: Option<usize>,
    /// Marian's: separate encoder and decoder tables (refused when false).
    #[serde(default = "default_true")]
    share_encoder_decoder_embeddings: bool,
    d_model: usize,
    encoder_layers: usize,
    decoder_layers: usize,
    encoder_attention_heads: usize,
    decoder_attention_heads: usize,
    encoder_ffn_dim: usize,
    decoder_ffn_dim: usize,
    activation_function: Option<String>,
    #[serde(default = "default_positions")]
    max_position_embeddings: usize,
    scale_embedding: Option<bool>,
    #[serde(default = "default_true")]
    tie_word_embeddings: bool,
    #[serde(default)]
    dropout: f64,
    #[serde(default)]
    attention_dropout: f64,
    #[serde(default)]
    activation_dropout: f64,
    #[serde(default = "default_pad")]
    pub pad_token_id: u32,
    #[serde(default = "default_eos")]
    eos_token_id: serde_json::Value,
    decoder_start_token_id: Option<u32>,
    /// fairseq's flags that older BART / mBART configs still carry and transformers no longer
    /// reads: accepted where they say what the family computes, refused by name otherwise.
    normalize_before: Option<bool>,
    add_final_layer_norm: Option<bool>,
    normalize_embedding: Option<bool>,
    static_position_embeddings: Option<bool>,
    add_bias_logits: Option<bool>,
}

fn default_true() -> bool {
    true
}
fn default_positions() -> usize {
    1024
}
fn default_pad() -> u32 {
    1
}
fn default_eos() -> serde_json::Value {
    serde_json::json!(2)
}

/// The token a family's decoder starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecoderStart {
    /// `</s>` (fairseq's models): our start token is a row of its own, a copy of EOS.
    Eos,
    /// The padding token (Marian's): our start token is that row, our padding one is added.
    Pad,
}

/// What a BART-style family computes, and its config class's own defaults.
pub struct BartDefaults {
    /// The decoder's first input.
    pub start: DecoderStart,
    /// The positions added to the embeddings (learned, or Marian's sinusoids in halves).
    pub positions: Positions,
    /// `activation_function` when absent.
    pub activation: &'static str,
    /// `scale_embedding` when absent.
    pub scale_embedding: bool,
    /// Where the blocks' norms sit (pre-LN also closes each stack with a norm).
    pub norm: NormPlacement,
    /// mBART / BART: the decoder's own learned positions and the embedding norms
    /// (`layernorm_embedding`); M2M100: neither (one computed table).
    pub stack_inputs: bool,
}

impl HfBartConfig {
    /// Our config of a family computed as `family` says, or what is not supported (by its
    /// field's name). The table gains two rows, our padding row and the copied start row.
    pub fn config(&self, family: &BartDefaults) -> std::result::Result<ModelConfig, String> {
        if let Some(n) = self.decoder_vocab_size.filter(|&n| n != self.vocab_size) {
            return Err(format!(
                "decoder_vocab_size {n} differs from vocab_size {}: separate target \
                 vocabularies are not supported",
                self.vocab_size
            ));
        }
        if !self.share_encoder_decoder_embeddings {
            return Err("share_encoder_decoder_embeddings false (an encoder and a decoder \
                        table of their own) is not supported"
                .into());
        }
        for (what, enc, dec) in [
            ("attention_heads", self.encoder_attention_heads, self.decoder_attention_heads),
            ("ffn_dim", self.encoder_ffn_dim, self.decoder_ffn_dim),
        ] {
            if enc != dec {
                return Err(format!(
                    "encoder_{what} {enc} and decoder_{what} {dec} differ (not supported)"
                ));
            }
        }
        let eos = self.eos()?;
        let (start, named, rows) = match family.start {
            DecoderStart::Eos => (eos, "eos_token_id", 2),
            DecoderStart::Pad => (self.pad_token_id, "pad_token_id", 1),
        };
        if let Some(given) = self.decoder_start_token_id.filter(|&s| s != start) {
            let token = match family.start {
                DecoderStart::Eos => "</s>",
                DecoderStart::Pad => "the padding token",
            };
            return Err(format!(
                "decoder_start_token_id {given} is not {named} {start}: only decoders that \
                 start from {token} are supported"
            ));
        }
        let pre_ln = family.norm == NormPlacement::PreLn;
        for (name, value, computed) in [
            ("normalize_before", self.normalize_before, pre_ln),
            ("add_final_layer_norm", self.add_final_layer_norm, pre_ln),
            ("normalize_embedding", self.normalize_embedding, family.stack_inputs),
            ("static_position_embeddings", self.static_position_embeddings, !family.stack_inputs),
            ("add_bias_logits", self.add_bias_logits, false),
        ] {
            if value.is_some_and(|v| v != computed) {
                return Err(format!(
                    "{name} {} is not what this family computes (transformers ignores the \
                     flag; this model would not be the one it describes)",
                    !computed
                ));
            }
        }
        let name = self.activation_function.as_deref().unwrap_or(family.activation);
        // Our padding row (and, starting from </s>, the copied start row).
        let mut c = ModelConfig::preset("base", self.vocab_size + rows).expect("a preset");
        c.d_model = self.d_model;
        c.n_heads = self.encoder_attention_heads;
        c.d_ff = self.encoder_ffn_dim;
        c.n_encoder_layers = self.encoder_layers;
        c.n_decoder_layers = self.decoder_layers;
        c.dropout = self.dropout;
        c.attention_dropout = self.attention_dropout;
        c.activation_dropout = self.activation_dropout;
        c.norm = family.norm;
        c.layer_norm_eps = 1e-5;
        c.tie_embeddings = self.tie_word_embeddings;
        c.max_len = self.max_position_embeddings;
        c.activation = activation(name)?;
        c.positions = family.positions;
        c.bias = true;
        c.scale_embeddings = self.scale_embedding.unwrap_or(family.scale_embedding);
        c.output_bias = true;
        c.embedding_norm = family.stack_inputs;
        c.target_positions = family.stack_inputs;
        c.validate()?;
        Ok(c)
    }

    /// The EOS id (one id; a list of several is refused).
    pub fn eos(&self) -> std::result::Result<u32, String> {
        one_eos(&self.eos_token_id)
    }
}

/// Test helper: the config of `family` from a small `config.json` of `model_type`, with the
/// `extra` fields and then `edit` applied (or the error naming what is refused).
#[cfg(test)]
pub fn test_config(
    model_type: &str,
    extra: serde_json::Value,
    family: &BartDefaults,
    edit: impl FnOnce(&mut serde_json::Value),
) -> std::result::Result<ModelConfig, String> {
    let mut json = serde_json::json!({
        "model_type": model_type, "vocab_size": 100, "d_model": 16, "encoder_layers": 2,
        "decoder_layers": 1, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
        "encoder_ffn_dim": 32, "decoder_ffn_dim": 32, "max_position_embeddings": 64
    });
    for (k, v) in extra.as_object().into_iter().flatten() {
        json[k] = v.clone();
    }
    edit(&mut json);
    let hf: HfBartConfig = serde_json::from_value(json).map_err(|e| e.to_string())?;
    hf.eos()?;
    hf.config(family)
}

/// The logit bias of a checkpoint's `final_logits_bias` (`[1, n]`; transformers' zeros where
/// it was saved without it) in our ids, taken out of `tensors`; an error names a wrong shape.
pub fn stored_logit_bias(
    tensors: &mut TensorMap,
    ids: &IdMap,
) -> std::result::Result<Vec<f32>, String> {
    let n = ids.len_theirs();
    let (shape, bias) = tensors
        .remove("final_logits_bias")
        .unwrap_or((vec![1, n], vec![0.0; n]));
    if shape.iter().product::<usize>() != n || shape.last() != Some(&n) {
        return Err(format!("final_logits_bias has shape {shape:?}, not [1, {n}]"));
    }
    Ok(ids.logit_bias(&bias))
}

/// The FFN activation of a config's `activation_function` (transformers' `ACT2FN` names we
/// compute), or the error naming it.
pub fn activation(name: &str) -> std::result::Result<Activation, String> {
    Ok(match name {
        "relu" => Activation::Relu,
        "gelu" => Activation::GeluErf,
        "gelu_new" | "gelu_pytorch_tanh" => Activation::GeluTanh,
        "swish" | "silu" => Activation::Silu,
        other => return Err(format!("activation_function {other:?} is not supported")),
    })
}

/// A config's `eos_token_id`: one id, or a list of one (a list of several is refused).
pub fn one_eos(value: &serde_json::Value) -> std::result::Result<u32, String> {
    let one = |v: &serde_json::Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    match value {
        serde_json::Value::Array(ids) if ids.len() == 1 => one(&ids[0]),
        v => one(v),
    }
    .ok_or_else(|| format!("eos_token_id {value} is not one token id"))
}

/// The tensors of `weights` without the `model.` prefix, the shared table (and an untied
/// `lm_head.weight`) reordered into our ids by `ids` (`[len_ours, d_model]`, our padding row
/// zero), the tied copies dropped once checked equal to it; an error names a missing table, a
/// wrong shape or a copy that differs.
pub fn in_our_ids(
    dir: &Path,
    weights: TensorMap,
    config: &ModelConfig,
    ids: &IdMap,
) -> Result<TensorMap> {
    let bad = |reason: String| ckpt_err(dir, reason);
    let mut tensors: TensorMap = weights
        .into_iter()
        .map(|(name, t)| (name.strip_prefix("model.").unwrap_or(&name).to_string(), t))
        .collect();
    let (d, n, n_ours) = (config.d_model, ids.len_theirs(), ids.len_ours());
    let shared = match tensors.remove("shared.weight") {
        Some(t) => t,
        // Saved with only one of the tied names.
        None => ["encoder.embed_tokens.weight", "decoder.embed_tokens.weight"]
            .iter()
            .find_map(|name| tensors.remove(*name))
            .ok_or_else(|| bad("no shared.weight (the token embedding table)".into()))?,
    };
    if shared.0 != [n, d] {
        return Err(bad(format!(
            "shared.weight has shape {:?}, the config needs [{n}, {d}]",
            shared.0
        )));
    }
    let mut tied = vec!["encoder.embed_tokens.weight", "decoder.embed_tokens.weight"];
    if config.tie_embeddings {
        tied.push("lm_head.weight");
    }
    for name in tied {
        if let Some((shape, values)) = tensors.remove(name) {
            if shape != shared.0 || values != shared.1 {
                return Err(bad(format!(
                    "{name} differs from shared.weight, to which the config ties it"
                )));
            }
        }
    }
    tensors.insert(
        "shared.weight".into(),
        (vec![n_ours, d], ids.reorder_rows_owned(shared.1, d, 0.0)),
    );
    if let Some((shape, head)) = tensors.remove("lm_head.weight") {
        if shape != [n, d] {
            return Err(bad(format!("lm_head.weight has shape {shape:?}, not [{n}, {d}]")));
        }
        tensors.insert(
            "lm_head.weight".into(),
            (vec![n_ours, d], ids.reorder_rows_owned(head, d, 0.0)),
        );
    }
    Ok(tensors)
}
