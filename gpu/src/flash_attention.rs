//! FlashAttention-2 for prefill: `O = softmax(Q Kᵀ · scale + mask) V` per head, never forming
//! the `q_len × kv_len` score matrix.
//!
//! Shapes (row-major f32): `q` and `o` `[q_len, n_heads, d_head]`, `k` and `v`
//! `[kv_len, n_kv_heads, d_head]`, `d_head ≤ 256`. Grouped-query attention: head `h` reads kv
//! head `h / (n_heads / n_kv_heads)`. Query `i` sits at absolute position `p_i = past + i`
//! (its `past` keys were cached before this chunk); key `j` is visible when
//! `j ≤ p_i` (causal) and `j > p_i − window` (sliding window), and masked keys get weight 0.
//! A query that sees no key gets a zero output.
//!
//! One workgroup per (tile of queries, head): the scaled Q tile in workgroup memory, K and V
//! streamed through it in tiles (only those some query of the tile can see, so causal and
//! windowed prefill skip the masked tiles), and each query's online softmax — running max `m`,
//! running sum `l`, accumulator rescaled by `exp(m_old − m_new)` — divided by `l` at the end.

use crate::buffer::GpuBuffer;
use crate::device::Gpu;
use crate::dispatch::Kernel;
use crate::error::GpuError;

const FLASH: Kernel = Kernel {
    name: "flash_attention",
    source: include_str!("shaders/flash_attention.wgsl"),
};

/// The largest head dimension the kernels take.
pub const MAX_D_HEAD: usize = 256;

/// The sizes of one attention call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    pub q_len: usize,
    pub kv_len: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub d_head: usize,
}

/// The scale and the mask.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnMask {
    /// Multiplies `Q Kᵀ` (usually `1/√d_head`).
    pub scale: f32,
    /// Keys after a query's position are masked.
    pub causal: bool,
    /// The absolute position of query 0 (keys cached before this chunk).
    pub past: usize,
    /// Sliding window: key `j` visible only when `j > p_i − window`.
    pub window: Option<usize>,
}

pub(crate) fn check_heads(
    op: &'static str,
    n_heads: usize,
    n_kv_heads: usize,
    d_head: usize,
) -> Result<(), GpuError> {
    let shape = |problem: String| Err(GpuError::Shape { op, problem });
    if n_heads == 0 || n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
        return shape(format!(
            "{n_heads} query heads are not groups of {n_kv_heads} kv heads"
        ));
    }
    if d_head == 0 || d_head > MAX_D_HEAD {
        return shape(format!("d_head {d_head} outside 1..={MAX_D_HEAD}"));
    }
    Ok(())
}

/// Records `o = softmax(q kᵀ · scale + mask) v` (see the module's equations).
pub fn flash_attention(
    gpu: &Gpu,
    q: &GpuBuffer<f32>,
    k: &GpuBuffer<f32>,
    v: &GpuBuffer<f32>,
    o: &GpuBuffer<f32>,
    shape: AttnShape,
    mask: AttnMask,
) -> Result<(), GpuError> {
    let AttnShape {
        q_len,
        kv_len,
        n_heads,
        n_kv_heads,
        d_head: d,
    } = shape;
    check_heads("flash_attention", n_heads, n_kv_heads, d)?;
    let err = |problem: String| {
        Err(GpuError::Shape {
            op: "flash_attention",
            problem,
        })
    };
    if q.len() != q_len * n_heads * d || o.len() != q.len() {
        return err(format!(
            "q {} and o {} for {q_len} queries × {n_heads} heads × {d}",
            q.len(),
            o.len()
        ));
    }
    if k.len() != kv_len * n_kv_heads * d || v.len() != k.len() {
        return err(format!(
            "k {} and v {} for {kv_len} keys × {n_kv_heads} kv heads × {d}",
            k.len(),
            v.len()
        ));
    }
    if mask.window == Some(0) {
        return err("a sliding window of 0 keys".into());
    }
    if q_len == 0 {
        return Ok(());
    }
    // Tiles: bq·d ≤ 1024 with bq a power of two dividing 256, bk·d ≤ 1024, bq·bk ≤ 512.
    let bq = (1024 / d).clamp(1, 32);
    let bq = 1usize << bq.ilog2();
    let bk = (1024 / d).clamp(1, 512 / bq);
    let q_tiles = q_len.div_ceil(bq);
    let groups = q_tiles * n_heads;
    // A window reaching past position 0 for every query masks nothing (0: none), and keeps
    // `j + window` within u32 in the kernel.
    let window = mask.window.filter(|&w| w < mask.past + q_len).unwrap_or(0);
    let words = [
        q_len as u32,
        kv_len as u32,
        n_heads as u32,
        n_kv_heads as u32,
        d as u32,
        mask.scale.to_bits(),
        mask.past as u32,
        mask.causal as u32,
        window as u32,
        bq as u32,
        bk as u32,
        q_tiles as u32,
    ];
    gpu.record(
        FLASH,
        &[],
        bytemuck::cast_slice(&words),
        &[&q.raw, &k.raw, &v.raw, &o.raw],
        gpu.grid(groups as u32),
    );
    Ok(())
}

