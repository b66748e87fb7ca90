//! Validation during training, for both model shapes: the encoder-decoder's loss and NLL per
//! target token over held-out pairs (and, optionally, greedy BLEU of the first sources against
//! their targets); the language model's NLL per token over a held-out token stream and its bits
//! per character.

use crate::decode::greedy::GreedyOptions;
use crate::decode::score::score_stream;
use crate::error::{Error, Result};
use crate::eval::bleu::{corpus_bleu, BleuScore};
use crate::model::{LanguageModel, Seq2Seq};
use crate::pipeline::translate::translate_lines;
use crate::text::vocab::Vocab;
use crate::train::pairs::{evaluate, Example};

/// What a validation measured.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidReport {
    /// Mean loss per target token (label-smoothed as in training for pairs; the NLL for a
    /// language model).
    pub loss: f64,
    /// Mean negative log-likelihood per target token (nats).
    pub nll: f64,
    /// Greedy corpus BLEU (pairs, when asked for).
    pub bleu: Option<BleuScore>,
    /// Total NLL / characters / ln 2 (language model).
    pub bits_per_char: Option<f64>,
    /// The share of masked tokens predicted exactly (masked-LM encoder).
    pub accuracy: Option<f64>,
}

/// Scores a model of type `M` on held-out data.
pub trait Validator<M> {
    /// Validates `model`; `extras`: also the costlier scores (greedy BLEU) where configured.
    fn validate(&self, model: &M, extras: bool) -> Result<ValidReport>;
}

/// Held-out sentence pairs.
pub struct PairValidation<'a> {
    /// The pairs in token ids (those the model can take).
    pub examples: Vec<Example>,
    /// Batching of the evaluation (the run's).
    pub tokens_per_batch: usize,
    /// ε_ls of the reported loss (the run's).
    pub label_smoothing: f64,
    /// Greedy BLEU of these sources against these references, if any.
    pub bleu: Option<BleuCheck<'a>>,
}

/// Sources to translate greedily and their references.
pub struct BleuCheck<'a> {
    pub vocab: &'a Vocab,
    pub sources: Vec<String>,
    pub references: Vec<String>,
}

impl Validator<Seq2Seq<f32>> for PairValidation<'_> {
    /// Loss and NLL without dropout, batched by tokens; with `extras`, greedy translations
    /// scored by corpus BLEU. Hypotheses stop at source length + 10 tokens (not the search's
    /// + 50), so the runaway repetitions of an early model cost little training time.
    fn validate(&self, model: &Seq2Seq<f32>, extras: bool) -> Result<ValidReport> {
        let s = evaluate(
            model,
            &self.examples,
            self.tokens_per_batch,
            self.label_smoothing,
        );
        let bleu = match (&self.bleu, extras) {
            (Some(check), true) => {
                let options = GreedyOptions {
                    max_len_extra: 10,
                    ..Default::default()
                };
                let hyps = translate_lines(model, check.vocab, None, &check.sources, &options)?;
                let score = corpus_bleu(&hyps, &check.references)
                    .map_err(|e| Error::Input(format!("validation BLEU: {e}")))?;
                Some(score)
            }
            _ => None,
        };
        Ok(ValidReport {
            loss: s.loss(),
            nll: s.nll(),
            bleu,
            bits_per_char: None,
            accuracy: None,
        })
    }
}

/// A held-out token stream (the end of the training text).
pub struct TextValidation {
    /// The tokens, starting with `<|endoftext|>`.
    pub tokens: Vec<u32>,
    /// Characters of the text they encode (for bits per character).
    pub chars: usize,
    /// Windows scored together.
    pub batch: usize,
}

impl Validator<LanguageModel<f32>> for TextValidation {
    /// Every token scored once, in non-overlapping windows of the model's context.
    fn validate(&self, model: &LanguageModel<f32>, _extras: bool) -> Result<ValidReport> {
        let context = model.max_len();
        let s = score_stream(model, &self.tokens, context, context, self.batch);
        Ok(ValidReport {
            loss: s.loss(),
            nll: s.nll(),
            bleu: None,
            bits_per_char: Some(s.nll_sum / self.chars as f64 / std::f64::consts::LN_2),
            accuracy: None,
        })
    }
}
