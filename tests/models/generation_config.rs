//! A Hugging Face model's generation settings against transformers: `forced_eos_token_id` on
//! the BART and mBART fixtures (`tests/fixtures/{bart,mbart}`, their `config.json` given
//! `forced_eos_token_id` 2 here, read by the loader), greedy and beam 4 at output limits short
//! enough that forcing EOS at the last step changes the outputs, against `generate` with the
//! same setting (`tests/fixtures/forced_eos/make.py`); and the translator's own searches
//! (`Translator::translate`, `translate_nbest`) applying it from the config alone. Greedy ids
//! are compared up to the first step whose margin is within rounding (1e-2), beam lists
//! wherever their scores are not tied, scores within 1e-4.

use crate::seq2seq_reference::ours;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use transformer::decode::beam::{beam_search, BeamOptions, BeamStop};
use transformer::decode::greedy::{greedy_decode, GreedyOptions};
use transformer::pipeline::translate::Translator;
use transformer::text::id_map::IdMap;
use transformer::text::EOS;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

#[derive(Deserialize)]
struct Reference {
    eos: u32,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    file: String,
    line: usize,
    source: String,
    source_lang: String,
    target_lang: String,
    source_ids: Vec<u32>,
    steps: usize,
    greedy_ids: Vec<u32>,
    greedy_margins: Vec<f64>,
    greedy_text: String,
    unforced_greedy_ids: Vec<u32>,
    beam: Vec<Beam>,
    unforced_beam: Vec<Beam>,
}

#[derive(Deserialize)]
struct Beam {
    ids: Vec<u32>,
    score: f64,
}

/// A copy of fixture `name` whose `config.json` sets `forced_eos_token_id` to `value`.
fn with_forced_eos(name: &str, value: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixtures().join(name)).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let path = dir.path().join("config.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let from = "\"forced_eos_token_id\": null";
    assert!(text.contains(from), "{name}: {text}");
    std::fs::write(
        &path,
        text.replace(from, &format!("\"forced_eos_token_id\": {value}")),
    )
    .unwrap();
    dir
}

fn ids_of(t: &Translator) -> IdMap {
    match (t.vocab.fairseq(), t.vocab.bart()) {
        (Some(fairseq), _) => fairseq.ids().clone(),
        (None, bart) => bart.unwrap().ids().clone(),
    }
}

/// Our emitted ids of a hypothesis, EOS included when it finished.
fn emitted(tokens: &[u32], finished: bool) -> Vec<u32> {
    let mut out = tokens.to_vec();
    if finished {
        out.push(EOS);
    }
    out
}

fn forced_eos_matches_transformers(name: &str) {
    let dir = with_forced_eos(name, "2");
    let mut t = Translator::load(dir.path()).unwrap();
    assert!(
        t.forced_end,
        "{name}: forced_eos_token_id read from config.json"
    );
    let json = std::fs::read(fixtures().join("forced_eos").join(format!("{name}.json"))).unwrap();
    let r: Reference = serde_json::from_slice(&json).unwrap();
    let ids = ids_of(&t);
    let (mut greedy_compared, mut changed, mut texts, mut beams) = (0, 0, 0, 0);
    for case in &r.cases {
        let at = format!(
            "{name} {} line {} limit {}",
            case.file, case.line, case.steps
        );
        let src = ours(&ids, &case.source_ids, r.eos);
        let want: Vec<u32> = case.greedy_ids.iter().map(|&id| ids.ours(id)).collect();
        assert_eq!(want.last(), Some(&EOS), "{at}: transformers ends with EOS");
        changed += usize::from(case.greedy_ids != case.unforced_greedy_ids);
        // At most `steps` tokens, the forced first included, as max_new_tokens.
        let greedy = GreedyOptions {
            max_len_extra: case.steps - src.len(),
            batch_size: 1,
            forced_first: Some(ids.ours(case.greedy_ids[0])),
            min_len: 0,
            forced_end: t.forced_end,
        };
        let hyp = greedy_decode(&t.model, std::slice::from_ref(&src), &greedy)
            .pop()
            .unwrap();
        assert!(
            hyp.finished && hyp.n_emitted() <= case.steps,
            "{at}: {hyp:?}"
        );
        let got = emitted(&hyp.tokens, hyp.finished);
        // The forced first token, then up to the first step within rounding.
        let sure = 1
            + (case.greedy_margins.iter())
                .position(|&m| m <= 1e-2)
                .unwrap_or(case.greedy_margins.len());
        let k = sure.min(want.len());
        assert_eq!(got[..k.min(got.len())], want[..k], "{at}: greedy ids");
        greedy_compared += k;
        if sure > case.greedy_margins.len() {
            assert_eq!(got, want, "{at}: greedy ids");
            // The translator forces EOS from its config alone.
            if t.vocab.fairseq().is_some() {
                t.set_languages(Some(&case.source_lang), Some(&case.target_lang))
                    .unwrap();
            }
            let options = GreedyOptions {
                max_len_extra: case.steps - src.len(),
                batch_size: 1,
                ..GreedyOptions::default()
            };
            let text = t
                .translate(std::slice::from_ref(&case.source), &options)
                .unwrap();
            assert_eq!(text[0], case.greedy_text, "{at}: Translator::translate");
            texts += 1;
        }
        // Beam 4 under transformers' rule.
        let beam = BeamOptions {
            beam_size: 4,
            alpha: 1.0,
            max_len_extra: case.steps - src.len(),
            batch_size: 1,
            nbest: 4,
            stop: BeamStop::HuggingFace,
            forced_first: Some(ids.ours(case.greedy_ids[0])),
            min_len: 0,
            forced_end: t.forced_end,
            beam_rules: Default::default(),
        };
        let list = beam_search(&t.model, std::slice::from_ref(&src), &beam)
            .pop()
            .unwrap();
        assert_eq!(list.len(), case.beam.len(), "{at}");
        for (j, (got, want)) in list.iter().zip(&case.beam).enumerate() {
            assert!(
                got.finished,
                "{at} hypothesis {j}: every beam ends with EOS"
            );
            let want_ids: Vec<u32> = want.ids.iter().map(|&id| ids.ours(id)).collect();
            let tied =
                |i: usize| (case.beam.get(i)).is_some_and(|b| (b.score - want.score).abs() < 1e-4);
            if !(tied(j + 1) || j > 0 && tied(j - 1)) {
                assert_eq!(emitted(&got.tokens, true), want_ids, "{at} hypothesis {j}");
            }
            assert!(
                (got.score - want.score).abs() < 1e-4,
                "{at} hypothesis {j}: score {} vs {}",
                got.score,
                want.score
            );
            beams += 1;
        }
        // Without the forced EOS, the unforced lists (what the fixture's config gives).
        let plain = BeamOptions {
            forced_end: false,
            ..beam
        };
        let list = beam_search(&t.model, std::slice::from_ref(&src), &plain)
            .pop()
            .unwrap();
        for (j, (got, want)) in list.iter().zip(&case.unforced_beam).enumerate() {
            assert!(
                (got.score - want.score).abs() < 1e-4,
                "{at} unforced hypothesis {j}: score {} vs {}",
                got.score,
                want.score
            );
        }
    }
    assert!(
        changed >= 4,
        "{name}: the forced EOS changed only {changed} greedy outputs"
    );
    assert!(
        greedy_compared >= 40 && texts >= 4,
        "{name}: {greedy_compared} ids, {texts} texts"
    );
    eprintln!(
        "{name}: {} cases ({changed} changed by the forced EOS), {greedy_compared} greedy ids, \
         {texts} texts, {beams} beam hypotheses compared",
        r.cases.len()
    );
}

