//! Evaluation of translations against references.
//!
//! [`bleu`]: corpus BLEU equal to sacreBLEU 2.x with its defaults (13a tokenizer, `exp`
//! smoothing, mixed case, one reference per line).

pub mod bleu;

// Used outside the library only (feature `internals`).

#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use bleu::{corpus_bleu, tokenize_13a, BleuError, BleuScore};
