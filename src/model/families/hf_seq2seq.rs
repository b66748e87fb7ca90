//! What Hugging Face's encoder-decoders (Marian, M2M100 / NLLB) configure and store alike: the
//! FFN's `activation_function` and one `eos_token_id` in `config.json`; tensors under a
//! `model.` prefix, and one token table (`shared.weight`) that both stacks read and the head
//! is tied to, also saved under its tied names (`encoder.embed_tokens.weight`,
//! `decoder.embed_tokens.weight`, `lm_head.weight`) or only under one of them.

use crate::error::Result;
use crate::model::config::Activation;
use crate::model::ModelConfig;
use crate::store::{ckpt_err, TensorMap};
use crate::text::id_map::IdMap;
use std::path::Path;

/// A rename table's rows: the family's own `rows`, then the names every layer of a Hugging
/// Face (BART-style) encoder-decoder shares (`self_attn`, `encoder_attn`, `fc1` / `fc2` and
/// their norms) -> ours.
macro_rules! with_layer_names {
    ($($row:expr),* $(,)?) => {
        [
            $($row,)*
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
        (vec![n_ours, d], ids.reorder_rows(&shared.1, d, 0.0)),
    );
    if let Some((shape, head)) = tensors.remove("lm_head.weight") {
        if shape != [n, d] {
            return Err(bad(format!("lm_head.weight has shape {shape:?}, not [{n}, {d}]")));
        }
        tensors.insert(
            "lm_head.weight".into(),
            (vec![n_ours, d], ids.reorder_rows(&head, d, 0.0)),
        );
    }
    Ok(tensors)
}
