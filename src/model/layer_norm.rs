//! Layer normalisation as a module: `LN(x) = γ ⊙ (x − μ) / √(σ² + ε) + β` (computed by
//! [`Backend::layer_norm`] and its backward).

use super::param::{Init, Module, Param, ParamVisitor};
use crate::backend::{Backend, CPU, LayerNormStats};
use crate::Float;

/// A layer norm over the model width with gain γ (init 1) and bias β (init 0).
#[derive(Clone, Debug)]
pub struct LayerNorm<T> {
    /// γ `[d]`
    pub gamma: Param<T>,
    /// β `[d]`
    pub beta: Param<T>,
    pub eps: f64,
}

impl<T: Float> LayerNorm<T> {
    pub fn new(d: usize, eps: f64) -> Self {
        LayerNorm {
            gamma: Param::constant(&[d], 1.0),
            beta: Param::constant(&[d], 0.0),
            eps,
        }
    }

    /// γ = 1, β = 0 through `init` (shapes only with [`ShapesOnly`](super::param::ShapesOnly)).
    pub fn with_init(d: usize, eps: f64, init: &mut impl Init) -> Self {
        LayerNorm {
            gamma: init.constant(&[d], 1.0),
            beta: init.constant(&[d], 0.0),
            eps,
        }
    }

    fn d(&self) -> usize {
        self.gamma.value.len()
    }

    /// `x [rows, d]` -> (`y [rows, d]`, the statistics the backward needs).
    pub fn forward(&self, x: &[T]) -> (Vec<T>, LayerNormStats<T>) {
        let mut y = vec![T::zero(); x.len()];
        let gamma_beta = (&self.gamma.value.data[..], &self.beta.value.data[..]);
        let stats = CPU.layer_norm(&mut y, x, gamma_beta, self.d(), self.eps);
        (y, stats)
    }

    /// Accumulates dγ, dβ and returns dx.
    pub fn backward(&mut self, x: &[T], stats: &LayerNormStats<T>, dy: &[T]) -> Vec<T> {
        let mut dx = vec![T::zero(); x.len()];
        let d = self.d();
        let grads = (&mut self.gamma.grad.data[..], &mut self.beta.grad.data[..]);
        CPU.layer_norm_backward(&mut dx, dy, x, stats, &self.gamma.value.data, grads, d);
        dx
    }
}

impl<T> Module<T> for LayerNorm<T> {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>) {
        v.param("weight", &mut self.gamma);
        v.param("bias", &mut self.beta);
    }
}
