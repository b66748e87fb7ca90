//! Loading a GGUF file (llama.cpp) of any family of the table that has a GGUF reader: the
//! family is found by `general.architecture`, its config read from the metadata, each tensor
//! decoded straight into the parameter its name maps to, or kept in its stored blocks.

use super::by_gguf_architecture;
use super::rope_params::GGUF_ROPE_FREQS;
use crate::error::Result;
use crate::backend::{Backend, PackedWeight, CPU};
use crate::model::checkpoint::{build_filled, RenameTable, TensorValues};
use crate::model::config::RopeScaling;
use crate::model::linear::for_each_linear;
use crate::model::{LanguageModel, ShapesOnly};
use crate::store::ckpt_err;
use crate::store::gguf::{GgufFile, TensorInfo};
use std::collections::{HashMap, HashSet};

/// How a GGUF model's linear layers multiply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgufWeights {
    /// Every tensor dequantised to float32.
    Dequantised,
    /// Every linear layer and the output projection whose tensor is stored in ggml blocks
    /// (`Q4_0` / `Q4_1` / `Q8_0`, `Q5_0` / `Q5_1` / `IQ4_NL`, the K-quants `Q2_K` … `Q6_K`)
    /// multiplies the file's own blocks, as llama.cpp does (see
    /// [`Backend::pack_blocks`](crate::backend::Backend::pack_blocks)), and holds no float32
    /// copy of them; a token
    /// embedding in blocks is looked up in them (a row dequantised per token, as llama.cpp's
    /// `get_rows`), and a tied output projection multiplies them. Tensors stored as floats
    /// and the norms are float32.
    Blocks,
}

/// Our names of the parameters a GGUF file's blocks may stand in for.
const EMBEDDING: &str = "embedding.weight";
const OUTPUT: &str = "output_proj.weight";

/// Loads a GGUF file of a family of the table: its hyper-parameters and weights, dequantised or
/// kept in blocks (`weights`). An architecture no family reads is an error naming it.
///
/// With [`GgufWeights::Blocks`], the `Q5_0` / `Q5_1` tensors the model copies (regrouped) are
/// given back to the system ([`GgufFile::release`]): `file` refuses them afterwards, so a
/// second load from the same `file` is an error naming such a tensor (open the file again).
pub fn load_gguf(file: &GgufFile, weights: GgufWeights) -> Result<LanguageModel<f32>> {
    let path = file.path();
    let arch = file.architecture()?;
    let (_, reader) = by_gguf_architecture(arch).ok_or_else(|| {
        // llama.cpp's hybrid linear-attention architectures: named, not just unknown.
        let hybrid = match arch {
            "qwen35" | "qwen35moe" | "qwen3next" => {
                "; its Gated DeltaNet (linear-attention) layers load from Hugging Face \
                 directories only (model_type qwen3_5_text), not from GGUF files yet"
            }
            _ => "",
        };
        ckpt_err(
            path,
            format!(
                "general.architecture {arch:?} is not supported (GGUF files of {} load){hybrid}",
                super::gguf_list()
            ),
        )
    })?;
    let c = (reader.config)(file)?;
    let names = &reader.names;
    // Fused tensors split into their parts; llama.cpp's rotary factors are the config's.
    let read_into_config = matches!(c.rope_scaling, Some(RopeScaling::FreqFactors { .. }));
    let infos: Vec<TensorInfo> = super::split_fused_gguf(file, reader.fused, &c)?
        .into_iter()
        .filter(|info| !(read_into_config && info.name == GGUF_ROPE_FREQS))
        .collect();
    // The weights of the linear layers, by our names: those multiplied in their blocks.
    let mut linear_weights = HashSet::new();
    let mut shapes = LanguageModel::<f32>::new(c.clone(), &mut ShapesOnly);
    for_each_linear(&mut shapes.blocks, |ours, _| {
        linear_weights.insert(format!("{ours}.weight"));
    });
    drop(shapes);
    // Whether a tensor is multiplied or looked up as stored: a block-format weight of a linear
    // layer, of an untied output projection or of the token embedding.
    let stays_packed = |info: &TensorInfo| {
        let ours = names.import(&info.name);
        let kept = ours
            .as_deref()
            .is_some_and(|n| n == OUTPUT || n == EMBEDDING || linear_weights.contains(n));
        weights == GgufWeights::Blocks && kept && CPU.multiplies_blocks(info.ggml_type)
    };
    // Each tensor is decoded straight into its parameter: no map of every tensor in float32.
    let tensors: HashMap<String, (Vec<usize>, GgufTensor)> = infos
        .iter()
        .map(|info| {
            let t = GgufTensor {
                file,
                info,
                packed: stays_packed(info),
            };
            (info.name.clone(), (info.shape(), t))
        })
        .collect();
    let mut model = build_filled(path, c, tensors, Some(names))?;
    if weights == GgufWeights::Blocks {
        use_gguf_blocks(&mut model, file, &infos, names)?;
    }
    Ok(model)
}

