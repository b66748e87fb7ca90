//! WordPiece, as llama.cpp's `llm_tokenizer_wpm` applies it to a `tokenizer.ggml.model = bert`
//! vocabulary (BERT, BGE). llama.cpp's converter spells a word-initial piece with a leading `▁`
//! and a continuation without BERT's `##`, so:
//!
//! 1. the text is cut into words: white space separates; each punctuation character, ASCII
//!    symbol and CJK ideograph is a word of its own; NUL, U+FFFD and control characters are
//!    dropped; with `lowercase` letters are lowercased, with `strip_accents` each character
//!    is replaced by the first code point of its NFD decomposition and marks are dropped;
//! 2. each word, `▁` put before it, is covered greedily from the left by the longest pieces of
//!    the vocabulary (byte lengths up to the longest piece's);
//! 3. a word that cannot be covered entirely is the unknown token.

use super::unicode::{flags, nfd_first, to_lower};
use super::Vocab;

/// The normalisation of the words (`tokenizer.ggml.normalizer.*`; both default to true).
#[derive(Clone, Copy, Debug)]
pub struct Normalizer {
    /// Lowercase letters.
    pub lowercase: bool,
    /// Reduce characters to their base and drop combining marks.
    pub strip_accents: bool,
}

/// llama.cpp's CJK ideograph ranges (Hugging Face's `_is_chinese_char`, with its
/// 0x2B920 typo kept).
fn is_chinese(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B920..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

/// The words of `text` (step 1).
pub fn words(text: &str, norm: Normalizer) -> Vec<String> {
    let mut words = vec![String::new()];
    for c in text.chars() {
        let c = if norm.strip_accents { nfd_first(c) } else { c };
        let f = flags(c);
        if f.is_whitespace() {
            if !words.last().unwrap().is_empty() {
                words.push(String::new());
            }
            continue;
        }
        if c == '\0' || c == '\u{FFFD}' || f.is_control() {
            continue;
        }
        if norm.strip_accents && f.is_mark() {
            continue;
        }
        let written = if norm.lowercase { to_lower(c) } else { c };
        if f.is_punctuation() || ((c as u32) < 0x7F && f.is_symbol()) || is_chinese(c) {
            if !words.last().unwrap().is_empty() {
                words.push(String::new());
            }
            words.last_mut().unwrap().push(written);
            words.push(String::new());
        } else {
            words.last_mut().unwrap().push(written);
        }
    }
    if words.last().unwrap().is_empty() {
        words.pop();
    }
    words
}

/// Appends the ids of `text` to `out` (steps 2 and 3); `unk` is the unknown token.
pub fn tokenize(vocab: &Vocab, text: &str, norm: Normalizer, unk: Option<u32>, out: &mut Vec<u32>) {
    for word in words(text, norm) {
        let marked = format!("\u{2581}{word}");
        let bytes = marked.as_bytes();
        let n = bytes.len();
        let before = out.len();
        let mut i = 0;
        while i < n {
            let longest = (i + 1..=n.min(i + vocab.max_token_len + 1))
                .rev()
                .find_map(|j| vocab.ids.get(&bytes[i..j]).map(|&id| (j, id)));
            match longest {
                Some((j, id)) => {
                    out.push(id);
                    i = j;
                }
                None => {
                    out.truncate(before);
                    break;
                }
            }
        }
        if out.len() == before {
            out.extend(unk);
        }
    }
}
