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
//! - `qwen35` (Qwen3.5): as `qwen2` with `[\p{L}\p{M}]+` for `\p{L}+` (combining marks stay in
//!   their word) and `[^\s\p{L}\p{M}\p{N}]` for `[^\s\p{L}\p{N}]`.
//! - `smollm` (llama.cpp shares it with `starcoder`, `refact`, `command-r`, ...): first `\p{N}`
//!   (every digit its own piece), then GPT-2's within the rest.
//! - `default` (a file without `tokenizer.ggml.pre`): `[\p{P}\$\+<=>\^~\|]+`, then GPT-2's,
//!   then `\p{N}+`, then `[0-9][0-9][0-9]`, each cutting within the pieces of the one before.
//! - `falcon`: ``[\p{P}\$\+<=>\^~\|`]+``, then GPT-2's, then `[0-9][0-9][0-9]`.
//! - `deepseek-coder`: `[\r\n]`, `\s?\p{L}+`, `\s?\p{P}+`, `[一-龥ࠀ-一가-퟿]+`, `\p{N}`, read as
//!   llama.cpp's general path reads them: an expression with a `\p{..}` class on the text with
//!   every code point above ASCII collapsed to its category (white space to `\v`), the others
//!   on the code points themselves.
//! - `deepseek-llm`: `[\r\n]`, `\s?` and a run of DeepSeek's letter class (Latin, Greek,
//!   Cyrillic, ... ranges), `\s?` and a run of its punctuation class, `\s+$`, the CJK runs,
//!   `\p{N}+` (the expressions without a `\p{..}` class read the code points, where `\s` is
//!   ASCII white space).
//! - `gemma4` (the `gemma4` tokenizer model): `[^\n]+|[\n]+` on the text with its spaces as `▁`,
//!   the words left in UTF-8.
//!
//! llama.cpp gives many names one of these expressions ([`PRE_NAMES`], as `llama-vocab.cpp`
//! maps them, with the two settings that follow the name there: whether a word that is a token
//! is taken whole without merges, and whether BOS is added by default).
//!
//! Each expression splits a piece into its matches and the text between them; the words are
//! then spelt in GPT-2's byte-level alphabet (each UTF-8 byte one printable character).

use super::unicode::{flags, to_lower, Flags};
use std::sync::LazyLock;

/// A pre-tokenizer of llama.cpp (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// `gpt-2`.
    Gpt2,
    /// `llama-bpe` (Llama 3).
    Llama3,
    /// `qwen2`.
    Qwen2,
    /// `qwen35`: Qwen2's with combining marks in letter runs.
    Qwen35,
    /// `smollm`: single digits, then GPT-2's.
    Smollm,
    /// `default`: llama.cpp's four expressions for a file that names none.
    Default,
    /// `falcon`: punctuation runs (the backtick too), GPT-2's, ASCII digit triples.
    Falcon,
    /// `deepseek-coder`: line breaks, letter and punctuation runs (a white space before each
    /// taken), CJK runs, single digits.
    DeepseekCoder,
    /// `deepseek-llm`: line breaks, DeepSeek's letter and punctuation classes (a white space
    /// before each taken), trailing white space, CJK runs, number runs.
    DeepseekLlm,
    /// `gemma4`: runs of line breaks and the text between them, not byte-encoded (the text's
    /// spaces are `▁` by then, and BPE runs on its UTF-8).
    Gemma4,
}

/// What llama.cpp does for a `tokenizer.ggml.pre` name: the expressions that cut the text,
/// whether a word that is a token is taken whole (`ignore_merges`), and whether BOS is added
/// when the file does not say (`add_bos`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreSettings {
    pub split: PreTokenizer,
    pub ignore_merges: bool,
    pub add_bos: bool,
}

