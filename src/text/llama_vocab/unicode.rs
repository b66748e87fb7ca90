//! The character classes llama.cpp's tokenizers read (`unicode.cpp`, `unicode-data.cpp`): each
//! code point's general category folded into one flag (`\p{L}` letter, `\p{N}` number, `\p{P}`
//! punctuation, `\p{S}` symbol, `\p{M}` mark, `\p{Z}` separator, `Cc`/`Cf`/`Co`/`Cs` control,
//! unassigned `Cn` none of them), the White_Space set, the simple lowercase mapping and the
//! first code point of a character's NFD decomposition.
//!
//! The category tables are the Unicode tables of `regex-syntax` (the `regex` crate's), read once
//! into sorted ranges; llama.cpp generates its own from `UnicodeData.txt`, so the two agree
//! wherever their Unicode versions do.

use regex_syntax::hir::{Class, HirKind};
use std::sync::OnceLock;

/// The category flags of one code point (llama.cpp's `unicode_cpt_flags`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flags(u16);

impl Flags {
    /// An unassigned code point (`Cn`): still a character, unlike a position past the text.
    pub const UNDEFINED: u16 = 0x0001;
    /// `\p{N}`.
    pub const NUMBER: u16 = 0x0002;
    /// `\p{L}`.
    pub const LETTER: u16 = 0x0004;
    /// `\p{Z}`.
    pub const SEPARATOR: u16 = 0x0008;
    /// `\p{M}` (llama.cpp's "accent mark").
    pub const MARK: u16 = 0x0010;
    /// `\p{P}`.
    pub const PUNCTUATION: u16 = 0x0020;
    /// `\p{S}`.
    pub const SYMBOL: u16 = 0x0040;
    /// `Cc`, `Cf`, `Co`, `Cs`.
    pub const CONTROL: u16 = 0x0080;
    /// White_Space (independent of the category).
    pub const WHITESPACE: u16 = 0x0100;

    /// The flags of a position outside the text (llama.cpp's `unicode_cpt_flags{}`): none.
    pub const NONE: Flags = Flags(0);

    fn has(self, flag: u16) -> bool {
        self.0 & flag != 0
    }
    /// A letter.
    pub fn is_letter(self) -> bool {
        self.has(Self::LETTER)
    }
    /// A number.
    pub fn is_number(self) -> bool {
        self.has(Self::NUMBER)
    }
    /// White space.
    pub fn is_whitespace(self) -> bool {
        self.has(Self::WHITESPACE)
    }
    /// A combining mark.
    pub fn is_mark(self) -> bool {
        self.has(Self::MARK)
    }
    /// Punctuation.
    pub fn is_punctuation(self) -> bool {
        self.has(Self::PUNCTUATION)
    }
    /// A symbol.
    pub fn is_symbol(self) -> bool {
        self.has(Self::SYMBOL)
    }
    /// A control, format or private-use character.
    pub fn is_control(self) -> bool {
        self.has(Self::CONTROL)
    }
    /// A character at all: false only for a position past the text (llama.cpp's
    /// `as_uint() != 0`; an unassigned code point has the flag [`Flags::UNDEFINED`]).
    pub fn is_char(self) -> bool {
        self.0 != 0
    }
    /// Unassigned (`Cn`).
    // Used outside the library only (feature `internals`).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn is_unassigned(self) -> bool {
        self.has(Self::UNDEFINED)
    }
}

/// `(first, last, flag)` ranges of code points, sorted and disjoint.
fn category_ranges() -> &'static [(u32, u32, u16)] {
    static RANGES: OnceLock<Vec<(u32, u32, u16)>> = OnceLock::new();
    RANGES.get_or_init(|| {
        let classes = [
            (r"\p{L}", Flags::LETTER),
            (r"\p{N}", Flags::NUMBER),
            (r"\p{Z}", Flags::SEPARATOR),
            (r"\p{M}", Flags::MARK),
            (r"\p{P}", Flags::PUNCTUATION),
            (r"\p{S}", Flags::SYMBOL),
            (r"[\p{Cc}\p{Cf}\p{Co}]", Flags::CONTROL),
        ];
        let mut ranges = Vec::new();
        for (pattern, flag) in classes {
            let hir = regex_syntax::Parser::new()
                .parse(pattern)
                .expect("a valid Unicode class");
            let HirKind::Class(Class::Unicode(class)) = hir.kind() else {
                unreachable!("{pattern} is a Unicode class")
            };
            ranges.extend(
                class
                    .ranges()
                    .iter()
                    .map(|r| (r.start() as u32, r.end() as u32, flag)),
            );
        }
        ranges.sort_unstable();
        ranges
    })
}

/// The flags of `c`.
pub fn flags(c: char) -> Flags {
    let cpt = c as u32;
    let white = if c.is_whitespace() {
        Flags::WHITESPACE
    } else {
        0
    };
    let ranges = category_ranges();
    let i = ranges.partition_point(|r| r.0 <= cpt);
    let category = match i.checked_sub(1).map(|i| ranges[i]) {
        Some((_, last, flag)) if cpt <= last => flag,
        _ => Flags::UNDEFINED,
    };
    Flags(category | white)
}

/// The simple (one code point) lowercase of `c`, as `UnicodeData.txt` gives it (llama.cpp's
/// `unicode_tolower`). Rust's full mapping differs only for U+0130, whose full lowercase is
/// `i` + U+0307: its first code point is the simple mapping.
pub fn to_lower(c: char) -> char {
    c.to_lowercase().next().unwrap_or(c)
}

/// The first code point of `c`'s canonical decomposition (llama.cpp's
/// `unicode_cpts_normalize_nfd` keeps only that one: `é` becomes `e`).
pub fn nfd_first(c: char) -> char {
    if c.is_ascii() {
        return c;
    }
    let mut s = tokenizers::NormalizedString::from(c.to_string());
    s.nfd();
    s.get().chars().next().unwrap_or(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_follow_the_general_category() {
        assert!(flags('a').is_letter() && flags('Ä').is_letter() && flags('我').is_letter());
        assert!(flags('3').is_number() && flags('½').is_number() && flags('²').is_number());
        assert!(flags('!').is_punctuation() && flags('\'').is_punctuation());
        assert!(flags('$').is_symbol() && flags('🦙').is_symbol() && flags('`').is_symbol());
        assert!(flags('\u{301}').is_mark());
        assert!(flags('\u{200d}').is_control() && flags('\t').is_control());
        assert!(flags(' ').is_whitespace() && flags('\u{3000}').is_whitespace());
        assert!(!flags('\u{200b}').is_whitespace());
        assert!(flags('\u{85}').is_whitespace() && flags('\u{a0}').is_whitespace());
        // An unassigned code point is still a character, unlike a position past the text.
        assert!(flags('\u{378}').is_unassigned() && flags('\u{378}').is_char());
        assert!(!flags('\u{10ffff}').is_letter() && !Flags::NONE.is_char());
        assert_eq!(to_lower('A'), 'a');
        assert_eq!(to_lower('Ä'), 'ä');
        assert_eq!(to_lower('\u{130}'), 'i');
        assert_eq!(nfd_first('é'), 'e');
        assert_eq!(nfd_first('ử'), 'u');
        assert_eq!(nfd_first('x'), 'x');
    }
}
