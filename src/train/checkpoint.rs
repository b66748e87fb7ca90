//! Checkpoints: a directory holding `config.json` (the model's shape), `model.safetensors` (the
//! weights, one tensor per parameter named after its module path) and, for training runs,
//! `optimizer.safetensors` (Adam's moments, `adam.m.<name>` / `adam.v.<name>`) and
//! `trainer_state.json` (step, RNG state, position in the data). Every file is written to a
//! temporary name and renamed, so a crash mid-write never leaves a broken file behind.

use crate::error::{Error, Result};
use crate::model::{LanguageModel, ModelConfig, Param, Seq2Seq};
use crate::rng::Rng;
use crate::train::adam::Adam;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub const CONFIG_FILE: &str = "config.json";
pub const MODEL_FILE: &str = "model.safetensors";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const TRAINER_STATE_FILE: &str = "trainer_state.json";

fn ckpt_err(path: &Path, reason: impl Into<String>) -> Error {
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

/// Reads a whole file, naming it in the error.
pub fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ckpt_err(path, "file not found"),
        _ => ckpt_err(path, format!("cannot read: {e}")),
    })
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

/// Parsed safetensors contents: name -> (shape, f32 values).
pub type TensorMap = HashMap<String, (Vec<usize>, Vec<f32>)>;

/// Reads every tensor of a safetensors file as f32 (the only dtype our checkpoints use).
pub fn read_tensors(path: &Path) -> Result<TensorMap> {
    read_tensors_skipping(path, |_| false)
}

/// Like [`read_tensors`], but leaves out (unread, whatever their dtype) the tensors whose name
/// `skip` accepts: non-parameter buffers of foreign checkpoints, such as BERT's `position_ids`.
pub fn read_tensors_skipping(path: &Path, skip: impl Fn(&str) -> bool) -> Result<TensorMap> {
    let bytes = read_file(path)?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| {
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
        if view.dtype() != Dtype::F32 {
            return Err(ckpt_err(
                path,
                format!("tensor {name} has dtype {:?}, expected F32", view.dtype()),
            ));
        }
        let values = view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        out.insert(name, (view.shape().to_vec(), values));
    }
    Ok(out)
}

/// Copies tensors from `map` into the parameters' values, checking names and shapes.
fn fill_params(
    path: &Path,
    params: &mut [(String, &mut Param<f32>)],
    map: &mut TensorMap,
) -> Result<()> {
    for (key, p) in params.iter_mut() {
        let (shape, values) = map
            .remove(key.as_str())
            .ok_or_else(|| ckpt_err(path, format!("missing tensor {key}")))?;
        if shape != p.value.shape {
            return Err(ckpt_err(
                path,
                format!(
                    "tensor {key} has shape {shape:?} but the config needs {:?} (config.json does not match the weights)",
                    p.value.shape
                ),
            ));
        }
        p.value.data.copy_from_slice(&values);
    }
    Ok(())
}

/// Saves `config.json` and `model.safetensors` into `dir` (created if needed).
pub fn save_model(dir: &Path, model: &mut Seq2Seq<f32>) -> Result<()> {
    let config = model.config.clone();
    save_params(dir, &config, &model.params_mut())
}

/// Saves `config` as `config.json` and the named parameters as `model.safetensors` into `dir`
/// (created if needed).
pub fn save_params(
    dir: &Path,
    config: &ModelConfig,
    params: &[(String, &mut Param<f32>)],
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|cause| Error::Write {
        path: dir.to_path_buf(),
        cause,
    })?;
    let config = serde_json::to_string_pretty(config).expect("config serialises");
    write_atomic(&dir.join(CONFIG_FILE), config.as_bytes())?;
    let path = dir.join(MODEL_FILE);
    let tensors: Vec<(String, Vec<usize>, &[f32])> = params
        .iter()
        .map(|(n, p)| (n.clone(), p.value.shape.clone(), &p.value.data[..]))
        .collect();
    let bytes = tensors_to_bytes(&tensors, &path)?;
    write_atomic(&path, &bytes)
}

/// Saves a decoder-only language model (`config.json`, `model.safetensors`) into `dir`.
pub fn save_language_model(dir: &Path, model: &mut LanguageModel<f32>) -> Result<()> {
    let config = model.config.clone();
    save_params(dir, &config, &model.params_mut())
}

