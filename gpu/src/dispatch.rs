//! Recording kernels: compiled pipelines (cached by name and constants), dispatches gathered in
//! one command encoder, submitted once per [`Gpu::flush`] or read-back, and the counters that
//! say what a step cost (dispatches, submissions, bytes each way).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::buffer::{Allocation, GpuBuffer};
use crate::device::Gpu;
use crate::error::GpuError;

/// A compute kernel: WGSL source with one entry point `main`. Binding 0 of group 0 is its
/// uniform parameters (when it takes any), then its storage buffers in the order given.
#[derive(Clone, Copy, Debug)]
pub struct Kernel {
    /// Unique among kernels: the pipeline cache's key (with the constants).
    pub name: &'static str,
    pub source: &'static str,
}

/// The dispatches recorded since the last submission, and their uniform parameters: written
/// one after another (each at an offset the adapter allows) into `uniforms`, copied into the
/// `arena` uniform buffer by one queue write just before the submission, so a dispatch
/// creates no buffer of its own.
#[derive(Default)]
pub(crate) struct Pending {
    encoder: Option<wgpu::CommandEncoder>,
    uniforms: Vec<u8>,
    arena: Option<wgpu::Buffer>,
}

/// Bytes of the uniform arena: a submission whose dispatches' parameters pass it is split
/// (submitted early) — about a thousand dispatches of 64-byte parameters at 256-byte offsets.
pub(crate) const ARENA_BYTES: u64 = 256 * 1024;

impl Pending {
    /// Submits the encoder (its parameters written into the arena first), if any.
    fn submit(&mut self, gpu: &Gpu) {
        if let Some(e) = self.encoder.take() {
            if let (Some(arena), false) = (&self.arena, self.uniforms.is_empty()) {
                gpu.queue.write_buffer(arena, 0, &self.uniforms);
            }
            self.uniforms.clear();
            gpu.queue.submit([e.finish()]);
            gpu.counters.submissions.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// What the device was asked to do, since it was opened (or [`Counters::reset`]).
#[derive(Debug, Default)]
pub struct Counters {
    dispatches: AtomicU64,
    submissions: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
}

/// A copy of [`Counters`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterValues {
    pub dispatches: u64,
    pub submissions: u64,
    /// Host to device (uploads and writes).
    pub bytes_up: u64,
    /// Device to host (read-backs).
    pub bytes_down: u64,
}

impl Counters {
    /// The values now.
    pub fn get(&self) -> CounterValues {
        CounterValues {
            dispatches: self.dispatches.load(Ordering::Relaxed),
            submissions: self.submissions.load(Ordering::Relaxed),
            bytes_up: self.bytes_up.load(Ordering::Relaxed),
            bytes_down: self.bytes_down.load(Ordering::Relaxed),
        }
    }

    /// Back to zero.
    pub fn reset(&self) {
        for c in [
            &self.dispatches,
            &self.submissions,
            &self.bytes_up,
            &self.bytes_down,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }
}

const STORAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

impl Gpu {
    /// The counters of this device.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    fn check_size(&self, what: &str, bytes: u64) -> Result<u64, GpuError> {
        let limit = self.max_binding_bytes().min(self.limits.max_buffer_size);
        if bytes > limit {
            return Err(GpuError::TooLarge {
                what: what.to_string(),
                bytes,
                limit,
            });
        }
        // Storage buffers are bound in whole 4-byte words; never zero-sized.
        Ok(bytes.div_ceil(4).max(1) * 4)
    }

    /// A new storage buffer of `bytes` (rounded up to whole words), checked against the
    /// binding limit and the budget, and created inside an out-of-memory error scope so that a
    /// refused allocation is an error, not a panic. Mapped for writing when `mapped`.
    pub(crate) fn create_storage(
        &self,
        what: &str,
        bytes: u64,
        mapped: bool,
    ) -> Result<(wgpu::Buffer, Allocation), GpuError> {
        let size = self.check_size(what, bytes)?;
        self.check_fits(what, size)?;
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let raw = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage: STORAGE,
            mapped_at_creation: mapped,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            log_refusal(&e);
            return Err(GpuError::OutOfMemory {
                what: what.to_string(),
                needed: size,
                available: self
                    .memory_budget()
                    .map(|b| b.saturating_sub(self.allocated_bytes())),
                device: self.label(),
            });
        }
        Ok((raw, Allocation::new(&self.allocated, size)))
    }

    /// A new device buffer of `parts` one after another (in `u32` words, the last padded
    /// with zeros), each copied straight into the mapped memory: no copy of the whole on the
    /// host.
    pub(crate) fn upload_parts(
        &self,
        what: &str,
        parts: &[&[u8]],
    ) -> Result<GpuBuffer<u32>, GpuError> {
        let bytes: usize = parts.iter().map(|p| p.len()).sum();
        let (raw, alloc) = self.create_storage(what, bytes as u64, true)?;
        {
            let mut view = raw
                .slice(..)
                .get_mapped_range_mut()
                .map_err(|e| GpuError::Device(e.to_string()))?;
            let mut at = 0;
            for p in parts {
                view.slice(at..at + p.len()).copy_from_slice(p);
                at += p.len();
            }
        }
        raw.unmap();
        self.counters
            .bytes_up
            .fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(GpuBuffer::from_raw(raw, bytes.div_ceil(4), alloc))
    }

    /// `data` copied into a new device buffer.
    pub fn upload<T: bytemuck::Pod>(&self, data: &[T]) -> Result<GpuBuffer<T>, GpuError> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let (raw, alloc) = self.create_storage("an upload", bytes.len() as u64, true)?;
        raw.slice(..)
            .get_mapped_range_mut()
            .map_err(|e| GpuError::Device(e.to_string()))?
            .slice(..bytes.len())
            .copy_from_slice(bytes);
        raw.unmap();
        self.counters
            .bytes_up
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(GpuBuffer::from_raw(raw, data.len(), alloc))
    }

