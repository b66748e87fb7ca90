//! End-to-end tests of the `transformer` binary: every user error gives one clear `error:` line
//! on stderr naming the problem (and the file or line), a nonzero exit and no panic; the happy
//! paths of train (and resume), translate, score, demo and bench work on tiny settings.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// What one run of the binary did.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn describe(&self) -> String {
        format!(
            "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code, self.stdout, self.stderr
        )
    }

    /// Asserts a clean success (exit 0, nothing that looks like a panic).
    fn ok(self) -> Run {
        assert_eq!(self.code, Some(0), "expected success\n{}", self.describe());
        self.no_panic();
        self
    }

    fn no_panic(&self) {
        for bad in ["panicked", "RUST_BACKTRACE", "stack backtrace"] {
            assert!(
                !self.stderr.contains(bad),
                "{bad:?} on stderr\n{}",
                self.describe()
            );
        }
    }

    /// Asserts a user error: nonzero exit (not a panic's 101, not a signal), nothing on stdout,
    /// and exactly one `error:` message on stderr that contains every one of `needles`.
    /// Returns that message.
    fn user_error(&self, needles: &[&str]) -> String {
        self.no_panic();
        match self.code {
            Some(code) => assert!(
                code != 0 && code != 101,
                "expected a clean failure\n{}",
                self.describe()
            ),
            None => panic!("killed by a signal\n{}", self.describe()),
        }
        assert!(
            self.stdout.is_empty(),
            "output on failure\n{}",
            self.describe()
        );
        // The message: an `error:` line and its indented continuation lines (clap lists
        // missing arguments that way).
        let lines: Vec<&str> = self.stderr.lines().collect();
        let starts: Vec<usize> = (0..lines.len())
            .filter(|&i| lines[i].starts_with("error:"))
            .collect();
        assert_eq!(starts.len(), 1, "want one error line\n{}", self.describe());
        let message: Vec<&str> = std::iter::once(lines[starts[0]])
            .chain(
                lines[starts[0] + 1..]
                    .iter()
                    .copied()
                    .take_while(|l| l.starts_with(' ') && !l.trim().is_empty()),
            )
            .collect();
        let message = message.join("\n");
        for needle in needles {
            assert!(
                message.contains(needle),
                "error message lacks {needle:?}\n{}",
                self.describe()
            );
        }
        message
    }
}

/// Runs the binary with `args` and `stdin`.
fn run(args: &[&str], stdin: &[u8]) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_transformer"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    {
        // The binary may exit before reading (e.g. a missing model): ignore a broken pipe.
        let mut input = child.stdin.take().unwrap();
        let _ = input.write_all(stdin);
    }
    let out = child.wait_with_output().expect("the binary runs");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn s(p: &Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}

/// 40 short pairs: a word and a number, reversed on the target side.
fn pairs() -> Vec<(String, String)> {
    let words = ["red", "blue", "green", "gold", "grey"];
    (0..40)
        .map(|i| {
            let src = format!("{} {}", words[i % 5], i * 7 % 23);
            let tgt: String = src.chars().rev().collect();
            (src, tgt)
        })
        .collect()
}

fn tsv(pairs: &[(String, String)]) -> Vec<u8> {
    pairs
        .iter()
        .flat_map(|(a, b)| format!("{a}\t{b}\n").into_bytes())
        .collect()
}

/// The training file: the 40 pairs with three malformed lines at lines 5, 12 and 20.
fn training_file(dir: &Path) -> PathBuf {
    let mut lines: Vec<Vec<u8>> = pairs()
        .iter()
        .map(|(a, b)| format!("{a}\t{b}").into_bytes())
        .collect();
    lines.insert(4, b"no tab on this line".to_vec());
    lines.insert(11, b"bad \xFF\xFE bytes\tx".to_vec());
    lines.insert(19, b"a\tb\tc".to_vec());
    let path = dir.join("train.tsv");
    std::fs::write(&path, lines.join(&b'\n')).unwrap();
    path
}

fn train(train: &Path, out: &Path, extra: &[&str]) -> Run {
    let mut args = vec!["train", "--train", s(train), "--out", s(out)];
    args.extend(super::cli_run::TINY_TRAIN);
    args.extend(extra);
    run(&args, b"")
}

fn trainer_step(dir: &Path) -> u64 {
    let text = std::fs::read_to_string(dir.join("trainer_state.json")).unwrap();
    let state: serde_json::Value = serde_json::from_str(&text).unwrap();
    state["step"]
        .as_u64()
        .expect("trainer_state.json has a step")
}

