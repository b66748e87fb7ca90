//! The position-wise feed-forward network: `FFN(x) = max(0, x W₁ᵀ + b₁) W₂ᵀ + b₂`.

use super::linear::Linear;
use super::param::{Module, Param};
use crate::kernels::activations::{relu_backward_inplace, relu_inplace};
use crate::rng::Rng;
use crate::Float;

/// Linear(d_model, d_ff) -> ReLU -> Linear(d_ff, d_model).
#[derive(Clone, Debug)]
pub struct FeedForward<T> {
    pub linear1: Linear<T>,
    pub linear2: Linear<T>,
}

/// What the FFN forward keeps: the ReLU output (the second linear's input; its sign is the ReLU
/// derivative).
#[derive(Clone, Debug)]
pub struct FeedForwardCache<T> {
    /// [rows, d_ff]
    pub hidden: Vec<T>,
}

impl<T: Float> FeedForward<T> {
    pub fn new(d_model: usize, d_ff: usize, rng: &mut Rng) -> Self {
        FeedForward {
            linear1: Linear::new(d_model, d_ff, rng),
            linear2: Linear::new(d_ff, d_model, rng),
        }
    }

    /// `x [rows, d_model]` -> `y [rows, d_model]`.
    pub fn forward(&self, x: &[T]) -> (Vec<T>, FeedForwardCache<T>) {
        // hidden: [rows, d_ff]
        let mut hidden = self.linear1.forward(x);
        relu_inplace(&mut hidden);
        let y = self.linear2.forward(&hidden);
        (y, FeedForwardCache { hidden })
    }

    /// Accumulates the gradients of both linears and returns dx.
    pub fn backward(&mut self, x: &[T], cache: FeedForwardCache<T>, dy: &[T]) -> Vec<T> {
        let mut dhidden = self.linear2.backward(&cache.hidden, dy);
        relu_backward_inplace(&mut dhidden, &cache.hidden);
        self.linear1.backward(x, &dhidden)
    }
}

impl<T> Module<T> for FeedForward<T> {
    fn collect_params<'a>(&'a mut self, prefix: &str, out: &mut Vec<(String, &'a mut Param<T>)>) {
        self.linear1
            .collect_params(&format!("{prefix}.linear1"), out);
        self.linear2
            .collect_params(&format!("{prefix}.linear2"), out);
    }
}
