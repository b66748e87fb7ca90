//! Nothing lost, nothing crashes: divergence keeps the last good checkpoint, non-finite weights
//! are never saved nor loaded, resumed recipes are checked like the command line, a directory
//! mixing two saves is refused, `--out` never overwrites by accident, averaging checks its
//! inputs, sizes are bounded, and closed pipes end quietly (library and binary).
use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use transformer::error::Error;
use transformer::model::checkpoint::{load, save};
use transformer::model::{ModelConfig, Module, Seq2Seq};
use transformer::store::{list_step_checkpoints, CheckpointWriter};
use transformer::train::pairs::{Example, TrainConfig};
use transformer::train::run::{run, Output, RunOptions, Silent};
use transformer::train::state::TrainerState;
use transformer::train::trainer::PairTrainer;
use transformer::train::windows::LmTrainConfig;

fn examples() -> Vec<Example> {
    common::toy_examples(40)
}

fn trainer() -> PairTrainer {
    let mut m = ModelConfig::preset("tiny", 24).unwrap();
    (m.d_model, m.n_heads, m.d_ff) = (16, 2, 32);
    let t = TrainConfig {
        tokens_per_batch: 100,
        warmup: 4,
        ..TrainConfig::default()
    };
    PairTrainer::new(m, t, examples()).unwrap()
}

fn no_tokenizer(_: &mut CheckpointWriter) -> transformer::error::Result<()> {
    Ok(())
}

fn state_step(dir: &Path) -> u64 {
    let bytes = transformer::store::read_file(&dir.join("trainer_state.json")).unwrap();
    serde_json::from_slice::<serde_json::Value>(&bytes).unwrap()["step"]
        .as_u64()
        .unwrap()
}

/// Weights that turn NaN stop the run with an error naming the step; the run directory and
/// the step checkpoints keep the last good save, none is rotated away.
#[test]
fn a_diverged_run_keeps_its_last_good_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Output {
        dir: tmp.path().join("run"),
        save_tokenizer: &no_tokenizer,
        log_every: Some(1),
        save_every: 1,
        keep_last: 2,
        save_into_dir_every: 1,
        autosave: None,
    };
    let mut t = trainer();
    let options = |max_steps| RunOptions {
        max_steps,
        time_limit: None,
        valid_every: 0,
    };
    run(&mut t, &options(3), Some(&out), None, &mut Silent).unwrap();
    let good = std::fs::read(out.dir.join("model.safetensors")).unwrap();
    // Saving NaN weights is refused, naming the tensor, and changes nothing.
    t.model.params_mut()[5].1.value.data[2] = f32::NAN;
    let name = t.model.params_mut()[5].0.clone();
    let err = t.save(&out.dir).unwrap_err();
    assert!(matches!(err, Error::NotFinite { .. }), "{err}");
    assert!(err.to_string().contains(&name), "{err}");
    assert_eq!(
        std::fs::read(out.dir.join("model.safetensors")).unwrap(),
        good
    );
    // Training on: the loss is NaN at update 4, the run stops and keeps step 3.
    let err = run(&mut t, &options(8), Some(&out), None, &mut Silent).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Diverged { step: 4, .. }), "{msg}");
    assert!(msg.contains("step 4") && msg.contains("kept"), "{msg}");
    assert_eq!(state_step(&out.dir), 3);
    assert_eq!(
        std::fs::read(out.dir.join("model.safetensors")).unwrap(),
        good
    );
    let steps: Vec<u64> = list_step_checkpoints(&out.dir.join("checkpoints"))
        .iter()
        .map(|d| state_step(d))
        .collect();
    assert_eq!(steps, [2, 3]);
    load::<Seq2Seq<f32>>(&out.dir).unwrap();
}

/// A NaN in a weights file is refused at load, naming the tensor.
#[test]
fn loading_refuses_weights_that_are_not_finite() {
    let tmp = tempfile::tempdir().unwrap();
    let mut t = trainer();
    save(tmp.path(), &mut t.model).unwrap();
    std::fs::remove_file(tmp.path().join("checkpoint.json")).unwrap();
    let path = tmp.path().join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n - 4..].copy_from_slice(&f32::INFINITY.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    let err = load::<Seq2Seq<f32>>(tmp.path()).unwrap_err().to_string();
    assert!(err.contains("inf") && err.contains("not finite"), "{err}");
    assert!(err.contains("tensor "), "{err}");
}

