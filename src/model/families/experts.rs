//! The mixture-of-experts fields of the families that have them ([`ExpertsConfig`], computed
//! by `crate::model::experts`), read from a Hugging Face `config.json` or a GGUF file's
//! metadata, and the split of GGUF's merged expert tensors (and of transformers 5's whole
//! 3-D expert tensors, [`split_whole_experts_hf`]) into one tensor per expert.
//!
//! A GGUF file stores each layer's experts as one tensor of ggml dims `[cols, rows, E]`
//! (`blk.{i}.ffn_{gate,up,down}_exps.weight`): expert `e`'s matrix is the `e`-th run of `rows`
//! stored rows, so each expert reads its own bytes in place (dequantised, or multiplied in its
//! blocks like any weight) under the name `blk.{i}.ffn_{gate,up,down}_exps.{e}.weight`.

use super::llama::{self, Variant};
use crate::error::Result;
use crate::model::config::{ExpertsConfig, ModelConfig};
use crate::store::{ckpt_err, TensorMap};
use crate::store::gguf::{GgufFile, TensorInfo};
use serde::Deserialize;
use std::path::Path;

/// The fields of a Hugging Face `config.json` that make its FFNs mixtures (Qwen3-MoE's and
/// Qwen2-MoE's `num_experts`, Mixtral's `num_local_experts`).
#[derive(Clone, Debug, Deserialize)]
pub struct HfExperts {
    #[serde(default, alias = "num_local_experts")]
    pub num_experts: Option<usize>,
    #[serde(default)]
    pub num_experts_per_tok: Option<usize>,
    /// Each expert's width (Qwen-MoE); Mixtral's experts are `intermediate_size` wide.
    #[serde(default)]
    pub moe_intermediate_size: Option<usize>,
    #[serde(default)]
    pub norm_topk_prob: Option<bool>,
    /// Every how many layers is a mixture (Qwen-MoE; 1: every layer).
    #[serde(default)]
    pub decoder_sparse_step: Option<usize>,
    /// Layers with a dense FFN instead (Qwen-MoE).
    #[serde(default)]
    pub mlp_only_layers: Option<Vec<usize>>,
    /// A dense expert every token passes through (Qwen2-MoE).
    #[serde(default)]
    pub shared_expert_intermediate_size: Option<usize>,
}

/// How a family reads its routing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Normalise {
    /// Always normalised (Mixtral: a softmax over the chosen logits).
    Always,
    /// As `norm_topk_prob` says; absent, the family's default in transformers (`false` for
    /// Qwen3-MoE and OLMoE, `true` for Qwen3-Next).
    AsConfigured { default: bool },
}

impl HfExperts {
    /// Reads the fields from a `config.json`'s bytes (the rest is the family's).
    pub fn parse(bytes: &[u8]) -> std::result::Result<Self, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("invalid config: {e}"))
    }

    /// Our config of the mixtures (`None`: no `num_experts`, dense FFNs); `d_ff` is
    /// `intermediate_size`, the experts' width where the family has no field of its own. What
    /// is not computed is refused by name: dense layers among the mixtures, shared experts.
    pub fn config(
        &self,
        d_ff: usize,
        normalise: Normalise,
    ) -> std::result::Result<Option<ExpertsConfig>, String> {
        let Some(n_experts) = self.num_experts.filter(|&n| n > 0) else {
            return Ok(None);
        };
        if let Some(step) = self.decoder_sparse_step.filter(|&s| s != 1) {
            return Err(format!(
                "decoder_sparse_step {step} is not supported (a mixture in every layer only)"
            ));
        }
        if let Some(layers) = self.mlp_only_layers.as_ref().filter(|l| !l.is_empty()) {
            return Err(format!(
                "mlp_only_layers {layers:?} is not supported (a mixture in every layer only)"
            ));
        }
        if let Some(width) = self.shared_expert_intermediate_size.filter(|&w| w > 0) {
            return Err(format!(
                "shared_expert_intermediate_size {width} is not supported (no shared expert)"
            ));
        }
        let top_k = self
            .num_experts_per_tok
            .ok_or("num_experts without num_experts_per_tok")?;
        Ok(Some(ExpertsConfig {
            n_experts,
            top_k,
            d_ff: self.moe_intermediate_size.unwrap_or(d_ff),
            normalise: match normalise {
                Normalise::Always => true,
                Normalise::AsConfigured { default } => self.norm_topk_prob.unwrap_or(default),
            },
            shared_d_ff: None,
            bias: false,
            swiglu_clamp: None,
        }))
    }
}

