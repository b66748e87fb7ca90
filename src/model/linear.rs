//! A fully connected layer, `y = x Wᵀ + b`, with PyTorch's `[d_out, d_in]` weight layout.

use super::param::{Module, Param};
use crate::kernels::matmul::{linear_forward, matmul, MatMut, MatRef};
use crate::kernels::reduce::add_column_sums;
use crate::rng::Rng;
use crate::Float;

/// `y = x Wᵀ + b`.
#[derive(Clone, Debug)]
pub struct Linear<T> {
    /// [d_out, d_in]
    pub weight: Param<T>,
    /// [d_out]
    pub bias: Param<T>,
    pub d_in: usize,
    pub d_out: usize,
}

impl<T: Float> Linear<T> {
    /// Xavier-uniform weight, zero bias.
    pub fn new(d_in: usize, d_out: usize, rng: &mut Rng) -> Self {
        Linear {
            weight: Param::xavier(&[d_out, d_in], d_in, d_out, rng),
            bias: Param::constant(&[d_out], 0.0),
            d_in,
            d_out,
        }
    }

    /// `x [rows, d_in]` -> `y [rows, d_out]`. The caller keeps `x` for the backward.
    pub fn forward(&self, x: &[T]) -> Vec<T> {
        let rows = x.len() / self.d_in;
        // y: [rows, d_out]
        let mut y = vec![T::zero(); rows * self.d_out];
        linear_forward(
            &mut y,
            x,
            &self.weight.value.data,
            Some(&self.bias.value.data),
            rows,
            self.d_in,
            self.d_out,
        );
        y
    }

    /// Accumulates `dW += dyᵀ x`, `db += Σ dy` and returns `dx = dy W`.
    pub fn backward(&mut self, x: &[T], dy: &[T]) -> Vec<T> {
        let rows = x.len() / self.d_in;
        self.accumulate_grads(x, dy);
        // dx: [rows, d_in]
        let mut dx = vec![T::zero(); rows * self.d_in];
        matmul(
            MatMut::new(&mut dx, rows, self.d_in),
            MatRef::new(dy, rows, self.d_out),
            MatRef::new(&self.weight.value.data, self.d_out, self.d_in),
            T::one(),
            false,
        );
        dx
    }

    /// Accumulates the parameter gradients only (when `dx` is not needed).
    pub fn accumulate_grads(&mut self, x: &[T], dy: &[T]) {
        let rows = x.len() / self.d_in;
        matmul(
            MatMut::new(&mut self.weight.grad.data, self.d_out, self.d_in),
            MatRef::new(dy, rows, self.d_out).t(),
            MatRef::new(x, rows, self.d_in),
            T::one(),
            true,
        );
        add_column_sums(&mut self.bias.grad.data, dy, self.d_out);
    }
}

impl<T> Module<T> for Linear<T> {
    fn collect_params<'a>(&'a mut self, prefix: &str, out: &mut Vec<(String, &'a mut Param<T>)>) {
        out.push((format!("{prefix}.weight"), &mut self.weight));
        out.push((format!("{prefix}.bias"), &mut self.bias));
    }
}
