//! Element-wise activations and their derivatives.

use crate::Float;
use rayon::prelude::*;

/// Below this many elements the loops stay on one thread.
const PAR_MIN: usize = 1 << 14;

/// `x ← max(x, 0)` (the paper's FFN activation).
pub fn relu_inplace<T: Float>(x: &mut [T]) {
    if x.len() < PAR_MIN {
        x.iter_mut().for_each(|v| *v = v.max(T::zero()));
    } else {
        x.par_iter_mut().for_each(|v| *v = v.max(T::zero()));
    }
}

/// `dy ← dy ⊙ 1[y > 0]`, given the ReLU output `y`.
pub fn relu_backward_inplace<T: Float>(dy: &mut [T], y: &[T]) {
    let f = |(g, &v): (&mut T, &T)| {
        if v <= T::zero() {
            *g = T::zero();
        }
    };
    if dy.len() < PAR_MIN {
        dy.iter_mut().zip(y).for_each(f);
    } else {
        dy.par_iter_mut().zip(y.par_iter()).for_each(f);
    }
}

/// `y += x` element-wise (residual connections).
pub fn add_inplace<T: Float>(y: &mut [T], x: &[T]) {
    assert_eq!(y.len(), x.len());
    if y.len() < PAR_MIN {
        y.iter_mut().zip(x).for_each(|(a, &b)| *a += b);
    } else {
        y.par_iter_mut()
            .zip(x.par_iter())
            .for_each(|(a, &b)| *a += b);
    }
}

/// `y *= m` element-wise (dropout masks).
pub fn mul_inplace<T: Float>(y: &mut [T], m: &[T]) {
    assert_eq!(y.len(), m.len());
    if y.len() < PAR_MIN {
        y.iter_mut().zip(m).for_each(|(a, &b)| *a *= b);
    } else {
        y.par_iter_mut()
            .zip(m.par_iter())
            .for_each(|(a, &b)| *a *= b);
    }
}
