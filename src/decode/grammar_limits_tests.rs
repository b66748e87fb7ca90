//! The bounds: chains, nesting and `$ref` depth measured as intended, hostile inputs (a chain
//! of 1,000 rules, 5,000 parentheses, 500 chained `$defs`) refused in a sentence naming the
//! limit, inputs at the limits compiled on the compiling thread, llguidance's messages cleaned.

use super::*;
use crate::decode::constraint::{ConstraintVocab, Grammar};
use serde_json::json;
use std::time::Instant;

fn vocab() -> ConstraintVocab {
    crate::decode::constraint::tests::byte_vocab().0
}

/// `root ::= r0`, `r{i} ::= r{i+1} "a"`, …, `r{n} ::= "b"`.
fn gbnf_chain(n: usize) -> String {
    let mut g = String::from("root ::= r0\n");
    for i in 0..n {
        g.push_str(&format!("r{i} ::= r{} \"a\"\n", i + 1));
    }
    g.push_str(&format!("r{n} ::= \"b\"\n"));
    g
}

/// `start: r0`, `r{i}: r{i+1} "a"`, …, `r{n}: "b"`.
fn lark_chain(n: usize) -> String {
    gbnf_chain(n)
        .replace("root ::=", "start:")
        .replace(" ::=", ":")
}

/// `$defs` `d0` … `d{n}`, each but the last a `$ref` to the next; the root refers to `d0`.
fn defs_chain(n: usize) -> Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        defs.insert(format!("d{i}"), json!({"$ref": format!("#/$defs/d{}", i + 1)}));
    }
    defs.insert(format!("d{n}"), json!({"type": "integer"}));
    json!({"$defs": defs, "$ref": "#/$defs/d0"})
}

fn parens(n: usize) -> String {
    format!("root ::= {}\"x\"{}\n", "(".repeat(n), ")".repeat(n))
}

/// Compiles `g`: the error's text, or `None` when it compiled; in well under 2 s.
fn compile(cv: &ConstraintVocab, g: Grammar) -> Option<String> {
    let start = Instant::now();
    let out = cv.compile(&g).err().map(|e| e.to_string());
    assert!(start.elapsed().as_secs_f64() < 2.0, "{:?}", start.elapsed());
    out
}

#[test]
fn chain_depths_count_links_and_stop_at_recursion() {
    assert_eq!(chain_depths(&[vec![1], vec![2], vec![]]), vec![3, 2, 1]);
    // A cycle 0 → 1 → 0: each chain ends where it would repeat.
    let cycle = chain_depths(&[vec![1], vec![0]]);
    assert!(cycle.iter().all(|&d| d <= 2), "{cycle:?}");
    // A diamond counts its longest side.
    assert_eq!(chain_depths(&[vec![1, 2], vec![3], vec![], vec![]])[0], 3);
    let long: Vec<Vec<usize>> = (0..100_000).map(|i| vec![i + 1]).chain([vec![]]).collect();
    assert_eq!(chain_depths(&long)[0], 100_001);
}

#[test]
fn schema_depth_follows_refs() {
    assert_eq!(schema_depth(&json!({"type": "integer"})), 1);
    assert_eq!(schema_depth(&json!({"a": {"b": {}}})), 3);
    assert!(schema_depth(&defs_chain(500)) > 500);
    assert!(schema_depth(&defs_chain(10)) < 30);
    // Self-reference ends.
    let d = schema_depth(&json!({"properties": {"me": {"$ref": "#"}}}));
    assert!(d <= 6, "{d}");
}

#[test]
fn hostile_inputs_are_refused_naming_the_limit() {
    let cv = vocab();
    let e = compile(&cv, Grammar::Gbnf(gbnf_chain(1000))).unwrap();
    assert!(e.contains("chain of") && e.contains("at most 200"), "{e}");
    let e = compile(&cv, Grammar::Gbnf(parens(5000))).unwrap();
    assert!(e.contains("nested more than 30"), "{e}");
    let e = compile(&cv, Grammar::Lark(lark_chain(1000))).unwrap();
    assert!(e.contains("grammar (Lark)") && e.contains("at most 200"), "{e}");
    let e = compile(&cv, Grammar::JsonSchema(defs_chain(500))).unwrap();
    assert!(e.contains("at most 256"), "{e}");
    // Stacked repetitions are no GBNF (nothing nests without parentheses).
    let e = compile(&cv, Grammar::Gbnf(format!("root ::= \"a\"{}\n", "*".repeat(50)))).unwrap();
    assert!(e.contains("unexpected '*'"), "{e}");
    let huge = format!("root ::= \"{}\"\n", "a".repeat(MAX_GRAMMAR_BYTES));
    let e = compile(&cv, Grammar::Gbnf(huge)).unwrap();
    assert!(e.contains("at most"), "{e}");
    // A %json schema inside Lark is checked too.
    let lark = format!("start: %json {}", defs_chain(500));
    let e = compile(&cv, Grammar::Lark(lark)).unwrap();
    assert!(e.contains("%json") && e.contains("at most 256"), "{e}");
}

#[test]
fn inputs_at_the_limits_compile() {
    let cv = vocab();
    for (what, g) in [
        ("gbnf chain", Grammar::Gbnf(gbnf_chain(MAX_RULE_DEPTH - 2))),
        ("gbnf parens", Grammar::Gbnf(parens(MAX_GBNF_NESTING))),
        ("lark chain", Grammar::Lark(lark_chain(MAX_RULE_DEPTH - 2))),
        ("defs chain", Grammar::JsonSchema(defs_chain(MAX_SCHEMA_DEPTH - 4))),
    ] {
        assert_eq!(compile(&cv, g), None, "{what}");
    }
}

#[test]
fn the_lark_scan_skips_strings_comments_and_directives() {
    // Names inside strings, regexes, comments and special tokens are not references; a rule
    // split over lines with `|` keeps its references.
    let text = "%llguidance {}\n// a: b\nstart: a \"b c\" /d e/ <|f|>\n  | b\n?a.2: \"x\"\nb: a\n";
    assert!(check_lark("t", text).is_ok());
    let mut chain = lark_chain(MAX_RULE_DEPTH + 5);
    chain.insert_str(0, "// start: nothing\n");
    assert!(check_lark("t", &chain).is_err());
}

#[test]
fn messages_are_cleaned() {
    let panic = "panic: assertion failed: grammar.symbols.len() < u16::MAX as usize - 10\n<backtrace>\n 0: /root/.cargo/registry/src/x.rs\n</backtrace>";
    let m = clean_message(panic);
    assert!(!m.contains("panic") && !m.contains("/root") && m.contains("65,000"), "{m}");
    let m = clean_message("failed: NoExtensionBias <state>\nrow 0 ...\n</state>");
    assert!(!m.contains("state") && !m.contains("NoExtensionBias"), "{m}");
    assert!(m.starts_with("no text satisfies it"), "{m}");
    let m = clean_message(&"x".repeat(5000));
    assert!(m.chars().count() <= MAX_MESSAGE_CHARS + 1, "{}", m.len());
    assert_eq!(clean_message("unknown type \"foo\""), "unknown type \"foo\"");
}
