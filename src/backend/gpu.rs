//! The [`Device`] on a GPU: the `transformer-gpu` crate's kernels (wgpu, WGSL) over its device
//! buffers. Every call records dispatches into the pending command encoder; a read-back
//! submits them, so a decoding step is one submission. Weights keep their GGUF blocks where a
//! kernel multiplies them (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K);
//! other block types are dequantised to f32 at upload.

use super::device::{
    AttnScores, Device, DeviceAct, DeviceError, KvShape, NormOf, StepRows, WeightSource,
};
use super::{Backend, GgmlType, Rope, RopeStyle, CPU};
use std::borrow::Cow;
use transformer_gpu::activations::{glu, Activation, GluInput};
use transformer_gpu::kv_cache::{BlockTable, PagedCache};
use transformer_gpu::norms::{add_norm, head_norm, norm, Norm};
use transformer_gpu::paged_attention::{
    paged_attention_scored, DecodeScratch, Scores, MAX_PARTITION,
};
use transformer_gpu::products::{glu_product, stacked_product, StackedWeight, WeightFormat};
use transformer_gpu::rope::{rope_kv_write, RopeFreqs, RopeLayout};
use transformer_gpu::{elementwise, products, softmax, Gpu, GpuBuffer, GpuError};

/// An opened GPU as a [`Device`].
#[derive(Debug)]
pub struct GpuDevice {
    pub gpu: Gpu,
}

/// One layer's KV blocks in device memory.
#[derive(Debug)]
pub struct GpuKv {
    k: GpuBuffer<f32>,
    v: GpuBuffer<f32>,
    shape: KvShape,
}

/// A layer's rotary frequencies and pairing on the device.
#[derive(Debug)]
pub struct GpuRope {
    freqs: RopeFreqs,
    layout: RopeLayout,
}

fn err(e: GpuError) -> DeviceError {
    DeviceError::Device(e.to_string())
}

/// The GPU format of a GGUF type, where a kernel multiplies it.
pub fn format_of(ty: GgmlType) -> Option<WeightFormat> {
    Some(match ty {
        GgmlType::F32 => WeightFormat::F32,
        GgmlType::F16 => WeightFormat::F16,
        GgmlType::BF16 => WeightFormat::Bf16,
        GgmlType::Q4_0 => WeightFormat::Q4_0,
        GgmlType::Q4_1 => WeightFormat::Q4_1,
        GgmlType::Q5_0 => WeightFormat::Q5_0,
        GgmlType::Q5_1 => WeightFormat::Q5_1,
        GgmlType::Q8_0 => WeightFormat::Q8_0,
        GgmlType::Q4_K => WeightFormat::Q4K,
        GgmlType::Q5_K => WeightFormat::Q5K,
        GgmlType::Q6_K => WeightFormat::Q6K,
        _ => return None,
    })
}

impl GpuDevice {
    /// Opens adapter `index` (`None`: the first, a discrete GPU when there is one).
    pub fn open(index: Option<usize>) -> Result<GpuDevice, DeviceError> {
        Ok(GpuDevice {
            gpu: Gpu::open(index).map_err(err)?,
        })
    }

    /// A part's format and bytes as the GPU multiplies them: the stored blocks where a kernel
    /// reads them, f32 values otherwise (float layers, other block types dequantised).
    fn part_bytes<'a>(
        &self,
        what: &str,
        p: &'a WeightSource<'a>,
    ) -> Result<(WeightFormat, Cow<'a, [u8]>), DeviceError> {
        let (d_out, d_in) = p.shape();
        if let Some((ty, bytes)) = p.ggml_blocks() {
            if let Some(f) = format_of(ty) {
                return Ok((f, bytes));
            }
            let mut values = vec![0f32; d_out * d_in];
            CPU.dequantise_ggml(ty, &bytes, &mut values)
                .map_err(|e| DeviceError::Device(format!("{what}: {e}")))?;
            return Ok((WeightFormat::F32, Cow::Owned(f32_bytes(&values))));
        }
        match p {
            WeightSource::Layer(w) if w.w.len() == d_out * d_in => {
                Ok((WeightFormat::F32, Cow::Owned(f32_bytes(w.w))))
            }
            _ => Err(DeviceError::Unsupported {
                device: self.name(),
                what: format!(
                    "{what} is held in a CPU-only format (bf16 or int8 packing): load the model \
                     with --precision f32, or ggml for a GGUF file"
                ),
            }),
        }
    }
}

