//! The argument groups several commands share, each flattened into a command's arguments
//! (`#[command(flatten)]`) where its flags appear in that command's help; and the checks of
//! the directory arguments (`--out`, `--resume`).
//!
//! The group structs carry no doc comment of their own: clap would take it for the command's
//! description.

use crate::decode::sample::SamplingOptions;
use crate::kernels::kv_blocks::KvType;
use crate::kernels::lowp::bf16_train::Bf16Kernel;
use crate::model::kv_cache::KvTypes;
use crate::pipeline::device::DeviceChoice;
use crate::pipeline::generate::ModelPrecision;
use crate::train::precision::TrainPrecision;
use anyhow::Result;
use clap::Args;
use std::path::Path;

// `--device` of `generate`, `chat`, `perplexity`, `embed`, `translate`, `serve` and
// `bench --generate`.
#[derive(Args, Debug, Clone, Default)]
pub struct DeviceArgs {
    /// Where the model runs: cpu, gpu (the first adapter, a discrete GPU when there is one) or
    /// gpu:N (`transformer devices` lists them). Default: the TRANSFORMER_DEVICE environment
    /// variable, else cpu. On a GPU a GGUF file's blocks are multiplied as stored.
    #[arg(long)]
    pub device: Option<String>,
}

impl DeviceArgs {
    /// The device asked for (see the flag).
    pub fn choice(&self) -> Result<DeviceChoice> {
        Ok(DeviceChoice::from_arg_or_env(self.device.as_deref())?)
    }

    /// The precision to load `model` in on `device`: `asked` on the CPU; on a GPU a GGUF
    /// file's blocks as stored (the GPU multiplies them) and f32 weights otherwise, refusing by
    /// name what is CPU-only (bf16 and int8 packings, speculative decoding, quantised KV
    /// caches).
    pub fn precision(
        &self,
        device: DeviceChoice,
        model: &Path,
        asked: ModelPrecision,
        speculative: bool,
        cache: &CacheTypeArgs,
    ) -> Result<ModelPrecision> {
        if device == DeviceChoice::Cpu {
            return Ok(asked);
        }
        if matches!(asked, ModelPrecision::Bf16 | ModelPrecision::Int8) {
            anyhow::bail!(
                "--device gpu multiplies f32 weights or a GGUF file's blocks, not --precision \
                 bf16 or int8"
            );
        }
        if speculative {
            anyhow::bail!("--device gpu does not run speculative decoding yet: use --device cpu");
        }
        if cache.types() != KvTypes::default() {
            anyhow::bail!(
                "--device gpu keeps keys and values in f32: --cache-type-k/-v are CPU-only"
            );
        }
        let gguf = model
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
        Ok(if gguf {
            ModelPrecision::Ggml
        } else {
            ModelPrecision::F32
        })
    }
}

// `--ctx-size` of `generate`, `chat` and `perplexity` (`serve` has its own).
#[derive(Args, Debug, Clone, Copy)]
pub struct ContextArgs {
    /// The longest sequence of the run, prompt and output, in tokens (llama.cpp's --ctx-size).
    /// Default: the model's context. Memory follows the tokens held, not this limit (the
    /// key/value cache grows as tokens are fed); a size whose key/value cache would not fit
    /// the memory available (MemAvailable) is refused with both numbers, and a size above the
    /// model's context is lowered to it.
    #[arg(long)]
    pub ctx_size: Option<usize>,
    #[command(flatten)]
    pub cache: CacheTypeArgs,
}

// `--cache-type-k` / `--cache-type-v` of `generate`, `chat`, `perplexity` and `serve`.
#[derive(Args, Debug, Clone, Copy, Default)]
pub struct CacheTypeArgs {
    /// How the key/value cache stores keys (llama.cpp's --cache-type-k / -ctk): f32 (exact,
    /// the default), f16, bf16, q8_0 (blocks of 32 int8 with an f16 scale) or q4_0 (blocks
    /// of 32 4-bit values with an f16 scale). Smaller types hold more tokens in the same
    /// memory and read faster at long contexts, at a small cost in accuracy.
    #[arg(long, value_parser = parse_kv_type)]
    pub cache_type_k: Option<KvType>,
    /// How the key/value cache stores values (llama.cpp's --cache-type-v / -ctv); the types
    /// of --cache-type-k.
    #[arg(long, value_parser = parse_kv_type)]
    pub cache_type_v: Option<KvType>,
}

/// A cache type by llama.cpp's name.
fn parse_kv_type(name: &str) -> Result<KvType, String> {
    KvType::parse(name).ok_or_else(|| {
        let names: Vec<&str> = KvType::ALL.iter().map(|t| t.name()).collect();
        format!("unknown cache type {name:?}: one of {}", names.join(", "))
    })
}