/// Loads a language model saved by [`save_language_model`]: the config must describe a
/// decoder-only model (`n_encoder_layers` 0), and the weights must match it in count (checked
/// before allocating), names and shapes.
pub fn load_language_model(dir: &Path) -> Result<LanguageModel<f32>> {
    let config = load_config(dir)?;
    if config.n_encoder_layers != 0 {
        return Err(ckpt_err(
            &dir.join(CONFIG_FILE),
            format!(
                "n_encoder_layers is {}: an encoder-decoder model, not a language model",
                config.n_encoder_layers
            ),
        ));
    }
    let path = dir.join(MODEL_FILE);
    let mut map = read_tensors(&path)?;
    let expected = crate::model::lm::lm_n_params(&config);
    let in_file: usize = map.values().map(|(_, v)| v.len()).sum();
    if expected != Some(in_file) {
        return Err(ckpt_err(
            &path,
            format!(
                "holds {in_file} weights but config.json implies {} (config.json does not match the weights)",
                expected.map_or("too many".to_string(), |n| n.to_string())
            ),
        ));
    }
    let mut model = LanguageModel::new(config, &mut Rng::new(0));
    fill_params(&path, &mut model.params_mut(), &mut map)?;
    if let Some(extra) = map.keys().min() {
        return Err(ckpt_err(
            &path,
            format!("unexpected tensor {extra} (config.json does not match the weights)"),
        ));
    }
    Ok(model)
}

/// Reads and validates `config.json` from `dir`.
pub fn load_config(dir: &Path) -> Result<ModelConfig> {
    let path = dir.join(CONFIG_FILE);
    let bytes = read_file(&path)?;
    let config: ModelConfig = serde_json::from_slice(&bytes)
        .map_err(|e| ckpt_err(&path, format!("invalid model config: {e}")))?;
    config.validate().map_err(|e| ckpt_err(&path, e))?;
    Ok(config)
}

/// Loads a model saved by [`save_model`], checking every tensor's name and shape.
pub fn load_model(dir: &Path) -> Result<Seq2Seq<f32>> {
    let config = load_config(dir)?;
    let path = dir.join(MODEL_FILE);
    let mut map = read_tensors(&path)?;
    // Compare sizes before allocating: a config edited to huge sizes is an error, not an OOM.
    let in_file: usize = map.values().map(|(_, v)| v.len()).sum();
    if config.n_params() != Some(in_file) {
        return Err(ckpt_err(
            &path,
            format!(
                "holds {in_file} weights but config.json implies {} (config.json does not match the weights)",
                config.n_params().map_or("too many".to_string(), |n| n.to_string())
            ),
        ));
    }
    let mut model = Seq2Seq::new(config, &mut Rng::new(0));
    fill_params(&path, &mut model.params_mut(), &mut map)?;
    if let Some(extra) = map.keys().min() {
        return Err(ckpt_err(
            &path,
            format!("unexpected tensor {extra} (config.json does not match the weights)"),
        ));
    }
    Ok(model)
}

/// Saves Adam's moments to `optimizer.safetensors`.
pub fn save_optimizer(dir: &Path, model: &mut Seq2Seq<f32>, adam: &Adam<f32>) -> Result<()> {
    save_optimizer_params(dir, &model.params_mut(), adam)
}

/// Saves Adam's moments of the named parameters to `optimizer.safetensors`.
pub fn save_optimizer_params(
    dir: &Path,
    params: &[(String, &mut Param<f32>)],
    adam: &Adam<f32>,
) -> Result<()> {
    let path = dir.join(OPTIMIZER_FILE);
    let mut tensors: Vec<(String, Vec<usize>, &[f32])> = Vec::new();
    for (i, (n, p)) in params.iter().enumerate() {
        tensors.push((format!("adam.m.{n}"), p.value.shape.clone(), &adam.m[i]));
        tensors.push((format!("adam.v.{n}"), p.value.shape.clone(), &adam.v[i]));
    }
    let bytes = tensors_to_bytes(&tensors, &path)?;
    write_atomic(&path, &bytes)
}

/// Loads Adam's moments saved by [`save_optimizer`] into `adam` (shaped for `model`).
pub fn load_optimizer(dir: &Path, model: &mut Seq2Seq<f32>, adam: &mut Adam<f32>) -> Result<()> {
    load_optimizer_params(dir, &model.params_mut(), adam)
}

/// Loads Adam's moments of the named parameters into `adam`, checking names and shapes.
pub fn load_optimizer_params(
    dir: &Path,
    params: &[(String, &mut Param<f32>)],
    adam: &mut Adam<f32>,
) -> Result<()> {
    let path = dir.join(OPTIMIZER_FILE);
    let mut map = read_tensors(&path)?;
    for (i, (name, p)) in params.iter().enumerate() {
        for (which, dst) in [("m", &mut adam.m[i]), ("v", &mut adam.v[i])] {
            let key = format!("adam.{which}.{name}");
            let (shape, values) = map
                .remove(&key)
                .ok_or_else(|| ckpt_err(&path, format!("missing tensor {key}")))?;
            if shape != p.value.shape {
                return Err(ckpt_err(
                    &path,
                    format!(
                        "tensor {key} has shape {shape:?}, expected {:?}",
                        p.value.shape
                    ),
                ));
            }
            *dst = values;
        }
    }
    if let Some(extra) = map.keys().min() {
        return Err(ckpt_err(&path, format!("unexpected tensor {extra}")));
    }
    Ok(())
}