/// A copy of the files of model directory `from` in a fresh directory `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// `--precision bf16` is saved with the run: a resume continues in bf16 whatever the flag says,
/// and says so.
#[test]
fn bf16_training_is_saved_and_resumed_in_bf16() {
    let tmp = tempfile::tempdir().unwrap();
    let data = training_file(tmp.path());
    let model = tmp.path().join("model");
    train(&data, &model, &["--max-steps", "2", "--precision", "bf16"]).ok();
    let state = std::fs::read_to_string(model.join("trainer_state.json")).unwrap();
    let state: serde_json::Value = serde_json::from_str(&state).unwrap();
    assert_eq!(state["config"]["precision"], "bf16", "{state}");
    let r = train(
        &data,
        &model,
        &[
            "--resume",
            s(&model),
            "--max-steps",
            "3",
            "--precision",
            "f32",
        ],
    )
    .ok();
    assert!(
        r.stderr.contains("at step 2 (precision bf16)"),
        "{}",
        r.describe()
    );
    assert_eq!(trainer_step(&model), 3);
    let state = std::fs::read_to_string(model.join("trainer_state.json")).unwrap();
    assert!(state.contains("\"precision\": \"bf16\""), "{state}");
}

/// One trained model serves every step that needs one: train (with malformed lines reported),
/// resume, translate, score, and the errors of broken model directories.
#[test]
fn train_resume_translate_score_and_broken_model_dirs() {
    let tmp = tempfile::tempdir().unwrap();
    let data = training_file(tmp.path());
    let model = tmp.path().join("model");

    // Train 3 steps; the malformed lines are skipped with a warning naming lines and count.
    let r = train(&data, &model, &["--max-steps", "3"]).ok();
    let warning = format!(
        "warning: {}: skipped 3 malformed lines (line 5: no tab; line 12: invalid UTF-8; \
         line 20: more than one tab)",
        data.display()
    );
    assert_eq!(
        r.stderr
            .lines()
            .filter(|l| l.starts_with("warning:"))
            .collect::<Vec<_>>(),
        [warning.as_str()],
        "{}",
        r.describe()
    );
    assert!(!r.stderr.contains("error"), "{}", r.describe());
    for file in [
        "config.json",
        "model.safetensors",
        "vocab.json",
        "optimizer.safetensors",
        "trainer_state.json",
    ] {
        assert!(
            model.join(file).is_file(),
            "{file} missing\n{}",
            r.describe()
        );
    }
    assert_eq!(trainer_step(&model), 3);

    // Resume to step 5 into another directory.
    let resumed = tmp.path().join("resumed");
    let r = run(
        &[
            "train",
            "--train",
            s(&data),
            "--resume",
            s(&model),
            "--max-steps",
            "5",
            "--threads",
            "1",
            "--out",
            s(&resumed),
        ],
        b"",
    )
    .ok();
    assert!(r.stderr.contains("at step 3"), "{}", r.describe());
    assert_eq!(trainer_step(&resumed), 5);
    assert_eq!(trainer_step(&model), 3, "resume must not touch its source");

    // Resuming on other data is refused.
    let other = tmp.path().join("other.tsv");
    std::fs::write(&other, tsv(&pairs()[..20])).unwrap();
    let r = run(
        &[
            "train",
            "--train",
            s(&other),
            "--resume",
            s(&model),
            "--max-steps",
            "5",
            "--out",
            s(&tmp.path().join("never")),
        ],
        b"",
    );
    r.user_error(&["trainer_state.json", "training data differ"]);
    // Resuming from a directory that does not exist names it.
    let missing = tmp.path().join("no-such-run");
    let r = run(
        &[
            "train",
            "--train",
            s(&data),
            "--resume",
            s(&missing),
            "--out",
            s(&tmp.path().join("never")),
        ],
        b"",
    );
    r.user_error(&[s(&missing)]);
    assert!(!tmp.path().join("never").exists());

    // Translate: one output line per input line, the empty line stays empty.
    let translate =
        |dir: &Path, stdin: &[u8]| run(&["translate", "--model", s(dir), "--threads", "1"], stdin);
    let r = translate(&resumed, b"red 7\n\nblue 14\n").ok();
    assert_eq!(r.stdout.matches('\n').count(), 3, "{}", r.describe());
    assert!(r.stdout.ends_with('\n'));
    assert_eq!(r.stdout.split('\n').nth(1), Some(""), "{}", r.describe());
    // Empty input: no lines in, no lines out.
    let r = translate(&model, b"").ok();
    assert_eq!(r.stdout, "");
    // Invalid UTF-8 and over-long lines name their line numbers.
    translate(&model, b"red 1\n\xC3\x28 x\n").user_error(&["<stdin>", "not valid UTF-8", "line 2"]);
    let long = format!("red 1\n{}\n", "a".repeat(1100));
    translate(&model, long.as_bytes()).user_error(&["line 2 (1100 tokens)", "1023"]);

    // Score: one finite negative log-probability per pair.
    let score = |stdin: &[u8]| run(&["score", "--model", s(&model), "--threads", "1"], stdin);
    let r = score(&tsv(&pairs()[..4])).ok();
    let scores: Vec<f64> = r
        .stdout
        .lines()
        .map(|l| l.trim().parse().expect("a number per line"))
        .collect();
    assert_eq!(scores.len(), 4, "{}", r.describe());
    assert!(
        scores.iter().all(|x| x.is_finite() && *x < 0.0),
        "{}",
        r.describe()
    );
    // A malformed line is an error naming it; so are empty and over-long input.
    score(b"red 1\t1 der\nblue 2 no tab\ngold 3\t3 dlog\n")
        .user_error(&["<stdin>", "line 2: no tab"]);
    score(b"red 1\t1 der\ngold 3\t\xFF\n").user_error(&["line 2: invalid UTF-8"]);
    score(b"").user_error(&["<stdin>", "no usable lines"]);
    let long = format!("red 1\t1 der\nred\t{}\n", "b".repeat(1100));
    score(long.as_bytes()).user_error(&["<stdin> line 2", "1100 target tokens"]);

    // A file changed after the save is refused by the checkpoint's manifest.
    let edited = tmp.path().join("edited");
    copy_dir(&model, &edited);
    let path = edited.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    translate(&edited, b"red 1\n").user_error(&[
        "model.safetensors",
        "does not match the checkpoint's manifest",
    ]);

    // Broken model directories without a manifest (another tool's, or older): each error
    // names the directory or file at fault.
    let broken = |name: &str, damage: &dyn Fn(&Path)| -> PathBuf {
        let dir = tmp.path().join(name);
        copy_dir(&model, &dir);
        std::fs::remove_file(dir.join("checkpoint.json")).unwrap();
        damage(&dir);
        dir
    };
    let gone = tmp.path().join("gone");
    translate(&gone, b"red 1\n").user_error(&["model directory", s(&gone), "does not exist"]);
    let dir = broken("no-config", &|d| {
        std::fs::remove_file(d.join("config.json")).unwrap()
    });
    translate(&dir, b"red 1\n").user_error(&["config.json", "file not found"]);
    let dir = broken("no-weights", &|d| {
        std::fs::remove_file(d.join("model.safetensors")).unwrap()
    });
    translate(&dir, b"red 1\n").user_error(&["model.safetensors", "file not found"]);
    let dir = broken("truncated", &|d| {
        let path = d.join("model.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    });
    translate(&dir, b"red 1\n").user_error(&["model.safetensors", "truncated or corrupt"]);
    run(&["score", "--model", s(&dir)], b"a\tb\n").user_error(&["model.safetensors", "truncated"]);
    let edit_config = |key: &'static str, value: u64| {
        move |d: &Path| {
            let path = d.join("config.json");
            let mut c: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            c[key] = value.into();
            std::fs::write(&path, c.to_string()).unwrap();
        }
    };
    let dir = broken("wider", &edit_config("d_ff", 256));
    translate(&dir, b"red 1\n").user_error(&[
        "model.safetensors",
        "config.json does not match the weights",
    ]);
    let dir = broken("shallower", &edit_config("n_decoder_layers", 1));
    translate(&dir, b"red 1\n").user_error(&["model.safetensors", "does not match"]);
    let dir = broken("deeper", &edit_config("n_encoder_layers", 3));
    translate(&dir, b"red 1\n").user_error(&["model.safetensors", "does not match"]);
    let dir = broken("bad-config", &|d| {
        std::fs::write(d.join("config.json"), "{\"d_model\": ").unwrap()
    });
    translate(&dir, b"red 1\n").user_error(&["config.json", "invalid model config"]);
    let dir = broken("no-vocab", &|d| {
        std::fs::remove_file(d.join("vocab.json")).unwrap()
    });
    translate(&dir, b"red 1\n").user_error(&["vocab.json"]);
    let dir = broken("bad-vocab", &|d| {
        std::fs::write(d.join("vocab.json"), "[1, 2").unwrap()
    });
    translate(&dir, b"red 1\n").user_error(&["vocab.json", "not a valid vocabulary"]);
    let dir = broken("no-state", &|d| {
        std::fs::remove_file(d.join("trainer_state.json")).unwrap()
    });
    run(
        &[
            "train",
            "--train",
            s(&data),
            "--resume",
            s(&dir),
            "--out",
            s(&tmp.path().join("never")),
        ],
        b"",
    )
    .user_error(&["trainer_state.json", "file not found"]);
}

#[test]
fn train_input_errors_are_one_clear_message() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");

    let missing = tmp.path().join("missing.tsv");
    train(&missing, &out, &[]).user_error(&["cannot read", s(&missing)]);

    let empty = tmp.path().join("empty.tsv");
    std::fs::write(&empty, b"").unwrap();
    train(&empty, &out, &[]).user_error(&[s(&empty), "no usable lines"]);

    let junk = tmp.path().join("junk.tsv");
    std::fs::write(&junk, b"no tab\n\xFF\xFE\n\n").unwrap();
    train(&junk, &out, &[]).user_error(&[s(&junk), "no usable lines"]);

    // Every pair longer than --max-len: a warning listing lines, then an error.
    let good = tmp.path().join("good.tsv");
    std::fs::write(&good, tsv(&pairs()[..7])).unwrap();
    let r = train(&good, &out, &["--max-len", "3"]);
    r.user_error(&[s(&good), "no training pairs left"]);
    assert!(
        r.stderr
            .contains("dropped 7 pairs longer than 3 tokens (lines 1, 2, 3, 4, 5, ...)"),
        "{}",
        r.describe()
    );

    // A bad validation file is as fatal as a bad training file.
    let r = train(&good, &out, &["--valid", s(&missing)]);
    r.user_error(&["cannot read", s(&missing)]);

    let r = run(
        &[
            "train",
            "--train",
            s(&good),
            "--out",
            s(&out),
            "--preset",
            "huge",
        ],
        b"",
    );
    r.user_error(&["unknown preset \"huge\"", "tiny"]);

    let config = tmp.path().join("config.json");
    std::fs::write(&config, b"{ not json").unwrap();
    run(
        &[
            "train",
            "--train",
            s(&good),
            "--out",
            s(&out),
            "--config",
            s(&config),
        ],
        b"",
    )
    .user_error(&[s(&config), "invalid model config"]);

    train(&good, &out, &["--dropout", "1.5"]).user_error(&["dropout"]);
    train(&good, &out, &["--label-smoothing", "1.5"]).user_error(&["--label-smoothing"]);
    train(&good, &out, &["--lr-factor", "0"]).user_error(&["--lr-factor"]);
    train(&good, &out, &["--clip-norm=-1"]).user_error(&["--clip-norm"]);
    train(&good, &out, &["--attention-dropout", "1"]).user_error(&["attention_dropout"]);
    train(&good, &out, &["--activation-dropout=-0.1"]).user_error(&["activation_dropout"]);
    train(&good, &out, &["--word-dropout", "1"]).user_error(&["--word-dropout"]);
    train(&good, &out, &["--max-steps", "10", "--cooldown", "11"])
        .user_error(&["--cooldown 11", "--max-steps 10"]);

    // --out names an existing file.
    train(&good, &empty, &["--max-steps", "0"])
        .user_error(&[s(&empty), "is a file, not a directory"]);
    assert!(!out.exists(), "no output directory after failures");
}

/// An io error's cause is printed once (it is part of the message, not also a `source`).
#[test]
fn io_errors_name_their_cause_once() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("missing.tsv");
    let message = train(&missing, &tmp.path().join("out"), &[]).user_error(&[s(&missing)]);
    assert_eq!(
        message.matches("No such file or directory").count(),
        1,
        "{message}"
    );
}