/// A resume reads model, optimizer and state of one save: a file of another save is refused.
#[test]
fn a_directory_mixing_two_saves_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let mut t = trainer();
    t.step().unwrap();
    t.save(tmp.path()).unwrap();
    let old_optimizer = std::fs::read(tmp.path().join("optimizer.safetensors")).unwrap();
    t.step().unwrap();
    t.save(tmp.path()).unwrap();
    PairTrainer::resume(tmp.path(), examples()).unwrap();
    std::fs::write(tmp.path().join("optimizer.safetensors"), old_optimizer).unwrap();
    let err = PairTrainer::resume(tmp.path(), examples())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("optimizer.safetensors") && err.contains("does not match"),
        "{err}"
    );
}

/// The recipe in trainer_state.json is checked with the command line's rules, naming the field.
#[test]
fn a_resumed_recipe_is_checked_like_the_command_line() {
    let path = Path::new("trainer_state.json");
    let lm = TrainerState {
        step: 3,
        rng: transformer::rng::Rng::new(1),
        order: None,
        config: LmTrainConfig::default(),
        data_fingerprint: 1,
    };
    let json = String::from_utf8(lm.to_bytes()).unwrap();
    let edit = |from: &str, to: &str| {
        assert!(json.contains(from), "{from}");
        let err =
            TrainerState::<LmTrainConfig>::from_bytes(json.replace(from, to).as_bytes(), path)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
        assert!(err.contains("trainer_state.json"), "{to}: {err}");
        err
    };
    assert!(edit("\"lr\": 0.0005", "\"lr\": -0.0005").contains("config.lr -0.0005"));
    assert!(edit("\"batch\": 16", "\"batch\": 1000000000000").contains("config.batch"));
    assert!(edit("\"beta2\": 0.98", "\"beta2\": 1.5").contains("config.adam.beta2"));
    assert!(edit("\"step\": 3", "\"step\": 99999999999").contains("step 99999999999"));
    let zeros = edit(
        &json[json.find("\"s\": [").unwrap()..json.find(']').unwrap() + 1],
        "\"s\": [0, 0, 0, 0]",
    );
    assert!(zeros.contains("rng"), "{zeros}");
    let pairs = TrainerState {
        step: 0,
        rng: transformer::rng::Rng::new(1),
        order: Some(transformer::train::batching::BatchOrder::new(1)),
        config: TrainConfig::default(),
        data_fingerprint: 1,
    };
    let json = String::from_utf8(pairs.to_bytes()).unwrap();
    let err = TrainerState::<TrainConfig>::from_bytes(
        json.replace("\"accumulate\": 1", "\"accumulate\": 1000000000000")
            .as_bytes(),
        path,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains("config.accumulate 1000000000000 must be in 1..=4096"),
        "{err}"
    );
    // With a byte order mark, a valid state reads.
    let bom = [b"\xEF\xBB\xBF".as_slice(), json.as_bytes()].concat();
    TrainerState::<TrainConfig>::from_bytes(&bom, path).unwrap();
}

// ---- the binary -----------------------------------------------------------------------------

struct Out {
    code: Option<i32>,
    stderr: String,
    stdout: String,
}

