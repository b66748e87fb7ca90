//! The run loop that `train`, `train-lm` and `demo` share (`train::run`), with both data
//! sources: the metrics log and its fields, validation (reused for the final report when it was
//! made at the last update), rotating step checkpoints, periodic saves, exact resume from a step
//! checkpoint, and the time-limit rule (checked after each update).
use crate::common;

use std::path::Path;
use transformer::model::Module;
use transformer::model::{ModelConfig, NormPlacement};
use transformer::model::{Param, Seq2Seq};
use transformer::store::CheckpointWriter;
use transformer::train::pairs::{evaluate, Example, TrainConfig};
use transformer::train::run::{run, Output, Reporter, RunOptions, Silent};
use transformer::train::schedule::Schedule;
use transformer::train::trainer::{LmTrainer, PairTrainer, StepReport};
use transformer::train::validate::{PairValidation, TextValidation, ValidReport, Validator};
use transformer::train::windows::LmTrainConfig;

/// What a run told its reporter.
#[derive(Default)]
struct Recorder {
    losses: Vec<(u64, f64)>,
    validated: Vec<u64>,
    time_limit: Option<u64>,
    finished: bool,
}

impl Reporter for Recorder {
    fn step(&mut self, r: &StepReport, _: f64, _: f64) {
        self.losses.push((r.step, r.loss));
    }
    fn validated(&mut self, r: &StepReport, _: &ValidReport, _: f64) {
        self.validated.push(r.step);
    }
    fn time_limit(&mut self, step: u64) {
        self.time_limit = Some(step);
    }
    fn finish(&mut self) {
        self.finished = true;
    }
}

fn lm_model() -> ModelConfig {
    let mut m = ModelConfig::preset("tiny", 30).unwrap();
    (m.d_model, m.n_heads, m.d_ff) = (16, 2, 32);
    (m.n_encoder_layers, m.n_decoder_layers, m.max_len) = (0, 1, 12);
    m.norm = NormPlacement::PreLn;
    m
}

fn lm_recipe() -> LmTrainConfig {
    LmTrainConfig {
        context: 12,
        batch: 3,
        lr: 3e-3,
        warmup: 2,
        total_steps: 10,
        seed: 4,
        ..LmTrainConfig::default()
    }
}

fn stream(n: u32, salt: u32) -> Vec<u32> {
    (0..n).map(|i| 4 + (i * 7 + i / 5 + salt) % 26).collect()
}

fn lm_trainer() -> LmTrainer {
    LmTrainer::new(lm_model(), lm_recipe(), stream(400, 0)).unwrap()
}

fn examples() -> Vec<Example> {
    common::toy_examples(40)
}

fn pair_trainer() -> PairTrainer {
    let mut m = ModelConfig::preset("tiny", 24).unwrap();
    (m.d_model, m.n_heads, m.d_ff) = (16, 2, 32);
    let t = TrainConfig {
        tokens_per_batch: 200,
        warmup: 4,
        seed: 3,
        ..TrainConfig::default()
    };
    PairTrainer::new(m, t, examples()).unwrap()
}

/// Stages a stand-in tokenizer file in a checkpoint save.
fn save_tokenizer(writer: &mut CheckpointWriter) -> transformer::error::Result<()> {
    writer.add("tokenizer.json", b"{}")
}

fn output(dir: &Path, log_every: Option<u64>, save_every: u64, into_dir: u64) -> Output<'static> {
    Output {
        dir: dir.to_path_buf(),
        save_tokenizer: &save_tokenizer,
        log_every,
        save_every,
        keep_last: 2,
        save_into_dir_every: into_dir,
        autosave: None,
    }
}

fn records(dir: &Path) -> Vec<serde_json::Map<String, serde_json::Value>> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| match serde_json::from_str(l).unwrap() {
            serde_json::Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        })
        .collect()
}

