//! The residual connection around every sublayer (section 3.1 and 5.4):
//! post-LN (the paper) `y = LayerNorm(x + Dropout(Sublayer(x)))`, or
//! pre-LN `y = x + Dropout(Sublayer(LayerNorm(x)))`; the norm a layer norm or an RMSNorm
//! ([`Norm`]). Pre-LN with a post-norm as well (Gemma 2 and 3, "sandwich" norms):
//! `y = x + Dropout(PostNorm(Sublayer(Norm(x))))`; with the input norm the identity and a
//! post-norm (OLMo 2): `y = x + Dropout(PostNorm(Sublayer(x)))`.
//!
//! A residual scale `m` (Granite's `residual_multiplier`) multiplies what is added:
//! pre-LN `y = x + Dropout(m · PostNorm(Sublayer(Norm(x))))`, post-LN
//! `y = Norm(x + Dropout(m · Sublayer(x)))`; its backward multiplies the gradient reaching the
//! sublayer by the same `m` (`∂y/∂s = m`, the identity path unchanged).

use super::config::NormPlacement;
use super::layer_norm::LayerNorm;
use super::norm::{Norm, NormStats};
use super::param::{Init, Module, ParamVisitor};
use crate::backend::{Backend, CPU};
use crate::rng::Rng;
use crate::Float;

/// A residual connection with its layer norm and dropout.
#[derive(Clone, Debug)]
pub struct Residual<T> {
    pub norm: Norm<T>,
    pub placement: NormPlacement,
    pub dropout: f64,
    /// Pre-LN only: a norm of the sublayer's output before it is added (Gemma's post-norms);
    /// `None`: the output is added as it is.
    pub post_norm: Option<Norm<T>>,
    /// `m`, the factor of what is added to the residual stream (Granite); `None`: 1.
    pub scale: Option<f64>,
}

/// What a residual forward keeps: its input, what the sublayer saw and kept, the dropout mask,
/// and the layer-norm input and statistics.
#[derive(Clone, Debug)]
pub struct ResidualCache<T, C> {
    /// x [rows, d_model]
    pub input: Vec<T>,
    /// Pre-LN only: LayerNorm(x), the sublayer's input.
    pub normed_input: Option<Vec<T>>,
    /// What the sublayer saved for its own backward.
    pub sublayer: C,
    pub dropout_mask: Option<Vec<T>>,
    /// Post-LN only: x + Dropout(Sublayer(x)), the norm's input.
    pub sum: Option<Vec<T>>,
    pub norm_stats: NormStats<T>,
    /// With a post-norm: the sublayer's output (the post-norm's input) and its statistics.
    pub post: Option<PostNormSaved<T>>,
}

/// What a post-norm's backward needs: its input `[rows, d_model]` (the sublayer's output) and
/// statistics.
pub type PostNormSaved<T> = (Vec<T>, NormStats<T>);

impl<T: Float> Residual<T> {
    pub fn new(
        d_model: usize,
        eps: f64,
        placement: NormPlacement,
        dropout: f64,
        init: &mut impl Init,
    ) -> Self {
        Residual {
            norm: Norm::Layer(LayerNorm::with_init(d_model, eps, init)),
            placement,
            dropout,
            post_norm: None,
            scale: None,
        }
    }

    /// A connection around `norm` (a layer norm or an RMSNorm).
    pub fn with_norm(norm: Norm<T>, placement: NormPlacement, dropout: f64) -> Self {
        Residual {
            norm,
            placement,
            dropout,
            post_norm: None,
            scale: None,
        }
    }

    /// The same connection with `post_norm` on the sublayer's output (pre-LN only; see
    /// [`post_norm`](Self::post_norm)).
    pub fn with_post_norm(mut self, post_norm: Option<Norm<T>>) -> Self {
        assert!(
            post_norm.is_none() || self.placement == NormPlacement::PreLn,
            "a post-norm needs pre-LN placement"
        );
        self.post_norm = post_norm;
        self
    }

    /// The same connection adding `scale · output` (see [`scale`](Self::scale)).
    pub fn with_scale(mut self, scale: Option<f64>) -> Self {
        self.scale = scale;
        self
    }

    /// `y ← m · y` with a residual scale `m` (nothing otherwise): the forward's scaling of the
    /// sublayer's output, and the backward's of its gradient.
    fn scaled(&self, y: &mut [T]) {
        if let Some(m) = self.scale {
            let m = T::of(m);
            y.iter_mut().for_each(|v| *v *= m);
        }
    }

    /// The post-norm of the sublayer's output `y` when there is one (`y` as it is otherwise),
    /// with what its backward needs.
    fn post_normed(&self, y: Vec<T>) -> (Vec<T>, Option<PostNormSaved<T>>) {
        match &self.post_norm {
            None => (y, None),
            Some(norm) => {
                let (normed, stats) = norm.forward(&y);
                (normed, Some((y, stats)))
            }
        }
    }

