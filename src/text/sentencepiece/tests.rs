//! The port against the `sentencepiece` package (0.2.3): what it made of the models, strings
//! and id sequences of tests/fixtures/sentencepiece (written by its `make.py`), of hand-made
//! and truncated model files, and of the `../shared/data` test corpora (hashed per line in
//! `<model>.lines`).

use super::SentencePiece;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The models of make.py: each has `<name>.json` and `<name>.lines`.
const MODELS: [&str; 7] = [
    "ding-de",
    "ding-en",
    "bible-en",
    "bible-es",
    "byte-fallback",
    "user-symbols",
    "suffix",
];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sentencepiece")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A model and what the package made of it.
fn model(name: &str) -> (SentencePiece, Value) {
    let expected = read_json(&fixtures().join(format!("{name}.json")));
    let path = fixtures().join(expected["model"].as_str().expect("model path"));
    let sp = SentencePiece::load(&path).unwrap_or_else(|e| panic!("{e}"));
    (sp, expected)
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .expect("array")
        .iter()
        .map(|v| v.as_str().expect("string"))
        .collect()
}

fn ids(value: &Value) -> Vec<u32> {
    let as_id = |v: &Value| v.as_u64().expect("id") as u32;
    value.as_array().expect("array").iter().map(as_id).collect()
}

/// FNV-1a, 32 bits (make.py's `fnv32`).
fn fnv32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811C_9DC5, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// make.py's `encode_hash`: FNV-1a of "piece\tid\n" for each piece.
fn encode_hash(encoded: &[(String, u32)]) -> u32 {
    let mut bytes = Vec::new();
    for (piece, id) in encoded {
        bytes.extend_from_slice(format!("{piece}\t{id}\n").as_bytes());
    }
    fnv32(&bytes)
}

fn split(encoded: &[(String, u32)]) -> (Vec<&str>, Vec<u32>) {
    encoded.iter().map(|(p, i)| (p.as_str(), *i)).unzip()
}

/// Panics with the count and the first few mismatches, if any.
fn report(what: &str, compared: usize, mismatches: &[String]) {
    eprintln!("{what}: {compared} compared, {} differ", mismatches.len());
    if !mismatches.is_empty() {
        let first: Vec<&str> = mismatches.iter().take(5).map(String::as_str).collect();
        panic!(
            "{what}: {} of {compared} differ; first:\n{}",
            mismatches.len(),
            first.join("\n")
        );
    }
}

#[test]
fn samples_encode_and_decode_as_the_package() {
    for name in MODELS {
        let (sp, expected) = model(name);
        let samples = expected["samples"].as_array().expect("samples");
        let mut mismatches = Vec::new();
        for sample in samples {
            let text = sample[0].as_str().expect("text");
            let encoded = sp.encode(text);
            let (pieces, got_ids) = split(&encoded);
            let (want_pieces, want_ids) = (strings(&sample[1]), ids(&sample[2]));
            if pieces != want_pieces || got_ids != want_ids {
                mismatches.push(format!(
                    "encode({text:?}):\n  got  {pieces:?} {got_ids:?}\n  want {want_pieces:?} {want_ids:?}"
                ));
                continue;
            }
            let by_ids = sp.decode_ids(&got_ids).expect("ids in range");
            let by_pieces = sp.decode_pieces(&pieces);
            let (want_ids_text, want_pieces_text) = (&sample[3], &sample[4]);
            if by_ids != want_ids_text.as_str().expect("text")
                || by_pieces != want_pieces_text.as_str().expect("text")
            {
                mismatches.push(format!(
                    "decode of encode({text:?}): got {by_ids:?} / {by_pieces:?}, \
                     want {want_ids_text} / {want_pieces_text}"
                ));
            }
        }
        report(&format!("{name} samples"), samples.len(), &mismatches);
    }
}

