//! Timing the kernels on the device, for benchmarks (`examples/kernels.rs`).
//!
//! Where the adapter has timestamp queries ([`Gpu::has_timestamps`]), [`Timestamps::mark`]
//! records the device's clock between the recorded dispatches: with an encoder-level write
//! where the adapter allows one (`TIMESTAMP_QUERY_INSIDE_ENCODERS`), otherwise as the start of
//! an empty compute pass (`TIMESTAMP_QUERY` alone). Every dispatch is its own compute pass
//! ([`Gpu::record`]), so marks between passes already time single dispatches: timestamps
//! inside a pass would add nothing. Without timestamps, [`Gpu::finish`] lets a caller take the
//! wall time of a submission (submit, run, wait).

use crate::buffer::{Allocation, GpuBuffer};
use crate::device::Gpu;
use crate::error::GpuError;

/// How [`Timestamps::mark`] writes the device's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimestampKind {
    /// Between passes, on the command encoder.
    Encoder,
    /// At the start of an empty compute pass.
    Pass,
}

impl Gpu {
    /// How this device takes timestamps, or `None` when it has no timestamp queries.
    pub fn has_timestamps(&self) -> Option<TimestampKind> {
        let f = self.device.features();
        if !f.contains(wgpu::Features::TIMESTAMP_QUERY) {
            None
        } else if f.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS) {
            Some(TimestampKind::Encoder)
        } else {
            Some(TimestampKind::Pass)
        }
    }

    /// Submits what was recorded and waits until the device has run it.
    pub fn finish(&self) -> Result<(), GpuError> {
        self.flush();
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Device(e.to_string()))?;
        Ok(())
    }

    /// A set of `count` timestamps (`None` when the device has no timestamp queries).
    pub fn timestamps(&self, count: u32) -> Result<Option<Timestamps>, GpuError> {
        let Some(kind) = self.has_timestamps() else {
            return Ok(None);
        };
        let count = count.max(1);
        let set = self.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count,
        });
        let raw = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("timestamps"),
            size: 8 * u64::from(count),
            usage: wgpu::BufferUsages::QUERY_RESOLVE
                | wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Ok(Some(Timestamps {
            kind,
            set,
            resolved: GpuBuffer::from_raw(
                raw,
                2 * count as usize,
                Allocation::new(&self.allocated, 8 * u64::from(count)),
            ),
            count,
            period_ns: f64::from(self.queue.get_timestamp_period()),
        }))
    }
}

/// Device timestamps written between recorded dispatches, read back as nanoseconds.
#[derive(Debug)]
pub struct Timestamps {
    kind: TimestampKind,
    set: wgpu::QuerySet,
    resolved: GpuBuffer<u32>,
    count: u32,
    period_ns: f64,
}

impl Timestamps {
    /// Records the write of timestamp `index` after the dispatches recorded so far.
    pub fn mark(&self, gpu: &Gpu, index: u32) {
        assert!(index < self.count, "timestamp {index} of {}", self.count);
        gpu.with_encoder(|e| match self.kind {
            TimestampKind::Encoder => e.write_timestamp(&self.set, index),
            TimestampKind::Pass => {
                e.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                        query_set: &self.set,
                        beginning_of_pass_write_index: Some(index),
                        end_of_pass_write_index: None,
                    }),
                });
            }
        });
    }

    /// How the timestamps are written.
    pub fn kind(&self) -> TimestampKind {
        self.kind
    }

    /// Runs what was recorded and returns timestamps `0..n` in nanoseconds (from an arbitrary
    /// origin; only differences mean something).
    pub fn read(&self, gpu: &Gpu, n: u32) -> Result<Vec<f64>, GpuError> {
        let n = n.min(self.count);
        gpu.with_encoder(|e| e.resolve_query_set(&self.set, 0..n, &self.resolved.raw, 0));
        let words = gpu.read_range(&self.resolved, 0, 2 * n as usize)?;
        Ok(words
            .chunks(2)
            .map(|w| (u64::from(w[0]) | (u64::from(w[1]) << 32)) as f64 * self.period_ns)
            .collect())
    }
}
