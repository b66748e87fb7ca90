//! A stack of N identical layers (section 3.1: "a stack of N = 6 identical layers"), with a
//! final layer norm after the last one when the blocks are pre-LN (post-LN blocks end in a norm
//! already). The encoder, the decoder, the language model's blocks and BERT's encoder are each
//! one `Stack`; what a layer does with its input is the caller's closure, so the loop, the final
//! norm and their backward are written once. Parameters: `layers.{i}.…`, `final_norm`.

use super::norm::{Norm, NormStats};
use super::param::{Init, Module, ParamVisitor};
use crate::rng::Rng;
use crate::Float;

/// Layers applied in order, then the optional final norm.
#[derive(Clone, Debug)]
pub struct Stack<L, T> {
    pub layers: Vec<L>,
    pub final_norm: Option<Norm<T>>,
}

/// What a stack's forward keeps: each layer's cache and the final norm's input and statistics.
#[derive(Clone, Debug)]
pub struct StackCache<C, T> {
    pub layers: Vec<C>,
    pub final_norm: Option<(Vec<T>, NormStats<T>)>,
}

impl<L, T: Float> Stack<L, T> {
    /// `n` layers made by `layer` in order (each drawing its parameters from `init`), then the
    /// final norm `final_norm` makes, if any.
    pub fn new<I: Init>(
        n: usize,
        init: &mut I,
        mut layer: impl FnMut(&mut I) -> L,
        final_norm: impl FnOnce(&mut I) -> Option<Norm<T>>,
    ) -> Self {
        let layers = (0..n).map(|_| layer(init)).collect();
        let final_norm = final_norm(init);
        Stack { layers, final_norm }
    }

    /// `x` through every layer (`layer(layer, x, rng) -> (y, cache)`), then the final norm.
    pub fn forward<C>(
        &self,
        mut x: Vec<T>,
        mut rng: Option<&mut Rng>,
        mut layer: impl FnMut(&L, Vec<T>, Option<&mut Rng>) -> (Vec<T>, C),
    ) -> (Vec<T>, StackCache<C, T>) {
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            let (y, c) = layer(l, x, rng.as_deref_mut());
            x = y;
            layers.push(c);
        }
        let mut final_norm = None;
        if let Some(norm) = &self.final_norm {
            let (y, stats) = norm.forward(&x);
            final_norm = Some((x, stats));
            x = y;
        }
        (x, StackCache { layers, final_norm })
    }

    /// Backward through the final norm and the layers in reverse
    /// (`layer(layer, cache, dy) -> dx`); accumulates gradients, returns dx.
    pub fn backward<C>(
        &mut self,
        cache: StackCache<C, T>,
        dy: Vec<T>,
        mut layer: impl FnMut(&mut L, C, &[T]) -> Vec<T>,
    ) -> Vec<T> {
        let mut dx = dy;
        if let (Some(norm), Some((x, stats))) = (&mut self.final_norm, &cache.final_norm) {
            dx = norm.backward(x, stats, &dx);
        }
        for (l, c) in self.layers.iter_mut().zip(cache.layers).rev() {
            dx = layer(l, c, &dx);
        }
        dx
    }

    /// Inference: `layer(i, layer, x) -> y` for each layer `i` in order, then the final norm.
    pub fn apply(
        &self,
        mut x: Vec<T>,
        mut layer: impl FnMut(usize, &L, Vec<T>) -> Vec<T>,
    ) -> Vec<T> {
        for (i, l) in self.layers.iter().enumerate() {
            x = layer(i, l, x);
        }
        match &self.final_norm {
            Some(norm) => norm.forward(&x).0,
            None => x,
        }
    }
}

impl<L: Module<T>, T> Module<T> for Stack<L, T> {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>) {
        v.list("layers", &mut self.layers);
        v.optional("final_norm", self.final_norm.as_mut());
    }
}