/// Makes every linear layer of `model` (loaded by [`load_gguf`] from `file`, whose tensors
/// are `infos` once fused ones are split, its block tensors left without float32 values) and
/// its output projection multiply the file's own blocks. Returns how many matrices use blocks.
fn use_gguf_blocks(
    model: &mut LanguageModel<f32>,
    file: &GgufFile,
    infos: &[TensorInfo],
    names: &RenameTable,
) -> Result<usize> {
    let path = file.path();
    let tensor = |name: &str| {
        infos
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| ckpt_err(path, format!("no tensor named {name}")))
    };
    let theirs = |ours: &str| {
        names
            .export(ours)
            .ok_or_else(|| ckpt_err(path, format!("no GGUF name for {ours}")))
    };
    // A tensor's blocks packed; with `only_user`, the file's memory of them given back when
    // the packed weight holds its own copy (Q5_0 / Q5_1, regrouped).
    let blocks = |name: &str, only_user: bool| -> Result<Option<PackedWeight>> {
        let info = tensor(name)?;
        if !CPU.multiplies_blocks(info.ggml_type) {
            return Ok(None);
        }
        let (rows, cols) = info.rows_cols();
        let data = file.tensor_bytes(info)?;
        let packed = CPU.pack_blocks(info.ggml_type, data, rows, cols)
            .map_err(|e| ckpt_err(path, format!("tensor {name}: {e}")))?;
        if only_user && CPU.copies_blocks(info.ggml_type) {
            // SAFETY: `data`, the only bytes read from this tensor, went into pack_ggml,
            // which copied them and let them go; nothing else uses the tensor (`only_user`).
            unsafe { file.release(info) };
        }
        Ok(packed)
    };
    let mut used = 0;
    let mut result: Result<()> = Ok(());
    for_each_linear(&mut model.blocks, |ours, linear| {
        if result.is_err() {
            return;
        }
        result = (|| {
            let name = theirs(&format!("{ours}.weight"))?;
            if let Some(packed) = blocks(&name, true)? {
                linear
                    .set_packed(packed)
                    .map_err(|e| ckpt_err(path, format!("tensor {name}: {e}")))?;
                used += 1;
            }
            Ok(())
        })();
    });
    result?;
    // The token embedding left in blocks is looked up in them, row by row.
    let embedding_name = theirs(EMBEDDING)?;
    if model.embedding.weight.value.data.is_empty() {
        let info = tensor(&embedding_name)?;
        let data = file.tensor_bytes(info)?;
        model
            .embedding
            .set_stored_rows(info.ggml_type, data)
            .map_err(|e| ckpt_err(path, format!("tensor {embedding_name}: {e}")))?;
    }
    // Tied: the projection multiplies the token embedding's blocks too.
    let head_name = match model.head.output_proj {
        Some(_) => theirs(OUTPUT)?,
        None => embedding_name.clone(),
    };
    // A tied projection whose embedding looks rows up in the same blocks keeps them.
    let only_user = head_name != embedding_name || !model.embedding.has_stored_rows();
    if let Some(packed) = blocks(&head_name, only_user)? {
        let only_copy = match &model.head.output_proj {
            Some(p) => p.value.data.is_empty(),
            None => model.embedding.has_stored_rows(),
        };
        let head = &mut model.head;
        match only_copy {
            true => head.set_packed_only(packed),
            false => head.set_packed(packed),
        }
        .map_err(|e| ckpt_err(path, format!("tensor {head_name}: {e}")))?;
        used += 1;
    }
    Ok(used)
}

/// A tensor of a GGUF file, dequantised when its parameter is filled, or kept in its blocks
/// (`packed`).
struct GgufTensor<'a> {
    file: &'a GgufFile,
    info: &'a TensorInfo,
    packed: bool,
}

impl TensorValues for GgufTensor<'_> {
    fn n_values(&self) -> usize {
        self.info.n_elements
    }
    fn write_into(self, out: &mut [f32]) -> Result<()> {
        self.file.dequantize_into(self.info, out)
    }
    fn stays_packed(&self) -> bool {
        self.packed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF file (version 3, no tensors) whose only metadata is `general.architecture`.
    fn file_of_architecture(arch: &str) -> GgufFile {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes()); // tensors
        b.extend(1u64.to_le_bytes()); // metadata keys
        let key = "general.architecture";
        b.extend((key.len() as u64).to_le_bytes());
        b.extend(key.as_bytes());
        b.extend(8u32.to_le_bytes()); // a string
        b.extend((arch.len() as u64).to_le_bytes());
        b.extend(arch.as_bytes());
        GgufFile::from_bytes(b, std::path::Path::new("test.gguf")).unwrap()
    }

    #[test]
    fn an_architecture_without_a_row_is_refused_by_name() {
        let file = file_of_architecture("falcon");
        let Err(err) = load_gguf(&file, GgufWeights::Dequantised) else {
            panic!("a falcon file loaded");
        };
        let err = err.to_string();
        assert!(
            err.contains("\"falcon\"") && err.contains("not supported"),
            "{err}"
        );
        assert!(err.contains("llama"), "{err}");
        // A llama file goes on to its config, which names the missing key.
        let Err(err) = load_gguf(&file_of_architecture("llama"), GgufWeights::Blocks) else {
            panic!("an empty llama file loaded");
        };
        assert!(err.to_string().contains("llama."), "{err}");
    }
}
