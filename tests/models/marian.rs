//! Marian (OPUS-MT's layout) against transformers: a tiny random `MarianMTModel`
//! (`tests/fixtures/marian`, made by its `make.py`: 2 + 2 post-LN layers of width 32, swish
//! FFNs, sinusoids in halves, a random logit bias) with SentencePiece models trained on
//! ../shared's German and English. The tokenizer gives transformers' ids on every source line
//! of the Ding test set and its detokenizer transformers' text of every reference translation;
//! encoder states and teacher-forced logits are within 1e-4 at every position (every token's
//! logit, through our id order); greedy translations are transformers' `generate` ids wherever
//! its margin exceeds 1e-2, and its text; beam search under transformers' rule
//! ([`BeamStop::HuggingFace`]: beam 4, length penalty 1, `early_stopping=False`) gives its
//! 4-best lists, hypotheses and scores (within 1e-4).

use crate::seq2seq_reference::{ours, state_and_logit_errors};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use transformer::decode::beam::{beam_search, BeamOptions, BeamStop};
use transformer::decode::greedy::{greedy_decode, GreedyOptions};
use transformer::pipeline::translate::Translator;

/// Marian's EOS (its id 0), which closes the reference's id lists.
const THEIR_EOS: u32 = 0;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/marian")
}

#[derive(Deserialize)]
struct Reference {
    vocab_size: usize,
    sources: Vec<Vec<u32>>,
    targets: Vec<Vec<u32>>,
    decoded: Vec<String>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    line: usize,
    source_ids: Vec<u32>,
    target_ids: Vec<u32>,
    encoder: Vec<f64>,
    logits: Vec<f64>,
    greedy_steps: usize,
    greedy_ids: Vec<u32>,
    greedy_margins: Vec<f64>,
    greedy_text: String,
    beams: Vec<Beam>,
}

#[derive(Deserialize)]
struct Beam {
    ids: Vec<u32>,
    score: f64,
}

fn load() -> (Translator, Reference) {
    let dir = fixture();
    let mut translator = Translator::load(&dir).unwrap();
    // As the translators run it: every weight in one form, its float32 values released.
    translator
        .prepare_precision(transformer::kernels::lowp::Precision::F32)
        .unwrap();
    let json = std::fs::read(dir.join("reference.json")).unwrap();
    (translator, serde_json::from_slice(&json).unwrap())
}

#[test]
fn marian_tokenizer_gives_transformers_ids_and_text_on_every_line() {
    let (t, r) = load();
    let tokenizer = t.vocab.marian().expect("a Marian vocabulary");
    let ids = tokenizer.ids();
    assert_eq!(ids.len_theirs(), r.vocab_size);
    assert_eq!(t.model.config.vocab_size, r.vocab_size + 1);
    let lines: Vec<String> = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/de-en/ding.test.tsv"),
    )
    .map(|text| text.lines().map(str::to_string).collect())
    .unwrap_or_default();
    if lines.is_empty() {
        eprintln!("skipped: ../shared/data/de-en/ding.test.tsv is absent");
        return;
    }
    assert_eq!(lines.len(), r.sources.len());
    for (i, line) in lines.iter().enumerate() {
        let source = line.split('\t').next().unwrap();
        assert_eq!(
            t.vocab.encode(source),
            ours(ids, &r.sources[i], THEIR_EOS),
            "line {}: {source:?}",
            i + 1
        );
        let target = ours(ids, &r.targets[i], THEIR_EOS);
        assert_eq!(t.vocab.decode(&target), r.decoded[i], "line {}", i + 1);
    }
}

#[test]
fn marian_states_and_logits_match_transformers() {
    let (t, r) = load();
    let ids = t.vocab.marian().unwrap().ids().clone();
    let mut checked = 0;
    for case in r.cases.iter().filter(|c| !c.logits.is_empty()) {
        let (src, tgt) = (
            ours(&ids, &case.source_ids, THEIR_EOS),
            ours(&ids, &case.target_ids, THEIR_EOS),
        );
        let (states, worst) = state_and_logit_errors(
            &t.model,
            &ids,
            (&src, &tgt),
            (&case.encoder, &case.logits),
            &[transformer::text::PAD],
        );
        assert!(
            states < 1e-4,
            "line {}: encoder states differ by {states:e}",
            case.line
        );
        eprintln!("line {}: encoder states within {states:.1e}", case.line);
        assert!(
            worst < 1e-4,
            "line {}: logits differ by {worst:e}",
            case.line
        );
        eprintln!("line {}: logits within {worst:.1e}", case.line);
        checked += 1;
    }
    assert_eq!(checked, 3);
}