impl CacheTypeArgs {
    /// The types asked for (f32 where not given).
    pub fn types(&self) -> KvTypes {
        KvTypes {
            k: self.cache_type_k.unwrap_or_default(),
            v: self.cache_type_v.unwrap_or_default(),
        }
    }

    /// Whether either option was given.
    pub fn given(&self) -> bool {
        self.cache_type_k.is_some() || self.cache_type_v.is_some()
    }

    /// Sets the model's cache types (refused by name where a layer cannot store them) and,
    /// when asked for, reports the key/value memory of one position on stderr.
    pub fn apply<T: crate::Float>(&self, model: &mut crate::model::LanguageModel<T>) -> Result<()> {
        model.set_kv_types(self.types())?;
        if self.given() {
            eprintln!(
                "key/value cache: {}, {:.0} bytes a position over {} layers",
                self.types(),
                model.kv_bytes_per_position(),
                model.blocks.layers.len()
            );
        }
        Ok(())
    }
}

impl ContextArgs {
    /// Sets the model's cache types (`--cache-type-k/-v`), then its context to `--ctx-size`,
    /// checked against the memory available in those types (see `model::context`); without
    /// it the model keeps its own.
    pub fn apply<T: crate::Float>(&self, model: &mut crate::model::LanguageModel<T>) -> Result<()> {
        self.cache.apply(model)?;
        let Some(ctx) = self.ctx_size else {
            return Ok(());
        };
        let set = model.set_context(ctx, crate::model::context::mem_available_bytes())?;
        if set < ctx {
            eprintln!("--ctx-size {ctx} is above the model's context: using {set} tokens");
        }
        Ok(())
    }

    /// Refuses a generation whose key/value cache (the prompt plus `max_tokens`, at most the
    /// context) would not fit the memory available, naming both byte counts: the cache of a
    /// generation is taken at its first feed, so this is checked before it starts.
    pub fn check_generation<T: crate::Float>(
        model: &crate::model::LanguageModel<T>,
        prompt_len: usize,
        max_tokens: usize,
    ) -> Result<()> {
        let available = crate::model::context::mem_available_bytes();
        generation_fits(model, prompt_len.saturating_add(max_tokens), available)
    }
}

/// [`ContextArgs::check_generation`] against `available` bytes (none: unchecked).
fn generation_fits<T: crate::Float>(
    model: &crate::model::LanguageModel<T>,
    positions: usize,
    available: Option<u64>,
) -> Result<()> {
    let positions = positions.min(model.max_len());
    let needed = model.kv_cache_bytes(positions);
    if let Some(available) = available {
        if needed > u128::from(available) {
            anyhow::bail!(
                "a generation of {positions} positions (prompt and --max-tokens) needs \
                 {needed} bytes of key/value cache, more than the {available} bytes \
                 available (MemAvailable); ask for fewer --max-tokens or a smaller --ctx-size"
            );
        }
    }
    Ok(())
}

/// `--source-lang` / `--target-lang` of the commands that run a translation model.
#[derive(Args, Debug, Clone)]
pub struct LanguageArgs {
    /// A multilingual model's source language, by its code (NLLB: `eng_Latn`; M2M100: `en`);
    /// the default is its tokenizer_config.json's `src_lang`. Refused for a model of one pair.
    #[arg(long)]
    pub source_lang: Option<String>,
    /// A multilingual model's target language (as --source-lang): every translation starts
    /// with its token. The default is its tokenizer_config.json's `tgt_lang`.
    #[arg(long)]
    pub target_lang: Option<String>,
}

impl LanguageArgs {
    /// Chooses `translator`'s languages (an unknown code, or codes for a model of one pair, is
    /// an error naming the flag).
    pub fn apply(
        &self,
        translator: &mut crate::pipeline::translate::Translator,
    ) -> crate::Result<()> {
        translator.set_languages(self.source_lang.as_deref(), self.target_lang.as_deref())
    }
}

// `--threads` of the inference commands.
#[derive(Args, Debug, Clone, Copy)]
pub struct ThreadsArgs {
    /// Worker threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

/// The `--threads` help of the training commands.
pub const TRAIN_THREADS_HELP: &str = "Worker threads (0: all cores). With 2 or more, training \
    splits every batch in two halves that run side by side on the model and a replica (data \
    parallelism, each half's matrix products on a single thread): always two halves, whatever \
    the count beyond 2; extra threads only serve the other parallel loops (attention, the \
    optimizer, validation). Under mpirun (a build with --features mpi): the threads of each \
    process, which splits its share of every batch the same way. Runs are reproducible bit for \
    bit at the same thread and process count";

// `--threads` of the training commands (`train`, `train-lm`, `demo`).
#[derive(Args, Debug, Clone, Copy)]
pub struct TrainThreadsArgs {
    #[arg(long, default_value_t = 0, help = TRAIN_THREADS_HELP)]
    pub threads: usize,
}

/// `--precision` of the inference commands: the numbers the weights are multiplied in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PrecisionArg {
    /// float32 (a GGUF file dequantised at load): the default.
    #[default]
    F32,
    /// bf16 weights and activations, float32 sums.
    Bf16,
    /// int8 weights per output row, activations quantised per row on the fly.
    Int8,
    /// A GGUF file's quantised blocks as stored: Q4_0/Q4_1/Q8_0, Q5_0/Q5_1/IQ4_NL, Q2_K..Q6_K
    /// (GGUF only).
    Ggml,
}

