//! What the command-line training tests share: running the binary, its output or its
//! error, a path as an argument, and a run's loss curve from `metrics.jsonl`.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// The flags of a tiny translation model's `train` run that the CLI tests share (the `tiny`
/// preset, small batches, one thread, a short warm-up).
pub const TINY_TRAIN: [&str; 8] = [
    "--preset",
    "tiny",
    "--tokens-per-batch",
    "200",
    "--threads",
    "1",
    "--warmup",
    "10",
];

/// Runs the binary; returns (exit code, stdout, stderr).
pub fn run(args: &[&str], stdin: &[u8]) -> (Option<i32>, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_transformer"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    {
        let mut input = child.stdin.take().unwrap();
        let _ = input.write_all(stdin);
    }
    let out = child.wait_with_output().expect("the binary runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn ok(args: &[&str], stdin: &[u8]) -> String {
    let (code, stdout, stderr) = run(args, stdin);
    assert_eq!(code, Some(0), "{args:?} failed\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stdout
}

/// The error of a run that must fail (exit code 1, no panic).
pub fn fails(args: &[&str], stdin: &[u8]) -> String {
    let (code, _, stderr) = run(args, stdin);
    assert_eq!(code, Some(1), "{args:?} should fail\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

pub fn s(p: &Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}

/// (step, loss, valid_nll, valid accuracy: `valid_masked_accuracy`, which `train-mlm` and
/// `train-classifier` both write) of each line of OUT/metrics.jsonl.
pub fn curve(dir: &Path) -> Vec<(u64, f64, Option<f64>, Option<f64>)> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["step"].as_u64().unwrap(),
                v["loss"].as_f64().unwrap(),
                v["valid_nll"].as_f64(),
                v["valid_masked_accuracy"].as_f64(),
            )
        })
        .collect()
}