#[test]
fn odd_sequences_decode_as_the_package() {
    for name in MODELS {
        let (sp, expected) = model(name);
        let mut mismatches = Vec::new();
        let by_ids = expected["decode_ids"].as_array().expect("decode_ids");
        for case in by_ids {
            let input = ids(&case[0]);
            let got = sp.decode_ids(&input).expect("ids in range");
            if got != case[1].as_str().expect("text") {
                mismatches.push(format!(
                    "decode_ids({input:?}): got {got:?}, want {}",
                    case[1]
                ));
            }
        }
        let by_pieces = expected["decode_pieces"].as_array().expect("decode_pieces");
        for case in by_pieces {
            let input = strings(&case[0]);
            let got = sp.decode_pieces(&input);
            if got != case[1].as_str().expect("text") {
                mismatches.push(format!(
                    "decode_pieces({input:?}): got {got:?}, want {}",
                    case[1]
                ));
            }
        }
        report(
            &format!("{name} decodes"),
            by_ids.len() + by_pieces.len(),
            &mismatches,
        );
    }
}

#[test]
fn vocabulary_lookups_agree_with_the_package() {
    for name in MODELS {
        let (sp, expected) = model(name);
        assert_eq!(
            sp.len() as u64,
            expected["pieces"].as_u64().expect("pieces"),
            "{name}"
        );
        assert!(!sp.is_empty());
        assert_eq!(
            u64::from(sp.unk_id()),
            expected["unk_id"].as_u64().expect("unk_id"),
            "{name}"
        );
        for case in expected["piece_to_id"].as_array().expect("piece_to_id") {
            let piece = case[0].as_str().expect("piece");
            let id = case[1].as_u64().expect("id") as u32;
            let want = case[2].as_bool().expect("is a piece").then_some(id);
            assert_eq!(
                sp.piece_to_id(piece),
                want,
                "{name}: piece_to_id({piece:?})"
            );
            if want.is_none() {
                assert_eq!(
                    id,
                    sp.unk_id(),
                    "{name}: the package gives unk for {piece:?}"
                );
            }
        }
        for id in 0..sp.len() as u32 {
            let piece = sp.id_to_piece(id).expect("in range");
            assert_eq!(sp.piece_to_id(piece), Some(id), "{name}: id {id} {piece:?}");
        }
        assert_eq!(sp.id_to_piece(sp.len() as u32), None);
        let error = sp
            .decode_ids(&[0, sp.len() as u32])
            .expect_err("out of range");
        assert!(error.to_string().contains(&sp.len().to_string()), "{error}");
    }
}

/// The test columns of `../shared/data` in make.py's order: ding.test.tsv then bible.test.tsv,
/// column 1 then 2 of each, as (name, lines); `None` (test skipped) without ../shared.
fn test_columns() -> Option<Vec<(String, Vec<String>)>> {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data");
    let mut columns = Vec::new();
    for file in ["de-en/ding.test.tsv", "en-es/bible.test.tsv"] {
        let path = data.join(file);
        let Ok(text) = std::fs::read_to_string(&path) else {
            eprintln!("skipped: {} is absent", path.display());
            return None;
        };
        let rows: Vec<Vec<&str>> = text
            .split('\n')
            .filter(|l| !l.is_empty())
            .map(|l| l.split('\t').collect())
            .collect();
        for column in 0..2 {
            let lines = rows.iter().map(|row| row[column].to_string()).collect();
            columns.push((format!("{file}:{}", column + 1), lines));
        }
    }
    Some(columns)
}

/// The 4000 test inputs of the `.lines` files, as (file:column:line, text).
fn test_corpora() -> Option<Vec<(String, String)>> {
    let mut inputs = Vec::new();
    for (name, lines) in test_columns()? {
        for (n, line) in lines.into_iter().enumerate() {
            inputs.push((format!("{name}:{}", n + 1), line));
        }
    }
    Some(inputs)
}

/// make.py's check of one text: "<piece count> <encode hash> <decode hash>".
fn hashes(sp: &SentencePiece, text: &str) -> String {
    let encoded = sp.encode(text);
    let (pieces, ids) = split(&encoded);
    let by_ids = sp.decode_ids(&ids).expect("ids in range");
    let by_pieces = sp.decode_pieces(&pieces);
    let decoded = [by_ids.as_bytes(), b"\0", by_pieces.as_bytes()].concat();
    format!(
        "{} {:08x} {:08x}",
        encoded.len(),
        encode_hash(&encoded),
        fnv32(&decoded)
    )
}

