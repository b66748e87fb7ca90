//! Choosing the device a command runs on (`--device cpu|gpu[:N]`, or `TRANSFORMER_DEVICE`),
//! and continuing a prompt on a `DeviceLm` (`crate::model::device_lm`): token ids in, sampled
//! ids out, the model's weights and KV blocks in the device's memory.

use crate::backend::{Device, DeviceError};
use crate::decode::sample::{is_greedy, sample, SamplingOptions};
use crate::decode::score::score_windows_with;
use crate::error::{Error, Result};
use crate::model::device_lm::{DeviceLm, StepOut, Want};
use crate::pipeline::generate::TextScore;
use crate::rng::Rng;
use crate::text::decoder_tokenizer::DecoderTokenizer;

/// Where a command runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// This crate's CPU kernels (the default).
    #[default]
    Cpu,
    /// A GPU adapter: `gpu` the first (a discrete one when there is one), `gpu:N` the N-th of
    /// `transformer devices`.
    Gpu(Option<usize>),
}

/// The environment variable read when `--device` is not given.
pub const DEVICE_ENV: &str = "TRANSFORMER_DEVICE";

impl DeviceChoice {
    /// `cpu`, `gpu` or `gpu:N`.
    pub fn parse(name: &str) -> Result<DeviceChoice> {
        let bad = || {
            Error::Input(format!(
                "unknown device {name:?}: cpu, gpu or gpu:N (`transformer devices` lists the GPUs)"
            ))
        };
        match name.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(DeviceChoice::Cpu),
            "gpu" => Ok(DeviceChoice::Gpu(None)),
            other => {
                let n = other.strip_prefix("gpu:").ok_or_else(bad)?;
                Ok(DeviceChoice::Gpu(Some(n.parse().map_err(|_| bad())?)))
            }
        }
    }

    /// `--device` when given, else [`DEVICE_ENV`] when set (and not empty), else the CPU.
    pub fn from_arg_or_env(arg: Option<&str>) -> Result<DeviceChoice> {
        match arg {
            Some(a) => Self::parse(a),
            None => match std::env::var(DEVICE_ENV) {
                Ok(v) if !v.trim().is_empty() => {
                    Self::parse(&v).map_err(|e| Error::Input(format!("{DEVICE_ENV}: {e}")))
                }
                _ => Ok(DeviceChoice::Cpu),
            },
        }
    }
}

#[cfg(feature = "gpu")]
impl DeviceChoice {
    /// The GPU asked for, opened (`None` for the CPU).
    pub fn open_gpu(self) -> Result<Option<crate::backend::GpuDevice>> {
        match self {
            DeviceChoice::Cpu => Ok(None),
            DeviceChoice::Gpu(index) => Ok(Some(crate::backend::GpuDevice::open(index)?)),
        }
    }
}

/// Continues `prompt` by up to `max_tokens` ids on `lm`, stopping after any of `until`
/// (included), calling `emit` with each new id. Greedy decoding takes the arg-max on the device
/// (4 bytes read back a token); sampling reads the last position's logits.
#[allow(clippy::too_many_arguments)]
pub fn generate_on_device<D: Device, E: From<Error>>(
    lm: &DeviceLm<D>,
    prompt: &[u32],
    max_tokens: usize,
    opts: SamplingOptions,
    rng: &mut Rng,
    until: &[u32],
    mut emit: impl FnMut(u32) -> std::result::Result<(), E>,
) -> std::result::Result<Vec<u32>, E> {
    let mut out = Vec::new();
    if max_tokens == 0 {
        return Ok(out);
    }
    if prompt.is_empty() {
        return Err(Error::Input("an empty prompt: nothing to continue".into()).into());
    }
    let capacity = prompt.len().saturating_add(max_tokens);
    if prompt.len() >= lm.max_len() {
        return Err(Error::Input(format!(
            "a prompt of {} tokens leaves no room in the model's context of {}",
            prompt.len(),
            lm.max_len()
        ))
        .into());
    }
    let device_err = |e: DeviceError| E::from(Error::from(e));
    let mut state = lm.start(1, capacity).map_err(device_err)?;
    let want = match is_greedy(opts) {
        true => Want::Argmax,
        false => Want::Logits,
    };
    let mut feed = prompt.to_vec();
    loop {
        let rows = vec![0; feed.len()];
        let last = [feed.len() - 1];
        let id = match lm
            .step(&mut state, &feed, &rows, &last, want)
            .map_err(device_err)?
        {
            StepOut::Ids(ids) => ids[0],
            StepOut::Logits(logits) => sample(&logits, opts, rng),
        };
        emit(id)?;
        out.push(id);
        if out.len() == max_tokens || until.contains(&id) || state.row_len(0) >= lm.max_len() {
            return Ok(out);
        }
        feed = vec![id];
    }
}

/// Scores `text` as one document on `lm`, as `score_document` does on the CPU: windows of
/// `window` tokens (at most the model's context) every `stride` tokens, `batch` windows a step,
/// each window a row of one state; the log-softmax is taken on the device.
pub fn score_document_on_device<D: Device>(
    lm: &DeviceLm<D>,
    tokenizer: &DecoderTokenizer,
    text: &str,
    (window, stride, batch): (usize, usize, usize),
) -> Result<TextScore> {
    if window == 0 {
        return Err(Error::Input("the scoring window must hold a token".into()));
    }
    let tokens = tokenizer.document(text)?;
    let shape = (window.min(lm.max_len()), stride, batch);
    let s = score_windows_with(
        tokens.as_slice(),
        shape,
        lm.vocab_size(),
        |rows, len, inputs, _| {
            let mut state = lm.start(rows, len)?;
            let row_of: Vec<usize> = (0..rows * len).map(|i| i / len).collect();
            let all: Vec<usize> = (0..rows * len).collect();
            match lm.step(&mut state, inputs, &row_of, &all, Want::LogProbs)? {
                StepOut::Logits(l) => Ok::<_, DeviceError>(l),
                StepOut::Ids(_) => unreachable!("log-probabilities asked"),
            }
        },
    )?;
    Ok(TextScore::of(&s, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_parse_and_bad_ones_are_named() {
        assert_eq!(DeviceChoice::parse("cpu").unwrap(), DeviceChoice::Cpu);
        assert_eq!(DeviceChoice::parse("GPU").unwrap(), DeviceChoice::Gpu(None));
        assert_eq!(
            DeviceChoice::parse("gpu:2").unwrap(),
            DeviceChoice::Gpu(Some(2))
        );
        for bad in ["gpu:", "gpu:x", "cuda", "gpu:-1", ""] {
            let e = DeviceChoice::parse(bad).unwrap_err().to_string();
            assert!(e.contains("cpu, gpu or gpu:N"), "{bad}: {e}");
        }
    }
}
