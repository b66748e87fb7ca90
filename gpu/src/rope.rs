//! Rotary position embeddings (RoPE), in place on queries or keys `x` `[rows, heads, d_head]`
//! (row-major f32), each row at its own position (a `u32` buffer `[rows]`, so one call serves a
//! batch of requests at different depths):
//!
//! `(x_a, x_b) ← f · (x_a cos φ − x_b sin φ, x_a sin φ + x_b cos φ)`, `φ = pos · θ_i`, for each
//! rotated pair `i < r/2` of the first `r ≤ d_head` dimensions (partial rotary leaves the rest
//! untouched), with the pairs of [`RopeLayout`] and the attention factor `f` (1 but for YaRN).
//!
//! The inverse frequencies `θ_i` are computed on the host in f64 and uploaded ([`RopeFreqs`]):
//! scaled variants (Llama 3, YaRN, NTK) upload their own. They travel as 64-bit binary
//! fractions of `θ_i / 2π`, so the kernel reduces `pos · θ_i` modulo 2π exactly in integer
//! arithmetic and takes the f32 sine and cosine of an angle in `[−π, π)`: the rotation is as
//! accurate at position 10⁶ as at 0.

use crate::buffer::GpuBuffer;
use crate::device::Gpu;
use crate::dispatch::Kernel;
use crate::error::GpuError;
use crate::kv_cache::{BlockTable, PagedCache};

const ROPE: Kernel = Kernel {
    name: "rope",
    source: concat!(
        include_str!("shaders/rope_fns.wgsl"),
        include_str!("shaders/rope.wgsl")
    ),
};

const ROPE_KV_WRITE: Kernel = Kernel {
    name: "rope_kv_write",
    source: concat!(
        include_str!("shaders/rope_fns.wgsl"),
        include_str!("shaders/rope_kv_write.wgsl")
    ),
};

/// Which dimensions form the rotated pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// `(i, i + r/2)`: GPT-NeoX's `rotate_half`, Hugging Face's Llama, Qwen, Mistral.
    HalfSplit,
    /// `(2i, 2i + 1)`: GPT-J and the original RoPE, llama.cpp's "normal" mode.
    Interleaved,
}

/// The inverse frequencies `θ_i`, `i < r/2`, on the device, and the attention factor.
#[derive(Debug)]
pub struct RopeFreqs {
    turns: GpuBuffer<u32>,
    pairs: usize,
    factor: f32,
}

impl RopeFreqs {
    /// Uploads `inv_freq` (`θ_i` in radians per position; rotating `r = 2 · inv_freq.len()`
    /// dimensions), each as the 64-bit fraction of `θ_i / 2π` (whole turns dropped).
    pub fn new(gpu: &Gpu, inv_freq: &[f64]) -> Result<RopeFreqs, GpuError> {
        if inv_freq.is_empty() || inv_freq.iter().any(|f| !f.is_finite() || *f < 0.0) {
            return Err(GpuError::Shape {
                op: "rope",
                problem: "inverse frequencies must be finite, non-negative and not empty".into(),
            });
        }
        let mut words = Vec::with_capacity(2 * inv_freq.len());
        for &f in inv_freq {
            let t = f / std::f64::consts::TAU;
            let frac = t - t.floor();
            // 53 significant bits of the fraction, as a 64-bit fixed-point number.
            let fixed = ((frac * (1u64 << 53) as f64) as u64) << 11;
            words.push((fixed >> 32) as u32);
            words.push(fixed as u32);
        }
        Ok(RopeFreqs {
            turns: gpu.upload(&words)?,
            pairs: inv_freq.len(),
            factor: 1.0,
        })
    }

    /// The standard frequencies `θ_i = theta^(−2i/r)` over `rotary_dims = r` (even) dims.
    pub fn standard(gpu: &Gpu, theta: f64, rotary_dims: usize) -> Result<RopeFreqs, GpuError> {
        if rotary_dims == 0 || !rotary_dims.is_multiple_of(2) {
            return Err(GpuError::Shape {
                op: "rope",
                problem: format!("rotary dims {rotary_dims} must be even and positive"),
            });
        }
        let inv: Vec<f64> = (0..rotary_dims / 2)
            .map(|i| theta.powf(-((2 * i) as f64) / rotary_dims as f64))
            .collect();
        RopeFreqs::new(gpu, &inv)
    }

    /// Multiplies the rotated dimensions by `factor` (YaRN's attention factor scales cos and
    /// sin).
    pub fn with_attention_factor(mut self, factor: f32) -> RopeFreqs {
        self.factor = factor;
        self
    }

