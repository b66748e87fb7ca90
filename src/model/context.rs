//! The context a language model runs with (`--ctx-size`, llama.cpp's `n_ctx`): the longest
//! sequence of this run, at most the model's own context (`config.max_len`, llama.cpp's
//! `n_ctx_train`).
//!
//! A context is a limit, not an allocation: the rotary angles are computed for the positions a
//! call rotates, the sinusoid table stops at `embedding::SINUSOID_TABLE_ROWS` rows, and a
//! key/value cache takes memory as positions are fed (decoding asks for the prompt plus the
//! tokens to generate, not the context). So a 1M-context file loads in the memory of its
//! weights, and by default a run may use the model's whole context.
//!
//! A context asked for explicitly is checked against the memory the machine has: one
//! sequence's keys and values at every position of it,
//!
//! ```text
//! KV bytes = Σ_layers kv_heads · head_dim · positions(layer) · (bytes(K type) + bytes(V type))
//! ```
//!
//! where a value's bytes are those of the cache types (`--cache-type-k` / `--cache-type-v`,
//! [`KvTypes`]: `sizeof(T)` by default, 2 for `f16` / `bf16`, 34/32 for `q8_0`, 18/32 for
//! `q4_0`; [`LanguageModel::set_kv_types`]).
//!
//! (`positions(layer)` = the context, or the window of a sliding-window layer; a
//! linear-attention layer keeps no keys), must not exceed `MemAvailable` of `/proc/meminfo`:
//! a context that could not be held is refused up front with both numbers, instead of an
//! allocation failing (an abort) deep into a long generation.

use super::attention_kind::AttentionKind;
use super::kv_cache::KvTypes;
use super::lm::LanguageModel;
use crate::error::{Error, Result};
use crate::Float;

/// `MemAvailable` of `/proc/meminfo` in bytes (the kernel's estimate of the memory a new
/// allocation can take without swapping), or `None` where the file or the line is absent.
/// (Used by the command line and the Python package, not by the library itself.)
#[cfg_attr(not(feature = "cli"), allow(dead_code))]
pub fn mem_available_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    meminfo_available(&meminfo)
}

