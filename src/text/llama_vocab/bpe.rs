//! Byte-level BPE over ranked merges, as llama.cpp's `llm_tokenizer_bpe_session` applies it to
//! a `tokenizer.ggml.model = gpt2` vocabulary (GPT-2, Llama 3, Qwen2, SmolLM2), word by word
//! after pre-tokenization ([`super::pre_tokenizer`]):
//!
//! 1. a word (spelt in the byte-level alphabet) starts as one symbol per character; when the
//!    vocabulary says to ignore merges (Llama 3) a word that is itself a token is that token;
//! 2. repeatedly, of all adjacent pairs that some merge rule joins, the pair of the earliest
//!    rule (`tokenizer.ggml.merges` order; on a tie the leftmost) is joined;
//! 3. each final symbol is its token; one that is not a token falls back to the tokens of its
//!    single bytes, where there are any: the byte-level characters, or `<0xXX>` tokens for a
//!    vocabulary that is not byte-encoded (Gemma 4's).

use super::Vocab;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// One symbol: a byte range of the word, linked to its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// Appends the ids of one pre-tokenized `word` to `out`; `ignore_merges`: a word that is a token
/// is taken whole; `hex_bytes`: an unknown piece falls back to `<0xXX>` tokens.
pub fn tokenize_word(
    vocab: &Vocab,
    word: &str,
    (ignore_merges, hex_bytes): (bool, bool),
    out: &mut Vec<u32>,
) {
    let bytes = word.as_bytes();
    if ignore_merges {
        if let Some(&id) = vocab.ids.get(bytes) {
            out.push(id);
            return;
        }
    }
    let mut symbols: Vec<Symbol> = Vec::new();
    for (start, c) in word.char_indices() {
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
    // (rank, left, right, joined length), smallest rank first, then leftmost.
    let mut queue: BinaryHeap<Reverse<(u32, usize, usize, usize)>> = BinaryHeap::new();
    let add = |queue: &mut BinaryHeap<_>, symbols: &[Symbol], left: usize, right: usize| {
        let (l, r): (Symbol, Symbol) = (symbols[left], symbols[right]);
        let id = |s: Symbol| vocab.ids.get(&bytes[s.start..s.start + s.len]).copied();
        if let (Some(a), Some(b)) = (id(l), id(r)) {
            if let Some(&rank) = vocab.merge_ranks.get(&(a, b)) {
                queue.push(Reverse((rank, left, right, l.len + r.len)));
            }
        }
    };
    for i in 1..symbols.len() {
        add(&mut queue, &symbols, i - 1, i);
    }
    while let Some(Reverse((_, left, right, len))) = queue.pop() {
        let (l, r) = (symbols[left], symbols[right]);
        // Stale: one side has been joined to something else since.
        if l.len == 0 || r.len == 0 || l.len + r.len != len {
            continue;
        }
        symbols[left].len += r.len;
        symbols[left].next = r.next;
        symbols[right].len = 0;
        if let Some(next) = r.next {
            symbols[next].prev = Some(left);
        }
        if let Some(prev) = l.prev {
            add(&mut queue, &symbols, prev, left);
        }
        if let Some(next) = r.next {
            add(&mut queue, &symbols, left, next);
        }
    }
    for s in symbols.iter().filter(|s| s.len > 0) {
        let piece = &bytes[s.start..s.start + s.len];
        match vocab.ids.get(piece) {
            Some(&id) => out.push(id),
            None if hex_bytes => out.extend(piece.iter().filter_map(|&b| {
                vocab.ids.get(format!("<0x{b:02X}>").as_bytes()).copied()
            })),
            None => out.extend(
                piece
                    .iter()
                    .filter_map(|&b| vocab.ids.get(std::slice::from_ref(&b)).copied()),
            ),
        }
    }
}
