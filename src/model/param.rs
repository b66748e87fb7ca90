//! Parameters: a trainable tensor with its gradient, how parameters are initialised, and the one
//! walk over a model's named parameters.
//!
//! Names mirror the module tree (`encoder.layers.0.self_attn.q_proj.weight`): every module
//! lists its children once, in [`Module::visit`], with the name of each, and the
//! [`ParamVisitor`] joins the path. Saving, loading, the optimizer, data parallelism, checkpoint
//! averaging and parameter counts all go through that one walk, in one fixed order. The same
//! walk, told to stop at linear layers ([`ParamVisitor::linears`]), is how every operation on
//! all the linear layers of a model (inference copies, packing, bf16 products, a GGUF file's
//! blocks) finds them: see [`super::linear::for_each_linear`].

use super::linear::Linear;
use crate::rng::Rng;
use crate::{Float, Tensor};

/// A trainable tensor and its gradient (same shape).
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
    pub fn xavier(shape: &[usize], fan_in: usize, fan_out: usize, rng: &mut Rng) -> Self {
        let a = (6.0 / (fan_in + fan_out) as f64).sqrt();
        let mut t = Tensor::zeros(shape);
        t.data
            .iter_mut()
            .for_each(|v| *v = T::of(rng.uniform_range(-a, a)));
        Param::new(t)
    }

    /// A parameter that has a shape and no values (see [`ShapesOnly`]).
    fn shape_only(shape: &[usize]) -> Self {
        let empty = || Tensor {
            data: Vec::new(),
            shape: shape.to_vec(),
        };
        Param {
            value: empty(),
            grad: empty(),
        }
    }

    /// The number of scalars its shape holds (`None` on overflow), whether or not its values
    /// are allocated.
    pub fn numel(&self) -> Option<usize> {
        self.value
            .shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
    }
}

/// How a model's constructor creates its parameters: drawn from a generator ([`Rng`]: every
/// model's random initialisation), or as shapes without values ([`ShapesOnly`]: the parameter
/// count of a configuration, checked against a weights file before anything is allocated).
/// Constructors take `&mut impl Init` and draw their parameters in a fixed order.
pub trait Init {
    /// Xavier-uniform (see [`Param::xavier`]).
    fn xavier<T: Float>(&mut self, shape: &[usize], fan_in: usize, fan_out: usize) -> Param<T>;
    /// Filled with `c`.
    fn constant<T: Float>(&mut self, shape: &[usize], c: f64) -> Param<T>;
    /// Whether tables that are not parameters (the sinusoids) should be computed.
    fn computes(&self) -> bool;
}

impl Init for Rng {
    fn xavier<T: Float>(&mut self, shape: &[usize], fan_in: usize, fan_out: usize) -> Param<T> {
        Param::xavier(shape, fan_in, fan_out, self)
    }
    fn constant<T: Float>(&mut self, shape: &[usize], c: f64) -> Param<T> {
        Param::constant(shape, c)
    }
    fn computes(&self) -> bool {
        true
    }
}

/// Builds a model's structure with every parameter's shape and no values: a model built this
/// way is only for [`count_params`], never for computing.
pub struct ShapesOnly;

impl Init for ShapesOnly {
    fn xavier<T: Float>(&mut self, shape: &[usize], _: usize, _: usize) -> Param<T> {
        Param::shape_only(shape)
    }
    fn constant<T: Float>(&mut self, shape: &[usize], _: f64) -> Param<T> {
        Param::shape_only(shape)
    }
    fn computes(&self) -> bool {
        false
    }
}

/// Builds a model's structure with every parameter's shape and no values yet, the tables that
/// are not parameters computed: a model about to be filled from a weights file
/// ([`super::checkpoint::build_filled`] allocates each parameter as it writes its values, so
/// nothing is drawn at random only to be overwritten, and a tensor kept in its stored
/// low-precision format never gets a float32 copy).
pub struct Unfilled;

impl Init for Unfilled {
    fn xavier<T: Float>(&mut self, shape: &[usize], _: usize, _: usize) -> Param<T> {
        Param::shape_only(shape)
    }
    fn constant<T: Float>(&mut self, shape: &[usize], _: f64) -> Param<T> {
        Param::shape_only(shape)
    }
    fn computes(&self) -> bool {
        true
    }
}

/// Anything that owns parameters lists them, each under its name, in one fixed order.
pub trait Module<T> {
    /// Calls `v.param(name, p)` for each own parameter and `v.module(name, m)` for each child.
    /// A mutable visit may change the weights, so it drops any prepared inference copies.
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>);

    /// This module as a linear layer, if it is one (only [`Linear`] answers): where a walk
    /// over the linear layers ([`ParamVisitor::linears`]) stops instead of descending.
    fn as_linear(&mut self) -> Option<&mut Linear<T>> {
        None
    }

    /// Every parameter with its full name (`prefix.path.name`, or `path.name` for an empty
    /// prefix), in visiting order.
    fn named_params(&mut self, prefix: &str) -> Vec<(String, &mut Param<T>)>
    where
        Self: Sized,
    {
        let mut v = ParamVisitor::new(prefix);
        self.visit(&mut v);
        v.params
    }

    /// Every parameter under its checkpoint name (the module path from this module).
    fn params_mut(&mut self) -> Vec<(String, &mut Param<T>)>
    where
        Self: Sized,
    {
        self.named_params("")
    }

    /// The number of trainable scalars held.
    fn n_params(&mut self) -> usize
    where
        Self: Sized,
    {
        self.params_mut()
            .iter()
            .map(|(_, p)| p.value.data.len())
            .sum()
    }

    /// Sets every gradient to zero.
    fn zero_grads(&mut self)
    where
        Self: Sized,
        T: Float,
    {
        for (_, p) in self.params_mut() {
            p.grad.fill_zero();
        }
    }
}

