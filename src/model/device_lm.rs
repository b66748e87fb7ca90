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

use super::config::{Activation, NormPlacement, Positions};
use super::linear::Linear;
use super::lm::LanguageModel;
use super::norm::Norm;
use crate::backend::{
    AttnScores, Device, DeviceAct, DeviceError, KvShape, NormOf, StepRows, WeightSource,
};

/// Positions per KV block.
pub const BLOCK_SIZE: usize = 16;

/// A norm's parameters on the device.
struct DeviceNorm<D: Device> {
    gain: D::Tensor,
    /// LayerNorm's β; `None` for RMSNorm.
    bias: Option<D::Tensor>,
    eps: f64,
}

impl<D: Device> DeviceNorm<D> {
    fn upload(device: &D, norm: &Norm<f32>) -> Result<Self, DeviceError> {
        Ok(match norm {
            Norm::Rms(n) => {
                let o = n.offset as f32;
                let gain: Vec<f32> = n.gain.value.data.iter().map(|g| g + o).collect();
                DeviceNorm {
                    gain: device.upload(&gain)?,
                    bias: None,
                    eps: n.eps,
                }
            }
            Norm::Layer(n) => DeviceNorm {
                gain: device.upload(&n.gamma.value.data)?,
                bias: Some(device.upload(&n.beta.value.data)?),
                eps: n.eps,
            },
        })
    }

    fn of(&self) -> NormOf<'_, D> {
        match &self.bias {
            None => NormOf::Rms {
                gain: &self.gain,
                eps: self.eps,
            },
            Some(bias) => NormOf::Layer {
                gain: &self.gain,
                bias,
                eps: self.eps,
            },
        }
    }
}

/// The feed-forward unit's weights on the device.
enum DeviceFfn<D: Device> {
    /// `(act(u W_gateᵀ) ⊙ u W_upᵀ) W_downᵀ`, gate‖up stacked.
    Gated {
        act: DeviceAct,
        gate_up: D::Weight,
        down: D::Weight,
        down_bias: Option<D::Tensor>,
    },
    /// `act(u W_1ᵀ + b_1) W_2ᵀ + b_2`.
    Plain {
        act: DeviceAct,
        up: D::Weight,
        up_bias: Option<D::Tensor>,
        down: D::Weight,
        down_bias: Option<D::Tensor>,
    },
}

/// A linear layer's bias on the device, if it has one.
fn bias<D: Device>(device: &D, l: &Linear<f32>) -> Result<Option<D::Tensor>, DeviceError> {
    l.bias.as_ref().map(|b| device.upload(&b.value.data)).transpose()
}

/// One block's weights on the device.
struct DeviceBlock<D: Device> {
    attn_norm: DeviceNorm<D>,
    /// `[W_q; W_k; W_v]` and, when any has one, `[b_q; b_k; b_v]` (zeros for the others).
    qkv: D::Weight,
    qkv_bias: Option<D::Tensor>,
    out: D::Weight,
    out_bias: Option<D::Tensor>,
    rope: D::Rope,
    /// The scores' factor (`1/√d_k` unless the model says otherwise), window and soft cap.
    scores: AttnScores,
    /// Query/key norms: the gains (offset included) and ε.
    qk_norm: Option<(D::Tensor, D::Tensor, f64)>,
    /// Norms of the attention's and the FFN's outputs before they are added (Gemma's).
    attn_post_norm: Option<DeviceNorm<D>>,
    ffn_post_norm: Option<DeviceNorm<D>>,
    n_heads: usize,
    ffn_norm: DeviceNorm<D>,
    ffn: DeviceFfn<D>,
    d_ff: usize,
}

