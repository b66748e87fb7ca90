//! The tokenizers of llama.cpp's GGUF vocabularies (`llama-vocab.cpp`), written out so that a
//! GGUF file's text is cut exactly where llama.cpp cuts it:
//!
//! - [`spm`]: SentencePiece pieces joined by score, with byte fallback (`llama`);
//! - [`bpe`] after [`pre_tokenizer`]: byte-level BPE joined by merge rank (`gpt2`);
//! - [`wpm`]: WordPiece, longest piece first (`bert`);
//! - [`special`]: the special tokens written in a text, matched before any of them;
//! - [`unicode`]: the character classes all of them read.
//!
//! [`Vocab`] holds what they share: the pieces and their ids, scores, types and merge ranks.
//! [`crate::text::gguf_tokenizer::GgufTokenizer`] reads one from a GGUF file's metadata.

pub mod bpe;
pub mod pre_tokenizer;
pub mod special;
pub mod spm;
pub mod unicode;
pub mod wpm;

use std::collections::HashMap;

/// The hasher of a vocabulary's maps: foldhash, seeded per process. Loading a 128k-piece
/// vocabulary with 280k merges looks a piece up about a million times; SipHash, the standard
/// map's, costs several times more on pieces this short.
pub type PieceHasher = foldhash::fast::RandomState;

/// `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
pub mod token_type {
    /// An ordinary piece.
    // Used outside the library only (feature `internals`).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub const NORMAL: i64 = 1;
    /// The unknown token.
    pub const UNKNOWN: i64 = 2;
    /// A control token (`<s>`, `<|im_start|>`): matched in a text only when special tokens
    /// are parsed.
    pub const CONTROL: i64 = 3;
    /// A user-defined token: always matched whole in a text, before any splitting.
    pub const USER_DEFINED: i64 = 4;
    /// An unused slot: decodes to nothing.
    pub const UNUSED: i64 = 5;
    /// A byte token `<0xXX>` (SentencePiece's byte fallback).
    pub const BYTE: i64 = 6;
}

/// A vocabulary: the pieces, each piece's id, score and type, and the merge ranks of a BPE one.
pub struct Vocab {
    /// The pieces, id = index (an empty piece renamed `[EMPTY_i]`, as llama.cpp does).
    pub tokens: Vec<String>,
    /// The id of each piece's bytes.
    pub ids: HashMap<Vec<u8>, u32, PieceHasher>,
    /// `tokenizer.ggml.scores` (0 where absent).
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.token_type` ([`token_type`]; normal where absent).
    // Used outside the library only (feature `internals`).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub types: Vec<i64>,
    /// The rank of each merge rule `(left id, right id)`: its index in `tokenizer.ggml.merges`.
    pub merge_ranks: HashMap<(u32, u32), u32, PieceHasher>,
    /// The longest piece, in bytes.
    pub max_token_len: usize,
}

impl Vocab {
    /// The byte token of `b` in a SentencePiece vocabulary: `<0xXX>`, else the one-byte piece.
    pub fn byte_token(&self, b: u8) -> Option<u32> {
        let hex = format!("<0x{b:02X}>");
        self.ids
            .get(hex.as_bytes())
            .or_else(|| self.ids.get(std::slice::from_ref(&b)))
            .copied()
    }
}
