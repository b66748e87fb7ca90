//! One table of the model families this crate reads from other projects' files ([`FAMILIES`]):
//! per family, the names it goes by (a Hugging Face `config.json`'s `model_type`, a GGUF
//! file's `general.architecture`), how its hyper-parameters become our [`ModelConfig`], how its
//! tensors are named (one [`RenameTable`] per storage, read by the loaders and by the code that
//! keeps a GGUF file's blocks alike) and its chat defaults. Loaders, `serve`, the commands and
//! the error messages that list what loads read this table; nothing else names a family.
//!
//! A new family is one file here (its config parser and name tables) and one row of
//! [`FAMILIES`], as long as our layers compute it (see the options of [`ModelConfig`]).

pub mod bart;
pub mod bert;
pub mod ctranslate2;
pub mod ctranslate2_int8;
mod ctranslate2_vocab;
pub mod experts;
pub mod gemma;
pub mod gguf;
#[cfg(test)]
mod gguf_tests;
pub mod gpt2;
pub mod gpt_oss;
pub mod llama;
pub mod m2m100;
pub mod mbart;
// Encoder-decoders.
pub mod marian;
// Llama-style families: Mistral, Qwen2/2.5, Qwen3, Phi-3, SmolLM3, Granite 3, OLMo 2/3 (and
// their shared rotary reader).
pub mod generation_config;
pub mod granite;
mod hf_seq2seq;
pub mod mistral;
pub mod mixtral;
pub mod multimodal;
pub mod olmo2;
pub mod olmoe;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3_5;
pub mod qwen3_5_moe;
pub mod qwen3_moe;
pub mod qwen3_next;
pub mod rope_params;
pub mod smollm3;
pub mod t5;

pub use gguf::{load_gguf, GgufWeights};

use super::checkpoint::{build_filled, RenameTable};
use super::{LanguageModel, ModelConfig};
use crate::error::Result;
use crate::store::gguf::{GgufFile, TensorInfo};
use crate::store::{ckpt_err, read_hf_weights, TensorMap};
use std::path::Path;

/// What a family's models are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FamilyKind {
    /// A decoder-only language model, loaded as a [`LanguageModel`] (generate, chat,
    /// perplexity, serve's completions).
    Decoder,
    /// A BERT-style encoder (embed, serve's embeddings).
    Encoder,
    /// An encoder-decoder translation model (translate, score, serve's translations).
    Translation,
}

/// How a Hugging Face decoder directory of a family becomes a [`LanguageModel`].
pub struct HfDecoder {
    /// `config.json` (its bytes, read from `config_path`, in the directory `dir`) -> our config;
    /// an error names what is not supported.
    pub config: fn(bytes: &[u8], config_path: &Path, dir: &Path) -> Result<ModelConfig>,
    /// The checkpoint's tensors as [`Family::hf_names`] names them: buffers and tied copies
    /// dropped, fused tensors split, layouts transposed to ours.
    pub tensors: fn(dir: &Path, tensors: TensorMap, config: &ModelConfig) -> Result<TensorMap>,
}

/// How a GGUF file of a family becomes a [`LanguageModel`] (see [`gguf`]).
pub struct GgufDecoder {
    /// Its `general.architecture`.
    pub architecture: &'static str,
    /// The metadata -> our config; an error names the key.
    pub config: fn(file: &GgufFile) -> Result<ModelConfig>,
    /// llama.cpp's tensor names -> our module paths.
    pub names: RenameTable,
    /// The file's tensors that hold several of ours (split at load, before `names`).
    pub fused: &'static [FusedTensor],
}

/// One stored tensor holding several parameters one after another along its rows (Phi-3's
/// `qkv_proj`: the query, key and value projections; `gate_up_proj`: the gate and the up
/// projection), split at load into tensors of the same storage's naming.
pub struct FusedTensor {
    /// The stored name, `{i}` standing for the layer.
    pub name: &'static str,
    /// The parts in row order: each one's name (`{i}`: the layer) and its number of rows
    /// under a config.
    pub parts: &'static [(&'static str, PartRows)],
}

