//! `serve --device gpu`: the language model's weights and the engine's pool of key/value
//! blocks live in a GPU's memory ([`DeviceLm`](crate::model::device_lm::DeviceLm), uploaded
//! once), and the same engine steps it: continuous batching over ragged steps, each a single
//! submission whose logits come back for the rows that sample. The pool is `--kv-memory` (at
//! most what one buffer of the adapter holds per layer, said at start): a request is admitted
//! once its blocks are free, so when the pool is full requests wait, and one that could never
//! fit is a 400 naming its size (the HTTP layer's check against the pool). Blocks are not
//! shared between rows here, so prefix caching is off. A step the device fails (lost, or out
//! of memory) ends the running requests with a 503, and from then on the server answers 503
//! and `/health` says why.

use super::super::scheduler::{EngineConfig, GenRequest};
use super::super::{App, LmFront, ServeConfig};
use crate::model::LanguageModel;
use crate::pipeline::device::DeviceChoice;
use crate::pipeline::generate::ModelPrecision;
use std::sync::mpsc::Receiver;
use std::sync::Arc;

/// The device a model is served on.
#[cfg(feature = "gpu")]
pub(super) type Opened = crate::backend::GpuDevice;
/// None without the `gpu` feature.
#[cfg(not(feature = "gpu"))]
pub(super) type Opened = std::convert::Infallible;

/// The GPU `config.device` names (`None`: the CPU), once what the device does not do is
/// refused by name; `engine` is adjusted to it (no prefix caching, the pool within one
/// buffer a layer).
pub(super) fn open(
    config: &ServeConfig,
    model: &LanguageModel<f32>,
    engine: &mut EngineConfig,
) -> Result<Option<Opened>, String> {
    let DeviceChoice::Gpu(index) = config.device else {
        return Ok(None);
    };
    let block = crate::model::device_lm::BLOCK_SIZE;
    if config.block_rows != block {
        return Err(format!(
            "--block-size {}: a GPU's key/value blocks hold {block} positions (leave \
             --block-size at its default)",
            config.block_rows
        ));
    }
    if !config.kv_types.is_exact() {
        return Err(format!(
            "--cache-type-k/--cache-type-v {}: a GPU keeps keys and values in f32",
            config.kv_types
        ));
    }
    if matches!(config.precision, ModelPrecision::Bf16 | ModelPrecision::Int8) {
        return Err(
            "--device gpu multiplies f32 weights or a GGUF file's blocks, not --precision \
             bf16 or int8"
                .into(),
        );
    }
    engine.prefix_cache = false;
    open_gpu(index, model, engine)
}

#[cfg(feature = "gpu")]
fn open_gpu(
    index: Option<usize>,
    model: &LanguageModel<f32>,
    engine: &mut EngineConfig,
) -> Result<Option<Opened>, String> {
    let device = crate::backend::GpuDevice::open(index).map_err(|e| e.to_string())?;
    // Each layer's keys (and values) are one buffer of `pool · block · d_kv` floats.
    let d_kv = model.blocks.layers.first().map_or(1, |l| l.self_attn.d_kv());
    let block_bytes = (engine.block_rows * d_kv * 4).max(1) as u64;
    let most = (device.gpu.max_binding_bytes() / block_bytes) as usize;
    if engine.pool_blocks > most {
        eprintln!(
            "--kv-memory: {} blocks of {} positions asked, {most} fit one buffer of {} bytes \
             a layer on {}: the pool holds {most}",
            engine.pool_blocks,
            engine.block_rows,
            device.gpu.max_binding_bytes(),
            device.gpu.label(),
        );
        engine.pool_blocks = most;
    }
    Ok(Some(device))
}

#[cfg(not(feature = "gpu"))]
fn open_gpu(
    _index: Option<usize>,
    _model: &LanguageModel<f32>,
    _engine: &mut EngineConfig,
) -> Result<Option<Opened>, String> {
    Err("this build has no GPU backend (the `gpu` feature): serve with --device cpu".into())
}

/// Uploads `model` to `device` and runs the engine over it (see the module docs).
pub(super) fn run(
    app: Arc<App>,
    device: Opened,
    model: LanguageModel<f32>,
    front: LmFront,
    requests: Receiver<GenRequest>,
) {
    #[cfg(feature = "gpu")]
    {
        let lm = match crate::model::device_lm::DeviceLm::new(device, &model) {
            Ok(lm) => lm,
            Err(e) => {
                let _ = app.load_error.set(e.to_string());
                return;
            }
        };
        // The device holds the weights now.
        drop(model);
        eprintln!(
            "on {}: {} bytes of weights and key/value blocks of {} positions",
            lm.device.gpu.label(),
            lm.device.gpu.allocated_bytes(),
            crate::model::device_lm::BLOCK_SIZE,
        );
        super::run_engine(app, &lm, front, requests);
    }
    #[cfg(not(feature = "gpu"))]
    {
        let _ = (app, model, front, requests);
        match device {}
    }
}
