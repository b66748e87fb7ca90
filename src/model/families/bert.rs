//! BERT (Devlin et al., 2019) as Hugging Face stores it: the encoder of [`crate::model::bert`]
//! under `model_type` `bert`. A `bert.` prefix (checkpoints of task models) is stripped; old
//! `gamma`/`beta` layer-norm names are read as `weight`/`bias`. Tensors that are not encoder
//! parameters are skipped by name, never silently: the `position_ids` / `token_type_ids`
//! buffers and the `pooler.` / `cls.` heads.

use super::{Family, FamilyKind};
use crate::model::checkpoint::RenameTable;

/// The row of [`super::FAMILIES`]: an encoder, loaded by [`crate::model::bert::Bert::load`].
pub const FAMILY: Family = Family {
    name: "bert",
    kind: FamilyKind::Encoder,
    model_types: &["bert"],
    hf_names: HF_NAMES,
    hf_decoder: None,
    gguf: None,
    chat_template: None,
};

/// Hugging Face BERT tensor names (after the `bert.` prefix is stripped and `gamma`/`beta` read as `weight`/`bias`) -> our module paths.
pub const HF_NAMES: RenameTable = RenameTable(&[&[
    ("embeddings.word_embeddings.", "word_embeddings."),
    ("embeddings.position_embeddings.", "position_embeddings."),
    (
        "embeddings.token_type_embeddings.",
        "token_type_embeddings.",
    ),
    ("embeddings.LayerNorm.", "embeddings_norm."),
    (
        "encoder.layer.{i}.attention.self.query.",
        "layers.{i}.self_attn.q_proj.",
    ),
    (
        "encoder.layer.{i}.attention.self.key.",
        "layers.{i}.self_attn.k_proj.",
    ),
    (
        "encoder.layer.{i}.attention.self.value.",
        "layers.{i}.self_attn.v_proj.",
    ),
    (
        "encoder.layer.{i}.attention.output.dense.",
        "layers.{i}.self_attn.out_proj.",
    ),
    (
        "encoder.layer.{i}.attention.output.LayerNorm.",
        "layers.{i}.self_attn_norm.",
    ),
    (
        "encoder.layer.{i}.intermediate.dense.",
        "layers.{i}.ffn.linear1.",
    ),
    ("encoder.layer.{i}.output.dense.", "layers.{i}.ffn.linear2."),
    (
        "encoder.layer.{i}.output.LayerNorm.",
        "layers.{i}.ffn_norm.",
    ),
]]);

/// Is `name` (without a `bert.` prefix) a tensor of a BERT checkpoint that is not an encoder
/// parameter: a buffer, or the weights of a head on top of the encoder?
pub fn is_ignored(name: &str) -> bool {
    matches!(
        name,
        "embeddings.position_ids" | "embeddings.token_type_ids"
    ) || name.starts_with("pooler.")
        || name.starts_with("cls.")
}

/// The canonical name of a checkpoint tensor: no `bert.` prefix, `LayerNorm.weight/bias`.
pub fn canonical_name(name: &str) -> String {
    let name = name.strip_prefix("bert.").unwrap_or(name);
    if let Some(stem) = name.strip_suffix("LayerNorm.gamma") {
        format!("{stem}LayerNorm.weight")
    } else if let Some(stem) = name.strip_suffix("LayerNorm.beta") {
        format!("{stem}LayerNorm.bias")
    } else {
        name.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_canonicalised_and_buffers_ignored() {
        assert_eq!(
            canonical_name("bert.encoder.layer.0.output.LayerNorm.gamma"),
            "encoder.layer.0.output.LayerNorm.weight"
        );
        assert!(is_ignored(&canonical_name("bert.embeddings.position_ids")));
        assert!(is_ignored("pooler.dense.weight"));
        assert!(!is_ignored("embeddings.word_embeddings.weight"));
    }
}