fn bin(args: &[&str], stdin: &[u8]) -> Out {
    let mut child = Command::new(env!("CARGO_BIN_EXE_transformer"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A command that does not read stdin may exit before it is written.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    let out = child.wait_with_output().unwrap();
    Out {
        code: out.status.code(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
    }
}

impl Out {
    fn ok(self) -> Out {
        assert_eq!(self.code, Some(0), "{}", self.stderr);
        self
    }
    fn refused(self, parts: &[&str]) -> Out {
        assert_eq!(self.code, Some(1), "{}", self.stderr);
        assert!(!self.stderr.contains("panicked"), "{}", self.stderr);
        for p in parts {
            assert!(self.stderr.contains(p), "lacks {p:?}: {}", self.stderr);
        }
        self
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A TSV corpus, a small model config and a text in `dir`.
fn inputs(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let tsv = dir.join("train.tsv");
    let lines: String = (0..30)
        .map(|i| format!("red {i}\trot {}\n", i * 2))
        .collect();
    std::fs::write(&tsv, lines).unwrap();
    let config = dir.join("small.json");
    std::fs::write(
        &config,
        r#"{"vocab_size": 4, "d_model": 16, "n_heads": 2, "d_ff": 32, "n_encoder_layers": 1,
            "n_decoder_layers": 1, "dropout": 0.1, "norm": "post-ln", "layer_norm_eps": 1e-6,
            "tie_embeddings": true, "max_len": 64}"#,
    )
    .unwrap();
    let text = dir.join("text.txt");
    let t: String = (0..80)
        .map(|i| format!("line {i} of the text.\n"))
        .collect();
    std::fs::write(&text, t).unwrap();
    (tsv, config, text)
}

fn train(tsv: &Path, config: &Path, out: &Path, extra: &[&str]) -> Out {
    let mut args = vec![
        "train",
        "--train",
        s(tsv),
        "--config",
        s(config),
        "--out",
        s(out),
        "--threads",
        "1",
    ];
    for (flag, value) in [("--max-steps", "2"), ("--tokens-per-batch", "100")] {
        if !extra.contains(&flag) {
            args.extend([flag, value]);
        }
    }
    args.extend(extra);
    bin(&args, b"")
}

/// One update of a tiny language model on `text` into `out` (which must succeed).
fn train_tiny_lm(text: &Path, out: &Path) {
    bin(
        &[
            "train-lm",
            "--text",
            s(text),
            "--out",
            s(out),
            "--vocab-size",
            "260",
            "--context",
            "8",
            "--batch",
            "2",
            "--d-model",
            "8",
            "--n-heads",
            "2",
            "--d-ff",
            "16",
            "--layers",
            "1",
            "--max-steps",
            "1",
            "--threads",
            "1",
        ],
        b"",
    )
    .ok();
}

#[test]
fn out_never_overwrites_by_accident() {
    let tmp = tempfile::tempdir().unwrap();
    let (tsv, config, _) = inputs(tmp.path());
    let out = tmp.path().join("run");
    train(&tsv, &config, &out, &["--save-every", "1"]).ok();
    let model = std::fs::read(out.join("model.safetensors")).unwrap();
    train(&tsv, &config, &out, &["--seed", "2"]).refused(&[
        s(&out),
        "already holds a run",
        "--resume",
        "--overwrite",
    ]);
    assert_eq!(std::fs::read(out.join("model.safetensors")).unwrap(), model);
    // Resuming it in place, or from one of its step checkpoints, is allowed.
    train(
        &tsv,
        &config,
        &out,
        &["--resume", s(&out), "--max-steps", "3"],
    )
    .ok();
    let step1 = out.join("checkpoints/step-00000001");
    train(
        &tsv,
        &config,
        &out,
        &["--resume", s(&step1), "--max-steps", "2"],
    )
    .ok();
    // --overwrite replaces the run: its step checkpoints are gone.
    train(&tsv, &config, &out, &["--overwrite", "--seed", "2"]).ok();
    assert!(!out.join("checkpoints").exists());
    assert_ne!(std::fs::read(out.join("model.safetensors")).unwrap(), model);
    // A file is never a run directory.
    train(&tsv, &config, &tsv, &[]).refused(&["is a file, not a directory"]);
    bin(&["translate", "--model", s(&tsv)], b"x\n").refused(&["is a file"]);
    // demo --out too.
    bin(&["demo", "--out", s(&out), "--steps", "1"], b"").refused(&["already holds"]);
}

#[test]
fn average_checks_its_inputs_and_writes_the_vocabulary() {
    let tmp = tempfile::tempdir().unwrap();
    let (tsv, config, text) = inputs(tmp.path());
    let out = tmp.path().join("run");
    train(&tsv, &config, &out, &["--save-every", "1"]).ok();
    let (c1, c2) = (
        out.join("checkpoints/step-00000001"),
        out.join("checkpoints/step-00000002"),
    );
    bin(&["average", "--out", s(&c1), s(&c1), s(&c2)], b"").refused(&["is (or holds)"]);
    bin(&["average", "--out", s(&out), s(&c1), s(&c2)], b"").refused(&["is (or holds)"]);
    let avg = tmp.path().join("avg");
    bin(&["average", "--out", s(&avg), s(&c1), s(&c2)], b"").ok();
    assert!(avg.join("vocab.json").is_file() && avg.join("checkpoint.json").is_file());
    bin(
        &["translate", "--model", s(&avg), "--threads", "1"],
        b"red 1\n",
    )
    .ok();
    bin(&["average", "--out", s(&avg), s(&c1)], b"").refused(&["already holds", "--overwrite"]);
    // Another vocabulary, same config: refused.
    let other_tsv = tmp.path().join("other.tsv");
    let lines: String = (0..30).map(|i| format!("blue {i}\tblau {i}\n")).collect();
    std::fs::write(&other_tsv, lines).unwrap();
    let other = tmp.path().join("other");
    train(&other_tsv, &config, &other, &[]).ok();
    bin(
        &[
            "average",
            "--out",
            s(&tmp.path().join("mixed")),
            s(&c1),
            s(&other),
        ],
        b"",
    )
    .refused(&["vocab.json differs", "cannot be averaged"]);
    // A language model and a translation model: refused.
    let lm = tmp.path().join("lm");
    train_tiny_lm(&text, &lm);
    bin(
        &["average", "--out", s(&tmp.path().join("x")), s(&lm), s(&c1)],
        b"",
    )
    .refused(&["translation"]);
    // The wrong kind of directory says what it is.
    bin(&["translate", "--model", s(&lm)], b"x\n").refused(&["a language model directory"]);
    bin(&["generate", "--model", s(&c1)], b"").refused(&["a translation"]);
}

#[test]
fn sizes_are_bounded_and_pipes_close_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let (tsv, config, text) = inputs(tmp.path());
    let out = tmp.path().join("run");
    train(&tsv, &config, &out, &["--accumulate", "1000000000000"])
        .refused(&["--accumulate 1000000000000 must be in 1..=4096"]);
    train(&tsv, &config, &out, &["--tokens-per-batch", "0"]).refused(&["--tokens-per-batch 0"]);
    assert!(!out.exists());
    train(&tsv, &config, &out, &[]).ok();
    let t = std::time::Instant::now();
    let r = bin(
        &["translate", "--model", s(&out), "--threads", "100000"],
        b"red 1\n",
    )
    .ok();
    assert!(
        r.stderr.contains("warning: --threads 100000"),
        "{}",
        r.stderr
    );
    assert!(t.elapsed().as_secs() < 20);
    bin(
        &[
            "translate",
            "--model",
            s(&out),
            "--threads",
            "1",
            "--max-extra",
            "18446744073709551615",
        ],
        b"red 1\n",
    )
    .ok();
    let r = bin(
        &["translate", "--model", s(&out), "--beam", "10000"],
        b"red 1\n",
    );
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(r.stderr.contains("256"), "{}", r.stderr);
    // A closed stdout ends quietly: generate | head -c 1.
    let lm = tmp.path().join("lm");
    train_tiny_lm(&text, &lm);
    let mut child = Command::new(env!("CARGO_BIN_EXE_transformer"))
        .args([
            "generate",
            "--model",
            s(&lm),
            "--max-tokens",
            "100000000000",
            "--threads",
            "1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 1];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut first).unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = r.stdout;
}

#[test]
fn resumed_settings_and_edited_files_are_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let (tsv, config, _) = inputs(tmp.path());
    let out = tmp.path().join("run");
    train(&tsv, &config, &out, &[]).ok();
    // A hand-edited recipe (the manifest removed, as an editor would leave it) is checked.
    let edited = tmp.path().join("edited");
    std::fs::create_dir(&edited).unwrap();
    for f in std::fs::read_dir(&out).unwrap().flatten() {
        if f.path().is_file() && f.file_name() != "checkpoint.json" {
            std::fs::copy(f.path(), edited.join(f.file_name())).unwrap();
        }
    }
    let state = edited.join("trainer_state.json");
    let text = std::fs::read_to_string(&state).unwrap();
    std::fs::write(
        &state,
        text.replace("\"lr_factor\": 1.0", "\"lr_factor\": -1.0"),
    )
    .unwrap();
    train(
        &tsv,
        &config,
        &edited,
        &["--resume", s(&edited), "--max-steps", "3"],
    )
    .refused(&["trainer_state.json", "config.lr_factor -1"]);
    std::fs::write(&state, &text).unwrap();
    // A config.json with a byte order mark loads.
    let cfg = edited.join("config.json");
    let c = std::fs::read(&cfg).unwrap();
    std::fs::write(&cfg, [b"\xEF\xBB\xBF".as_slice(), &c].concat()).unwrap();
    bin(
        &["translate", "--model", s(&edited), "--threads", "1"],
        b"red 1\n",
    )
    .ok();
    // --config with one too.
    let bom = tmp.path().join("bom.json");
    let c = std::fs::read(&config).unwrap();
    std::fs::write(&bom, [b"\xEF\xBB\xBF".as_slice(), &c].concat()).unwrap();
    train(&tsv, &bom, &tmp.path().join("bom-run"), &[]).ok();
}

/// A weights file with a tensor missing and another one too many names both.
#[test]
fn missing_and_unexpected_tensors_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let mut t = trainer();
    save(tmp.path(), &mut t.model).unwrap();
    std::fs::remove_file(tmp.path().join("checkpoint.json")).unwrap();
    let path = tmp.path().join("model.safetensors");
    let mut map = transformer::store::read_tensors(&path).unwrap();
    let mut names: Vec<String> = map.keys().cloned().collect();
    names.sort();
    let (shape, values) = map.remove(&names[3]).unwrap();
    map.insert(
        "decoder.layers.9.extra.weight".into(),
        (vec![2], vec![0.0, 1.0]),
    );
    let _ = (shape, values);
    let tensors: Vec<(String, Vec<usize>, &[f32])> = map
        .iter()
        .map(|(n, (s, v))| (n.clone(), s.clone(), &v[..]))
        .collect();
    let bytes = transformer::store::tensors_to_bytes(&tensors, &path).unwrap();
    std::fs::write(&path, bytes).unwrap();
    let err = load::<Seq2Seq<f32>>(tmp.path()).unwrap_err().to_string();
    assert!(
        err.contains(&format!("missing tensors: {}", names[3]))
            && err.contains("unexpected tensors: decoder.layers.9.extra.weight"),
        "{err}"
    );
}

/// A Hugging Face config.json where one of our translation models is wanted is named as such.
#[test]
fn a_hugging_face_directory_given_to_translate_is_named() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8}"#,
    )
    .unwrap();
    let Err(err) = load::<Seq2Seq<f32>>(dir.path()) else {
        panic!("accepted")
    };
    let msg = err.to_string();
    assert!(msg.contains("config.json"), "{msg}");
    assert!(
        msg.contains("Hugging Face model (model_type \"llama\")"),
        "{msg}"
    );
}

