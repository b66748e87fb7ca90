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
            "--source-lang",
            "de",
            "--target-lang",
            "en",
        ])
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let ckpts = out.join("checkpoints");
    // The pair is recorded in the model and in every step checkpoint.
    let pair = |dir: &std::path::Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(dir.join("languages.json")).unwrap()).unwrap()
    };
    let de_en = serde_json::json!({"source": "de", "target": "en"});
    assert_eq!(pair(&out), de_en);
    assert_eq!(pair(&ckpts.join("step-00000003")), de_en);
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
    assert_eq!(pair(&resumed), de_en, "a resumed run keeps the pair");
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
    assert_eq!(pair(&avg), de_en, "an average keeps the pair");
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
    // A resumed run given both codes records the new pair; checkpoints that record different
    // pairs are not averaged.
    let resumed_fr = tmp.path().join("resumed-fr");
    let status = bin()
        .args(["train", "--train"])
        .arg(&data)
        .arg("--resume")
        .arg(ckpts.join("step-00000002"))
        .arg("--out")
        .arg(&resumed_fr)
        .args(["--max-steps", "3", "--threads", "1"])
        .args(["--source-lang", "de", "--target-lang", "fr"])
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(pair(&resumed_fr)["target"], "fr");
    let output = bin()
        .args(["average", "--out"])
        .arg(tmp.path().join("avg2"))
        .arg(&resumed_fr)
        .arg(ckpts.join("step-00000003"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && err.contains("different language pairs"),
        "{err}"
    );
    // A bad code, or one code without the other, is refused before any work.
    for extra in [
        &["--source-lang", "d e", "--target-lang", "en"][..],
        &["--source-lang", "de"][..],
    ] {
        let output = bin()
            .args(["train", "--train"])
            .arg(&data)
            .arg("--out")
            .arg(tmp.path().join("never"))
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && err.contains("lang") && !err.contains("panicked"),
            "{extra:?}: {err}"
        );
        assert!(!tmp.path().join("never").exists());
    }
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

/// `--cooldown 0` on resume removes the checkpoint's cool-down: the run continues on the paper's
/// schedule.
#[test]
fn resuming_with_cooldown_0_removes_the_cooldown() {
    use transformer::model::ModelConfig;
    use transformer::train::schedule::Schedule;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("train.tsv");
    let lines: String = (0..20).map(|i| format!("blue {i}\tblau {i}\n")).collect();
    std::fs::write(&data, lines).unwrap();
    let run = |out: &str, extra: &[&str]| {
        let output = bin()
            .args(["train", "--train"])
            .arg(&data)
            .arg("--out")
            .arg(tmp.path().join(out))
            .args([
                "--tokens-per-batch",
                "100",
                "--threads",
                "1",
                "--log-every",
                "1",
            ])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    run("first", &["--max-steps", "4", "--cooldown", "2"]);
    let first = tmp.path().join("first");
    run(
        "plain",
        &[
            "--resume",
            first.to_str().unwrap(),
            "--max-steps",
            "6",
            "--cooldown",
            "0",
        ],
    );
    let state = std::fs::read_to_string(tmp.path().join("plain/trainer_state.json")).unwrap();
    assert!(state.contains("\"cooldown\": null"), "{state}");
    let metrics = std::fs::read_to_string(tmp.path().join("plain/metrics.jsonl")).unwrap();
    let d_model = ModelConfig::preset("tiny", 10).unwrap().d_model;
    let schedule = Schedule::inverse_sqrt(d_model, 4000, 1.0);
    let lrs: Vec<(u64, f64)> = metrics
        .lines()
        .map(|l| {
            let r: serde_json::Value = serde_json::from_str(l).unwrap();
            (r["step"].as_u64().unwrap(), r["lr"].as_f64().unwrap())
        })
        .collect();
    assert_eq!(lrs.len(), 2, "{metrics}");
    for (step, lr) in lrs {
        let want = schedule.lr(step);
        assert!(
            (lr - want).abs() <= 1e-12 * want,
            "step {step}: {lr} vs {want}"
        );
    }
}

/// The data of the state-format check below, written by the test (the commands that made the
/// expected files ran the binary built before the trainers were merged into one).
fn state_format_inputs(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let pairs = dir.join("pairs.tsv");
    let text = dir.join("text.txt");
    let lines: String = (0..30)
        .map(|i| format!("red {i}\trot {}\n", i * 2))
        .collect();
    std::fs::write(&pairs, lines).unwrap();
    let lines: String = (0..400)
        .map(|i| format!("line {i}: the quick brown fox {} jumps\n", i * 7 % 13))
        .collect();
    std::fs::write(&text, lines).unwrap();
    (pairs, text)
}

/// `trainer_state.json` as the code before the single trainer wrote it for
/// `train --train pairs.tsv --max-steps 3 --tokens-per-batch 120 --word-dropout 0.1
/// --cooldown 2 --clip-norm 1 --seed 7 --threads 1` (with `--threads 2` only the generator
/// differs: RNG_2_THREADS).
const PAIRS_STATE: &str = r#"{
  "step": 3,
  "rng": {
    "inner": {
      "s": [
        7197772818487392818,
        10115163215447594667,
        3143928896400016874,
        5544217279052820989
      ]
    }
  },
  "order": {
    "seed": 7,
    "epoch": 0,
    "position": 3
  },
  "config": {
    "label_smoothing": 0.1,
    "warmup": 4000,
    "lr_factor": 1.0,
    "tokens_per_batch": 120,
    "accumulate": 1,
    "clip_norm": 1.0,
    "adam": {
      "beta1": 0.9,
      "beta2": 0.98,
      "eps": 1e-9
    },
    "seed": 7,
    "word_dropout": 0.1,
    "cooldown": {
      "start": 1,
      "end": 3
    }
  },
  "data_fingerprint": 8582204859564045561
}"#;