fn weights(params: Vec<(String, &mut Param<f32>)>) -> Vec<f32> {
    params
        .iter()
        .flat_map(|(_, p)| p.value.data.clone())
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
}

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn language_model_run_logs_validates_rotates_checkpoints_and_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("lm");
    let held_out = stream(40, 3);
    let validation = TextValidation {
        tokens: held_out.clone(),
        chars: 100,
        batch: 2,
    };
    let options = RunOptions {
        max_steps: 10,
        time_limit: None,
        valid_every: 5,
    };
    let mut trainer = lm_trainer();
    let mut heard = Recorder::default();
    let summary = run(
        &mut trainer,
        &options,
        Some(&output(&out, Some(4), 3, 4)),
        Some(&validation as &dyn Validator<_>),
        &mut heard,
    )
    .unwrap();
    assert_eq!((summary.start_step, summary.step), (0, 10));
    assert!(!summary.timed_out && heard.finished && heard.time_limit.is_none());
    assert_eq!(summary.tokens, 10 * 3 * 12);
    assert_eq!(heard.validated, [5, 10]);
    let steps: Vec<u64> = heard.losses.iter().map(|&(s, _)| s).collect();
    assert_eq!(steps, (1..=10).collect::<Vec<_>>());

    // One line every 4 updates, on each validation and at the last update.
    let log = records(&out);
    let logged: Vec<u64> = log.iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(logged, [4, 5, 8, 10]);
    let schedule = Schedule::cosine(3e-3, 2, 10, 0.1);
    let mut first = 1;
    for r in &log {
        let step = r["step"].as_u64().unwrap();
        // The loss is the mean over the updates since the previous line.
        let window: Vec<f64> = heard.losses[first as usize - 1..step as usize]
            .iter()
            .map(|&(_, l)| l)
            .collect();
        let mean = window.iter().sum::<f64>() / window.len() as f64;
        assert!(close(r["loss"].as_f64().unwrap(), mean), "step {step}");
        // No label smoothing: the NLL is the loss.
        assert!(close(r["nll"].as_f64().unwrap(), mean), "step {step}");
        assert!(close(r["lr"].as_f64().unwrap(), schedule.lr(step)));
        assert!(r["tokens_per_s"].as_f64().unwrap() > 0.0);
        assert!(r["elapsed_s"].as_f64().unwrap() >= 0.0);
        assert!(r.get("epoch").is_none(), "windows have no epochs");
        let validated = step % 5 == 0;
        for key in ["valid_loss", "valid_nll", "valid_bits_per_char"] {
            assert_eq!(r.contains_key(key), validated, "{key} at step {step}");
        }
        if validated {
            // bits per character = NLL per token · tokens scored / characters / ln 2.
            let nll = r["valid_nll"].as_f64().unwrap();
            let bpc = nll * (held_out.len() - 1) as f64 / 100.0 / std::f64::consts::LN_2;
            assert!(close(r["valid_bits_per_char"].as_f64().unwrap(), bpc));
            assert_eq!(r["valid_loss"], r["valid_nll"]);
        }
        first = step + 1;
    }
    // The final report is the last update's validation, not a second one.
    let valid = summary.valid.unwrap();
    assert_eq!(Some(valid.nll), log[3]["valid_nll"].as_f64());
    assert_eq!(valid, validation.validate(&trainer.model, false).unwrap());
    assert_eq!(summary.curves.unwrap().unwrap(), out.join("curves.png"));

    // Step checkpoints at 3, 6 and 9, the last two kept, each complete.
    assert_eq!(
        files(&out.join("checkpoints")),
        ["step-00000006", "step-00000009"]
    );
    let ckpt = out.join("checkpoints/step-00000006");
    assert_eq!(
        files(&ckpt),
        [
            "checkpoint.json",
            "config.json",
            "model.safetensors",
            "optimizer.safetensors",
            "tokenizer.json",
            "trainer_state.json"
        ]
    );
    assert!(out.join("curves.png").is_file() && out.join("tokenizer.json").is_file());
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("trainer_state.json")).unwrap()).unwrap();
    assert_eq!(state["step"], 10);

    // Resuming from step 6 reaches the straight run's weights bit for bit.
    let mut resumed = LmTrainer::resume(&ckpt, stream(400, 0)).unwrap();
    let again = tmp.path().join("again");
    let mut heard_again = Recorder::default();
    run(
        &mut resumed,
        &options,
        Some(&output(&again, Some(1), 0, 0)),
        None,
        &mut heard_again,
    )
    .unwrap();
    assert_eq!(heard_again.losses, heard.losses[6..].to_vec());
    assert_eq!(
        weights(resumed.model.params_mut()),
        weights(trainer.model.params_mut())
    );
    let logged: Vec<u64> = records(&again)
        .iter()
        .map(|r| r["step"].as_u64().unwrap())
        .collect();
    assert_eq!(logged, [7, 8, 9, 10]);
}

