//! The optimizer's part of a checkpoint: Adam's moments in `optimizer.safetensors`.

use crate::error::Result;
use crate::model::checkpoint::check_finite;
use crate::model::Param;
use crate::store::{ckpt_err, read_tensors, tensors_to_bytes, CheckpointWriter, OPTIMIZER_FILE};
use crate::train::adam::Adam;
use std::path::Path;

/// Stages Adam's moments of the named parameters as `optimizer.safetensors` in a save;
/// refuses (saving nothing) a moment that is not finite, naming it.
pub fn write_optimizer_params(
    writer: &mut CheckpointWriter,
    params: &[(String, &mut Param<f32>)],
    adam: &Adam<f32>,
) -> Result<()> {
    let path = writer.dir().join(OPTIMIZER_FILE);
    let mut tensors: Vec<(String, Vec<usize>, &[f32])> = Vec::new();
    for (i, (n, p)) in params.iter().enumerate() {
        tensors.push((format!("adam.m.{n}"), p.value.shape.clone(), &adam.m[i]));
        tensors.push((format!("adam.v.{n}"), p.value.shape.clone(), &adam.v[i]));
    }
    check_finite(&path, tensors.iter().map(|(n, _, d)| (n.as_str(), *d)))?;
    let bytes = tensors_to_bytes(&tensors, &path)?;
    writer.add(OPTIMIZER_FILE, &bytes)
}

/// Loads Adam's moments saved by [`write_optimizer_params`] into `adam` (shaped for `params`),
/// checking names and shapes.
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
            if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
                return Err(ckpt_err(
                    &path,
                    format!("tensor {key} holds {v} at index {i}: not finite"),
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
