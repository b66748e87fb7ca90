//! `train --save-every/--keep-last/--log-every` and `average`, end to end through the binary.

use std::process::{Command, Stdio};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_transformer"))
}

#[test]
fn step_checkpoints_metrics_and_averaging() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("train.tsv");
    let lines: String = (0..30)
        .map(|i| format!("red {i}\trot {}\n", i * 2))
        .collect();
    std::fs::write(&data, lines).unwrap();
    let out = tmp.path().join("run");
    let status = bin()
        .args(["train", "--train"])
        .arg(&data)
        .arg("--valid")
        .arg(&data)
        .arg("--out")
        .arg(&out)
        .args([
            "--valid-every",
            "2",
            "--valid-bleu-lines",
            "5",
            "--max-steps",
            "3",
            "--tokens-per-batch",
            "120",
            "--threads",
            "1",
            "--save-every",
            "1",
            "--keep-last",
            "2",
            "--log-every",
            "1",
        ])
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let ckpts = out.join("checkpoints");
    let mut names: Vec<String> = std::fs::read_dir(&ckpts)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["step-00000002", "step-00000003"]);
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 3);
    let bleu = records[1]["valid_bleu"].as_f64().unwrap();
    assert!((0.0..=100.0).contains(&bleu), "{bleu}");
    assert!(records[1]["valid_loss"].as_f64().unwrap() > 0.0);
    assert!(records[0].get("valid_bleu").is_none());
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r["step"], i as u64 + 1);
        assert!(r["loss"].as_f64().unwrap() > 0.0);
        assert!(r["lr"].as_f64().unwrap() > 0.0);
        assert!(r["tokens_per_s"].as_f64().unwrap() > 0.0);
    }
    // A step checkpoint is a complete model directory: it resumes...
    let resumed = tmp.path().join("resumed");
    let status = bin()
        .args(["train", "--train"])
        .arg(&data)
        .arg("--resume")
        .arg(ckpts.join("step-00000002"))
        .arg("--out")
        .arg(&resumed)
        .args(["--max-steps", "3", "--threads", "1"])
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    // ...and averages into a model that translates.
    let avg = tmp.path().join("avg");
    let output = bin()
        .arg("average")
        .arg("--out")
        .arg(&avg)
        .arg(ckpts.join("step-00000002"))
        .arg(ckpts.join("step-00000003"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut child = bin()
        .args(["translate", "--threads", "1", "--model"])
        .arg(&avg)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"red 3\n\nred 4\n")
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    assert_eq!(String::from_utf8(output.stdout).unwrap().lines().count(), 3);
    // Averaging nothing that exists is a clear error.
    let output = bin()
        .args(["average", "--out"])
        .arg(tmp.path().join("x"))
        .arg(tmp.path().join("missing"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(
        err.contains("missing") && !err.contains("panicked"),
        "{err}"
    );
}
