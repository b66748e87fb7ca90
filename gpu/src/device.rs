//! Adapters and the opened device.

use std::collections::HashMap;
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

    /// The largest storage buffer one binding may address.
    pub fn max_binding_bytes(&self) -> u64 {
        self.limits.max_storage_buffer_binding_size
    }
}
