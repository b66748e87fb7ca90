//! A multimodal checkpoint's language model read as a text model (Qwen3.5's and Qwen3.5-MoE's
//! `…ForConditionalGeneration`, `model_type` `qwen3_5` / `qwen3_5_moe`): the text model's
//! config is the `config.json`'s `text_config` (with the top level's `tie_word_embeddings`,
//! which is what transformers ties the output projection by), and its weights are the
//! language model's, `model.language_model.*` read as the text model's `model.*`, `lm_head`
//! as it is. The vision tower (`model.visual.*`) is not loaded, and loading says so once on
//! stderr: images are not an input here (a served chat message with image content is refused
//! by name, `crate::serve`).

use crate::error::Result;
use crate::store::{ckpt_err, TensorMap};
use serde_json::Value;
use std::path::Path;

/// Where a multimodal checkpoint keeps its language model's tensors.
const LANGUAGE_MODEL: &str = "model.language_model.";

/// Where it keeps its vision tower's.
const VISION: &str = "model.visual.";

/// The text model's config of `config` (read from `path`): its `text_config`, whose
/// `model_type` must be `text_type` when it says one, with the top level's
/// `tie_word_embeddings` (false when absent, transformers' default); `config` itself when it
/// has no `text_config` (a text model's).
pub fn text_config(config: Value, path: &Path, text_type: &str) -> Result<Value> {
    let Value::Object(mut top) = config else {
        return Err(ckpt_err(path, "config.json is not a JSON object"));
    };
    let Some(text) = top.remove("text_config") else {
        return Ok(Value::Object(top));
    };
    let Value::Object(mut text) = text else {
        return Err(ckpt_err(path, "text_config is not a JSON object"));
    };
    if let Some(t) = text
        .get("model_type")
        .and_then(Value::as_str)
        .filter(|&t| t != text_type)
    {
        return Err(ckpt_err(
            path,
            format!("text_config.model_type {t:?} is not {text_type:?}"),
        ));
    }
    let tied = top
        .get("tie_word_embeddings")
        .cloned()
        .unwrap_or(Value::Bool(false));
    text.insert("tie_word_embeddings".into(), tied);
    Ok(Value::Object(text))
}

/// `tensors` of the directory `dir` with a multimodal checkpoint's language model renamed to a
/// text model's (`model.language_model.X` as `model.X`) and its vision tower's dropped, said
/// once on stderr; a text checkpoint's as they are. A tensor under both names is refused.
pub fn language_model_tensors(dir: &Path, tensors: TensorMap) -> Result<TensorMap> {
    if !tensors.keys().any(|n| n.starts_with(LANGUAGE_MODEL)) {
        return Ok(tensors);
    }
    let mut out = TensorMap::with_capacity(tensors.len());
    let mut vision = 0usize;
    for (name, t) in tensors {
        if name.starts_with(VISION) {
            vision += 1;
            continue;
        }
        let ours = match name.strip_prefix(LANGUAGE_MODEL) {
            Some(rest) => format!("model.{rest}"),
            None => name,
        };
        if out.contains_key(&ours) {
            return Err(ckpt_err(
                dir,
                format!("tensor {ours} appears twice (as {LANGUAGE_MODEL}* and model.*)"),
            ));
        }
        out.insert(ours, t);
    }
    if vision > 0 {
        eprintln!(
            "note: {}: a multimodal checkpoint read as its text model: the vision tower's {vision} \
             tensors ({VISION}*) are not loaded (image input is not supported)",
            dir.display()
        );
    }
    Ok(out)
}
