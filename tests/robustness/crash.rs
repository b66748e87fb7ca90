//! Crash test: `kill -9` training runs (translation and language model, resumed in place with
//! `--resume D --out D` and into a new directory) at random moments, saves included, and check
//! every time that
//! - the directory loads, and its checkpoint is one consistent save: model, optimizer, trainer
//!   state and vocabulary byte for byte those of an uninterrupted run's checkpoint at the same
//!   step (read through `store::read_file`, as every loader reads);
//! - every step checkpoint that `store::list_step_checkpoints` lists is that too;
//! - `--resume` continues from it and, after more kills, ends bit-identical to the
//!   uninterrupted run.
//!
//! Saves happen after every update (`--autosave` of a nanosecond, `--save-every 1`), so kills
//! land in saves often; a kill that leaves a staging (`.saving`) or committed (`.commit`)
//! directory behind is counted as one during a save. The normal suite makes a few kills per
//! case (seconds); `TRANSFORMER_CRASH_KILLS=N` makes N per case (`tests/crash/crash.sh`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use transformer::model::checkpoint::load;
use transformer::model::{LanguageModel, Seq2Seq};
use transformer::rng::Rng;
use transformer::store::{list_step_checkpoints, read_file, step_checkpoint_name};

const STEPS: u64 = 10;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Translation,
    LanguageModel,
}

/// The training command of `kind` writing `out`, resuming `resume` (no --overwrite).
fn command(
    kind: Kind,
    data: &Path,
    out: &Path,
    resume: Option<&Path>,
    every_step: bool,
) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_transformer"));
    match kind {
        Kind::Translation => {
            c.args(["train", "--train"]).arg(data).args([
                "--tokens-per-batch",
                "120",
                "--warmup",
                "4",
                "--dropout",
                "0.1",
            ]);
        }
        Kind::LanguageModel => {
            c.args(["train-lm", "--text"]).arg(data).args([
                "--vocab-size",
                "270",
                "--context",
                "16",
                "--batch",
                "4",
                "--d-model",
                "32",
                "--n-heads",
                "2",
                "--d-ff",
                "64",
                "--layers",
                "1",
                "--eval-every",
                "0",
            ]);
        }
    }
    c.arg("--out").arg(out);
    c.args([
        "--max-steps",
        &STEPS.to_string(),
        "--threads",
        "1",
        "--seed",
        "3",
    ]);
    c.args(["--log-every", "1", "--save-every", "1"]);
    if every_step {
        // Into OUT after every update, and every step checkpoint kept.
        c.args(["--autosave", "1e-9", "--keep-last", "3"]);
    } else {
        c.args(["--keep-last", "100"]);
    }
    if let Some(r) = resume {
        c.arg("--resume").arg(r);
    }
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

fn data(dir: &Path, kind: Kind) -> PathBuf {
    let path = dir.join(match kind {
        Kind::Translation => "train.tsv",
        Kind::LanguageModel => "text.txt",
    });
    let text: String = match kind {
        Kind::Translation => (0..40)
            .map(|i| format!("red {i} apples\trot {} Äpfel\n", i * 3))
            .collect(),
        Kind::LanguageModel => (0..200)
            .map(|i| format!("line {i}: the quick brown fox jumps over {} dogs.\n", i * 7))
            .collect(),
    };
    std::fs::write(&path, text).unwrap();
    // A small translation model, so that saves after every update stay quick.
    let config = r#"{"vocab_size": 4, "d_model": 32, "n_heads": 2, "d_ff": 64,
        "n_encoder_layers": 1, "n_decoder_layers": 1, "dropout": 0.1, "norm": "pre-ln",
        "layer_norm_eps": 1e-6, "tie_embeddings": true, "max_len": 64}"#;
    std::fs::write(dir.join("model.json"), config).unwrap();
    path
}

/// The files of a checkpoint that must come from one save.
fn checkpoint_files(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Translation => &[
            "config.json",
            "model.safetensors",
            "optimizer.safetensors",
            "trainer_state.json",
            "vocab.json",
        ],
        Kind::LanguageModel => &[
            "config.json",
            "model.safetensors",
            "optimizer.safetensors",
            "trainer_state.json",
            "tokenizer.json",
        ],
    }
}

fn step_of(dir: &Path) -> u64 {
    let state: serde_json::Value =
        serde_json::from_slice(&read_file(&dir.join("trainer_state.json")).unwrap()).unwrap();
    state["step"].as_u64().unwrap()
}

/// Whether `dir` holds a checkpoint (complete, or whose commit a kill interrupted).
fn has_checkpoint(dir: &Path) -> bool {
    read_file(&dir.join("trainer_state.json")).is_ok()
}

/// `dir`'s checkpoint loads and is, file for file, the reference's at its step.
fn check_consistent(kind: Kind, dir: &Path, reference: &Path) -> u64 {
    match kind {
        Kind::Translation => drop(load::<Seq2Seq<f32>>(dir).unwrap()),
        Kind::LanguageModel => drop(load::<LanguageModel<f32>>(dir).unwrap()),
    }
    let step = step_of(dir);
    let want = reference
        .join("checkpoints")
        .join(step_checkpoint_name(step));
    for name in checkpoint_files(kind) {
        let got = read_file(&dir.join(name)).unwrap();
        let expected = std::fs::read(want.join(name)).unwrap();
        assert!(
            got == expected,
            "{}: {name} differs from the uninterrupted run's at step {step}",
            dir.display()
        );
    }
    step
}

