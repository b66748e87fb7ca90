//! Special tokens written in a text (llama.cpp's `tokenizer_st_partition`): before any other
//! processing the text is cut at every occurrence of a special token's text, longest tokens
//! first, leftmost occurrences first; each occurrence becomes that token and only the text
//! between occurrences is tokenized. Control and unknown tokens are matched only when special
//! tokens are parsed; user-defined ones always. A token may swallow the white space (C's
//! `isspace`) to its left (`lstrip`) or right (`rstrip`).

/// A special token as matched in text.
#[derive(Clone, Debug)]
pub struct SpecialToken {
    /// Its id.
    pub id: u32,
    /// Its text.
    pub text: String,
    /// Matched even when special tokens are not parsed (a user-defined token).
    pub always: bool,
    /// Swallows the white space before it.
    pub lstrip: bool,
    /// Swallows the white space after it.
    pub rstrip: bool,
}

/// A piece of a text after the special tokens are cut out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fragment<'a> {
    /// Text to tokenize.
    Text(&'a str),
    /// A special token.
    Token(u32),
}

/// C's `isspace` on a byte.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// Cuts `text` at the special tokens of `specials` (already in matching order: longest first).
pub fn partition<'a>(
    text: &'a str,
    specials: &[SpecialToken],
    parse_special: bool,
) -> Vec<Fragment<'a>> {
    let mut fragments = if text.is_empty() {
        Vec::new()
    } else {
        vec![Fragment::Text(text)]
    };
    for special in specials.iter().filter(|s| s.always || parse_special) {
        let pattern = special.text.as_str();
        if pattern.is_empty() {
            continue;
        }
        let mut next = Vec::with_capacity(fragments.len());
        for fragment in fragments {
            let Fragment::Text(mut rest) = fragment else {
                next.push(fragment);
                continue;
            };
            while let Some(at) = rest.find(pattern) {
                let mut left = &rest[..at];
                if special.lstrip {
                    left = left.trim_end_matches(|c: char| c.is_ascii() && is_c_space(c as u8));
                }
                if !left.is_empty() {
                    next.push(Fragment::Text(left));
                }
                next.push(Fragment::Token(special.id));
                rest = &rest[at + pattern.len()..];
                if special.rstrip {
                    rest = rest.trim_start_matches(|c: char| c.is_ascii() && is_c_space(c as u8));
                }
            }
            if !rest.is_empty() {
                next.push(Fragment::Text(rest));
            }
        }
        fragments = next;
    }
    fragments
}

#[cfg(test)]
mod tests {
    use super::*;

    fn special(id: u32, text: &str, always: bool, lstrip: bool, rstrip: bool) -> SpecialToken {
        SpecialToken {
            id,
            text: text.into(),
            always,
            lstrip,
            rstrip,
        }
    }

    #[test]
    fn partition_cuts_longest_first_and_strips() {
        use Fragment::*;
        let specials = [
            special(1, "<|end|>", false, false, true),
            special(2, "<x>", true, true, false),
            special(3, "<|e", false, false, false),
        ];
        assert_eq!(
            partition("a <x> b<|end|>  c<|e", &specials, true),
            [
                Text("a"),
                Token(2),
                Text(" b"),
                Token(1),
                Text("c"),
                Token(3)
            ]
        );
        assert_eq!(
            partition("a <x> b<|end|>", &specials, false),
            [Text("a"), Token(2), Text(" b<|end|>")]
        );
        assert_eq!(partition("", &specials, true), []);
        assert_eq!(partition("<x><x>", &specials, true), [Token(2), Token(2)]);
    }
}
