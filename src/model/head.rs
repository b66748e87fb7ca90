//! The output head (section 3.4): the pre-softmax linear transformation from the last hidden
//! states to one logit per vocabulary entry, `logits = h Wᵀ` (no bias), and the loss it feeds.
//! `W [vocab, d_model]` is the embedding matrix when tied (the paper shares it between the two
//! embedding layers and this projection), else a parameter of its own, `output_proj.weight`.
//!
//! Options of later models: a bias (Marian), a divisor `s` (Granite's `logits_scaling`:
//! `z = (h Wᵀ + b) / s`, backward `∂L/∂(h Wᵀ) = ∂L/∂z / s`) and a soft cap (Gemma 2:
//! `c · tanh(z / c)`, applied last).

use super::embedding::Embedding;
use super::loss::{cross_entropy_ignoring, LossStats};
use super::param::{Init, Module, Param, ParamVisitor};
use crate::backend::{Backend, MatMut, MatRef, PackedWeight, Precision, WeightRef, CPU};
use crate::Float;

/// The pre-softmax projection, tied to the embedding or not.
#[derive(Clone, Debug)]
pub struct OutputHead<T> {
    /// `W [vocab, d_model]` when untied; `None` when the embedding matrix is used.
    pub output_proj: Option<Param<T>>,
    /// Inference only: `Wᵀ [d_model, vocab]` (see [`OutputHead::prepare_inference`]); dropped by
    /// any mutable visit of the parameters.
    transposed: Option<Vec<T>>,
    /// Inference only: `W` packed in a low-precision format (f32 models), multiplied instead;
    /// dropped with `transposed` unless it is the only copy of `W` (`packed_only`).
    packed: Option<PackedWeight>,
    /// `packed` holds the only values of `W` (a GGUF file's blocks, no float32 copy).
    packed_only: bool,
    pub d_model: usize,
    pub vocab: usize,
    /// Soft-capping `c` of the logits, `z ← c · tanh(z / c)` (Gemma 2), or none.
    pub softcap: Option<f64>,
    /// `b [vocab]` added to every row of logits (Marian's `final_logits_bias`), or none.
    pub bias: Option<Param<T>>,
    /// `s`, the logits divided by it before any soft cap (Granite), or none.
    pub divisor: Option<f64>,
}

impl<T: Float> OutputHead<T> {
    /// Tied (no parameter), or a Xavier-uniform `[vocab, d_model]` drawn from `init`.
    pub fn new(vocab: usize, d_model: usize, tied: bool, init: &mut impl Init) -> Self {
        OutputHead {
            output_proj: (!tied).then(|| init.xavier(&[vocab, d_model], d_model, vocab)),
            transposed: None,
            packed: None,
            packed_only: false,
            d_model,
            vocab,
            softcap: None,
            bias: None,
            divisor: None,
        }
    }

    /// The same head with its logits divided by `divisor` (none: left as they are).
    pub fn with_divisor(mut self, divisor: Option<f64>) -> Self {
        self.divisor = divisor;
        self
    }

    /// The same head with its logits soft-capped at `cap` (none: left as they are).
    pub fn with_softcap(mut self, cap: Option<f64>) -> Self {
        self.softcap = cap;
        self
    }

    /// The same head with a zero bias `[vocab]` drawn from `init` when `bias` (none otherwise).
    pub fn with_bias(mut self, bias: bool, init: &mut impl Init) -> Self {
        self.bias = bias.then(|| init.constant(&[self.vocab], 0.0));
        self
    }

    /// `W [vocab, d_model]`: the own projection, or the embedding matrix.
    pub fn weight<'a>(&'a self, embedding: &'a Embedding<T>) -> &'a [T] {
        match &self.output_proj {
            Some(p) => &p.value.data,
            None => &embedding.weight.value.data,
        }
    }

    /// Keeps `Wᵀ` for a run of decoding steps, which gemm multiplies without repacking.
    pub fn prepare_inference(&mut self, embedding: &Embedding<T>) {
        if self.packed.is_some() || self.weight(embedding).is_empty() {
            return;
        }
        let w = CPU.transpose_weight(self.weight(embedding), self.vocab, self.d_model);
        self.transposed = Some(w);
    }

    /// Readies the projection for inference in `precision` (see
    /// [`super::linear::Linear::prepare_precision`]); a packed weight already set is kept.
    pub fn prepare_precision(
        &mut self,
        embedding: &Embedding<T>,
        precision: Precision,
    ) -> Result<(), String> {
        // Packed already, or released (see `prepare_alone`): the form it holds stays.
        if self.packed.is_some() || self.weight(embedding).is_empty() {
            return Ok(());
        }
        match T::as_f32(self.weight(embedding)) {
            Some(w) => match CPU.pack_weight(precision, w, self.vocab, self.d_model)? {
                Some(p) => {
                    self.transposed = None;
                    self.packed = Some(p);
                }
                None => self.prepare_inference(embedding),
            },
            None if precision == Precision::F32 => self.prepare_inference(embedding),
            None => return Err("low-precision inference needs an f32 model".into()),
        }
        Ok(())
    }