/// The `tokenizer.ggml.pre` names understood, each as `llama-vocab.cpp` maps it:
/// `(name, expressions, ignore_merges, add_bos)`. Names llama.cpp gives other expressions (or
/// other settings: a separator added, a BOS id cleared) are refused by name.
pub const PRE_NAMES: &[(&str, PreTokenizer, bool, bool)] = {
    use PreTokenizer::*;
    &[
        ("default", Default, false, false),
        // Llama 3's expression, words that are tokens whole, BOS added.
        ("llama-bpe", Llama3, true, true),
        ("llama3", Llama3, true, true),
        ("llama-v3", Llama3, true, true),
        ("falcon3", Llama3, true, true),
        ("falcon-h1", Llama3, true, true),
        ("pixtral", Llama3, true, true),
        ("midm-2.0", Llama3, true, true),
        ("lfm2", Llama3, true, true),
        ("jina-v5-nano", Llama3, true, true),
        // Llama 3's expression with the merges.
        ("dbrx", Llama3, false, false),
        ("smaug-bpe", Llama3, false, false),
        // GPT-2's.
        ("gpt-2", Gpt2, false, false),
        ("gpt2", Gpt2, false, false),
        ("phi-2", Gpt2, false, false),
        ("jina-es", Gpt2, false, false),
        ("jina-de", Gpt2, false, false),
        ("gigachat", Gpt2, false, false),
        ("jina-v2-es", Gpt2, false, false),
        ("jina-v2-de", Gpt2, false, false),
        ("a.x-4.0", Gpt2, false, false),
        ("mellum", Gpt2, false, false),
        ("modern-bert", Gpt2, false, false),
        ("mpt", Gpt2, false, false),
        ("olmo", Gpt2, false, false),
        ("jais", Gpt2, false, false),
        ("exaone4", Gpt2, false, false),
        // Single digits, then GPT-2's.
        ("smollm", Smollm, false, false),
        ("starcoder", Smollm, false, false),
        ("refact", Smollm, false, false),
        ("command-r", Smollm, false, false),
        ("codeshell", Smollm, false, false),
        ("exaone", Smollm, false, false),
        ("minerva-7b", Smollm, false, false),
        // Qwen2's (Llama 3's with single digits).
        ("qwen2", Qwen2, false, false),
        ("deepseek-r1-qwen", Qwen2, false, false),
        ("kormo", Qwen2, false, false),
        ("f2llmv2", Qwen2, false, false),
        ("stablelm2", Qwen2, false, false),
        ("megrez", Qwen2, false, false),
        ("qwen35", Qwen35, false, false),
        ("falcon", Falcon, false, false),
        ("deepseek-coder", DeepseekCoder, false, false),
        ("deepseek-llm", DeepseekLlm, false, false),
        ("gemma4", Gemma4, false, false),
        ("granite-embed-multi-311m", Gemma4, false, false),
    ]
};

impl PreTokenizer {
    /// What llama.cpp does for `tokenizer.ggml.pre` `name`, if it is one of [`PRE_NAMES`].
    pub fn settings(name: &str) -> Option<PreSettings> {
        PRE_NAMES
            .iter()
            .find(|(n, ..)| *n == name)
            .map(|&(_, split, ignore_merges, add_bos)| PreSettings {
                split,
                ignore_merges,
                add_bos,
            })
    }

    /// Cuts `text` into words, each spelt in the byte-level alphabet (see
    /// [`byte_encoded`](Self::byte_encoded)).
    pub fn words(self, text: &str) -> Vec<String> {
        let cpts: Vec<char> = text.chars().collect();
        let mut lengths = if cpts.is_empty() {
            Vec::new()
        } else {
            vec![cpts.len()]
        };
        let steps: &[Split] = match self {
            PreTokenizer::Gpt2 => &[Split::Gpt2],
            PreTokenizer::Llama3 => &[Split::Llama3 { digits: 3, marks: false }],
            PreTokenizer::Qwen2 => &[Split::Llama3 { digits: 1, marks: false }],
            PreTokenizer::Qwen35 => &[Split::Llama3 { digits: 1, marks: true }],
            PreTokenizer::Smollm => &[Split::EachNumber, Split::Gpt2],
            PreTokenizer::Default => &[
                Split::PunctuationRuns,
                Split::Gpt2,
                Split::NumberRuns,
                Split::AsciiDigitTriples,
            ],
            PreTokenizer::DeepseekCoder => &[
                Split::EachLineBreak,
                Split::SpaceThenLetters,
                Split::SpaceThenPunctuation,
                Split::CjkRuns,
                Split::EachNumber,
            ],
            PreTokenizer::DeepseekLlm => &[
                Split::EachLineBreak,
                Split::SpaceThenClass(&DEEPSEEK_LETTERS),
                Split::SpaceThenClass(&DEEPSEEK_PUNCTUATION),
                Split::TrailingSpace,
                Split::CjkRuns,
                Split::NumberRuns,
            ],
            PreTokenizer::Gemma4 => &[Split::NewlineRuns],
            PreTokenizer::Falcon => &[
                Split::PunctuationOrBacktickRuns,
                Split::Gpt2,
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
                match self.byte_encoded() {
                    true => byte_level(word.as_bytes()),
                    false => word,
                }
            })
            .collect()
    }

