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
//! KV bytes = Σ_layers 2 · kv_heads · head_dim · positions(layer) · sizeof(T)
//! ```
//!
//! (`positions(layer)` = the context, or the window of a sliding-window layer; a
//! linear-attention layer keeps no keys), must not exceed `MemAvailable` of `/proc/meminfo`:
//! a context that could not be held is refused up front with both numbers, instead of an
//! allocation failing (an abort) deep into a long generation.

use super::attention_kind::AttentionKind;
use super::lm::LanguageModel;
use crate::error::{Error, Result};
use crate::Float;

/// `MemAvailable` of `/proc/meminfo` in bytes (the kernel's estimate of the memory a new
/// allocation can take without swapping), or `None` where the file or the line is absent.
pub fn mem_available_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    meminfo_available(&meminfo)
}

/// The `MemAvailable:` line of a `/proc/meminfo` text, in bytes (the file states kB).
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
        let value_bytes = std::mem::size_of::<T>() as u128;
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
                2 * attn.d_kv() as u128 * held as u128 * value_bytes
            })
            .sum()
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
                     bytes ({:.1} GiB: 2 x {} layers' keys and values of {} bytes a value), \
                     more than the {available} bytes ({:.1} GiB) available (MemAvailable, \
                     /proc/meminfo); ask for a smaller --ctx-size",
                    needed as f64 / (1u64 << 30) as f64,
                    self.blocks.layers.len(),
                    std::mem::size_of::<T>(),
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
    }
}