    /// Readies the projection for inference in `precision` holding `W` in one form only (see
    /// [`super::linear::Linear::prepare_alone`]). Tied, that form is the embedding's
    /// ([`Embedding::hold_alone`]: f32 `Eᵀ` in panels, or its packed rows), which both the
    /// lookups and this product read; a packed projection set before (a CTranslate2 int8
    /// model's stored rows) is dropped for it, since the table may differ from it (a zeroed
    /// start row) and its int8 rows are those rows again (quantising `q / scale` gives `q`
    /// back, the scale to a rounding); untied, the own
    /// `W` is released like a linear layer's, and the embedding's table stays its float32 rows
    /// (f32) or becomes its own packed rows (bf16, int8, as CTranslate2 quantises its
    /// embeddings). Neither can train or be saved afterwards.
    pub fn prepare_alone(
        &mut self,
        embedding: &mut Embedding<T>,
        precision: Precision,
    ) -> Result<(), String> {
        let (vocab, d) = (self.vocab, self.d_model);
        let Some(p) = &mut self.output_proj else {
            (self.transposed, self.packed) = (None, None);
            return embedding.hold_alone(precision);
        };
        if !p.value.data.is_empty() {
            if self.packed.is_none() && self.transposed.is_none() {
                let packed = match precision {
                    Precision::F32 => None,
                    _ => {
                        let w = T::as_f32(&p.value.data)
                            .ok_or("low-precision inference needs an f32 model")?;
                        CPU.pack_weight(precision, w, vocab, d)?
                    }
                };
                match packed {
                    Some(packed) => self.packed = Some(packed),
                    None => {
                        let w = std::mem::take(&mut p.value.data);
                        self.transposed = Some(CPU.transpose_weight_owned(w, vocab, d));
                    }
                }
            }
            p.value.data = Vec::new();
            p.grad.data = Vec::new();
        }
        match precision {
            Precision::F32 => Ok(()),
            _ => embedding.hold_alone(precision),
        }
    }

    /// Multiplies by `packed` (`[vocab, d_model]`) from now on, until the next mutable visit.
    pub fn set_packed(&mut self, packed: PackedWeight) -> Result<(), String> {
        if (packed.rows(), packed.cols()) != (self.vocab, self.d_model) {
            return Err(format!(
                "packed output projection {}x{} for vocabulary {} x d_model {}",
                packed.rows(),
                packed.cols(),
                self.vocab,
                self.d_model
            ));
        }
        self.transposed = None;
        self.packed = Some(packed);
        Ok(())
    }

    /// [`set_packed`](Self::set_packed) for a `W` that has no float32 values (an own
    /// projection left unfilled, or the embedding table looked up in its stored blocks): the
    /// packed weight stays through visits, there being nothing else to multiply.
    pub fn set_packed_only(&mut self, packed: PackedWeight) -> Result<(), String> {
        self.set_packed(packed)?;
        self.packed_only = true;
        Ok(())
    }

    /// The packed weight in use, if any.
    pub fn packed(&self) -> Option<&PackedWeight> {
        self.packed.as_ref()
    }

    /// `hidden [rows, d_model]` -> logits `[rows, vocab]`: `z = (h Wᵀ + b) / s` (`b` only with
    /// a bias, `s` only with a divisor), then `c · tanh(z / c)` when soft-capped.
    pub fn logits(&self, embedding: &Embedding<T>, hidden: &[T]) -> Vec<T> {
        let mut logits = self.product(embedding, hidden);
        if let Some(c) = self.softcap {
            CPU.softcap(&mut logits, self.vocab, c);
        }
        logits
    }

    /// `hidden [rows, d_model]` -> `z = (h Wᵀ + b) / s [rows, vocab]`, before any soft-capping.
    fn product(&self, embedding: &Embedding<T>, hidden: &[T]) -> Vec<T> {
        let (d, v) = (self.d_model, self.vocab);
        let rows = hidden.len() / d;
        // logits: [rows, vocab]
        let mut logits = vec![T::zero(); rows * v];
        CPU.weight_product(&mut logits, hidden, rows, self.weight_ref(embedding));
        if let Some(b) = &self.bias {
            CPU.add_row_bias(&mut logits, &b.value.data);
        }
        if let Some(s) = self.divisor {
            let s = T::of(s);
            logits.iter_mut().for_each(|z| *z /= s);
        }
        logits
    }

