//! Numerically stable softmax and log-softmax over rows (the max is subtracted first).

use crate::Float;

/// `x ← softmax(x)` over the first `valid` entries; entries at or past `valid` get exactly 0.
/// With `valid == 0` the whole row is 0 (a query that may attend to nothing).
pub fn softmax_inplace<T: Float>(row: &mut [T], valid: usize) {
    let valid = valid.min(row.len());
    let (live, masked) = row.split_at_mut(valid);
    masked.iter_mut().for_each(|x| *x = T::zero());
    if live.is_empty() {
        return;
    }
    let max = live.iter().fold(T::neg_infinity(), |m, &x| m.max(x));
    let mut sum = T::zero();
    for x in live.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    let inv = T::one() / sum;
    live.iter_mut().for_each(|x| *x *= inv);
}

/// `x ← log softmax(x)` over the whole row; returns the log-sum-exp that was subtracted.
pub fn log_softmax_inplace<T: Float>(row: &mut [T]) -> T {
    let max = row.iter().fold(T::neg_infinity(), |m, &x| m.max(x));
    let sum: T = row.iter().map(|&x| (x - max).exp()).sum();
    let lse = max + sum.ln();
    row.iter_mut().for_each(|x| *x -= lse);
    lse
}

/// Backward of softmax for one row: `ds_j = p_j (dp_j − Σ_k p_k dp_k)`, written over `dp`.
pub fn softmax_backward_inplace<T: Float>(dp: &mut [T], p: &[T]) {
    let dot: T = dp.iter().zip(p).map(|(&g, &q)| g * q).sum();
    for (g, &q) in dp.iter_mut().zip(p) {
        *g = q * (*g - dot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_is_stable_and_masks_exactly() {
        let mut row = vec![1000.0f32, 1001.0, 999.0, 5.0];
        softmax_inplace(&mut row, 3);
        assert_eq!(row[3], 0.0);
        let e = [(-1.0f64).exp(), 1.0, (-2.0f64).exp()];
        let s: f64 = e.iter().sum();
        for i in 0..3 {
            assert!((row[i] as f64 - e[i] / s).abs() < 1e-6);
        }
        let mut lrow = vec![1000.0f64, 1001.0, 999.0];
        let lse = log_softmax_inplace(&mut lrow);
        assert!((lse - (1001.0 + s.ln())).abs() < 1e-9);
        assert!((lrow[1] - (-s.ln())).abs() < 1e-12);
        let mut none = vec![3.0f64; 2];
        softmax_inplace(&mut none, 0);
        assert_eq!(none, vec![0.0, 0.0]);
    }
}
