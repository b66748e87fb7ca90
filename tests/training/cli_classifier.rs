//! End-to-end tests of `train-classifier` and `classify` (BERT fine-tuned for sentence
//! classification): a tiny encoder learns a task decided by one word and classifies held-out
//! sentences far above chance, a resumed run continues the same loss curve bit for bit, an
//! encoder of `train-mlm` is fine-tuned through `--init`, and bad input gets clear errors.

use super::cli_run::{curve, fails, ok, s};
use std::path::Path;

const FILLER: [&str; 8] = ["the", "red", "big", "old", "new", "small", "one", "my"];

/// `n` sentences of 3 to 6 filler words with "apple" (label fruit) or "hammer" (label tool)
/// at a random place, from a seeded generator: the label is decided by that one word.
fn sentences(n: usize, seed: u64) -> Vec<(String, &'static str)> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = |k: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % k as u64) as usize
    };
    (0..n)
        .map(|_| {
            let mut words: Vec<&str> = (0..3 + next(4)).map(|_| FILLER[next(8)]).collect();
            let (word, label) = match next(2) {
                0 => ("apple", "fruit"),
                _ => ("hammer", "tool"),
            };
            words.insert(next(words.len() + 1), word);
            (words.join(" "), label)
        })
        .collect()
}

fn tsv(rows: &[(String, &str)]) -> String {
    rows.iter().map(|(t, l)| format!("{t}\t{l}\n")).collect()
}

const FLAGS: [&str; 26] = [
    "--vocab-size",
    "300",
    "--max-len",
    "12",
    "--batch",
    "16",
    "--d-model",
    "32",
    "--n-heads",
    "2",
    "--d-ff",
    "64",
    "--layers",
    "1",
    "--lr",
    "3e-3",
    "--warmup",
    "10",
    "--dropout",
    "0",
    "--threads",
    "1",
    "--log-every",
    "1",
    "--eval-every",
    "40",
];

#[test]
fn train_classifier_learns_resumes_exactly_and_classifies() {
    let tmp = tempfile::tempdir().unwrap();
    let train = tmp.path().join("train.tsv");
    let valid = tmp.path().join("valid.tsv");
    let test = tmp.path().join("test.tsv");
    std::fs::write(&train, tsv(&sentences(300, 1))).unwrap();
    std::fs::write(&valid, tsv(&sentences(40, 2))).unwrap();
    let held_out = sentences(100, 3);
    std::fs::write(&test, tsv(&held_out)).unwrap();
    let full = tmp.path().join("full");
    let half = tmp.path().join("resumed");
    let mut args = vec![
        "train-classifier",
        "--train",
        s(&train),
        "--valid",
        s(&valid),
    ];
    args.extend_from_slice(&["--out", s(&full), "--max-steps", "80", "--save-every", "40"]);
    args.extend_from_slice(&FLAGS);
    ok(&args, b"");
    let c = curve(&full);
    let last = c.last().unwrap();
    assert_eq!(last.0, 80);
    assert!(
        c[0].1 > last.1 + 0.3,
        "the loss fell: {:?} -> {:?}",
        c[0],
        last
    );
    let labels: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(full.join("labels.json")).unwrap()).unwrap();
    assert_eq!(labels, ["fruit", "tool"]);

    // resumed from the step-40 checkpoint, into another directory: the same curve
    let from = full.join("checkpoints").join("step-00000040");
    assert!(from.is_dir(), "no step checkpoint at 40");
    let mut args = vec![
        "train-classifier",
        "--train",
        s(&train),
        "--valid",
        s(&valid),
    ];
    args.extend_from_slice(&["--out", s(&half), "--resume", s(&from), "--max-steps", "80"]);
    args.extend_from_slice(&["--eval-every", "40", "--threads", "1", "--log-every", "1"]);
    ok(&args, b"");
    let after: Vec<_> = c.iter().filter(|l| l.0 > 40).cloned().collect();
    assert_eq!(curve(&half), after, "the resumed run's curve differs");

    // held-out sentences: chance is 0.5
    let report = ok(&["classify", "--model", s(&full), "--eval", s(&test)], b"");
    let accuracy: f64 = report
        .split_whitespace()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no accuracy in {report}"));
    assert!(accuracy >= 0.9, "held-out accuracy {accuracy}\n{report}");
    assert!(
        report.contains("fruit\t") && report.contains("tool\t"),
        "{report}"
    );

    // stdin: one JSON line per sentence, probabilities of both labels summing to 1
    let input: String = held_out[..10]
        .iter()
        .map(|(t, _)| format!("{t}\n"))
        .collect();
    let out = ok(&["classify", "--model", s(&full)], input.as_bytes());
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 10);
    let mut right = 0;
    for (line, (_, want)) in lines.iter().zip(&held_out) {
        let probs = line["probabilities"].as_object().unwrap();
        assert_eq!(probs.len(), 2);
        let sum: f64 = probs.values().map(|p| p.as_f64().unwrap()).sum();
        assert!((sum - 1.0).abs() < 1e-9, "{line}");
        let label = line["label"].as_str().unwrap();
        let best = probs
            .iter()
            .max_by(|a, b| a.1.as_f64().partial_cmp(&b.1.as_f64()).unwrap())
            .unwrap();
        assert_eq!(best.0, label);
        right += usize::from(label == *want);
    }
    assert!(right >= 8, "{right} of 10 right\n{out}");
}

