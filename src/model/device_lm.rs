//! The decoder-only language model's inference step on a [`Device`]: the same model as
//! [`LanguageModel`], its weights uploaded once into the device's memory, its keys and values
//! in blocks there, and every operation of a step a device call (one submission per step on a
//! GPU: the token ids go in, the sampled ids or the logits of the rows that need them come
//! out). Written once over the trait: the [`Host`](crate::backend::Host) device runs it on
//! the CPU (the reference the tests compare with the model's own step), the GPU device on any
//! Vulkan, Metal or DX12 adapter.
//!
//! A pre-norm block of the model (section 3.1 with the norm moved inside the residual), per
//! token at position `p` of its row:
//!
//! ```text
//! u = Norm₁(h);  q, k, v = u W_qᵀ, u W_kᵀ, u W_vᵀ;  K, V ← RoPE(k, p), v
//! h ← h + softmax(RoPE(q, p) Kᵀ / √d_k) V W_oᵀ
//! h ← h + FFN(Norm₂(h))                FFN(u) = (act(u W_gateᵀ) ⊙ u W_upᵀ) W_downᵀ
//! ```
//!
//! then `logits = Norm(h) Eᵀ` (or the head's own matrix). The paper's post-LN blocks,
//! `h ← Norm(h + Sublayer(h))` with no final norm, and positions added to the embeddings
//! (learned rows as GPT-2's, or the sinusoids of section 3.5) run through the same calls. The residual adds are fused with the
//! next norm ([`Device::add_norm`]), Q‖K‖V is one stacked product, RoPE is fused with the
//! store into the key/value blocks, and the gated unit with its product.
//!
//! What a model needs that this step does not do yet is refused by name when it is built
//! ([`DeviceLm::new`]): biases of a gated FFN, sparse or linear attention, head gates, pre-LN
//! and post-LN sublayers mixed.

use super::config::{NormPlacement, Positions};
use super::device_block::{
    check_block, run_stack, unsupported, upload_block, DeviceBlock, DeviceFfn, DeviceNorm,
};
pub use super::device_rows::BLOCK_SIZE;
use super::device_rows::{kv_blocks, DeviceEmbedding, Layout};
use super::lm::LanguageModel;
use crate::backend::{Device, DeviceError};

/// A language model's weights on a device (see the module docs).
pub struct DeviceLm<D: Device> {
    pub device: D,
    d_model: usize,
    vocab: usize,
    n_kv_heads: usize,
    d_head: usize,
    max_len: usize,
    /// The token table with its factor and positions, and the head.
    embedding: DeviceEmbedding<D>,
    /// Post-LN blocks (the paper's): `x ← Norm(x + Sublayer(x))`, no final norm.
    post_ln: bool,
    blocks: Vec<DeviceBlock<D>>,
    /// Pre-LN's final norm.
    final_norm: Option<DeviceNorm<D>>,
    /// The logits' soft cap `c · tanh(z / c)` (Gemma 2).
    logit_softcap: Option<f64>,
}

/// The rows a [`DeviceLm`] decodes: every layer's KV blocks on the device, and per row one
/// block table that every layer shares, with the row's length.
pub struct DeviceLmState<D: Device> {
    kv: Vec<D::Kv>,
    free: Vec<u32>,
    tables: Vec<Vec<u32>>,
    lens: Vec<usize>,
    /// Positions a row may hold.
    capacity: usize,
}

impl<D: Device> DeviceLmState<D> {
    /// Positions fed to row `r` so far.
    pub fn row_len(&self, r: usize) -> usize {
        self.lens[r]
    }

    /// Empties row `r`, its blocks back to the pool.
    pub fn clear_row(&mut self, r: usize) {
        self.free.append(&mut self.tables[r]);
        self.lens[r] = 0;
    }

    /// Rows of the state.
    pub fn rows(&self) -> usize {
        self.lens.len()
    }

    /// Adds an empty row at the end; its index.
    pub fn add_row(&mut self) -> usize {
        self.tables.push(Vec::new());
        self.lens.push(0);
        self.lens.len() - 1
    }

    /// Keeps the rows `kept` (ascending indices), in that order; the others' blocks go back to
    /// the pool.
    pub fn keep_rows(&mut self, kept: &[usize]) {
        let mut tables = std::mem::take(&mut self.tables);
        let lens = std::mem::take(&mut self.lens);
        for &r in kept {
            self.tables.push(std::mem::take(&mut tables[r]));
            self.lens.push(lens[r]);
        }
        for mut table in tables {
            self.free.append(&mut table);
        }
    }

    /// Blocks the rows hold now (of [`BLOCK_SIZE`] positions in every layer).
    pub fn blocks_in_use(&self) -> usize {
        self.tables.iter().map(Vec::len).sum()
    }
}