const RNG_1_THREAD: &str = r#"        7197772818487392818,
        10115163215447594667,
        3143928896400016874,
        5544217279052820989"#;

const RNG_2_THREADS: &str = r#"        9439396509004923638,
        1542364580768478253,
        5634898598034390040,
        18060795828817002012"#;

/// The same for `train-lm --text text.txt --vocab-size 300 --context 16 --batch 4 --d-model 16
/// --n-heads 2 --d-ff 32 --layers 1 --max-steps 3 --eval-every 0` (1 or 2 threads alike).
const LM_STATE: &str = r#"{
  "step": 3,
  "rng": {
    "inner": {
      "s": [
        11892568880107674222,
        3141315510371766351,
        5023068224897126806,
        16448783457672662163
      ]
    }
  },
  "config": {
    "context": 16,
    "batch": 4,
    "lr": 0.0005,
    "warmup": 200,
    "total_steps": 3,
    "min_lr_ratio": 0.1,
    "clip_norm": 1.0,
    "label_smoothing": 0.0,
    "adam": {
      "beta1": 0.9,
      "beta2": 0.98,
      "eps": 1e-9
    },
    "seed": 1
  },
  "data_fingerprint": 9171600218887911800
}"#;

/// `trainer_state.json` stays byte for byte what the code before the single trainer wrote (same
/// fields, order, values, generator and data fingerprints), for both shapes; and state files in
/// that format, and in the older one without `word_dropout` and `cooldown`, resume.
#[test]
fn trainer_state_files_keep_their_format_and_old_ones_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let (pairs, text) = state_format_inputs(tmp.path());
    let train = |out: &str, threads: &str, extra: &[&str]| {
        let output = bin()
            .args(["train", "--train"])
            .arg(&pairs)
            .arg("--out")
            .arg(tmp.path().join(out))
            .args(["--threads", threads])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let train_lm = |out: &str, threads: &str, extra: &[&str]| {
        let output = bin()
            .args(["train-lm", "--text"])
            .arg(&text)
            .arg("--out")
            .arg(tmp.path().join(out))
            .args([
                "--vocab-size",
                "300",
                "--context",
                "16",
                "--batch",
                "4",
                "--d-model",
                "16",
            ])
            .args([
                "--n-heads",
                "2",
                "--d-ff",
                "32",
                "--layers",
                "1",
                "--eval-every",
                "0",
            ])
            .args(["--threads", threads])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let state = |out: &str| {
        std::fs::read_to_string(tmp.path().join(out).join("trainer_state.json")).unwrap()
    };
    let recipe = [
        "--tokens-per-batch",
        "120",
        "--word-dropout",
        "0.1",
        "--cooldown",
        "2",
        "--clip-norm",
        "1",
        "--seed",
        "7",
        "--max-steps",
        "3",
    ];
    train("p1", "1", &recipe);
    train("p2", "2", &recipe);
    train_lm("l1", "1", &["--max-steps", "3"]);
    train_lm("l2", "2", &["--max-steps", "3"]);
    assert_eq!(state("p1"), PAIRS_STATE);
    assert_eq!(
        state("p2"),
        PAIRS_STATE.replace(RNG_1_THREAD, RNG_2_THREADS)
    );
    assert_eq!(state("l1"), LM_STATE);
    assert_eq!(state("l2"), LM_STATE);

    // A state in the format before `word_dropout` and `cooldown` (meaning 0 and none) resumes
    // with those defaults; the resumed run writes both fields.
    let old = tmp.path().join("old");
    std::fs::create_dir(&old).unwrap();
    for f in [
        "config.json",
        "model.safetensors",
        "optimizer.safetensors",
        "vocab.json",
    ] {
        std::fs::copy(tmp.path().join("p1").join(f), old.join(f)).unwrap();
    }
    let before_options = PAIRS_STATE.replace(
        r#",
    "word_dropout": 0.1,
    "cooldown": {
      "start": 1,
      "end": 3
    }"#,
        "",
    );
    assert!(!before_options.contains("word_dropout"));
    std::fs::write(old.join("trainer_state.json"), &before_options).unwrap();
    let old_str = old.to_str().unwrap();
    train("from-old", "1", &["--resume", old_str, "--max-steps", "5"]);
    let resumed = state("from-old");
    assert!(resumed.contains("\"step\": 5"), "{resumed}");
    assert!(resumed.contains("\"word_dropout\": 0.0"), "{resumed}");
    assert!(resumed.contains("\"cooldown\": null"), "{resumed}");
    // The language model's state file in today's format resumes too.
    let l1 = tmp.path().join("l1");
    train_lm(
        "l1-more",
        "1",
        &["--resume", l1.to_str().unwrap(), "--max-steps", "5"],
    );
    assert!(state("l1-more").contains("\"step\": 5"));
}
