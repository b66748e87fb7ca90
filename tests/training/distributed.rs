//! Data parallelism across ranks (`train::distributed`), checked without MPI: the ranks are
//! threads of this process joined by `dist::local::LocalGroup`, each with its own trainer, as
//! `mpirun` would run them as processes. Two ranks of one part each train exactly as one
//! process whose batches are split in the same two parts (in-process data parallelism, same
//! dropout generators), with dropout on; without dropout, three ranks of two parts each train
//! as one whole-batch process up to rounding; a run resumes with another number of ranks; the
//! start broadcasts rank 0's weights, and ranks with different data fail together. (The same
//! checks under a real `mpirun -np 2`: `tests/mpi/run.sh`.)

use std::sync::Arc;
use transformer::dist::local::LocalGroup;
use transformer::dist::Communicator;
use transformer::model::ModelConfig;
use transformer::train::pairs::{Example, TrainConfig};
use transformer::train::trainer::{LmTrainer, PairTrainer};
use transformer::train::windows::LmTrainConfig;

fn examples() -> Vec<Example> {
    (0..48u32)
        .map(|i| Example {
            src: (0..(3 + i % 6)).map(|j| 4 + (i * 7 + j) % 25).collect(),
            tgt: (0..(2 + i % 5)).map(|j| 4 + (i * 3 + j * 5) % 25).collect(),
        })
        .collect()
}

fn model_config(dropout: f64) -> ModelConfig {
    let mut m = ModelConfig::preset("tiny", 30).unwrap();
    (m.d_model, m.n_heads, m.d_ff) = (32, 4, 64);
    (m.dropout, m.attention_dropout, m.activation_dropout) = (dropout, dropout, dropout);
    m
}

fn pair_trainer(dropout: f64, seed: u64) -> PairTrainer {
    let t = TrainConfig {
        tokens_per_batch: 160,
        warmup: 10,
        accumulate: 2,
        word_dropout: dropout,
        clip_norm: Some(1.0),
        seed,
        ..TrainConfig::default()
    };
    PairTrainer::new(model_config(dropout), t, examples()).unwrap()
}

fn lm_tokens() -> Vec<u32> {
    (0..600u32).map(|i| 4 + (i * 7 + i / 5) % 26).collect()
}

fn lm_trainer(dropout: f64) -> LmTrainer {
    let mut m = model_config(dropout);
    m.max_len = 16;
    let config = LmTrainConfig {
        context: 12,
        batch: 5, // odd: parts of 3 and 2 windows (2 parts), 1 window each (4 or more)
        lr: 3e-3,
        warmup: 2,
        total_steps: 10,
        seed: 4,
        ..LmTrainConfig::default()
    };
    LmTrainer::new(m, config, lm_tokens()).unwrap()
}

/// The losses of `steps` updates and the weights after them.
type Outcome = (Vec<f64>, Vec<f32>);

fn weights(params: Vec<(String, &mut transformer::model::Param<f32>)>) -> Vec<f32> {
    params
        .iter()
        .flat_map(|(_, p)| p.value.data.clone())
        .collect()
}

