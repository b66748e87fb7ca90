//! What every model step on a [`Device`] shares outside its blocks: the layout of a step's
//! tokens (each token's block-table row, position and context, uploaded as ids) and the token
//! embedding with its added positions and the output head.

use super::embedding::Embedding;
use super::head::OutputHead;
use crate::backend::{Device, DeviceError, KvShape, StepRows, WeightSource};

/// Positions per KV block.
pub const BLOCK_SIZE: usize = 16;

/// Token `i` of a step: its row of block ids `table[i · max_blocks ..]`, its position and
/// the keys it sees (`ctx`).
pub(super) struct Layout {
    pub(super) pos: Vec<u32>,
    pub(super) ctx: Vec<u32>,
    pub(super) table: Vec<u32>,
    pub(super) max_blocks: usize,
}

/// A [`Layout`] on the device.
pub(super) struct Uploaded<D: Device> {
    seq: D::Ids,
    pub(super) pos: D::Ids,
    ctx: D::Ids,
    table: D::Ids,
    max_blocks: usize,
    max_ctx: usize,
    tokens: usize,
}

impl Layout {
    /// Every token of each sequence of `lens`, its own sequence's blocks (consecutive, from
    /// 0) and the whole sequence its context (an encoder, or a source); returns the layout and
    /// the blocks used.
    pub(super) fn whole_sequences(lens: &[usize]) -> (Layout, usize) {
        let max_blocks = lens.iter().map(|l| l.div_ceil(BLOCK_SIZE)).max().unwrap_or(1).max(1);
        let mut l = Layout {
            pos: Vec::new(),
            ctx: Vec::new(),
            table: Vec::new(),
            max_blocks,
        };
        let mut next = 0u32;
        for &len in lens {
            let n = len.div_ceil(BLOCK_SIZE) as u32;
            let row: Vec<u32> = (0..max_blocks as u32)
                .map(|b| if b < n { next + b } else { 0 })
                .collect();
            for p in 0..len {
                l.pos.push(p as u32);
                l.ctx.push(len as u32);
                l.table.extend_from_slice(&row);
            }
            next += n;
        }
        (l, next as usize)
    }

    /// Sequence `r`'s row of blocks in a [`whole_sequences`](Self::whole_sequences) layout of
    /// `lens` (its first token's).
    pub(super) fn row_of(&self, lens: &[usize], r: usize) -> &[u32] {
        let first: usize = lens[..r].iter().sum();
        &self.table[first * self.max_blocks..][..self.max_blocks]
    }

    /// The ids the device reads: each token its own table row (`seq[i] = i`).
    pub(super) fn upload<D: Device>(&self, d: &D) -> Result<Uploaded<D>, DeviceError> {
        let tokens = self.pos.len();
        let seq: Vec<u32> = (0..tokens as u32).collect();
        Ok(Uploaded {
            seq: d.upload_ids(&seq)?,
            pos: d.upload_ids(&self.pos)?,
            ctx: d.upload_ids(&self.ctx)?,
            table: d.upload_ids(&self.table)?,
            max_blocks: self.max_blocks,
            max_ctx: self.ctx.iter().copied().max().unwrap_or(1) as usize,
            tokens,
        })
    }
}

impl<D: Device> Uploaded<D> {
    /// The step's rows as the device calls take them.
    pub(super) fn rows(&self) -> StepRows<'_, D> {
        StepRows {
            seq: &self.seq,
            pos: &self.pos,
            ctx: &self.ctx,
            table: &self.table,
            max_blocks: self.max_blocks,
            max_ctx: self.max_ctx,
            tokens: self.tokens,
        }
    }
}

/// The token embedding on a device, its factor, its added positions (learned rows or the
/// sinusoids, `None` with rotary positions) and the output head (`None`: tied to the table,
/// which is then multiplied as uploaded: one copy in device memory).
pub(super) struct DeviceEmbedding<D: Device> {
    table: D::Weight,
    scale: f32,
    positions: Option<D::Weight>,
    head: Option<D::Weight>,
    d_model: usize,
}

impl<D: Device> DeviceEmbedding<D> {
    /// Uploads `embedding` (its positions for `positions` rows) and `head`.
    pub(super) fn upload(
        device: &D,
        embedding: &Embedding<f32>,
        head: &OutputHead<f32>,
        positions: usize,
    ) -> Result<Self, DeviceError> {
        let d_model = embedding.d_model;
        if head.bias.is_some() {
            let what = "a bias on the output projection (Marian's final_logits_bias)";
            return Err(super::device_block::unsupported(device, what.into()));
        }
        let positions = match embedding.position_table(positions) {
            Some(rows) => Some(device.weight(
                "embedding.positions",
                &[WeightSource::floats(&rows, positions, d_model)],
            )?),
            None => None,
        };
        let head = match head.output_proj.is_some() {
            true => Some(device.weight(
                "output_proj",
                &[WeightSource::Layer(head.weight_ref(embedding))],
            )?),
            false => None,
        };
        Ok(DeviceEmbedding {
            table: device.weight("embedding", &[embedding.table_source()])?,
            scale: embedding.token_scale() as f32,
            positions,
            head,
            d_model,
        })
    }

    /// `E[ids] · s (+ P[pos])` `[tokens, d_model]`, as the model's embedding computes it.
    pub(super) fn embed(
        &self,
        d: &D,
        ids: &D::Ids,
        pos: &D::Ids,
        n: usize,
    ) -> Result<D::Tensor, DeviceError> {
        let mut h = d.zeros(n * self.d_model)?;
        d.gather(&mut h, ids, &self.table)?;
        if self.scale != 1.0 {
            d.scale(&mut h, self.scale)?;
        }
        if let Some(table) = &self.positions {
            // h ← h + P[pos] (into a new buffer: a device call does not read and write one).
            let (mut rows, mut sum) = (d.zeros(n * self.d_model)?, d.zeros(n * self.d_model)?);
            d.gather(&mut rows, pos, table)?;
            d.add(&mut sum, &h, &rows)?;
            h = sum;
        }
        Ok(h)
    }

    /// The head's matrix `W [vocab, d_model]`: its own, or the embedding table.
    pub(super) fn head(&self) -> &D::Weight {
        self.head.as_ref().unwrap_or(&self.table)
    }
}

/// `layers` layers' KV storage of `blocks` blocks of [`BLOCK_SIZE`] positions each, for keys
/// and values of `(n_kv_heads, d_head)`.
pub(super) fn kv_blocks<D: Device>(
    d: &D,
    layers: usize,
    blocks: usize,
    shape: (usize, usize),
) -> Result<Vec<D::Kv>, DeviceError> {
    kv_blocks_of(d, layers, (blocks, BLOCK_SIZE), shape)
}

/// [`kv_blocks`] with blocks of `block_size` positions.
pub(super) fn kv_blocks_of<D: Device>(
    d: &D,
    layers: usize,
    (blocks, block_size): (usize, usize),
    (n_kv_heads, d_head): (usize, usize),
) -> Result<Vec<D::Kv>, DeviceError> {
    let shape = KvShape {
        blocks,
        block_size,
        n_kv_heads,
        d_head,
    };
    (0..layers).map(|_| d.kv_blocks(shape)).collect()
}
