//! The number format of a training run's matrix products (`--precision` of `train` and
//! `train-lm`, saved with the recipe so that a resumed run keeps it).
//!
//! - `f32`: everything in float32.
//! - `bf16`: mixed precision as `torch.autocast(dtype=torch.bfloat16)` does it for the linear
//!   layers: both operands of each product of a linear layer (forward `Y = X Wᵀ`, backward
//!   `dX = dY W` and `dW += dYᵀ X`) are rounded to bf16 (nearest, ties to even), every sum is
//!   in float32. The master weights, their gradients and Adam's moments stay float32; the
//!   weights are rounded once per optimizer step (see
//!   [`Linear`](crate::model::linear::Linear)). bf16 has float32's exponent range, so no loss
//!   scaling is needed. Everything else (embeddings, norms, attention, the output projection,
//!   the loss) stays float32.

use serde::{Deserialize, Serialize};

/// The number format of a run's products.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum TrainPrecision {
    /// float32 throughout (the default).
    #[default]
    F32,
    /// bf16 operands in the linear layers' products, float32 sums, float32 master weights and
    /// optimizer state.
    Bf16,
}

impl TrainPrecision {
    /// For `skip_serializing_if`: recipes in f32 are written as before the option existed.
    pub fn is_f32(&self) -> bool {
        *self == TrainPrecision::F32
    }

    /// Whether the linear layers multiply bf16-rounded operands.
    pub fn bf16_products(self) -> bool {
        self == TrainPrecision::Bf16
    }
}

impl std::fmt::Display for TrainPrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TrainPrecision::F32 => "f32",
            TrainPrecision::Bf16 => "bf16",
        })
    }
}
