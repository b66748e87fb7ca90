//! Model files against the `sentencepiece` package (0.2.3): hand-made and truncated ones
//! (malformed.json, malformed-bpe.json: loaded where the package loads them, refused where it
//! refuses them, for the same reason), refused algorithms, and damaged copies of the fixtures
//! (never a panic).

use super::tests::{fixtures, ids, read_json, split, strings};
use super::SentencePiece;
use serde_json::Value;
use std::path::Path;

fn from_hex(hex: &str) -> Vec<u8> {
    let digit = |c: u8| (c as char).to_digit(16).expect("hex") as u8;
    hex.as_bytes()
        .chunks(2)
        .map(|p| digit(p[0]) << 4 | digit(p[1]))
        .collect()
}

/// Whether a model the package loads encodes and decodes as it did (`case` holds `encodes`:
/// [text, pieces, ids], `decode_pieces` and `decode_ids`: [input, text]).
fn check_loaded(sp: &SentencePiece, case: &Value, what: &str) {
    for probe in case["encodes"].as_array().expect("encodes") {
        let text = probe[0].as_str().expect("text");
        let encoded = sp.encode(text);
        let (pieces, got_ids) = split(&encoded);
        assert_eq!(pieces, strings(&probe[1]), "{what}: pieces of {text:?}");
        assert_eq!(got_ids, ids(&probe[2]), "{what}: ids of {text:?}");
    }
    for probe in case["decode_pieces"].as_array().expect("decode_pieces") {
        let pieces = strings(&probe[0]);
        let want = probe[1].as_str().expect("text");
        assert_eq!(
            sp.decode_pieces(&pieces),
            want,
            "{what}: decode_pieces({pieces:?})"
        );
    }
    for probe in case["decode_ids"].as_array().expect("decode_ids") {
        let input = ids(&probe[0]);
        let want = probe[1].as_str().expect("text");
        assert_eq!(
            sp.decode_ids(&input).expect("in range"),
            want,
            "{what}: decode_ids({input:?})"
        );
    }
}

/// The words of the port's message for the package's reason to refuse a model.
fn same_reason(package: &str) -> &'static str {
    const REASONS: [(&str, &str); 16] = [
        ("ParseFromArray", "not a valid model protobuf"),
        (
            "Blob for normalization rule is broken",
            "blob for normalization rule is broken",
        ),
        ("exceeds the input blob size", "exceeds the input blob size"),
        ("is not divisible by 1024", "is not divisible by 1024"),
        (
            "must be null terminated",
            "normalized block must be null terminated",
        ),
        (
            "precompiled_charsmap is invalid",
            "precompiled_charsmap is invalid",
        ),
        ("unk is not defined", "no unknown piece"),
        ("unk is already defined", "two unknown pieces"),
        ("piece must not be empty", "is empty"),
        (
            "piece must not include null character",
            "holds a NUL character",
        ),
        ("is already defined", "is already defined"),
        ("no pieces are loaded", "no piece to segment text with"),
        (
            "is found although `byte_fallback` is false",
            "in a model without byte_fallback",
        ),
        (
            "there are not 256 byte pieces",
            "the 256 byte pieces are not all there",
        ),
        ("is invalid.", "invalid byte piece"),
        ("score is NaN or Inf", "has a score of"),
    ];
    let found = REASONS.iter().find(|(theirs, _)| package.contains(theirs));
    found
        .unwrap_or_else(|| panic!("no reason for the package's {package:?}"))
        .1
}

#[test]
fn malformed_models_are_refused_where_the_package_refuses_them() {
    check_malformed("malformed.json");
}

/// The hand-made and truncated models of `file` (malformed.json's layout) load where the
/// package loads them, and then encode and decode as it did, and are refused where it refuses
/// them, for the same reason.
pub(super) fn check_malformed(file: &str) {
    let expected = read_json(&fixtures().join(file));
    let path = Path::new("crafted.model");
    let cases = expected["cases"].as_array().expect("cases");
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let bytes = from_hex(case["hex"].as_str().expect("hex"));
        let result = SentencePiece::from_bytes(&bytes, path);
        // Refused by design: word and char models, and a model without `<unk>` (which the
        // package accepts when it has byte fallback).
        let refused_by_design = ["word", "char", "fallback-without-unk"].contains(&name);
        match (&result, case["loads"].as_bool().expect("loads")) {
            (Ok(sp), true) => check_loaded(sp, case, name),
            (Err(e), false) => {
                let message = e.to_string();
                assert!(message.starts_with("crafted.model: "), "{name}: {message}");
                let package = case["error"].as_str().expect("error");
                let reason = same_reason(package);
                assert!(
                    message.contains(reason),
                    "{name}: {message} (package: {package})"
                );
            }
            (Err(e), true) if refused_by_design => {
                let message = e.to_string();
                let expected = match name {
                    "word" | "char" => format!("SentencePiece {name} models are not supported"),
                    _ => "no unknown piece".to_string(),
                };
                assert!(message.contains(&expected), "{message}");
                assert!(message.contains("crafted.model"), "{message}");
            }
            (Err(e), true) => panic!("{name}: the package loads it, the port says {e}"),
            (Ok(_), false) => panic!(
                "{name}: the package refuses it ({}), the port loads it",
                case["error"]
            ),
        }
    }
    let model_name = expected["truncated_model"].as_str().expect("model");
    let full = std::fs::read(fixtures().join(model_name)).expect("model");
    let truncated = expected["truncated"].as_array().expect("truncated");
    for case in truncated {
        let cut = case["cut"].as_u64().expect("cut") as usize;
        let what = format!("{model_name} cut to {cut} bytes");
        match (
            SentencePiece::from_bytes(&full[..cut], path),
            case["loads"].as_bool().expect("loads"),
        ) {
            (Ok(sp), true) => check_loaded(&sp, case, &what),
            (Err(_), false) => {}
            (Ok(_), false) => panic!(
                "{what}: the package refuses it ({}), the port loads it",
                case["error"]
            ),
            (Err(e), true) => panic!("{what}: the package loads it, the port says {e}"),
        }
    }
    eprintln!(
        "{} hand-made and {} truncated models",
        cases.len(),
        truncated.len()
    );
}

