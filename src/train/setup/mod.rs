//! Setting up a training run, written once for the commands that train: read the data, learn
//! the tokenizer or load the checkpoint's, encode the data, build the model and the trainer,
//! fresh from a spec or resumed from a checkpoint directory, on the run's processes.
//!
//! Two kinds of run, one module each: the encoder-decoder on sentence pairs ([`pairs`], the
//! `train` command) and the decoder-only language model on one text ([`lm`], `train-lm`). What
//! they share is here: how a run begins ([`Start`]), the limits of the options both take
//! ([`check_max_steps`], [`check_vocab_size`]), resuming with its announcement
//! ([`resume_trainer`]) and joining the processes with the bf16 kernel ([`join`]).
//!
//! Nothing is printed here: every message for the person running the setup (a warning about
//! input that was skipped or dropped, the line naming a resumed run) goes, one line each, to
//! the caller's [`Notes`], at the point of the setup where it arises.

// Used by the binary's commands (feature `cli`) and outside the library (feature `internals`).
#[cfg_attr(not(any(feature = "cli", feature = "internals")), allow(dead_code))]
pub mod classify;
pub mod lm;
// Used by the binary's commands (feature `cli`) and outside the library (feature `internals`).
#[cfg_attr(not(any(feature = "cli", feature = "internals")), allow(dead_code))]
pub mod mlm;
pub mod pairs;

use crate::dist::Communicator;
use crate::error::{Error, Result};
use crate::kernels::lowp::bf16_train::Bf16Kernel;
use crate::train::model::Trainable;
use crate::train::source::{BatchSource, Recipe, MAX_STEP};
use crate::train::state::TrainerState;
use crate::train::trainer::Trainer;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The largest vocabulary a run learns (`--vocab-size`; also `bench --vocab`).
pub const MAX_VOCAB: usize = 1 << 20;

/// Where the setup's messages go, one line each as it should be shown (`warning: ...`,
/// `resumed ...`): warnings on every process, the resumed run on rank 0 only.
pub type Notes<'a> = &'a mut dyn FnMut(&str);

/// How a run begins: `Fresh` from a spec `F` (tokenizer, model and recipe made from it), or
/// `Resume` from a checkpoint directory (a run's OUT or one of its step checkpoints), which
/// brings its own tokenizer, model and recipe.
#[derive(Clone, Debug)]
pub enum Start<F> {
    /// A new run made from this spec.
    Fresh(F),
    /// A run continued from this checkpoint directory.
    Resume(PathBuf),
}

impl<F> Start<F> {
    /// The checkpoint directory of a resumed run.
    pub fn resume_dir(&self) -> Option<&Path> {
        match self {
            Start::Fresh(_) => None,
            Start::Resume(dir) => Some(dir),
        }
    }

    /// The spec of a fresh run.
    pub fn fresh(&self) -> Option<&F> {
        match self {
            Start::Fresh(spec) => Some(spec),
            Start::Resume(_) => None,
        }
    }
}

/// Refuses a run longer than the trainer can count (`max_steps <= MAX_STEP`).
pub fn check_max_steps(max_steps: u64) -> Result<()> {
    if max_steps > MAX_STEP {
        return Err(Error::Input(format!(
            "--max-steps {max_steps} is beyond the supported {MAX_STEP}"
        )));
    }
    Ok(())
}

/// Refuses a vocabulary to learn of more than [`MAX_VOCAB`] entries.
pub fn check_vocab_size(vocab_size: usize) -> Result<()> {
    if vocab_size > MAX_VOCAB {
        return Err(Error::Input(format!(
            "--vocab-size {vocab_size} is above the supported {MAX_VOCAB}"
        )));
    }
    Ok(())
}

/// The line a resumed run announces: the directory, its step and its precision.
pub fn resumed_line<R: Recipe>(dir: &Path, state: &TrainerState<R>) -> String {
    format!(
        "resumed {} at step {} (precision {})",
        dir.display(),
        state.step,
        state.config.precision()
    )
}

/// Continues the run saved in `dir` on `data` ([`Trainer::resume`]) and, on rank 0 of `comm`,
/// announces it to `notes` ([`resumed_line`]).
pub fn resume_trainer<M, S>(
    dir: &Path,
    data: S::Data,
    comm: &dyn Communicator,
    notes: Notes,
) -> Result<Trainer<M, S>>
where
    M: Trainable,
    S: BatchSource<Part = M::Part>,
{
    let trainer = Trainer::<M, S>::resume(dir, data)?;
    if comm.rank() == 0 {
        notes(&resumed_line(dir, &trainer.state));
    }
    Ok(trainer)
}

/// Puts a fresh or resumed trainer on the run's processes ([`Trainer::set_communicator`]: a
/// collective, rank 0's state wins) and multiplies with `bf16_kernel` where the recipe's
/// precision is bf16 (not saved with the run).
pub fn join<M, S>(
    trainer: &mut Trainer<M, S>,
    comm: Arc<dyn Communicator>,
    bf16_kernel: Bf16Kernel,
) -> Result<()>
where
    M: Trainable,
    S: BatchSource<Part = M::Part>,
{
    trainer.set_communicator(comm)?;
    trainer.set_bf16_kernel(bf16_kernel);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_name_the_option_and_the_bound() {
        assert!(check_max_steps(MAX_STEP).is_ok());
        let e = check_max_steps(MAX_STEP + 1).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "--max-steps {} is beyond the supported {MAX_STEP}",
                MAX_STEP + 1
            )
        );
        assert!(check_vocab_size(MAX_VOCAB).is_ok());
        let e = check_vocab_size(MAX_VOCAB + 1).unwrap_err().to_string();
        assert!(e.contains("above the supported 1048576"), "{e}");
    }

    #[test]
    fn start_tells_fresh_from_resumed() {
        let fresh: Start<u8> = Start::Fresh(3);
        assert_eq!(fresh.fresh(), Some(&3));
        assert_eq!(fresh.resume_dir(), None);
        let resumed: Start<u8> = Start::Resume(PathBuf::from("run"));
        assert_eq!(resumed.fresh(), None);
        assert_eq!(resumed.resume_dir(), Some(Path::new("run")));
    }
}
