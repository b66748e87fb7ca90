//! `train --attention`: a translation model whose encoder and decoder self-attention are all of
//! one kind, saved in config.json, and translated with beam search (which reorders the
//! decoding state's rows: a linear-attention layer's running sums go with them); linear
//! attention with attention dropout refused by name.

use super::cli_run::{fails, ok, s, TINY_TRAIN};

#[test]
fn train_attention_sets_every_self_attention_layer_and_beam_search_translates() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("pairs.tsv");
    let lines: String = (0..16)
        .map(|i| format!("w{} x{}\tx{} w{}\n", i % 5, i % 3, i % 3, i % 5))
        .collect();
    std::fs::write(&data, lines).unwrap();
    for (kind, json) in [
        ("linear", r#"{"kind":"linear"}"#),
        ("window:2", r#"{"kind":"window","window":2}"#),
    ] {
        let model = tmp.path().join(kind.replace(':', "-"));
        let mut train = vec!["train", "--train", s(&data), "--out", s(&model)];
        train.extend(TINY_TRAIN);
        train.extend([
            "--max-steps",
            "3",
            "--attention",
            kind,
            "--attention-dropout",
            "0",
        ]);
        ok(&train, b"");
        let config = std::fs::read_to_string(model.join("config.json")).unwrap();
        let config: serde_json::Value = serde_json::from_str(&config).unwrap();
        let want: serde_json::Value = serde_json::from_str(json).unwrap();
        for field in ["encoder_layer_attention", "layer_attention"] {
            let kinds = config[field].as_array().expect(field);
            assert!(
                !kinds.is_empty() && kinds.iter().all(|k| *k == want),
                "{kind} {field}: {kinds:?}"
            );
        }
        let out = ok(
            &[
                "translate",
                "--model",
                s(&model),
                "--beam",
                "2",
                "--threads",
                "1",
            ],
            b"w1 x2\nw3 x0\nw4\n",
        );
        assert_eq!(out.lines().count(), 3, "{kind}: {out}");
    }
    let mut train = vec!["train", "--train", s(&data), "--out"];
    let refused = tmp.path().join("refused");
    train.push(s(&refused));
    train.extend(TINY_TRAIN);
    train.extend([
        "--max-steps",
        "3",
        "--attention",
        "linear",
        "--attention-dropout",
        "0.1",
    ]);
    let err = fails(&train, b"");
    assert!(
        err.contains("linear attention") && err.contains("attention_dropout"),
        "{err}"
    );
}
