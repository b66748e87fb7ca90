//! The normalisation of a residual connection (and of a pre-norm stack's end): the paper's layer
//! norm, or RMSNorm (Llama), chosen by the model's config. Both are computed
//! through the backend ([`Backend::layer_norm`], [`Backend::rms_norm`] and their backwards).

use super::layer_norm::LayerNorm;
use super::param::{Init, Module, Param, ParamVisitor};
use crate::backend::{Backend, LayerNormStats, RmsNormStats, CPU};
use crate::Float;
use std::borrow::Cow;

/// RMSNorm (Zhang & Sennrich 2019): `RMSNorm(x) = (g + o) ⊙ x / √(mean(x²) + ε)`, gain `g`
/// (init 1), no bias, no mean subtraction; the offset `o` is 0 but for checkpoints that store
/// `g − 1` (Gemma: `o = 1`). Parameter: `weight` (the stored gain `g`).
#[derive(Clone, Debug)]
pub struct RmsNorm<T> {
    /// g `[d]`
    pub gain: Param<T>,
    pub eps: f64,
    /// `o`, added to the stored gain when the norm is applied.
    pub offset: f64,
}

impl<T: Float> RmsNorm<T> {
    /// Gain 1 through `init`.
    pub fn new(d: usize, eps: f64, init: &mut impl Init) -> Self {
        RmsNorm {
            gain: init.constant(&[d], 1.0),
            eps,
            offset: 0.0,
        }
    }

    /// The same norm applying the gain `g + offset`.
    pub fn with_offset(mut self, offset: f64) -> Self {
        self.offset = offset;
        self
    }

    /// `x [rows, d]` -> (`y [rows, d]`, what the backward needs).
    pub fn forward(&self, x: &[T]) -> (Vec<T>, RmsNormStats<T>) {
        let d = self.gain.value.shape[0];
        let mut y = vec![T::zero(); x.len()];
        let gain = applied_gain(&self.gain.value.data, self.offset);
        let stats = CPU.rms_norm(&mut y, x, &gain, d, self.eps);
        (y, stats)
    }

    /// Accumulates dg (`∂/∂g = ∂/∂(g + o)`) and returns dx.
    pub fn backward(&mut self, x: &[T], stats: &RmsNormStats<T>, dy: &[T]) -> Vec<T> {
        let d = self.gain.value.shape[0];
        let mut dx = vec![T::zero(); x.len()];
        let gain = applied_gain(&self.gain.value.data, self.offset);
        CPU.rms_norm_backward(&mut dx, dy, x, stats, &gain, &mut self.gain.grad.data, d);
        dx
    }
}

/// The gain applied, `g + o`: the stored `g` itself when `o = 0`.
fn applied_gain<T: Float>(g: &[T], offset: f64) -> Cow<'_, [T]> {
    if offset == 0.0 {
        return Cow::Borrowed(g);
    }
    g.iter().map(|&v| v + T::of(offset)).collect()
}

impl<T> Module<T> for RmsNorm<T> {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>) {
        v.param("weight", &mut self.gain);
    }
}

/// A layer norm, an RMSNorm, or none: `Identity`, `y = x` without parameters (a sublayer
/// whose input is not normalised: OLMo 2's, which normalise their outputs instead).
#[derive(Clone, Debug)]
pub enum Norm<T> {
    Layer(LayerNorm<T>),
    Rms(RmsNorm<T>),
    Identity,
}

/// What a norm's forward keeps for its backward.
#[derive(Clone, Debug)]
pub enum NormStats<T> {
    Layer(LayerNormStats<T>),
    Rms(RmsNormStats<T>),
    Identity,
}

impl<T: Float> Norm<T> {
    /// `x [rows, d]` -> (`y [rows, d]`, the statistics the backward needs).
    pub fn forward(&self, x: &[T]) -> (Vec<T>, NormStats<T>) {
        match self {
            Norm::Layer(n) => {
                let (y, s) = n.forward(x);
                (y, NormStats::Layer(s))
            }
            Norm::Rms(n) => {
                let (y, s) = n.forward(x);
                (y, NormStats::Rms(s))
            }
            Norm::Identity => (x.to_vec(), NormStats::Identity),
        }
    }

    /// Whether this is no norm at all ([`Norm::Identity`]).
    pub fn is_identity(&self) -> bool {
        matches!(self, Norm::Identity)
    }

    /// Accumulates the norm's parameter gradients and returns dx.
    pub fn backward(&mut self, x: &[T], stats: &NormStats<T>, dy: &[T]) -> Vec<T> {
        match (self, stats) {
            (Norm::Layer(n), NormStats::Layer(s)) => n.backward(x, s, dy),
            (Norm::Rms(n), NormStats::Rms(s)) => n.backward(x, s, dy),
            (Norm::Identity, NormStats::Identity) => dy.to_vec(),
            _ => panic!("norm statistics of the other kind"),
        }
    }
}

impl<T> Module<T> for Norm<T> {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>) {
        match self {
            Norm::Layer(n) => n.visit(v),
            Norm::Rms(n) => n.visit(v),
            Norm::Identity => {}
        }
    }
}
