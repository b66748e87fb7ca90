//! Text in and out: vocabularies (and the tokenizers of GGUF files: `gguf_tokenizer`,
//! `llama_vocab`) and corpus reading with line-numbered errors.

pub mod bart_tokenizer;
pub mod bpe;
pub mod corpus;
pub mod ct2_tokenizer;
pub mod decoder_tokenizer;
#[cfg(feature = "serve")]
pub mod detect;
pub mod fairseq;
pub mod fairseq_ct2;
pub mod fairseq_codes;
pub mod gguf_tokenizer;
pub mod id_map;
// Used by the binary's commands (feature `cli`) and outside the library (feature `internals`).
#[cfg_attr(not(any(feature = "cli", feature = "internals")), allow(dead_code))]
pub mod languages;
pub mod llama_vocab;
pub mod marian;
// Used by the binary's commands (feature `cli`) and outside the library (feature `internals`).
#[cfg_attr(not(any(feature = "cli", feature = "internals")), allow(dead_code))]
pub mod mlm_tokenizer;
pub mod pretrained;
pub mod sentencepiece;
pub mod spm_pair;
pub mod t5_tokenizer;
// Used by constrained decoding (feature `constrain`) and outside the library (`internals`).
#[cfg_attr(not(any(feature = "constrain", feature = "internals")), allow(dead_code))]
pub mod token_bytes;
pub mod tokenizer;
pub mod vocab;

use std::path::PathBuf;

/// Special token ids shared by every translation vocabulary of the project: padding.
pub const PAD: u32 = 0;
/// Begin of sentence: the first decoder input.
pub const BOS: u32 = 1;
/// End of sentence: closes every source and every target.
pub const EOS: u32 = 2;
/// Unknown token.
pub const UNK: u32 = 3;

/// Everything that can go wrong reading or writing text files; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// The file could not be opened or read.
    #[error("cannot read {path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        cause: std::io::Error,
    },
    /// The file could not be written or moved into place.
    #[error("cannot write {path}: {cause}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        cause: std::io::Error,
    },
    /// Some lines could not be parsed; `report` lists how many and the first few.
    #[error("{path}: {report}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// How many lines failed, and the first few with their numbers and reasons.
        report: String,
    },
    /// The file holds no line that could be used.
    #[error("{path}: no usable lines")]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// A vocabulary file is not a valid vocabulary.
    #[error("{path}: not a valid vocabulary: {reason}")]
    BadVocab {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}
