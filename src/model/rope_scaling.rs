//! The rescaled rotary frequencies of long-context checkpoints ([`RopeScaling`]: Llama 3.1's
//! `llama3`, YaRN, linear, or llama.cpp's stored factors) and what a configuration's scaling
//! asks of the layers: the divisor of each frequency and the factor of `cos` and `sin` (the
//! equations are in `kernels::rope`).

use super::config::ModelConfig;
use crate::backend::{Backend, Llama3Scaling, YarnScaling, CPU};
use serde::{Deserialize, Serialize};

/// Rescaled rotary frequencies (long-context checkpoints): each frequency `θᵢ` of
/// `kernels::rope` divided by a factor `fᵢ`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum RopeScaling {
    /// Llama 3.1's `rope_type: llama3` (transformers' `_compute_llama3_parameters`): low
    /// frequencies slowed by `factor`, high ones kept, those between interpolated (see
    /// `kernels::rope::llama3_freq_factors`).
    Llama3 {
        /// How much the low frequencies are slowed (8 in Llama 3.1).
        factor: f64,
        /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are slowed
        /// by `factor`.
        low_freq_factor: f64,
        /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context the model was first trained with (8192 in Llama 3.1).
        original_max_position_embeddings: f64,
    },
    /// YaRN's `rope_type: yarn` (transformers' `_compute_yarn_parameters`, llama.cpp's
    /// `rope.scaling.type yarn`; Qwen2.5's 128k configs): the frequencies between the
    /// `beta_fast` and `beta_slow` bands ramped from kept to slowed by `factor`, `cos` and `sin`
    /// multiplied by `attention_factor` (see `kernels::rope::yarn_freq_factors`).
    Yarn {
        /// How much the low frequencies are slowed.
        factor: f64,
        /// The context the model was first trained with.
        original_max_position_embeddings: f64,
        /// Rotations over the original context above which a frequency is kept (32).
        beta_fast: f64,
        /// Rotations below which a frequency is slowed by `factor` (1).
        beta_slow: f64,
        /// The factor of `cos` and `sin` (default `0.1 · ln factor + 1`).
        attention_factor: f64,
        /// Whether the ramp's ends are whole dimensions (transformers' default: true).
        truncate: bool,
    },
    /// `rope_type: linear` (position interpolation): every frequency divided by `factor`.
    Linear {
        /// The divisor of every frequency.
        factor: f64,
    },
    /// The factors as stored (llama.cpp's `rope_freqs` tensor), `[d_k / 2]`.
    FreqFactors {
        /// `fᵢ` for each of the `d_k / 2` frequencies.
        factors: Vec<f64>,
    },
}

impl ModelConfig {
    /// The divisors `fᵢ` of the rotary frequencies, `[d_k / 2]`, that
    /// [`rope_scaling`](Self::rope_scaling) asks for; empty without scaling.
    pub fn rope_freq_factors(&self) -> Vec<f64> {
        match &self.rope_scaling {
            None => Vec::new(),
            Some(RopeScaling::FreqFactors { factors }) => factors.clone(),
            &Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => CPU.rope_llama3_factors(
                self.rope_base,
                self.d_head(),
                Llama3Scaling {
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings,
                },
            ),
            &Some(RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                truncate,
                ..
            }) => CPU.rope_yarn_factors(
                self.rope_base,
                self.d_head(),
                YarnScaling {
                    factor,
                    original_max_position_embeddings,
                    beta_fast,
                    beta_slow,
                    truncate,
                },
            ),
            &Some(RopeScaling::Linear { factor }) => vec![factor; self.d_head() / 2],
        }
    }

    /// The factor `m` of the rotated queries' and keys' `cos` and `sin` that
    /// [`rope_scaling`](Self::rope_scaling) asks for: YaRN's attention factor, else 1.
    pub fn rope_attention_factor(&self) -> f64 {
        match self.rope_scaling {
            Some(RopeScaling::Yarn {
                attention_factor, ..
            }) => attention_factor,
            _ => 1.0,
        }
    }
}
