//! Fuzzing of every reader: seed files ([`seeds`]), their mutations ([`mutate`]) and the
//! readers run on them ([`readers`]).
#![allow(dead_code)]

/// The GGUF tests' writer, shared with the seeds.
#[path = "../gguf_common/mod.rs"]
pub mod gguf_common;
pub mod grammars;
pub mod mutate;
pub mod readers;
pub mod seeds;

use std::path::PathBuf;
use std::sync::OnceLock;

/// The seeds and a scratch directory, built once per process (for the `cargo fuzz` targets).
pub fn setup() -> &'static (seeds::Seeds, PathBuf) {
    static SETUP: OnceLock<(seeds::Seeds, PathBuf)> = OnceLock::new();
    SETUP.get_or_init(|| (seeds::Seeds::build(), seeds::tempdir()))
}

/// A reader's result as a `cargo fuzz` target judges it: an unclear error is a finding, like a
/// panic.
pub fn judge(result: Result<readers::Outcome, String>) {
    if let Err(unclear) = result {
        panic!("{unclear}");
    }
}

/// Writes the seed inputs of every `cargo fuzz` target into `root/<target>/seed-<i>`, in each
/// target's input encoding (a leading selector byte where the target has one): libFuzzer's
/// starting corpus (`fuzz/README.md`).
pub fn write_corpus(root: &std::path::Path, s: &seeds::Seeds) -> std::io::Result<()> {
    use seeds::Seeds;
    let with = |selector: &[u8], bytes: &[u8]| [selector, bytes].concat();
    let mut targets: Vec<(&str, Vec<Vec<u8>>)> = vec![
        (
            "safetensors",
            vec![
                with(&[0], &Seeds::file(&s.translation, "model.safetensors")),
                with(&[1], &Seeds::file(&s.language_model, "model.safetensors")),
            ],
        ),
        (
            "config_json",
            vec![
                with(&[0], &Seeds::file(&s.translation, "config.json")),
                with(&[1], &Seeds::file(&s.language_model, "config.json")),
            ],
        ),
        ("vocab_json", {
            let mut v = s.vocabs.clone();
            v.push(s.bpe_vocab.0.clone());
            v
        }),
        ("tokenizer_json", vec![s.tokenizer.clone()]),
        ("trainer_state_json", s.states.clone()),
        (
            "checkpoint_manifest",
            vec![Seeds::file(&s.translation, "checkpoint.json")],
        ),
        ("corpus", s.corpora.clone()),
        ("gguf", vec![s.gguf.clone()]),
    ];
    let mut hf = Vec::new();
    for (d, files) in s.hf_decoders.iter().enumerate() {
        for (f, (_, bytes)) in files.iter().enumerate() {
            hf.push(with(&[d as u8, f as u8], bytes));
        }
    }
    targets.push(("hf_decoder", hf));
    for (target, inputs) in targets {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir)?;
        for (i, input) in inputs.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), input)?;
        }
    }
    Ok(())
}
