//! Mixture of experts (Shazeer et al. 2017; Switch, Mixtral, Qwen3-MoE, OLMoE): the block's
//! position-wise FFN replaced by `E` FFNs of their own ("experts"), of which a linear router
//! picks `k` for each token:
//!
//! `p = softmax(x W_rᵀ + b_r)`, `S = top_k(p)`, `w_e = p_e / Σ_{j ∈ S} p_j` (normalised; or
//! `w_e = p_e`), `MoE(x) = Σ_{e ∈ S} w_e · FFN_e(x)`,
//!
//! and, with a shared expert (Qwen2-MoE, Qwen3-Next, Qwen3.5-MoE), a dense FFN every token
//! passes through, scaled by its own sigmoid gate `w_g [1, d_model]`:
//! `MoE(x) = Σ_{e ∈ S} w_e · FFN_e(x) + σ(x w_gᵀ) · FFN_s(x)`.
//!
//! Normalised, the weights are the softmax of the chosen logits alone (gpt-oss's router:
//! `top_k` of the logits, then their softmax): `p_e / Σ_{j∈S} p_j = e^{l_e} / Σ_{j∈S} e^{l_j}`.
//! The router's bias `b_r` and the experts' biases exist only where a family has them
//! ([`MixtureOfExperts::with_biases`], gpt-oss, whose experts also clamp their SwiGLU:
//! `super::feed_forward`).
//!
//! Tokens are grouped by expert, so each chosen expert is one product over its tokens (a
//! prompt or a batch of rows reads each expert's weights once), and the weighted outputs are
//! added in expert order (as transformers' `index_add_` does). [`Ffn`] is a block's FFN
//! sublayer: one dense FFN or a mixture.
//!
//! Backward, beside it: `dFFN_e = w_e dy` for each routed token, `dw_e = dy · FFN_e(x)`; the
//! normalisation `dp_e = (dw_e − Σ_{j∈S} w_j dw_j) / Σ_{j∈S} p_j` on `S` (0 elsewhere), the
//! softmax `dl = p ⊙ (dp − p · dp)`, then the router's product. The choice of `S` is piecewise
//! constant and has no gradient. The shared expert: `dFFN_s = σ dy`, and through its gate
//! `dl_g = (dy · FFN_s(x)) σ (1 − σ)`, then the gate's product.

use super::config::Activation;
use super::feed_forward::{FeedForward, FeedForwardCache};
use super::linear::Linear;
use super::param::{Init, Module, ParamVisitor};
use crate::backend::{Backend, CPU};
use crate::rng::Rng;
use crate::Float;

/// What a router picks for one token: the expert and its weight `w_e`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Choice<T> {
    pub expert: usize,
    pub weight: T,
}

/// `E` gated (or plain) FFNs of width `d_ff` each and the router that picks `top_k` of them.
#[derive(Clone, Debug)]
pub struct MixtureOfExperts<T> {
    /// `W_r [E, d_model]`, no bias.
    pub router: Linear<T>,
    pub experts: Vec<FeedForward<T>>,
    pub top_k: usize,
    /// Whether the chosen probabilities are divided by their sum (Mixtral, Qwen3-MoE) or used
    /// as they are (OLMoE).
    pub normalise: bool,
    /// The expert every token passes through, if the model has one.
    pub shared: Option<SharedExpert<T>>,
}

/// A dense FFN every token passes through, its output scaled by `σ(x w_gᵀ)`.
#[derive(Clone, Debug)]
pub struct SharedExpert<T> {
    pub ffn: FeedForward<T>,
    /// `w_g [1, d_model]`, no bias.
    pub gate: Linear<T>,
}

/// What the shared expert's forward keeps: its output `[rows, d_model]`, its FFN's cache and
/// the gate `σ [rows]`.
#[derive(Clone, Debug)]
struct SharedCache<T> {
    y: Vec<T>,
    cache: FeedForwardCache<T>,
    sigma: Vec<T>,
}

