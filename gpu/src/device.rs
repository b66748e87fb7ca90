//! Adapters and the opened device.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::dispatch::{Counters, Pending};
use crate::error::GpuError;

/// One adapter as `transformer devices` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterSummary {
    /// The index `--device gpu:N` names.
    pub index: usize,
    pub name: String,
    /// `discrete`, `integrated`, `virtual`, `cpu` (a software device such as lavapipe), `other`.
    pub kind: &'static str,
    /// `Vulkan`, `Metal`, `Dx12`.
    pub api: String,
    pub driver: String,
    /// The largest buffer one binding may address, in bytes (the adapter does not say how
    /// much memory it has through this API; this bounds one weight matrix).
    pub max_binding_bytes: u64,
    /// Half-precision arithmetic in shaders.
    pub shader_f16: bool,
    /// Subgroup (warp / wave) operations.
    pub subgroups: bool,
    /// Cooperative matrices (tensor cores), experimental in wgpu.
    pub cooperative_matrix: bool,
}

fn instance() -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends = wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12;
    // Where the driver reports a budget (DX12; Vulkan with VK_EXT_memory_budget), creating a
    // buffer past 95 % of it is an out-of-memory error (caught in an error scope and returned
    // as `GpuError::OutOfMemory`) rather than an allocation that pages or loses the device.
    desc.memory_budget_thresholds.for_resource_creation = Some(95);
    wgpu::Instance::new(desc)
}

fn kind(t: wgpu::DeviceType) -> &'static str {
    match t {
        wgpu::DeviceType::DiscreteGpu => "discrete",
        wgpu::DeviceType::IntegratedGpu => "integrated",
        wgpu::DeviceType::VirtualGpu => "virtual",
        wgpu::DeviceType::Cpu => "cpu",
        wgpu::DeviceType::Other => "other",
    }
}

fn summary(index: usize, a: &wgpu::Adapter) -> AdapterSummary {
    let info = a.get_info();
    let features = a.features();
    AdapterSummary {
        index,
        name: info.name,
        kind: kind(info.device_type),
        api: format!("{:?}", info.backend),
        driver: format!("{} {}", info.driver, info.driver_info)
            .trim()
            .to_string(),
        max_binding_bytes: a.limits().max_storage_buffer_binding_size,
        shader_f16: features.contains(wgpu::Features::SHADER_F16),
        subgroups: features.contains(wgpu::Features::SUBGROUP),
        cooperative_matrix: features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX),
    }
}

/// The adapters this machine has, discrete GPUs first, software devices last (the order
/// `gpu:N` indexes).
fn sorted_adapters() -> Vec<wgpu::Adapter> {
    let mut list = pollster::block_on(instance().enumerate_adapters(wgpu::Backends::all()));
    let rank = |a: &wgpu::Adapter| match a.get_info().device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    list.sort_by_key(rank);
    list
}

/// Every adapter found, in `gpu:N` order (empty when there is none).
pub fn adapters() -> Vec<AdapterSummary> {
    sorted_adapters()
        .iter()
        .enumerate()
        .map(|(i, a)| summary(i, a))
        .collect()
}

/// An opened adapter: device, queue, compiled kernels, the dispatches not yet submitted.
pub struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) summary: AdapterSummary,
    pub(crate) limits: wgpu::Limits,
    pub(crate) pipelines: Mutex<HashMap<String, Arc<wgpu::ComputePipeline>>>,
    pub(crate) pending: Mutex<Pending>,
    pub(crate) counters: Counters,
    /// Bytes held by the live [`crate::GpuBuffer`]s of this device.
    pub(crate) allocated: Arc<AtomicU64>,
    /// The device memory this process may use, when known; `u64::MAX` when not.
    pub(crate) budget: AtomicU64,
    /// At most this many bytes in one weight buffer (`u64::MAX`: the adapter's limits).
    pub(crate) piece_cap: AtomicU64,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("adapter", &self.summary)
            .finish()
    }
}

