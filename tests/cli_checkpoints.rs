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

/// A run with a cool-down resumes for longer only with a new cool-down: past the old one's end
/// the rate would be 0, so that is refused with a message naming it.
#[test]
fn resuming_past_a_cooldown_needs_a_new_one() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("train.tsv");
    let lines: String = (0..20).map(|i| format!("blue {i}\tblau {i}\n")).collect();
    std::fs::write(&data, lines).unwrap();
    let run = |out: &str, extra: &[&str]| {
        bin()
            .args(["train", "--train"])
            .arg(&data)
            .arg("--out")
            .arg(tmp.path().join(out))
            .args(["--tokens-per-batch", "100", "--threads", "1"])
            .args(extra)
            .output()
            .unwrap()
    };
    let first = run("first", &["--max-steps", "4", "--cooldown", "2"]);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let first_dir = tmp.path().join("first");
    let first_dir = first_dir.to_str().unwrap();
    let refused = run("longer", &["--resume", first_dir, "--max-steps", "6"]);
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        message.contains("cool-down ends at step 4") && message.contains("--max-steps 6"),
        "{message}"
    );
    let extended = run(
        "longer",
        &[
            "--resume",
            first_dir,
            "--max-steps",
            "6",
            "--cooldown",
            "2",
            "--log-every",
            "1",
        ],
    );
    assert!(
        extended.status.success(),
        "{}",
        String::from_utf8_lossy(&extended.stderr)
    );
    let metrics = std::fs::read_to_string(tmp.path().join("longer/metrics.jsonl")).unwrap();
    let lrs: Vec<f64> = metrics
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["lr"]
                .as_f64()
                .unwrap()
        })
        .collect();
    // Steps 5 and 6 of the new cool-down over updates 5..=6: half the rate, then 0.
    assert_eq!(lrs.len(), 2, "{metrics}");
    assert!(lrs[0] > 0.0 && lrs[1] == 0.0, "{lrs:?}");
}
