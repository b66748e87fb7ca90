//! File formats and the names of the files in a model directory, in one place for every module
//! that reads or writes them: safetensors tensors, GGUF files ([`gguf`]; metadata values in
//! [`gguf_value`], element types in [`ggml`], llama hyper-parameters in [`gguf_llama`]), atomic
//! writes, and the layout
//!
//! | file | what | written by |
//! |---|---|---|
//! | `config.json` | the model's shape ([`crate::model::ModelConfig`]) | every model directory |
//! | `model.safetensors` | the weights, one tensor per parameter named after its module path | every model directory |
//! | `vocab.json` (+ `tokenizer.json` for BPE) | the translation vocabulary | `train`, `demo --out`, `average` |
//! | `tokenizer.json` | byte-level BPE of a language model, or a Hugging Face tokenizer | `train-lm` |
//! | `pretrained.json` (+ `tokenizer.json` / `tokenizer.gguf`) | a pretrained decoder's own tokenizer beside weights in our format ([`crate::pipeline::lm_dir`]; `tokenizer.gguf`: a GGUF file's metadata, no tensors, [`gguf_write`]) | `prune` of a Hugging Face directory or GGUF file |
//! | `optimizer.safetensors` | Adam's moments, `adam.m.<name>` / `adam.v.<name>` | training runs |
//! | `trainer_state.json` | step, generator state, position in the data, recipe | training runs |
//! | `metrics.jsonl`, `curves.png` | one JSON line of metrics per log step, their plot | `train` |
//! | `checkpoints/step-NNNNNNNN/` | full checkpoints (model directories) | `train --save-every` |
//! | `checkpoint.json` | the manifest of the last complete save: every file's size and hash ([`atomic`]) | every save |
//! | `*.gguf` (a single file, read only) | a llama.cpp model: metadata, tokenizer, quantised weights ([`gguf`]) | llama.cpp's converters |
//!
//! A checkpoint is saved all or nothing ([`atomic`]): its files are staged in a temporary
//! directory with a manifest written last, then published at once; readers check every file
//! against the manifest, so a crash mid-save never leaves a broken or mixed checkpoint behind.
//! Single files ([`write_atomic`]) are written to a temporary name and renamed.

pub mod atomic;
pub mod ctranslate2;
pub mod package;
pub mod file_memory;
/// The ggml element types and block layouts, kept beside the kernels that multiply them
/// ([`crate::kernels::lowp::ggml`]); re-exported here for the readers of GGUF files.
pub use crate::kernels::lowp::ggml;
pub mod gguf;
pub mod gguf_llama;
pub mod gguf_value;
pub mod gguf_write;
#[cfg(feature = "hub")]
pub mod hub;
pub mod pickle;
pub mod torch_file;

pub use atomic::{read_file, CheckpointWriter, MANIFEST_FILE};

use crate::error::{Error, Result};
use rayon::prelude::*;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub const CONFIG_FILE: &str = "config.json";
pub const MODEL_FILE: &str = "model.safetensors";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const TRAINER_STATE_FILE: &str = "trainer_state.json";
/// The index of a Hugging Face checkpoint sharded into several safetensors files.
pub const HF_INDEX_FILE: &str = "model.safetensors.index.json";
/// The translation vocabulary (word, character or the BPE's token list).
pub const VOCAB_FILE: &str = "vocab.json";
/// A `tokenizers` tokenizer: byte-level BPE (ours), or a Hugging Face model's.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// sentence-transformers' settings file, whose `max_seq_length` sets the truncation.
pub const SENTENCE_CONFIG_FILE: &str = "sentence_bert_config.json";
/// The metrics log of a training run: one JSON object per line.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// The plot of [`METRICS_FILE`].
pub const CURVES_FILE: &str = "curves.png";
/// The folder of a run's step checkpoints.
pub const CHECKPOINTS_DIR: &str = "checkpoints";

pub(crate) fn ckpt_err(path: &Path, reason: impl Into<String>) -> Error {
    Error::Checkpoint {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Writes `bytes` to `path` through `path.tmp` and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let write = |p: &Path| -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::File::create(p)?;
        f.write_all(bytes)?;
        f.sync_all()
    };
    write(&tmp)
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|cause| Error::Write {
            path: path.to_path_buf(),
            cause,
        })
}