    /// Runs `sublayer` inside the residual connection. Dropout when `rng` is given.
    pub fn forward<C>(
        &self,
        x: Vec<T>,
        rng: Option<&mut Rng>,
        sublayer: impl FnOnce(&[T]) -> (Vec<T>, C),
    ) -> (Vec<T>, ResidualCache<T, C>) {
        match self.placement {
            NormPlacement::PostLn => {
                let (mut sum, inner) = sublayer(&x);
                self.scaled(&mut sum);
                let dropout_mask = rng.and_then(|r| CPU.dropout_mask(r, sum.len(), self.dropout));
                CPU.dropout_add(&mut sum, dropout_mask.as_deref(), &x);
                let (y, norm_stats) = self.norm.forward(&sum);
                let cache = ResidualCache {
                    input: x,
                    normed_input: None,
                    sublayer: inner,
                    dropout_mask,
                    sum: Some(sum),
                    norm_stats,
                    post: None,
                };
                (y, cache)
            }
            NormPlacement::PreLn => {
                let (normed, norm_stats) = self.norm.forward(&x);
                let (y, inner) = sublayer(&normed);
                let (mut y, post) = self.post_normed(y);
                self.scaled(&mut y);
                let dropout_mask = rng.and_then(|r| CPU.dropout_mask(r, y.len(), self.dropout));
                CPU.dropout_add(&mut y, dropout_mask.as_deref(), &x);
                let cache = ResidualCache {
                    input: x,
                    normed_input: Some(normed),
                    sublayer: inner,
                    dropout_mask,
                    sum: None,
                    norm_stats,
                    post,
                };
                (y, cache)
            }
        }
    }

    /// [`forward`](Self::forward) around a sublayer with a dropout of its own (attention
    /// weights, FFN activations) of probability `inner_p`: the sublayer gets a generator forked
    /// from `rng`, only when it has something to drop (see [`fork_for`]).
    pub fn forward_inner<C>(
        &self,
        x: Vec<T>,
        mut rng: Option<&mut Rng>,
        inner_p: f64,
        sublayer: impl FnOnce(&[T], Option<&mut Rng>) -> (Vec<T>, C),
    ) -> (Vec<T>, ResidualCache<T, C>) {
        let mut inner = CPU.dropout_rng(rng.as_deref_mut(), inner_p);
        self.forward(x, rng, |u| sublayer(u, inner.as_mut()))
    }

    /// Backward through the connection. `sublayer_backward(sublayer_input, saved, d_output)`
    /// must return the gradient with respect to the sublayer's input.
    pub fn backward<C>(
        &mut self,
        cache: ResidualCache<T, C>,
        dy: &[T],
        sublayer_backward: impl FnOnce(&[T], C, &[T]) -> Vec<T>,
    ) -> Vec<T> {
        let ResidualCache {
            input,
            normed_input,
            sublayer,
            dropout_mask,
            sum,
            norm_stats,
            post,
        } = cache;
        match self.placement {
            NormPlacement::PostLn => {
                let sum = sum.expect("post-LN cache keeps the sum");
                let dsum = self.norm.backward(&sum, &norm_stats, dy);
                let mut dsub = dsum.clone();
                if let Some(m) = &dropout_mask {
                    CPU.mul(&mut dsub, m);
                }
                self.scaled(&mut dsub);
                let mut dx = sublayer_backward(&input, sublayer, &dsub);
                CPU.add(&mut dx, &dsum);
                dx
            }
            NormPlacement::PreLn => {
                let normed = normed_input.expect("pre-LN cache keeps the normed input");
                let mut dsub = dy.to_vec();
                if let Some(m) = &dropout_mask {
                    CPU.mul(&mut dsub, m);
                }
                self.scaled(&mut dsub);
                if let (Some(norm), Some((y, stats))) = (&mut self.post_norm, &post) {
                    dsub = norm.backward(y, stats, &dsub);
                }
                let dnormed = sublayer_backward(&normed, sublayer, &dsub);
                let mut dx = self.norm.backward(&input, &norm_stats, &dnormed);
                CPU.add(&mut dx, dy);
                dx
            }
        }
    }

    /// Inference: the same computation without dropout and without saving anything.
    pub fn apply(&self, x: Vec<T>, sublayer: impl FnOnce(&[T]) -> Vec<T>) -> Vec<T> {
        self.forward(x, None, |input| (sublayer(input), ())).0
    }

    /// [`apply`](Self::apply) when only the last of every `q_len` rows of the output is wanted
    /// (the last position of each prompt in `x [batch*q_len, d]`): `sublayer` gets the whole
    /// (pre-LN: normalised) input and returns its output for those rows only, `[batch, d]`; the
    /// residual sum and (post-LN) the norm run on those rows only.
    pub fn apply_last(
        &self,
        x: Vec<T>,
        q_len: usize,
        d: usize,
        sublayer: impl FnOnce(&[T]) -> Vec<T>,
    ) -> Vec<T> {
        let x_last = last_rows(&x, q_len, d);
        match self.placement {
            NormPlacement::PostLn => {
                let mut sum = sublayer(&x);
                self.scaled(&mut sum);
                CPU.add(&mut sum, &x_last);
                self.norm.forward(&sum).0
            }
            NormPlacement::PreLn => {
                let (normed, _) = self.norm.forward(&x);
                let (mut y, _) = self.post_normed(sublayer(&normed));
                self.scaled(&mut y);
                CPU.add(&mut y, &x_last);
                y
            }
        }
    }
}

/// The last of every `q_len` rows of `x [batch*q_len, d]`: `[batch, d]`.
pub fn last_rows<T: Float>(x: &[T], q_len: usize, d: usize) -> Vec<T> {
    assert!(
        q_len > 0 && x.len().is_multiple_of(q_len * d),
        "x is not [batch*q_len, d]"
    );
    x.chunks_exact(q_len * d)
        .flat_map(|seq| &seq[(q_len - 1) * d..])
        .copied()
        .collect()
}

/// A residual connection's parameters are its norm's: `weight` and `bias` under the
/// connection's own name (`self_attn_norm`, `ffn_norm`, ...). A post-norm is not among them:
/// the block names it (`self_attn_post_norm`, `ffn_post_norm`).
impl<T> Module<T> for Residual<T> {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>) {
        self.norm.visit(v);
    }
}
