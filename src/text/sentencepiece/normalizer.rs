//! SentencePiece's normalizer (`normalizer.cc`): the precompiled character map (rules as a
//! darts-clone double-array trie over UTF-8 bytes, the longest rule wins), user-defined symbols
//! kept whole, and the whitespace rules (leading, trailing and repeated spaces removed, spaces
//! escaped as `▁`, a `▁` put before the text or, `treat_whitespace_as_suffix`, after it).
//! The same code with a model's `denormalizer_spec` rewrites decoded text.

use super::proto::NormalizerSpec;
use super::unigram::PieceTrie;
use std::borrow::Cow;

/// U+2581 LOWER ONE EIGHTH BLOCK, the visible space of the pieces.
pub(super) const SPACE_SYMBOL: &str = "\u{2581}";

/// U+FFFD, what a malformed UTF-8 byte becomes.
const REPLACEMENT: &[u8] = "\u{FFFD}".as_bytes();

/// Tries hold at most this many matches of one prefix (`Normalizer::kMaxTrieResultsSize`).
const MAX_TRIE_RESULTS: usize = 32;

/// The bytes of the UTF-8 character whose first byte is `lead` (1 for a continuation byte), as
/// SentencePiece's `OneCharLen` reads it.
pub(super) fn one_char_len(lead: u8) -> usize {
    const LENGTHS: [u8; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    usize::from(LENGTHS[usize::from(lead >> 4)])
}

/// Whether `bytes` (not empty) starts with a well-formed UTF-8 character, and how many bytes
/// that character takes (1 when malformed): SentencePiece's `IsValidDecodeUTF8`. Overlong forms,
/// surrogates and code points above U+10FFFF are malformed; a literal U+FFFD is well formed.
pub(super) fn valid_utf8_prefix(bytes: &[u8]) -> (bool, usize) {
    let trail = |i: usize| bytes[i] & 0xC0 == 0x80;
    let valid = |c: u32| c < 0xD800 || (0xE000..=0x10FFFF).contains(&c);
    let b = |i: usize| u32::from(bytes[i]);
    let len = bytes.len();
    let lead = bytes[0];
    if lead < 0x80 {
        return (true, 1);
    }
    if len >= 2 && lead & 0xE0 == 0xC0 {
        let cp = ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
        if trail(1) && cp >= 0x80 && valid(cp) {
            return (true, 2);
        }
    } else if len >= 3 && lead & 0xF0 == 0xE0 {
        let cp = ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
        if trail(1) && trail(2) && cp >= 0x800 && valid(cp) {
            return (true, 3);
        }
    } else if len >= 4 && lead & 0xF8 == 0xF0 {
        let cp =
            ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
        if trail(1) && trail(2) && trail(3) && cp >= 0x10000 && valid(cp) {
            return (true, 4);
        }
    }
    (false, 1)
}

/// A precompiled character map: `<u32 LE trie size in bytes><trie units, u32 LE><replacement
/// strings, each ended by NUL>`; a rule's value is the offset of its replacement.
#[derive(Debug)]
struct CharsMap {
    /// The double-array units.
    units: Vec<u32>,
    /// The NUL-terminated replacement strings.
    strings: Vec<u8>,
}

// The fields of a darts-clone unit (`DoubleArrayUnit`).
fn has_leaf(unit: u32) -> bool {
    (unit >> 8) & 1 == 1
}
fn leaf_value(unit: u32) -> u32 {
    unit & ((1 << 31) - 1)
}
fn label(unit: u32) -> u32 {
    unit & ((1 << 31) | 0xFF)
}
fn offset(unit: u32) -> u32 {
    (unit >> 10) << ((unit & (1 << 9)) >> 6)
}

impl CharsMap {
    /// Reads and checks a blob, with the checks (and messages) of SentencePiece's
    /// `DecodePrecompiledCharsMap` and darts-clone's `validate`.
    fn parse(blob: &[u8]) -> Result<CharsMap, String> {
        if blob.len() <= 4 {
            return Err("blob for normalization rule is broken".to_string());
        }
        let trie_size = u32::from_le_bytes([blob[0], blob[1], blob[2], blob[3]]) as usize;
        let rest = &blob[4..];
        if trie_size >= rest.len() {
            return Err(format!(
                "trie data size ({trie_size} bytes) exceeds the input blob size ({} bytes)",
                blob.len()
            ));
        }
        if trie_size < 1024 || !trie_size.is_multiple_of(1024) {
            return Err(format!(
                "trie data size ({trie_size} bytes) is not divisible by 1024"
            ));
        }
        let units: Vec<u32> = rest[..trie_size]
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let strings = rest[trie_size..].to_vec();
        if strings.last() != Some(&0) {
            return Err("normalized block must be null terminated".to_string());
        }
        let map = CharsMap { units, strings };
        if !map.is_valid() {
            return Err("precompiled_charsmap is invalid".to_string());
        }
        Ok(map)
    }

    /// darts-clone's `DoubleArray::validate(max_value_limit)`, the limit being the size of the
    /// strings: every unit's children lie inside the array, every node with a leaf has one,
    /// every leaf's offset lies inside the strings.
    fn is_valid(&self) -> bool {
        let size = self.units.len();
        let Some(&root) = self.units.first() else {
            return false;
        };
        if label(root) != 0 || has_leaf(root) || offset(root) == 0 {
            return false;
        }
        if (offset(root) as usize | 0xFF) >= size {
            return false;
        }
        for (i, &unit) in self.units.iter().enumerate().skip(1) {
            if label(unit) <= 0xFF {
                let child = i ^ offset(unit) as usize;
                if (child | 0xFF) >= size {
                    return false;
                }
                if has_leaf(unit) && label(self.units[child]) <= 0xFF {
                    return false;
                }
            } else if leaf_value(unit) as usize >= self.strings.len() {
                return false;
            }
        }
        true
    }

    /// The longest rule that prefixes `input`: its length and its replacement
    /// (`DoubleArray::commonPrefixSearch` keeping at most 32 matches, the last the longest).
    fn longest_match(&self, input: &[u8]) -> Option<(usize, &[u8])> {
        let unit_at = |pos: usize| self.units.get(pos).copied();
        let mut node = offset(unit_at(0)?) as usize;
        let mut found = None;
        let mut count = 0;
        // (A checked map keeps every position inside the array: `None` only ends the search.)
        for (i, &byte) in input.iter().enumerate() {
            node ^= usize::from(byte);
            let Some(unit) = unit_at(node).filter(|&u| label(u) == u32::from(byte)) else {
                break;
            };
            node ^= offset(unit) as usize;
            if has_leaf(unit) {
                if count < MAX_TRIE_RESULTS {
                    let Some(leaf) = unit_at(node) else { break };
                    found = Some((i + 1, leaf_value(leaf) as usize));
                }
                count += 1;
            }
        }
        let (len, value) = found?;
        if len > input.len() || value >= self.strings.len() {
            return None;
        }
        let tail = &self.strings[value..];
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        Some((len, &tail[..end]))
    }
}

/// A normalizer: the rules of one `NormalizerSpec`.
#[derive(Debug)]
pub(super) struct Normalizer {
    /// The rules (`None`: an empty map, as `identity`).
    charsmap: Option<CharsMap>,
    /// The user-defined symbols, matched before the rules and kept unchanged.
    user_symbols: Option<PieceTrie>,
    add_dummy_prefix: bool,
    remove_extra_whitespaces: bool,
    escape_whitespaces: bool,
    /// From the trainer spec: the dummy `▁` goes after the text.
    treat_whitespace_as_suffix: bool,
}

impl Normalizer {
    /// The normalizer of `spec`; `user_symbols` are the model's user-defined pieces.
    pub(super) fn new(
        spec: &NormalizerSpec,
        treat_whitespace_as_suffix: bool,
        user_symbols: Option<PieceTrie>,
    ) -> Result<Normalizer, String> {
        let charsmap = if spec.precompiled_charsmap.is_empty() {
            None
        } else {
            Some(CharsMap::parse(&spec.precompiled_charsmap)?)
        };
        Ok(Normalizer {
            charsmap,
            user_symbols: user_symbols.filter(|t| !t.is_empty()),
            add_dummy_prefix: spec.add_dummy_prefix,
            remove_extra_whitespaces: spec.remove_extra_whitespaces,
            escape_whitespaces: spec.escape_whitespaces,
            treat_whitespace_as_suffix,
        })
    }

    /// The text `input` starts with, normalized, and how many bytes of `input` it replaces
    /// (`Normalizer::NormalizePrefix`): a user-defined symbol whole, else the longest rule,
    /// else one character unchanged (U+FFFD for one malformed byte).
    fn normalize_prefix<'a>(&'a self, input: &'a [u8]) -> (&'a [u8], usize) {
        if let Some(len) = self
            .user_symbols
            .as_ref()
            .and_then(|t| t.longest_prefix(input))
        {
            return (&input[..len], len);
        }
        if let Some((len, replacement)) =
            self.charsmap.as_ref().and_then(|m| m.longest_match(input))
        {
            return (replacement, len);
        }
        match valid_utf8_prefix(input) {
            (true, len) => (&input[..len], len),
            (false, _) => (REPLACEMENT, 1),
        }
    }

    /// The normalized text (`Normalizer::Normalize`).
    pub(super) fn normalize(&self, input: &str) -> String {
        let mut input = input.as_bytes();
        if self.remove_extra_whitespaces {
            while !input.is_empty() {
                let (replacement, consumed) = self.normalize_prefix(input);
                if replacement != b" " {
                    break;
                }
                input = &input[consumed..];
            }
        }
        if input.is_empty() {
            return String::new();
        }
        let space: &[u8] = if self.escape_whitespaces {
            SPACE_SYMBOL.as_bytes()
        } else {
            b" "
        };
        let mut out: Vec<u8> = Vec::with_capacity(input.len() * 3);
        if !self.treat_whitespace_as_suffix && self.add_dummy_prefix {
            out.extend_from_slice(space);
        }
        let mut is_prev_space = self.remove_extra_whitespaces;
        while !input.is_empty() {
            let (mut piece, consumed) = self.normalize_prefix(input);
            while is_prev_space && piece.first() == Some(&b' ') {
                piece = &piece[1..];
            }
            if !piece.is_empty() {
                for &byte in piece {
                    if self.escape_whitespaces && byte == b' ' {
                        out.extend_from_slice(SPACE_SYMBOL.as_bytes());
                    } else {
                        out.push(byte);
                    }
                }
                is_prev_space = piece.ends_with(b" ");
            }
            input = &input[consumed..];
            if !self.remove_extra_whitespaces {
                is_prev_space = false;
            }
        }
        if self.remove_extra_whitespaces {
            while out.ends_with(space) {
                out.truncate(out.len() - space.len());
            }
        }
        if self.treat_whitespace_as_suffix && self.add_dummy_prefix {
            out.extend_from_slice(space);
        }
        // Replacement strings of a well-formed map are UTF-8; a corrupt one is made so.
        match String::from_utf8(out) {
            Ok(text) => text,
            Err(e) => match String::from_utf8_lossy(e.as_bytes()) {
                Cow::Owned(text) => text,
                Cow::Borrowed(text) => text.to_string(),
            },
        }
    }
}
