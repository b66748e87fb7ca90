//! How a query·key dot product becomes an attention score before the mask and the softmax:
//!
//! `s = scale · q·k`, then, with a soft cap `c` (Gemma 2), `s ← c · tanh(s / c)`,
//!
//! where `scale` is the paper's `1/√d_k` unless the model states its own (Gemma's
//! `query_pre_attn_scalar^(−1/2)`). The cap keeps every score inside `(−c, c)`; its derivative,
//! which the backward passes multiply the score gradients by, is
//! `∂s/∂(scale · q·k) = 1 − tanh² = 1 − (s/c)²`, read from the capped score itself.

use crate::Float;

/// The score function of an attention call (see the module's doc). The default is the paper's:
/// `q·k / √d_k`, uncapped.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Scores {
    /// The factor of the dot products; `None`: `1/√d_k`.
    pub scale: Option<f64>,
    /// The soft cap `c > 0` of the scaled scores; `None`: scores as they are.
    pub softcap: Option<f64>,
}

impl Scores {
    /// The factor of the dot products for heads of `d_head` columns.
    pub fn scale<T: Float>(&self, d_head: usize) -> T {
        T::of(self.scale.unwrap_or(1.0 / (d_head as f64).sqrt()))
    }

    /// Caps scaled scores in place, `s ← c · tanh(s / c)` (nothing without a cap).
    pub fn cap<T: Float>(&self, scores: &mut [T]) {
        if let Some(c) = self.softcap {
            let c = T::of(c);
            scores.iter_mut().for_each(|s| *s = c * (*s / c).tanh());
        }
    }

    /// One capped score (see [`cap`](Self::cap)).
    pub fn cap_one<T: Float>(&self, s: T) -> T {
        match self.softcap {
            Some(c) => {
                let c = T::of(c);
                c * (s / c).tanh()
            }
            None => s,
        }
    }

    /// Through the cap backwards: `ds ← ds · (1 − (s/c)²)` for the capped scores `capped`
    /// (nothing without a cap).
    pub fn cap_backward<T: Float>(&self, ds: &mut [T], capped: &[T]) {
        if let Some(c) = self.softcap {
            let c = T::of(c);
            for (g, &s) in ds.iter_mut().zip(capped) {
                let t = s / c;
                *g *= T::one() - t * t;
            }
        }
    }

    /// Whether the scores are capped.
    pub fn capped(&self) -> bool {
        self.softcap.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cap against `c · tanh(s/c)` in float64, its derivative against central differences;
    /// without a cap both are the identity.
    #[test]
    fn the_cap_and_its_derivative() {
        let scores = Scores {
            scale: Some(0.125),
            softcap: Some(2.5),
        };
        assert_eq!(scores.scale::<f64>(64), 0.125);
        assert_eq!(Scores::default().scale::<f64>(64), 0.125);
        assert_eq!(Scores::default().scale::<f64>(16), 0.25);
        let raw: Vec<f64> = (0..9).map(|i| (i as f64 - 4.0) * 1.7).collect();
        let mut capped = raw.clone();
        scores.cap(&mut capped);
        for (&r, &s) in raw.iter().zip(&capped) {
            assert!((s - 2.5 * (r / 2.5).tanh()).abs() < 1e-15);
            assert!(s.abs() < 2.5);
            assert_eq!(scores.cap_one(r), s);
        }
        let mut ds = vec![1.0; raw.len()];
        scores.cap_backward(&mut ds, &capped);
        for (&r, &g) in raw.iter().zip(&ds) {
            let h = 1e-6;
            let numeric = (scores.cap_one(r + h) - scores.cap_one(r - h)) / (2.0 * h);
            assert!((g - numeric).abs() < 1e-8, "{r}: {g} vs {numeric}");
        }
        let mut same = raw.clone();
        Scores::default().cap(&mut same);
        assert_eq!(same, raw);
        let mut ones = vec![1.0; raw.len()];
        Scores::default().cap_backward(&mut ones, &raw);
        assert!(ones.iter().all(|&g| g == 1.0));
    }
}
