//! SentencePiece's BPE over scored pieces, as llama.cpp's `llm_tokenizer_spm` applies it to a
//! `tokenizer.ggml.model = llama` vocabulary (Llama 2, Mistral, Phi-3):
//!
//! 1. spaces are written `▁` (U+2581), and one is put before the text when the vocabulary asks
//!    for it (`add_space_prefix`, done by the caller);
//! 2. the text starts as one symbol per character;
//! 3. repeatedly, of all adjacent pairs whose joined text is a vocabulary piece, the one whose
//!    piece has the highest score (`tokenizer.ggml.scores`; on a tie the leftmost) is joined;
//! 4. each final symbol is its piece's id; a character with no piece falls back to its UTF-8
//!    bytes, each the byte token `<0xXX>` (or, failing that, the one-byte piece).

use super::Vocab;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// One symbol: a byte range of the text, linked to its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate join of symbols `left` and `right` into a piece of `score` spanning `len` bytes.
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// The heap's top is the highest score, then the leftmost.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(other.left.cmp(&self.left))
    }
}

/// Appends the ids of `text` (spaces already written `▁`) to `out`; `Err` names a byte that
/// has neither a byte token nor a one-byte piece.
pub fn tokenize(vocab: &Vocab, text: &str, out: &mut Vec<u32>) -> Result<(), u8> {
    let bytes = text.as_bytes();
    let mut symbols: Vec<Symbol> = Vec::new();
    for (start, c) in text.char_indices() {
        let i = symbols.len();
        symbols.push(Symbol {
            start,
            len: c.len_utf8(),
            prev: i.checked_sub(1),
            next: None,
        });
        if i > 0 {
            symbols[i - 1].next = Some(i);
        }
    }
    let mut queue = BinaryHeap::new();
    let try_add =
        |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], left: usize, right: usize| {
            let (l, r) = (symbols[left], symbols[right]);
            let piece = &bytes[l.start..r.start + r.len];
            if let Some(&id) = vocab.ids.get(piece) {
                queue.push(Bigram {
                    left,
                    right,
                    score: vocab.scores[id as usize],
                    len: piece.len(),
                });
            }
        };
    for i in 1..symbols.len() {
        try_add(&mut queue, &symbols, i - 1, i);
    }
    while let Some(bigram) = queue.pop() {
        let (l, r) = (symbols[bigram.left], symbols[bigram.right]);
        // Stale: one side has been joined to something else since.
        if l.len == 0 || r.len == 0 || l.len + r.len != bigram.len {
            continue;
        }
        symbols[bigram.left].len += r.len;
        symbols[bigram.left].next = r.next;
        symbols[bigram.right].len = 0;
        if let Some(next) = r.next {
            symbols[next].prev = Some(bigram.left);
        }
        if let Some(prev) = l.prev {
            try_add(&mut queue, &symbols, prev, bigram.left);
        }
        if let Some(next) = r.next {
            try_add(&mut queue, &symbols, bigram.left, next);
        }
    }
    let mut i = (!symbols.is_empty()).then_some(0);
    while let Some(s) = i.map(|i| symbols[i]) {
        let piece = &bytes[s.start..s.start + s.len];
        match vocab.ids.get(piece) {
            Some(&id) => out.push(id),
            None => {
                for &b in piece {
                    out.push(vocab.byte_token(b).ok_or(b)?);
                }
            }
        }
        i = s.next;
    }
    Ok(())
}