/// What a walk over the linear layers does to each: `(module path, layer)`.
type OnLinear<'a, T> = Box<dyn FnMut(&str, &mut Linear<T>) + 'a>;

/// Collects `(name, parameter)` pairs, the name joined from the module path with `.`; or,
/// made by [`linears`](Self::linears), hands each linear layer to a callback instead.
pub struct ParamVisitor<'a, T> {
    path: Vec<String>,
    params: Vec<(String, &'a mut Param<T>)>,
    /// Set for a walk over the linear layers: called on each instead of visiting it, and no
    /// parameter is collected (so nothing is handed out to change, and no module drops its
    /// prepared copies).
    on_linear: Option<OnLinear<'a, T>>,
}

impl<'a, T> ParamVisitor<'a, T> {
    /// A visitor whose names start with `prefix` (none when empty).
    pub fn new(prefix: &str) -> Self {
        ParamVisitor {
            path: (!prefix.is_empty())
                .then(|| prefix.to_string())
                .into_iter()
                .collect(),
            params: Vec::new(),
            on_linear: None,
        }
    }

    /// A walk that calls `f(path, layer)` on every linear layer reached through
    /// [`module`](Self::module) (module paths without a prefix, e.g. `layers.0.self_attn.q_proj`),
    /// in visiting order, and collects no parameters.
    pub fn linears(f: impl FnMut(&str, &mut Linear<T>) + 'a) -> Self {
        ParamVisitor {
            on_linear: Some(Box::new(f)),
            ..ParamVisitor::new("")
        }
    }

    /// A parameter of the module being visited.
    pub fn param(&mut self, name: &str, p: &'a mut Param<T>) {
        if self.on_linear.is_some() {
            return;
        }
        let mut full = self.path.join(".");
        if !full.is_empty() {
            full.push('.');
        }
        full.push_str(name);
        self.params.push((full, p));
    }

    /// A child module, its parameters named under `name`.
    pub fn module(&mut self, name: &str, m: &'a mut impl Module<T>) {
        self.path.push(name.to_string());
        if let Some(f) = self.on_linear.as_mut() {
            if let Some(linear) = m.as_linear() {
                f(&self.path.join("."), linear);
                self.path.pop();
                return;
            }
        }
        m.visit(self);
        self.path.pop();
    }

    /// A child module that may be absent (a pre-LN final norm, an untied projection).
    pub fn optional(&mut self, name: &str, m: Option<&'a mut impl Module<T>>) {
        if let Some(m) = m {
            self.module(name, m);
        }
    }

    /// A list of modules, named `name.0`, `name.1`, ...
    pub fn list<M: Module<T>>(&mut self, name: &str, ms: &'a mut [M]) {
        self.path.push(name.to_string());
        for (i, m) in ms.iter_mut().enumerate() {
            self.module(&i.to_string(), m);
        }
        self.path.pop();
    }

    /// What was collected.
    pub fn into_params(self) -> Vec<(String, &'a mut Param<T>)> {
        self.params
    }
}

/// The number of trainable scalars of `model` from its parameters' shapes (`None` on
/// overflow); works on a model built with [`ShapesOnly`].
pub fn count_params<T>(model: &mut impl Module<T>) -> Option<usize> {
    model.named_params("").iter().try_fold(0usize, |n, (_, p)| {
        p.value
            .shape
            .iter()
            .try_fold(1usize, |m, &d| m.checked_mul(d))
            .and_then(|m| n.checked_add(m))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Leaf {
        w: Param<f32>,
    }
    impl Module<f32> for Leaf {
        fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, f32>) {
            v.param("weight", &mut self.w);
        }
    }
    struct Tree {
        leaves: Vec<Leaf>,
        extra: Option<Leaf>,
        own: Param<f32>,
    }
    impl Module<f32> for Tree {
        fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, f32>) {
            v.list("layers", &mut self.leaves);
            v.optional("final", self.extra.as_mut());
            v.param("bias", &mut self.own);
        }
    }

    #[test]
    fn names_follow_the_module_path_and_counts_the_shapes() {
        let leaf = |n: usize| Leaf {
            w: ShapesOnly.constant(&[n, 3], 0.0),
        };
        let mut tree = Tree {
            leaves: vec![leaf(2), leaf(5)],
            extra: Some(leaf(1)),
            own: Param::constant(&[4], 1.0),
        };
        let names: Vec<String> = tree.named_params("").into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            ["layers.0.weight", "layers.1.weight", "final.weight", "bias"]
        );
        let names: Vec<String> = tree.named_params("m").into_iter().map(|(n, _)| n).collect();
        assert_eq!(names[0], "m.layers.0.weight");
        assert_eq!(count_params(&mut tree), Some(6 + 15 + 3 + 4));
        tree.extra = None;
        assert_eq!(count_params(&mut tree), Some(6 + 15 + 4));
        assert!(tree.leaves[0].w.value.data.is_empty());
        let mut huge = Leaf {
            w: ShapesOnly.constant(&[usize::MAX, 2], 0.0),
        };
        assert_eq!(count_params(&mut huge), None);
        assert_eq!(huge.w.numel(), None);
    }
}