#[test]
fn bad_flags_are_one_clear_message() {
    let cases: &[(&[&str], &[&str])] = &[
        (&["frobnicate"], &["unrecognized subcommand", "frobnicate"]),
        (&["train", "--out", "x"], &["required", "--train"]),
        (
            &["train", "--train", "a", "--out", "b", "--max-steps", "many"],
            &["many", "--max-steps"],
        ),
        (
            &[
                "train",
                "--train",
                "a",
                "--out",
                "b",
                "--vocab-level",
                "byte",
            ],
            &["byte", "--vocab-level"],
        ),
        (
            &[
                "train", "--train", "a", "--out", "b", "--preset", "tiny", "--config", "c",
            ],
            &["--config", "--preset"],
        ),
        (&["translate"], &["required", "--model"]),
        (&["translate", "--model", "m", "--bogus"], &["--bogus"]),
        (
            &["translate", "--model", "m", "--beam-stop", "never"],
            &["--beam-stop", "first-k"],
        ),
        (&["score", "--model", "m", "--batch-size", "-3"], &["-3"]),
        (&["demo", "--steps", "1.5"], &["1.5", "--steps"]),
        (&["bench", "--threads", "lots"], &["lots", "--threads"]),
        (
            &["train", "--train", "a", "--out", "b", "--precision", "int8"],
            &["int8", "--precision"],
        ),
        (
            &[
                "train",
                "--train",
                "a",
                "--out",
                "b",
                "--bf16-kernel",
                "fast",
            ],
            &["fast", "--bf16-kernel", "gemm"],
        ),
    ];
    // No subcommand at all: the overview of the commands, as a failure.
    let r = run(&[], b"");
    r.no_panic();
    assert_eq!(r.code, Some(2), "{}", r.describe());
    assert!(
        r.stderr.contains("Usage: transformer <COMMAND>"),
        "{}",
        r.describe()
    );
    for (args, needles) in cases {
        let r = run(args, b"");
        let message = r.user_error(needles);
        // Usage errors exit with 2 and point to --help.
        assert_eq!(r.code, Some(2), "{args:?}: {message}\n{}", r.describe());
        assert!(
            r.stderr.contains("try '--help'"),
            "{args:?}: {message}\n{}",
            r.describe()
        );
    }
}