impl PrecisionArg {
    /// For a decoder language model.
    pub fn model_precision(self) -> crate::pipeline::generate::ModelPrecision {
        use crate::pipeline::generate::ModelPrecision as M;
        match self {
            PrecisionArg::F32 => M::F32,
            PrecisionArg::Bf16 => M::Bf16,
            PrecisionArg::Int8 => M::Int8,
            PrecisionArg::Ggml => M::Ggml,
        }
    }

    /// For a model of float weights (translation, embeddings): `ggml` is refused.
    pub fn float_precision(self) -> Result<crate::kernels::lowp::Precision> {
        use crate::kernels::lowp::Precision as P;
        Ok(match self {
            PrecisionArg::F32 => P::F32,
            PrecisionArg::Bf16 => P::Bf16,
            PrecisionArg::Int8 => P::Int8,
            PrecisionArg::Ggml => anyhow::bail!("--precision ggml is for .gguf models only"),
        })
    }
}

// `--precision` of `translate`, `embed`, `generate`, `chat` and `perplexity`.
#[derive(Args, Debug, Clone, Copy)]
pub struct PrecisionArgs {
    /// The numbers the weights are multiplied in: f32 (a GGUF file dequantised at load), bf16,
    /// int8, or ggml (a GGUF file's own quantised blocks, as llama.cpp computes).
    #[arg(long, value_enum, default_value = "f32")]
    pub precision: PrecisionArg,
}

// `--precision` and `--bf16-kernel` of the training commands (`train`, `train-lm`).
#[derive(Args, Debug, Clone, Copy)]
pub struct TrainPrecisionArgs {
    /// The number format of the linear layers' products: f32, or bf16 (operands rounded to
    /// bf16, float32 sums, float32 weights and optimizer state; see `train::precision`).
    /// Saved with the run: ignored with --resume, which continues in the checkpoint's.
    #[arg(long, value_enum, default_value_t = TrainPrecision::F32)]
    pub precision: TrainPrecision,
    /// With --precision bf16, how the products are multiplied: gemm (the float32 gemm over
    /// bf16-rounded operands, fastest where measured), packed (bf16 panels through the AVX-512
    /// BF16 kernel where the CPU has it, else its portable twin), avx512 or portable. Not saved
    /// with the run: kernels differ in the order of the f32 sums, so a resume continues bit for
    /// bit only with the same one.
    #[arg(long, default_value = "gemm", value_parser = Bf16Kernel::parse)]
    pub bf16_kernel: Bf16Kernel,
}

