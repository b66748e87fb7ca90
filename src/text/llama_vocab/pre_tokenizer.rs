//! Pre-tokenization of byte-level BPE vocabularies: the regular expressions that cut a text into
//! the words BPE merges within, named by `tokenizer.ggml.pre`, computed as llama.cpp computes
//! them (`unicode_regex_split` and its hand-written matchers in `unicode.cpp`), so that the
//! corner cases (a run of spaces before a word, unassigned code points) cut where llama.cpp's
//! do.
//!
//! - `gpt-2` (GPT-2, and our older name `gpt2`):
//!   `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
//! - `llama-bpe` (Llama 3; also `llama3`, `llama-v3`):
//!   `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
//! - `qwen2`: as Llama 3 with `\p{N}` (each digit alone) for `\p{N}{1,3}`.
//! - `smollm` (llama.cpp shares it with `starcoder`, `refact`, ...): first `\p{N}` (every digit
//!   its own piece), then GPT-2's within the rest.
//! - `default` (a file without `tokenizer.ggml.pre`): `[\p{P}\$\+<=>\^~\|]+`, then GPT-2's,
//!   then `\p{N}+`, then `[0-9][0-9][0-9]`, each cutting within the pieces of the one before.
//!
//! Each expression splits a piece into its matches and the text between them; the words are
//! then spelt in GPT-2's byte-level alphabet (each UTF-8 byte one printable character).

use super::unicode::{flags, to_lower, Flags};

/// A pre-tokenizer of llama.cpp (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// `gpt-2`.
    Gpt2,
    /// `llama-bpe` (Llama 3).
    Llama3,
    /// `qwen2`.
    Qwen2,
    /// `smollm`: single digits, then GPT-2's.
    Smollm,
    /// `default`: llama.cpp's four expressions for a file that names none.
    Default,
}

/// The `tokenizer.ggml.pre` names understood.
pub const SUPPORTED_PRE: [&str; 8] = [
    "default",
    "gpt-2",
    "gpt2",
    "llama-bpe",
    "llama3",
    "llama-v3",
    "qwen2",
    "smollm",
];

impl PreTokenizer {
    /// The pre-tokenizer called `name` in `tokenizer.ggml.pre`, if supported.
    pub fn from_name(name: &str) -> Option<PreTokenizer> {
        Some(match name {
            "default" => PreTokenizer::Default,
            "gpt-2" | "gpt2" => PreTokenizer::Gpt2,
            "llama-bpe" | "llama3" | "llama-v3" => PreTokenizer::Llama3,
            "qwen2" => PreTokenizer::Qwen2,
            "smollm" => PreTokenizer::Smollm,
            _ => return None,
        })
    }

    /// Cuts `text` into words, each spelt in the byte-level alphabet.
    pub fn words(self, text: &str) -> Vec<String> {
        let cpts: Vec<char> = text.chars().collect();
        let mut lengths = if cpts.is_empty() {
            Vec::new()
        } else {
            vec![cpts.len()]
        };
        let steps: &[Split] = match self {
            PreTokenizer::Gpt2 => &[Split::Gpt2],
            PreTokenizer::Llama3 => &[Split::Llama3 { digits: 3 }],
            PreTokenizer::Qwen2 => &[Split::Llama3 { digits: 1 }],
            PreTokenizer::Smollm => &[Split::EachNumber, Split::Gpt2],
            PreTokenizer::Default => &[
                Split::PunctuationRuns,
                Split::Gpt2,
                Split::NumberRuns,
                Split::AsciiDigitTriples,
            ],
        };
        for step in steps {
            let mut next = Vec::with_capacity(lengths.len());
            let mut start = 0;
            for len in lengths {
                step.split(&cpts[start..start + len], &mut next);
                start += len;
            }
            lengths = next;
        }
        let mut start = 0;
        lengths
            .into_iter()
            .map(|len| {
                let word: String = cpts[start..start + len].iter().collect();
                start += len;
                byte_level(word.as_bytes())
            })
            .collect()
    }
}

/// GPT-2's byte-level spelling of `bytes`: `!`..=`~`, `¡`..=`¬`, `®`..=`ÿ` stand for
/// themselves, the other 68 bytes for U+0100 onwards in byte order (a space is `Ġ`).
pub fn byte_level(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| byte_char(b)).collect()
}

