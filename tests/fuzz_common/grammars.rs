//! Random grammars and JSON schemas for the constraint compiler, drawn from a byte string (the
//! fuzzer's input, or random bytes in `cargo test`): chains of rules, deep nesting, recursion,
//! `$ref` chains and cycles, wide `anyOf`, long literals, in GBNF, Lark, regular expressions and
//! JSON schema. Schemas are written as text and read back with `serde_json` (whose 128-level
//! limit a request's body meets too); a text it refuses is not a case.

use serde_json::Value;
use transformer::decode::constraint::{ConstraintVocab, Grammar};
use transformer::text::token_bytes::TokenBytes;

/// The vocabulary cases compile against: one token per printable ASCII byte and a special end
/// token.
pub fn byte_vocab() -> ConstraintVocab {
    let mut tokens: Vec<TokenBytes> = (0x20u8..0x7f)
        .map(|b| TokenBytes {
            bytes: vec![b],
            special: false,
        })
        .collect();
    tokens.push(TokenBytes {
        bytes: b"<|end|>".to_vec(),
        special: true,
    });
    let end = tokens.len() as u32 - 1;
    ConstraintVocab::new(&tokens, tokens.len(), &[end]).expect("the byte vocabulary")
}

/// Choices read from bytes; past their end every choice is 0.
pub struct Choices<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Choices<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Choices { data, pos: 0 }
    }

    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    /// A number in `0..n` (n ≥ 1).
    pub fn below(&mut self, n: usize) -> usize {
        let x = u16::from_le_bytes([self.byte(), self.byte()]) as usize;
        x % n.max(1)
    }

    /// A size, small most often, up to `max`: one of 1..8, up to 64 or up to `max`.
    fn size(&mut self, max: usize) -> usize {
        match self.below(4) {
            0 | 1 => 1 + self.below(8),
            2 => 1 + self.below(64),
            _ => 1 + self.below(max),
        }
    }
}

/// A GBNF or Lark item: a literal, a class, a reference to `rule` (any of `0..rules`), a group.
fn item(c: &mut Choices, rules: usize, lark: bool) -> String {
    let name = |i: usize| format!("r{i}");
    match c.below(6) {
        0 => format!("\"{}\"", "ab".repeat(c.size(500))),
        1 => match lark {
            true => "/[a-z]/".into(),
            false => "[a-z]".into(),
        },
        2 | 3 => name(c.below(rules)),
        4 => format!("({} | {})", name(c.below(rules)), "\"x\""),
        _ => format!("\"y\"{}", ["*", "+", "?", "{2,3}"][c.below(4)]),
    }
}

/// Rules `r0 … r{n-1}` (each `r{i}` refers to `r{i+1}` with random other items, so a chain of
/// `n`; references back make recursion), `root`/`start` referring to `r0`.
fn rules(c: &mut Choices, lark: bool) -> String {
    let n = c.size(1500);
    let (start, def) = match lark {
        true => ("start:", ":"),
        false => ("root ::=", " ::="),
    };
    let mut text = format!("{start} r0\n");
    for i in 0..n {
        let mut body = Vec::new();
        if i + 1 < n {
            body.push(format!("r{}", i + 1));
        }
        for _ in 0..c.below(3) {
            body.push(item(c, n, lark));
        }
        let alt = c.below(3) == 0;
        body.push("\"z\"".into());
        let joined = body.join(if alt { " | " } else { " " });
        text.push_str(&format!("r{i}{def} {joined}\n"));
    }
    text
}

/// Parentheses `depth` deep around a literal, with alternatives or repetitions at some levels.
fn nesting(c: &mut Choices, depth: usize, open: &str, close: &str) -> String {
    let mut text = String::new();
    let mut closes = Vec::with_capacity(depth);
    for _ in 0..depth {
        match c.below(3) {
            0 => {
                text.push_str(open);
                text.push_str("\"a\" | ");
                closes.push(close.to_string());
            }
            1 => {
                text.push_str(open);
                closes.push(format!("{close}*"));
            }
            _ => {
                text.push_str(open);
                closes.push(close.to_string());
            }
        }
    }
    text.push_str("\"x\"");
    while let Some(c) = closes.pop() {
        text.push_str(&c);
    }
    text
}

