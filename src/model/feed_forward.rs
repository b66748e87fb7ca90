//! The position-wise feed-forward network: `FFN(x) = max(0, x W₁ᵀ + b₁) W₂ᵀ + b₂`, or with GELU
//! in place of the ReLU (BERT, GPT-2).

use super::config::Activation;
use super::linear::Linear;
use super::param::{Module, Param};
use crate::kernels::activations::{
    gelu_erf_backward_inplace, gelu_erf_forward, gelu_tanh_backward_inplace, gelu_tanh_forward,
    relu_backward_inplace,
};
use crate::rng::Rng;
use crate::Float;

/// Linear(d_model, d_ff) -> activation -> Linear(d_ff, d_model).
#[derive(Clone, Debug)]
pub struct FeedForward<T> {
    pub linear1: Linear<T>,
    pub linear2: Linear<T>,
    pub activation: Activation,
}

/// What the FFN forward keeps: the activation's output (the second linear's input; for ReLU its
/// sign is also the derivative) and, for GELU, its input.
#[derive(Clone, Debug)]
pub struct FeedForwardCache<T> {
    /// [rows, d_ff]
    pub hidden: Vec<T>,
    /// [rows, d_ff], the first linear's output; empty for ReLU, which does not need it.
    pub pre_activation: Vec<T>,
}

impl<T: Float> FeedForward<T> {
    pub fn new(d_model: usize, d_ff: usize, activation: Activation, rng: &mut Rng) -> Self {
        FeedForward {
            linear1: Linear::new(d_model, d_ff, rng),
            linear2: Linear::new(d_ff, d_model, rng),
            activation,
        }
    }

    /// Transposed weight copies of both linears for inference
    /// (see [`Linear::prepare_inference`]).
    pub fn prepare_inference(&mut self) {
        self.linear1.prepare_inference();
        self.linear2.prepare_inference();
    }

    /// `x [rows, d_model]` -> `y [rows, d_model]`.
    pub fn forward(&self, x: &[T]) -> (Vec<T>, FeedForwardCache<T>) {
        let (hidden, pre_activation) = match self.activation {
            // hidden: [rows, d_ff], bias and ReLU fused
            Activation::Relu => (self.linear1.forward_relu(x), Vec::new()),
            Activation::GeluErf | Activation::GeluTanh => {
                // pre: [rows, d_ff]
                let pre = self.linear1.forward(x);
                let mut hidden = vec![T::zero(); pre.len()];
                if self.activation == Activation::GeluErf {
                    gelu_erf_forward(&mut hidden, &pre);
                } else {
                    gelu_tanh_forward(&mut hidden, &pre);
                }
                (hidden, pre)
            }
        };
        let y = self.linear2.forward(&hidden);
        (
            y,
            FeedForwardCache {
                hidden,
                pre_activation,
            },
        )
    }

    /// Accumulates the gradients of both linears and returns dx.
    pub fn backward(&mut self, x: &[T], cache: FeedForwardCache<T>, dy: &[T]) -> Vec<T> {
        let mut dhidden = self.linear2.backward(&cache.hidden, dy);
        match self.activation {
            Activation::Relu => relu_backward_inplace(&mut dhidden, &cache.hidden),
            Activation::GeluErf => gelu_erf_backward_inplace(&mut dhidden, &cache.pre_activation),
            Activation::GeluTanh => gelu_tanh_backward_inplace(&mut dhidden, &cache.pre_activation),
        }
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