#[test]
fn help_and_version_work_for_every_subcommand() {
    for sub in ["train", "translate", "score", "demo", "bench"] {
        let r = run(&[sub, "--help"], b"").ok();
        assert!(
            r.stdout.contains(&format!("Usage: transformer {sub}")),
            "{}",
            r.describe()
        );
        let r = run(&["help", sub], b"").ok();
        assert!(r.stdout.contains("--threads"), "{}", r.describe());
    }
    let r = run(&["--help"], b"").ok();
    for sub in ["train", "translate", "score", "demo", "bench"] {
        assert!(r.stdout.contains(sub), "{}", r.describe());
    }
    let r = run(&["--version"], b"").ok();
    assert!(r.stdout.starts_with("transformer "), "{}", r.describe());
}

/// The training commands' help says what applies on --resume, what --cooldown 0 does there, and
/// that data parallelism always splits in two halves.
#[test]
fn training_help_says_what_applies_on_resume() {
    let train = run(&["train", "--help"], b"").ok().stdout;
    let lm = run(&["train-lm", "--help"], b"").ok().stdout;
    for help in [&train, &lm] {
        assert!(help.contains("always two halves"), "{help}");
        assert!(help.contains("What applies:"), "{help}");
        for flag in ["--log-every", "--save-every", "--keep-last", "--time-limit"] {
            assert!(help.contains(flag), "{flag}\n{help}");
        }
    }
    assert!(train.contains("0 removes it"), "{train}");
    // Every recipe option says it is ignored with --resume.
    let ignored = |help: &str, flags: &[&str]| {
        for flag in flags {
            let entry = help
                .split("\n      --")
                .find(|e| e.starts_with(&flag[2..]))
                .unwrap_or_else(|| panic!("no {flag} in\n{help}"));
            assert!(entry.contains("Ignored with --resume"), "{entry}");
        }
    };
    ignored(
        &train,
        &[
            "--preset",
            "--config",
            "--seed",
            "--tokens-per-batch",
            "--accumulate",
            "--clip-norm",
            "--warmup",
            "--lr-factor",
            "--label-smoothing",
            "--dropout",
            "--attention-dropout",
            "--activation-dropout",
            "--word-dropout",
            "--pre-ln",
            "--vocab-level",
            "--vocab-size",
        ],
    );
    ignored(
        &lm,
        &[
            "--vocab-size",
            "--context",
            "--batch",
            "--d-model",
            "--n-heads",
            "--d-ff",
            "--layers",
            "--dropout",
            "--pre-ln",
            "--activation",
            "--positions",
            "--untied",
            "--lr",
            "--warmup",
            "--clip-norm",
            "--label-smoothing",
            "--seed",
        ],
    );
}