    /// Whether words are spelt in the byte-level alphabet (all but `gemma4`, whose BPE runs on
    /// the UTF-8 of its `▁`-escaped text, unknown bytes as `<0xXX>` tokens).
    pub fn byte_encoded(self) -> bool {
        self != PreTokenizer::Gemma4
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
    /// Llama 3's expression with `\p{N}{1,digits}`, letter runs with combining marks where
    /// `marks` (`..._llama3`, `..._qwen2`, `..._qwen35`).
    Llama3 { digits: usize, marks: bool },
    /// `\p{N}`.
    EachNumber,
    /// `\p{N}+`.
    NumberRuns,
    /// `[\p{P}\$\+<=>\^~\|]+`.
    PunctuationRuns,
    /// ``[\p{P}\$\+<=>\^~\|`]+`` (Falcon's).
    PunctuationOrBacktickRuns,
    /// `[\r\n]`.
    EachLineBreak,
    /// `\s?\p{L}+` on the collapsed text.
    SpaceThenLetters,
    /// `\s?\p{P}+` on the collapsed text.
    SpaceThenPunctuation,
    /// `[一-龥ࠀ-一가-퟿]+` on the code points.
    CjkRuns,
    /// `\s?[class]+` on the code points (`class` a bracket expression's ranges).
    SpaceThenClass(&'static LazyLock<Vec<(char, char)>>),
    /// `\s+$` on the code points.
    TrailingSpace,
    /// `[^\n]+|[\n]+`.
    NewlineRuns,
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
            Split::Llama3 { digits, marks } => llama3(piece, (digits, marks), out),
            Split::EachNumber => runs(piece, out, number, false),
            Split::NumberRuns => runs(piece, out, number, true),
            Split::PunctuationRuns => runs(piece, out, punctuation, true),
            Split::PunctuationOrBacktickRuns => {
                runs(piece, out, |c| c == '`' || punctuation(c), true)
            }
            Split::EachLineBreak => runs(piece, out, |c| matches!(c, '\r' | '\n'), false),
            Split::SpaceThenLetters => space_then_runs(piece, out, collapsed_space, collapsed_letter),
            Split::SpaceThenPunctuation => {
                space_then_runs(piece, out, collapsed_space, collapsed_punctuation)
            }
            Split::CjkRuns => runs(piece, out, cjk, true),
            Split::SpaceThenClass(ranges) => {
                let in_class = |c: char| ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&c));
                space_then_runs(piece, out, ascii_space, in_class)
            }
            Split::NewlineRuns => runs(piece, out, |c| c == '\n', true),
            Split::TrailingSpace => {
                let run = piece.iter().rev().take_while(|&&c| ascii_space(c)).count();
                if run < piece.len() {
                    out.push(piece.len() - run);
                }
                if run > 0 {
                    out.push(run);
                }
            }
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

/// Pieces for the leftmost matches of an expression in `piece` and for the text between them:
/// `match_at(pos)` is the length of the match starting at `pos`, if one does (never 0).
fn cut_matches(piece: &[char], out: &mut Vec<usize>, match_at: impl Fn(usize) -> Option<usize>) {
    let mut gap = 0;
    let mut pos = 0;
    while pos < piece.len() {
        match match_at(pos) {
            Some(len) => {
                if gap > 0 {
                    out.push(gap);
                    gap = 0;
                }
                out.push(len);
                pos += len;
            }
            None => {
                gap += 1;
                pos += 1;
            }
        }
    }
    if gap > 0 {
        out.push(gap);
    }
}

/// Pieces for the matches of `class+` (or single `class` characters when `!greedy`) and for the
/// text between them.
fn runs(piece: &[char], out: &mut Vec<usize>, class: impl Fn(char) -> bool, greedy: bool) {
    cut_matches(piece, out, |pos| {
        let run = match greedy {
            true => piece[pos..].iter().take_while(|&&c| class(c)).count(),
            false => usize::from(class(piece[pos])),
        };
        (run > 0).then_some(run)
    })
}

/// `\s` on llama.cpp's collapsed text: ASCII white space (`\v` and `\f` too), and every
/// white space above ASCII (collapsed to `\v`).
fn collapsed_space(c: char) -> bool {
    match c.is_ascii() {
        true => ascii_space(c),
        false => flags(c).is_whitespace(),
    }
}

/// `\p{L}` on the collapsed text: ASCII letters, and the letters above ASCII that are not
/// white space.
fn collapsed_letter(c: char) -> bool {
    match c.is_ascii() {
        true => c.is_ascii_alphabetic(),
        false => !flags(c).is_whitespace() && flags(c).is_letter(),
    }
}

/// `\p{P}` on the collapsed text: ASCII ``!-#%-*,-/:-;?-@[-]_{}`` (not the symbols
/// ``$+<=>^`|~``), and the punctuation above ASCII that is not white space.
fn collapsed_punctuation(c: char) -> bool {
    match c.is_ascii() {
        true => c.is_ascii_punctuation() && !"$+<=>^`|~".contains(c),
        false => !flags(c).is_whitespace() && flags(c).is_punctuation(),
    }
}

/// `[一-龥ࠀ-一가-퟿]`: U+4E00–U+9FA5, U+0800–U+4E00 (together U+0800–U+9FA5), U+AC00–U+D7FF.
fn cjk(c: char) -> bool {
    matches!(c, '\u{0800}'..='\u{9fa5}' | '\u{ac00}'..='\u{d7ff}')
}

/// `\s` on code points (std::wregex in the C locale): ASCII white space.
fn ascii_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r')
}