impl Device for GpuDevice {
    type Tensor = GpuBuffer<f32>;
    type Ids = GpuBuffer<u32>;
    type Weight = StackedWeight;
    type Kv = GpuKv;
    type Rope = GpuRope;

    fn name(&self) -> String {
        format!("gpu:{}", self.gpu.adapter().index)
    }

    fn zeros(&self, len: usize) -> Result<GpuBuffer<f32>, DeviceError> {
        self.gpu.zeros(len).map_err(err)
    }

    fn upload(&self, values: &[f32]) -> Result<GpuBuffer<f32>, DeviceError> {
        self.gpu.upload(values).map_err(err)
    }

    fn upload_ids(&self, ids: &[u32]) -> Result<GpuBuffer<u32>, DeviceError> {
        self.gpu.upload(ids).map_err(err)
    }

    fn read(&self, t: &GpuBuffer<f32>) -> Result<Vec<f32>, DeviceError> {
        self.gpu.read(t).map_err(err)
    }

    fn read_ids(&self, t: &GpuBuffer<u32>) -> Result<Vec<u32>, DeviceError> {
        self.gpu.read(t).map_err(err)
    }

    fn weight(&self, what: &str, parts: &[WeightSource<'_>]) -> Result<StackedWeight, DeviceError> {
        let d_in = parts.first().map_or(0, |p| p.shape().1);
        let mut held = Vec::with_capacity(parts.len());
        for p in parts {
            let (format, bytes) = self.part_bytes(what, p)?;
            held.push((format, p.shape().0, bytes));
        }
        let list: Vec<(WeightFormat, usize, &[u8])> =
            held.iter().map(|(f, r, b)| (*f, *r, b.as_ref())).collect();
        StackedWeight::upload(&self.gpu, d_in, &list)
            .map_err(|e| DeviceError::Device(format!("{what}: {e}")))
    }

    fn kv_blocks(&self, shape: KvShape) -> Result<GpuKv, DeviceError> {
        let len = shape.blocks * shape.block_size * shape.n_kv_heads * shape.d_head;
        Ok(GpuKv {
            k: self.gpu.zeros(len).map_err(err)?,
            v: self.gpu.zeros(len).map_err(err)?,
            shape,
        })
    }

    fn rope_table(
        &self,
        rope: Option<Rope>,
        freq_factors: &[f64],
        d_head: usize,
    ) -> Result<GpuRope, DeviceError> {
        let Some(rope) = rope else {
            // No rotation: every angle 0 (cos 1, sin 0), so keys are stored as they are.
            let freqs = RopeFreqs::new(&self.gpu, &vec![0.0; (d_head / 2).max(1)]).map_err(err)?;
            return Ok(GpuRope {
                freqs,
                layout: RopeLayout::HalfSplit,
            });
        };
        // θᵢ = base^(−2i/d_head) / fᵢ, as the CPU kernel computes it.
        let inv_freq: Vec<f64> = (0..d_head / 2)
            .map(|i| {
                let f = freq_factors.get(i).copied().unwrap_or(1.0);
                rope.base.powf(-2.0 * i as f64 / d_head as f64) / f
            })
            .collect();
        let freqs = RopeFreqs::new(&self.gpu, &inv_freq)
            .map_err(err)?
            .with_attention_factor(rope.attention_factor as f32);
        let layout = match rope.style {
            RopeStyle::HalfSplit => RopeLayout::HalfSplit,
            RopeStyle::Interleaved => RopeLayout::Interleaved,
        };
        Ok(GpuRope { freqs, layout })
    }

    fn gather(
        &self,
        out: &mut GpuBuffer<f32>,
        ids: &GpuBuffer<u32>,
        table: &StackedWeight,
    ) -> Result<(), DeviceError> {
        products::gather_stacked(&self.gpu, out, ids, table).map_err(err)
    }

    fn add(
        &self,
        y: &mut GpuBuffer<f32>,
        a: &GpuBuffer<f32>,
        b: &GpuBuffer<f32>,
    ) -> Result<(), DeviceError> {
        elementwise::add(&self.gpu, y, a, b).map_err(err)
    }

    fn add_bias(&self, y: &mut GpuBuffer<f32>, b: &GpuBuffer<f32>) -> Result<(), DeviceError> {
        elementwise::add_bias(&self.gpu, y, b).map_err(err)
    }

    fn scale(&self, x: &mut GpuBuffer<f32>, s: f32) -> Result<(), DeviceError> {
        elementwise::scale(&self.gpu, x, s).map_err(err)
    }

    fn product(
        &self,
        y: &mut GpuBuffer<f32>,
        x: &GpuBuffer<f32>,
        rows: usize,
        w: &StackedWeight,
    ) -> Result<(), DeviceError> {
        stacked_product(&self.gpu, y, x, rows, w).map_err(err)
    }

    fn glu_product(
        &self,
        act: DeviceAct,
        y: &mut GpuBuffer<f32>,
        x: &GpuBuffer<f32>,
        rows: usize,
        gate_up: &StackedWeight,
    ) -> Result<(), DeviceError> {
        let act = activation(act);
        match gate_up.single() {
            Some(w) => glu_product(&self.gpu, act, y, x, rows, w).map_err(err),
            None => {
                // Gate and up of different formats: the product, then the gated unit.
                let both = self.gpu.zeros(rows * gate_up.d_out()).map_err(err)?;
                stacked_product(&self.gpu, &both, x, rows, gate_up).map_err(err)?;
                glu(&self.gpu, act, GluInput::Fused(&both), y, gate_up.d_out() / 2).map_err(err)
            }
        }
    }

    fn activate(&self, act: DeviceAct, x: &mut GpuBuffer<f32>) -> Result<(), DeviceError> {
        transformer_gpu::activations::activate(&self.gpu, x, activation(act)).map_err(err)
    }

    fn norm(
        &self,
        n: NormOf<'_, Self>,
        x: &GpuBuffer<f32>,
        y: &mut GpuBuffer<f32>,
    ) -> Result<(), DeviceError> {
        norm(&self.gpu, &gpu_norm(n), x, y).map_err(err)
    }

    fn add_norm(
        &self,
        n: NormOf<'_, Self>,
        h: &mut GpuBuffer<f32>,
        x: &GpuBuffer<f32>,
        y: &mut GpuBuffer<f32>,
    ) -> Result<(), DeviceError> {
        add_norm(&self.gpu, &gpu_norm(n), h, x, y).map_err(err)
    }

    fn rope_kv_write(
        &self,
        qkv: &GpuBuffer<f32>,
        q_out: &mut GpuBuffer<f32>,
        rows: &StepRows<'_, Self>,
        rope: &GpuRope,
        n_heads: usize,
        kv: &mut GpuKv,
    ) -> Result<(), DeviceError> {
        let (cache, table) = paged(kv, rows);
        rope_kv_write(
            &self.gpu,
            qkv,
            q_out,
            rows.seq,
            rows.pos,
            &rope.freqs,
            n_heads,
            rope.layout,
            cache,
            table,
        )
        .map_err(err)
    }

    fn kv_write(
        &self,
        k: &GpuBuffer<f32>,
        v: &GpuBuffer<f32>,
        rows: &StepRows<'_, Self>,
        kv: &mut GpuKv,
    ) -> Result<(), DeviceError> {
        let (cache, table) = paged(kv, rows);
        transformer_gpu::kv_cache::kv_write(&self.gpu, cache, table, k, v, rows.seq, rows.pos)
            .map_err(err)
    }

    fn paged_attention(
        &self,
        q: &GpuBuffer<f32>,
        kv: &GpuKv,
        rows: &StepRows<'_, Self>,
        o: &mut GpuBuffer<f32>,
        n_heads: usize,
        scores: AttnScores,
    ) -> Result<(), DeviceError> {
        // The kernel covers each table row's blocks: one partition (one pass) up to
        // MAX_PARTITION keys, split above.
        let max_ctx = (rows.max_blocks * kv.shape.block_size).max(1);
        let partition = max_ctx.min(MAX_PARTITION);
        let scratch =
            DecodeScratch::new(&self.gpu, rows.tokens, n_heads, kv.shape.d_head, max_ctx, partition)
                .map_err(err)?;
        let (cache, table) = paged(kv, rows);
        let scores = Scores {
            scale: scores.scale as f32,
            window: scores.window,
            softcap: scores.softcap.map(|c| c as f32),
        };
        paged_attention_scored(
            &self.gpu, q, cache, table, rows.ctx, o, n_heads, scores, &scratch,
        )
        .map_err(err)
    }

    fn head_norm(
        &self,
        qkv: &mut GpuBuffer<f32>,
        width: usize,
        heads: (usize, usize),
        q_gain: &GpuBuffer<f32>,
        k_gain: &GpuBuffer<f32>,
        eps: f64,
    ) -> Result<(), DeviceError> {
        head_norm(&self.gpu, qkv, width, heads, q_gain, k_gain, eps as f32).map_err(err)
    }

    fn softcap(&self, x: &mut GpuBuffer<f32>, c: f64) -> Result<(), DeviceError> {
        elementwise::softcap(&self.gpu, x, c as f32).map_err(err)
    }

    fn copy_rows(
        &self,
        dst: &mut GpuBuffer<f32>,
        src: &GpuBuffer<f32>,
        rows: &[usize],
        width: usize,
    ) -> Result<(), DeviceError> {
        elementwise::copy_rows(&self.gpu, dst, src, rows, width).map_err(err)
    }

    fn log_softmax(
        &self,
        x: &GpuBuffer<f32>,
        y: &mut GpuBuffer<f32>,
        n: usize,
    ) -> Result<(), DeviceError> {
        softmax::log_softmax(&self.gpu, x, y, n).map_err(err)
    }

    fn argmax(
        &self,
        x: &GpuBuffer<f32>,
        ids: &mut GpuBuffer<u32>,
        n: usize,
    ) -> Result<(), DeviceError> {
        softmax::argmax(&self.gpu, x, ids, n).map_err(err)
    }
}

/// Little-endian bytes of f32 values (the device's layout).
fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn activation(act: DeviceAct) -> Activation {
    match act {
        DeviceAct::Relu => Activation::Relu,
        DeviceAct::GeluErf => Activation::GeluErf,
        DeviceAct::GeluTanh => Activation::GeluTanh,
        DeviceAct::Silu => Activation::Silu,
    }
}

fn gpu_norm<'a>(n: NormOf<'a, GpuDevice>) -> Norm<'a> {
    match n {
        NormOf::Rms { gain, eps } => Norm::Rms {
            weight: gain,
            eps: eps as f32,
            offset: 0.0,
        },
        NormOf::Layer { gain, bias, eps } => Norm::Layer {
            gain,
            bias: Some(bias),
            eps: eps as f32,
        },
    }
}

fn paged<'a>(kv: &'a GpuKv, rows: &StepRows<'a, GpuDevice>) -> (PagedCache<'a>, BlockTable<'a>) {
    (
        PagedCache {
            k: &kv.k,
            v: &kv.v,
            block_size: kv.shape.block_size,
            n_kv_heads: kv.shape.n_kv_heads,
            d_head: kv.shape.d_head,
        },
        BlockTable {
            ids: rows.table,
            max_blocks: rows.max_blocks,
        },
    )
}
