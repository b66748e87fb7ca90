//! Device memory: a storage buffer holding `len` elements of one type, counted in its
//! device's [`Gpu::allocated_bytes`](crate::Gpu::allocated_bytes) while it lives.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes of one buffer, added to its device's count when created and taken off when dropped.
#[derive(Debug)]
pub(crate) struct Allocation {
    bytes: u64,
    counter: Arc<AtomicU64>,
}

impl Allocation {
    pub(crate) fn new(counter: &Arc<AtomicU64>, bytes: u64) -> Allocation {
        counter.fetch_add(bytes, Ordering::Relaxed);
        Allocation {
            bytes,
            counter: counter.clone(),
        }
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// `len` elements of `T` in device memory (a storage buffer, also a copy source and target).
#[derive(Debug)]
pub struct GpuBuffer<T> {
    pub(crate) raw: wgpu::Buffer,
    len: usize,
    _alloc: Allocation,
    _elem: PhantomData<T>,
}

impl<T: bytemuck::Pod> GpuBuffer<T> {
    pub(crate) fn from_raw(raw: wgpu::Buffer, len: usize, alloc: Allocation) -> Self {
        GpuBuffer {
            raw,
            len,
            _alloc: alloc,
            _elem: PhantomData,
        }
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes held (rounded up to 4, as storage buffers are).
    pub fn bytes(&self) -> u64 {
        self.raw.size()
    }
}