#[test]
fn bart_forced_eos_matches_transformers_generate() {
    forced_eos_matches_transformers("bart");
}

#[test]
fn mbart_forced_eos_matches_transformers_generate() {
    forced_eos_matches_transformers("mbart");
}

/// The searches of the translator itself (greedy, beam with alternatives) end every output at
/// its limit with EOS once the config asks, and not otherwise.
#[test]
fn the_translator_forces_eos_at_its_limit_from_the_config() {
    let forced = Translator::load(with_forced_eos("bart", "2").path()).unwrap();
    let plain = Translator::load(&fixtures().join("bart")).unwrap();
    assert!(forced.forced_end && !plain.forced_end);
    let lines = vec!["Er gab uns nur einen Bericht über die Lage im Land.".to_string()];
    let beam = BeamOptions {
        beam_size: 4,
        nbest: 4,
        max_len_extra: 0,
        ..BeamOptions::default()
    };
    let (a, b) = (
        forced.translate_nbest(&lines, &beam).unwrap(),
        plain.translate_nbest(&lines, &beam).unwrap(),
    );
    assert_eq!(a[0].len(), 4);
    assert_ne!(
        a, b,
        "a limit of the source's length: forcing EOS changes the list"
    );
    // A forced EOS that is not the model's EOS is refused by name.
    let e = Translator::load(with_forced_eos("bart", "5").path())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("forced_eos_token_id 5 is not eos_token_id 2"),
        "{e}"
    );
}

/// The fields of `generation_config.json` that change outputs and are not computed here are
/// refused by name; the search settings the command line chooses are noted by name.
#[test]
fn generation_config_fields_are_refused_or_noted_by_name() {
    let dir = with_forced_eos("bart", "null");
    let write =
        |json: &str| std::fs::write(dir.path().join("generation_config.json"), json).unwrap();
    write(r#"{"eos_token_id": 2, "forced_bos_token_id": 0, "num_beams": 4, "max_length": 200}"#);
    let t = Translator::load(dir.path()).unwrap();
    let note = t.generation_note.clone().unwrap();
    assert!(
        note.contains("generation_config.json") && note.contains("num_beams 4, max_length 200"),
        "{note}"
    );
    write(r#"{"forced_bos_token_id": 0, "no_repeat_ngram_size": 3}"#);
    let e = Translator::load(dir.path()).err().unwrap().to_string();
    assert!(
        e.contains("generation_config.json") && e.contains("no_repeat_ngram_size 3"),
        "{e}"
    );
    // Marian's own: its padding (the decoder's start) banned, which is never emitted.
    let marian = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixtures().join("marian")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, marian.path().join(path.file_name().unwrap())).unwrap();
    }
    let write =
        |json: &str| std::fs::write(marian.path().join("generation_config.json"), json).unwrap();
    write(r#"{"bad_words_ids": [[1439]], "forced_eos_token_id": 0, "renormalize_logits": true}"#);
    let t = Translator::load(marian.path()).unwrap();
    assert!(t.forced_end);
    assert!(t
        .generation_note
        .unwrap()
        .contains("renormalize_logits true"));
    write(r#"{"bad_words_ids": [[7]]}"#);
    let e = Translator::load(marian.path()).err().unwrap().to_string();
    assert!(e.contains("bad_words_ids [[7]]"), "{e}");
    write(r#"{"forced_bos_token_id": 7}"#);
    let e = Translator::load(marian.path()).err().unwrap().to_string();
    assert!(e.contains("forced_bos_token_id 7 is not supported"), "{e}");
}