#[test]
fn long_texts_encode_and_decode_as_the_package() {
    // make.py's LONG_SYNTHETIC, then each test column joined by spaces.
    let mut texts = vec![
        (
            "repeated".to_string(),
            "Der schnelle braune Fuchs springt über den faulen Hund 😀 ﬁ. ".repeat(3000),
        ),
        ("unknown runs".to_string(), "日本語 ".repeat(3000) + "x"),
    ];
    for (name, lines) in test_columns().unwrap_or_default() {
        let name = name.rsplit('/').next().unwrap_or_default().to_string();
        texts.push((name, lines.join(" ")));
    }
    let mut compared = 0;
    for name in MODELS {
        let (sp, expected) = model(name);
        let long = expected["long"].as_array().expect("long");
        for (text_name, text) in &texts {
            let want = long
                .iter()
                .find(|l| l[0] == text_name.as_str())
                .expect("in make.py");
            let want = format!(
                "{} {} {}",
                want[1],
                want[2].as_str().unwrap(),
                want[3].as_str().unwrap()
            );
            assert_eq!(
                hashes(&sp, text),
                want,
                "{name}: {text_name} ({} bytes)",
                text.len()
            );
            compared += 1;
        }
    }
    eprintln!("{compared} long texts compared");
}

#[test]
fn every_test_corpus_line_encodes_and_decodes_as_the_package() {
    let Some(inputs) = test_corpora() else { return };
    assert_eq!(inputs.len(), 4000);
    for name in MODELS {
        let (sp, _) = model(name);
        let path = fixtures().join(format!("{name}.lines"));
        let lines = std::fs::read_to_string(&path).expect("lines file");
        let expected: Vec<&str> = lines.lines().collect();
        assert_eq!(expected.len(), inputs.len(), "{}", path.display());
        let mut mismatches = Vec::new();
        for ((where_, text), want) in inputs.iter().zip(&expected) {
            let got = hashes(&sp, text);
            if got != *want {
                let encoded = sp.encode(text);
                let (pieces, got_ids) = split(&encoded);
                let by_ids = sp.decode_ids(&got_ids).expect("ids in range");
                mismatches.push(format!(
                    "{where_} {text:?}: got \"{got}\", the package \"{want}\" \
                     (count, encode hash, decode hash); ours: {pieces:?} {got_ids:?} -> {by_ids:?}"
                ));
            }
        }
        report(&format!("{name} test corpora"), inputs.len(), &mismatches);
    }
}

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
    let expected = read_json(&fixtures().join("malformed.json"));
    let path = Path::new("crafted.model");
    let cases = expected["cases"].as_array().expect("cases");
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let bytes = from_hex(case["hex"].as_str().expect("hex"));
        let result = SentencePiece::from_bytes(&bytes, path);
        // Refused by design: other algorithms, and a model without `<unk>` (which the package
        // accepts when it has byte fallback).
        let refused_by_design = ["bpe", "word", "char", "fallback-without-unk"].contains(&name);
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
                    "bpe" => "SentencePiece BPE models are not supported".to_string(),
                    "fallback-without-unk" => "no unknown piece".to_string(),
                    kind => format!("SentencePiece {kind} models are not supported"),
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
fn a_bpe_model_file_is_refused_by_name() {
    let path = fixtures().join("bpe.model");
    let error = SentencePiece::load(&path)
        .expect_err("BPE is refused")
        .to_string();
    assert!(
        error.contains("SentencePiece BPE models are not supported yet"),
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
    let path = Path::new("damaged.model");
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut loaded = 0;
    let mut tries = 0;
    for name in [
        "user-symbols.model",
        "byte-fallback.model",
        "suffix.model",
        "bible-en.model",
    ] {
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
                    for text in ["Hello wörld  ﬁ 😀 日本", "", "  ", "a\0b"] {
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