#[test]
fn demo_runs_on_tiny_settings() {
    let r = run(
        &[
            "demo",
            "--max-number",
            "999",
            "--train-size",
            "100",
            "--held-out",
            "20",
            "--steps",
            "3",
            "--tokens-per-batch",
            "600",
            "--samples",
            "2",
            "--threads",
            "1",
        ],
        b"",
    )
    .ok();
    assert!(
        r.stdout
            .lines()
            .any(|l| l.contains("exact match on 20 held-out numbers")),
        "{}",
        r.describe()
    );
    run(&["demo", "--max-number", "0", "--threads", "1"], b"").user_error(&["--max-number 0"]);
}

#[test]
fn bench_prints_tokens_per_second() {
    let bench = |extra: &[&str]| {
        let mut args = vec!["bench", "--threads", "1"];
        args.extend(extra);
        run(&args, b"")
    };
    // One step, no warm-up: the shortest timed run.
    let one_step = ["--vocab", "50", "--steps", "1", "--warmup-steps", "0"];
    let r = bench(
        &[
            &[
                "--preset",
                "tiny",
                "--batch",
                "2",
                "--src-len",
                "4",
                "--tgt-len",
                "4",
            ][..],
            &one_step,
        ]
        .concat(),
    )
    .ok();
    let rate: Vec<f64> = r
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("train: ")?.strip_suffix(" tokens/s"))
        .map(|x| x.parse().expect("a number"))
        .collect();
    assert_eq!(rate.len(), 1, "{}", r.describe());
    assert!(rate[0].is_finite() && rate[0] > 0.0, "{}", r.describe());

    bench(&["--preset", "huge"]).user_error(&["unknown preset \"huge\""]);
    bench(&["--preset", "tiny", "--steps", "0"]).user_error(&["--steps"]);
    bench(&["--preset", "tiny", "--src-len", "2000"]).user_error(&["max_len 1024"]);
    for vocab in ["0", "3", "4"] {
        bench(&["--preset", "tiny", "--vocab", vocab]).user_error(&["--vocab"]);
    }

    // Decoder-only: 130 tokens per sequence, past the tiled-attention threshold.
    let lm = [
        "--lm",
        "--preset",
        "tiny",
        "--seq-len",
        "130",
        "--tokens",
        "260",
    ];
    let r = bench(&[&lm[..], &one_step].concat()).ok();
    assert!(
        r.stdout.lines().any(|l| l.starts_with("train-lm: ")),
        "{}",
        r.describe()
    );
    assert!(
        r.stdout
            .lines()
            .any(|l| l.starts_with("peak resident memory: ")),
        "{}",
        r.describe()
    );
    bench(&["--lm", "--preset", "tiny", "--seq-len", "1"]).user_error(&["--seq-len"]);
    bench(&["--translate", "no-such-model", "--src", "x.txt"]).user_error(&["no-such-model"]);
}