/// What the mixture's forward keeps for its backward.
#[derive(Clone, Debug)]
pub struct ExpertsCache<T> {
    /// `[rows, E]`, the router's probabilities.
    probs: Vec<T>,
    /// `[rows * top_k]`, each token's choices in rank order.
    choices: Vec<Choice<T>>,
    /// The shared expert's, if any.
    shared: Option<SharedCache<T>>,
    /// Per expert with tokens: its tokens (rows of `x`), their inputs `[n, d_model]`, outputs
    /// `[n, d_model]` and the expert's cache.
    groups: Vec<ExpertGroup<T>>,
}

#[derive(Clone, Debug)]
struct ExpertGroup<T> {
    expert: usize,
    rows: Vec<usize>,
    weights: Vec<T>,
    x: Vec<T>,
    y: Vec<T>,
    cache: FeedForwardCache<T>,
}

/// The `k` largest of `probs` (ties: the lower index first), as transformers' `topk` of
/// distinct values, with their weights.
pub fn route<T: Float>(probs: &[T], k: usize, normalise: bool) -> Vec<Choice<T>> {
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].partial_cmp(&probs[a]).unwrap_or(std::cmp::Ordering::Equal));
    order.truncate(k);
    let sum = order.iter().fold(T::zero(), |s, &e| s + probs[e]);
    order
        .into_iter()
        .map(|expert| Choice {
            expert,
            weight: if normalise {
                probs[expert] / sum
            } else {
                probs[expert]
            },
        })
        .collect()
}

impl<T: Float> MixtureOfExperts<T> {
    /// `n_experts` experts of `d_ff` hidden units with `activation` (no biases) and the router,
    /// parameters drawn in the order router, then each expert's.
    pub fn new(
        d_model: usize,
        (n_experts, top_k, d_ff): (usize, usize, usize),
        activation: Activation,
        normalise: bool,
        init: &mut impl Init,
    ) -> Self {
        let router = Linear::with_bias(d_model, n_experts, false, init);
        let experts = (0..n_experts)
            .map(|_| FeedForward::with_bias(d_model, d_ff, activation, false, init))
            .collect();
        MixtureOfExperts {
            router,
            experts,
            top_k,
            normalise,
            shared: None,
        }
    }

    /// This mixture with a shared expert of `d_ff` hidden units with `activation` (no biases)
    /// and its gate, drawn from `init` in that order.
    pub fn with_shared(mut self, d_ff: usize, activation: Activation, init: &mut impl Init) -> Self {
        let d = self.router.d_in;
        self.shared = Some(SharedExpert {
            ffn: FeedForward::with_bias(d, d_ff, activation, false, init),
            gate: Linear::with_bias(d, 1, false, init),
        });
        self
    }

    /// The same mixture with zero biases on the router and on each expert's three projections
    /// (to be loaded), drawn from `init` in the order router, then each expert's.
    pub fn with_biases(mut self, init: &mut impl Init) -> Self {
        let e = self.experts.len();
        self.router.bias = Some(init.constant(&[e], 0.0));
        for expert in &mut self.experts {
            let gate = expert.gate.iter_mut();
            for linear in [&mut expert.linear1, &mut expert.linear2].into_iter().chain(gate) {
                linear.bias = Some(init.constant(&[linear.d_out], 0.0));
            }
        }
        self
    }

    /// Each token's choices, `[rows * top_k]`, and the router's probabilities `[rows, E]`.
    pub fn choices(&self, x: &[T]) -> (Vec<Choice<T>>, Vec<T>) {
        let e = self.experts.len();
        let mut probs = self.router.forward(x);
        CPU.softmax_rows(&mut probs, e);
        let choices = probs
            .chunks(e)
            .flat_map(|p| route(p, self.top_k, self.normalise))
            .collect();
        (choices, probs)
    }

    /// `x [rows, d_model]` -> `y [rows, d_model]`.
    pub fn forward(&self, x: &[T]) -> Vec<T> {
        self.forward_train(x, None).0
    }