    /// A new device buffer of `len` zeros.
    pub fn zeros<T: bytemuck::Pod>(&self, len: usize) -> Result<GpuBuffer<T>, GpuError> {
        let (raw, alloc) = self.create_storage("a buffer", (len * size_of::<T>()) as u64, false)?;
        Ok(GpuBuffer::from_raw(raw, len, alloc))
    }

    /// Overwrites `buf` from element `offset` with `data`. The write lands before the
    /// dispatches of the next submission (all of them, also those recorded before this call):
    /// write a step's inputs before recording the step.
    pub fn write<T: bytemuck::Pod>(
        &self,
        buf: &GpuBuffer<T>,
        offset: usize,
        data: &[T],
    ) -> Result<(), GpuError> {
        if offset + data.len() > buf.len() {
            return Err(GpuError::Shape {
                op: "write",
                problem: format!(
                    "{} elements at {offset} into a buffer of {}",
                    data.len(),
                    buf.len()
                ),
            });
        }
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let at = (offset * size_of::<T>()) as u64;
        if !at.is_multiple_of(4) || !bytes.len().is_multiple_of(4) {
            return Err(GpuError::Shape {
                op: "write",
                problem: "writes must start and end on 4-byte boundaries".into(),
            });
        }
        self.queue.write_buffer(&buf.raw, at, bytes);
        self.counters
            .bytes_up
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn pipeline(&self, kernel: Kernel, constants: &[(&str, f64)]) -> Arc<wgpu::ComputePipeline> {
        // The key: the kernel's name, and its constants where it has any (no allocation on
        // the common path: this runs at every dispatch).
        let key: std::borrow::Cow<'_, str> = if constants.is_empty() {
            kernel.name.into()
        } else {
            let mut key = kernel.name.to_string();
            for (n, v) in constants {
                key.push_str(&format!(";{n}={v}"));
            }
            key.into()
        };
        let mut cache = self.pipelines.lock().expect("pipeline cache");
        if let Some(p) = cache.get(key.as_ref()) {
            return p.clone();
        }
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(kernel.name),
                source: wgpu::ShaderSource::Wgsl(kernel.source.into()),
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(kernel.name),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants,
                    zero_initialize_workgroup_memory: true,
                },
                cache: None,
            });
        let p = Arc::new(pipeline);
        cache.insert(key.into_owned(), p.clone());
        p
    }

    /// The grid for `groups` workgroups: along x up to the adapter's limit per dimension, the
    /// rest along y. A kernel recovers its linear group index as `wid.x + wid.y * nwg.x`.
    pub fn grid(&self, groups: u32) -> [u32; 3] {
        let max = self.limits.max_compute_workgroups_per_dimension.max(1);
        if groups <= max {
            [groups.max(1), 1, 1]
        } else {
            [max, groups.div_ceil(max), 1]
        }
    }

    /// Records one dispatch of `kernel` over `grid` with its uniform `params` (binding 0, when
    /// not empty) and `buffers` (the following bindings, in order); nothing runs until the
    /// next submission.
    pub fn record(
        &self,
        kernel: Kernel,
        constants: &[(&str, f64)],
        params: &[u8],
        buffers: &[&wgpu::Buffer],
        grid: [u32; 3],
    ) {
        let pipeline = self.pipeline(kernel, constants);
        let mut pending = self.pending.lock().expect("pending dispatches");
        // The parameters' place in the arena (a uniform binding is a multiple of 16 bytes).
        let align = u64::from(self.limits.min_uniform_buffer_offset_alignment).max(16);
        let size = (params.len() as u64).div_ceil(16) * 16;
        let mut offset = (pending.uniforms.len() as u64).div_ceil(align) * align;
        if !params.is_empty() && offset + size > ARENA_BYTES {
            pending.submit(self);
            offset = 0;
        }
        let arena = (!params.is_empty()).then(|| {
            pending
                .arena
                .get_or_insert_with(|| {
                    self.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("uniform arena"),
                        size: ARENA_BYTES,
                        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                        mapped_at_creation: false,
                    })
                })
                .clone()
        });
        let mut entries = Vec::with_capacity(buffers.len() + 1);
        let first = match &arena {
            None => 0,
            Some(arena) => {
                let at = offset as usize;
                pending.uniforms.resize(at, 0);
                pending.uniforms.extend_from_slice(params);
                pending.uniforms.resize(at + size as usize, 0);
                entries.push(wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: arena,
                        offset,
                        size: std::num::NonZeroU64::new(size),
                    }),
                });
                1
            }
        };
        for (i, b) in buffers.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: first + i as u32,
                resource: b.as_entire_binding(),
            });
        }
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let encoder = pending.encoder.get_or_insert_with(|| {
            self.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
        });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        }
        self.counters.dispatches.fetch_add(1, Ordering::Relaxed);
    }

    /// Submits what was recorded (nothing when nothing was).
    pub fn flush(&self) {
        // Submitted under the lock: an encoder taken by one thread must reach the queue before
        // another thread's later encoder does (tests share one device; a read's copy must not
        // run before the dispatches recorded ahead of it).
        let mut pending = self.pending.lock().expect("pending dispatches");
        pending.submit(self);
    }

    /// `buf`'s elements, after everything recorded so far has run (one submission).
    pub fn read<T: bytemuck::Pod>(&self, buf: &GpuBuffer<T>) -> Result<Vec<T>, GpuError> {
        self.read_range(buf, 0, buf.len())
    }

    /// Elements `start..start + len` of `buf` (4-byte aligned ranges), after everything
    /// recorded so far has run.
    pub fn read_range<T: bytemuck::Pod>(
        &self,
        buf: &GpuBuffer<T>,
        start: usize,
        len: usize,
    ) -> Result<Vec<T>, GpuError> {
        if start + len > buf.len() {
            return Err(GpuError::Shape {
                op: "read",
                problem: format!("{len} elements at {start} of a buffer of {}", buf.len()),
            });
        }
        let at = (start * size_of::<T>()) as u64;
        let bytes = (len * size_of::<T>()) as u64;
        if !at.is_multiple_of(4) {
            return Err(GpuError::Shape {
                op: "read",
                problem: "reads must start on a 4-byte boundary".into(),
            });
        }
        let size = bytes.div_ceil(4).max(1) * 4;
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let copy = size.min(buf.raw.size() - at);
        self.with_encoder(|encoder| encoder.copy_buffer_to_buffer(&buf.raw, at, &staging, 0, copy));
        self.flush();
        let slice = staging.slice(..);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Device(e.to_string()))?;
        rx.recv()
            .map_err(|e| GpuError::Device(e.to_string()))?
            .map_err(|e| GpuError::Device(e.to_string()))?;
        let view = slice
            .get_mapped_range()
            .map_err(|e| GpuError::Device(e.to_string()))?;
        let out: Vec<T> = bytemuck::cast_slice::<u8, T>(&view[..bytes as usize]).to_vec();
        drop(view);
        staging.unmap();
        self.counters.bytes_down.fetch_add(bytes, Ordering::Relaxed);
        Ok(out)
    }
}

/// The driver's refusal, for whoever reads stderr (the error returned names only the sizes).
fn log_refusal(e: &wgpu::Error) {
    if std::env::var_os("TRANSFORMER_GPU_DEBUG").is_some() {
        eprintln!("gpu allocation refused: {e}");
    }
}

impl Gpu {
    /// Runs `f` on the encoder of the pending dispatches (opened when there is none), under
    /// the pending lock: dispatches ([`Gpu::record`]), read-back copies and the timestamps of
    /// [`crate::timing`] all go into it; they reach the device with the next submission.
    pub(crate) fn with_encoder<R>(&self, f: impl FnOnce(&mut wgpu::CommandEncoder) -> R) -> R {
        let mut pending = self.pending.lock().expect("pending dispatches");
        let encoder = pending.encoder.get_or_insert_with(|| {
            self.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
        });
        f(encoder)
    }
}
