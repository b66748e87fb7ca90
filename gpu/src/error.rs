//! What can go wrong on the device, each naming the problem.

/// An error of the GPU backend.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No Vulkan, Metal or DX12 adapter was found.
    #[error(
        "no Vulkan device found: install mesa-vulkan-drivers for a software one, or a GPU driver"
    )]
    NoAdapter,
    /// `--device gpu:N` named an adapter that does not exist.
    #[error("no GPU adapter {index}: {count} found (`transformer devices` lists them)")]
    NoSuchAdapter { index: usize, count: usize },
    /// The adapter refused to open a device.
    #[error("the GPU adapter {name} could not open a device: {reason}")]
    DeviceRequest { name: String, reason: String },
    /// A buffer larger than the adapter allows in one binding.
    #[error("{what} needs {bytes} bytes in one buffer; this GPU allows at most {limit}")]
    TooLarge {
        what: String,
        bytes: u64,
        limit: u64,
    },
    /// Shapes that do not agree, found before anything was recorded.
    #[error("GPU {op}: {problem}")]
    Shape { op: &'static str, problem: String },
    /// Device memory would run out: a budget is known ([`crate::Gpu::memory_budget`]) and
    /// `needed` bytes exceed what is left of it (`available`), or the driver refused the
    /// allocation (`available` unknown).
    #[error(
        "{what} needs {} of device memory; {device} has {}",
        gigabytes(*needed),
        available.map_or("no more (the driver refused the allocation)".to_string(),
                         |a| format!("{} free", gigabytes(a)))
    )]
    OutOfMemory {
        what: String,
        needed: u64,
        available: Option<u64>,
        /// `gpu:N (NAME)`.
        device: String,
    },
    /// The device was lost, or a submission or read-back failed.
    #[error("GPU device error: {0}")]
    Device(String),
}

/// Bytes as gigabytes (10⁹) with one decimal, megabytes below 0.1 GB, bytes below 0.1 MB.
fn gigabytes(bytes: u64) -> String {
    if bytes >= 100_000_000 {
        format!("{:.1} GB", bytes as f64 / 1e9)
    } else if bytes >= 100_000 {
        format!("{:.1} MB", bytes as f64 / 1e6)
    } else {
        format!("{bytes} bytes")
    }
}