/// `bytes` without a leading UTF-8 byte order mark (editors on Windows write one; JSON
/// parsers refuse it).
pub fn strip_bom(bytes: &[u8]) -> &[u8] {
    bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes)
}

fn f32_bytes(data: &[f32]) -> Vec<u8> {
    data.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Serialises named f32 tensors to safetensors bytes.
pub fn tensors_to_bytes(tensors: &[(String, Vec<usize>, &[f32])], path: &Path) -> Result<Vec<u8>> {
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|(_, _, d)| f32_bytes(d)).collect();
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), b)| {
            TensorView::new(Dtype::F32, shape.clone(), b).map(|v| (name.clone(), v))
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| ckpt_err(path, format!("cannot serialise: {e}")))?;
    safetensors::serialize(views, None)
        .map_err(|e| ckpt_err(path, format!("cannot serialise: {e}")))
}

/// Values of a tensor decoded to float32 by one task of the thread pool.
const DECODE_RUN: usize = 1 << 16;

/// Parsed safetensors contents: name -> (shape, f32 values).
pub type TensorMap = HashMap<String, (Vec<usize>, Vec<f32>)>;

/// Reads every tensor of a safetensors file as f32 (the only dtype our checkpoints use).
pub fn read_tensors(path: &Path) -> Result<TensorMap> {
    read_tensors_skipping(path, |_| false)
}

/// Like [`read_tensors`], but leaves out (unread, whatever their dtype) the tensors whose name
/// `skip` accepts: non-parameter buffers of foreign checkpoints, such as BERT's `position_ids`.
pub fn read_tensors_skipping(path: &Path, skip: impl Fn(&str) -> bool) -> Result<TensorMap> {
    parse_tensors(&read_file(path)?, path, skip)
}

/// The tensors of safetensors `bytes` (read from `path`, named in errors), as
/// [`read_tensors_skipping`] reads them.
pub fn parse_tensors(bytes: &[u8], path: &Path, skip: impl Fn(&str) -> bool) -> Result<TensorMap> {
    parse_tensors_as(bytes, path, skip, false, |_| {})
}

/// Like [`read_tensors_skipping`], for checkpoints of other tools: F32, F16 and BF16 tensors are
/// read as f32 (other dtypes are an error naming the tensor).
///
/// The file is mapped read-only ([`file_memory`], as a GGUF file is) and each tensor decoded
/// from the map: no private copy of the file's bytes is made on the way to the float32
/// values. In a directory our saves checked with a manifest ([`atomic`]), the file is read and
/// checked against it instead.
pub fn read_float_tensors(path: &Path, skip: impl Fn(&str) -> bool) -> Result<TensorMap> {
    let checked = path
        .parent()
        .map(atomic::manifest_in_force)
        .transpose()?
        .flatten()
        .is_some();
    if checked {
        return parse_tensors_as(&read_file(path)?, path, skip, true, |_| {});
    }
    let map = gguf::hold_file(path, file_memory::FileMemory::Map)?;
    // An address (not a pointer) so that the decoding threads may share it.
    let base = map.as_ptr() as usize;
    parse_tensors_as(&map, path, skip, true, |range| {
        // SAFETY: `map` is the file mapped read-only from its first byte (a page), holding
        // `range`; a mapped file's pages given back read as the file's same bytes again if
        // touched, so the views still alive into them (the tensors and runs not yet decoded
        // hold other, disjoint ranges; pages shared with them are kept, `give_back` drops
        // whole pages inside `range` only) never see them change. Nothing reads these bytes
        // again.
        unsafe { file_memory::give_back(base as *const u8, range) };
    })
}