/// What a step returns for its output positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// The logits `[outputs, vocab]`, read back.
    Logits,
    /// Their log-softmax `[outputs, vocab]`, computed on the device and read back (scoring).
    LogProbs,
    /// The arg-max ids `[outputs]`, computed on the device (greedy decoding reads 4 bytes a row).
    Argmax,
}

/// A step's result (see [`Want`]).
#[derive(Clone, Debug, PartialEq)]
pub enum StepOut {
    Logits(Vec<f32>),
    Ids(Vec<u32>),
}

impl<D: Device> DeviceLm<D> {
    /// Uploads `model` to `device`, or names what it has that the device step does not do.
    pub fn new(device: D, model: &LanguageModel<f32>) -> Result<DeviceLm<D>, DeviceError> {
        check(&device, model)?;
        let first = &model.blocks.layers[0].self_attn;
        let (n_kv_heads, d_head) = (first.n_kv_heads, first.d_head);
        let mut blocks = Vec::with_capacity(model.blocks.layers.len());
        for (i, layer) in model.blocks.layers.iter().enumerate() {
            blocks.push(upload_block(&device, i, layer)?);
        }
        let final_norm = match &model.blocks.final_norm {
            Some(n) => Some(DeviceNorm::upload(&device, n)?),
            None => None,
        };
        // Added positions (learned rows, or the sinusoids): a table of the run's context.
        let embedding =
            DeviceEmbedding::upload(&device, &model.embedding, &model.head, model.max_len())?;
        let post_ln = model.blocks.layers[0].self_attn_res.placement == NormPlacement::PostLn;
        Ok(DeviceLm {
            d_model: model.config.d_model,
            vocab: model.config.vocab_size,
            n_kv_heads,
            d_head,
            max_len: model.max_len(),
            embedding,
            post_ln,
            blocks,
            final_norm,
            logit_softcap: model.head.softcap,
            device,
        })
    }

    /// Entries of each distribution.
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// Bytes of keys and values a position takes in device memory (every layer, f32).
    pub fn kv_bytes_per_position(&self) -> usize {
        2 * self.blocks.len() * self.n_kv_heads * self.d_head * 4
    }

    /// Dispatches of a decoder layer's step on a device that records one per operation: the
    /// (add +) norm, Q‖K‖V, RoPE + KV store, attention, W_o, add + norm, the FFN's products
    /// (gated: 2; plain: 3 with the activation), and one more for each bias, query/key norm
    /// and post-norm of the layer (layer 0's; a GPU's stacked products of mixed formats and
    /// split attention add to it).
    pub fn dispatches_per_layer(&self) -> usize {
        let b = &self.blocks[0];
        let ffn = match &b.ffn {
            DeviceFfn::Gated { down_bias, .. } => 2 + down_bias.is_some() as usize,
            DeviceFfn::Plain {
                up_bias, down_bias, ..
            } => 3 + up_bias.is_some() as usize + down_bias.is_some() as usize,
        };
        let extra = [
            b.qkv_bias.is_some(),
            b.out_bias.is_some(),
            b.qk_norm.is_some(),
            b.attn_post_norm.is_some(),
            b.ffn_post_norm.is_some(),
        ];
        6 + ffn + extra.iter().filter(|&&x| x).count()
    }

    /// The longest sequence the model takes.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// An empty state of `rows` rows of up to `capacity` positions each (at most
    /// [`max_len`](Self::max_len)), its KV blocks allocated on the device now.
    pub fn start(&self, rows: usize, capacity: usize) -> Result<DeviceLmState<D>, DeviceError> {
        let capacity = capacity.clamp(1, self.max_len.max(1));
        let per_row = capacity.div_ceil(BLOCK_SIZE);
        let blocks = rows * per_row;
        let kv = kv_blocks(&self.device, self.blocks.len(), blocks, (self.n_kv_heads, self.d_head))?;
        Ok(DeviceLmState {
            kv,
            free: (0..blocks as u32).rev().collect(),
            tables: vec![Vec::new(); rows],
            lens: vec![0; rows],
            capacity,
        })
    }

    /// An empty state (rows come with [`DeviceLmState::add_row`]) over a pool of `blocks`
    /// KV blocks allocated on the device now, each row up to the model's context: a server's
    /// rows share the pool, a row taking blocks as it grows.
    pub fn start_pool(&self, blocks: usize) -> Result<DeviceLmState<D>, DeviceError> {
        let kv = kv_blocks(&self.device, self.blocks.len(), blocks, (self.n_kv_heads, self.d_head))?;
        Ok(DeviceLmState {
            kv,
            free: (0..blocks as u32).rev().collect(),
            tables: Vec::new(),
            lens: Vec::new(),
            capacity: self.max_len.max(1),
        })
    }