/// The byte-level character of one byte.
pub fn byte_char(b: u8) -> char {
    let printable = |b: u8| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    if printable(b) {
        return b as char;
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(0x100 + rank).expect("below U+0144")
}

/// One expression of a pre-tokenizer.
#[derive(Clone, Copy)]
enum Split {
    /// GPT-2's expression (llama.cpp's `unicode_regex_split_custom_gpt2`).
    Gpt2,
    /// Llama 3's expression with `\p{N}{1,digits}` (`..._llama3`, `..._qwen2`).
    Llama3 { digits: usize },
    /// `\p{N}`.
    EachNumber,
    /// `\p{N}+`.
    NumberRuns,
    /// `[\p{P}\$\+<=>\^~\|]+`.
    PunctuationRuns,
    /// `[0-9][0-9][0-9]`.
    AsciiDigitTriples,
}

/// The flags of `piece[pos]`, none past the end.
fn flags_at(piece: &[char], pos: usize) -> Flags {
    piece.get(pos).map_or(Flags::NONE, |&c| flags(c))
}

impl Split {
    /// Appends the lengths (in code points) of the pieces `piece` is cut into.
    fn split(self, piece: &[char], out: &mut Vec<usize>) {
        match self {
            Split::Gpt2 => gpt2(piece, out),
            Split::Llama3 { digits } => llama3(piece, digits, out),
            Split::EachNumber => runs(piece, out, number, false),
            Split::NumberRuns => runs(piece, out, number, true),
            Split::PunctuationRuns => runs(piece, out, punctuation, true),
            Split::AsciiDigitTriples => digit_triples(piece, out),
        }
    }
}

/// `\p{N}` as llama.cpp's collapsed-text regex reads it: ASCII digits, and any other number that
/// is not white space.
fn number(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_digit();
    }
    let f = flags(c);
    !f.is_whitespace() && f.is_number()
}

/// `[\p{P}\$\+<=>\^~\|]` as the collapsed-text regex reads it.
fn punctuation(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_punctuation() && !"`".contains(c);
    }
    let f = flags(c);
    !f.is_whitespace() && f.is_punctuation()
}

/// Pieces for the matches of `class+` (or single `class` characters when `!greedy`) and for the
/// text between them.
fn runs(piece: &[char], out: &mut Vec<usize>, class: impl Fn(char) -> bool, greedy: bool) {
    let mut gap = 0;
    let mut pos = 0;
    while pos < piece.len() {
        if class(piece[pos]) {
            if gap > 0 {
                out.push(gap);
                gap = 0;
            }
            let start = pos;
            pos += 1;
            while greedy && pos < piece.len() && class(piece[pos]) {
                pos += 1;
            }
            out.push(pos - start);
        } else {
            gap += 1;
            pos += 1;
        }
    }
    if gap > 0 {
        out.push(gap);
    }
}

/// `[0-9][0-9][0-9]`: leftmost triples of ASCII digits, and the text between.
fn digit_triples(piece: &[char], out: &mut Vec<usize>) {
    let mut gap = 0;
    let mut pos = 0;
    while pos < piece.len() {
        if pos + 3 <= piece.len() && piece[pos..pos + 3].iter().all(char::is_ascii_digit) {
            if gap > 0 {
                out.push(gap);
                gap = 0;
            }
            out.push(3);
            pos += 3;
        } else {
            gap += 1;
            pos += 1;
        }
    }
    if gap > 0 {
        out.push(gap);
    }
}

/// `[^\s\p{L}\p{N}]`: a character that is neither white space, letter nor number.
fn other(f: Flags) -> bool {
    !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.is_char()
}

/// The length of a contraction (`'s`, `'t`, `'re`, `'ve`, `'m`, `'ll`, `'d`) at `pos`, or 0;
/// `fold` lowercases its letters first (Llama 3's `(?i:...)`).
fn contraction(piece: &[char], pos: usize, fold: bool) -> usize {
    if piece[pos] != '\'' || pos + 1 >= piece.len() {
        return 0;
    }
    let at = |i: usize| {
        let c = piece[i];
        if fold {
            to_lower(c)
        } else {
            c
        }
    };
    let next = at(pos + 1);
    if matches!(next, 's' | 't' | 'm' | 'd') {
        return 2;
    }
    if pos + 2 < piece.len() {
        let next2 = at(pos + 2);
        if matches!((next, next2), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
            return 3;
        }
    }
    0
}

/// Cuts at the ends of the words GPT-2's expression matches (a character that matches none is
/// a word of its own).
fn gpt2(piece: &[char], out: &mut Vec<usize>) {
    let n = piece.len();
    let mut pos = 0;
    while pos < n {
        let start = pos;
        let c = piece[pos];
        let f = flags(c);
        let len = contraction(piece, pos, false);
        if len > 0 {
            out.push(len);
            pos += len;
            continue;
        }
        // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`
        let space = usize::from(c == ' ');
        let f2 = if c == ' ' {
            flags_at(piece, pos + 1)
        } else {
            f
        };
        let class: Option<fn(Flags) -> bool> = if f2.is_letter() {
            Some(Flags::is_letter)
        } else if f2.is_number() {
            Some(Flags::is_number)
        } else if other(f2) {
            Some(other)
        } else {
            None
        };
        if let Some(class) = class {
            pos += space + 1;
            while class(flags_at(piece, pos)) {
                pos += 1;
            }
            out.push(pos - start);
            continue;
        }
        pos = whitespace_end(piece, pos, false);
        out.push(pos - start);
    }
}