/// The rows of one part of a [`FusedTensor`] under a config.
pub type PartRows = fn(&ModelConfig) -> usize;

impl FusedTensor {
    /// The parts' names and row ranges of layer `i`'s tensor of `rows` rows, or why they do
    /// not add up to it.
    fn parts_of(
        &self,
        i: usize,
        rows: usize,
        config: &ModelConfig,
    ) -> std::result::Result<Vec<(String, std::ops::Range<usize>)>, String> {
        let mut start = 0;
        let mut parts = Vec::with_capacity(self.parts.len());
        for (name, rows_of) in self.parts {
            let n = rows_of(config);
            parts.push((name.replace("{i}", &i.to_string()), start..start + n));
            start += n;
        }
        if start != rows {
            return Err(format!(
                "tensor {} has {rows} rows, not the {start} of its parts ({})",
                self.name.replace("{i}", &i.to_string()),
                self.parts
                    .iter()
                    .map(|(n, _)| n.replace("{i}", &i.to_string()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        Ok(parts)
    }
}

/// Splits every layer's fused tensor of a Hugging Face checkpoint (`tensors`, read from
/// `path`) into its parts (row ranges of a `[rows, cols]` matrix).
pub fn split_fused_hf(
    path: &Path,
    tensors: &mut TensorMap,
    fused: &[FusedTensor],
    config: &ModelConfig,
) -> Result<()> {
    for f in fused {
        for i in 0..config.n_decoder_layers {
            let Some((shape, data)) = tensors.remove(&f.name.replace("{i}", &i.to_string())) else {
                continue;
            };
            let [rows, cols] = shape[..] else {
                return Err(ckpt_err(
                    path,
                    format!("tensor {} has shape {shape:?}, not a matrix", f.name),
                ));
            };
            let parts = f.parts_of(i, rows, config).map_err(|e| ckpt_err(path, e))?;
            for (name, range) in parts {
                let values = data[range.start * cols..range.end * cols].to_vec();
                tensors.insert(name, (vec![range.len(), cols], values));
            }
        }
    }
    Ok(())
}

/// The tensor infos of a GGUF file with every fused tensor replaced by its parts, and every
/// merged expert tensor by one per expert ([`experts::split_experts`]): each part
/// is a range of the stored rows (ggml stores each row of a matrix whole, blocks included), so
/// a part reads its bytes in place, dequantised or multiplied in its blocks like any tensor.
pub fn split_fused_gguf(
    file: &GgufFile,
    fused: &[FusedTensor],
    config: &ModelConfig,
) -> Result<Vec<TensorInfo>> {
    let path = file.path();
    let mut infos = Vec::with_capacity(file.tensors().len());
    for info in file.tensors() {
        if let Some(parts) = experts::split_experts(file, info, config.experts)? {
            infos.extend(parts);
            continue;
        }
        let found = fused.iter().find_map(|f| {
            (0..config.n_decoder_layers)
                .find(|i| f.name.replace("{i}", &i.to_string()) == info.name)
                .map(|i| (f, i))
        });
        let Some((f, i)) = found else {
            infos.push(info.clone());
            continue;
        };
        let (rows, cols) = info.rows_cols();
        let n_bytes = match (info.dims.len(), info.n_bytes) {
            (2, Some(n)) if rows > 0 => n,
            _ => {
                return Err(ckpt_err(
                    path,
                    format!(
                        "tensor {} (dims {:?}, ggml type {}) cannot be split into its parts",
                        info.name, info.dims, info.ggml_type
                    ),
                ))
            }
        };
        let row_bytes = n_bytes / rows;
        for (name, range) in f.parts_of(i, rows, config).map_err(|e| ckpt_err(path, e))? {
            infos.push(TensorInfo {
                name,
                dims: vec![cols, range.len()],
                ggml_type: info.ggml_type,
                offset: info.offset + range.start * row_bytes,
                n_elements: range.len() * cols,
                n_bytes: Some(range.len() * row_bytes),
            });
        }
    }
    Ok(infos)
}

/// One row of the table.
pub struct Family {
    /// The family's name in messages.
    pub name: &'static str,
    pub kind: FamilyKind,
    /// The `model_type`s of a Hugging Face `config.json` that are this family.
    pub model_types: &'static [&'static str],
    /// Hugging Face tensor names (after the family's own canonicalisation) -> our module
    /// paths.
    pub hf_names: RenameTable,
    /// Loading a Hugging Face directory as a decoder (decoders only).
    pub hf_decoder: Option<HfDecoder>,
    /// Loading a GGUF file, for the families llama.cpp stores that we read.
    pub gguf: Option<GgufDecoder>,
    /// The chat template a model of the family uses when its files carry none (none is
    /// hard-coded today: every chat template comes from the model's files).
    pub chat_template: Option<&'static str>,
}

/// Every family this crate loads, in the order messages list them.
pub const FAMILIES: &[Family] = &[
    llama::FAMILY,
    gpt2::FAMILY,
    bert::FAMILY,
    gemma::GEMMA2,
    gemma::GEMMA3,
    // Llama-style families.
    mistral::FAMILY,
    qwen2::FAMILY,
    qwen3::FAMILY,
    phi3::FAMILY,
    smollm3::FAMILY,
    granite::FAMILY,
    olmo2::OLMO2,
    olmo2::OLMO3,
    // Mixtures of experts.
    qwen3_moe::FAMILY,
    mixtral::FAMILY,
    olmoe::FAMILY,
    gpt_oss::FAMILY,
    // Hybrid linear attention (and their mixtures of experts).
    qwen3_5::FAMILY,
    qwen3_5_moe::FAMILY,
    qwen3_next::FAMILY,
    // Encoder-decoders.
    marian::FAMILY,
    m2m100::FAMILY,
    mbart::FAMILY,
    bart::FAMILY,
    t5::FAMILY,
];

/// The family named `name` ([`Family::name`]).
pub fn by_name(name: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.name == name)
}

/// The family whose Hugging Face `config.json` says `model_type`.
pub fn by_model_type(model_type: &str) -> Option<&'static Family> {
    FAMILIES
        .iter()
        .find(|f| f.model_types.contains(&model_type))
}

/// The family and GGUF reader of a file whose `general.architecture` is `architecture`.
pub fn by_gguf_architecture(architecture: &str) -> Option<(&'static Family, &'static GgufDecoder)> {
    FAMILIES.iter().find_map(|f| {
        f.gguf
            .as_ref()
            .filter(|g| g.architecture == architecture)
            .map(|g| (f, g))
    })
}

/// The `model_type` of the Hugging Face `config.json` in `dir`, if it has one that says it.
pub fn model_type_of(dir: &Path) -> Option<String> {
    let bytes = std::fs::read(dir.join(crate::store::CONFIG_FILE)).ok()?;
    let json: serde_json::Value = serde_json::from_slice(crate::store::strip_bom(&bytes)).ok()?;
    json.get("model_type")?.as_str().map(str::to_string)
}

/// Whether `model_type` is an encoder family's (a directory `embed` loads).
pub fn is_encoder(model_type: &str) -> bool {
    by_model_type(model_type).is_some_and(|f| f.kind == FamilyKind::Encoder)
}

/// Whether a Hugging Face `model_type` is a translation model (an encoder-decoder) we load.
#[cfg(feature = "serve")]
pub fn is_translation(model_type: &str) -> bool {
    by_model_type(model_type).is_some_and(|f| f.kind == FamilyKind::Translation)
}

/// `a`, `a and b`, `a, b and c`.
fn english_list(names: &[&str]) -> String {
    match names {
        [] => "none".into(),
        [one] => (*one).into(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// The `model_type`s of the Hugging Face families of `kind` that load, as a list for messages
/// (`llama and gpt2`).
pub fn hf_list(kind: FamilyKind) -> String {
    let names: Vec<&str> = FAMILIES
        .iter()
        .filter(|f| f.kind == kind && (kind != FamilyKind::Decoder || f.hf_decoder.is_some()))
        .flat_map(|f| f.model_types.iter().copied())
        .collect();
    english_list(&names)
}

/// The GGUF architectures that load, as a list for messages.
pub fn gguf_list() -> String {
    let names: Vec<&str> = FAMILIES
        .iter()
        .filter_map(|f| f.gguf.as_ref().map(|g| g.architecture))
        .collect();
    english_list(&names)
}

/// Loads the Hugging Face decoder directory `dir` of `family` (its `config.json` already read:
/// `bytes`, from `config_path`): the config through the family's parser (first, so that what
/// the family refuses is refused by name before any weight is read: gpt-oss's MXFP4
/// `quantization_config`, whose `uint8` blocks the weight reader would otherwise name as a
/// dtype), then the weights (`model.safetensors` or the shards), the tensors through its layout
/// and names.
pub fn load_hf_decoder(
    family: &Family,
    dir: &Path,
    bytes: &[u8],
    config_path: &Path,
) -> Result<LanguageModel<f32>> {
    let hf = family.hf_decoder.as_ref().ok_or_else(|| {
        ckpt_err(
            config_path,
            format!("model_type {} is not a decoder", family.name),
        )
    })?;
    let config = (hf.config)(bytes, config_path, dir)?;
    let weights = read_hf_weights(dir, |_| false)?;
    let tensors = (hf.tensors)(dir, weights, &config)?;
    build_filled(dir, config, tensors, Some(&family.hf_names))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_finds_each_family_by_each_of_its_names() {
        assert_eq!(by_model_type("llama").unwrap().name, "llama");
        assert_eq!(by_name("gpt2").unwrap().model_types, ["gpt2"]);
        assert_eq!(by_model_type("gpt2").unwrap().kind, FamilyKind::Decoder);
        assert!(is_encoder("bert") && !is_encoder("llama") && !is_encoder("qwen2"));
        assert!(by_model_type("falcon").is_none());
        assert_eq!(by_gguf_architecture("llama").unwrap().0.name, "llama");
        assert!(by_gguf_architecture("gpt2").is_none());
        for (model_type, arch) in [
            ("mistral", None),
            ("qwen2", Some("qwen2")),
            ("qwen3", Some("qwen3")),
            ("phi3", Some("phi3")),
        ] {
            assert_eq!(by_model_type(model_type).unwrap().name, model_type);
            if let Some(arch) = arch {
                assert_eq!(by_gguf_architecture(arch).unwrap().0.name, model_type);
            }
        }
        assert_eq!(
            hf_list(FamilyKind::Decoder),
            "llama, gpt2, gemma2, gemma3_text, mistral, qwen2, qwen3, phi3, smollm3, granite, \
             olmo2, olmo3, qwen3_moe, mixtral, olmoe, gpt_oss, qwen3_5_text, qwen3_5, \
             qwen3_5_moe_text, qwen3_5_moe and qwen3_next"
        );
        assert_eq!(hf_list(FamilyKind::Encoder), "bert");
        assert_eq!(
            hf_list(FamilyKind::Translation),
            "marian, m2m_100, mbart, bart, t5, mt5 and umt5"
        );
        assert_eq!(
            by_model_type("marian").unwrap().kind,
            FamilyKind::Translation
        );
        assert_eq!(
            gguf_list(),
            "llama, gemma2, gemma3, qwen2, qwen3, phi3, smollm3, granite, olmo2, qwen3moe, olmoe \
             and gpt-oss"
        );
        assert_eq!(english_list(&["a", "b", "c"]), "a, b and c");
        // Every name of every table maps back to itself.
        for f in FAMILIES {
            let tables = [Some(f.hf_names), f.gguf.as_ref().map(|g| g.names)];
            for table in tables.into_iter().flatten() {
                for (theirs, ours) in table.rules() {
                    let numbered = |n: &str| n.replace("{i}", "3").replace("{e}", "5");
                    let (theirs, ours) = (numbered(theirs), numbered(ours));
                    assert_eq!(table.import(&theirs).as_deref(), Some(ours.as_str()));
                    assert_eq!(table.export(&ours).as_deref(), Some(theirs.as_str()));
                }
            }
        }
    }
}