    /// The forward with the experts' activation dropout drawn from `rng` when given.
    pub fn forward_train(&self, x: &[T], mut rng: Option<&mut Rng>) -> (Vec<T>, ExpertsCache<T>) {
        let d = self.router.d_in;
        let (choices, probs) = self.choices(x);
        let mut y = vec![T::zero(); x.len()];
        let mut groups = Vec::new();
        for (expert, ffn) in self.experts.iter().enumerate() {
            let (mut rows, mut weights) = (Vec::new(), Vec::new());
            for (i, c) in choices.iter().enumerate() {
                if c.expert == expert {
                    rows.push(i / self.top_k);
                    weights.push(c.weight);
                }
            }
            if rows.is_empty() {
                continue;
            }
            // x_e: [n, d_model], the tokens routed to this expert.
            let x_e: Vec<T> = rows.iter().flat_map(|&r| &x[r * d..(r + 1) * d]).copied().collect();
            let (y_e, cache) = ffn.forward_train(&x_e, rng.as_deref_mut());
            for ((&r, &w), out) in rows.iter().zip(&weights).zip(y_e.chunks(d)) {
                for (acc, &v) in y[r * d..(r + 1) * d].iter_mut().zip(out) {
                    *acc += w * v;
                }
            }
            groups.push(ExpertGroup {
                expert,
                rows,
                weights,
                x: x_e,
                y: y_e,
                cache,
            });
        }
        let shared = self.shared.as_ref().map(|s| {
            let (y_s, cache) = s.ffn.forward_train(x, rng);
            // σ: [rows], the gate of each token.
            let sigma: Vec<T> = s
                .gate
                .forward(x)
                .into_iter()
                .map(|l| T::one() / (T::one() + (-l).exp()))
                .collect();
            for ((out, part), &g) in y.chunks_mut(d).zip(y_s.chunks(d)).zip(&sigma) {
                for (acc, &v) in out.iter_mut().zip(part) {
                    *acc += g * v;
                }
            }
            SharedCache {
                y: y_s,
                cache,
                sigma,
            }
        });
        (
            y,
            ExpertsCache {
                probs,
                choices,
                shared,
                groups,
            },
        )
    }

    /// Accumulates the router's and the experts' gradients and returns dx.
    pub fn backward(&mut self, x: &[T], cache: ExpertsCache<T>, dy: &[T]) -> Vec<T> {
        let (d, e, k) = (self.router.d_in, self.experts.len(), self.top_k);
        let rows = x.len() / d;
        let mut dx = vec![T::zero(); x.len()];
        // dw: [rows, E], the gradient of each chosen weight.
        let mut dw = vec![T::zero(); rows * e];
        for g in cache.groups {
            let mut dy_e = Vec::with_capacity(g.x.len());
            for (j, (&r, &w)) in g.rows.iter().zip(&g.weights).enumerate() {
                let dy_r = &dy[r * d..(r + 1) * d];
                dy_e.extend(dy_r.iter().map(|&v| w * v));
                let out = &g.y[j * d..(j + 1) * d];
                dw[r * e + g.expert] = dy_r.iter().zip(out).fold(T::zero(), |s, (&a, &b)| s + a * b);
            }
            let dx_e = self.experts[g.expert].backward(&g.x, g.cache, &dy_e);
            for (&r, part) in g.rows.iter().zip(dx_e.chunks(d)) {
                for (acc, &v) in dx[r * d..(r + 1) * d].iter_mut().zip(part) {
                    *acc += v;
                }
            }
        }
        // dl: [rows, E], through the normalisation (dp, zero off the chosen experts), then
        // the softmax.
        let mut dl = vec![T::zero(); rows * e];
        for r in 0..rows {
            let p = &cache.probs[r * e..(r + 1) * e];
            let chosen = &cache.choices[r * k..(r + 1) * k];
            let (dw, dp) = (&dw[r * e..(r + 1) * e], &mut dl[r * e..(r + 1) * e]);
            if self.normalise {
                let sum = chosen.iter().fold(T::zero(), |s, c| s + p[c.expert]);
                let mean = chosen
                    .iter()
                    .fold(T::zero(), |s, c| s + c.weight * dw[c.expert]);
                for c in chosen {
                    dp[c.expert] = (dw[c.expert] - mean) / sum;
                }
            } else {
                for c in chosen {
                    dp[c.expert] = dw[c.expert];
                }
            }
        }
        CPU.softmax_rows_backward(&mut dl, &cache.probs, e);
        CPU.add(&mut dx, &self.router.backward(x, &dl));
        if let (Some(s), Some(c)) = (self.shared.as_mut(), cache.shared) {
            // dy_s = σ dy; dl_g = (dy · FFN_s(x)) σ (1 − σ), [rows, 1].
            let mut dy_s = Vec::with_capacity(dy.len());
            let mut dl_g = Vec::with_capacity(rows);
            for ((dy_r, y_r), &g) in dy.chunks(d).zip(c.y.chunks(d)).zip(&c.sigma) {
                dy_s.extend(dy_r.iter().map(|&v| g * v));
                let dg = dy_r.iter().zip(y_r).fold(T::zero(), |acc, (&a, &b)| acc + a * b);
                dl_g.push(dg * g * (T::one() - g));
            }
            CPU.add(&mut dx, &s.ffn.backward(x, c.cache, &dy_s));
            CPU.add(&mut dx, &s.gate.backward(x, &dl_g));
        }
        dx
    }
}