/// The model "minimal" of malformed.json with one more piece of `len` bytes.
fn with_piece_of(len: usize) -> Vec<u8> {
    let expected = read_json(&fixtures().join("malformed.json"));
    let cases = expected["cases"].as_array().expect("cases");
    let minimal = cases
        .iter()
        .find(|c| c["name"] == "minimal")
        .expect("minimal");
    let mut bytes = from_hex(minimal["hex"].as_str().expect("hex"));
    let varint = |mut n: usize, out: &mut Vec<u8>| {
        while n >= 0x80 {
            out.push((n as u8 & 0x7F) | 0x80);
            n >>= 7;
        }
        out.push(n as u8);
    };
    let mut text = vec![0x0A]; // SentencePiece.piece, length-delimited
    varint(len, &mut text);
    text.extend(std::iter::repeat_n(b'x', len));
    bytes.push(0x0A); // ModelProto.pieces
    varint(text.len(), &mut bytes);
    bytes.extend(text);
    bytes
}

#[test]
fn pieces_of_8000_bytes_are_refused_as_the_package_refuses_them() {
    let path = Path::new("long.model");
    let sp = SentencePiece::from_bytes(&with_piece_of(7999), path).expect("7999 bytes load");
    assert_eq!(sp.len(), 7);
    let error = SentencePiece::from_bytes(&with_piece_of(8000), path).expect_err("too long");
    assert!(error.to_string().contains("piece 6 is too long"), "{error}");
}

#[test]
fn a_char_model_file_is_refused_by_name() {
    let path = fixtures().join("char.model");
    let error = SentencePiece::load(&path)
        .expect_err("char models are refused")
        .to_string();
    assert!(
        error.contains("SentencePiece char models are not supported"),
        "{error}"
    );
    assert!(error.contains(&path.display().to_string()), "{error}");
}

#[test]
fn a_missing_file_is_named() {
    let path = fixtures().join("no-such.model");
    let error = SentencePiece::load(&path).expect_err("missing").to_string();
    assert!(error.contains("no-such.model"), "{error}");
}

/// xorshift64: deterministic bytes for the damage test.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn damaged_files_give_errors_or_working_models_never_panics() {
    check_damaged(
        &[
            "user-symbols.model",
            "byte-fallback.model",
            "suffix.model",
            "bible-en.model",
        ],
        0x9E37_79B9_7F4A_7C15,
    );
}

/// Damaged copies of the model files (150 each: truncated, bits flipped, junk inserted, drawn
/// from `seed`) load or are refused with the file's name, and loaded ones encode and decode
/// without panicking.
pub(super) fn check_damaged(files: &[&str], seed: u64) {
    let path = Path::new("damaged.model");
    let mut state = seed;
    let mut loaded = 0;
    let mut tries = 0;
    for &name in files {
        let full = std::fs::read(fixtures().join(name)).expect("model");
        for _ in 0..150 {
            let mut bytes = full.clone();
            match xorshift(&mut state) % 3 {
                0 => bytes.truncate(xorshift(&mut state) as usize % full.len()),
                1 => {
                    for _ in 0..1 + xorshift(&mut state) % 4 {
                        let at = xorshift(&mut state) as usize % bytes.len();
                        bytes[at] ^= 1 << (xorshift(&mut state) % 8);
                    }
                }
                _ => {
                    let at = xorshift(&mut state) as usize % bytes.len();
                    let len = (xorshift(&mut state) % 64) as usize;
                    let junk: Vec<u8> = (0..len).map(|_| xorshift(&mut state) as u8).collect();
                    bytes.splice(at..at, junk);
                }
            }
            tries += 1;
            match SentencePiece::from_bytes(&bytes, path) {
                Ok(sp) => {
                    loaded += 1;
                    for text in ["Hello wörld  ﬁ 😀 日本", "", "  ", "a\0b", "aber <sep> ung ü"] {
                        let ids: Vec<u32> = sp.encode(text).into_iter().map(|(_, id)| id).collect();
                        sp.decode_ids(&ids).expect("encoded ids are in range");
                    }
                }
                Err(e) => assert!(e.to_string().contains("damaged.model"), "{e}"),
            }
        }
    }
    let garbage: Vec<u8> = (0..4096).map(|_| xorshift(&mut state) as u8).collect();
    assert!(SentencePiece::from_bytes(&garbage, path).is_err());
    assert!(
        SentencePiece::from_bytes(&[], path).is_err(),
        "no unknown piece"
    );
    eprintln!("{tries} damaged files, {loaded} still loaded");
}
