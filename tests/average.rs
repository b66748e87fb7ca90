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