    /// `W [vocab, d_model]` with the forms this head keeps (the embedding's values when tied).
    /// Tied, the forms the embedding holds stand in for the head's own (the table released to
    /// inference: [`prepare_alone`](Self::prepare_alone)).
    pub fn weight_ref<'a>(&'a self, embedding: &'a Embedding<T>) -> WeightRef<'a, T> {
        let table = embedding.table_ref();
        let tied = self.output_proj.is_none();
        WeightRef {
            w: self.weight(embedding),
            d_in: self.d_model,
            d_out: self.vocab,
            transposed: (self.transposed.as_deref()).or(table.transposed.filter(|_| tied)),
            packed: self.packed.as_ref().or(table.packed.filter(|_| tied)),
            bf16: None,
        }
    }

    /// `hidden [rows, d_model]` -> log-probabilities `[rows, vocab]` (log-softmax of each row).
    pub fn log_probs(&self, embedding: &Embedding<T>, hidden: &[T]) -> Vec<T> {
        let mut logits = self.logits(embedding, hidden);
        self.log_softmax_rows(&mut logits);
        logits
    }

    /// `logits [rows, vocab]` -> log-probabilities in place (log-softmax of each row).
    pub fn log_softmax_rows(&self, logits: &mut [T]) {
        CPU.log_softmax_rows(logits, self.vocab);
    }

    /// The loss of `logits [rows, vocab]` against `targets [rows]` (targets equal to `ignore`
    /// skipped), label-smoothed by `smoothing` (see [`super::loss`]). With `grad_scale`, the
    /// logits are overwritten with `grad_scale · ∂L/∂logits`, ready for [`backward`](Self::backward);
    /// otherwise with log-probabilities.
    pub fn loss(
        &self,
        logits: &mut [T],
        targets: &[u32],
        ignore: Option<u32>,
        smoothing: f64,
        grad_scale: Option<f64>,
    ) -> LossStats {
        cross_entropy_ignoring(logits, targets, self.vocab, smoothing, grad_scale, ignore)
    }

    /// From `dlogits [rows, vocab]` and the head's input `hidden [rows, d_model]`: accumulates
    /// `dW += dlogitsᵀ hidden` (into the embedding's gradient when tied) and, with a bias,
    /// `db += Σ_rows dlogits`; returns `dhidden = dlogits W`.
    pub fn backward(
        &mut self,
        embedding: &mut Embedding<T>,
        hidden: &[T],
        dlogits: &[T],
    ) -> Vec<T> {
        let (d, v) = (self.d_model, self.vocab);
        let rows = hidden.len() / d;
        assert!(
            !self.weight(embedding).is_empty(),
            "the backward of an output projection whose float32 weight was released for \
             inference (OutputHead::prepare_alone): such a model cannot train"
        );
        // Soft-capped: ∂/∂z = ∂/∂logit · (1 − tanh²(z / c)), z recomputed from `hidden`.
        let mut capped: Vec<T>;
        let dlogits = match self.softcap {
            None => dlogits,
            Some(c) => {
                let z = self.product(embedding, hidden);
                capped = vec![T::zero(); dlogits.len()];
                CPU.softcap_backward(&mut capped, dlogits, &z, c);
                &capped
            }
        };
        // Divided: ∂/∂(h Wᵀ + b) = ∂/∂z / s.
        let divided: Vec<T>;
        let dlogits = match self.divisor {
            None => dlogits,
            Some(s) => {
                let s = T::of(s);
                divided = dlogits.iter().map(|&g| g / s).collect();
                &divided
            }
        };
        // dhidden [rows, d_model] = dlogits W
        let mut dhidden = vec![T::zero(); rows * d];
        CPU.matmul(
            MatMut::new(&mut dhidden, rows, d),
            MatRef::new(dlogits, rows, v),
            MatRef::new(self.weight(embedding), v, d),
            T::one(),
            false,
        );
        if let Some(b) = &mut self.bias {
            CPU.add_column_sums(&mut b.grad.data, dlogits, v);
        }
        let w_grad = match &mut self.output_proj {
            Some(p) => &mut p.grad.data,
            None => &mut embedding.weight.grad.data,
        };
        CPU.matmul(
            MatMut::new(w_grad, v, d),
            MatRef::new(dlogits, rows, v).t(),
            MatRef::new(hidden, rows, d),
            T::one(),
            true,
        );
        dhidden
    }
}

/// The head's own parameters, `output_proj.weight` (untied only) and `output_proj.bias` (with a
/// bias only); a visit drops `Wᵀ`.
impl<T> Module<T> for OutputHead<T> {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>) {
        // A released own projection (`prepare_alone`) keeps its only form.
        let released = (self.output_proj.as_ref()).is_some_and(|p| p.value.data.is_empty());
        if !released {
            self.transposed = None;
        }
        if !self.packed_only && !released {
            self.packed = None;
        }
        if let Some(p) = &mut self.output_proj {
            v.param("output_proj.weight", p);
        }
        if let Some(b) = &mut self.bias {
            v.param("output_proj.bias", b);
        }
    }
}
