//! The rotary parameters of a llama-style checkpoint: the base θ and the frequency scaling
//! ([`RopeScaling`]), as a Hugging Face `config.json` states them (transformers 5's
//! `rope_parameters`, or the older top-level `rope_theta` and `rope_scaling`) or a GGUF file
//! (`{arch}.rope.freq_base`, `{arch}.rope.scaling.type`, llama.cpp's `rope_freqs.weight`
//! tensor of per-frequency factors).
//!
//! Computed: the default rotation, Llama 3.1's `llama3` scaling, YaRN (`yarn`: Qwen2.5's
//! 128k configs; GGUF `rope.scaling.type yarn` with llama.cpp's `rope.scaling.factor`,
//! `rope.scaling.original_context_length` and `rope.scaling.yarn_*` keys) and `linear`. Every
//! other scaling (`dynamic`, `longrope`, ...) is refused by name.

use crate::error::Result;
use crate::backend::{Backend, CPU};
use crate::model::config::RopeScaling;
use crate::store::ckpt_err;
use crate::store::gguf::GgufFile;
use serde_json::Value;

/// llama.cpp's name of the tensor of per-frequency factors (`LLM_TENSOR_ROPE_FREQS`): read into
/// the config, not a parameter.
pub const GGUF_ROPE_FREQS: &str = "rope_freqs.weight";

/// The rotary base and scaling of a Hugging Face config: `rope_parameters` (transformers 5)
/// when present, else `rope_theta` (default `10000`) and `rope_scaling`. The message of an
/// error names the field.
///
/// `max_position_embeddings` is what transformers falls back on where a YaRN config leaves
/// out `original_max_position_embeddings` (and `factor`: their ratio).
pub fn hf_rope(
    rope_parameters: Option<&Value>,
    rope_theta: Option<f64>,
    rope_scaling: Option<&Value>,
    max_position_embeddings: usize,
) -> std::result::Result<(f64, Option<RopeScaling>), String> {
    let params = match (rope_parameters, rope_scaling) {
        (Some(p), _) if !p.is_null() => Some(("rope_parameters", p)),
        (_, Some(s)) if !s.is_null() => Some(("rope_scaling", s)),
        _ => None,
    };
    let Some((field, params)) = params else {
        return Ok((rope_theta.unwrap_or(crate::model::config::ROPE_BASE), None));
    };
    let params = params
        .as_object()
        .ok_or_else(|| format!("{field} is not an object"))?;
    let base = match params.get("rope_theta") {
        Some(v) => number(field, "rope_theta", v)?,
        None => rope_theta.unwrap_or(crate::model::config::ROPE_BASE),
    };
    // transformers writes the kind as `rope_type`, older configs as `type`.
    let kind = params
        .get("rope_type")
        .or_else(|| params.get("type"))
        .map(|v| {
            v.as_str()
                .ok_or_else(|| format!("{field}.rope_type is not a string"))
        })
        .transpose()?
        .unwrap_or("default");
    if let Some(p) = params.get("partial_rotary_factor") {
        let p = number(field, "partial_rotary_factor", p)?;
        if p != 1.0 {
            return Err(format!(
                "{field}.partial_rotary_factor {p} is not supported (rotary over the whole head only)"
            ));
        }
    }
    // A key's number, `None` where absent or null.
    let optional = |key: &str| -> std::result::Result<Option<f64>, String> {
        match params.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => number(field, key, v).map(Some),
        }
    };
    let get = |key: &str| -> std::result::Result<f64, String> {
        optional(key)?.ok_or_else(|| format!("{field} of rope_type {kind} has no {key}"))
    };
    let scaling = match kind {
        "default" => None,
        "llama3" => Some(RopeScaling::Llama3 {
            factor: get("factor")?,
            low_freq_factor: get("low_freq_factor")?,
            high_freq_factor: get("high_freq_factor")?,
            original_max_position_embeddings: get("original_max_position_embeddings")?,
        }),
        "linear" => Some(RopeScaling::Linear {
            factor: get("factor")?,
        }),
        "yarn" => {
            let original = optional("original_max_position_embeddings")?
                .unwrap_or(max_position_embeddings as f64);
            let factor = optional("factor")?
                .unwrap_or(max_position_embeddings as f64 / original);
            let (mscale, mscale_all_dim) = (optional("mscale")?, optional("mscale_all_dim")?);
            let attention_factor = optional("attention_factor")?
                .unwrap_or_else(|| CPU.rope_yarn_attention_factor(factor, mscale, mscale_all_dim));
            // transformers: `rope_parameters.get("beta_fast") or 32` (a 0 is the default too).
            let or_default =
                |v: Option<f64>, default: f64| v.filter(|&b| b != 0.0).unwrap_or(default);
            let truncate = match params.get("truncate") {
                None | Some(Value::Null) => true,
                Some(v) => v
                    .as_bool()
                    .ok_or_else(|| format!("{field}.truncate is not a boolean: {v}"))?,
            };
            Some(RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original,
                beta_fast: or_default(optional("beta_fast")?, 32.0),
                beta_slow: or_default(optional("beta_slow")?, 1.0),
                attention_factor,
                truncate,
            })
        }
        other => {
            return Err(format!(
                "{field}.rope_type {other:?} is not supported (default, llama3, yarn and \
                 linear are)"
            ))
        }
    };
    Ok((base, scaling))
}