/// Float64 attention written from the equation, for the tests of this module and of paged
/// attention: `q` `[q_len, n_heads, d]`, `k`/`v` `[kv_len, n_kv, d]`.
#[cfg(test)]
pub(crate) fn attention_ref(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: AttnShape,
    mask: AttnMask,
) -> Vec<f64> {
    attention_ref_capped(q, k, v, shape, mask, None)
}

/// [`attention_ref`] with the scaled scores soft-capped, `c · tanh(s / c)`.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn attention_ref_capped(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: AttnShape,
    mask: AttnMask,
    softcap: Option<f64>,
) -> Vec<f64> {
    let AttnShape {
        q_len,
        kv_len,
        n_heads,
        n_kv_heads,
        d_head: d,
    } = shape;
    let group = n_heads / n_kv_heads;
    let mut o = vec![0.0f64; q_len * n_heads * d];
    for i in 0..q_len {
        let pos = mask.past + i;
        for h in 0..n_heads {
            let kvh = h / group;
            let qrow = &q[(i * n_heads + h) * d..][..d];
            let visible: Vec<usize> = (0..kv_len)
                .filter(|&j| !mask.causal || j <= pos)
                .filter(|&j| mask.window.is_none_or(|w| j > pos || pos - j < w))
                .collect();
            let scores: Vec<f64> = visible
                .iter()
                .map(|&j| {
                    let krow = &k[(j * n_kv_heads + kvh) * d..][..d];
                    let dot: f64 = qrow
                        .iter()
                        .zip(krow)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum();
                    let s = dot * mask.scale as f64;
                    softcap.map_or(s, |c| c * (s / c).tanh())
                })
                .collect();
            let m = scores.iter().fold(f64::NEG_INFINITY, |m, &s| m.max(s));
            let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let total: f64 = w.iter().sum();
            let out = &mut o[(i * n_heads + h) * d..][..d];
            for (&j, &wj) in visible.iter().zip(&w) {
                let vrow = &v[(j * n_kv_heads + kvh) * d..][..d];
                for (o, &x) in out.iter_mut().zip(vrow) {
                    *o += wj / total * x as f64;
                }
            }
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_close, gpu, rand_vec};

    fn run(shape: AttnShape, mask: AttnMask, seed: u64) {
        let gpu = gpu().unwrap();
        let AttnShape {
            q_len,
            kv_len,
            n_heads,
            n_kv_heads,
            d_head: d,
        } = shape;
        // Scores of a few units: a peaked softmax, not a uniform one.
        let q: Vec<f32> = rand_vec(q_len * n_heads * d, seed)
            .iter()
            .map(|x| x * 2.0)
            .collect();
        let k = rand_vec(kv_len * n_kv_heads * d, seed + 1);
        let v = rand_vec(kv_len * n_kv_heads * d, seed + 2);
        let (dq, dk, dv) = (
            gpu.upload(&q).unwrap(),
            gpu.upload(&k).unwrap(),
            gpu.upload(&v).unwrap(),
        );
        let o = gpu.zeros::<f32>(q.len()).unwrap();
        flash_attention(gpu, &dq, &dk, &dv, &o, shape, mask).unwrap();
        let want = attention_ref(&q, &k, &v, shape, mask);
        let what = format!("{shape:?} {mask:?}");
        assert_close(&gpu.read(&o).unwrap(), &want, 1e-4, 1e-5, &what);
    }

    fn shape(q_len: usize, kv_len: usize, n_heads: usize, n_kv: usize, d: usize) -> AttnShape {
        AttnShape {
            q_len,
            kv_len,
            n_heads,
            n_kv_heads: n_kv,
            d_head: d,
        }
    }

    fn mask(d: usize, causal: bool, past: usize, window: Option<usize>) -> AttnMask {
        AttnMask {
            scale: 1.0 / (d as f32).sqrt(),
            causal,
            past,
            window,
        }
    }

    #[test]
    fn causal_prefill_with_gqa_matches_f64() {
        if gpu().is_none() {
            return;
        }
        run(shape(1, 1, 1, 1, 1), mask(1, true, 0, None), 1);
        run(shape(7, 7, 4, 2, 64), mask(64, true, 0, None), 2);
        run(shape(70, 70, 2, 1, 128), mask(128, true, 0, None), 3);
        run(shape(33, 33, 3, 3, 80), mask(80, true, 0, None), 4);
    }

    #[test]
    fn causal_with_an_offset_continues_a_cache() {
        if gpu().is_none() {
            return;
        }
        run(shape(5, 12, 2, 1, 96), mask(96, true, 7, None), 5);
        run(shape(17, 300, 8, 2, 32), mask(32, true, 283, None), 6);
        // A single new query over a long cache.
        run(shape(1, 257, 4, 4, 64), mask(64, true, 256, None), 7);
    }

    #[test]
    fn bidirectional_and_sliding_window() {
        if gpu().is_none() {
            return;
        }
        run(shape(33, 45, 2, 2, 16), mask(16, false, 0, None), 8);
        run(shape(40, 40, 3, 1, 64), mask(64, true, 0, Some(9)), 9);
        run(shape(9, 50, 2, 1, 8), mask(8, true, 41, Some(20)), 10);
        // Fewer keys than queries, all visible.
        run(shape(20, 6, 2, 1, 32), mask(32, false, 0, None), 14);
        // A window longer than the context masks nothing.
        run(
            shape(5, 9, 1, 1, 16),
            mask(16, true, 4, Some(usize::MAX)),
            17,
        );
    }

    #[test]
    fn a_long_prefill_over_many_tiles() {
        if gpu().is_none() {
            return;
        }
        run(shape(300, 300, 2, 1, 64), mask(64, true, 0, None), 15);
        run(
            shape(257, 400, 4, 2, 32),
            mask(32, true, 143, Some(128)),
            16,
        );
    }

    #[test]
    fn head_dims_up_to_256() {
        if gpu().is_none() {
            return;
        }
        run(shape(9, 9, 2, 1, 256), mask(256, true, 0, None), 11);
        run(shape(6, 11, 1, 1, 200), mask(200, true, 5, None), 12);
        run(shape(3, 3, 1, 1, 3), mask(3, false, 0, None), 13);
    }

    #[test]
    fn shape_errors() {
        let Some(gpu) = gpu() else { return };
        let b = gpu.zeros::<f32>(16).unwrap();
        let e = flash_attention(
            gpu,
            &b,
            &b,
            &b,
            &b,
            shape(1, 1, 3, 2, 16),
            mask(16, true, 0, None),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("3 query heads are not groups of 2"),
            "{e}"
        );
        let e = flash_attention(
            gpu,
            &b,
            &b,
            &b,
            &b,
            shape(1, 1, 1, 1, 300),
            mask(1, true, 0, None),
        )
        .unwrap_err();
        assert!(e.to_string().contains("d_head 300 outside"), "{e}");
        let e = flash_attention(
            gpu,
            &b,
            &b,
            &b,
            &b,
            shape(2, 1, 1, 1, 16),
            mask(16, true, 0, None),
        )
        .unwrap_err();
        assert!(e.to_string().contains("q 16 and o 16 for 2 queries"), "{e}");
    }
}
