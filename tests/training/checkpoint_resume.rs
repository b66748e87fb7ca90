//! Checkpoints: exact resume, and clear errors for missing, truncated, corrupt or mismatched files.
use crate::common;

use transformer::model::checkpoint::load;
use transformer::model::ModelConfig;
use transformer::model::{Module, Seq2Seq};
use transformer::store as checkpoint;
use transformer::train::pairs::{Example, TrainConfig};
use transformer::train::schedule::{Cooldown, Schedule};
use transformer::train::trainer::PairTrainer;

fn examples() -> Vec<Example> {
    common::toy_examples(60)
}

fn configs() -> (ModelConfig, TrainConfig) {
    let mut m = ModelConfig::preset("tiny", 24).unwrap();
    m.d_model = 32;
    m.n_heads = 4;
    m.d_ff = 64;
    let t = TrainConfig {
        tokens_per_batch: 120,
        warmup: 10,
        accumulate: 2,
        clip_norm: Some(1.0),
        seed: 5,
        ..TrainConfig::default()
    };
    (m, t)
}

#[test]
fn resumed_run_continues_the_same_loss_curve_bit_for_bit() {
    let (m, t) = configs();
    check_resume(m, t);
}

#[test]
fn resume_is_exact_with_attention_activation_and_word_dropout_and_a_cooldown() {
    let (mut m, mut t) = configs();
    (m.attention_dropout, m.activation_dropout) = (0.1, 0.2);
    t.word_dropout = 0.15;
    // The cool-down spans the checkpoint at step 5: updates 4..=14 decay to zero at 14.
    t.cooldown = Cooldown::last(10, 14);
    let lrs = check_resume(m, t.clone());
    let plain = Schedule::inverse_sqrt(32, t.warmup, t.lr_factor);
    for (i, lr) in lrs.iter().enumerate() {
        let step = i as u64 + 1;
        let left = if step <= 4 {
            1.0
        } else {
            (14 - step) as f64 / 10.0
        };
        assert!((lr - plain.lr(step) * left).abs() < 1e-15, "step {step}");
    }
}

/// Runs 12 updates straight and 5 + 7 through a checkpoint, asserts equal losses, and returns
/// the learning rates of the straight run.
fn check_resume(m: ModelConfig, t: TrainConfig) -> Vec<f64> {
    let mut straight = PairTrainer::new(m.clone(), t.clone(), examples()).unwrap();
    let reports: Vec<_> = (0..12).map(|_| straight.step().unwrap()).collect();
    let losses: Vec<f64> = reports.iter().map(|r| r.loss).collect();

    let dir = tempfile::tempdir().unwrap();
    let mut first = PairTrainer::new(m, t, examples()).unwrap();
    for want in &losses[..5] {
        assert_eq!(first.step().unwrap().loss.to_bits(), want.to_bits());
    }
    first.save(dir.path()).unwrap();
    drop(first);
    let mut resumed = PairTrainer::resume(dir.path(), examples()).unwrap();
    assert_eq!(resumed.state.step, 5);
    for (i, want) in losses[5..].iter().enumerate() {
        let got = resumed.step().unwrap().loss;
        assert_eq!(got.to_bits(), want.to_bits(), "step {}", i + 6);
    }
    // The losses went down: the run really trained.
    assert!(losses[11] < losses[0], "{losses:?}");
    reports.iter().map(|r| r.lr).collect()
}

#[test]
fn bad_checkpoints_are_clear_errors_naming_the_file() {
    let (m, t) = configs();
    let dir = tempfile::tempdir().unwrap();
    let mut trainer = PairTrainer::new(m, t, examples()).unwrap();
    trainer.step().unwrap();
    trainer.save(dir.path()).unwrap();
    let model_path = dir.path().join(checkpoint::MODEL_FILE);
    let good = std::fs::read(&model_path).unwrap();
    // Loads fine as is, and gives the same weights.
    let mut loaded = load::<Seq2Seq<f32>>(dir.path()).unwrap();
    let a: Vec<f32> = loaded.params_mut()[3].1.value.data.clone();
    assert_eq!(a, trainer.model.params_mut()[3].1.value.data);

    // The manifest refuses any file changed after the save.
    std::fs::write(&model_path, &good[..good.len() / 2]).unwrap();
    let err = load::<Seq2Seq<f32>>(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("model.safetensors")
            && err.contains("does not match the checkpoint's manifest"),
        "{err}"
    );
    // Without one (a directory of another tool, or from before manifests), each file's own
    // checks speak.
    std::fs::remove_file(dir.path().join("checkpoint.json")).unwrap();

    // Truncated weights.
    std::fs::write(&model_path, &good[..good.len() / 2]).unwrap();
    let err = load::<Seq2Seq<f32>>(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("model.safetensors") && err.contains("truncated"),
        "{err}"
    );
    // Garbage.
    std::fs::write(&model_path, b"not a checkpoint").unwrap();
    let err = load::<Seq2Seq<f32>>(dir.path()).unwrap_err().to_string();
    assert!(err.contains("model.safetensors"), "{err}");
    std::fs::write(&model_path, &good).unwrap();

    // A config that does not match the weights.
    let cfg_path = dir.path().join(checkpoint::CONFIG_FILE);
    let cfg = std::fs::read_to_string(&cfg_path).unwrap();
    std::fs::write(&cfg_path, cfg.replace("\"d_ff\": 64", "\"d_ff\": 96")).unwrap();
    let err = load::<Seq2Seq<f32>>(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("model.safetensors") && err.contains("does not match"),
        "{err}"
    );
    // A config edited to absurd sizes is refused before the model is allocated.
    std::fs::write(
        &cfg_path,
        cfg.replace("\"d_model\": 32", "\"d_model\": 1000000000000"),
    )
    .unwrap();
    let err = load::<Seq2Seq<f32>>(dir.path()).unwrap_err().to_string();
    assert!(err.contains("does not match"), "{err}");
    std::fs::write(&cfg_path, cfg.replace("\"n_heads\": 4", "\"n_heads\": 5")).unwrap();
    let err = load::<Seq2Seq<f32>>(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("config.json") && err.contains("n_heads"),
        "{err}"
    );
    std::fs::write(&cfg_path, "{").unwrap();
    let err = load::<Seq2Seq<f32>>(dir.path()).unwrap_err().to_string();
    assert!(err.contains("config.json"), "{err}");
    std::fs::write(&cfg_path, &cfg).unwrap();

    // Missing files.
    std::fs::remove_file(dir.path().join(checkpoint::OPTIMIZER_FILE)).unwrap();
    let err = PairTrainer::resume(dir.path(), examples())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("optimizer.safetensors") && err.contains("not found"),
        "{err}"
    );
    let err = load::<Seq2Seq<f32>>(&dir.path().join("nowhere"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("config.json") && err.contains("not found"),
        "{err}"
    );

    // Resuming on different data is refused.
    trainer.save(dir.path()).unwrap();
    let mut other = examples();
    other[0].tgt.push(5);
    let err = PairTrainer::resume(dir.path(), other)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("training data differ"), "{err}");
    // No temporary files are left behind.
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty());
}