impl<T> Module<T> for MixtureOfExperts<T> {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>) {
        v.module("router", &mut self.router);
        v.list("experts", &mut self.experts);
        if let Some(s) = &mut self.shared {
            v.module("shared_expert", &mut s.ffn);
            v.module("shared_expert_gate", &mut s.gate);
        }
    }
}

/// A block's FFN sublayer: the position-wise FFN of the paper, or a mixture of experts.
#[derive(Clone, Debug)]
pub enum Ffn<T> {
    Dense(Box<FeedForward<T>>),
    Experts(Box<MixtureOfExperts<T>>),
}

/// What [`Ffn`]'s forward keeps.
#[derive(Clone, Debug)]
pub enum FfnCache<T> {
    Dense(FeedForwardCache<T>),
    Experts(ExpertsCache<T>),
}

impl<T: Float> Ffn<T> {
    /// `x [rows, d_model]` -> `y [rows, d_model]`.
    pub fn forward(&self, x: &[T]) -> Vec<T> {
        match self {
            Ffn::Dense(f) => f.forward(x).0,
            Ffn::Experts(m) => m.forward(x),
        }
    }

    /// The forward with activation dropout drawn from `rng` when given.
    pub fn forward_train(&self, x: &[T], rng: Option<&mut Rng>) -> (Vec<T>, FfnCache<T>) {
        match self {
            Ffn::Dense(f) => {
                let (y, c) = f.forward_train(x, rng);
                (y, FfnCache::Dense(c))
            }
            Ffn::Experts(m) => {
                let (y, c) = m.forward_train(x, rng);
                (y, FfnCache::Experts(c))
            }
        }
    }

    /// Accumulates gradients and returns dx.
    pub fn backward(&mut self, x: &[T], cache: FfnCache<T>, dy: &[T]) -> Vec<T> {
        match (self, cache) {
            (Ffn::Dense(f), FfnCache::Dense(c)) => f.backward(x, c, dy),
            (Ffn::Experts(m), FfnCache::Experts(c)) => m.backward(x, c, dy),
            _ => unreachable!("a cache of the other kind of FFN"),
        }
    }

    /// The activation dropout (the experts': they share it).
    pub fn dropout(&self) -> f64 {
        match self {
            Ffn::Dense(f) => f.dropout,
            Ffn::Experts(m) => m.experts.first().map_or(0.0, |f| f.dropout),
        }
    }

    /// The dense FFN, `None` for a mixture.
    pub fn dense(&self) -> Option<&FeedForward<T>> {
        match self {
            Ffn::Dense(f) => Some(f),
            Ffn::Experts(_) => None,
        }
    }

}

impl<T> Module<T> for Ffn<T> {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>) {
        match self {
            Ffn::Dense(f) => f.visit(v),
            Ffn::Experts(m) => m.visit(v),
        }
    }
}

#[cfg(test)]
#[path = "experts_tests.rs"]
mod tests;
