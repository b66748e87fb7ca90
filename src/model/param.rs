//! A trainable parameter: its value and the gradient accumulated by backward passes.

use crate::{Float, Tensor};

/// A named-by-its-owner trainable tensor and its gradient (same shape).
#[derive(Clone, Debug)]
pub struct Param<T> {
    pub value: Tensor<T>,
    pub grad: Tensor<T>,
}

impl<T: Float> Param<T> {
    /// A parameter with the given value and a zero gradient.
    pub fn new(value: Tensor<T>) -> Self {
        let grad = Tensor::zeros(&value.shape);
        Param { value, grad }
    }

    /// Filled with a constant.
    pub fn constant(shape: &[usize], c: f64) -> Self {
        let mut t = Tensor::zeros(shape);
        t.data.iter_mut().for_each(|v| *v = T::of(c));
        Param::new(t)
    }

    /// Xavier/Glorot uniform: U(−a, a) with a = √(6 / (fan_in + fan_out)).
    pub fn xavier(
        shape: &[usize],
        fan_in: usize,
        fan_out: usize,
        rng: &mut crate::rng::Rng,
    ) -> Self {
        let a = (6.0 / (fan_in + fan_out) as f64).sqrt();
        let mut t = Tensor::zeros(shape);
        t.data
            .iter_mut()
            .for_each(|v| *v = T::of(rng.uniform_range(-a, a)));
        Param::new(t)
    }
}

/// Anything that owns parameters lists them, with names that mirror the module tree
/// (`encoder.layers.0.self_attn.q_proj.weight`), in one fixed order.
pub trait Module<T> {
    /// Appends `(prefix + name, parameter)` for every parameter, in a fixed order.
    fn collect_params<'a>(&'a mut self, prefix: &str, out: &mut Vec<(String, &'a mut Param<T>)>);
}