/// Every listed step checkpoint of `dir` is consistent; a kill leaves no half-written one
/// listed.
fn check_step_checkpoints(kind: Kind, dir: &Path, reference: &Path) {
    for ckpt in list_step_checkpoints(&dir.join("checkpoints")) {
        let step = check_consistent(kind, &ckpt, reference);
        assert_eq!(
            ckpt.file_name().unwrap().to_str().unwrap(),
            step_checkpoint_name(step)
        );
    }
}

/// Whether a kill left a save under way (a staging or commit directory).
fn killed_in_save(dir: &Path) -> bool {
    let staged = |d: &Path| d.join(".saving").exists() || d.join(".commit").exists();
    let step_staged = std::fs::read_dir(dir.join("checkpoints"))
        .map(|rd| {
            rd.flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(".saving") || staged(&e.path()))
        })
        .unwrap_or(false);
    staged(dir) || step_staged
}

fn run_to_end(mut c: Command) {
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

struct Tally {
    kills: usize,
    in_saves: usize,
    survived: usize,
}

/// One case: kill runs of `kind` until `kills` kills, resuming each time (in place or into a
/// new directory), then let the last run finish and compare it with the reference.
fn crash_case(kind: Kind, in_place: bool, kills: usize, seed: u64) -> Tally {
    let tmp = tempfile::tempdir().unwrap();
    let data = data(tmp.path(), kind);
    // The uninterrupted run, every step checkpoint kept.
    let reference = tmp.path().join("reference");
    let t0 = Instant::now();
    run_to_end(command(kind, &data, &reference, None, false));
    let span = t0.elapsed().as_secs_f64() * 1.2 + 0.05;
    let mut rng = Rng::new(seed);
    let mut tally = Tally {
        kills: 0,
        in_saves: 0,
        survived: 0,
    };
    let mut generation = 0;
    let mut dir = tmp.path().join("run-0");
    let mut source: Option<PathBuf> = None;
    loop {
        let mut c = command(kind, &data, &dir, source.as_deref(), true);
        if source.is_none() {
            c.arg("--overwrite");
        }
        if tally.kills == kills {
            run_to_end(c);
            break;
        }
        let mut child = c.spawn().unwrap();
        std::thread::sleep(Duration::from_secs_f64(rng.uniform() * span));
        let finished = child.try_wait().unwrap().is_some_and(|s| s.success());
        child.kill().unwrap();
        child.wait().unwrap();
        if finished {
            // It ended before the kill: start the case's next run from scratch.
            dir = tmp.path().join(format!("run-{}", generation + 1));
            generation += 1;
            source = None;
            continue;
        }
        tally.kills += 1;
        if killed_in_save(&dir) {
            tally.in_saves += 1;
        }
        check_step_checkpoints(kind, &dir, &reference);
        source = if has_checkpoint(&dir) {
            check_consistent(kind, &dir, &reference);
            Some(dir.clone())
        } else {
            // Killed before its first save: the latest step checkpoint, if any.
            list_step_checkpoints(&dir.join("checkpoints")).pop()
        };
        tally.survived += 1;
        if !in_place {
            generation += 1;
            dir = tmp.path().join(format!("run-{generation}"));
        }
    }
    // The finished run equals the uninterrupted one, bit for bit.
    assert_eq!(step_of(&dir), STEPS);
    let fin = check_consistent(kind, &dir, &reference);
    assert_eq!(fin, STEPS);
    for name in checkpoint_files(kind) {
        assert_eq!(
            read_file(&dir.join(name)).unwrap(),
            std::fs::read(reference.join(name)).unwrap(),
            "{name}"
        );
    }
    check_step_checkpoints(kind, &dir, &reference);
    tally
}

fn kills() -> usize {
    std::env::var("TRANSFORMER_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

fn report(name: &str, t: Tally) {
    eprintln!(
        "crash {name}: {} of {} kills survived ({} during a save)",
        t.survived, t.kills, t.in_saves
    );
    assert_eq!(t.survived, t.kills);
}

#[test]
fn translation_killed_and_resumed_in_place() {
    report(
        "translation, in place",
        crash_case(Kind::Translation, true, kills(), 1),
    );
}

#[test]
fn translation_killed_and_resumed_elsewhere() {
    report(
        "translation, new directory",
        crash_case(Kind::Translation, false, kills(), 2),
    );
}

#[test]
fn language_model_killed_and_resumed_in_place() {
    report(
        "language model, in place",
        crash_case(Kind::LanguageModel, true, kills(), 3),
    );
}

#[test]
fn language_model_killed_and_resumed_elsewhere() {
    report(
        "language model, new directory",
        crash_case(Kind::LanguageModel, false, kills(), 4),
    );
}