    /// `r`: the dimensions rotated (twice the frequencies).
    pub fn rotary_dims(&self) -> usize {
        2 * self.pairs
    }
}

/// Records the rotation of `x` `[rows, heads, d_head]` in place, row `j` at `positions[j]`.
pub fn rope(
    gpu: &Gpu,
    x: &GpuBuffer<f32>,
    positions: &GpuBuffer<u32>,
    freqs: &RopeFreqs,
    heads: usize,
    d_head: usize,
    layout: RopeLayout,
) -> Result<(), GpuError> {
    let rows = positions.len();
    let shape = |problem: String| {
        Err(GpuError::Shape {
            op: "rope",
            problem,
        })
    };
    if freqs.rotary_dims() > d_head {
        return shape(format!(
            "{} rotary dims exceed d_head {d_head}",
            freqs.rotary_dims()
        ));
    }
    if x.len() != rows * heads * d_head {
        return shape(format!(
            "x has {} elements, not {rows} positions × {heads} heads × {d_head}",
            x.len()
        ));
    }
    let total = rows * heads * freqs.pairs;
    if total == 0 {
        return Ok(());
    }
    let total = u32::try_from(total).map_err(|_| GpuError::Shape {
        op: "rope",
        problem: format!("{total} pairs exceed u32"),
    })?;
    let words = [
        total,
        heads as u32,
        d_head as u32,
        freqs.pairs as u32,
        (layout == RopeLayout::Interleaved) as u32,
        freqs.factor.to_bits(),
    ];
    gpu.record(
        ROPE,
        &[],
        bytemuck::cast_slice(&words),
        &[&x.raw, &positions.raw, &freqs.turns.raw],
        gpu.grid(total.div_ceil(256)),
    );
    Ok(())
}