/// DeepSeek LLM's letter class (`llama-vocab.cpp`), the ranges of its bracket expression
/// (read once).
static DEEPSEEK_LETTERS: LazyLock<Vec<(char, char)>> = LazyLock::new(|| class_ranges("A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃"));

/// DeepSeek LLM's punctuation class.
static DEEPSEEK_PUNCTUATION: LazyLock<Vec<(char, char)>> =
    LazyLock::new(|| class_ranges("!-/:-~！-／：-～‘-‟　-。"));

/// The ranges of a bracket expression's body of single characters and `a-b` ranges.
fn class_ranges(body: &str) -> Vec<(char, char)> {
    let cs: Vec<char> = body.chars().collect();
    let mut ranges = Vec::new();
    let mut i = 0;
    while i < cs.len() {
        if i + 2 < cs.len() && cs[i + 1] == '-' {
            ranges.push((cs[i], cs[i + 2]));
            i += 3;
        } else {
            ranges.push((cs[i], cs[i]));
            i += 1;
        }
    }
    ranges
}

/// Pieces for the matches of `\s?class+` (leftmost, greedy: a white space, as `space` reads
/// it, is taken when a `class` character follows it) and for the text between them.
fn space_then_runs(
    piece: &[char],
    out: &mut Vec<usize>,
    space: impl Fn(char) -> bool,
    class: impl Fn(char) -> bool,
) {
    cut_matches(piece, out, |pos| {
        let c = piece[pos];
        let spaced = !class(c) && space(c) && piece.get(pos + 1).is_some_and(|&d| class(d));
        let start = pos + usize::from(spaced);
        let run = piece[start..].iter().take_while(|&&c| class(c)).count();
        (run > 0).then_some(run + usize::from(spaced))
    })
}

