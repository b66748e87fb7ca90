//! Paged decode attention: one new query row per sequence against a KV cache stored in
//! fixed-size blocks ([`crate::kv_cache`], whose [`kv_write`] stores new rows).
//!
//! The cache is `k_cache`, `v_cache` `[num_blocks, block_size, n_kv_heads, d_head]` (row-major
//! f32). Each sequence owns blocks listed in its row of a block table `[seqs, max_blocks]`
//! (`u32` block ids, in any order: blocks come from a shared pool), and has `ctx_lens[s]`
//! cached keys; its key `j` lives in slot `table[s, j / block_size] · block_size +
//! j % block_size`. For queries `q` `[seqs, n_heads, d_head]` the output `o`
//! `[seqs, n_heads, d_head]` is
//!
//! `o[s, h] = Σ_{j < ctx_s} softmax_j(scale · q[s, h] · k_j) v_j`, with kv head
//! `h / (n_heads / n_kv_heads)` (grouped-query attention).
//!
//! One workgroup serves the query heads that share a kv head (up to 8), so each cached row is
//! read once per group, not once per head. Long contexts are split (flash-decoding):
//! partitions of `partition` keys are computed in parallel, each writing its partial max
//! `m_p`, sum `l_p` and unnormalised accumulator into a [`DecodeScratch`], then a reduce kernel
//! merges them:
//! `M = max m_p`, `o = Σ_p acc_p e^(m_p − M) / Σ_p l_p e^(m_p − M)`.
//! When one partition covers every sequence's context (`max_blocks · block_size ≤
//! partition`), the first pass writes `o = acc / l` itself and there is no reduce dispatch:
//! one dispatch, the same arithmetic (one partition's weight `e^(m − m)` is 1).
//!
//! Block ids and context lengths are read on the device and not checked against the cache's
//! size: an out-of-range id reads or writes within the buffer's bounds (wgpu's robust buffer
//! access), never outside it, but gives meaningless results.

use crate::buffer::GpuBuffer;
use crate::device::Gpu;
use crate::dispatch::Kernel;
use crate::error::GpuError;
use crate::flash_attention::check_heads;
pub use crate::kv_cache::{kv_write, BlockTable, PagedCache};

const PARTIAL: Kernel = Kernel {
    name: "paged_partial",
    source: include_str!("shaders/paged_partial.wgsl"),
};

const REDUCE: Kernel = Kernel {
    name: "paged_reduce",
    source: include_str!("shaders/paged_reduce.wgsl"),
};

/// The default keys per partition of the split-K pass.
pub const DEFAULT_PARTITION: usize = 256;
/// The most keys per partition (the scores of a partition stay in workgroup memory).
pub const MAX_PARTITION: usize = 1024;

/// Device memory for the partial results of the split-K pass, sized for up to `rows`
/// (sequence, head) pairs of `d_head` over up to `max_context` keys.
#[derive(Debug)]
pub struct DecodeScratch {
    ml: GpuBuffer<f32>,
    acc: GpuBuffer<f32>,
    partition: usize,
}

impl DecodeScratch {
    /// Scratch for `seqs × n_heads` rows of `d_head` and contexts up to `max_context` keys,
    /// split into partitions of `partition` keys (1..=[`MAX_PARTITION`]).
    pub fn new(
        gpu: &Gpu,
        seqs: usize,
        n_heads: usize,
        d_head: usize,
        max_context: usize,
        partition: usize,
    ) -> Result<DecodeScratch, GpuError> {
        if partition == 0 || partition > MAX_PARTITION {
            return Err(GpuError::Shape {
                op: "paged_attention",
                problem: format!("a partition of {partition} keys outside 1..={MAX_PARTITION}"),
            });
        }
        let parts = max_context.div_ceil(partition).max(1);
        let rows = seqs * n_heads * parts;
        Ok(DecodeScratch {
            ml: gpu.zeros(2 * rows)?,
            acc: gpu.zeros(rows * d_head)?,
            partition,
        })
    }
}

/// How a query's scores are formed and which keys it sees: `s = scale · q · k`, then
/// `c · tanh(s / c)` with a soft cap `c` (Gemma 2); with a sliding window `w` only the last
/// `w` keys of the context (the query is at position `ctx − 1`: keys `ctx − w .. ctx`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scores {
    pub scale: f32,
    pub window: Option<usize>,
    pub softcap: Option<f32>,
}

/// Records paged decode attention for one query row per sequence (see the module's
/// equations): `q` and `o` `[seqs, n_heads, d_head]` (two buffers), `ctx_lens` `[seqs]`. One
/// dispatch when one partition of `scratch` covers `max_blocks · block_size` keys, two
/// otherwise.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    gpu: &Gpu,
    q: &GpuBuffer<f32>,
    cache: PagedCache<'_>,
    table: BlockTable<'_>,
    ctx_lens: &GpuBuffer<u32>,
    o: &GpuBuffer<f32>,
    n_heads: usize,
    scale: f32,
    scratch: &DecodeScratch,
) -> Result<(), GpuError> {
    let scores = Scores {
        scale,
        window: None,
        softcap: None,
    };
    paged_attention_scored(gpu, q, cache, table, ctx_lens, o, n_heads, scores, scratch)
}

