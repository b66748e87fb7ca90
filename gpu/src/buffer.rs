//! Device memory: a storage buffer holding `len` elements of one plain type.

use std::marker::PhantomData;

/// `len` elements of `T` in device memory (a storage buffer, also a copy source and target).
#[derive(Debug)]
pub struct GpuBuffer<T> {
    pub(crate) raw: wgpu::Buffer,
    len: usize,
    _elem: PhantomData<T>,
}

impl<T: bytemuck::Pod> GpuBuffer<T> {
    pub(crate) fn from_raw(raw: wgpu::Buffer, len: usize) -> Self {
        GpuBuffer {
            raw,
            len,
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
