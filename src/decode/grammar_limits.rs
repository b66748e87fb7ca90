//! Bounds on what one request's grammar or JSON schema may ask of the compiler, checked before
//! llguidance sees it, and the cleaning of llguidance's error messages.
//!
//! llguidance compiles a grammar by recursion: a GBNF or Lark rule that refers to another rule
//! that refers to another … (terminals are inlined into one regular expression), a JSON schema
//! whose `$ref` leads to a definition whose `$ref` leads to another …, each link is a few stack
//! frames. A 20 KB chain of 1,000 rules overflowed a 2 MiB thread stack, and a stack overflow
//! aborts the process: no `catch_unwind` sees it. So:
//!
//! * every check here is iterative (no recursion on the input's shape) and runs before
//!   compiling: text size ([`MAX_GRAMMAR_BYTES`], [`MAX_SCHEMA_BYTES`]), the depth of rule
//!   chains ([`MAX_RULE_DEPTH`]) and of schema nesting counted through `$ref`
//!   ([`MAX_SCHEMA_DEPTH`]);
//! * compiling runs on a thread of its own with [`COMPILE_STACK`] bytes of stack, many times
//!   what inputs within these limits need (the limit-sized cases are tested to compile);
//! * a panic inside llguidance comes back as an error ([`clean_message`] turns it into one
//!   short sentence: no backtrace, no paths, no parser state).

use crate::error::{Error, Result};
use serde_json::Value;
use std::collections::HashMap;

/// Bytes of a `regex`, Lark or GBNF text.
pub const MAX_GRAMMAR_BYTES: usize = 128 * 1024;
/// Bytes of a JSON schema, written compactly.
pub const MAX_SCHEMA_BYTES: usize = 256 * 1024;
/// Rules in the longest chain of references (a rule referring back to one on its own chain,
/// recursion, ends the chain).
pub const MAX_RULE_DEPTH: usize = 200;
/// Nesting of GBNF parentheses (llguidance's Lark reader takes 30 levels at most, so deeper
/// groups that are not simplified away would fail there anyway).
pub const MAX_GBNF_NESTING: usize = 30;
/// Nesting of a JSON schema (objects and arrays), a `$ref` counted as its target's nesting.
pub const MAX_SCHEMA_DEPTH: usize = 256;
/// The compiling thread's stack.
pub const COMPILE_STACK: usize = 64 << 20;
/// Characters of an error message passed on to a client.
pub const MAX_MESSAGE_CHARS: usize = 300;

/// For each node of a graph (`edges[i]`: the nodes node `i` refers to), the length in nodes of
/// the longest chain starting there, a reference back to a node on the chain ending it.
/// Iterative depth-first search, each node finished once.
pub fn chain_depths(edges: &[Vec<usize>]) -> Vec<usize> {
    let n = edges.len();
    // 0: not seen, 1: on the stack, 2: done.
    let mut state = vec![0u8; n];
    let mut depth = vec![1usize; n];
    for start in 0..n {
        if state[start] != 0 {
            continue;
        }
        let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
        state[start] = 1;
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            if let Some(&child) = edges[node].get(*next) {
                *next += 1;
                match state.get(child) {
                    Some(0) => {
                        state[child] = 1;
                        stack.push((child, 0));
                    }
                    Some(2) => depth[node] = depth[node].max(depth[child] + 1),
                    _ => {}
                }
            } else {
                state[node] = 2;
                stack.pop();
                if let Some(&(parent, _)) = stack.last() {
                    depth[parent] = depth[parent].max(depth[node] + 1);
                }
            }
        }
    }
    depth
}

/// Errs when `bytes` exceeds `limit`.
pub fn check_size(what: &str, bytes: usize, limit: usize) -> Result<()> {
    match bytes > limit {
        true => Err(Error::Input(format!(
            "{what} is {bytes} bytes; at most {limit}"
        ))),
        false => Ok(()),
    }
}

/// Errs when the longest chain of rules (`depths` from [`chain_depths`]) exceeds
/// [`MAX_RULE_DEPTH`].
pub fn check_rule_depth(what: &str, depths: &[usize]) -> Result<()> {
    let deepest = depths.iter().copied().max().unwrap_or(0);
    match deepest > MAX_RULE_DEPTH {
        true => Err(Error::Input(format!(
            "{what}: a chain of {deepest} rules each referring to the next; \
             at most {MAX_RULE_DEPTH}"
        ))),
        false => Ok(()),
    }
}

