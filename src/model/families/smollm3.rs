//! SmolLM3 (Hugging Face 2025): a Llama-family decoder (grouped-query attention, SwiGLU,
//! RMSNorm, the head tied to the embeddings by default) in which some layers attend without
//! positions (NoPE): their queries and keys are not rotated, `softmax(q·kᵀ / √d_k)` of the
//! plain projections ([`ModelConfig::layer_rope`]). Which ones: `no_rope_layers` (per layer, 1
//! rotates, 0 does not; transformers writes it), or without it every
//! `no_rope_layer_interval`-th layer (4: layers 3, 7, 11, ... are NoPE). Names are Llama's.
//!
//! GGUF: architecture `smollm3`, Llama's tensor names and rotary pairing (the converter
//! permutes the query and key rows as Llama's; names without experts' rows,
//! [`llama::GGUF_DENSE_NAMES`]); llama.cpp fixes the interval at 4
//! (`n_no_rope_layer_step`) and stores no per-layer list, so a file's NoPE layers are every
//! fourth.

use super::llama::{self, Variant, WindowRule};
use super::{Family, FamilyKind, GgufDecoder, HfDecoder};
use crate::error::Result;
use crate::model::config::{ModelConfig, RopeStyle};
use crate::store::ckpt_err;
use crate::store::gguf::GgufFile;
use serde::Deserialize;
use std::path::Path;

/// SmolLM3's variant of the Llama config: no biases, no query/key norms, no window.
pub const VARIANT: Variant = Variant {
    qkv_bias: false,
    qk_norm: false,
    windows: WindowRule::Never,
};

/// The row of [`super::FAMILIES`].
pub const FAMILY: Family = Family {
    name: "smollm3",
    kind: FamilyKind::Decoder,
    model_types: &["smollm3"],
    hf_names: llama::HF_DENSE_NAMES,
    hf_decoder: Some(HfDecoder {
        config: hf_config,
        tensors: llama::hf_tensors,
    }),
    gguf: Some(GgufDecoder {
        architecture: "smollm3",
        config: gguf_config,
        names: llama::GGUF_DENSE_NAMES,
        fused: &[],
    }),
    chat_template: None,
};

/// transformers' `SmolLM3Config.default_theta`: the rotary base of a config that states none.
const DEFAULT_THETA: f64 = 2_000_000.0;

/// llama.cpp's (and transformers' default) NoPE interval: every fourth layer.
const GGUF_NO_ROPE_INTERVAL: usize = 4;

fn four() -> usize {
    GGUF_NO_ROPE_INTERVAL
}

/// SmolLM3's own fields of `config.json` (the rest are Llama's).
#[derive(Deserialize)]
struct SmolLm3Fields {
    /// Per layer, 1: rotary, 0: NoPE (at least as many entries as layers).
    #[serde(default)]
    no_rope_layers: Option<Vec<serde_json::Value>>,
    #[serde(default = "four")]
    no_rope_layer_interval: usize,
    #[serde(default)]
    use_sliding_window: bool,
    /// Tied unless it says otherwise (SmolLM3's default, unlike Llama's).
    #[serde(default)]
    tie_word_embeddings: Option<bool>,
}

/// Each of `n` layers rotates unless it is every `interval`-th (`(i + 1) % interval == 0`).
fn every_nth_without(n: usize, interval: usize) -> Vec<bool> {
    (0..n).map(|i| (i + 1) % interval != 0).collect()
}

impl SmolLm3Fields {
    /// Per layer of `n`, whether it rotates; an error names the field.
    fn layer_rope(&self, n: usize) -> std::result::Result<Vec<bool>, String> {
        let Some(list) = &self.no_rope_layers else {
            if self.no_rope_layer_interval == 0 {
                return Err("no_rope_layer_interval 0 (every layer would be NoPE)".into());
            }
            return Ok(every_nth_without(n, self.no_rope_layer_interval));
        };
        if list.len() < n {
            return Err(format!(
                "no_rope_layers has {} entries for {n} layers",
                list.len()
            ));
        }
        (list[..n].iter().enumerate())
            .map(|(i, v)| match v.as_i64() {
                Some(0) => Ok(false),
                Some(1) => Ok(true),
                _ => Err(format!(
                    "no_rope_layers[{i}] is {v}, not 0 (NoPE) or 1 (rotary)"
                )),
            })
            .collect()
    }
}

/// A Hugging Face directory's `config.json` of `model_type` `smollm3`, as our config.
fn hf_config(bytes: &[u8], config_path: &Path, dir: &Path) -> Result<ModelConfig> {
    let err = |e: String| ckpt_err(dir, format!("config.json: {e}"));
    let own: SmolLm3Fields = serde_json::from_slice(bytes)
        .map_err(|e| ckpt_err(config_path, format!("invalid SmolLM3 config: {e}")))?;
    if own.use_sliding_window {
        return Err(err(
            "use_sliding_window true is not supported (SmolLM3's sliding layers)".into(),
        ));
    }
    let mut llama = llama::parse_config(bytes, config_path)?;
    llama.rope_theta = llama.rope_theta.or(Some(DEFAULT_THETA));
    llama.tie_word_embeddings = own.tie_word_embeddings.unwrap_or(true);
    let mut c = llama.model_config_of(&VARIANT).map_err(err)?;
    c.layer_rope = own.layer_rope(c.n_decoder_layers).map_err(err)?;
    c.validate().map_err(err)?;
    Ok(c)
}

/// The config of a GGUF file of architecture `smollm3`: Llama's, every fourth layer NoPE.
fn gguf_config(file: &GgufFile) -> Result<ModelConfig> {
    let mut c = llama::gguf_config_of(file, &VARIANT, RopeStyle::Interleaved)?;
    c.layer_rope = every_nth_without(c.n_decoder_layers, GGUF_NO_ROPE_INTERVAL);
    c.validate().map_err(|e| ckpt_err(file.path(), e))?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nope_layers_are_every_fourth_or_as_listed() {
        assert_eq!(
            every_nth_without(9, 4),
            [true, true, true, false, true, true, true, false, true]
        );
        let fields = |json: &str| serde_json::from_str::<SmolLm3Fields>(json).unwrap();
        assert_eq!(
            fields("{}").layer_rope(4).unwrap(),
            [true, true, true, false]
        );
        assert_eq!(
            fields(r#"{"no_rope_layer_interval": 2}"#)
                .layer_rope(4)
                .unwrap(),
            [true, false, true, false]
        );
        // A list wins over the interval; entries past the layers are not read.
        let listed = fields(r#"{"no_rope_layers": [0, 1, 1, 0, 7], "no_rope_layer_interval": 2}"#);
        assert_eq!(listed.layer_rope(4).unwrap(), [false, true, true, false]);
        assert!(listed
            .layer_rope(5)
            .unwrap_err()
            .contains("no_rope_layers[4] is 7"));
        let short = fields(r#"{"no_rope_layers": [1, 1]}"#)
            .layer_rope(3)
            .unwrap_err();
        assert!(
            short.contains("no_rope_layers has 2 entries for 3 layers"),
            "{short}"
        );
        let zero = fields(r#"{"no_rope_layer_interval": 0}"#)
            .layer_rope(3)
            .unwrap_err();
        assert!(zero.contains("no_rope_layer_interval 0"), "{zero}");
    }
}