impl HfExperts {
    /// [`config`](Self::config) for a family whose every mixture has a shared expert with its
    /// sigmoid gate (Qwen3-Next, Qwen3.5-MoE): `shared_expert_intermediate_size`, its width,
    /// required (transformers would build one of its default width without it).
    pub fn config_with_shared(
        &self,
        d_ff: usize,
        normalise: Normalise,
    ) -> std::result::Result<Option<ExpertsConfig>, String> {
        let shared = match self.shared_expert_intermediate_size {
            None => return Err("shared_expert_intermediate_size is missing (the family's mixtures \
                                have a shared expert)"
                .into()),
            Some(0) => {
                return Err("shared_expert_intermediate_size 0 is not supported (a shared expert \
                            of no width)"
                    .into())
            }
            Some(w) => w,
        };
        let routed = HfExperts {
            shared_expert_intermediate_size: None,
            ..self.clone()
        };
        Ok(routed.config(d_ff, normalise)?.map(|e| ExpertsConfig {
            shared_d_ff: Some(shared),
            ..e
        }))
    }
}

/// A Hugging Face `config.json` (`bytes`, read from `config_path` in `dir`) of a llama-style
/// family of variant `v` whose FFNs are mixtures (`count`: the field that says how many
/// experts, refused when absent), `edit` applied last (the family's own fields).
pub fn hf_config(
    (bytes, config_path, dir): (&[u8], &Path, &Path),
    v: &Variant,
    (normalise, count): (Normalise, &str),
    edit: impl FnOnce(&mut ModelConfig),
) -> Result<ModelConfig> {
    let config = llama::parse_config(bytes, config_path)?;
    let err = |e: String| ckpt_err(dir, format!("config.json: {e}"));
    let mut c = config.model_config_of(v).map_err(err)?;
    c.experts = HfExperts::parse(bytes)
        .map_err(err)?
        .config(config.intermediate_size, normalise)
        .map_err(err)?;
    if c.experts.is_none() {
        return Err(err(format!("{count} is missing (the family has experts)")));
    }
    edit(&mut c);
    c.validate().map_err(err)?;
    Ok(c)
}

/// The mixtures of a GGUF file (`None` without `{arch}.expert_count`): llama.cpp's
/// `expert_count`, `expert_used_count` and `expert_feed_forward_length` (absent: the dense
/// `feed_forward_length`, `d_ff`), with the routing llama.cpp computes for the architecture
/// (`normalise`). Shared experts, weight scales and gating functions other than the softmax
/// are refused by key.
pub fn gguf_experts(file: &GgufFile, d_ff: usize, normalise: bool) -> Result<Option<ExpertsConfig>> {
    let arch = file.architecture()?;
    let key = |k: &str| format!("{arch}.{k}");
    let Some(n_experts) = file.get::<usize>(&key("expert_count"))?.filter(|&n| n > 0) else {
        return Ok(None);
    };
    let path = file.path();
    let top_k = file
        .get::<usize>(&key("expert_used_count"))?
        .ok_or_else(|| ckpt_err(path, format!("{} is missing", key("expert_used_count"))))?;
    if let Some(shared) = file.get::<usize>(&key("expert_shared_count"))?.filter(|&n| n > 0) {
        return Err(ckpt_err(
            path,
            format!("{} {shared} is not supported (no shared experts)", key("expert_shared_count")),
        ));
    }
    if let Some(f) = file.get::<usize>(&key("expert_gating_func"))?.filter(|&f| f != 1) {
        return Err(ckpt_err(
            path,
            format!("{} {f} is not supported (softmax routers only)", key("expert_gating_func")),
        ));
    }
    if let Some(s) = file
        .get::<f64>(&key("expert_weights_scale"))?
        .filter(|&s| s != 0.0 && s != 1.0)
    {
        return Err(ckpt_err(
            path,
            format!("{} {s} is not supported", key("expert_weights_scale")),
        ));
    }
    let d_ff = file
        .get::<usize>(&key("expert_feed_forward_length"))?
        .unwrap_or(d_ff);
    let experts = ExpertsConfig {
        n_experts,
        top_k,
        d_ff,
        normalise,
        shared_d_ff: None,
        bias: false,
        swiglu_clamp: None,
    };
    Ok(Some(experts))
}

/// The stems of llama.cpp's merged expert tensors (`blk.{i}.{stem}.weight`).
const MERGED: [&str; 3] = ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"];