/// The `$ref`s (to this document, `#…`) inside `value`, each with its nesting below `value`;
/// and `value`'s own nesting. Iterative. Data keywords (`const`, `enum`, `default`,
/// `examples`) are not schemas and are skipped.
fn refs_within(value: &Value) -> (Vec<(&str, usize)>, usize) {
    let mut refs = Vec::new();
    let mut deepest = 0;
    let mut stack = vec![(value, 1usize)];
    while let Some((v, d)) = stack.pop() {
        deepest = deepest.max(d);
        match v {
            Value::Object(map) => {
                for (k, child) in map {
                    match (k.as_str(), child) {
                        ("$ref", Value::String(r)) if r.starts_with('#') => refs.push((&r[..], d)),
                        ("const" | "enum" | "default" | "examples", _) => {}
                        (_, Value::Object(_) | Value::Array(_)) => stack.push((child, d + 1)),
                        _ => {}
                    }
                }
            }
            Value::Array(items) => {
                for child in items {
                    if child.is_object() || child.is_array() {
                        stack.push((child, d + 1));
                    }
                }
            }
            _ => {}
        }
    }
    (refs, deepest)
}

/// A JSON schema's nesting, each `$ref` into the document counted as the nesting of its target
/// (a `$ref` back into a schema already being counted, recursion, counts nothing more).
pub fn schema_depth(root: &Value) -> usize {
    // Nodes: the root and every `$ref` target, by pointer.
    let mut ids: HashMap<String, usize> = HashMap::from([(String::new(), 0)]);
    let mut values: Vec<&Value> = vec![root];
    let mut edges: Vec<Vec<(usize, usize)>> = Vec::new();
    let mut own: Vec<usize> = Vec::new();
    let mut i = 0;
    while i < values.len() {
        let (refs, deepest) = refs_within(values[i]);
        own.push(deepest);
        let mut out = Vec::new();
        for (r, at) in refs {
            let pointer = &r[1..];
            if let Some(&id) = ids.get(pointer) {
                out.push((id, at));
            } else if let Some(target) = root.pointer(pointer) {
                ids.insert(pointer.to_string(), values.len());
                out.push((values.len(), at));
                values.push(target);
            }
        }
        edges.push(out);
        i += 1;
    }
    // Longest weighted path, iteratively, a back edge counting nothing (as in chain_depths).
    let n = values.len();
    let mut state = vec![0u8; n];
    let mut depth = own.clone();
    let mut stack: Vec<(usize, usize)> = vec![(0, 0)];
    state[0] = 1;
    while let Some(&mut (node, ref mut next)) = stack.last_mut() {
        if let Some(&(child, at)) = edges[node].get(*next) {
            *next += 1;
            match state[child] {
                0 => {
                    state[child] = 1;
                    stack.push((child, 0));
                }
                2 => depth[node] = depth[node].max(at + depth[child]),
                _ => {}
            }
        } else {
            state[node] = 2;
            stack.pop();
            if let Some(&(parent, k)) = stack.last() {
                let at = edges[parent][k - 1].1;
                depth[parent] = depth[parent].max(at + depth[node]);
            }
        }
    }
    depth[0]
}

/// Errs when the schema is larger than [`MAX_SCHEMA_BYTES`] or nests deeper than
/// [`MAX_SCHEMA_DEPTH`] (see [`schema_depth`]).
pub fn check_schema(schema: &Value) -> Result<()> {
    check_size("the JSON schema", schema.to_string().len(), MAX_SCHEMA_BYTES)?;
    let depth = schema_depth(schema);
    match depth > MAX_SCHEMA_DEPTH {
        true => Err(Error::Input(format!(
            "the JSON schema nests {depth} levels deep, counting each $ref as its target's \
             nesting; at most {MAX_SCHEMA_DEPTH}"
        ))),
        false => Ok(()),
    }
}