#[test]
fn marian_greedy_translations_match_transformers_generate() {
    let (t, r) = load();
    let ids = t.vocab.marian().unwrap().ids().clone();
    let mut compared = 0;
    for case in &r.cases {
        let src = ours(&ids, &case.source_ids, THEIR_EOS);
        // Exactly `greedy_steps` tokens at most, as transformers' max_new_tokens.
        let options = GreedyOptions {
            max_len_extra: case.greedy_steps - src.len(),
            batch_size: 1,
            forced_first: None,
            min_len: 0,
            forced_end: false,
        };
        let hyp = greedy_decode(&t.model, std::slice::from_ref(&src), &options)
            .pop()
            .unwrap();
        let mut emitted = hyp.tokens.clone();
        if hyp.finished {
            emitted.push(transformer::text::EOS);
        }
        let want: Vec<u32> = case.greedy_ids.iter().map(|&id| ids.ours(id)).collect();
        // Up to the first step whose margin is within rounding.
        let sure = (case.greedy_margins.iter())
            .position(|&m| m <= 1e-2)
            .unwrap_or(case.greedy_margins.len());
        let k = sure.min(want.len());
        assert_eq!(
            emitted[..k.min(emitted.len())],
            want[..k],
            "line {}: greedy ids",
            case.line
        );
        compared += k;
        if sure == case.greedy_margins.len() {
            assert_eq!(
                t.vocab.decode(&hyp.tokens),
                case.greedy_text,
                "line {}",
                case.line
            );
        }
    }
    assert!(compared >= 40, "only {compared} greedy tokens compared");
    eprintln!("{compared} greedy tokens compared");
}

#[test]
fn marian_beam_search_matches_transformers_generate() {
    let (t, r) = load();
    let ids = t.vocab.marian().unwrap().ids().clone();
    let mut finished = 0;
    for case in &r.cases {
        let src = ours(&ids, &case.source_ids, THEIR_EOS);
        let options = BeamOptions {
            beam_size: 4,
            alpha: 1.0,
            max_len_extra: case.greedy_steps - src.len(),
            batch_size: 1,
            nbest: 4,
            stop: BeamStop::HuggingFace,
            forced_first: None,
            min_len: 0,
            forced_end: false,
            beam_rules: Default::default(),
        };
        let list = beam_search(&t.model, std::slice::from_ref(&src), &options)
            .pop()
            .unwrap();
        assert_eq!(list.len(), case.beams.len(), "line {}", case.line);
        for (j, (got, want)) in list.iter().zip(&case.beams).enumerate() {
            let mut emitted = got.tokens.clone();
            if got.finished {
                emitted.push(transformer::text::EOS);
                finished += 1;
            }
            let want_ids: Vec<u32> = want.ids.iter().map(|&id| ids.ours(id)).collect();
            // Neighbours closer than rounding may come in either order.
            let tied =
                |i: usize| (case.beams.get(i)).is_some_and(|b| (b.score - want.score).abs() < 1e-4);
            if !(tied(j + 1) || j > 0 && tied(j - 1)) {
                assert_eq!(emitted, want_ids, "line {} hypothesis {j}", case.line);
            }
            assert!(
                (got.score - want.score).abs() < 1e-4,
                "line {} hypothesis {j}: score {} vs {}",
                case.line,
                got.score,
                want.score
            );
        }
    }
    // Some hypotheses end with EOS before the limit, others reach it.
    assert!(finished >= 4, "{finished} finished hypotheses");
    eprintln!(
        "{} hypotheses compared, {finished} finished",
        4 * r.cases.len()
    );
}

/// A copy of the fixture with `edit` applied, loaded: the error's text.
fn load_error(edit: impl FnOnce(&Path)) -> String {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    edit(dir.path());
    match Translator::load(dir.path()) {
        Ok(_) => panic!("the edited fixture loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn broken_marian_directories_are_clear_errors() {
    let e = load_error(|d| std::fs::remove_file(d.join("source.spm")).unwrap());
    assert!(e.contains("source.spm"), "{e}");
    let e = load_error(|d| std::fs::write(d.join("target.spm"), b"\x0a\x05ab").unwrap());
    assert!(e.contains("target.spm"), "{e}");
    let e = load_error(|d| {
        let bytes = std::fs::read(d.join("model.safetensors")).unwrap();
        std::fs::write(d.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    });
    assert!(e.contains("model.safetensors"), "{e}");
    let e = load_error(|d| {
        std::fs::write(d.join("vocab.json"), r#"{"<unk>": 1, "x": 99999}"#).unwrap()
    });
    assert!(e.contains("vocab.json") && e.contains("99999"), "{e}");
    let e = load_error(|d| std::fs::write(d.join("vocab.json"), r#"{"a": 1}"#).unwrap());
    assert!(e.contains("no <unk> piece"), "{e}");
    let e = load_error(|d| {
        let path = d.join("config.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text.replace(
            "\"decoder_vocab_size\": 1440",
            "\"decoder_vocab_size\": 700",
        );
        std::fs::write(&path, text).unwrap();
    });
    assert!(e.contains("decoder_vocab_size 700"), "{e}");
    // A vocab_size that the table does not have: the shapes named.
    let e = load_error(|d| {
        let path = d.join("config.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text
            .replace(
                "\"decoder_vocab_size\": 1440",
                "\"decoder_vocab_size\": 1441",
            )
            .replace("\"vocab_size\": 1440", "\"vocab_size\": 1441");
        std::fs::write(&path, text).unwrap();
    });
    assert!(e.contains("shared.weight has shape [1440, 32]"), "{e}");
}