/// The `MemAvailable:` line of a `/proc/meminfo` text, in bytes (the file states kB).
#[cfg_attr(not(feature = "cli"), allow(dead_code))]
fn meminfo_available(meminfo: &str) -> Option<u64> {
    let line = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

impl<T: Float> LanguageModel<T> {
    /// The model's own context (`config.max_len`), whatever this run's is.
    pub fn model_context(&self) -> usize {
        self.config.max_len
    }

    /// Bytes of one sequence's keys and values over `positions` positions (the module's
    /// equation).
    pub fn kv_cache_bytes(&self, positions: usize) -> u128 {
        let float_bytes = std::mem::size_of::<T>();
        self.blocks
            .layers
            .iter()
            .enumerate()
            .map(|(i, layer)| {
                let attn = &layer.self_attn;
                if self.config.layer_attention_kind(i) == AttentionKind::Linear {
                    return 0;
                }
                let held = attn.window.map_or(positions, |w| w.min(positions));
                let per_position = self.kv_types.position_bytes(attn.d_kv(), float_bytes);
                (per_position * held as f64).ceil() as u128
            })
            .sum()
    }

    /// Bytes of the keys and values of one position over every layer (the full context's
    /// layers; a sliding window does not change this).
    pub fn kv_bytes_per_position(&self) -> f64 {
        let float_bytes = std::mem::size_of::<T>();
        (0..self.blocks.layers.len())
            .filter(|&i| self.config.layer_attention_kind(i) != AttentionKind::Linear)
            .map(|i| {
                let d_kv = self.blocks.layers[i].self_attn.d_kv();
                self.kv_types.position_bytes(d_kv, float_bytes)
            })
            .sum()
    }

    /// The storage types of the key/value caches this model's states start with.
    pub fn kv_types(&self) -> KvTypes {
        self.kv_types
    }

    /// Stores keys and values as `types` in every state started from now on (llama.cpp's
    /// `--cache-type-k` / `--cache-type-v`). Refused, naming the option: a packed type whose
    /// blocks do not divide a layer's heads, and a packed type with a linear-attention layer
    /// (it keeps running sums, no keys or values to store).
    pub fn set_kv_types(&mut self, types: KvTypes) -> Result<()> {
        if !types.is_exact() {
            for (i, layer) in self.blocks.layers.iter().enumerate() {
                let attn = &layer.self_attn;
                if self.config.layer_attention_kind(i) == AttentionKind::Linear {
                    return Err(Error::Input(format!(
                        "--cache-type-k/--cache-type-v {types}: layer {i} is linear attention,                          which keeps running sums instead of keys and values; only f32 applies"
                    )));
                }
                types
                    .check_widths(attn.d_head, attn.d_kv())
                    .map_err(|e| Error::Input(format!("{e} (layer {i})")))?;
            }
        }
        self.kv_types = types;
        Ok(())
    }

    /// Sets this run's context to `ctx` positions, at most the model's own (a larger `ctx` is
    /// lowered to it); returns the context set. With `available` (bytes, e.g.
    /// `mem_available_bytes`), refuses a context whose key/value cache
    /// ([`kv_cache_bytes`](Self::kv_cache_bytes)) would not fit, naming both numbers.
    pub fn set_context(&mut self, ctx: usize, available: Option<u64>) -> Result<usize> {
        if ctx == 0 {
            return Err(Error::Input("the context (--ctx-size) must hold a token".into()));
        }
        let ctx = ctx.min(self.config.max_len);
        if let Some(available) = available {
            let needed = self.kv_cache_bytes(ctx);
            if needed > u128::from(available) {
                return Err(Error::Input(format!(
                    "--ctx-size {ctx}: the key/value cache of {ctx} positions needs {needed} \
                     bytes ({:.1} GiB: {} layers' keys and values, {:.0} bytes a position, \
                     cache types {}), more than the {available} bytes ({:.1} GiB) available \
                     (MemAvailable, /proc/meminfo); ask for a smaller --ctx-size or a \
                     smaller --cache-type-k/-v",
                    needed as f64 / (1u64 << 30) as f64,
                    self.blocks.layers.len(),
                    self.kv_bytes_per_position(),
                    self.kv_types,
                    available as f64 / (1u64 << 30) as f64,
                )));
            }
        }
        self.context = ctx;
        Ok(ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::{ModelConfig, Positions};
    use crate::model::ShapesOnly;

    #[test]
    fn meminfo_line_is_read_in_bytes() {
        let text = "MemTotal:       24575284 kB\nMemFree:  1 kB\nMemAvailable:   20123456 kB\n";
        assert_eq!(meminfo_available(text), Some(20_123_456 * 1024));
        assert_eq!(meminfo_available("MemTotal: 5 kB\n"), None);
    }

    /// 2 layers of 2 key/value heads of 8: 2 · 2 · 16 · ctx · 4 bytes; a context above the
    /// bytes available is refused with both numbers, one within them is set, one above the
    /// model's is lowered to it.
    #[test]
    fn context_is_checked_against_the_memory_available() {
        let mut c = ModelConfig::preset("tiny", 8).unwrap();
        (c.n_encoder_layers, c.n_decoder_layers) = (0, 2);
        (c.d_model, c.n_heads, c.n_kv_heads, c.d_ff, c.vocab_size) = (32, 4, Some(2), 16, 8);
        (c.positions, c.max_len) = (Positions::Rotary, 1 << 20);
        let mut m = LanguageModel::<f32>::new(c, &mut ShapesOnly);
        assert_eq!(m.kv_cache_bytes(1000), 2 * 2 * 16 * 1000 * 4);
        let err = m.set_context(1 << 20, Some(1 << 20)).unwrap_err().to_string();
        let needed = ((2 * 2 * 16 * 4u64) << 20).to_string();
        assert!(err.contains(&needed) && err.contains("1048576 bytes"), "{err}");
        assert_eq!(m.max_len(), 1 << 20, "a refused context changes nothing");
        assert_eq!(m.set_context(4096, Some(1 << 20)).unwrap(), 4096);
        assert_eq!((m.max_len(), m.model_context()), (4096, 1 << 20));
        assert_eq!(m.start(1, 1 << 20).capacity(), 4096);
        assert_eq!(m.set_context(usize::MAX, None).unwrap(), 1 << 20);
        assert!(m.set_context(0, None).is_err());
        // Packed cache types: q8_0 keys (34 bytes a block of 32), f16 values (2 bytes).
        assert_eq!(m.kv_bytes_per_position(), 2.0 * 2.0 * 16.0 * 4.0);
        use crate::backend::KvType;
        let types = KvTypes {
            k: KvType::Q8_0,
            v: KvType::F16,
        };
        // Heads of 8 values: no whole q8_0 block; refused naming the option.
        let err = m.set_kv_types(types).unwrap_err().to_string();
        assert!(err.contains("--cache-type-k q8_0"), "{err}");
        let f16 = KvTypes {
            k: KvType::F16,
            v: KvType::Bf16,
        };
        m.set_kv_types(f16).unwrap();
        // 2 layers x 16 values x (2 + 2) bytes.
        assert_eq!(m.kv_bytes_per_position(), 2.0 * 16.0 * 4.0);
        assert_eq!(m.kv_cache_bytes(1000), 2 * 16 * 4 * 1000);
        assert_eq!(m.start(1, 8).caches[0].types(), f16);
    }
}
