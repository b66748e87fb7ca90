//! The port against the `sentencepiece` package (0.2.3): what it made of the models, strings
//! and id sequences of tests/fixtures/sentencepiece (written by its `make.py`) and of the
//! `../shared/data` test corpora (hashed per line in `<model>.lines`). The unigram models here;
//! the checks are functions of the models' names, which bpe_tests.rs runs on the BPE models
//! (and load_tests.rs has the model files the package refuses or that are damaged).

use super::SentencePiece;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The unigram models of make.py: each has `<name>.json` and `<name>.lines`.
const MODELS: [&str; 7] = [
    "ding-de",
    "ding-en",
    "bible-en",
    "bible-es",
    "byte-fallback",
    "user-symbols",
    "suffix",
];

pub(super) fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sentencepiece")
}

pub(super) fn read_json(path: &Path) -> Value {
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

pub(super) fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .expect("array")
        .iter()
        .map(|v| v.as_str().expect("string"))
        .collect()
}

pub(super) fn ids(value: &Value) -> Vec<u32> {
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

pub(super) fn split(encoded: &[(String, u32)]) -> (Vec<&str>, Vec<u32>) {
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
    check_samples(&MODELS);
}

/// Each model's `samples` encode and decode as the package did.
pub(super) fn check_samples(models: &[&str]) {
    for &name in models {
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
    check_odd_sequences(&MODELS);
}

/// Each model's `decode_ids` and `decode_pieces` decode as the package did.
pub(super) fn check_odd_sequences(models: &[&str]) {
    for &name in models {
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
    check_vocabulary(&MODELS);
}

/// Each model's size, unknown id and `piece_to_id` are the package's; ids and pieces map back.
pub(super) fn check_vocabulary(models: &[&str]) {
    for &name in models {
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
    check_long_texts(&MODELS);
}

/// Each model's `long` texts encode and decode to the package's hashes.
pub(super) fn check_long_texts(models: &[&str]) {
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
    for &name in models {
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
    check_test_corpora(&MODELS);
}

/// Each model's `.lines`: every test corpus line encodes and decodes to the package's hashes.
pub(super) fn check_test_corpora(models: &[&str]) {
    let Some(inputs) = test_corpora() else { return };
    assert_eq!(inputs.len(), 4000);
    for &name in models {
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