// The sampling of `generate` and `chat` (`chat` changes `--temperature`'s default to 0).
#[derive(Args, Debug, Clone, Copy)]
pub struct SamplingArgs {
    /// Softmax temperature; 0 is greedy (the most probable token, ties to the lowest id).
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f64,
    /// Sample among the k most likely tokens only (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling: the smallest set of tokens with this much probability (1: all).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    /// Seed of the sampling generator.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

impl SamplingArgs {
    /// The sampling settings, checked: `--temperature` finite and >= 0, `--top-p` in (0, 1].
    pub fn options(&self) -> Result<SamplingOptions> {
        let (temperature, top_p) = (self.temperature, self.top_p);
        if !(temperature.is_finite() && temperature >= 0.0) {
            anyhow::bail!("--temperature {temperature} must be >= 0");
        }
        if !(top_p > 0.0 && top_p <= 1.0) {
            anyhow::bail!("--top-p {top_p} must be in (0, 1]");
        }
        Ok(SamplingOptions {
            temperature,
            top_k: self.top_k,
            top_p,
        })
    }
}

/// The `--autosave` help of the training commands.
pub const AUTOSAVE_HELP: &str = "Also save the run into OUT whenever this many seconds have \
    passed since it was last saved there (0: off), so that a run that is killed loses at most \
    that much; resume it with --resume OUT --out OUT";

/// The `--overwrite` help of the commands that write a model directory.
pub const OVERWRITE_HELP: &str = "Replace the run or model that --out already holds (its \
    checkpoint files, metrics and step checkpoints are deleted first); without it such an \
    --out is refused, unless it is the run being resumed";

// What the training commands keep of their saves (`train`, `train-lm`).
#[derive(Args, Debug, Clone, Copy)]
pub struct SaveArgs {
    /// Keep only the last K step checkpoints (at least one).
    #[arg(long, default_value_t = 5)]
    pub keep_last: usize,
    #[arg(long, default_value_t = 600.0, help = AUTOSAVE_HELP)]
    pub autosave: f64,
    #[arg(long, help = OVERWRITE_HELP)]
    pub overwrite: bool,
}

impl SaveArgs {
    /// `--autosave` in seconds, `None` when off (0).
    pub fn autosave_seconds(&self) -> Option<f64> {
        (self.autosave > 0.0).then_some(self.autosave)
    }
}

/// Refuses a directory argument that is missing or a file, naming the flag.
pub fn check_dir(flag: &str, dir: &Path) -> Result<()> {
    if dir.is_dir() {
        Ok(())
    } else if dir.exists() {
        anyhow::bail!("{flag} {}: is a file, not a directory", dir.display())
    } else {
        anyhow::bail!("{flag} {}: directory does not exist", dir.display())
    }
}

/// Refuses an `--out` that already holds a run or a model, unless it is the run being resumed
/// (`--resume` is `--out` or inside it) or `--overwrite` is given; an `--out` that is a file is
/// refused always. `resumable`: the command has `--resume` (the message suggests it).
pub fn check_out(
    out: &Path,
    resume: Option<&Path>,
    overwrite: bool,
    resumable: bool,
) -> Result<()> {
    if out.exists() && !out.is_dir() {
        anyhow::bail!("--out {}: is a file, not a directory", out.display());
    }
    let Some(found) = crate::store::existing_run(out) else {
        return Ok(());
    };
    if resume.is_some_and(|r| crate::store::same_or_inside(r, out)) || overwrite {
        return Ok(());
    }
    let resume = if resumable {
        format!("give --resume {} to continue it, ", out.display())
    } else {
        String::new()
    };
    anyhow::bail!(
        "--out {} already holds a run or a model ({found}); {resume}give --overwrite to \
         replace it, or another --out",
        out.display()
    )
}

/// With `--overwrite`, deletes the run or model `out` holds (its checkpoint files, metrics,
/// curves and step checkpoints; nothing else), unless the run resumes from inside it.
pub fn clear_out(out: &Path, resume: Option<&Path>, overwrite: bool) -> Result<()> {
    if overwrite && !resume.is_some_and(|r| crate::store::same_or_inside(r, out)) {
        if let Some(found) = crate::store::existing_run(out) {
            eprintln!(
                "--overwrite: deleting the run in {} ({found}, ...)",
                out.display()
            );
            crate::store::clear_run(out)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Sampled {
        #[command(flatten)]
        sampling: SamplingArgs,
    }

    /// A generation's key/value cache against the bytes available: 2 layers · 2 · 32 wide ·
    /// positions · 4 bytes, the positions at most the context.
    #[test]
    fn a_generation_larger_than_memory_is_refused_naming_the_bytes() {
        use crate::model::config::{ModelConfig, Positions};
        let mut c = ModelConfig::preset("tiny", 8).unwrap();
        (c.n_encoder_layers, c.n_decoder_layers, c.d_model, c.n_heads) = (0, 2, 32, 4);
        (c.positions, c.max_len) = (Positions::Rotary, 1 << 20);
        let model = crate::model::LanguageModel::<f32>::new(c, &mut crate::model::ShapesOnly);
        let err = generation_fits(&model, 1 << 20, Some(1 << 20))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("536870912 bytes") && err.contains("1048576 bytes"),
            "{err}"
        );
        assert!(generation_fits(&model, 1000, Some(1 << 20)).is_ok());
        assert!(generation_fits(&model, 1 << 30, None).is_ok());
        let err = generation_fits(&model, usize::MAX, Some(1))
            .unwrap_err()
            .to_string();
        assert!(err.contains("of 1048576 positions"), "{err}");
    }

    #[test]
    fn sampling_values_are_checked() {
        let parse = |args: &[&str]| {
            Sampled::try_parse_from([&["x"], args].concat())
                .unwrap()
                .sampling
                .options()
                .map_err(|e| e.to_string())
        };
        let o = parse(&["--top-k", "5"]).unwrap();
        assert_eq!((o.temperature, o.top_k, o.top_p), (1.0, 5, 1.0));
        assert_eq!(
            parse(&["--temperature=-1"]).unwrap_err(),
            "--temperature -1 must be >= 0"
        );
        assert_eq!(
            parse(&["--top-p", "0"]).unwrap_err(),
            "--top-p 0 must be in (0, 1]"
        );
    }
}