/// The tensors of safetensors `bytes` as f32: F32 only, or with `widen` also F16 and BF16.
/// `decoded(range)` is told the byte range of each run of [`DECODE_RUN`] values once they are
/// decoded, and of each tensor once all its values are (a mapped file's pages are given back
/// then: the load's peak is the float32 values, not the values and the whole file, nor a
/// vocabulary-sized table twice).
fn parse_tensors_as(
    bytes: &[u8],
    path: &Path,
    skip: impl Fn(&str) -> bool,
    widen: bool,
    decoded: impl Fn(std::ops::Range<usize>) + Sync,
) -> Result<TensorMap> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| {
        ckpt_err(
            path,
            format!("not a valid safetensors file (truncated or corrupt?): {e}"),
        )
    })?;
    let mut out = HashMap::new();
    for (name, view) in st.tensors() {
        if skip(&name) {
            continue;
        }
        let data = view.data();
        let start = data.as_ptr() as usize - bytes.as_ptr() as usize;
        // Decoded over the thread pool in runs of DECODE_RUN values (a 1B model is 2.5 GB of
        // bf16), each run's bytes given back once decoded.
        let decode = |width: usize, f: &(dyn Fn(&[u8]) -> f32 + Sync)| -> Vec<f32> {
            let mut out = vec![0.0f32; data.len() / width];
            out.par_chunks_mut(DECODE_RUN)
                .zip(data.par_chunks(DECODE_RUN * width))
                .for_each(|(out, run)| {
                    for (v, b) in out.iter_mut().zip(run.chunks_exact(width)) {
                        *v = f(b);
                    }
                    let at = run.as_ptr() as usize - bytes.as_ptr() as usize;
                    decoded(at..at + run.len());
                });
            out
        };
        let half = |f: fn(u16) -> f32| decode(2, &|b| f(u16::from_le_bytes([b[0], b[1]])));
        let values = match view.dtype() {
            Dtype::F32 => decode(4, &|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            Dtype::F16 if widen => half(ggml::f16_to_f32),
            Dtype::BF16 if widen => half(crate::kernels::lowp::bf16_to_f32),
            other => {
                let expected = if widen { "F32, F16 or BF16" } else { "F32" };
                return Err(ckpt_err(
                    path,
                    format!("tensor {name} has dtype {other:?}, expected {expected}"),
                ));
            }
        };
        decoded(start..start + data.len());
        out.insert(name, (view.shape().to_vec(), values));
    }
    Ok(out)
}

/// The weights of a Hugging Face model directory: `model.safetensors`, or the shards its
/// `model.safetensors.index.json` lists (`weight_map`: tensor name -> shard file), or where
/// neither is there PyTorch's `pytorch_model.bin` (or its shards), as f32.
pub fn read_hf_weights(dir: &Path, skip: impl Fn(&str) -> bool + Copy) -> Result<TensorMap> {
    let single = dir.join(MODEL_FILE);
    let index = dir.join(HF_INDEX_FILE);
    let torch = dir.join(torch_file::TORCH_FILE);
    let torch_index = dir.join(torch_file::TORCH_INDEX_FILE);
    if single.is_file() {
        return read_float_tensors(&single, skip);
    }
    if index.is_file() {
        return read_shards(&index, |path| read_float_tensors(path, skip));
    }
    // PyTorch's files where safetensors are absent (read without Python: `torch_file`).
    if torch.is_file() {
        return torch_file::read_torch_tensors(&torch, skip);
    }
    if torch_index.is_file() {
        return read_shards(&torch_index, |path| {
            torch_file::read_torch_tensors(path, skip)
        });
    }
    read_float_tensors(&single, skip)
}

/// The tensors of every shard an index file (`weight_map`: name -> shard file) names, each
/// read by `read`; a shard outside the directory or a tensor in two shards is an error.
fn read_shards(index: &Path, read: impl Fn(&Path) -> Result<TensorMap>) -> Result<TensorMap> {
    let dir = index.parent().unwrap_or(Path::new("."));
    let bad = |reason: String| ckpt_err(index, reason);
    let json: serde_json::Value = serde_json::from_slice(&read_file(index)?)
        .map_err(|e| bad(format!("invalid JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no weight_map object".into()))?;
    let mut shards: Vec<&str> = Vec::new();
    for (name, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| bad(format!("weight_map entry {name} is not a file name")))?;
        let plain = Path::new(file).file_name().is_some_and(|f| f == file);
        if !plain {
            return Err(bad(format!(
                "shard {file:?} is not a file name in the directory"
            )));
        }
        if !shards.contains(&file) {
            shards.push(file);
        }
    }
    shards.sort();
    let mut out = TensorMap::new();
    for shard in shards {
        let path = dir.join(shard);
        for (name, t) in read(&path)? {
            if out.insert(name.clone(), t).is_some() {
                return Err(ckpt_err(
                    &path,
                    format!("tensor {name} appears in two shards"),
                ));
            }
        }
    }
    Ok(out)
}

