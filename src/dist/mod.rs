//! Communication between the processes of one training run: a small [`Communicator`] (rank,
//! size, all-reduce sum, broadcast from rank 0, barrier) with three implementations:
//!
//! - [`SingleProcess`]: one rank, every operation the identity (the default build, no MPI);
//! - `Mpi` (`src/dist/mpi.rs`, with `--features mpi`): `MPI_COMM_WORLD` through rsmpi, for runs
//!   launched by `mpirun -np N transformer train ...`;
//! - [`local::LocalGroup`]: ranks as threads of one process, so that the distributed trainer is
//!   tested in `cargo test` without an MPI library.
//!
//! The collectives are blocking and every rank must make the same calls in the same order with
//! buffers of the same length (MPI's rule). Sums are element-wise over the ranks: after
//! `all_reduce_sum(x)` every rank holds `x₀ + x₁ + … + x_{N−1}`.
//!
//! [`world`] picks the implementation: a process started by `mpirun`/`mpiexec` (seen from the
//! launcher's environment) joins MPI's world when the build has MPI, and is refused otherwise
//! (N copies of one single-process run would overwrite each other's output); any other process
//! is a [`SingleProcess`].

// Used outside the library only (feature `internals`): the tests' ranks as threads.
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub mod local;
#[cfg(feature = "mpi")]
pub mod mpi;

use crate::error::Result;
use std::sync::Arc;

/// The collectives data-parallel training needs. Errors inside MPI abort the whole run (MPI's
/// default error handler), so the operations return nothing.
pub trait Communicator: Send + Sync {
    /// This process's index, `0..size()`; rank 0 logs, validates and saves.
    fn rank(&self) -> usize;
    /// The number of processes.
    fn size(&self) -> usize;
    /// `buf ← Σ_ranks buf`, element-wise, on every rank.
    fn all_reduce_sum(&self, buf: &mut [f32]);
    /// `buf ← Σ_ranks buf` in f64 (loss sums and counts).
    fn all_reduce_sum_f64(&self, buf: &mut [f64]);
    /// `buf ← rank 0's buf` on every rank.
    fn broadcast(&self, buf: &mut [f32]);
    /// `buf ← rank 0's buf` on every rank, bytes (the trainer state, lengths).
    fn broadcast_bytes(&self, buf: &mut [u8]);
    /// Returns once every rank has called it.
    fn barrier(&self);
    /// Ends every process of the run with `code` (after an error on one rank, which the others
    /// would otherwise wait for forever).
    fn abort(&self, code: i32) -> !;
}

/// One process: rank 0 of 1, every collective leaves its buffer as it is.
#[derive(Clone, Copy, Debug, Default)]
pub struct SingleProcess;

impl Communicator for SingleProcess {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_reduce_sum(&self, _: &mut [f32]) {}
    fn all_reduce_sum_f64(&self, _: &mut [f64]) {}
    fn broadcast(&self, _: &mut [f32]) {}
    fn broadcast_bytes(&self, _: &mut [u8]) {}
    fn barrier(&self) {}
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
}

/// Whether every rank passes `ok` (one all-reduce): lets all ranks fail together when one
/// finds a problem, instead of the others waiting for it in the next collective.
pub fn all_ok(comm: &dyn Communicator, ok: bool) -> bool {
    let mut failed = [if ok { 0.0 } else { 1.0 }];
    comm.all_reduce_sum_f64(&mut failed);
    failed[0] == 0.0
}

/// Rank 0's bytes on every rank, whatever their length elsewhere (the length goes first).
pub fn broadcast_vec(comm: &dyn Communicator, bytes: &mut Vec<u8>) {
    let mut len = (bytes.len() as u64).to_le_bytes();
    comm.broadcast_bytes(&mut len);
    bytes.resize(u64::from_le_bytes(len) as usize, 0);
    comm.broadcast_bytes(bytes);
}

/// The number of processes the launcher (Open MPI's `mpirun`, MPICH/Intel's `mpiexec`, PMIx)
/// says this run has, when this process was started by one.
pub fn launched_size() -> Option<usize> {
    [
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_SIZE",
        "MPI_LOCALNRANKS",
    ]
    .iter()
    .find_map(|var| std::env::var(var).ok()?.trim().parse().ok())
}

/// The run's communicator: MPI's world when launched by `mpirun` (in a build with MPI), else
/// a single process; see the module's description.
pub fn world() -> Result<Arc<dyn Communicator>> {
    match launched_size() {
        None => Ok(Arc::new(SingleProcess)),
        #[cfg(feature = "mpi")]
        Some(_) => Ok(Arc::new(mpi::Mpi::initialize()?)),
        #[cfg(not(feature = "mpi"))]
        Some(1) => Ok(Arc::new(SingleProcess)),
        #[cfg(not(feature = "mpi"))]
        Some(n) => Err(crate::error::Error::Distributed(format!(
            "started by mpirun as one of {n} processes, but this build has no MPI support: \
             rebuild with `cargo build --release --features mpi` (needs an MPI library and \
             libclang), or run one process without mpirun"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_process_is_rank_0_of_1_and_leaves_buffers_alone() {
        let comm = SingleProcess;
        assert_eq!((comm.rank(), comm.size()), (0, 1));
        let mut x = [1.5f32, -2.0, 3.25];
        comm.all_reduce_sum(&mut x);
        assert_eq!(x, [1.5, -2.0, 3.25]);
        comm.broadcast(&mut x);
        assert_eq!(x, [1.5, -2.0, 3.25]);
        let mut y = [0.1f64, 7.0];
        comm.all_reduce_sum_f64(&mut y);
        assert_eq!(y, [0.1, 7.0]);
        let mut bytes = b"state".to_vec();
        broadcast_vec(&comm, &mut bytes);
        assert_eq!(bytes, b"state");
        comm.barrier();
        assert!(all_ok(&comm, true));
        assert!(!all_ok(&comm, false));
    }
}
