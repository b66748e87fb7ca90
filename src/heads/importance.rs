//! Head importance (Michel et al. 2019, eq. 2): `I_h = E_x |∂L(x)/∂ξ_h|` at ξ = 1, one term
//! per batch (the gradient of the batch's mean token loss), averaged over the batches, then
//! normalised per layer by the ℓ2 norm of the layer's scores, `Î_h = I_h / ‖I_layer‖₂`.
//!
//! The gradients come from the model's own backward: each attention sums `∂L/∂ξ_h` while its
//! [`gate_grads`](crate::model::attention::MultiHeadAttention::gate_grads) is `Some`
//! (`crate::model::head_gate`). The parameter gradients the same backward accumulates are
//! left for the caller to discard.

use super::{per_head, site_of, HeadModel, PerHead};
use crate::batch::Batch;
use crate::model::{LanguageModel, Seq2Seq};
use crate::Float;

/// The sums of `|∂L/∂ξ_h|` over the batches seen so far.
#[derive(Clone, Debug)]
pub struct Importance {
    /// `Σ_batches |∂L/∂ξ_h|`, `[site][layer][head]`.
    pub sums: PerHead<f64>,
    /// Batches summed.
    pub batches: usize,
}

impl Importance {
    /// Starts tracking the gates' gradients of every attention of `model` (zeroed).
    pub fn start<T>(model: &mut impl HeadModel<T>) -> Importance {
        for (_, _, a) in model.attentions_mut() {
            a.gate_grads = Some(vec![0.0; a.n_heads]);
        }
        Importance {
            sums: per_head(model, 0.0),
            batches: 0,
        }
    }

    /// Adds `|∂L/∂ξ_h|` of the batch whose backward just ran, and zeroes the gradients.
    pub fn add_batch<T>(&mut self, model: &mut impl HeadModel<T>) {
        for (site, layer, a) in model.attentions_mut() {
            let grads = a.gate_grads.as_mut().expect("gates tracked since start");
            let sums = &mut site_of(&mut self.sums, site)[layer];
            for (s, g) in sums.iter_mut().zip(grads.iter_mut()) {
                *s += g.abs();
                *g = 0.0;
            }
        }
        self.batches += 1;
    }

    /// Stops tracking the gates' gradients.
    pub fn stop<T>(model: &mut impl HeadModel<T>) {
        for (_, _, a) in model.attentions_mut() {
            a.gate_grads = None;
        }
    }

    /// `I_h`: the mean of `|∂L/∂ξ_h|` over the batches.
    pub fn mean(&self) -> PerHead<f64> {
        let n = self.batches.max(1) as f64;
        map(&self.sums, |s| s / n)
    }

    /// `Î_h = I_h / ‖I_layer‖₂` (0 for a layer whose scores are all 0).
    pub fn normalised(&self) -> PerHead<f64> {
        let mut out = self.mean();
        for (_, layers) in &mut out {
            for heads in layers {
                let norm = heads.iter().map(|x| x * x).sum::<f64>().sqrt();
                if norm > 0.0 {
                    heads.iter_mut().for_each(|x| *x /= norm);
                }
            }
        }
        out
    }
}

/// `f` of every entry of a table.
pub fn map<V, W>(table: &PerHead<V>, f: impl Fn(&V) -> W) -> PerHead<W> {
    let layers = |ls: &Vec<Vec<V>>| ls.iter().map(|hs| hs.iter().map(&f).collect()).collect();
    table.iter().map(|(s, ls)| (*s, layers(ls))).collect()
}

/// The importance of a language model's heads over `windows` (each `seq + 1` tokens: inputs
/// and the next tokens), `batch` windows a forward, without dropout.
pub fn lm_importance<T: Float>(
    model: &mut LanguageModel<T>,
    windows: &[Vec<u32>],
    batch: usize,
) -> Importance {
    let mut importance = Importance::start(model);
    for group in windows.chunks(batch.max(1)) {
        let (mut tokens, mut targets) = (Vec::new(), Vec::new());
        for w in group {
            tokens.extend_from_slice(&w[..w.len() - 1]);
            targets.extend_from_slice(&w[1..]);
        }
        let scale = 1.0 / targets.len() as f64;
        model.forward_backward(&tokens, &targets, group.len(), 0.0, scale, None);
        importance.add_batch(model);
    }
    Importance::stop(model);
    importance
}

/// The importance of a translation model's heads over `batches`, without dropout or label
/// smoothing: the gradient of each batch's mean loss per target token.
pub fn seq2seq_importance<T: Float>(model: &mut Seq2Seq<T>, batches: &[Batch]) -> Importance {
    let mut importance = Importance::start(model);
    for b in batches {
        let tokens: usize = b.tgt_lens.iter().sum();
        model.forward_backward(b, 0.0, 1.0 / tokens.max(1) as f64, None);
        importance.add_batch(model);
    }
    Importance::stop(model);
    importance
}