/// `info` as one tensor per expert when it is a merged expert tensor of a model of
/// `experts` (its weights `[cols, rows, E]`, or gpt-oss's biases `[rows, E]`, ggml dims), or
/// `None` (any other tensor); an error when its dims do not hold them.
pub fn split_experts(
    file: &GgufFile,
    info: &TensorInfo,
    experts: Option<ExpertsConfig>,
) -> Result<Option<Vec<TensorInfo>>> {
    let merged = |suffix: &str| {
        info.name
            .strip_prefix("blk.")
            .and_then(|rest| rest.split_once('.'))
            .and_then(|(_, rest)| rest.strip_suffix(suffix))
            .filter(|stem| MERGED.contains(stem))
            .is_some()
    };
    let Some(experts) = experts else {
        return Ok(None);
    };
    let suffix = match (merged(".weight"), merged(".bias")) {
        (true, _) => "weight",
        (_, true) => "bias",
        _ => return Ok(None),
    };
    let e = experts.n_experts;
    let (n_bytes, dims) = match (suffix, &info.dims[..], info.n_bytes) {
        ("weight", [cols, rows, n], Some(bytes)) if *n == e && *rows > 0 => {
            (bytes, vec![*cols, *rows])
        }
        ("bias", [rows, n], Some(bytes)) if *n == e && *rows > 0 => (bytes, vec![*rows]),
        _ => {
            let want = match suffix {
                "weight" => "[cols, rows, {e}]",
                _ => "[rows, {e}]",
            };
            return Err(ckpt_err(
                file.path(),
                format!(
                    "tensor {} has dims {:?}, not {} for {e} experts",
                    info.name,
                    info.dims,
                    want.replace("{e}", &e.to_string())
                ),
            ));
        }
    };
    let expert_bytes = n_bytes / e;
    let n_elements = dims.iter().product();
    let base = info.name.rsplit_once('.').map_or(&info.name[..], |(base, _)| base);
    Ok(Some(
        (0..e)
            .map(|k| TensorInfo {
                name: format!("{base}.{k}.{suffix}"),
                dims: dims.clone(),
                ggml_type: info.ggml_type,
                offset: info.offset + k * expert_bytes,
                n_elements,
                n_bytes: Some(expert_bytes),
            })
            .collect(),
    ))
}

/// Splits each layer's experts stored whole, as transformers 5 holds them (checkpoints of
/// Qwen3-Next and Qwen3.5-MoE may be saved so): `model.layers.{i}.mlp.experts.gate_up_proj
/// [E, 2·d_ff, d_model]` (expert `e`'s gate rows, then its up rows) and `…experts.down_proj
/// [E, d_model, d_ff]`, into the per-expert tensors of the checkpoints saved expert by expert
/// (`…experts.{e}.{gate,up,down}_proj.weight`). Tensors in `tensors` (read from `path`) of
/// another shape than `config`'s experts are refused by name.
pub fn split_whole_experts_hf(
    path: &Path,
    tensors: &mut TensorMap,
    config: &ModelConfig,
) -> Result<()> {
    let Some(e) = config.experts else {
        return Ok(());
    };
    let (n, d_ff, d) = (e.n_experts, e.d_ff, config.d_model);
    for i in 0..config.n_decoder_layers {
        let stem = format!("model.layers.{i}.mlp.experts");
        for (name, rows, parts) in [
            ("gate_up_proj", 2 * d_ff, &["gate_proj", "up_proj"][..]),
            ("down_proj", d, &["down_proj"][..]),
        ] {
            let whole = format!("{stem}.{name}");
            let Some((shape, data)) = tensors.remove(&whole) else {
                continue;
            };
            let cols = if name == "down_proj" { d_ff } else { d };
            if shape != [n, rows, cols] {
                return Err(ckpt_err(
                    path,
                    format!("tensor {whole} has shape {shape:?}, not [{n}, {rows}, {cols}]"),
                ));
            }
            // Expert k's block of rows·cols values, cut into its parts' equal row ranges.
            let part_len = rows / parts.len() * cols;
            for (k, block) in data.chunks(rows * cols).enumerate() {
                for (part, values) in parts.iter().zip(block.chunks(part_len)) {
                    let shape = vec![rows / parts.len(), cols];
                    tensors.insert(format!("{stem}.{k}.{part}.weight"), (shape, values.to_vec()));
                }
            }
        }
    }
    Ok(())
}