/// [`paged_attention`] with a sliding window and a soft cap of the scores ([`Scores`]).
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_scored(
    gpu: &Gpu,
    q: &GpuBuffer<f32>,
    cache: PagedCache<'_>,
    table: BlockTable<'_>,
    ctx_lens: &GpuBuffer<u32>,
    o: &GpuBuffer<f32>,
    n_heads: usize,
    scores: Scores,
    scratch: &DecodeScratch,
) -> Result<(), GpuError> {
    paged_attention_passes(
        gpu, q, cache, table, ctx_lens, o, n_heads, scores, scratch, true,
    )
}

/// [`paged_attention`], in one pass where one partition covers the contexts only when
/// `single_pass` (the tests compare the two).
#[allow(clippy::too_many_arguments)]
pub(crate) fn paged_attention_passes(
    gpu: &Gpu,
    q: &GpuBuffer<f32>,
    cache: PagedCache<'_>,
    table: BlockTable<'_>,
    ctx_lens: &GpuBuffer<u32>,
    o: &GpuBuffer<f32>,
    n_heads: usize,
    scores: Scores,
    scratch: &DecodeScratch,
    single_pass: bool,
) -> Result<(), GpuError> {
    let op = "paged_attention";
    let Scores {
        scale,
        window,
        softcap,
    } = scores;
    if window == Some(0) || softcap.is_some_and(|c| !(c > 0.0 && c.is_finite())) {
        return Err(GpuError::Shape {
            op,
            problem: format!("a window of {window:?} keys or a soft cap of {softcap:?}"),
        });
    }
    let window = u32::try_from(window.unwrap_or(0)).unwrap_or(u32::MAX);
    let d = cache.d_head;
    check_heads(op, n_heads, cache.n_kv_heads, d)?;
    cache.check(op)?;
    let seqs = table.seqs(op)?;
    let err = |problem: String| Err(GpuError::Shape { op, problem });
    if ctx_lens.len() != seqs {
        return err(format!(
            "{} context lengths for {seqs} block-table rows",
            ctx_lens.len()
        ));
    }
    if q.len() != seqs * n_heads * d || o.len() != q.len() {
        return err(format!(
            "q {} and o {} for {seqs} sequences × {n_heads} heads × {d}",
            q.len(),
            o.len()
        ));
    }
    let parts = (table.max_blocks * cache.block_size)
        .div_ceil(scratch.partition)
        .max(1);
    let rows = seqs * n_heads;
    if scratch.ml.len() < 2 * rows * parts || scratch.acc.len() < rows * parts * d {
        return err(format!(
            "scratch too small for {rows} rows × {parts} partitions × {d}"
        ));
    }
    if q.raw == o.raw {
        return err("o must be another buffer than q".into());
    }
    if rows == 0 {
        return Ok(());
    }
    let direct = single_pass && parts == 1;
    // Query heads per workgroup: those sharing a kv head, up to what workgroup memory holds.
    let group = n_heads / cache.n_kv_heads;
    let gt = group
        .min(8)
        .min(2048 / scratch.partition)
        .min(1024 / d)
        .max(1);
    let head_tiles = group.div_ceil(gt);
    let words = [
        seqs as u32,
        n_heads as u32,
        cache.n_kv_heads as u32,
        d as u32,
        cache.block_size as u32,
        table.max_blocks as u32,
        parts as u32,
        scratch.partition as u32,
        scale.to_bits(),
        gt as u32,
        head_tiles as u32,
        (256 / gt.next_power_of_two()) as u32,
        direct as u32,
        window,
        softcap.unwrap_or(0.0).to_bits(),
        0,
    ];
    let groups = seqs * cache.n_kv_heads * head_tiles * parts;
    gpu.record(
        PARTIAL,
        &[],
        bytemuck::cast_slice(&words),
        &[
            &q.raw,
            &cache.k.raw,
            &cache.v.raw,
            &table.ids.raw,
            &ctx_lens.raw,
            &scratch.ml.raw,
            &scratch.acc.raw,
            &o.raw,
        ],
        gpu.grid(groups as u32),
    );
    if direct {
        return Ok(());
    }
    let words = [rows as u32, parts as u32, d as u32];
    gpu.record(
        REDUCE,
        &[],
        bytemuck::cast_slice(&words),
        &[&scratch.ml.raw, &scratch.acc.raw, &o.raw],
        gpu.grid(rows as u32),
    );
    Ok(())
}

#[cfg(test)]
#[path = "paged_attention_tests.rs"]
mod tests;