/// `v` (the value of `key` in `field`) as a number.
fn number(field: &str, key: &str, v: &Value) -> std::result::Result<f64, String> {
    v.as_f64()
        .ok_or_else(|| format!("{field}.{key} is not a number: {v}"))
}

/// The rotary scaling of a GGUF file: llama.cpp's `rope_freqs.weight` tensor (per-frequency
/// factors, written by the converter for Llama 3.1 checkpoints) when present;
/// `{arch}.rope.scaling.type` `yarn` ([`gguf_yarn`]) or `linear` (`rope.scaling.factor`);
/// any other type than `none` is refused by name.
pub fn gguf_rope_scaling(file: &GgufFile) -> Result<Option<RopeScaling>> {
    let arch = file.architecture()?;
    let key = format!("{arch}.rope.scaling.type");
    match file.get::<&str>(&key)? {
        None | Some("none") => {}
        Some("yarn") => return gguf_yarn(file, arch).map(Some),
        Some("linear") => {
            let factor_key = format!("{arch}.rope.scaling.factor");
            let factor = file.get::<f64>(&factor_key)?.ok_or_else(|| {
                ckpt_err(file.path(), format!("{key} linear without {factor_key}"))
            })?;
            return Ok(Some(RopeScaling::Linear { factor }));
        }
        Some(kind) => {
            return Err(ckpt_err(
                file.path(),
                format!(
                    "{key} {kind:?} is not supported (yarn, linear and rope_freqs factors are)"
                ),
            ));
        }
    }
    for long_rope in ["rope_factors_long.weight", "rope_factors_short.weight"] {
        if file.tensors().iter().any(|t| t.name == long_rope) {
            return Err(ckpt_err(
                file.path(),
                format!("tensor {long_rope} (LongRoPE scaling) is not supported"),
            ));
        }
    }
    let Some(info) = file.tensors().iter().find(|t| t.name == GGUF_ROPE_FREQS) else {
        return Ok(None);
    };
    let factors = file.dequantize_info(info)?;
    Ok(Some(RopeScaling::FreqFactors {
        factors: factors.into_iter().map(f64::from).collect(),
    }))
}