#[test]
fn train_stops_at_the_time_limit_and_saves() {
    let tmp = tempfile::tempdir().unwrap();
    let data = training_file(tmp.path());
    let model = tmp.path().join("model");
    let r = train(
        &data,
        &model,
        &["--max-steps", "50", "--time-limit", "0.000001"],
    )
    .ok();
    assert!(
        r.stderr.contains("--time-limit reached at step 1"),
        "{}",
        r.describe()
    );
    assert_eq!(trainer_step(&model), 1);
    let r = train(&data, &tmp.path().join("x"), &["--time-limit", "0"]);
    r.user_error(&["--time-limit 0", "positive number of seconds"]);

    // The saved model runs under `bench --translate` (greedy, then beam search).
    let src = tmp.path().join("src.txt");
    std::fs::write(&src, "red 7\nblue 14\n\ngold 3\n").unwrap();
    let r = run(
        &[
            "bench",
            "--translate",
            s(&model),
            "--src",
            s(&src),
            "--threads",
            "1",
            "--beam",
            "2",
            "--beam-stop",
            "first-k",
            "--sentences-per-batch",
            "2",
        ],
        b"",
    )
    .ok();
    // "greedy: X sentences/s, Y target tokens/s (N tokens in T s)", then the same for the beam;
    // every sentence emits at least its EOS.
    for prefix in ["greedy: ", "beam 2: "] {
        let line = r.stdout.lines().find(|l| l.starts_with(prefix));
        let line = line.unwrap_or_else(|| panic!("no {prefix:?} line\n{}", r.describe()));
        let tokens: usize = line
            .split('(')
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no token count in {line:?}"));
        assert!(tokens >= 3, "{line}");
    }
    assert!(r.stderr.contains("3 sentences"), "{}", r.describe());
}
