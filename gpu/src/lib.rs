//! The GPU kernels of the `transformer` crate: WGSL compute shaders run through `wgpu` on any
//! Vulkan, Metal or DX12 adapter, including Mesa's lavapipe (a software Vulkan device on the CPU,
//! which is how CI tests them).
//!
//! - [`Gpu`] is one opened adapter: its device and queue, the compiled kernels, and the
//!   dispatches recorded since the last submission. Kernels are *recorded*, not run: every
//!   dispatch of a step goes into one command encoder, submitted once when a result is read
//!   back ([`Gpu::read`]) or on [`Gpu::flush`] — one submission per decode step.
//! - [`GpuBuffer`] is device memory holding `len` elements of one type; uploads and read-backs
//!   are counted ([`Counters`]) so a benchmark can say how many bytes crossed the bus per step.
//!   Every buffer's bytes count in [`Gpu::allocated_bytes`] until it is dropped; with a
//!   budget ([`Gpu::memory_budget`]) an allocation that would pass it, or one the driver
//!   refuses, is [`GpuError::OutOfMemory`], never a panic.
//! - A decoder layer's decode step is 8 dispatches: add + norm, the Q‖K‖V product
//!   ([`products::stacked_product`]), RoPE fused with the KV-cache store
//!   ([`rope::rope_kv_write`]), single-pass paged attention, the output product, add + norm,
//!   the gate‖up product with SwiGLU fused into its output ([`products::glu_product`]), the
//!   down product.
//! - Each operation is a module with its WGSL source in `src/shaders/` and a host function that
//!   checks shapes and records the dispatch; its tests compare it with a float64 loop written
//!   from the equation.

pub mod activations;
mod buffer;
mod device;
mod dispatch;
pub mod elementwise;
mod error;
pub mod flash_attention;
pub mod kv_cache;
pub mod norms;
pub mod paged_attention;
pub mod products;
pub mod rope;
pub mod softmax;
pub mod timing;

pub use buffer::GpuBuffer;
pub use device::{adapters, AdapterSummary, Gpu};
pub use dispatch::Counters;
pub use error::GpuError;

#[cfg(test)]
mod decode_layer_tests;
// The device the tests run on and their seeded inputs: this crate's tests and the root
// crate's GPU-against-CPU tests share one rule for a missing adapter (skip, or fail under CI).
#[doc(hidden)]
pub mod testing;