/// One of our config.json files where a BERT encoder is wanted (`embed`) is named as such.
#[test]
fn our_model_given_to_embed_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = ModelConfig::preset("tiny", 50).unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::to_vec(&config).unwrap(),
    )
    .unwrap();
    let Err(err) = transformer::model::bert::Bert::load(dir.path()) else {
        panic!("accepted")
    };
    let msg = err.to_string();
    assert!(
        msg.contains("config.json") && msg.contains("a model of this project"),
        "{msg}"
    );
}

/// `TRANSFORMER_KERNEL` and `bench --kernel` name a kernel; an unknown name is refused before
/// any work, a known one the CPU has runs the command.
#[test]
fn kernel_names_are_checked() {
    let run = |kernel: &str, args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_transformer"))
            .env("TRANSFORMER_KERNEL", kernel)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        Out {
            code: out.status.code(),
            stderr: String::from_utf8_lossy(&out.stderr).into(),
            stdout: String::from_utf8_lossy(&out.stdout).into(),
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("t.jinja");
    std::fs::write(&template, "{{ messages[0].content }}").unwrap();
    let args = ["template", "--template", s(&template)];
    run("neon", &args).refused(&["TRANSFORMER_KERNEL", "neon", "portable, avx2 or avx512"]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_transformer"))
        .env("TRANSFORMER_KERNEL", "portable")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let _ = child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"messages": [{"role": "user", "content": "hi"}]}"#);
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi");
    bin(&["bench", "--kernel", "sve", "--lm"], b"").refused(&["sve", "avx2"]);
    // TRANSFORMER_AVX_VNNI takes 0 or 1 (the AVX2 int8 kernel's AVX-VNNI form off or on),
    // TRANSFORMER_GGUF_MEMORY hugepages or map (how a GGUF file's bytes are held).
    for (var, value, want) in [
        (
            "TRANSFORMER_AVX_VNNI",
            "yes",
            "TRANSFORMER_AVX_VNNI=yes: expected 0 or 1",
        ),
        (
            "TRANSFORMER_GGUF_MEMORY",
            "mmap",
            "TRANSFORMER_GGUF_MEMORY=mmap: expected hugepages or map",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_transformer"))
            .env(var, value)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(want), "{stderr}");
    }
}