/// `[0-9][0-9][0-9]`: leftmost triples of ASCII digits, and the text between.
fn digit_triples(piece: &[char], out: &mut Vec<usize>) {
    cut_matches(piece, out, |pos| {
        let triple = piece.get(pos..pos + 3)?;
        triple.iter().all(char::is_ascii_digit).then_some(3)
    })
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
/// (3 for Llama 3, 1 for Qwen2); with `marks`, letter runs take combining marks too
/// (`[\p{L}\p{M}]+`, and `[^\s\p{L}\p{M}\p{N}]` for the others: Qwen3.5's).
fn llama3(piece: &[char], (digits, marks): (usize, bool), out: &mut Vec<usize>) {
    let n = piece.len();
    let word = |f: Flags| f.is_letter() || (marks && f.is_mark());
    let other = |f: Flags| other(f) && !(marks && f.is_mark());
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
        // `[^\r\n\p{L}\p{N}]?\p{L}+` (`[\p{L}\p{M}]+` with marks)
        if !(c == '\r' || c == '\n' || f.is_number())
            && (word(f) || word(flags_at(piece, pos + 1)))
        {
            pos += 1;
            while word(flags_at(piece, pos)) {
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
        if !(f2.is_whitespace() || word(f2) || f2.is_number()) && f.is_char() {
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

    /// DeepSeek Coder: line breaks alone, a space joins the letters or punctuation after it,
    /// symbols (`+`) are not punctuation, CJK runs and single digits.
    #[test]
    fn deepseek_coder_cuts_as_its_five_expressions() {
        assert_eq!(
            cut(PreTokenizer::DeepseekCoder, "a+b, 12\n中文 x"),
            ["a", "+", "b", ",", " ", "1", "2", "\n", "中文", " x"]
        );
    }

    /// DeepSeek LLM: the classes' ranges, a trailing white-space run cut off, digit runs whole;
    /// its punctuation class's `:-~` holds the ASCII letters, so within a letter run the third
    /// expression cuts them from the others (as llama.cpp's `std::wregex` does).
    #[test]
    fn deepseek_llm_cuts_as_its_six_expressions() {
        assert_eq!(class_ranges("A-Zµ!-/"), [('A', 'Z'), ('µ', 'µ'), ('!', '/')]);
        assert_eq!(
            cut(PreTokenizer::DeepseekLlm, "Ωx, 123  "),
            ["Ω", "x", ",", " ", "123", "  "]
        );
    }

    /// Qwen3.5 keeps a combining mark (U+0301) in its word where Qwen2 cuts it off.
    #[test]
    fn qwen35_keeps_combining_marks_in_words() {
        assert_eq!(cut(PreTokenizer::Qwen2, "e\u{301}t\u{301}e"), ["e", "\u{301}t", "\u{301}e"]);
        assert_eq!(cut(PreTokenizer::Qwen35, "e\u{301}t\u{301}e 1"), ["e\u{301}t\u{301}e", " ", "1"]);
    }

    /// Falcon's first expression takes the backtick that `default`'s leaves; it has no
    /// `\p{N}+` step, so a run of digits is cut in ASCII triples only.
    #[test]
    fn falcon_cuts_punctuation_with_backticks_and_digit_triples() {
        assert_eq!(cut(PreTokenizer::Falcon, "`a`+1234"), ["`", "a", "`+", "123", "4"]);
        assert_eq!(cut(PreTokenizer::Default, "`a`+1234"), ["`", "a", "`", "+", "123", "4"]);
    }

    /// Every name maps to one set of settings; Llama 3's names take words whole and add BOS,
    /// the same expression under `dbrx` does neither; an unknown name is none.
    #[test]
    fn llama_cpp_names_map_to_their_settings() {
        for (i, (name, ..)) in PRE_NAMES.iter().enumerate() {
            assert!(!PRE_NAMES[..i].iter().any(|(n, ..)| n == name), "{name} twice");
        }
        let llama3 = PreTokenizer::settings("falcon3").unwrap();
        assert_eq!((llama3.split, llama3.ignore_merges, llama3.add_bos), (PreTokenizer::Llama3, true, true));
        let dbrx = PreTokenizer::settings("dbrx").unwrap();
        assert_eq!((dbrx.split, dbrx.ignore_merges, dbrx.add_bos), (PreTokenizer::Llama3, false, false));
        assert_eq!(PreTokenizer::settings("command-r").map(|s| s.split), Some(PreTokenizer::Smollm));
        assert_eq!(PreTokenizer::settings("mpt").map(|s| s.split), Some(PreTokenizer::Gpt2));
        assert_eq!(PreTokenizer::settings("deepseek-v3"), None);
        assert_eq!(PreTokenizer::settings("qwen35").map(|s| s.split), Some(PreTokenizer::Qwen35));
    }

    #[test]
    fn byte_level_alphabet() {
        assert_eq!(byte_level(b" \n\t"), "ĠĊĉ");
        assert_eq!(byte_char(0), 'Ā');
        assert_eq!(byte_char(0xad), 'Ń');
        assert_eq!(byte_level("é".as_bytes()), "Ã©");
    }
}