/// Records RoPE fused with the KV-cache store, for `qkv` `[rows, n_heads + 2·n_kv_heads,
/// d_head]` (each row its query heads, then key heads, then value heads: the output of a
/// Q‖K‖V [`crate::products::stacked_product`]), row `r` at position `row_pos[r]` of sequence
/// `row_seq[r]`, in one dispatch:
///
/// - `q_out[r, h] = rope(q[r, h], row_pos[r])` for the `n_heads` query heads (`q_out`
///   `[rows, n_heads, d_head]`, what [`crate::paged_attention`] reads);
/// - `k_cache[slot, h] = rope(k[r, h], row_pos[r])` and `v_cache[slot, h] = v[r, h]` for the
///   kv heads, `slot = table[row_seq[r], pos / block_size] · block_size + pos % block_size`.
///
/// `rope` is [`rope`]'s rotation (same arithmetic, so the same bits as [`rope`] on q and k
/// followed by [`crate::kv_cache::kv_write`]); `qkv` is only read.
#[allow(clippy::too_many_arguments)]
pub fn rope_kv_write(
    gpu: &Gpu,
    qkv: &GpuBuffer<f32>,
    q_out: &GpuBuffer<f32>,
    row_seq: &GpuBuffer<u32>,
    row_pos: &GpuBuffer<u32>,
    freqs: &RopeFreqs,
    n_heads: usize,
    layout: RopeLayout,
    cache: PagedCache<'_>,
    table: BlockTable<'_>,
) -> Result<(), GpuError> {
    const OP: &str = "rope_kv_write";
    cache.check(OP)?;
    table.seqs(OP)?;
    let (n_kv, d) = (cache.n_kv_heads, cache.d_head);
    let rows = row_pos.len();
    let shape = |problem: String| Err(GpuError::Shape { op: OP, problem });
    if freqs.rotary_dims() > d {
        return shape(format!(
            "{} rotary dims exceed d_head {d}",
            freqs.rotary_dims()
        ));
    }
    if row_seq.len() != rows
        || qkv.len() != rows * (n_heads + 2 * n_kv) * d
        || q_out.len() != rows * n_heads * d
    {
        return shape(format!(
            "qkv {} and q_out {} for {} sequence ids, {rows} positions of {n_heads} query \
             heads and {n_kv} kv heads × {d}",
            qkv.len(),
            q_out.len(),
            row_seq.len()
        ));
    }
    if qkv.raw == q_out.raw {
        return shape("q_out must be another buffer than qkv".into());
    }
    if qkv.is_empty() {
        return Ok(());
    }
    let total = u32::try_from(qkv.len()).map_err(|_| GpuError::Shape {
        op: OP,
        problem: format!("{} elements exceed u32", qkv.len()),
    })?;
    let words = [
        total,
        n_heads as u32,
        n_kv as u32,
        d as u32,
        freqs.pairs as u32,
        (layout == RopeLayout::Interleaved) as u32,
        freqs.factor.to_bits(),
        cache.block_size as u32,
        table.max_blocks as u32,
        0,
        0,
        0,
    ];
    gpu.record(
        ROPE_KV_WRITE,
        &[],
        bytemuck::cast_slice(&words),
        &[
            &qkv.raw,
            &row_pos.raw,
            &freqs.turns.raw,
            &row_seq.raw,
            &table.ids.raw,
            &q_out.raw,
            &cache.k.raw,
            &cache.v.raw,
        ],
        gpu.grid(total.div_ceil(256)),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_close, gpu, rand_vec};

    #[allow(clippy::too_many_arguments)]
    fn rope_ref(
        x: &[f32],
        pos: &[u32],
        inv: &[f64],
        heads: usize,
        d: usize,
        layout: RopeLayout,
        factor: f64,
    ) -> Vec<f64> {
        let mut y: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let half = inv.len();
        for (r, &p) in pos.iter().enumerate() {
            for h in 0..heads {
                let base = (r * heads + h) * d;
                for (i, &f) in inv.iter().enumerate() {
                    let (a, b) = match layout {
                        RopeLayout::HalfSplit => (base + i, base + i + half),
                        RopeLayout::Interleaved => (base + 2 * i, base + 2 * i + 1),
                    };
                    let (s, c) = (p as f64 * f).sin_cos();
                    let (x0, x1) = (y[a], y[b]);
                    y[a] = factor * (x0 * c - x1 * s);
                    y[b] = factor * (x0 * s + x1 * c);
                }
            }
        }
        y
    }

    #[test]
    fn rope_matches_f64_in_both_layouts_full_and_partial() {
        let Some(gpu) = gpu() else { return };
        let positions: Vec<u32> = vec![0, 1, 7, 4095, 100_000, 1_000_000, 33];
        // (heads, d_head, rotary dims, theta)
        let cases = [
            (1, 2, 2, 10_000.0),
            (3, 6, 4, 10_000.0),
            (4, 64, 64, 10_000.0),
            (2, 80, 32, 500_000.0),
            (2, 256, 256, 1_000_000.0),
        ];
        for (heads, d, rot, theta) in cases {
            for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
                for rows in [1usize, positions.len()] {
                    let pos = &positions[positions.len() - rows..];
                    let x = rand_vec(rows * heads * d, d as u64);
                    let inv: Vec<f64> = (0..rot / 2)
                        .map(|i| f64::powf(theta, -((2 * i) as f64) / rot as f64))
                        .collect();
                    let freqs = RopeFreqs::standard(gpu, theta, rot).unwrap();
                    let (dx, dp) = (gpu.upload(&x).unwrap(), gpu.upload(pos).unwrap());
                    rope(gpu, &dx, &dp, &freqs, heads, d, layout).unwrap();
                    let want = rope_ref(&x, pos, &inv, heads, d, layout, 1.0);
                    let what = format!("rope {rows}x{heads}x{d} rot {rot} {layout:?}");
                    assert_close(&gpu.read(&dx).unwrap(), &want, 1e-5, 2e-6, &what);
                }
            }
        }
    }

    #[test]
    fn scaled_frequencies_and_the_attention_factor() {
        let Some(gpu) = gpu() else { return };
        // Any uploaded frequencies (here YaRN-like: some slowed by 8) and a factor.
        let inv: Vec<f64> = (0..32)
            .map(|i| 10_000f64.powf(-(i as f64) / 32.0) / if i > 16 { 8.0 } else { 1.0 })
            .collect();
        let pos: Vec<u32> = (0..300).map(|i| i * 997).collect();
        let (heads, d) = (3, 64);
        let x = rand_vec(pos.len() * heads * d, 12);
        let freqs = RopeFreqs::new(gpu, &inv)
            .unwrap()
            .with_attention_factor(1.1);
        let (dx, dp) = (gpu.upload(&x).unwrap(), gpu.upload(&pos).unwrap());
        rope(gpu, &dx, &dp, &freqs, heads, d, RopeLayout::HalfSplit).unwrap();
        let want = rope_ref(
            &x,
            &pos,
            &inv,
            heads,
            d,
            RopeLayout::HalfSplit,
            1.1f32 as f64,
        );
        assert_close(&gpu.read(&dx).unwrap(), &want, 1e-5, 2e-6, "scaled rope");
    }

    #[test]
    fn rope_kv_write_is_rope_then_kv_write() {
        use crate::kv_cache::kv_write;
        let Some(gpu) = gpu() else { return };
        // (n_heads, n_kv, d, rotary dims, block size): GQA, MHA, partial rotary, odd d.
        let cases = [
            (6, 2, 10, 6, 3),
            (4, 4, 8, 8, 4),
            (3, 1, 7, 4, 5),
            (8, 2, 64, 64, 16),
        ];
        let seqs = [1u32, 0, 2, 1, 0];
        let pos = [0u32, 9, 4, 13, 2];
        let max_blocks = 5;
        for (n_heads, n_kv, d, rot, bs) in cases {
            for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
                let rows = pos.len();
                let width = (n_heads + 2 * n_kv) * d;
                let qkv = rand_vec(rows * width, (n_heads * d + rot) as u64);
                let part = |from: usize, heads: usize| -> Vec<f32> {
                    (0..rows)
                        .flat_map(|r| qkv[r * width + from * d..][..heads * d].to_vec())
                        .collect()
                };
                let (q, k, v) = (
                    part(0, n_heads),
                    part(n_heads, n_kv),
                    part(n_heads + n_kv, n_kv),
                );
                // Each sequence's blocks, distinct, shuffled.
                let table: Vec<u32> = (0..3 * max_blocks as u32).map(|i| (i * 7) % 15).collect();
                let num_blocks = 15;
                let cache_len = num_blocks * bs * n_kv * d;
                let freqs = RopeFreqs::standard(gpu, 10_000.0, rot).unwrap();
                let up = |x: &[f32]| gpu.upload(x).unwrap();
                let (dt, ds, dp) = (
                    gpu.upload(&table).unwrap(),
                    gpu.upload(&seqs).unwrap(),
                    gpu.upload(&pos).unwrap(),
                );
                let bt = BlockTable {
                    ids: &dt,
                    max_blocks,
                };
                let run = |fused: bool| -> (Vec<f32>, Vec<f32>, Vec<f32>) {
                    let (kc, vc) = (up(&vec![0.5; cache_len]), up(&vec![0.5; cache_len]));
                    let cache = PagedCache {
                        k: &kc,
                        v: &vc,
                        block_size: bs,
                        n_kv_heads: n_kv,
                        d_head: d,
                    };
                    let dq = if fused {
                        let dq = gpu.zeros::<f32>(q.len()).unwrap();
                        let dqkv = up(&qkv);
                        rope_kv_write(
                            gpu, &dqkv, &dq, &ds, &dp, &freqs, n_heads, layout, cache, bt,
                        )
                        .unwrap();
                        dq
                    } else {
                        let (dq, dk, dv) = (up(&q), up(&k), up(&v));
                        rope(gpu, &dq, &dp, &freqs, n_heads, d, layout).unwrap();
                        rope(gpu, &dk, &dp, &freqs, n_kv, d, layout).unwrap();
                        kv_write(gpu, cache, bt, &dk, &dv, &ds, &dp).unwrap();
                        dq
                    };
                    (
                        gpu.read(&dq).unwrap(),
                        gpu.read(&kc).unwrap(),
                        gpu.read(&vc).unwrap(),
                    )
                };
                let (fused, unfused) = (run(true), run(false));
                let what = format!("{n_heads}/{n_kv} heads × {d}, rot {rot}, {layout:?}");
                assert_eq!(fused.0, unfused.0, "q, {what}");
                assert_eq!(fused.1, unfused.1, "k cache, {what}");
                assert_eq!(fused.2, unfused.2, "v cache, {what}");
            }
        }
    }

    #[test]
    fn rope_shape_errors() {
        let Some(gpu) = gpu() else { return };
        let freqs = RopeFreqs::standard(gpu, 10_000.0, 8).unwrap();
        let x = gpu.zeros::<f32>(2 * 2 * 8).unwrap();
        let pos = gpu.upload(&[0u32, 1]).unwrap();
        let e = rope(gpu, &x, &pos, &freqs, 2, 6, RopeLayout::HalfSplit).unwrap_err();
        assert!(
            e.to_string().contains("8 rotary dims exceed d_head 6"),
            "{e}"
        );
        let e = rope(gpu, &x, &pos, &freqs, 3, 8, RopeLayout::HalfSplit).unwrap_err();
        assert!(
            e.to_string().contains("not 2 positions × 3 heads × 8"),
            "{e}"
        );
        assert!(RopeFreqs::standard(gpu, 10_000.0, 5).is_err());
    }
}
