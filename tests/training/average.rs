//! Checkpoint averaging: the mean of every parameter, refused across different models.

use transformer::model::ModelConfig;
use transformer::model::{Module, Seq2Seq};
use transformer::store::{list_step_checkpoints, step_checkpoint_name};
use transformer::train::average::average_checkpoints;
use transformer::train::pairs::{Example, TrainConfig};
use transformer::train::trainer::PairTrainer;

fn examples() -> Vec<Example> {
    (0..20u32)
        .map(|i| Example {
            src: vec![4 + i % 7, 5 + i % 3],
            tgt: vec![6 + i % 5],
        })
        .collect()
}

#[test]
fn averages_parameters_and_rejects_mismatched_models() {
    let mut m = ModelConfig::preset("tiny", 12).unwrap();
    m.d_model = 16;
    m.n_heads = 2;
    m.d_ff = 32;
    let t = TrainConfig {
        tokens_per_batch: 40,
        warmup: 5,
        ..TrainConfig::default()
    };
    let root = tempfile::tempdir().unwrap();
    let mut trainer = PairTrainer::new(m.clone(), t.clone(), examples()).unwrap();
    let mut dirs = Vec::new();
    let mut snapshots: Vec<Vec<Vec<f32>>> = Vec::new();
    for step in [1u64, 2, 3] {
        trainer.step().unwrap();
        let dir = root.path().join(step_checkpoint_name(step));
        trainer.save(&dir).unwrap();
        snapshots.push(
            trainer
                .model
                .params_mut()
                .iter()
                .map(|(_, p)| p.value.data.clone())
                .collect(),
        );
        dirs.push(dir);
    }
    assert_eq!(list_step_checkpoints(root.path()), dirs);
    let mut avg: Seq2Seq<f32> = average_checkpoints(&dirs).unwrap();
    for (i, (name, p)) in avg.params_mut().iter().enumerate() {
        for (j, &v) in p.value.data.iter().enumerate() {
            let want = snapshots.iter().map(|s| s[i][j] as f64).sum::<f64>() / 3.0;
            assert!(
                (v as f64 - want).abs() <= 1e-7 * want.abs().max(1.0),
                "{name}[{j}]"
            );
        }
    }
    // A checkpoint of another model is refused, naming its config.
    let mut m2 = m.clone();
    m2.d_ff = 48;
    let mut other = PairTrainer::new(m2, t, examples()).unwrap();
    let odd = root.path().join("odd");
    other.save(&odd).unwrap();
    let err = average_checkpoints::<Seq2Seq<f32>>(&[dirs[0].clone(), odd])
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("config") && err.contains("cannot be averaged"),
        "{err}"
    );
    assert!(average_checkpoints::<Seq2Seq<f32>>(&[]).is_err());
}

/// Language models average the same way (the average is generic over the model), and the CLI
/// writes the language model's tokenizer beside it.
#[test]
fn averages_language_models_through_the_cli() {
    use transformer::model::LanguageModel;
    let root = tempfile::tempdir().unwrap();
    let text = root.path().join("t.txt");
    std::fs::write(
        &text,
        "to be or not to be, that is the question\n".repeat(40),
    )
    .unwrap();
    let out = root.path().join("lm");
    let bin = env!("CARGO_BIN_EXE_transformer");
    let s = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let args = [
        "train-lm",
        "--text",
        &s(&text),
        "--out",
        &s(&out),
        "--vocab-size",
        "270",
        "--context",
        "16",
        "--batch",
        "2",
        "--d-model",
        "16",
        "--n-heads",
        "2",
        "--d-ff",
        "32",
        "--layers",
        "1",
        "--max-steps",
        "4",
        "--save-every",
        "2",
        "--eval-every",
        "0",
        "--threads",
        "1",
    ];
    let r = std::process::Command::new(bin).args(args).output().unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let dirs = list_step_checkpoints(&out.join("checkpoints"));
    assert_eq!(dirs.len(), 2);
    let avg_dir = root.path().join("avg");
    let mut cmd = std::process::Command::new(bin);
    cmd.args(["average", "--out", &s(&avg_dir)]).args(&dirs);
    let r = cmd.output().unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(String::from_utf8_lossy(&r.stderr).contains("language model"));
    let load = |d: &std::path::Path| -> LanguageModel<f32> {
        transformer::model::checkpoint::load(d).unwrap()
    };
    let (mut a, mut b, mut avg) = (load(&dirs[0]), load(&dirs[1]), load(&avg_dir));
    let (pa, pb) = (a.params_mut(), b.params_mut());
    for ((name, p), ((_, x), (_, y))) in avg.params_mut().iter().zip(pa.iter().zip(&pb)) {
        for ((&v, &x), &y) in p.value.data.iter().zip(&x.value.data).zip(&y.value.data) {
            let want = (x as f64 + y as f64) / 2.0;
            assert!(
                (v as f64 - want).abs() <= 1e-7 * want.abs().max(1.0),
                "{name}"
            );
        }
    }
    assert!(avg_dir.join("tokenizer.json").is_file());
    // The averaged directory generates like any language model directory.
    let r = std::process::Command::new(bin)
        .args([
            "generate",
            "--model",
            &s(&avg_dir),
            "--max-tokens",
            "5",
            "--threads",
            "1",
        ])
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
}