/// The complete checkpoint directories `step-*` under `dir`, oldest first: a save that was
/// interrupted is never listed (see [`atomic::is_complete`]).
pub fn list_step_checkpoints(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let step = name.strip_prefix("step-")?.parse::<u64>().ok()?;
            atomic::is_complete(&e.path()).then(|| (step, e.path()))
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, p)| p).collect()
}

/// The directory name of the checkpoint at `step`.
pub fn step_checkpoint_name(step: u64) -> String {
    format!("step-{step:08}")
}

/// What in `dir` shows that it already holds a run or a model (a checkpoint file, the
/// metrics log, step checkpoints), or `None` when there is nothing of the kind (a missing or
/// empty directory, or one with other files only).
// Used by the binary (feature `cli`) and outside the library (feature `internals`).
#[cfg_attr(not(any(feature = "cli", feature = "internals")), allow(dead_code))]
pub fn existing_run(dir: &Path) -> Option<String> {
    if !dir.is_dir() {
        return None;
    }
    atomic::CHECKPOINT_FILES
        .iter()
        .chain(&[
            MANIFEST_FILE,
            METRICS_FILE,
            CHECKPOINTS_DIR,
            atomic::STAGING_DIR,
            atomic::COMMIT_DIR,
        ])
        .find(|name| dir.join(name).exists())
        .map(|name| name.to_string())
}

/// Deletes what [`existing_run`] looks for (and the curves), leaving other files alone: the
/// start of a run that replaces an older one (`--overwrite`).
// Used by the binary (feature `cli`) and outside the library (feature `internals`).
#[cfg_attr(not(any(feature = "cli", feature = "internals")), allow(dead_code))]
pub fn clear_run(dir: &Path) -> Result<()> {
    let remove = |path: PathBuf| -> Result<()> {
        let result = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match result {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::Write { path, cause: e })
            }
            _ => Ok(()),
        }
    };
    // The manifest first (the directory then holds no checkpoint), the step checkpoints
    // renamed aside before they are deleted.
    remove(dir.join(MANIFEST_FILE))?;
    if dir.join(CHECKPOINTS_DIR).is_dir() {
        atomic::remove_checkpoint(&dir.join(CHECKPOINTS_DIR))?;
    }
    for name in atomic::CHECKPOINT_FILES.iter().chain(&[
        METRICS_FILE,
        CURVES_FILE,
        atomic::STAGING_DIR,
        atomic::COMMIT_DIR,
    ]) {
        remove(dir.join(name))?;
    }
    Ok(())
}

/// Whether `inner` is `outer` or lies inside it (both resolved through the file system when
/// they exist).
// Used by the binary (feature `cli`) and outside the library (feature `internals`).
#[cfg_attr(not(any(feature = "cli", feature = "internals")), allow(dead_code))]
pub fn same_or_inside(inner: &Path, outer: &Path) -> bool {
    let resolve = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    resolve(inner).starts_with(resolve(outer))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tensors of several pages each, in F32, F16 and BF16, read from the mapped file whose
    /// pages are given back tensor by tensor as they are decoded: every value as written, in
    /// whichever order the file lists them.
    #[test]
    fn mapped_tensors_read_whole_while_their_pages_are_given_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let n = 3 * 4096 + 7;
        let values = |k: usize| -> Vec<f32> { (0..n).map(|i| ((i * 31 + k) % 97) as f32 - 48.0).collect() };
        let (a, b, c) = (values(1), values(2), values(3));
        let half: Vec<u8> = c.iter().flat_map(|&v| ggml::f32_to_f16(v).to_le_bytes()).collect();
        let brain: Vec<u8> = b.iter().flat_map(|&v| ((v.to_bits() >> 16) as u16).to_le_bytes()).collect();
        let a_bytes = f32_bytes(&a);
        let views = vec![
            ("a", TensorView::new(Dtype::F32, vec![n], &a_bytes).unwrap()),
            ("b", TensorView::new(Dtype::BF16, vec![n], &brain).unwrap()),
            ("c", TensorView::new(Dtype::F16, vec![n], &half).unwrap()),
        ];
        std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
        let read = read_float_tensors(&path, |_| false).unwrap();
        assert_eq!(read["a"], (vec![n], a));
        // Small integers: exact in bf16 and f16.
        assert_eq!(read["b"], (vec![n], b));
        assert_eq!(read["c"], (vec![n], c));
        // The file is untouched by the giving back: read again, the same.
        assert_eq!(read_float_tensors(&path, |_| false).unwrap(), read);
    }
}