/// YaRN as llama.cpp's converter writes it (`convert_hf_to_gguf.py`, Qwen2.5 and others):
/// `{arch}.rope.scaling.factor` and `.original_context_length` (both required), and where the
/// Hugging Face config stated them `.yarn_beta_fast`, `.yarn_beta_slow` and `.yarn_attn_factor`
/// (transformers' `attention_factor`; absent: `0.1 · ln factor + 1`). An extrapolation factor
/// (`.yarn_ext_factor`) other than 1 and DeepSeek's `.yarn_log_multiplier` are refused by name.
fn gguf_yarn(file: &GgufFile, arch: &str) -> Result<RopeScaling> {
    let key = |k: &str| format!("{arch}.rope.scaling.{k}");
    let optional = |k: &str| -> Result<Option<f64>> { file.get::<f64>(&key(k)) };
    let required = |k: &str| -> Result<f64> {
        optional(k)?.ok_or_else(|| {
            ckpt_err(file.path(), format!("rope scaling yarn without {}", key(k)))
        })
    };
    let factor = required("factor")?;
    let original = file
        .get::<usize>(&key("original_context_length"))?
        .ok_or_else(|| {
            ckpt_err(
                file.path(),
                format!("rope scaling yarn without {}", key("original_context_length")),
            )
        })? as f64;
    if let Some(e) = optional("yarn_ext_factor")?.filter(|&e| e >= 0.0 && e != 1.0) {
        return Err(ckpt_err(
            file.path(),
            format!("{} {e} is not supported (1, full YaRN, is)", key("yarn_ext_factor")),
        ));
    }
    if let Some(m) = optional("yarn_log_multiplier")?.filter(|&m| m != 0.0) {
        return Err(ckpt_err(
            file.path(),
            format!("{} {m} (DeepSeek's mscale) is not supported", key("yarn_log_multiplier")),
        ));
    }
    let positive_or = |v: Option<f64>, default: f64| v.filter(|&b| b > 0.0).unwrap_or(default);
    Ok(RopeScaling::Yarn {
        factor,
        original_max_position_embeddings: original,
        beta_fast: positive_or(optional("yarn_beta_fast")?, 32.0),
        beta_slow: positive_or(optional("yarn_beta_slow")?, 1.0),
        attention_factor: positive_or(
            optional("yarn_attn_factor")?,
            CPU.rope_yarn_attention_factor(factor, None, None),
        ),
        truncate: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hf_rope_reads_both_layouts_and_refuses_other_scalings_by_name() {
        assert_eq!(hf_rope(None, None, None, 4096).unwrap(), (10000.0, None));
        assert_eq!(hf_rope(None, Some(5e5), None, 4096).unwrap(), (5e5, None));
        let v5 = json!({"rope_theta": 1e6, "rope_type": "default"});
        assert_eq!(hf_rope(Some(&v5), None, None, 4096).unwrap(), (1e6, None));
        let llama3 = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        };
        let v5 = json!({"rope_theta": 5e5, "rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192});
        assert_eq!(
            hf_rope(Some(&v5), None, None, 4096).unwrap(),
            (5e5, Some(llama3.clone()))
        );
        let v4 = json!({"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        assert_eq!(
            hf_rope(None, Some(5e5), Some(&v4), 4096).unwrap(),
            (5e5, Some(llama3))
        );
        for (kind, value) in [
            ("dynamic", json!({"rope_type": "dynamic", "factor": 4.0})),
            ("longrope", json!({"rope_type": "longrope"})),
        ] {
            let err = hf_rope(None, None, Some(&value), 4096).unwrap_err();
            assert!(err.contains(kind) && err.contains("not supported"), "{err}");
        }
        // Qwen2.5's 128k config (transformers 4 layout), defaults filled as transformers does.
        let qwen =
            json!({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768});
        let (_, yarn) = hf_rope(None, Some(1e6), Some(&qwen), 131072).unwrap();
        assert_eq!(
            yarn,
            Some(RopeScaling::Yarn {
                factor: 4.0,
                original_max_position_embeddings: 32768.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: 0.1 * 4f64.ln() + 1.0,
                truncate: true,
            })
        );
        // Without original_max_position_embeddings: max_position_embeddings, and without a
        // factor their ratio; mscale over mscale_all_dim; explicit attention_factor wins.
        let deepseek = json!({"rope_type": "yarn", "mscale": 1.0, "mscale_all_dim": 0.5,
            "beta_fast": 16, "truncate": false});
        let Some(RopeScaling::Yarn { factor, original_max_position_embeddings, beta_fast,
            attention_factor, truncate, .. }) = hf_rope(Some(&deepseek), None, None, 4096)
            .unwrap().1 else { panic!("not yarn") };
        assert_eq!((factor, original_max_position_embeddings, beta_fast, truncate),
            (1.0, 4096.0, 16.0, false));
        assert_eq!(attention_factor, 1.0);
        let explicit = json!({"rope_type": "yarn", "factor": 8.0, "attention_factor": 0.5,
            "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 0.5});
        let Some(RopeScaling::Yarn { attention_factor, .. }) =
            hf_rope(Some(&explicit), None, None, 32768).unwrap().1 else { panic!() };
        assert_eq!(attention_factor, 0.5);
        let ratio = json!({"rope_type": "yarn", "factor": 8.0,
            "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 0.5});
        let Some(RopeScaling::Yarn { attention_factor, .. }) =
            hf_rope(Some(&ratio), None, None, 32768).unwrap().1 else { panic!() };
        let want = (0.1 * 8f64.ln() + 1.0) / (0.05 * 8f64.ln() + 1.0);
        assert!((attention_factor - want).abs() < 1e-15, "{attention_factor} vs {want}");
        let linear = json!({"type": "linear", "factor": 2.0});
        assert_eq!(
            hf_rope(None, None, Some(&linear), 4096).unwrap().1,
            Some(RopeScaling::Linear { factor: 2.0 })
        );
        let missing = json!({"rope_type": "llama3", "factor": 8.0});
        let err = hf_rope(Some(&missing), None, None, 4096).unwrap_err();
        assert!(err.contains("low_freq_factor"), "{err}");
        let partial = json!({"rope_type": "default", "partial_rotary_factor": 0.5});
        let err = hf_rope(Some(&partial), None, None, 4096).unwrap_err();
        assert!(err.contains("partial_rotary_factor"), "{err}");
        let err = hf_rope(Some(&json!({"rope_theta": "big"})), None, None, 4096).unwrap_err();
        assert!(err.contains("rope_theta"), "{err}");
    }
}
