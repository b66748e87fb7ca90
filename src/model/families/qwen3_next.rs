//! Qwen3-Next (Qwen team 2025; Qwen3-Next-80B-A3B): the stack Qwen3.5 grew from, the same
//! pieces ([`super::qwen3_5`]: Gated DeltaNet layers around gated, partially rotated
//! full-attention layers, zero-centred norms) with every FFN a mixture of experts and a shared
//! expert ([`super::qwen3_5_moe`]'s block), the chosen weights renormalised when
//! `norm_topk_prob` (transformers' default: true). `model_type` `qwen3_next`
//! (`Qwen3NextForCausalLM`).
//!
//! What differs is storage: each Gated DeltaNet layer's input projections are fused, key head
//! group by key head group. For key head `g` of `key_heads`, serving `r = value_heads /
//! key_heads` value heads, `in_proj_qkvz` holds the rows `[q_g (d_k); k_g (d_k); v_g (r·d_v);
//! z_g (r·d_v)]` and `in_proj_ba` the rows `[b_g (r); a_g (r)]`; at load they become Qwen3.5's
//! `in_proj_qkv` (every `q`, then every `k`, then every `v`), `in_proj_z`, `in_proj_b` and
//! `in_proj_a`.
//!
//! Refused by name: dense FFNs among the mixtures (`mlp_only_layers`, `decoder_sparse_step`
//! other than 1), and what Qwen3.5 refuses. llama.cpp's `qwen3next` GGUF files do not load yet.

use super::experts::Normalise;
use super::qwen3_5::{self, HybridFfn};
use super::{Family, FamilyKind, HfDecoder};
use crate::error::Result;
use crate::model::config::ModelConfig;
use crate::store::{ckpt_err, TensorMap};
use std::path::Path;

/// The row of [`super::FAMILIES`].
pub const FAMILY: Family = Family {
    name: "qwen3_next",
    kind: FamilyKind::Decoder,
    model_types: &["qwen3_next"],
    hf_names: qwen3_5::HF_NAMES,
    hf_decoder: Some(HfDecoder {
        config: hf_config,
        tensors: hf_tensors,
    }),
    gguf: None,
    chat_template: None,
};

/// A Hugging Face directory's `config.json` of `model_type` `qwen3_next`, as our config.
fn hf_config(bytes: &[u8], config_path: &Path, dir: &Path) -> Result<ModelConfig> {
    let ffn = HybridFfn::Experts(Normalise::AsConfigured { default: true });
    qwen3_5::hybrid_hf_config((bytes, config_path, dir), "qwen3_next", ffn)
}

/// The tensors of a Qwen3-Next directory in our layout: each Gated DeltaNet layer's fused
/// projections split into Qwen3.5's (see the module docs), then Qwen3.5's
/// ([`qwen3_5::hybrid_tensors`]).
fn hf_tensors(dir: &Path, mut tensors: TensorMap, config: &ModelConfig) -> Result<TensorMap> {
    if let Some(g) = &config.gated_delta {
        let (nk, dk, nv, dv) = (g.key_heads, g.d_key, g.value_heads, g.d_value);
        let r = nv / nk;
        for i in 0..config.n_decoder_layers {
            let stem = format!("model.layers.{i}.linear_attn");
            // Per key head group, the parts' rows in stored order.
            let qkvz = [("q", dk), ("k", dk), ("v", r * dv), ("z", r * dv)];
            let fused = format!("{stem}.in_proj_qkvz.weight");
            if let Some((cols, parts)) = split_groups(dir, &mut tensors, &fused, nk, &qkvz)? {
                if let [q, k, v, z] = &parts[..] {
                    let qkv = [&q.1[..], &k.1[..], &v.1[..]].concat();
                    let qkv_rows = q.0 + k.0 + v.0;
                    let name = format!("{stem}.in_proj_qkv.weight");
                    tensors.insert(name, (vec![qkv_rows, cols], qkv));
                    let name = format!("{stem}.in_proj_z.weight");
                    tensors.insert(name, (vec![z.0, cols], z.1.clone()));
                }
            }
            let ba = [("b", r), ("a", r)];
            let fused = format!("{stem}.in_proj_ba.weight");
            if let Some((cols, parts)) = split_groups(dir, &mut tensors, &fused, nk, &ba)? {
                for ((part, _), (rows, values)) in ba.iter().zip(parts) {
                    let name = format!("{stem}.in_proj_{part}.weight");
                    tensors.insert(name, (vec![rows, cols], values));
                }
            }
        }
    }
    qwen3_5::hybrid_tensors(dir, tensors, config)
}

/// Some rows of a matrix: how many, and their values.
type Rows = (usize, Vec<f32>);

/// The matrix `name` removed from `tensors` and cut, in each of its `groups` row groups, into
/// `parts` (their names and rows per group, in stored order): the columns, and each part's
/// rows of every group in group order. `None` when there is no such tensor; an error naming
/// the parts when its rows do not add up.
fn split_groups(
    dir: &Path,
    tensors: &mut TensorMap,
    name: &str,
    groups: usize,
    parts: &[(&str, usize)],
) -> Result<Option<(usize, Vec<Rows>)>> {
    let Some((shape, data)) = tensors.remove(name) else {
        return Ok(None);
    };
    let per_group: usize = parts.iter().map(|(_, rows)| rows).sum();
    let [rows, cols] = shape[..] else {
        return Err(ckpt_err(
            dir,
            format!("tensor {name} has shape {shape:?}, not a matrix"),
        ));
    };
    if rows != groups * per_group || cols == 0 {
        let each: Vec<String> = parts.iter().map(|(p, n)| format!("{p} {n}")).collect();
        return Err(ckpt_err(
            dir,
            format!(
                "tensor {name} has {rows} rows, not {groups} key head groups of {per_group} \
                 rows ({})",
                each.join(", ")
            ),
        ));
    }
    let mut out: Vec<Rows> = parts.iter().map(|_| (0, Vec::new())).collect();
    for group in data.chunks(per_group * cols) {
        let mut start = 0;
        for ((_, n), (count, values)) in parts.iter().zip(&mut out) {
            values.extend_from_slice(&group[start * cols..(start + n) * cols]);
            *count += n;
            start += n;
        }
    }
    Ok(Some((cols, out)))
}