#[test]
fn pair_run_logs_epochs_and_validates_at_the_end() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("pairs");
    let valid: Vec<Example> = examples().into_iter().rev().take(8).collect();
    let validation = PairValidation {
        examples: valid.clone(),
        tokens_per_batch: 100,
        label_smoothing: 0.1,
        bleu: None,
    };
    let mut trainer = pair_trainer();
    let per_epoch = trainer.source().batches_per_epoch() as u64;
    assert!(
        per_epoch < 6,
        "{per_epoch} batches: the run should see a new epoch"
    );
    let mut heard = Recorder::default();
    let summary = run(
        &mut trainer,
        &RunOptions {
            max_steps: 6,
            time_limit: None,
            valid_every: 4,
        },
        Some(&output(&out, Some(0), 0, 0)),
        Some(&validation as &dyn Validator<Seq2Seq<f32>>),
        &mut heard,
    )
    .unwrap();
    assert_eq!(heard.validated, [4]);
    // Log every 0: lines on validation and at the last update only.
    let log = records(&out);
    let logged: Vec<u64> = log.iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(logged, [4, 6]);
    assert_eq!(log[0]["epoch"].as_u64(), Some(4 / per_epoch));
    assert_eq!(log[1]["epoch"].as_u64(), Some(6 / per_epoch));
    assert!(log[0].contains_key("valid_loss") && !log[1].contains_key("valid_loss"));
    assert!(!log[0].contains_key("valid_bleu"));
    let mean = heard.losses[..4].iter().map(|&(_, l)| l).sum::<f64>() / 4.0;
    assert!(close(log[0]["loss"].as_f64().unwrap(), mean));
    let lr = Schedule::inverse_sqrt(16, 4, 1.0).lr(6);
    assert!(close(log[1]["lr"].as_f64().unwrap(), lr));
    // The last update was not validated in the loop: the final report is made after it.
    let want = evaluate(&trainer.model, &valid, 100, 0.1);
    let got = summary.valid.unwrap();
    assert_eq!((got.loss, got.nll), (want.loss(), want.nll()));
    assert!(got.loss > got.nll, "label-smoothed loss above the NLL");
    assert!(got.bleu.is_none() && got.bits_per_char.is_none());
    assert!(!out.join("checkpoints").exists());
    assert_eq!(
        files(&out),
        [
            "checkpoint.json",
            "config.json",
            "curves.png",
            "metrics.jsonl",
            "model.safetensors",
            "optimizer.safetensors",
            "tokenizer.json",
            "trainer_state.json"
        ]
    );
}

#[test]
fn the_time_limit_stops_after_the_update_that_crosses_it() {
    let tmp = tempfile::tempdir().unwrap();
    let options = RunOptions {
        max_steps: 50,
        time_limit: Some(1e-9),
        valid_every: 0,
    };
    // Both shapes: exactly one update, logged as the last, then the final save.
    let mut lm = lm_trainer();
    let mut heard = Recorder::default();
    let out = tmp.path().join("lm");
    let summary = run(
        &mut lm,
        &options,
        Some(&output(&out, Some(100), 0, 1)),
        None,
        &mut heard,
    )
    .unwrap();
    assert!(summary.timed_out && summary.valid.is_none());
    assert_eq!((summary.step, heard.time_limit), (1, Some(1)));
    assert_eq!(heard.losses.len(), 1);
    let log = records(&out);
    assert_eq!(log.len(), 1);
    assert_eq!(log[0]["step"], 1);

    let mut pairs = pair_trainer();
    let mut heard = Recorder::default();
    let summary = run(&mut pairs, &options, None, None, &mut heard).unwrap();
    assert!(summary.timed_out && heard.finished);
    assert_eq!((summary.step, heard.time_limit), (1, Some(1)));
    assert!(summary.curves.is_none());

    // A run already at --max-steps makes no update and does not time out.
    let summary = run(
        &mut pairs,
        &RunOptions {
            max_steps: 1,
            ..options
        },
        None,
        None,
        &mut Silent,
    )
    .unwrap();
    assert!(!summary.timed_out);
    assert_eq!(
        (summary.start_step, summary.step, summary.tokens),
        (1, 1, 0)
    );
}
