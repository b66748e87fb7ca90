//! The plain buffer + shape type, and the scalar trait every layer is generic over.
//!
//! Training runs in `f32`; the gradient tests run the very same code in `f64` so that central
//! finite differences are accurate to ~1e-9 and a wrong backward cannot hide in rounding.

use std::fmt::Debug;
use std::iter::Sum;
use std::ops::{AddAssign, DivAssign, MulAssign, SubAssign};

/// A real scalar the model can run in: `f32` for speed, `f64` for the reference checks.
pub trait Float:
    num_traits::Float
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
    + Sum
    + Default
    + Debug
    + Send
    + Sync
    + 'static
{
    /// Converts from f64 (rounding to nearest for f32).
    fn of(x: f64) -> Self;
    /// Widens to f64.
    fn f64(self) -> f64;
    /// `eˣ` in straight-line arithmetic that vectorises (f32: `exp_f32`,
    /// within 2 ulp; f64: the exact library `exp`, so the reference checks stay exact).
    fn exp_vec(self) -> Self;
    /// The slice as f32, when `Self` is f32 (the low-precision kernels take f32 only).
    fn as_f32(s: &[Self]) -> Option<&[f32]>;
    /// The mutable slice as f32, when `Self` is f32.
    fn as_f32_mut(s: &mut [Self]) -> Option<&mut [f32]>;
}

impl Float for f32 {
    #[inline(always)]
    fn of(x: f64) -> Self {
        x as f32
    }
    #[inline(always)]
    fn f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn exp_vec(self) -> Self {
        crate::kernels::softmax::exp_f32(self)
    }
    fn as_f32(s: &[Self]) -> Option<&[f32]> {
        Some(s)
    }
    fn as_f32_mut(s: &mut [Self]) -> Option<&mut [f32]> {
        Some(s)
    }
}

impl Float for f64 {
    #[inline(always)]
    fn of(x: f64) -> Self {
        x
    }
    #[inline(always)]
    fn f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn exp_vec(self) -> Self {
        self.exp()
    }
    fn as_f32(_: &[Self]) -> Option<&[f32]> {
        None
    }
    fn as_f32_mut(_: &mut [Self]) -> Option<&mut [f32]> {
        None
    }
}

/// A contiguous row-major buffer with an explicit shape. Nothing clever: layers index `data`
/// directly and write the shape of every tensor where it is born.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor<T> {
    /// The elements in row-major order, `shape.iter().product()` of them.
    pub data: Vec<T>,
    /// The size of each dimension, outermost first.
    pub shape: Vec<usize>,
}

impl<T: Float> Tensor<T> {
    /// A tensor of zeros with the given shape.
    pub fn zeros(shape: &[usize]) -> Self {
        let n = shape.iter().product();
        Tensor {
            data: vec![T::zero(); n],
            shape: shape.to_vec(),
        }
    }

    /// Wraps a buffer; panics if the length does not match the shape (a programming error).
    pub fn from_vec(data: Vec<T>, shape: &[usize]) -> Self {
        assert_eq!(
            data.len(),
            shape.iter().product::<usize>(),
            "buffer length does not match shape {shape:?}"
        );
        Tensor {
            data,
            shape: shape.to_vec(),
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when the tensor holds no element.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Sets every element to zero, keeping the allocation.
    pub fn fill_zero(&mut self) {
        self.data.iter_mut().for_each(|x| *x = T::zero());
    }

    /// Converts element-wise to another float type.
    pub fn cast<U: Float>(&self) -> Tensor<U> {
        Tensor {
            data: self.data.iter().map(|&x| U::of(x.f64())).collect(),
            shape: self.shape.clone(),
        }
    }
}
