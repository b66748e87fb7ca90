//! The position-wise feed-forward network: `FFN(x) = max(0, x W₁ᵀ + b₁) W₂ᵀ + b₂`, or with GELU
//! in place of the ReLU (BERT, GPT-2), or gated (SwiGLU, Llama):
//! `FFN(x) = (silu(x W_gateᵀ) ⊙ x W₁ᵀ) W₂ᵀ` (`linear1` is the "up", `linear2` the "down"
//! projection; biases only when the model has them), or GeGLU (Gemma):
//! `FFN(x) = (gelu_tanh(x W_gateᵀ) ⊙ x W₁ᵀ) W₂ᵀ`, or ungated with SiLU (Marian's swish):
//! `FFN(x) = silu(x W₁ᵀ + b₁) W₂ᵀ + b₂`.
//!
//! gpt-oss's experts clamp their SwiGLU ([`FeedForward::clamp`], `kernels::swiglu_clamped`):
//! `FFN(x) = ((clamp(u, −l, l) + 1) ⊙ g' σ(α g')) W₂ᵀ + b₂`, `g' = min(g, l)`,
//! `g = x W_gateᵀ + b_gate`, `u = x W₁ᵀ + b₁` (α = 1.702, l = 7).

use super::config::{Activation, SwigluClamp};
use super::linear::Linear;
use super::param::{Init, Module, ParamVisitor};
use crate::backend::{Backend, CPU};
use crate::rng::Rng;
use crate::Float;

/// Linear(d_model, d_ff) -> activation -> Linear(d_ff, d_model); gated: the activation is
/// `silu(gate) ⊙ linear1`.
#[derive(Clone, Debug)]
pub struct FeedForward<T> {
    pub linear1: Linear<T>,
    pub linear2: Linear<T>,
    /// `W_gate [d_ff, d_model]` of a gated FFN ([`Activation::SiluGated`],
    /// [`Activation::GeluTanhGated`]).
    pub gate: Option<Linear<T>>,
    pub activation: Activation,
    /// Activation dropout: the probability of dropping each hidden unit after the activation
    /// during training (0 in the paper).
    pub dropout: f64,
    /// With [`Activation::SiluGated`]: gpt-oss's clamped form of the SwiGLU (see the module
    /// docs); `None`: the plain one.
    pub clamp: Option<SwigluClamp>,
}

/// What the FFN forward keeps: the activation's output after dropout (the second linear's input;
/// for ReLU its sign is also the derivative wherever the unit was kept), the dropout mask and,
/// for GELU, the activation's input.
#[derive(Clone, Debug)]
pub struct FeedForwardCache<T> {
    /// [rows, d_ff]
    pub hidden: Vec<T>,
    /// [rows, d_ff], the activation-dropout mask (factors 0 or 1/(1 − p)).
    pub dropout_mask: Option<Vec<T>>,
    /// [rows, d_ff], the first linear's output (gated: the gate's); empty for ReLU, which does
    /// not need it.
    pub pre_activation: Vec<T>,
    /// [rows, d_ff], gated only: the first linear's ("up") output.
    pub up: Vec<T>,
}

impl<T: Float> FeedForward<T> {
    pub fn new(d_model: usize, d_ff: usize, activation: Activation, init: &mut impl Init) -> Self {
        Self::with_bias(d_model, d_ff, activation, true, init)
    }

    /// Parameters drawn in the order linear1, linear2 (and the gate when gated); biases only
    /// when `bias`.
    pub fn with_bias(
        d_model: usize,
        d_ff: usize,
        activation: Activation,
        bias: bool,
        init: &mut impl Init,
    ) -> Self {
        let linear1 = Linear::with_bias(d_model, d_ff, bias, init);
        let linear2 = Linear::with_bias(d_ff, d_model, bias, init);
        let gate = activation
            .is_gated()
            .then(|| Linear::with_bias(d_model, d_ff, bias, init));
        FeedForward {
            linear1,
            linear2,
            gate,
            activation,
            dropout: 0.0,
            clamp: None,
        }
    }

    /// The same FFN with activation dropout `p`.
    pub fn with_dropout(mut self, p: f64) -> Self {
        self.dropout = p;
        self
    }

    /// `x [rows, d_model]` -> `y [rows, d_model]`.
    pub fn forward(&self, x: &[T]) -> (Vec<T>, FeedForwardCache<T>) {
        self.forward_train(x, None)
    }