/// `ranks` threads, each building a trainer with `make`, joining the group, training with
/// in-process data parallelism `parallel` for `steps` updates; every rank's outcome.
fn on_ranks<M, S>(
    ranks: usize,
    parallel: bool,
    steps: usize,
    make: impl Fn(usize) -> transformer::train::trainer::Trainer<M, S> + Sync,
) -> Vec<Outcome>
where
    M: transformer::train::model::Trainable,
    S: transformer::train::source::BatchSource<Part = M::Part>,
{
    std::thread::scope(|s| {
        let handles: Vec<_> = LocalGroup::new(ranks)
            .into_iter()
            .map(|comm| {
                let make = &make;
                s.spawn(move || {
                    let mut trainer = make(comm.rank());
                    trainer.set_data_parallel(parallel);
                    trainer.set_communicator(Arc::new(comm)).unwrap();
                    let losses = (0..steps).map(|_| trainer.step().unwrap().loss).collect();
                    (losses, weights(trainer.model.params_mut()))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn single<M, S>(
    parallel: bool,
    steps: usize,
    mut trainer: transformer::train::trainer::Trainer<M, S>,
) -> Outcome
where
    M: transformer::train::model::Trainable,
    S: transformer::train::source::BatchSource<Part = M::Part>,
{
    trainer.set_data_parallel(parallel);
    let losses = (0..steps).map(|_| trainer.step().unwrap().loss).collect();
    (losses, weights(trainer.model.params_mut()))
}

fn largest_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// Every rank ends with the same weights, and `reference`'s losses to `tolerance` (relative).
fn check_ranks_match(ranks: &[Outcome], reference: &Outcome, tolerance: f64) {
    for (r, (losses, w)) in ranks.iter().enumerate() {
        assert_eq!(w, &ranks[0].1, "rank {r}'s weights differ from rank 0's");
        assert_eq!(
            losses, &ranks[0].0,
            "rank {r}'s losses differ from rank 0's"
        );
    }
    for (i, (a, b)) in ranks[0].0.iter().zip(&reference.0).enumerate() {
        assert!(
            (a - b).abs() <= tolerance * b.abs(),
            "step {}: {a} on the ranks vs {b} in one process",
            i + 1
        );
    }
    // The runs trained.
    assert!(
        reference.0.last() < reference.0.first(),
        "{:?}",
        reference.0
    );
}

#[test]
fn two_ranks_train_as_one_process_split_in_the_same_two_parts_with_dropout() {
    let ranks = on_ranks(2, false, 6, |_| pair_trainer(0.1, 9));
    let reference = single(true, 6, pair_trainer(0.1, 9));
    check_ranks_match(&ranks, &reference, 1e-6);
    let worst = largest_difference(&ranks[0].1, &reference.1);
    assert!(worst < 1e-5, "weights differ by {worst}");
    // Dropout was on: a run in one part draws other masks.
    let whole = single(false, 6, pair_trainer(0.1, 9));
    assert_ne!(whole.0, reference.0);
}

#[test]
fn language_model_two_ranks_train_as_one_process_in_two_parts_with_dropout() {
    let ranks = on_ranks(2, false, 6, |_| lm_trainer(0.1));
    let reference = single(true, 6, lm_trainer(0.1));
    check_ranks_match(&ranks, &reference, 1e-6);
    let worst = largest_difference(&ranks[0].1, &reference.1);
    assert!(worst < 1e-5, "weights differ by {worst}");
}

#[test]
fn without_dropout_the_number_of_ranks_changes_only_rounding() {
    // 3 ranks x 2 parts: 6 parts per batch (some ranks get fewer) vs the whole batch.
    let ranks = on_ranks(3, true, 6, |_| pair_trainer(0.0, 9));
    let reference = single(false, 6, pair_trainer(0.0, 9));
    check_ranks_match(&ranks, &reference, 1e-4);
    let ranks = on_ranks(3, true, 6, |_| lm_trainer(0.0));
    let reference = single(false, 6, lm_trainer(0.0));
    check_ranks_match(&ranks, &reference, 1e-4);
}

#[test]
fn rank_0_s_weights_and_state_reach_every_rank() {
    // Rank 1 starts from another seed: after joining it holds rank 0's model and recipe.
    let ranks = on_ranks(2, false, 2, |rank| pair_trainer(0.0, 9 + rank as u64));
    let reference = single(true, 2, pair_trainer(0.0, 9));
    check_ranks_match(&ranks, &reference, 1e-6);
}

#[test]
fn ranks_with_different_data_fail_together() {
    let errors: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = LocalGroup::new(2)
            .into_iter()
            .map(|comm| {
                s.spawn(move || {
                    let mut data = examples();
                    if comm.rank() == 1 {
                        data.pop();
                    }
                    let t = TrainConfig {
                        tokens_per_batch: 160,
                        ..TrainConfig::default()
                    };
                    let mut trainer = PairTrainer::new(model_config(0.0), t, data).unwrap();
                    trainer
                        .set_communicator(Arc::new(comm))
                        .unwrap_err()
                        .to_string()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in errors {
        assert!(e.contains("training data differ"), "{e}");
    }
}

#[test]
fn a_run_resumes_with_another_number_of_ranks() {
    // 3 updates on 2 ranks (rank 0 saves), then 3 more in one process of two parts (and
    // the other way round): the curve of an uninterrupted 6-update run.
    let reference = single(true, 6, pair_trainer(0.1, 9));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    std::thread::scope(|s| {
        for comm in LocalGroup::new(2) {
            let path = &path;
            s.spawn(move || {
                let mut trainer = pair_trainer(0.1, 9);
                trainer.set_data_parallel(false);
                let rank = comm.rank();
                let comm: Arc<dyn Communicator> = Arc::new(comm);
                trainer.set_communicator(comm.clone()).unwrap();
                for _ in 0..3 {
                    trainer.step().unwrap();
                }
                if rank == 0 {
                    trainer.save(path).unwrap();
                }
                comm.barrier();
            });
        }
    });
    let mut resumed = PairTrainer::resume(&path, examples()).unwrap();
    resumed.set_data_parallel(true);
    let losses: Vec<f64> = (0..3).map(|_| resumed.step().unwrap().loss).collect();
    for (i, (a, b)) in losses.iter().zip(&reference.0[3..]).enumerate() {
        assert!(
            (a - b).abs() <= 1e-6 * b.abs(),
            "step {}: {a} vs {b}",
            i + 4
        );
    }
    // One process (two parts) for 3 updates, then 2 ranks.
    let mut first = pair_trainer(0.1, 9);
    first.set_data_parallel(true);
    for _ in 0..3 {
        first.step().unwrap();
    }
    first.save(&path).unwrap();
    let ranks = on_ranks(2, false, 3, |_| {
        PairTrainer::resume(&path, examples()).unwrap()
    });
    for (i, (a, b)) in ranks[0].0.iter().zip(&reference.0[3..]).enumerate() {
        assert!(
            (a - b).abs() <= 1e-6 * b.abs(),
            "step {}: {a} vs {b}",
            i + 4
        );
    }
    assert_eq!(ranks[0], ranks[1]);
}

/// A build without MPI started by `mpirun` as one of several processes refuses to train (N
/// single-process copies would overwrite each other's run) and says how to build with MPI.
#[cfg(not(feature = "mpi"))]
#[test]
fn a_build_without_mpi_refuses_to_run_as_one_of_several_processes() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, "a small text to train on\n".repeat(50)).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_transformer"))
        .args(["train-lm", "--text"])
        .arg(&text)
        .arg("--out")
        .arg(dir.path().join("run"))
        .env("OMPI_COMM_WORLD_SIZE", "2")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("one of 2 processes") && stderr.contains("--features mpi"),
        "{stderr}"
    );
    assert!(!dir.path().join("run").exists());
}