/// A language model's weights on a device (see the module docs).
pub struct DeviceLm<D: Device> {
    pub device: D,
    d_model: usize,
    vocab: usize,
    n_kv_heads: usize,
    d_head: usize,
    max_len: usize,
    embedding: D::Weight,
    /// The token embedding's factor (1, √d_model, or the config's).
    embedding_scale: f32,
    /// The rows added to the embeddings at each position (learned or sinusoidal), `None`
    /// with rotary positions.
    positions: Option<D::Weight>,
    /// Post-LN blocks (the paper's): `x ← Norm(x + Sublayer(x))`, no final norm.
    post_ln: bool,
    blocks: Vec<DeviceBlock<D>>,
    /// Pre-LN's final norm.
    final_norm: Option<DeviceNorm<D>>,
    /// The head's own matrix; `None` when tied to the embedding table.
    head: Option<D::Weight>,
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
            let a = &layer.self_attn;
            let what = |w: &str| format!("layers.{i}.{w}");
            let qkv = device.weight(
                &what("self_attn.qkv_proj"),
                &[
                    WeightSource::Layer(a.q_proj.weight_ref()),
                    WeightSource::Layer(a.k_proj.weight_ref()),
                    WeightSource::Layer(a.v_proj.weight_ref()),
                ],
            )?;
            let projections = [&a.q_proj, &a.k_proj, &a.v_proj];
            let qkv_bias = match projections.iter().any(|l| l.bias.is_some()) {
                true => {
                    let mut b = Vec::new();
                    for l in projections {
                        match &l.bias {
                            Some(p) => b.extend_from_slice(&p.value.data),
                            None => b.resize(b.len() + l.d_out, 0.0),
                        }
                    }
                    Some(device.upload(&b)?)
                }
                false => None,
            };
            let out = device.weight(&what("self_attn.out_proj"), &[WeightSource::Layer(a.out_proj.weight_ref())])?;
            let f = &layer.ffn;
            let down = device.weight(&what("ffn.linear2"), &[WeightSource::Layer(f.linear2.weight_ref())])?;
            let down_bias = bias(&device, &f.linear2)?;
            let ffn = match (f.activation, &f.gate) {
                (Activation::SiluGated | Activation::GeluTanhGated, Some(gate)) => DeviceFfn::Gated {
                    act: match f.activation {
                        Activation::SiluGated => DeviceAct::Silu,
                        _ => DeviceAct::GeluTanh,
                    },
                    gate_up: device.weight(
                        &what("ffn.gate_up"),
                        &[
                            WeightSource::Layer(gate.weight_ref()),
                            WeightSource::Layer(f.linear1.weight_ref()),
                        ],
                    )?,
                    down,
                    down_bias,
                },
                (act, _) => DeviceFfn::Plain {
                    act: match act {
                        Activation::Relu => DeviceAct::Relu,
                        Activation::GeluErf => DeviceAct::GeluErf,
                        _ => DeviceAct::GeluTanh,
                    },
                    up: device.weight(&what("ffn.linear1"), &[WeightSource::Layer(f.linear1.weight_ref())])?,
                    up_bias: bias(&device, &f.linear1)?,
                    down,
                    down_bias,
                },
            };
            blocks.push(DeviceBlock {
                attn_norm: DeviceNorm::upload(&device, &layer.self_attn_res.norm)?,
                qkv,
                qkv_bias,
                out,
                out_bias: bias(&device, &a.out_proj)?,
                rope: device.rope_table(a.rotary.then_some(a.rope), &a.rope_freq_factors, a.d_head)?,
                scores: AttnScores {
                    scale: a.scores.scale.unwrap_or(1.0 / (a.d_head as f64).sqrt()),
                    window: a.window,
                    softcap: a.scores.softcap,
                },
                qk_norm: match (&a.q_norm, &a.k_norm) {
                    (Some(q), Some(k)) => {
                        let gain = |n: &super::norm::RmsNorm<f32>| -> Vec<f32> {
                            let o = n.offset as f32;
                            n.gain.value.data.iter().map(|g| g + o).collect()
                        };
                        Some((device.upload(&gain(q))?, device.upload(&gain(k))?, q.eps))
                    }
                    _ => None,
                },
                attn_post_norm: layer
                    .self_attn_res
                    .post_norm
                    .as_ref()
                    .map(|n| DeviceNorm::upload(&device, n))
                    .transpose()?,
                ffn_post_norm: layer
                    .ffn_res
                    .post_norm
                    .as_ref()
                    .map(|n| DeviceNorm::upload(&device, n))
                    .transpose()?,
                n_heads: a.n_heads,
                ffn_norm: DeviceNorm::upload(&device, &layer.ffn_res.norm)?,
                ffn,
                d_ff: f.linear1.d_out,
            });
        }
        let final_norm = match &model.blocks.final_norm {
            Some(n) => Some(DeviceNorm::upload(&device, n)?),
            None => None,
        };
        // Added positions (learned rows, or the sinusoids): a table of the run's context.
        let positions = match model.embedding.position_table(model.max_len()) {
            Some(rows) => Some(device.weight(
                "embedding.positions",
                &[WeightSource::Layer(crate::backend::WeightRef {
                    w: &rows,
                    d_in: model.config.d_model,
                    d_out: model.max_len(),
                    transposed: None,
                    packed: None,
                    bf16: None,
                })],
            )?),
            None => None,
        };
        let post_ln = model.blocks.layers[0].self_attn_res.placement == NormPlacement::PostLn;
        let embedding = device.weight("embedding", &[model.embedding.table_source()])?;
        // A tied head multiplies the embedding table as uploaded (one copy in device memory).
        let head = match model.head.output_proj.is_some() {
            true => Some(device.weight(
                "output_proj",
                &[WeightSource::Layer(model.head.weight_ref(&model.embedding))],
            )?),
            false => None,
        };
        Ok(DeviceLm {
            d_model: model.config.d_model,
            vocab: model.config.vocab_size,
            n_kv_heads,
            d_head,
            max_len: model.max_len(),
            embedding,
            embedding_scale: model.embedding.token_scale() as f32,
            positions,
            post_ln,
            blocks,
            final_norm,
            head,
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
        let shape = KvShape {
            blocks,
            block_size: BLOCK_SIZE,
            n_kv_heads: self.n_kv_heads,
            d_head: self.d_head,
        };
        let kv = (0..self.blocks.len())
            .map(|_| self.device.kv_blocks(shape))
            .collect::<Result<_, _>>()?;
        Ok(DeviceLmState {
            kv,
            free: (0..blocks as u32).rev().collect(),
            tables: vec![Vec::new(); rows],
            lens: vec![0; rows],
            capacity,
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
        let ctx: Vec<u32> = pos.iter().map(|p| p + 1).collect();
        let seq: Vec<u32> = (0..n as u32).collect();
        let (ids, seq, pos, ctx, table) = (
            d.upload_ids(tokens)?,
            d.upload_ids(&seq)?,
            d.upload_ids(&pos)?,
            d.upload_ids(&ctx)?,
            d.upload_ids(&table)?,
        );
        let step_rows = StepRows {
            seq: &seq,
            pos: &pos,
            ctx: &ctx,
            table: &table,
            max_blocks,
            max_ctx: positions.iter().max().map_or(1, |p| p + 1),
            tokens: n,
        };
        let dm = self.d_model;
        let mut h = d.zeros(n * dm)?;
        d.gather(&mut h, &ids, &self.embedding)?;
        if self.embedding_scale != 1.0 {
            d.scale(&mut h, self.embedding_scale)?;
        }
        let mut normed = d.zeros(n * dm)?;
        let mut y = d.zeros(n * dm)?;
        let mut o = d.zeros(n * dm)?;
        if let Some(table) = &self.positions {
            // h ← h + P[pos] (o holds the sum, then becomes h).
            let mut rows = d.zeros(n * dm)?;
            d.gather(&mut rows, &pos, table)?;
            d.add(&mut o, &h, &rows)?;
            std::mem::swap(&mut h, &mut o);
        }
        let posts = self.blocks.iter().any(|b| b.attn_post_norm.is_some() || b.ffn_post_norm.is_some());
        let mut post = match posts {
            true => Some(d.zeros(n * dm)?),
            false => None,
        };
        let mut sized: Option<(usize, usize, Sized<D>)> = None;
        for (l, block) in self.blocks.iter().enumerate() {
            // Pre-LN: the sublayer reads Norm(h) (the previous layer's output added first);
            // post-LN: h itself, normed after each add below.
            if !self.post_ln {
                let norm = block.attn_norm.of();
                match l {
                    0 => d.norm(norm, &h, &mut normed)?,
                    _ => d.add_norm(norm, &mut h, &y, &mut normed)?,
                }
            }
            let key = (block.n_heads, block.d_ff);
            if sized.as_ref().map(|s| (s.0, s.1)) != Some(key) {
                let heads = n * block.n_heads * self.d_head;
                sized = Some((
                    key.0,
                    key.1,
                    Sized {
                        qkv: d.zeros(n * (block.n_heads + 2 * self.n_kv_heads) * self.d_head)?,
                        q: d.zeros(heads)?,
                        att: d.zeros(heads)?,
                        f: d.zeros(n * block.d_ff)?,
                    },
                ));
            }
            let s = &mut sized.as_mut().expect("just sized").2;
            let input = if self.post_ln { &h } else { &normed };
            d.product(&mut s.qkv, input, n, &block.qkv)?;
            if let Some(b) = &block.qkv_bias {
                d.add_bias(&mut s.qkv, b)?;
            }
            if let Some((gq, gk, eps)) = &block.qk_norm {
                let width = (block.n_heads + 2 * self.n_kv_heads) * self.d_head;
                d.head_norm(&mut s.qkv, width, (block.n_heads, self.n_kv_heads), gq, gk, *eps)?;
            }
            d.rope_kv_write(&s.qkv, &mut s.q, &step_rows, &block.rope, block.n_heads, &mut state.kv[l])?;
            d.paged_attention(&s.q, &state.kv[l], &step_rows, &mut s.att, block.n_heads, block.scores)?;
            d.product(&mut o, &s.att, n, &block.out)?;
            if let Some(b) = &block.out_bias {
                d.add_bias(&mut o, b)?;
            }
            if let (Some(norm), Some(p)) = (&block.attn_post_norm, post.as_mut()) {
                d.norm(norm.of(), &o, p)?;
                std::mem::swap(&mut o, p);
            }
            match self.post_ln {
                true => {
                    d.add_norm(block.attn_norm.of(), &mut h, &o, &mut normed)?;
                    std::mem::swap(&mut h, &mut normed);
                }
                false => d.add_norm(block.ffn_norm.of(), &mut h, &o, &mut normed)?,
            }
            let input = if self.post_ln { &h } else { &normed };
            match &block.ffn {
                DeviceFfn::Gated {
                    act,
                    gate_up,
                    down,
                    down_bias,
                } => {
                    d.glu_product(*act, &mut s.f, input, n, gate_up)?;
                    d.product(&mut y, &s.f, n, down)?;
                    if let Some(b) = down_bias {
                        d.add_bias(&mut y, b)?;
                    }
                }
                DeviceFfn::Plain {
                    act,
                    up,
                    up_bias,
                    down,
                    down_bias,
                } => {
                    d.product(&mut s.f, input, n, up)?;
                    if let Some(b) = up_bias {
                        d.add_bias(&mut s.f, b)?;
                    }
                    d.activate(*act, &mut s.f)?;
                    d.product(&mut y, &s.f, n, down)?;
                    if let Some(b) = down_bias {
                        d.add_bias(&mut y, b)?;
                    }
                }
            }
            if let (Some(norm), Some(p)) = (&block.ffn_post_norm, post.as_mut()) {
                d.norm(norm.of(), &y, p)?;
                std::mem::swap(&mut y, p);
            }
            if self.post_ln {
                d.add_norm(block.ffn_norm.of(), &mut h, &y, &mut normed)?;
                std::mem::swap(&mut h, &mut normed);
            }
        }
        // The last hidden states: pre-LN's final norm of h + y, or post-LN's h.
        let hidden = match &self.final_norm {
            Some(norm) if !self.post_ln => {
                d.add_norm(norm.of(), &mut h, &y, &mut normed)?;
                &normed
            }
            _ => &h,
        };
        let m = outputs.len();
        let mut picked = d.zeros(m * dm)?;
        d.copy_rows(&mut picked, hidden, outputs, dm)?;
        let mut logits = d.zeros(m * self.vocab)?;
        d.product(&mut logits, &picked, m, self.head.as_ref().unwrap_or(&self.embedding))?;
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

/// A step's buffers whose sizes follow a layer's heads and `d_ff`.
struct Sized<D: Device> {
    qkv: D::Tensor,
    q: D::Tensor,
    att: D::Tensor,
    f: D::Tensor,
}

/// Refuses, by name, what the device step does not do (see the module docs).
fn check<D: Device>(device: &D, model: &LanguageModel<f32>) -> Result<(), DeviceError> {
    let no = |what: &str| {
        Err(DeviceError::Unsupported {
            device: device.name(),
            what: format!("{what} (not on a device yet: use --device cpu)"),
        })
    };
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
    let kv = &model.blocks.layers[0].self_attn;
    for (i, l) in model.blocks.layers.iter().enumerate() {
        let a = &l.self_attn;
        let at = |what: &str| format!("layer {i}: {what}");
        let placement = |p: NormPlacement| (p == NormPlacement::PostLn) == post_ln;
        if !placement(l.self_attn_res.placement) || !placement(l.ffn_res.placement) {
            return no(&at("pre-LN and post-LN sublayers mixed"));
        }
        if post_ln && (l.self_attn_res.post_norm.is_some() || l.ffn_res.post_norm.is_some()) {
            return no(&at("post-norms in post-LN blocks"));
        }
        if a.pattern.is_some() || a.linear {
            return no(&at("sparse or linear attention"));
        }
        if a.q_norm.is_some() != a.k_norm.is_some() {
            return no(&at("a query norm without a key norm, or the reverse"));
        }
        if !a.gates.is_empty() {
            return no(&at("head gates"));
        }
        if (a.n_kv_heads, a.d_head) != (kv.n_kv_heads, kv.d_head) {
            return no(&at("key/value heads of another shape than layer 0's"));
        }
        if let Some(gate) = &l.ffn.gate {
            if gate.bias.is_some() || l.ffn.linear1.bias.is_some() {
                return no(&at("biases of a gated feed-forward"));
            }
        }
    }
    Ok(())
}