/// A JSON schema as text: nested objects, arrays, `$ref` chains, cycles, self-reference, wide
/// `anyOf`.
fn schema(c: &mut Choices) -> String {
    match c.below(6) {
        0 => {
            let depth = c.size(200);
            let mut s = String::from("{\"type\": \"integer\"}");
            for _ in 0..depth {
                s = match c.below(2) {
                    0 => format!("{{\"type\": \"object\", \"properties\": {{\"a\": {s}}}, \"required\": [\"a\"]}}"),
                    _ => format!("{{\"type\": \"array\", \"items\": {s}, \"maxItems\": 2}}"),
                };
            }
            s
        }
        1 => {
            let n = c.size(1200);
            let back = c.below(2) == 0;
            let defs: Vec<String> = (0..n)
                .map(|i| match (i + 1 < n, back) {
                    (true, _) => format!("\"d{i}\": {{\"$ref\": \"#/$defs/d{}\"}}", i + 1),
                    (false, true) => format!("\"d{i}\": {{\"anyOf\": [{{\"$ref\": \"#/$defs/d0\"}}, {{\"type\": \"null\"}}]}}"),
                    (false, false) => format!("\"d{i}\": {{\"type\": \"string\"}}"),
                })
                .collect();
            format!("{{\"$defs\": {{{}}}, \"$ref\": \"#/$defs/d0\"}}", defs.join(", "))
        }
        2 => {
            let n = c.size(3000);
            let options: Vec<String> = (0..n)
                .map(|i| format!("{{\"type\": \"object\", \"properties\": {{\"k{i}\": {{\"type\": \"integer\"}}}}, \"required\": [\"k{i}\"]}}"))
                .collect();
            format!("{{\"anyOf\": [{}]}}", options.join(", "))
        }
        3 => ["{\"$ref\": \"#\"}", "{\"properties\": {\"me\": {\"$ref\": \"#\"}}, \"required\": [\"me\"]}",
              "{\"$defs\": {\"a\": {\"$ref\": \"#/$defs/b\"}, \"b\": {\"$ref\": \"#/$defs/a\"}}, \"$ref\": \"#/$defs/a\"}",
              "{\"$ref\": \"#/$defs/missing\"}", "{\"allOf\": [{\"$ref\": \"#\"}, {\"type\": \"object\"}]}"][c.below(5)]
            .to_string(),
        4 => {
            let depth = c.size(150);
            format!("{}{{}}{}", "{\"not\": ".repeat(depth), "}".repeat(depth))
        }
        _ => format!("{{\"type\": \"string\", \"pattern\": \"{}\"}}", "(a|".repeat(c.size(100)) + "b" + &")".repeat(c.size(100))),
    }
}

/// One case: its kind (for reports) and the grammar; `None` when its schema text does not
/// parse.
pub fn case(c: &mut Choices) -> Option<(&'static str, Grammar)> {
    Some(match c.below(7) {
        0 => ("gbnf rules", Grammar::Gbnf(rules(c, false))),
        1 => {
            let depth = c.size(6000);
            (
                "gbnf nesting",
                Grammar::Gbnf(format!("root ::= {}\n", nesting(c, depth, "(", ")"))),
            )
        }
        2 => ("lark rules", Grammar::Lark(rules(c, true))),
        3 => {
            let depth = c.size(6000);
            (
                "lark nesting",
                Grammar::Lark(format!("start: {}\n", nesting(c, depth, "(", ")"))),
            )
        }
        4 => {
            let depth = c.size(3000);
            (
                "regex",
                Grammar::Regex(format!("{}b{}", "(a|".repeat(depth), ")*".repeat(depth))),
            )
        }
        5 => {
            let text = schema(c);
            (
                "lark %json",
                Grammar::Lark(format!("start: \"<\" %json {text} \">\"\n")),
            )
        }
        _ => {
            let value: Value = serde_json::from_str(&schema(c)).ok()?;
            ("json schema", Grammar::JsonSchema(value))
        }
    })
}

/// Whether an error message is fit for a client: short, one line, no panic, backtrace, path or
/// parser dump.
pub fn clean(message: &str) -> bool {
    message.len() < 500
        && !message.contains('\n')
        && [
            "panic",
            "backtrace",
            "/root/",
            ".cargo",
            ".rs:",
            "<state>",
            "NoExtensionBias",
        ]
        .iter()
        .all(|bad| !message.contains(bad))
}
