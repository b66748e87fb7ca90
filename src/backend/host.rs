//! The [`Device`] on the host: handles are vectors, every call runs at once through the
//! [`Cpu`](super::Cpu) backend's kernels (the products, norms, RoPE and activations the model's
//! own step calls, so those are the same bits), and attention is a plain loop over the block
//! table, summed in f64. It is the reference the GPU device is compared with, and runs the
//! device step (`crate::model::device_lm`) without a GPU; the model's own CPU path stays the
//! fast one.

use super::device::{
    AttnScores, Device, DeviceAct, DeviceError, KvShape, NormOf, StepRows, WeightSource,
};
use super::{Backend, GgmlType, PackedWeight, Rope, WeightRef, CPU};

/// The host as a [`Device`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Host;

/// One matrix of a host weight, owned.
#[derive(Clone, Debug)]
enum Part {
    /// `W [d_out, d_in]` and, when the layer kept one, `Wᵀ`.
    Floats {
        w: Vec<f32>,
        transposed: Option<Vec<f32>>,
    },
    /// Packed as the layer packed it.
    Packed(PackedWeight),
    /// A GGUF table's stored rows.
    Rows { ty: GgmlType, bytes: Vec<u8> },
}

/// A host weight: its parts stacked by rows (see [`Device::weight`]).
#[derive(Clone, Debug)]
pub struct HostWeight {
    parts: Vec<(Part, usize)>,
    d_in: usize,
    d_out: usize,
}

/// One layer's KV blocks on the host.
#[derive(Clone, Debug)]
pub struct HostKv {
    k: Vec<f32>,
    v: Vec<f32>,
    shape: KvShape,
}

/// The slot of the key at position `j` of token `i`'s row (its table row `rows.seq[i]`).
fn slot(rows: &StepRows<'_, Host>, i: usize, j: usize, block_size: usize) -> usize {
    let table = &rows.table[rows.seq[i] as usize * rows.max_blocks..];
    table[j / block_size] as usize * block_size + j % block_size
}

impl HostKv {
    /// Key `k` and value `v` (`[n_kv_heads · d_head]` each) into slot `slot`.
    fn store(&mut self, slot: usize, k: &[f32], v: &[f32]) {
        let at = slot * k.len();
        self.k[at..at + k.len()].copy_from_slice(k);
        self.v[at..at + v.len()].copy_from_slice(v);
    }
}

fn shape(what: String) -> DeviceError {
    DeviceError::Device(format!("host device: {what}"))
}

impl HostWeight {
    /// Part `i`'s product into `y [rows, part rows]`.
    fn part_product(&self, i: usize, y: &mut [f32], x: &[f32], rows: usize) {
        let (part, d_out) = &self.parts[i];
        let d_in = self.d_in;
        let w = |w: &'static [f32]| WeightRef {
            w,
            d_in,
            d_out: *d_out,
            transposed: None,
            packed: None,
            bf16: None,
        };
        match part {
            Part::Floats { w: values, transposed } => {
                let wr = WeightRef {
                    w: values,
                    transposed: transposed.as_deref(),
                    ..w(&[])
                };
                CPU.weight_product(y, x, rows, wr);
            }
            Part::Packed(p) => CPU.weight_product(
                y,
                x,
                rows,
                WeightRef {
                    packed: Some(p),
                    ..w(&[])
                },
            ),
            Part::Rows { ty, bytes } => {
                // W dequantised row by row, then the float product.
                let row_bytes = bytes.len() / d_out;
                let mut values = vec![0f32; d_out * d_in];
                for (o, row) in values.chunks_exact_mut(d_in).enumerate() {
                    let b = &bytes[o * row_bytes..(o + 1) * row_bytes];
                    CPU.dequantise_ggml(*ty, b, row).expect("sizes checked at upload");
                }
                CPU.weight_product(
                    y,
                    x,
                    rows,
                    WeightRef {
                        w: &values,
                        ..w(&[])
                    },
                );
            }
        }
    }
}

impl Device for Host {
    type Tensor = Vec<f32>;
    type Ids = Vec<u32>;
    type Weight = HostWeight;
    type Kv = HostKv;
    type Rope = (Option<Rope>, Vec<f64>);

    fn name(&self) -> String {
        "cpu".into()
    }

    fn zeros(&self, len: usize) -> Result<Vec<f32>, DeviceError> {
        Ok(vec![0.0; len])
    }

    fn upload(&self, values: &[f32]) -> Result<Vec<f32>, DeviceError> {
        Ok(values.to_vec())
    }

    fn upload_ids(&self, ids: &[u32]) -> Result<Vec<u32>, DeviceError> {
        Ok(ids.to_vec())
    }

