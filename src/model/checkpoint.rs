//! Model directories: `config.json` and `model.safetensors` (see [`crate::store`]), saved from
//! and loaded into our models, every tensor's name and shape checked.

use crate::error::Error;
use crate::error::Result;
use crate::model::{LanguageModel, ModelConfig, Param, Seq2Seq};
use crate::rng::Rng;
use crate::store::{
    ckpt_err, read_file, read_tensors, tensors_to_bytes, write_atomic, TensorMap, CONFIG_FILE,
    MODEL_FILE,
};
use std::path::Path;

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
