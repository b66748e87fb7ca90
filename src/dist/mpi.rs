//! MPI's world through rsmpi (`--features mpi`): the [`Communicator`] of a run launched by
//! `mpirun -np N transformer train ...`.
//!
//! MPI is initialised at thread level `MPI_THREAD_SERIALIZED`: the trainer calls MPI from the
//! thread that runs the command (a worker of rayon's pool, not the process's first thread),
//! one call at a time, while rayon's other threads compute and never call MPI. The world
//! communicator is named afresh for each call (a constant handle), so [`Mpi`] holds no MPI
//! handle and is `Send + Sync` without `unsafe`. MPI is finalised when the [`Mpi`] is dropped.
//!
//! Buffers go through MPI in buckets of at most [`BUCKET`] elements: MPI counts are C `int`s,
//! and `MPI_Allreduce` needs a separate send buffer, which a bucket bounds to 16 MiB.

use crate::dist::Communicator;
use crate::error::{Error, Result};
use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use mpi::environment::{Threading, Universe};
use mpi::topology::{Communicator as _, SimpleCommunicator};

/// Elements per MPI call (16 MiB of f32).
pub const BUCKET: usize = 1 << 22;

/// `MPI_COMM_WORLD` of an initialised MPI.
pub struct Mpi {
    rank: usize,
    size: usize,
    /// Finalises MPI when dropped.
    _universe: Universe,
}

impl Mpi {
    /// Initialises MPI (once per process).
    pub fn initialize() -> Result<Mpi> {
        let (universe, provided) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| Error::Distributed("MPI was already initialised".into()))?;
        if provided < Threading::Serialized {
            return Err(Error::Distributed(format!(
                "the MPI library provides thread level {provided:?}; training needs Serialized \
                 (MPI is called from a worker thread)"
            )));
        }
        let world = universe.world();
        Ok(Mpi {
            rank: world.rank() as usize,
            size: world.size() as usize,
            _universe: universe,
        })
    }

    fn world(&self) -> SimpleCommunicator {
        SimpleCommunicator::world()
    }
}

impl Communicator for Mpi {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn all_reduce_sum(&self, buf: &mut [f32]) {
        let world = self.world();
        let mut send = Vec::with_capacity(buf.len().min(BUCKET));
        for bucket in buf.chunks_mut(BUCKET) {
            send.clear();
            send.extend_from_slice(bucket);
            world.all_reduce_into(&send[..], bucket, SystemOperation::sum());
        }
    }
    fn all_reduce_sum_f64(&self, buf: &mut [f64]) {
        let world = self.world();
        for bucket in buf.chunks_mut(BUCKET) {
            let send = bucket.to_vec();
            world.all_reduce_into(&send[..], bucket, SystemOperation::sum());
        }
    }
    fn broadcast(&self, buf: &mut [f32]) {
        let world = self.world();
        for bucket in buf.chunks_mut(BUCKET) {
            world.process_at_rank(0).broadcast_into(bucket);
        }
    }
    fn broadcast_bytes(&self, buf: &mut [u8]) {
        let world = self.world();
        for bucket in buf.chunks_mut(BUCKET) {
            world.process_at_rank(0).broadcast_into(bucket);
        }
    }
    fn barrier(&self) {
        self.world().barrier();
    }
    fn abort(&self, code: i32) -> ! {
        self.world().abort(code)
    }
}
