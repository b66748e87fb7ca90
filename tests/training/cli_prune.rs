//! `transformer prune` on a translation model trained here: heads removed by importance, the
//! pruned model fine-tuned on sentence pairs with the recipe's label smoothing, the same seed
//! giving the same weights, the result translating; and the refusals of flags that cannot apply.

use super::cli_run::{fails, ok, s, TINY_TRAIN};
use std::path::Path;

/// 24 pairs: a colour and a number, reversed on the target side.
fn write_pairs(path: &Path) {
    let words = ["red", "blue", "green", "gold"];
    let lines: String = (0..24)
        .map(|i| {
            let src = format!("{} {}", words[i % 4], i * 7 % 23);
            let tgt: String = src.chars().rev().collect();
            format!("{src}\t{tgt}\n")
        })
        .collect();
    std::fs::write(path, lines).unwrap();
}

#[test]
fn prune_fine_tunes_a_translation_model_with_its_own_label_smoothing() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("pairs.tsv");
    write_pairs(&data);
    let model = tmp.path().join("model");
    let mut train = vec!["train", "--train", s(&data), "--out", s(&model)];
    train.extend(TINY_TRAIN);
    train.extend(["--label-smoothing", "0.2", "--max-steps", "3"]);
    ok(&train, b"");
    let prune = |out: &Path, extra: &[&str]| {
        let mut args = vec![
            "prune",
            "--model",
            s(&model),
            "--keep",
            "0.5",
            "--data",
            s(&data),
            "--batches",
            "2",
            "--batch",
            "4",
            "--threads",
            "1",
            "--out",
            s(out),
        ];
        args.extend(extra);
        super::cli_run::run(&args, b"")
    };
    let first = tmp.path().join("pruned");
    let (code, _, stderr) = prune(&first, &["--fine-tune-steps", "5", "--lr", "1e-3"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains(
            "fine-tuned 5 updates of 4 sentence pairs (20 distinct), label smoothing 0.2"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("removed 12 of 24 heads"), "{stderr}");
    let config = std::fs::read_to_string(first.join("config.json")).unwrap();
    assert!(config.contains("layer_heads"), "{config}");

    // The same seed: the same fine-tuned weights, byte for byte; without the fine-tune, others.
    let again = tmp.path().join("again");
    let (code, _, stderr) = prune(&again, &["--fine-tune-steps", "5", "--lr", "1e-3"]);
    assert_eq!(code, Some(0), "{stderr}");
    let weights = |dir: &Path| std::fs::read(dir.join("model.safetensors")).unwrap();
    assert_eq!(weights(&first), weights(&again));
    let plain = tmp.path().join("plain");
    let (code, _, stderr) = prune(&plain, &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("fine-tuned"), "{stderr}");
    assert_ne!(weights(&first), weights(&plain));

    // A flag given explicitly wins over the recipe.
    let explicit = tmp.path().join("explicit");
    let (code, _, stderr) = prune(
        &explicit,
        &["--fine-tune-steps", "1", "--label-smoothing", "0"],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("label smoothing 0, lr"), "{stderr}");

    // Importance on one file, the fine-tune on another: the fine-tune's pairs are counted
    // from --fine-tune-data (8 pairs there, all of them seen).
    let few = tmp.path().join("few.tsv");
    let text = std::fs::read_to_string(&data).unwrap();
    std::fs::write(
        &few,
        text.lines()
            .take(8)
            .map(|l| format!("{l}\n"))
            .collect::<String>(),
    )
    .unwrap();
    let split = tmp.path().join("split");
    let (code, _, stderr) = prune(
        &split,
        &["--fine-tune-steps", "3", "--fine-tune-data", s(&few)],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("4 sentence pairs (8 distinct)"), "{stderr}");

    // The pruned, fine-tuned model translates.
    let out = ok(
        &["translate", "--model", s(&first), "--threads", "1"],
        b"red 7\n",
    );
    assert_eq!(out.lines().count(), 1, "{out}");

    // Flags that cannot apply are refused by name, and nothing is written.
    let refusals: [(&[&str], &str); 4] = [
        (
            &["--by", "random", "--label-smoothing", "0.1"],
            "--label-smoothing applies to the fine-tune",
        ),
        (
            &["--by", "random", "--fine-tune-steps", "2"],
            "--fine-tune-steps needs --data or --fine-tune-data",
        ),
        (
            &["--by", "random", "--fine-tune-data", s(&data)],
            "--fine-tune-data applies to the fine-tune",
        ),
        (
            &[
                "--data",
                s(&data),
                "--fine-tune-steps",
                "2",
                "--label-smoothing",
                "1.5",
            ],
            "--label-smoothing 1.5",
        ),
    ];
    for (i, (extra, message)) in refusals.iter().enumerate() {
        let out = tmp.path().join(format!("refused-{i}"));
        let mut args = vec![
            "prune",
            "--model",
            s(&model),
            "--keep",
            "0.5",
            "--out",
            s(&out),
        ];
        args.extend_from_slice(extra);
        let err = fails(&args, b"");
        assert!(err.contains(message), "{err}");
        assert!(!out.exists(), "nothing written on an error");
    }
}
