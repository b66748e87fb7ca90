//! The hyper-parameters of a llama-style decoder as its GGUF metadata states them.
//!
//! llama.cpp's keys (`llama-arch.cpp`), prefixed by the architecture name (`general.architecture`,
//! `llama` below; the families that share these keys write their own name). Which
//! architectures load is the model's table of families (`crate::model::families`), not this
//! reader's:
//!
//! | key | field | |
//! |---|---|---|
//! | `general.architecture` | the prefix of the keys below | required |
//! | `llama.block_count` | [`LlamaGgufConfig::n_layers`] | required |
//! | `llama.embedding_length` | [`LlamaGgufConfig::d_model`] | required |
//! | `llama.feed_forward_length` | [`LlamaGgufConfig::d_ff`] | required |
//! | `llama.attention.head_count` | [`LlamaGgufConfig::n_heads`] | required |
//! | `llama.attention.head_count_kv` | [`LlamaGgufConfig::n_kv_heads`] | defaults to `head_count` (no grouping), as in llama.cpp |
//! | `llama.attention.layer_norm_rms_epsilon` | [`LlamaGgufConfig::rms_norm_eps`] | required |
//! | `llama.rope.freq_base` | [`LlamaGgufConfig::rope_freq_base`] | defaults to 10000, as in llama.cpp |
//! | `llama.attention.key_length` | [`LlamaGgufConfig::key_length`] | the head size; defaults to `embedding_length / head_count`; `value_length` must equal it |
//! | `llama.rope.dimension_count` | [`LlamaGgufConfig::rope_dim`] | defaults to the head size |
//! | `llama.context_length` | [`LlamaGgufConfig::context_length`] | required |
//! | `llama.vocab_size` | [`LlamaGgufConfig::vocab_size`] | else the length of `tokenizer.ggml.tokens` |
//!
//! Integers may be stored as any GGUF integer type, floats as f32 or f64; a key of another
//! type is an error naming it. The weights' names and shapes are not checked here (the model
//! that loads them does).

use super::ckpt_err;
use super::gguf::GgufFile;
use crate::error::Result;

/// llama.cpp's `rope_freq_base` when the file does not state one.
pub const DEFAULT_ROPE_FREQ_BASE: f64 = 10000.0;

/// A llama decoder's shape and constants, read from GGUF metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaGgufConfig {
    /// Decoder blocks (`llama.block_count`).
    pub n_layers: usize,
    /// Width of the residual stream (`llama.embedding_length`).
    pub d_model: usize,
    /// Hidden width of the SwiGLU feed-forward (`llama.feed_forward_length`).
    pub d_ff: usize,
    /// Query heads (`llama.attention.head_count`).
    pub n_heads: usize,
    /// Key/value heads (`llama.attention.head_count_kv`); `n_heads / n_kv_heads` query heads
    /// share each (grouped-query attention).
    pub n_kv_heads: usize,
    /// RMSNorm's ε (`llama.attention.layer_norm_rms_epsilon`), as stored (f32 in most files).
    pub rms_norm_eps: f64,
    /// RoPE's base θ (`llama.rope.freq_base`).
    pub rope_freq_base: f64,
    /// Dimensions of each head that RoPE rotates (`llama.rope.dimension_count`).
    pub rope_dim: usize,
    /// Width of each head when the file states it (`llama.attention.key_length`; Qwen3's
    /// heads need not be `d_model / n_heads` wide).
    pub key_length: Option<usize>,
    /// Training context length (`llama.context_length`).
    pub context_length: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
}

impl LlamaGgufConfig {
    /// Reads the hyper-parameters of `file` under the keys of its architecture
    /// (`{arch}.block_count`, ...).
    pub fn from_gguf(file: &GgufFile) -> Result<LlamaGgufConfig> {
        let bad = |reason: String| ckpt_err(file.path(), reason);
        let arch = file.architecture()?;
        let key = |k: &str| format!("{arch}.{k}");
        let n_heads: usize = file.require(&key("attention.head_count"))?;
        let d_model: usize = file.require(&key("embedding_length"))?;
        let key_length: Option<usize> = file.get(&key("attention.key_length"))?;
        let value_length: Option<usize> = file.get(&key("attention.value_length"))?;
        if value_length.is_some() && value_length != key_length {
            return Err(bad(format!(
                "{} {value_length:?} differs from {} {key_length:?} (not supported)",
                key("attention.value_length"),
                key("attention.key_length")
            )));
        }
        let vocab_size = match file.get::<usize>(&key("vocab_size"))? {
            Some(n) => n,
            None => file
                .get::<Vec<&str>>("tokenizer.ggml.tokens")?
                .map(|t| t.len())
                .ok_or_else(|| {
                    bad(format!(
                        "neither {} nor tokenizer.ggml.tokens is present",
                        key("vocab_size")
                    ))
                })?,
        };
        let config = LlamaGgufConfig {
            n_layers: file.require(&key("block_count"))?,
            d_model,
            d_ff: file.require(&key("feed_forward_length"))?,
            n_heads,
            n_kv_heads: file
                .get(&key("attention.head_count_kv"))?
                .unwrap_or(n_heads),
            rms_norm_eps: file.require(&key("attention.layer_norm_rms_epsilon"))?,
            rope_freq_base: file
                .get(&key("rope.freq_base"))?
                .unwrap_or(DEFAULT_ROPE_FREQ_BASE),
            rope_dim: match file.get(&key("rope.dimension_count"))? {
                Some(n) => n,
                None => key_length.unwrap_or(d_model / n_heads.max(1)),
            },
            key_length,
            context_length: file.require(&key("context_length"))?,
            vocab_size,
        };
        config.validate(arch).map_err(bad)?;
        Ok(config)
    }

    /// Size of one attention head: [`key_length`](Self::key_length), else
    /// `d_model / n_heads`.
    pub fn head_dim(&self) -> usize {
        self.key_length.unwrap_or(self.d_model / self.n_heads)
    }

    fn validate(&self, arch: &str) -> std::result::Result<(), String> {
        let positive = [
            ("block_count", self.n_layers),
            ("embedding_length", self.d_model),
            ("feed_forward_length", self.d_ff),
            ("attention.head_count", self.n_heads),
            ("attention.head_count_kv", self.n_kv_heads),
            ("context_length", self.context_length),
        ];
        if let Some((key, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{arch}.{key} is 0"));
        }
        if self.vocab_size == 0 {
            return Err("the vocabulary size is 0".into());
        }
        if self.key_length == Some(0) {
            return Err(format!("{arch}.attention.key_length is 0"));
        }
        if self.key_length.is_none() && !self.d_model.is_multiple_of(self.n_heads) {
            return Err(format!(
                "embedding length {} is not a multiple of the {} heads",
                self.d_model, self.n_heads
            ));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(format!(
                "{} query heads cannot be shared evenly by {} key/value heads",
                self.n_heads, self.n_kv_heads
            ));
        }
        if self.rope_dim > self.head_dim() || !self.rope_dim.is_multiple_of(2) {
            return Err(format!(
                "RoPE dimension count {} must be even and at most the head size {}",
                self.rope_dim,
                self.head_dim()
            ));
        }
        if !(self.rms_norm_eps > 0.0 && self.rms_norm_eps.is_finite()) {
            return Err(format!(
                "RMSNorm epsilon {} is not positive",
                self.rms_norm_eps
            ));
        }
        if !(self.rope_freq_base > 0.0 && self.rope_freq_base.is_finite()) {
            return Err(format!("RoPE base {} is not positive", self.rope_freq_base));
        }
        Ok(())
    }
}