/// Where the white-space alternatives end a word starting at `pos`: `\s*[\r\n]+` (when
/// `newlines`: up to the last line break of the run), else `\s+(?!\S)` (a run followed by more
/// text leaves its last character to the next word), else `\s+`; a character that matches
/// nothing is a word alone.
fn whitespace_end(piece: &[char], pos: usize, newlines: bool) -> usize {
    let mut count = 0;
    let mut last_break = None;
    while flags_at(piece, pos + count).is_whitespace() {
        if newlines && matches!(piece[pos + count], '\r' | '\n') {
            last_break = Some(pos + count + 1);
        }
        count += 1;
    }
    if let Some(end) = last_break {
        return end;
    }
    if count > 1 && pos + count < piece.len() {
        return pos + count - 1;
    }
    pos + count.max(1)
}

/// Cuts at the ends of the words Llama 3's expression matches, `\p{N}{1,digits}` for numbers
/// (3 for Llama 3, 1 for Qwen2).
fn llama3(piece: &[char], digits: usize, out: &mut Vec<usize>) {
    let n = piece.len();
    let mut pos = 0;
    while pos < n {
        let start = pos;
        let c = piece[pos];
        let f = flags(c);
        let len = contraction(piece, pos, true);
        if len > 0 {
            out.push(len);
            pos += len;
            continue;
        }
        // `[^\r\n\p{L}\p{N}]?\p{L}+`
        if !(c == '\r' || c == '\n' || f.is_number())
            && (f.is_letter() || flags_at(piece, pos + 1).is_letter())
        {
            pos += 1;
            while flags_at(piece, pos).is_letter() {
                pos += 1;
            }
            out.push(pos - start);
            continue;
        }
        // `\p{N}{1,digits}`: a run of numbers in pieces of `digits`.
        if f.is_number() {
            let mut ini = pos;
            while flags_at(piece, pos).is_number() {
                pos += 1;
                if pos - ini >= digits {
                    out.push(pos - ini);
                    ini = pos;
                }
            }
            if pos > ini {
                out.push(pos - ini);
            }
            continue;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*` (the first character's own flags must be defined).
        let f2 = if c == ' ' {
            flags_at(piece, pos + 1)
        } else {
            f
        };
        if !(f2.is_whitespace() || f2.is_letter() || f2.is_number()) && f.is_char() {
            pos += usize::from(c == ' ');
            let mut g = f2;
            while other(g) {
                pos += 1;
                g = flags_at(piece, pos);
            }
            while pos < n && matches!(piece[pos], '\r' | '\n') {
                pos += 1;
            }
            out.push(pos - start);
            continue;
        }
        pos = whitespace_end(piece, pos, true);
        out.push(pos - start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(pre: PreTokenizer, text: &str) -> Vec<String> {
        let cpts: Vec<char> = text.chars().collect();
        let words = pre.words(text);
        // Undo the byte-level spelling to read the pieces.
        let mut start = 0;
        let mut pieces = Vec::new();
        for w in &words {
            let bytes = w.chars().count();
            let mut taken = 0;
            let mut piece = String::new();
            while taken < bytes {
                let c = cpts[start];
                taken += c.len_utf8();
                piece.push(c);
                start += 1;
            }
            pieces.push(piece);
        }
        pieces
    }

    #[test]
    fn gpt2_cuts_as_its_regex() {
        let p = PreTokenizer::Gpt2;
        assert_eq!(cut(p, "Hello world"), ["Hello", " world"]);
        assert_eq!(cut(p, "  Hello"), [" ", " Hello"]);
        assert_eq!(cut(p, "a  "), ["a", "  "]);
        assert_eq!(cut(p, "I've 33!!"), ["I", "'ve", " 33", "!!"]);
        assert_eq!(cut(p, "'S"), ["'", "S"]);
        // `\s+(?!\S)` takes a run of white space up to the end, but leaves its last
        // character to a word that follows.
        assert_eq!(cut(p, "\n \n"), ["\n \n"]);
        assert_eq!(cut(p, "a\n b"), ["a", "\n", " b"]);
    }

    #[test]
    fn llama3_and_qwen2_cut_numbers_differently() {
        assert_eq!(
            cut(PreTokenizer::Llama3, "x 1234567 'RE\n\n y"),
            // ` ?[^\s\p{L}\p{N}]+` takes ` '` before the contraction can.
            ["x", " ", "123", "456", "7", " '", "RE", "\n\n", " y"]
        );
        assert_eq!(cut(PreTokenizer::Llama3, "'RE"), ["'RE"]);
        assert_eq!(cut(PreTokenizer::Qwen2, "a 123"), ["a", " ", "1", "2", "3"]);
        assert_eq!(cut(PreTokenizer::Llama3, " \n\n  x"), [" \n\n", " ", " x"]);
    }

    #[test]
    fn smollm_and_default_split_numbers_first() {
        assert_eq!(
            cut(PreTokenizer::Smollm, " 2024!"),
            [" ", "2", "0", "2", "4", "!"]
        );
        assert_eq!(
            cut(PreTokenizer::Default, "a+=b 12345"),
            ["a", "+=", "b", " ", "123", "45"]
        );
    }

    #[test]
    fn byte_level_alphabet() {
        assert_eq!(byte_level(b" \n\t"), "ĠĊĉ");
        assert_eq!(byte_char(0), 'Ā');
        assert_eq!(byte_char(0xad), 'Ń');
        assert_eq!(byte_level("é".as_bytes()), "Ã©");
    }
}