/// Checks a Lark text (written by a client, or converted from GBNF): its size, the chains of
/// its rules (see [`chain_depths`]), and each schema embedded with `%json`. A scan of its
/// tokens, not a parse: strings, regular expressions, comments, special tokens and the JSON
/// after a `%` directive are skipped; a name first on its line and followed by `:` (after an
/// optional `.priority`) starts a rule, every other name is a reference. Errors of syntax are
/// llguidance's to find.
pub fn check_lark(what: &str, text: &str) -> Result<()> {
    check_size(what, text.len(), MAX_GRAMMAR_BYTES)?;
    let b = text.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut ids: HashMap<&str, usize> = HashMap::new();
    let mut refs: Vec<Vec<&str>> = Vec::new();
    let mut current: Option<usize> = None;
    let mut line_start = true;
    let mut i = 0;
    // Skips a quoted run from the opening `b[i]` to past its closing twin (or the end).
    let skip_quoted = |mut i: usize, close: u8| {
        i += 1;
        while i < b.len() && b[i] != close && b[i] != b'\n' {
            i += if b[i] == b'\\' { 2 } else { 1 };
        }
        match b.get(i) == Some(&close) {
            true => i + 1,
            false => i,
        }
    };
    while i < b.len() {
        let c = b[i];
        let at_start = line_start;
        line_start = c == b'\n' || (line_start && matches!(c, b' ' | b'\t' | b'\r' | b'?' | b'!'));
        match c {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'"' | b'/' => {
                i = skip_quoted(i, c);
                continue;
            }
            b'<' => {
                i = skip_quoted(i, b'>');
                continue;
            }
            b'%' => {
                let start = i + 1;
                i = start;
                while i < b.len() && word(b[i]) {
                    i += 1;
                }
                let directive = &text[start..i];
                while i < b.len() && matches!(b[i], b' ' | b'\t') {
                    i += 1;
                }
                if b.get(i) == Some(&b'{') {
                    let mut json =
                        serde_json::Deserializer::from_str(&text[i..]).into_iter::<Value>();
                    if let Some(Ok(value)) = json.next() {
                        if directive == "json" {
                            check_schema(&value)
                                .map_err(|e| Error::Input(format!("{what}: %json: {e}")))?;
                        }
                        i += json.byte_offset();
                    }
                }
                continue;
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < b.len() && word(b[i]) {
                    i += 1;
                }
                let name = &text[start..i];
                let mut j = i;
                if b.get(j) == Some(&b'.') {
                    j += 1;
                    while j < b.len() && (b[j].is_ascii_digit() || b[j] == b'-') {
                        j += 1;
                    }
                }
                while j < b.len() && matches!(b[j], b' ' | b'\t') {
                    j += 1;
                }
                if at_start && b.get(j) == Some(&b':') {
                    let next = ids.len();
                    let id = *ids.entry(name).or_insert(next);
                    if id == refs.len() {
                        refs.push(Vec::new());
                    }
                    current = Some(id);
                    i = j + 1;
                } else if let Some(rule) = current {
                    refs[rule].push(name);
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    let edges: Vec<Vec<usize>> = refs
        .iter()
        .map(|names| names.iter().filter_map(|n| ids.get(n).copied()).collect())
        .collect();
    check_rule_depth(what, &chain_depths(&edges))
}

/// An error message of llguidance made fit for a client: a panic inside it named as such in one
/// sentence, a parser state dump or backtrace cut off, the length capped at
/// [`MAX_MESSAGE_CHARS`].
pub fn clean_message(raw: &str) -> String {
    if raw.contains("panic:") || raw.contains("<backtrace>") {
        return match raw.contains("symbols.len()") {
            true => "it needs more grammar symbols than the compiler can hold (65,000)".into(),
            false => "the grammar compiler failed on it (it is too large or too complex)".into(),
        };
    }
    if raw.contains("NoExtensionBias") {
        // llguidance's stop reason where no token at all may come first.
        return "no text satisfies it (no token can start it; a $ref only to itself?)".into();
    }
    let mut text = raw.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
    for marker in ["<state>", "<grammar>"] {
        if let Some(at) = text.find(marker) {
            text = text[..at].trim_end();
        }
    }
    let text = text.trim().to_string();
    let text = match text.is_empty() {
        true => "it cannot be compiled".to_string(),
        false => text,
    };
    match text.chars().count() > MAX_MESSAGE_CHARS {
        true => format!(
            "{}…",
            text.chars().take(MAX_MESSAGE_CHARS).collect::<String>()
        ),
        false => text,
    }
}

#[cfg(test)]
#[path = "grammar_limits_tests.rs"]
mod tests;
