//! Evaluation of translations against references.
//!
//! [`bleu`]: corpus BLEU equal to sacreBLEU 2.x with its defaults (13a tokenizer, `exp`
//! smoothing, mixed case, one reference per line).

pub mod bleu;

pub use bleu::{corpus_bleu, tokenize_13a, BleuError, BleuScore};