    /// [`forward`](Self::forward) with activation dropout drawn from `rng` when it is given and
    /// [`dropout`](Self::dropout) is positive: `y = (act(x W₁ᵀ + b₁) ⊙ M) W₂ᵀ + b₂`.
    pub fn forward_train(&self, x: &[T], rng: Option<&mut Rng>) -> (Vec<T>, FeedForwardCache<T>) {
        let mut up = Vec::new();
        let (mut hidden, pre_activation) = match self.activation {
            // hidden: [rows, d_ff], bias and ReLU fused
            Activation::Relu => (self.linear1.forward_relu(x), Vec::new()),
            Activation::SiluGated => {
                // gate, up, hidden: [rows, d_ff]
                let gate = self.gate.as_ref().expect("a gated FFN has a gate");
                let g = gate.forward(x);
                up = self.linear1.forward(x);
                let mut hidden = vec![T::zero(); g.len()];
                match self.clamp {
                    None => CPU.swiglu(&mut hidden, &g, &up),
                    Some(c) => CPU.swiglu_clamped(&mut hidden, &g, &up, (c.alpha, c.limit)),
                }
                (hidden, g)
            }
            Activation::GeluTanhGated => {
                // gate, up, hidden: [rows, d_ff]; hidden = gelu_tanh(gate) ⊙ up
                let gate = self.gate.as_ref().expect("a gated FFN has a gate");
                let g = gate.forward(x);
                up = self.linear1.forward(x);
                let mut hidden = vec![T::zero(); g.len()];
                CPU.gelu_tanh(&mut hidden, &g);
                CPU.mul(&mut hidden, &up);
                (hidden, g)
            }
            Activation::GeluErf | Activation::GeluTanh | Activation::Silu => {
                // pre: [rows, d_ff]
                let pre = self.linear1.forward(x);
                let mut hidden = vec![T::zero(); pre.len()];
                match self.activation {
                    Activation::GeluErf => CPU.gelu_erf(&mut hidden, &pre),
                    Activation::Silu => CPU.silu(&mut hidden, &pre),
                    _ => CPU.gelu_tanh(&mut hidden, &pre),
                }
                (hidden, pre)
            }
        };
        let dropout_mask = rng.and_then(|r| CPU.dropout_mask(r, hidden.len(), self.dropout));
        if let Some(m) = &dropout_mask {
            CPU.mul(&mut hidden, m);
        }
        let y = self.linear2.forward(&hidden);
        (
            y,
            FeedForwardCache {
                hidden,
                dropout_mask,
                pre_activation,
                up,
            },
        )
    }

    /// Accumulates the gradients of both linears and returns dx.
    pub fn backward(&mut self, x: &[T], cache: FeedForwardCache<T>, dy: &[T]) -> Vec<T> {
        let mut dhidden = self.linear2.backward(&cache.hidden, dy);
        let mask = cache.dropout_mask.as_deref();
        match self.activation {
            // The mask and the ReLU's derivative in one pass.
            Activation::Relu => CPU.relu_backward(&mut dhidden, &cache.hidden, mask),
            Activation::SiluGated | Activation::GeluTanhGated => {
                if let Some(m) = mask {
                    CPU.mul(&mut dhidden, m);
                }
                let n = dhidden.len();
                let (mut dgate, mut dup) = (vec![T::zero(); n], vec![T::zero(); n]);
                let (g, u) = (&cache.pre_activation, &cache.up);
                if let (Activation::SiluGated, Some(c)) = (self.activation, self.clamp) {
                    let clamp = (c.alpha, c.limit);
                    CPU.swiglu_clamped_backward((&mut dgate, &mut dup), &dhidden, g, u, clamp);
                } else if self.activation == Activation::SiluGated {
                    CPU.swiglu_backward((&mut dgate, &mut dup), &dhidden, g, u);
                } else {
                    // dup = dh ⊙ gelu_tanh(g), dgate = dh ⊙ u ⊙ gelu_tanh'(g)
                    CPU.gelu_tanh(&mut dup, g);
                    CPU.mul(&mut dup, &dhidden);
                    dgate.copy_from_slice(&dhidden);
                    CPU.mul(&mut dgate, u);
                    CPU.gelu_tanh_backward(&mut dgate, g);
                }
                let gate = self.gate.as_mut().expect("a gated FFN has a gate");
                let mut dx = gate.backward(x, &dgate);
                CPU.add(&mut dx, &self.linear1.backward(x, &dup));
                return dx;
            }
            Activation::GeluErf | Activation::GeluTanh | Activation::Silu => {
                if let Some(m) = mask {
                    CPU.mul(&mut dhidden, m);
                }
                let pre = &cache.pre_activation;
                match self.activation {
                    Activation::GeluErf => CPU.gelu_erf_backward(&mut dhidden, pre),
                    Activation::Silu => CPU.silu_backward(&mut dhidden, pre),
                    _ => CPU.gelu_tanh_backward(&mut dhidden, pre),
                }
            }
        }
        self.linear1.backward(x, &dhidden)
    }
}

impl<T> Module<T> for FeedForward<T> {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>) {
        v.module("linear1", &mut self.linear1);
        v.module("linear2", &mut self.linear2);
        v.optional("gate", self.gate.as_mut());
    }
}
