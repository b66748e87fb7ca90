//! The paged KV cache: its layout, its block table, and the kernel that stores new rows.
//!
//! The cache is `k`, `v` `[num_blocks, block_size, n_kv_heads, d_head]` (row-major f32), a pool
//! of fixed-size blocks shared by the sequences. Each sequence lists its blocks, in any order,
//! in its row of a block table `[seqs, max_blocks]` of `u32` ids; its position `pos` lives in
//! slot `table[seq, pos / block_size] · block_size + pos % block_size`. [`kv_write`] stores a
//! step's new rows there ([`crate::rope::rope_kv_write`] rotates the keys and stores them in
//! the same dispatch, from a Q‖K‖V product's output); [`crate::paged_attention`] reads them.

use crate::buffer::GpuBuffer;
use crate::device::Gpu;
use crate::dispatch::Kernel;
use crate::error::GpuError;

const KV_WRITE: Kernel = Kernel {
    name: "kv_write",
    source: include_str!("shaders/kv_write.wgsl"),
};

/// A paged KV cache: `k` and `v` `[num_blocks, block_size, n_kv_heads, d_head]`.
#[derive(Clone, Copy, Debug)]
pub struct PagedCache<'a> {
    pub k: &'a GpuBuffer<f32>,
    pub v: &'a GpuBuffer<f32>,
    pub block_size: usize,
    pub n_kv_heads: usize,
    pub d_head: usize,
}

/// The block table `[seqs, max_blocks]` of block ids.
#[derive(Clone, Copy, Debug)]
pub struct BlockTable<'a> {
    pub ids: &'a GpuBuffer<u32>,
    pub max_blocks: usize,
}

impl PagedCache<'_> {
    pub(crate) fn check(&self, op: &'static str) -> Result<(), GpuError> {
        let row = self.block_size * self.n_kv_heads * self.d_head;
        if self.block_size == 0
            || row == 0
            || self.k.len() != self.v.len()
            || !self.k.len().is_multiple_of(row)
        {
            return Err(GpuError::Shape {
                op,
                problem: format!(
                    "caches of {} and {} are not blocks of {} × {} kv heads × {}",
                    self.k.len(),
                    self.v.len(),
                    self.block_size,
                    self.n_kv_heads,
                    self.d_head
                ),
            });
        }
        Ok(())
    }
}

impl BlockTable<'_> {
    /// The rows of the table (sequences).
    pub(crate) fn seqs(&self, op: &'static str) -> Result<usize, GpuError> {
        if self.max_blocks == 0 || !self.ids.len().is_multiple_of(self.max_blocks) {
            return Err(GpuError::Shape {
                op,
                problem: format!(
                    "a block table of {} is not rows of {} blocks",
                    self.ids.len(),
                    self.max_blocks
                ),
            });
        }
        Ok(self.ids.len() / self.max_blocks)
    }
}

/// Records the store of new rows `k_new`, `v_new` `[n_new, n_kv_heads, d_head]` into the
/// cache: row `r` of sequence `row_seq[r]` at position `row_pos[r]` goes to slot
/// `table[seq, pos / block_size] · block_size + pos % block_size`.
pub fn kv_write(
    gpu: &Gpu,
    cache: PagedCache<'_>,
    table: BlockTable<'_>,
    k_new: &GpuBuffer<f32>,
    v_new: &GpuBuffer<f32>,
    row_seq: &GpuBuffer<u32>,
    row_pos: &GpuBuffer<u32>,
) -> Result<(), GpuError> {
    let op = "kv_write";
    cache.check(op)?;
    table.seqs(op)?;
    let n_new = row_seq.len();
    let row_len = cache.n_kv_heads * cache.d_head;
    if row_pos.len() != n_new || k_new.len() != n_new * row_len || v_new.len() != k_new.len() {
        return Err(GpuError::Shape {
            op,
            problem: format!(
                "{} sequence ids, {} positions, k {} and v {} for rows of {} kv heads × {}",
                n_new,
                row_pos.len(),
                k_new.len(),
                v_new.len(),
                cache.n_kv_heads,
                cache.d_head
            ),
        });
    }
    let n = k_new.len() as u32;
    if n == 0 {
        return Ok(());
    }
    let words = [
        n,
        row_len as u32,
        cache.block_size as u32,
        table.max_blocks as u32,
    ];
    gpu.record(
        KV_WRITE,
        &[],
        bytemuck::cast_slice(&words),
        &[
            &k_new.raw,
            &v_new.raw,
            &row_seq.raw,
            &row_pos.raw,
            &table.ids.raw,
            &cache.k.raw,
            &cache.v.raw,
        ],
        gpu.grid(n.div_ceil(256)),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{gpu, rand_vec};

    #[test]
    fn kv_write_stores_rows_in_their_slots() {
        let Some(gpu) = gpu() else { return };
        let (bs, n_kv, d, max_blocks) = (4usize, 2usize, 3usize, 3usize);
        let num_blocks = 7;
        let row = n_kv * d;
        // Two sequences; rows at positions across block boundaries.
        let table: Vec<u32> = vec![5, 0, 3, 6, 2, 1];
        let rows = [(0u32, 0u32), (0, 3), (0, 4), (1, 11), (1, 5), (0, 9)];
        let k_new = rand_vec(rows.len() * row, 70);
        let v_new = rand_vec(rows.len() * row, 71);
        let dk = gpu.zeros::<f32>(num_blocks * bs * row).unwrap();
        let dv = gpu.zeros::<f32>(num_blocks * bs * row).unwrap();
        let cache = PagedCache {
            k: &dk,
            v: &dv,
            block_size: bs,
            n_kv_heads: n_kv,
            d_head: d,
        };
        let dt = gpu.upload(&table).unwrap();
        let bt = BlockTable {
            ids: &dt,
            max_blocks,
        };
        let seq: Vec<u32> = rows.iter().map(|r| r.0).collect();
        let pos: Vec<u32> = rows.iter().map(|r| r.1).collect();
        let (dkn, dvn) = (gpu.upload(&k_new).unwrap(), gpu.upload(&v_new).unwrap());
        let (ds, dp) = (gpu.upload(&seq).unwrap(), gpu.upload(&pos).unwrap());
        kv_write(gpu, cache, bt, &dkn, &dvn, &ds, &dp).unwrap();
        let mut want_k = vec![0.0f32; num_blocks * bs * row];
        let mut want_v = want_k.clone();
        for (r, &(s, p)) in rows.iter().enumerate() {
            let (s, p) = (s as usize, p as usize);
            let slot = table[s * max_blocks + p / bs] as usize * bs + p % bs;
            want_k[slot * row..][..row].copy_from_slice(&k_new[r * row..][..row]);
            want_v[slot * row..][..row].copy_from_slice(&v_new[r * row..][..row]);
        }
        assert_eq!(gpu.read(&dk).unwrap(), want_k);
        assert_eq!(gpu.read(&dv).unwrap(), want_v);
    }
}
