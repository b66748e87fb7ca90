//! End-to-end tests of `train --vocab-level bpe` (a joint byte-level BPE vocabulary saved as
//! tokenizer.json in the model directory) and of the two-file corpus `--src-file/--tgt-file`.

use super::cli_run::{ok, run, s, TINY_TRAIN};

/// 60 small pairs with some non-ASCII text: colour and number, German-ish on the target side.
fn corpus() -> (Vec<String>, Vec<String>) {
    let en = ["red", "blue", "green", "white", "grey"];
    let de = ["rot", "blau", "grün", "weiß", "grau"];
    (0..60)
        .map(|i| {
            (
                format!("the {} house {}", en[i % 5], i % 13),
                format!("das {}e Haus {}.", de[i % 5], i % 13),
            )
        })
        .unzip()
}

/// The BPE runs' flags after [`TINY_TRAIN`].
const BPE: [&str; 4] = ["--vocab-level", "bpe", "--vocab-size", "300"];

#[test]
fn bpe_train_translate_score_resume_attention() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, tgt) = corpus();
    let tsv: String = src
        .iter()
        .zip(&tgt)
        .map(|(a, b)| format!("{a}\t{b}\n"))
        .collect();
    let data = tmp.path().join("train.tsv");
    std::fs::write(&data, tsv).unwrap();
    let model = tmp.path().join("model");
    let mut args = vec!["train", "--train", s(&data), "--out", s(&model)];
    args.extend(TINY_TRAIN);
    args.extend(BPE);
    args.extend(["--max-steps", "3"]);
    ok(&args, b"");
    assert!(model.join("tokenizer.json").is_file());
    let vocab: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("vocab.json")).unwrap()).unwrap();
    assert_eq!(vocab["level"], "bpe");

    let out = ok(
        &["translate", "--model", s(&model), "--max-extra", "8"],
        "the red house 3\n\nthe grey house 12\n".as_bytes(),
    );
    assert_eq!(out.lines().count(), 3, "{out:?}");
    assert!(!out.contains('Ġ'), "byte-level markers leaked: {out:?}");

    let scores = ok(
        &["score", "--model", s(&model)],
        "the red house 3\tdas rote Haus 3.\n".as_bytes(),
    );
    assert_eq!(scores.lines().count(), 1, "{scores:?}");

    let picture = tmp.path().join("att.svg");
    ok(
        &[
            "attention",
            "--model",
            s(&model),
            "--src",
            "the red house",
            "--tgt",
            "das rote Haus",
            "--out",
            s(&picture),
            "--threads",
            "1",
        ],
        b"",
    );

    let resumed = tmp.path().join("resumed");
    let mut args = vec!["train", "--train", s(&data), "--out", s(&resumed)];
    args.extend(["--resume", s(&model), "--max-steps", "4", "--threads", "1"]);
    ok(&args, b"");
    assert_eq!(
        std::fs::read_to_string(resumed.join("tokenizer.json")).unwrap(),
        std::fs::read_to_string(model.join("tokenizer.json")).unwrap()
    );
}

#[test]
fn two_file_corpus_trains_and_mismatched_line_counts_are_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, tgt) = corpus();
    let src_path = tmp.path().join("train.en");
    let tgt_path = tmp.path().join("train.de");
    let mut src_text = src.join("\n");
    let mut tgt_text = tgt.join("\n");
    // Line 61: an empty target, skipped and reported with its line number.
    src_text.push_str("\nonly a source\n");
    tgt_text.push_str("\n\n");
    std::fs::write(&src_path, &src_text).unwrap();
    std::fs::write(&tgt_path, &tgt_text).unwrap();
    let model = tmp.path().join("model");
    let mut args = vec![
        "train",
        "--src-file",
        s(&src_path),
        "--tgt-file",
        s(&tgt_path),
    ];
    args.extend(["--out", s(&model), "--max-steps", "2"]);
    args.extend(TINY_TRAIN);
    args.extend(BPE);
    let (code, _, stderr) = run(&args, b"");
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("line 61: empty target"), "{stderr}");
    assert!(model.join("tokenizer.json").is_file());
    let out = ok(
        &["translate", "--model", s(&model), "--max-extra", "5"],
        b"the blue house 1\n",
    );
    assert_eq!(out.lines().count(), 1);

    std::fs::write(&tgt_path, tgt[..10].join("\n")).unwrap();
    // A fresh --out: the first run's directory would be refused before the corpus is read.
    let fresh = tmp.path().join("model-2");
    let out_at = args.iter().position(|a| *a == "--out").unwrap() + 1;
    args[out_at] = s(&fresh);
    let (code, stdout, stderr) = run(&args, b"");
    assert!(matches!(code, Some(c) if c != 0 && c != 101), "{stderr}");
    assert!(stdout.is_empty());
    for needle in [s(&src_path), s(&tgt_path), "61 lines", "10 lines"] {
        assert!(stderr.contains(needle), "lacks {needle:?}: {stderr}");
    }
}