#[test]
fn train_classifier_fine_tunes_a_train_mlm_encoder() {
    let tmp = tempfile::tempdir().unwrap();
    let text = tmp.path().join("text.txt");
    let rows = sentences(200, 4);
    let plain: String = rows.iter().map(|(t, _)| format!("{t}\n")).collect();
    std::fs::write(&text, plain).unwrap();
    let train = tmp.path().join("train.tsv");
    std::fs::write(&train, tsv(&rows)).unwrap();
    let mlm = tmp.path().join("mlm");
    ok(
        &[
            "train-mlm",
            "--text",
            s(&text),
            "--out",
            s(&mlm),
            "--vocab-size",
            "300",
            "--context",
            "16",
            "--batch",
            "8",
            "--d-model",
            "32",
            "--n-heads",
            "2",
            "--d-ff",
            "64",
            "--layers",
            "1",
            "--max-steps",
            "5",
            "--threads",
            "1",
        ],
        b"",
    );
    let out = tmp.path().join("cls");
    ok(
        &[
            "train-classifier",
            "--train",
            s(&train),
            "--out",
            s(&out),
            "--init",
            s(&mlm),
            "--max-len",
            "16",
            "--batch",
            "8",
            "--max-steps",
            "3",
            "--threads",
            "1",
            "--pooling",
            "mean",
        ],
        b"",
    );
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["encoder"]["d_model"], 32);
    assert_eq!(config["pooling"], "mean");
    assert_eq!(
        std::fs::read(out.join("tokenizer.json")).unwrap(),
        std::fs::read(mlm.join("tokenizer.json")).unwrap(),
        "the pre-trained encoder's tokenizer is kept"
    );
    // --max-len beyond the encoder's 16 positions is refused, naming both
    let e = fails(
        &[
            "train-classifier",
            "--train",
            s(&train),
            "--out",
            s(&tmp.path().join("x")),
            "--init",
            s(&mlm),
            "--max-len",
            "32",
        ],
        b"",
    );
    assert!(
        e.contains("--max-len 32") && e.contains("16 positions"),
        "{e}"
    );
}

#[test]
fn bad_input_gets_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let good = tmp.path().join("good.tsv");
    std::fs::write(&good, tsv(&sentences(50, 5))).unwrap();
    let out = tmp.path().join("out");
    let train = |file: &Path, extra: &[&str]| {
        let mut args = vec!["train-classifier", "--train", s(file), "--out", s(&out)];
        args.extend_from_slice(&FLAGS);
        args.extend_from_slice(&["--max-steps", "2"]);
        args.extend_from_slice(extra);
        fails(&args, b"")
    };
    let bad = tmp.path().join("bad.tsv");
    std::fs::write(&bad, "an apple\tfruit\nno tab on this line\n").unwrap();
    let e = train(&bad, &[]);
    assert!(e.contains("bad.tsv:2: no tab"), "{e}");
    std::fs::write(&bad, b"an apple\tfruit\n\xff\xfe\tfruit\n").unwrap();
    let e = train(&bad, &[]);
    assert!(e.contains("bad.tsv:2: not valid UTF-8"), "{e}");
    std::fs::write(&bad, "an apple\tfruit\n\ttool\n").unwrap();
    let e = train(&bad, &[]);
    assert!(e.contains("bad.tsv:2: empty text"), "{e}");
    std::fs::write(&bad, "an apple\tfruit\na pear\tfruit\n").unwrap();
    let e = train(&bad, &[]);
    assert!(e.contains("one label (fruit)"), "{e}");
    let valid = tmp.path().join("valid.tsv");
    std::fs::write(&valid, "an apple\tfruit\na wrench\ttools\n").unwrap();
    let e = train(&good, &["--valid", s(&valid)]);
    assert!(e.contains("valid.tsv:2: label \"tools\""), "{e}");
    let e = train(&good, &["--init", s(&tmp.path().join("missing"))]);
    assert!(e.contains("missing") && e.contains("does not exist"), "{e}");

    // classify: a missing model, an empty sentence
    let e = fails(
        &["classify", "--model", s(&tmp.path().join("none"))],
        b"x\n",
    );
    assert!(e.contains("does not exist"), "{e}");
    let model = tmp.path().join("model");
    let mut args = vec!["train-classifier", "--train", s(&good), "--out", s(&model)];
    args.extend_from_slice(&FLAGS);
    args.extend_from_slice(&["--max-steps", "2"]);
    ok(&args, b"");
    let e = fails(
        &["classify", "--model", s(&model)],
        b"an apple\n\nmy hammer\n",
    );
    assert!(e.contains("<stdin>:2: empty sentence"), "{e}");
    let e = fails(
        &["classify", "--model", s(&model), "--eval", s(&valid)],
        b"",
    );
    assert!(e.contains("valid.tsv:2: label \"tools\""), "{e}");
}