impl Gpu {
    /// Opens adapter `index` of [`adapters`] (the first, a discrete GPU when there is one, for
    /// `None`), with f16 arithmetic and subgroups when it has them and its own limits.
    pub fn open(index: Option<usize>) -> Result<Gpu, GpuError> {
        let list = sorted_adapters();
        if list.is_empty() {
            return Err(GpuError::NoAdapter);
        }
        let i = index.unwrap_or(0);
        let adapter = list.get(i).ok_or(GpuError::NoSuchAdapter {
            index: i,
            count: list.len(),
        })?;
        let summary = summary(i, adapter);
        // Timestamp queries only serve the benchmarks (`crate::timing`); nothing else needs them.
        let wanted = wgpu::Features::SHADER_F16
            | wgpu::Features::SUBGROUP
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS;
        let features = adapter.features() & wanted;
        let limits = adapter.limits();
        let desc = wgpu::DeviceDescriptor {
            label: Some("transformer"),
            required_features: features,
            required_limits: limits.clone(),
            ..Default::default()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc)).map_err(|e| {
            GpuError::DeviceRequest {
                name: summary.name.clone(),
                reason: e.to_string(),
            }
        })?;
        Ok(Gpu {
            device,
            queue,
            summary,
            limits,
            pipelines: Mutex::new(HashMap::new()),
            pending: Mutex::new(Pending::default()),
            counters: Counters::default(),
            allocated: Arc::new(AtomicU64::new(0)),
            budget: AtomicU64::new(u64::MAX),
            piece_cap: AtomicU64::new(u64::MAX),
        })
    }

    /// What was opened.
    pub fn adapter(&self) -> &AdapterSummary {
        &self.summary
    }

    /// Whether shaders may use `f16` arithmetic (`enable f16;`).
    pub fn has_f16(&self) -> bool {
        self.device.features().contains(wgpu::Features::SHADER_F16)
    }

    /// Whether shaders may use subgroup operations (`enable subgroups;`).
    pub fn has_subgroups(&self) -> bool {
        self.device.features().contains(wgpu::Features::SUBGROUP)
    }

    /// Bytes of device memory held by this device's live buffers (created minus dropped;
    /// storage buffers only: not the pipelines, the per-dispatch uniforms or the staging of
    /// read-backs, which are small and short-lived).
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated.load(Ordering::Relaxed)
    }

    /// The device memory this process may use, when known. wgpu 30 has no safe query of an
    /// adapter's memory size or budget (`AdapterInfo` does not carry it; the driver's budget,
    /// VK_EXT_memory_budget or DXGI's, is read only inside wgpu-hal, reachable through the
    /// `unsafe` `as_hal`; `Device::generate_allocator_report` says what wgpu's allocator holds,
    /// not what is free), so this is `None` until [`Gpu::set_memory_budget`] sets one (from the
    /// user, or the vendor's tools). The driver's own budget still applies: an allocation past
    /// 95 % of it is an out-of-memory error.
    pub fn memory_budget(&self) -> Option<u64> {
        match self.budget.load(Ordering::Relaxed) {
            u64::MAX => None,
            b => Some(b),
        }
    }

    /// Sets (or, with `None`, clears) the budget that [`Gpu::upload`] and [`Gpu::zeros`]
    /// check before allocating: past it they return [`GpuError::OutOfMemory`].
    pub fn set_memory_budget(&self, bytes: Option<u64>) {
        self.budget
            .store(bytes.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// `gpu:N (NAME)`, as errors name this device.
    pub fn label(&self) -> String {
        format!("gpu:{} ({})", self.summary.index, self.summary.name)
    }

    /// Checks that `bytes` more of device memory fit the budget, when one is known: the
    /// [`GpuError::OutOfMemory`] that a loader returns before uploading a model of `bytes`
    /// (`what` names it: "the model").
    pub fn check_fits(&self, what: &str, bytes: u64) -> Result<(), GpuError> {
        if let Some(budget) = self.memory_budget() {
            let free = budget.saturating_sub(self.allocated_bytes());
            if bytes > free {
                return Err(GpuError::OutOfMemory {
                    what: what.to_string(),
                    needed: bytes,
                    available: Some(free),
                    device: self.label(),
                });
            }
        }
        Ok(())
    }

    /// The largest storage buffer one binding may address.
    pub fn max_binding_bytes(&self) -> u64 {
        self.limits.max_storage_buffer_binding_size
    }

    /// The most bytes one storage buffer may hold here (the binding and buffer limits, or a
    /// lower cap set for tests).
    pub(crate) fn buffer_limit(&self) -> u64 {
        let cap = self.piece_cap.load(std::sync::atomic::Ordering::Relaxed);
        self.max_binding_bytes()
            .min(self.limits.max_buffer_size)
            .min(cap)
    }

    /// Caps the bytes of one weight buffer (tests: a table cut into runs on any adapter).
    #[doc(hidden)]
    pub fn set_weight_buffer_cap(&self, bytes: u64) {
        self.piece_cap
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::products::{GpuWeight, WeightFormat};

    #[test]
    fn allocations_are_counted_and_a_budget_is_an_error_naming_the_sizes() {
        if crate::testing::gpu().is_none() {
            return;
        }
        // Its own device: the shared one's buffers come and go with the other tests.
        let gpu = Gpu::open(None).unwrap();
        assert_eq!(gpu.allocated_bytes(), 0);
        assert_eq!(gpu.memory_budget(), None);
        let a = gpu.zeros::<f32>(1000).unwrap();
        let b = gpu.upload(&[1u8, 2, 3]).unwrap();
        // Whole words: 3 bytes hold 4.
        assert_eq!(gpu.allocated_bytes(), 4000 + 4);
        let w = GpuWeight::upload(&gpu, WeightFormat::Q4_0, 32, 3, &[0u8; 54]).unwrap();
        assert_eq!(gpu.allocated_bytes(), 4004 + 56);
        drop(a);
        assert_eq!(gpu.allocated_bytes(), 4 + 56);
        drop((b, w));
        assert_eq!(gpu.allocated_bytes(), 0);

        gpu.set_memory_budget(Some(10_000));
        assert_eq!(gpu.memory_budget(), Some(10_000));
        let keep = gpu.zeros::<u8>(6000).unwrap();
        let e = gpu.zeros::<f32>(1001).unwrap_err();
        match &e {
            GpuError::OutOfMemory {
                needed, available, ..
            } => assert_eq!((*needed, *available), (4004, Some(4000))),
            other => panic!("{other}"),
        }
        let msg = e.to_string();
        assert!(
            msg.starts_with("a buffer needs 4004 bytes of device memory"),
            "{msg}"
        );
        assert!(msg.ends_with(") has 4000 bytes free"), "{msg}");
        assert!(
            msg.contains(&format!("gpu:0 ({})", gpu.adapter().name)),
            "{msg}"
        );
        assert!(gpu.upload(&vec![0u32; 1001]).is_err());
        assert!(GpuWeight::upload(&gpu, WeightFormat::F32, 1001, 1, &[0u8; 4004]).is_err());
        let e = gpu.check_fits("the model", 5_100_000_000).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("the model needs 5.1 GB of device memory; gpu:0 ("),
            "{e}"
        );
        assert!(e.to_string().ends_with("has 4000 bytes free"), "{e}");
        // Nothing was allocated by the refusals; the budget fits again once freed.
        assert_eq!(gpu.allocated_bytes(), 6000);
        drop(keep);
        assert!(gpu.zeros::<f32>(1001).is_ok());
        gpu.set_memory_budget(None);
        assert!(gpu.check_fits("the model", u64::MAX).is_ok());
    }
}
