//! The rotary parameters of a llama-style checkpoint: the base θ and the frequency scaling
//! ([`RopeScaling`]), as a Hugging Face `config.json` states them (transformers 5's
//! `rope_parameters`, or the older top-level `rope_theta` and `rope_scaling`) or a GGUF file
//! (`{arch}.rope.freq_base`, `{arch}.rope.scaling.type`, llama.cpp's `rope_freqs.weight`
//! tensor of per-frequency factors).
//!
//! Computed: the default rotation and Llama 3.1's `llama3` scaling. Every other scaling
//! (`linear`, `dynamic`, `yarn`, `longrope`, ...) is refused by name.

use crate::error::Result;
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
pub fn hf_rope(
    rope_parameters: Option<&Value>,
    rope_theta: Option<f64>,
    rope_scaling: Option<&Value>,
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
    let scaling = match kind {
        "default" => None,
        "llama3" => {
            let get = |key: &str| -> std::result::Result<f64, String> {
                let v = params
                    .get(key)
                    .ok_or_else(|| format!("{field} of rope_type llama3 has no {key}"))?;
                number(field, key, v)
            };
            Some(RopeScaling::Llama3 {
                factor: get("factor")?,
                low_freq_factor: get("low_freq_factor")?,
                high_freq_factor: get("high_freq_factor")?,
                original_max_position_embeddings: get("original_max_position_embeddings")?,
            })
        }
        other => {
            return Err(format!(
                "{field}.rope_type {other:?} is not supported (default and llama3 are)"
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
/// factors, written by the converter for Llama 3.1 checkpoints) when present; a
/// `{arch}.rope.scaling.type` other than `none` is refused by name.
pub fn gguf_rope_scaling(file: &GgufFile) -> Result<Option<RopeScaling>> {
    let arch = file.architecture()?;
    let key = format!("{arch}.rope.scaling.type");
    if let Some(kind) = file.get::<&str>(&key)? {
        if kind != "none" {
            return Err(ckpt_err(
                file.path(),
                format!("{key} {kind:?} is not supported (rope_freqs factors are)"),
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hf_rope_reads_both_layouts_and_refuses_other_scalings_by_name() {
        assert_eq!(hf_rope(None, None, None).unwrap(), (10000.0, None));
        assert_eq!(hf_rope(None, Some(5e5), None).unwrap(), (5e5, None));
        let v5 = json!({"rope_theta": 1e6, "rope_type": "default"});
        assert_eq!(hf_rope(Some(&v5), None, None).unwrap(), (1e6, None));
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
            hf_rope(Some(&v5), None, None).unwrap(),
            (5e5, Some(llama3.clone()))
        );
        let v4 = json!({"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        assert_eq!(
            hf_rope(None, Some(5e5), Some(&v4)).unwrap(),
            (5e5, Some(llama3))
        );
        for (kind, value) in [
            ("yarn", json!({"rope_type": "yarn", "factor": 4.0})),
            ("linear", json!({"type": "linear", "factor": 2.0})),
            ("longrope", json!({"rope_type": "longrope"})),
        ] {
            let err = hf_rope(None, None, Some(&value)).unwrap_err();
            assert!(err.contains(kind) && err.contains("not supported"), "{err}");
        }
        let missing = json!({"rope_type": "llama3", "factor": 8.0});
        let err = hf_rope(Some(&missing), None, None).unwrap_err();
        assert!(err.contains("low_freq_factor"), "{err}");
        let partial = json!({"rope_type": "default", "partial_rotary_factor": 0.5});
        let err = hf_rope(Some(&partial), None, None).unwrap_err();
        assert!(err.contains("partial_rotary_factor"), "{err}");
        let err = hf_rope(Some(&json!({"rope_theta": "big"})), None, None).unwrap_err();
        assert!(err.contains("rope_theta"), "{err}");
    }
}