    fn read(&self, t: &Vec<f32>) -> Result<Vec<f32>, DeviceError> {
        Ok(t.clone())
    }

    fn read_ids(&self, t: &Vec<u32>) -> Result<Vec<u32>, DeviceError> {
        Ok(t.clone())
    }

    fn weight(&self, what: &str, parts: &[WeightSource<'_>]) -> Result<HostWeight, DeviceError> {
        let d_in = parts.first().map_or(0, |p| p.shape().1);
        let mut out = Vec::with_capacity(parts.len());
        for p in parts {
            let (d_out, p_in) = p.shape();
            if p_in != d_in || d_out == 0 {
                return Err(shape(format!(
                    "{what}: a part of [{d_out}, {p_in}] stacked on rows of {d_in}"
                )));
            }
            let part = match p {
                WeightSource::Layer(w) => match (w.packed, w.w.len() == d_out * d_in) {
                    (Some(packed), _) => Part::Packed(packed.clone()),
                    (None, true) => Part::Floats {
                        w: w.w.to_vec(),
                        transposed: w.transposed.map(<[f32]>::to_vec),
                    },
                    (None, false) => {
                        return Err(shape(format!("{what}: a layer without its weight's values")))
                    }
                },
                WeightSource::Rows { ty, bytes, .. } => Part::Rows {
                    ty: *ty,
                    bytes: bytes.to_vec(),
                },
            };
            out.push((part, d_out));
        }
        let d_out = out.iter().map(|p| p.1).sum();
        Ok(HostWeight {
            parts: out,
            d_in,
            d_out,
        })
    }

    fn kv_blocks(&self, shape: KvShape) -> Result<HostKv, DeviceError> {
        let len = shape.blocks * shape.block_size * shape.n_kv_heads * shape.d_head;
        Ok(HostKv {
            k: vec![0.0; len],
            v: vec![0.0; len],
            shape,
        })
    }

    fn rope_table(
        &self,
        rope: Option<Rope>,
        freq_factors: &[f64],
        _d_head: usize,
    ) -> Result<(Option<Rope>, Vec<f64>), DeviceError> {
        Ok((rope, freq_factors.to_vec()))
    }

    fn gather(&self, out: &mut Vec<f32>, ids: &Vec<u32>, table: &HostWeight) -> Result<(), DeviceError> {
        let d = table.d_in;
        if out.len() != ids.len() * d || table.parts.len() != 1 {
            return Err(shape(format!("gather of {} ids into {}", ids.len(), out.len())));
        }
        for (row, &id) in out.chunks_exact_mut(d).zip(ids) {
            let id = id as usize;
            if id >= table.d_out {
                row.fill(0.0);
                continue;
            }
            match &table.parts[0].0 {
                Part::Floats { w, .. } => row.copy_from_slice(&w[id * d..(id + 1) * d]),
                Part::Rows { ty, bytes } => {
                    let rb = bytes.len() / table.d_out;
                    CPU.dequantise_ggml(*ty, &bytes[id * rb..(id + 1) * rb], row)
                        .map_err(shape)?;
                }
                Part::Packed(_) => return Err(shape("a packed table has no rows to gather".into())),
            }
        }
        Ok(())
    }

    fn add(&self, y: &mut Vec<f32>, a: &Vec<f32>, b: &Vec<f32>) -> Result<(), DeviceError> {
        if a.len() != y.len() || b.len() != y.len() {
            return Err(shape(format!("{} + {} into {}", a.len(), b.len(), y.len())));
        }
        y.copy_from_slice(a);
        CPU.add(y, b);
        Ok(())
    }

    fn add_bias(&self, y: &mut Vec<f32>, b: &Vec<f32>) -> Result<(), DeviceError> {
        if b.is_empty() || !y.len().is_multiple_of(b.len()) {
            return Err(shape(format!("a bias of {} for {} values", b.len(), y.len())));
        }
        CPU.add_row_bias(y, b);
        Ok(())
    }

    fn scale(&self, x: &mut Vec<f32>, s: f32) -> Result<(), DeviceError> {
        x.iter_mut().for_each(|v| *v *= s);
        Ok(())
    }

    fn product(
        &self,
        y: &mut Vec<f32>,
        x: &Vec<f32>,
        rows: usize,
        w: &HostWeight,
    ) -> Result<(), DeviceError> {
        if x.len() != rows * w.d_in || y.len() != rows * w.d_out {
            return Err(shape(format!(
                "product of x {} and y {} for {rows} rows of [{}, {}]",
                x.len(),
                y.len(),
                w.d_out,
                w.d_in
            )));
        }
        if w.parts.len() == 1 {
            w.part_product(0, y, x, rows);
            return Ok(());
        }
        let mut col = 0;
        for i in 0..w.parts.len() {
            let n = w.parts[i].1;
            let mut part = vec![0f32; rows * n];
            w.part_product(i, &mut part, x, rows);
            for (dst, src) in y.chunks_exact_mut(w.d_out).zip(part.chunks_exact(n)) {
                dst[col..col + n].copy_from_slice(src);
            }
            col += n;
        }
        Ok(())
    }

    fn glu_product(
        &self,
        act: DeviceAct,
        y: &mut Vec<f32>,
        x: &Vec<f32>,
        rows: usize,
        gate_up: &HostWeight,
    ) -> Result<(), DeviceError> {
        let d_ff = gate_up.d_out / 2;
        let mut both = vec![0f32; rows * 2 * d_ff];
        self.product(&mut both, x, rows, gate_up)?;
        let (mut gate, mut up) = (Vec::with_capacity(rows * d_ff), Vec::with_capacity(rows * d_ff));
        for row in both.chunks_exact(2 * d_ff) {
            gate.extend_from_slice(&row[..d_ff]);
            up.extend_from_slice(&row[d_ff..]);
        }
        match act {
            DeviceAct::Silu => CPU.swiglu(y, &gate, &up),
            _ => {
                y.copy_from_slice(&gate);
                self.activate(act, y)?;
                CPU.mul(y, &up);
            }
        }
        Ok(())
    }

    fn activate(&self, act: DeviceAct, x: &mut Vec<f32>) -> Result<(), DeviceError> {
        let input = x.clone();
        match act {
            DeviceAct::Relu => CPU.relu(x),
            DeviceAct::GeluErf => CPU.gelu_erf(x, &input),
            DeviceAct::GeluTanh => CPU.gelu_tanh(x, &input),
            DeviceAct::Silu => {
                for v in x.iter_mut() {
                    *v = *v / (1.0 + (-*v).exp());
                }
            }
        }
        Ok(())
    }

    fn norm(&self, norm: NormOf<'_, Self>, x: &Vec<f32>, y: &mut Vec<f32>) -> Result<(), DeviceError> {
        match norm {
            NormOf::Rms { gain, eps } => {
                CPU.rms_norm(y, x, gain, gain.len(), eps);
            }
            NormOf::Layer { gain, bias, eps } => {
                CPU.layer_norm(y, x, (gain, bias), gain.len(), eps);
            }
        }
        Ok(())
    }

    fn add_norm(
        &self,
        norm: NormOf<'_, Self>,
        h: &mut Vec<f32>,
        x: &Vec<f32>,
        y: &mut Vec<f32>,
    ) -> Result<(), DeviceError> {
        CPU.add(h, x);
        self.norm(norm, h, y)
    }

    fn rope_kv_write(
        &self,
        qkv: &Vec<f32>,
        q_out: &mut Vec<f32>,
        rows: &StepRows<'_, Self>,
        (rope, factors): &(Option<Rope>, Vec<f64>),
        n_heads: usize,
        kv: &mut HostKv,
    ) -> Result<(), DeviceError> {
        let KvShape {
            block_size,
            n_kv_heads: n_kv,
            d_head: d,
            ..
        } = kv.shape;
        let width = (n_heads + 2 * n_kv) * d;
        if qkv.len() != rows.tokens * width || q_out.len() != rows.tokens * n_heads * d {
            return Err(shape(format!("rope_kv_write of qkv {} for {} tokens", qkv.len(), rows.tokens)));
        }
        for i in 0..rows.tokens {
            let pos = rows.pos[i] as usize;
            let t = &qkv[i * width..(i + 1) * width];
            let q = &mut q_out[i * n_heads * d..(i + 1) * n_heads * d];
            q.copy_from_slice(&t[..n_heads * d]);
            let mut k = t[n_heads * d..(n_heads + n_kv) * d].to_vec();
            if let Some(rope) = rope {
                CPU.rope(q, *rope, factors, 1, n_heads, (d, pos));
                CPU.rope(&mut k, *rope, factors, 1, n_kv, (d, pos));
            }
            kv.store(slot(rows, i, pos, block_size), &k, &t[(n_heads + n_kv) * d..]);
        }
        Ok(())
    }

    fn kv_write(
        &self,
        k: &Vec<f32>,
        v: &Vec<f32>,
        rows: &StepRows<'_, Self>,
        kv: &mut HostKv,
    ) -> Result<(), DeviceError> {
        let KvShape {
            block_size,
            n_kv_heads: n_kv,
            d_head: d,
            ..
        } = kv.shape;
        let w = n_kv * d;
        if k.len() != rows.tokens * w || v.len() != k.len() {
            return Err(shape(format!("kv_write of {} keys for {} tokens", k.len(), rows.tokens)));
        }
        for i in 0..rows.tokens {
            let at = slot(rows, i, rows.pos[i] as usize, block_size);
            kv.store(at, &k[i * w..(i + 1) * w], &v[i * w..(i + 1) * w]);
        }
        Ok(())
    }

    fn paged_attention(
        &self,
        q: &Vec<f32>,
        kv: &HostKv,
        rows: &StepRows<'_, Self>,
        o: &mut Vec<f32>,
        n_heads: usize,
        scores: AttnScores,
    ) -> Result<(), DeviceError> {
        let KvShape {
            block_size,
            n_kv_heads: n_kv,
            d_head: d,
            ..
        } = kv.shape;
        let group = n_heads / n_kv;
        let AttnScores {
            scale,
            window,
            softcap,
        } = scores;
        for i in 0..rows.tokens {
            let ctx = rows.ctx[i] as usize;
            let first = window.map_or(0, |w| ctx.saturating_sub(w));
            let slot = |j: usize| slot(rows, i, j, block_size);
            for h in 0..n_heads {
                let qh = &q[(i * n_heads + h) * d..(i * n_heads + h + 1) * d];
                let kvh = h / group;
                let key = |j: usize| {
                    let at = (slot(j) * n_kv + kvh) * d;
                    at..at + d
                };
                let scores: Vec<f64> = (first..ctx)
                    .map(|j| {
                        let k = &kv.k[key(j)];
                        let s = qh.iter().zip(k).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>()
                            * scale;
                        softcap.map_or(s, |c| c * (s / c).tanh())
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                let out = &mut o[(i * n_heads + h) * d..(i * n_heads + h + 1) * d];
                for (c, o) in out.iter_mut().enumerate() {
                    let sum: f64 = (first..ctx)
                        .map(|j| weights[j - first] * kv.v[key(j)][c] as f64)
                        .sum();
                    *o = (sum / total) as f32;
                }
            }
        }
        Ok(())
    }

    fn head_norm(
        &self,
        qkv: &mut Vec<f32>,
        width: usize,
        (n_q, n_k): (usize, usize),
        q_gain: &Vec<f32>,
        k_gain: &Vec<f32>,
        eps: f64,
    ) -> Result<(), DeviceError> {
        let d = q_gain.len();
        if d == 0 || width < (n_q + n_k) * d || !qkv.len().is_multiple_of(width.max(1)) {
            return Err(shape(format!("head norms of {} values in rows of {width}", qkv.len())));
        }
        for row in qkv.chunks_exact_mut(width) {
            for (h, head) in row[..(n_q + n_k) * d].chunks_exact_mut(d).enumerate() {
                let x = head.to_vec();
                let gain = if h < n_q { q_gain } else { k_gain };
                CPU.rms_norm(head, &x, gain, d, eps);
            }
        }
        Ok(())
    }

    fn softcap(&self, x: &mut Vec<f32>, c: f64) -> Result<(), DeviceError> {
        let n = x.len();
        CPU.softcap(x, n.max(1), c);
        Ok(())
    }

    fn copy_rows(
        &self,
        dst: &mut Vec<f32>,
        src: &Vec<f32>,
        rows: &[usize],
        width: usize,
    ) -> Result<(), DeviceError> {
        if dst.len() != rows.len() * width || rows.iter().any(|&r| (r + 1) * width > src.len()) {
            return Err(shape(format!("copy of rows {rows:?} of {width} into {}", dst.len())));
        }
        for (d, &r) in dst.chunks_exact_mut(width).zip(rows) {
            d.copy_from_slice(&src[r * width..(r + 1) * width]);
        }
        Ok(())
    }

    fn log_softmax(&self, x: &Vec<f32>, y: &mut Vec<f32>, n: usize) -> Result<(), DeviceError> {
        if n == 0 || y.len() != x.len() || !x.len().is_multiple_of(n) {
            return Err(shape(format!("log-softmax of {} values in rows of {n}", x.len())));
        }
        y.copy_from_slice(x);
        CPU.log_softmax_rows(y, n);
        Ok(())
    }

    fn argmax(&self, x: &Vec<f32>, ids: &mut Vec<u32>, n: usize) -> Result<(), DeviceError> {
        for (id, row) in ids.iter_mut().zip(x.chunks_exact(n)) {
            let mut best = 0;
            for (j, &v) in row.iter().enumerate() {
                if v > row[best] {
                    best = j;
                }
            }
            *id = best as u32;
        }
        Ok(())
    }
}