    /// Feeds `tokens`, token `i` continuing row `rows[i]` at that row's next position (a row's
    /// tokens in order), and returns what `want` asks for at the tokens `outputs` (indices
    /// into `tokens`).
    pub fn step(
        &self,
        state: &mut DeviceLmState<D>,
        tokens: &[u32],
        rows: &[usize],
        outputs: &[usize],
        want: Want,
    ) -> Result<StepOut, DeviceError> {
        let n = tokens.len();
        let d = &self.device;
        let bad = |what: String| DeviceError::Device(format!("device step: {what}"));
        if rows.len() != n || outputs.iter().any(|&o| o >= n) || n == 0 {
            return Err(bad(format!("{n} tokens, {} rows, outputs {outputs:?}", rows.len())));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(bad(format!("token id {t} is outside the vocabulary of {}", self.vocab)));
        }
        // Each token's position, and blocks for the positions it reaches.
        let mut positions = Vec::with_capacity(n);
        let mut next = state.lens.clone();
        for &r in rows {
            let Some(len) = next.get_mut(r) else {
                return Err(bad(format!("row {r} of a state of {}", state.lens.len())));
            };
            if *len >= state.capacity {
                return Err(bad(format!("row {r} is full ({} positions)", state.capacity)));
            }
            positions.push(*len);
            *len += 1;
            while state.tables[r].len() * BLOCK_SIZE < *len {
                let block = state.free.pop().ok_or_else(|| bad("no free KV block".into()))?;
                state.tables[r].push(block);
            }
        }
        state.lens = next;
        let max_blocks = rows.iter().map(|&r| state.tables[r].len()).max().unwrap_or(1).max(1);
        let mut table = vec![0u32; n * max_blocks];
        for (i, &r) in rows.iter().enumerate() {
            let t = &state.tables[r];
            table[i * max_blocks..i * max_blocks + t.len()].copy_from_slice(t);
        }
        let pos: Vec<u32> = positions.iter().map(|&p| p as u32).collect();
        let layout = Layout {
            ctx: pos.iter().map(|p| p + 1).collect(),
            pos,
            table,
            max_blocks,
        };
        let (ids, step) = (d.upload_ids(tokens)?, layout.upload(d)?);
        let h = self.embedding.embed(d, &ids, &step.pos, n)?;
        let hidden = run_stack(
            d,
            &self.blocks,
            self.post_ln,
            self.final_norm.as_ref(),
            (self.n_kv_heads, self.d_head),
            (h, self.d_model),
            &step.rows(),
            &mut state.kv,
            None,
        )?;
        let m = outputs.len();
        let mut picked = d.zeros(m * self.d_model)?;
        d.copy_rows(&mut picked, &hidden, outputs, self.d_model)?;
        let mut logits = d.zeros(m * self.vocab)?;
        d.product(&mut logits, &picked, m, self.embedding.head())?;
        if let Some(c) = self.logit_softcap {
            d.softcap(&mut logits, c)?;
        }
        match want {
            Want::Logits => Ok(StepOut::Logits(d.read(&logits)?)),
            Want::LogProbs => {
                let mut logprobs = d.zeros(m * self.vocab)?;
                d.log_softmax(&logits, &mut logprobs, self.vocab)?;
                Ok(StepOut::Logits(d.read(&logprobs)?))
            }
            Want::Argmax => {
                let mut ids = d.upload_ids(&vec![0; m])?;
                d.argmax(&logits, &mut ids, self.vocab)?;
                Ok(StepOut::Ids(d.read_ids(&ids)?))
            }
        }
    }
}


/// Refuses, by name, what the device step does not do (see the module docs).
fn check<D: Device>(device: &D, model: &LanguageModel<f32>) -> Result<(), DeviceError> {
    let no = |what: &str| Err(unsupported(device, what.into()));
    let c = &model.config;
    if model.blocks.layers.is_empty() {
        return no("a model without layers");
    }
    let post_ln = model.blocks.layers[0].self_attn_res.placement == NormPlacement::PostLn;
    if post_ln == model.blocks.final_norm.is_some() {
        return no("pre-LN blocks without a final norm, or post-LN blocks with one");
    }
    if c.positions == Positions::Learned && model.embedding.position_rows() == 0 {
        return no("learned positions without their table");
    }
    if c.gated_delta.is_some() {
        return no("a hybrid stack's Gated DeltaNet (linear-attention) layers (Qwen3.5)");
    }
    if model.head.divisor.is_some() {
        return no("logits divided by logits_scaling (Granite)");
    }
    let shape = &model.blocks.layers[0].self_attn;
    for (i, l) in model.blocks.layers.iter().enumerate() {
        if let Some(problem) = check_block(l, post_ln, (shape.n_kv_heads, shape.d_head)) {
            return no(&format!("layer {i}: {problem}"));
        }
    }
    Ok(())
}
