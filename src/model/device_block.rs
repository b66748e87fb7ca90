//! One decoder (or encoder) block on a [`Device`]: its weights uploaded ([`upload_block`]) and
//! the layer loop of a step ([`run_stack`]), shared by the language model's step
//! (`super::device_lm`), the encoder's (`super::device_encoder`) and the translator's
//! (`super::device_seq2seq`). Per token, pre-LN:
//!
//! ```text
//! u = Norm₁(h);  q, k, v = u W_qᵀ (+ b), …;  [q, k ← QKNorm];  K, V ← RoPE(k, p), v
//! h ← h + [PostNorm](softmax(RoPE(q, p) Kᵀ · s) V W_oᵀ)
//! h ← h + [PostNorm](FFN(Norm₂(h)))      FFN(u) = (act(u W_gateᵀ) ⊙ u W_upᵀ) W_downᵀ
//! ```
//!
//! post-LN (the paper's): `h ← Norm₁(h + Attention(h))`, `h ← Norm₂(h + FFN(h))`. The residual
//! adds are fused with the next norm ([`Device::add_norm`]).

use super::attention::MultiHeadAttention;
use super::block::SelfAttentionBlock;
use super::decoder::DecoderLayer;
use super::feed_forward::FeedForward;
use super::residual::Residual;
use super::config::{Activation, NormPlacement};
use super::linear::Linear;
use super::norm::{Norm, RmsNorm};
use crate::backend::{
    AttnScores, Device, DeviceAct, DeviceError, NormOf, StepRows, WeightSource,
};

/// A norm's parameters on the device.
pub(super) struct DeviceNorm<D: Device> {
    pub(super) gain: D::Tensor,
    /// LayerNorm's β; `None` for RMSNorm.
    pub(super) bias: Option<D::Tensor>,
    pub(super) eps: f64,
}

/// An RMSNorm's gain as applied, `g + o` (its stored offset added).
fn rms_gain(n: &RmsNorm<f32>) -> Vec<f32> {
    let o = n.offset as f32;
    n.gain.value.data.iter().map(|g| g + o).collect()
}

/// `what` refused on `device`, by name.
pub(super) fn unsupported<D: Device>(device: &D, what: String) -> DeviceError {
    DeviceError::Unsupported {
        device: device.name(),
        what: format!("{what} (not on a device yet: use --device cpu)"),
    }
}

impl<D: Device> DeviceNorm<D> {
    pub(super) fn upload(device: &D, norm: &Norm<f32>) -> Result<Self, DeviceError> {
        Ok(match norm {
            Norm::Rms(n) => DeviceNorm {
                gain: device.upload(&rms_gain(n))?,
                bias: None,
                eps: n.eps,
            },
            Norm::Layer(n) => DeviceNorm {
                gain: device.upload(&n.gamma.value.data)?,
                bias: Some(device.upload(&n.beta.value.data)?),
                eps: n.eps,
            },
            Norm::Identity => {
                return Err(unsupported(
                    device,
                    "a sublayer without an input norm".into(),
                ))
            }
        })
    }

    pub(super) fn of(&self) -> NormOf<'_, D> {
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
pub(super) enum DeviceFfn<D: Device> {
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
pub(super) fn bias<D: Device>(device: &D, l: &Linear<f32>) -> Result<Option<D::Tensor>, DeviceError> {
    l.bias.as_ref().map(|b| device.upload(&b.value.data)).transpose()
}

/// One block's weights on the device.
pub(super) struct DeviceBlock<D: Device> {
    pub(super) attn_norm: DeviceNorm<D>,
    /// `[W_q; W_k; W_v]` and, when any has one, `[b_q; b_k; b_v]` (zeros for the others).
    pub(super) qkv: D::Weight,
    pub(super) qkv_bias: Option<D::Tensor>,
    pub(super) out: D::Weight,
    pub(super) out_bias: Option<D::Tensor>,
    pub(super) rope: D::Rope,
    /// The scores' factor (`1/√d_k` unless the model says otherwise), window and soft cap.
    pub(super) scores: AttnScores,
    /// Query/key norms: the gains (offset included) and ε.
    pub(super) qk_norm: Option<(D::Tensor, D::Tensor, f64)>,
    /// Norms of the attention's and the FFN's outputs before they are added (Gemma's).
    pub(super) attn_post_norm: Option<DeviceNorm<D>>,
    pub(super) ffn_post_norm: Option<DeviceNorm<D>>,
    pub(super) n_heads: usize,
    pub(super) ffn_norm: DeviceNorm<D>,
    pub(super) ffn: DeviceFfn<D>,
    pub(super) d_ff: usize,
    /// A translation decoder layer's attention over the source, between the two.
    pub(super) cross: Option<DeviceCross<D>>,
}

/// Cross-attention's weights on the device: queries from the decoder's stream, keys and
/// values of the source computed once per sentence ([`DeviceCross::store`]).
pub(super) struct DeviceCross<D: Device> {
    pub(super) norm: DeviceNorm<D>,
    pub(super) q: D::Weight,
    pub(super) q_bias: Option<D::Tensor>,
    pub(super) k: D::Weight,
    pub(super) k_bias: Option<D::Tensor>,
    pub(super) v: D::Weight,
    pub(super) v_bias: Option<D::Tensor>,
    pub(super) out: D::Weight,
    pub(super) out_bias: Option<D::Tensor>,
    pub(super) n_heads: usize,
    pub(super) scores: AttnScores,
}

/// The self-attention and FFN sublayers of a block (an encoder or decoder-only block, or a
/// translation decoder layer's own).
pub(super) struct Parts<'a> {
    pub(super) attn: &'a MultiHeadAttention<f32>,
    pub(super) attn_res: &'a Residual<f32>,
    pub(super) ffn: &'a FeedForward<f32>,
    pub(super) ffn_res: &'a Residual<f32>,
}

/// What a block with a mixture-of-experts FFN is refused as (no expert products on a device
/// yet).
const MIXTURE: &str = "mixture-of-experts FFNs";

/// Uploads block `i` of a model (its weights, norms, rotary table and options) to `device`.
pub(super) fn upload_block<D: Device>(
    device: &D,
    i: usize,
    layer: &SelfAttentionBlock<f32>,
) -> Result<DeviceBlock<D>, DeviceError> {
    let Some(ffn) = layer.ffn.dense() else {
        return Err(unsupported(device, MIXTURE.into()));
    };
    let parts = Parts {
        attn: &layer.self_attn,
        attn_res: &layer.self_attn_res,
        ffn,
        ffn_res: &layer.ffn_res,
    };
    upload_parts(device, i, parts)
}

/// Uploads layer `i` of a translation decoder: its own sublayers and its cross-attention.
pub(super) fn upload_decoder_layer<D: Device>(
    device: &D,
    i: usize,
    layer: &DecoderLayer<f32>,
) -> Result<DeviceBlock<D>, DeviceError> {
    let parts = Parts {
        attn: &layer.self_attn,
        attn_res: &layer.self_attn_res,
        ffn: &layer.ffn,
        ffn_res: &layer.ffn_res,
    };
    let mut block = upload_parts(device, i, parts)?;
    let c = &layer.cross_attn;
    let w = |name: &str, l: &Linear<f32>| {
        device.weight(&format!("layers.{i}.cross_attn.{name}"), &[WeightSource::Layer(l.weight_ref())])
    };
    block.cross = Some(DeviceCross {
        norm: DeviceNorm::upload(device, &layer.cross_attn_res.norm)?,
        q: w("q_proj", &c.q_proj)?,
        q_bias: bias(device, &c.q_proj)?,
        k: w("k_proj", &c.k_proj)?,
        k_bias: bias(device, &c.k_proj)?,
        v: w("v_proj", &c.v_proj)?,
        v_bias: bias(device, &c.v_proj)?,
        out: w("out_proj", &c.out_proj)?,
        out_bias: bias(device, &c.out_proj)?,
        n_heads: c.n_heads,
        scores: AttnScores {
            scale: c.scores.scale.unwrap_or(1.0 / (c.d_head as f64).sqrt()),
            window: None,
            softcap: c.scores.softcap,
        },
    });
    Ok(block)
}

/// What a translation decoder layer's cross-attention has that the device step does not do.
pub(super) fn check_cross(layer: &DecoderLayer<f32>) -> Option<&'static str> {
    let c = &layer.cross_attn;
    if c.rotary || c.q_norm.is_some() || c.k_norm.is_some() || c.pattern.is_some() || c.linear {
        return Some("cross-attention with rotary positions, query/key norms, or a sparse or linear kernel");
    }
    if !c.gates.is_empty() || layer.cross_attn_res.post_norm.is_some() {
        return Some("cross-attention with head gates or a post-norm");
    }
    None
}

impl<D: Device> DeviceCross<D> {
    /// The source's keys and values `memory [tokens, d_model]` into `kv`, each token at its
    /// `rows` slot.
    pub(super) fn store(
        &self,
        d: &D,
        memory: &D::Tensor,
        rows: &StepRows<'_, D>,
        width: usize,
        kv: &mut D::Kv,
    ) -> Result<(), DeviceError> {
        let n = rows.tokens;
        let (mut k, mut v) = (d.zeros(n * width)?, d.zeros(n * width)?);
        d.product(&mut k, memory, n, &self.k)?;
        d.product(&mut v, memory, n, &self.v)?;
        if let Some(b) = &self.k_bias {
            d.add_bias(&mut k, b)?;
        }
        if let Some(b) = &self.v_bias {
            d.add_bias(&mut v, b)?;
        }
        d.kv_write(&k, &v, rows, kv)
    }
}

/// The source a translation decoder's step reads: its keys and values per layer and each
/// target token's row of them (every source position its context).
pub(super) struct CrossSource<'a, D: Device> {
    pub(super) kv: &'a [D::Kv],
    pub(super) rows: StepRows<'a, D>,
    /// `(n_kv_heads, d_head)` of the cross-attention.
    pub(super) shape: (usize, usize),
}

/// [`upload_block`] from a block's sublayers.
pub(super) fn upload_parts<D: Device>(
    device: &D,
    i: usize,
    layer: Parts<'_>,
) -> Result<DeviceBlock<D>, DeviceError> {
    let a = layer.attn;
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
    let f = layer.ffn;
    let down = device.weight(&what("ffn.linear2"), &[WeightSource::Layer(f.linear2.weight_ref())])?;
    let down_bias = bias(device, &f.linear2)?;
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
                Activation::Silu => DeviceAct::Silu,
                _ => DeviceAct::GeluTanh,
            },
            up: device.weight(&what("ffn.linear1"), &[WeightSource::Layer(f.linear1.weight_ref())])?,
            up_bias: bias(device, &f.linear1)?,
            down,
            down_bias,
        },
    };
    Ok(DeviceBlock {
        attn_norm: DeviceNorm::upload(device, &layer.attn_res.norm)?,
        qkv,
        qkv_bias,
        out,
        out_bias: bias(device, &a.out_proj)?,
        rope: device.rope_table(a.rotary.then_some(a.rope), &a.rope_freq_factors, a.d_head)?,
        scores: AttnScores {
            scale: a.scores.scale.unwrap_or(1.0 / (a.d_head as f64).sqrt()),
            window: a.window,
            softcap: a.scores.softcap,
        },
        qk_norm: match (&a.q_norm, &a.k_norm) {
            (Some(q), Some(k)) => Some((
                device.upload(&rms_gain(q))?,
                device.upload(&rms_gain(k))?,
                q.eps,
            )),
            _ => None,
        },
        attn_post_norm: layer
            .attn_res
            .post_norm
            .as_ref()
            .map(|n| DeviceNorm::upload(device, n))
            .transpose()?,
        ffn_post_norm: layer
            .ffn_res
            .post_norm
            .as_ref()
            .map(|n| DeviceNorm::upload(device, n))
            .transpose()?,
        n_heads: a.n_heads,
        ffn_norm: DeviceNorm::upload(device, &layer.ffn_res.norm)?,
        ffn,
        d_ff: f.linear1.d_out,
        cross: None,
    })
}

/// The residual stream of a step and its scratch rows, each `[tokens, d_model]`: `h` the
/// stream, `normed` a norm's output, `o` the attention's output, `y` the FFN's (pre-LN: added
/// by the next layer's or the final norm), `post` a post-norm's output when a layer has one.
struct Stream<D: Device> {
    h: D::Tensor,
    normed: D::Tensor,
    y: D::Tensor,
    o: D::Tensor,
    post: Option<D::Tensor>,
}

impl<D: Device> Stream<D> {
    /// The rows of `n` tokens, `h` the embeddings.
    fn new(d: &D, h: D::Tensor, n: usize, dm: usize, blocks: &[DeviceBlock<D>]) -> Result<Self, DeviceError> {
        let posts = blocks.iter().any(|b| b.attn_post_norm.is_some() || b.ffn_post_norm.is_some());
        Ok(Stream {
            h,
            normed: d.zeros(n * dm)?,
            y: d.zeros(n * dm)?,
            o: d.zeros(n * dm)?,
            post: match posts {
                true => Some(d.zeros(n * dm)?),
                false => None,
            },
        })
    }
}

/// The last hidden states of `blocks` over the embeddings `h [tokens, dm]` laid out as `rows` says (keys
/// and values into `kv`, a translation decoder reading `source`): post-LN's stream, or pre-LN's
/// final norm of it.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_stack<D: Device>(
    d: &D,
    blocks: &[DeviceBlock<D>],
    post_ln: bool,
    final_norm: Option<&DeviceNorm<D>>,
    shape: (usize, usize),
    (h, dm): (D::Tensor, usize),
    rows: &StepRows<'_, D>,
    kv: &mut [D::Kv],
    source: Option<&CrossSource<'_, D>>,
) -> Result<D::Tensor, DeviceError> {
    let mut stream = Stream::new(d, h, rows.tokens, dm, blocks)?;
    run_blocks(d, blocks, post_ln, shape, &mut stream, rows, kv, source)?;
    match final_norm {
        Some(norm) if !post_ln => {
            d.add_norm(norm.of(), &mut stream.h, &stream.y, &mut stream.normed)?;
            Ok(stream.normed)
        }
        _ => Ok(stream.h),
    }
}

/// Runs `blocks` over the `n` tokens of `stream` laid out as `rows` says, their keys and values
/// into `kv` (one per block). Pre-LN leaves the last FFN output in `y`, to be added by the
/// final norm; post-LN leaves the finished stream in `h`.
#[allow(clippy::too_many_arguments)]
fn run_blocks<D: Device>(
    d: &D,
    blocks: &[DeviceBlock<D>],
    post_ln: bool,
    (n_kv, d_head): (usize, usize),
    stream: &mut Stream<D>,
    rows: &StepRows<'_, D>,
    kv: &mut [D::Kv],
    source: Option<&CrossSource<'_, D>>,
) -> Result<(), DeviceError> {
    let n = rows.tokens;
    // Cross-attention's queries and outputs (a translation decoder's layers).
    let mut cross_bufs = match source {
        Some(src) => {
            let heads = blocks.iter().filter_map(|b| b.cross.as_ref()).map(|c| c.n_heads).max().unwrap_or(1);
            let width = n * heads * src.shape.1;
            Some((d.zeros(width)?, d.zeros(width)?, heads))
        }
        None => None,
    };
    let Stream { h, normed, y, o, post } = stream;
    let mut sized: Option<(usize, usize, Sized<D>)> = None;
    for (l, block) in blocks.iter().enumerate() {
        // Pre-LN: the sublayer reads Norm(h) (the previous layer's output added first);
        // post-LN: h itself, normed after each add below.
        if !post_ln {
            let norm = block.attn_norm.of();
            match l {
                0 => d.norm(norm, h, normed)?,
                _ => d.add_norm(norm, h, y, normed)?,
            }
        }
        let key = (block.n_heads, block.d_ff);
        if sized.as_ref().map(|s| (s.0, s.1)) != Some(key) {
            let heads = n * block.n_heads * d_head;
            sized = Some((
                key.0,
                key.1,
                Sized {
                    qkv: d.zeros(n * (block.n_heads + 2 * n_kv) * d_head)?,
                    q: d.zeros(heads)?,
                    att: d.zeros(heads)?,
                    f: d.zeros(n * block.d_ff)?,
                },
            ));
        }
        let s = &mut sized.as_mut().expect("just sized").2;
        let input = if post_ln { &*h } else { &*normed };
        d.product(&mut s.qkv, input, n, &block.qkv)?;
        if let Some(b) = &block.qkv_bias {
            d.add_bias(&mut s.qkv, b)?;
        }
        if let Some((gq, gk, eps)) = &block.qk_norm {
            let width = (block.n_heads + 2 * n_kv) * d_head;
            d.head_norm(&mut s.qkv, width, (block.n_heads, n_kv), gq, gk, *eps)?;
        }
        d.rope_kv_write(&s.qkv, &mut s.q, rows, &block.rope, block.n_heads, &mut kv[l])?;
        d.paged_attention(&s.q, &kv[l], rows, &mut s.att, block.n_heads, block.scores)?;
        d.product(o, &s.att, n, &block.out)?;
        if let Some(b) = &block.out_bias {
            d.add_bias(o, b)?;
        }
        if let (Some(norm), Some(p)) = (&block.attn_post_norm, post.as_mut()) {
            d.norm(norm.of(), o, p)?;
            std::mem::swap(o, p);
        }
        match post_ln {
            true => {
                d.add_norm(block.attn_norm.of(), h, o, normed)?;
                std::mem::swap(h, normed);
            }
            false => match &block.cross {
                Some(c) => d.add_norm(c.norm.of(), h, o, normed)?,
                None => d.add_norm(block.ffn_norm.of(), h, o, normed)?,
            },
        }
        if let (Some(c), Some(src), Some((cq, catt, heads))) = (&block.cross, source, cross_bufs.as_mut()) {
            // Attention over the source: queries from h (post-LN) or Norm_c(h), every source
            // position seen.
            if c.n_heads != *heads {
                return Err(DeviceError::Device("cross-attention heads differ between layers".into()));
            }
            let input = if post_ln { &*h } else { &*normed };
            d.product(cq, input, n, &c.q)?;
            if let Some(b) = &c.q_bias {
                d.add_bias(cq, b)?;
            }
            d.paged_attention(cq, &src.kv[l], &src.rows, catt, c.n_heads, c.scores)?;
            d.product(o, catt, n, &c.out)?;
            if let Some(b) = &c.out_bias {
                d.add_bias(o, b)?;
            }
            match post_ln {
                true => {
                    d.add_norm(c.norm.of(), h, o, normed)?;
                    std::mem::swap(h, normed);
                }
                false => d.add_norm(block.ffn_norm.of(), h, o, normed)?,
            }
        }
        let input = if post_ln { &*h } else { &*normed };
        match &block.ffn {
            DeviceFfn::Gated {
                act,
                gate_up,
                down,
                down_bias,
            } => {
                d.glu_product(*act, &mut s.f, input, n, gate_up)?;
                d.product(y, &s.f, n, down)?;
                if let Some(b) = down_bias {
                    d.add_bias(y, b)?;
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
                d.product(y, &s.f, n, down)?;
                if let Some(b) = down_bias {
                    d.add_bias(y, b)?;
                }
            }
        }
        if let (Some(norm), Some(p)) = (&block.ffn_post_norm, post.as_mut()) {
            d.norm(norm.of(), y, p)?;
            std::mem::swap(y, p);
        }
        if post_ln {
            d.add_norm(block.ffn_norm.of(), h, y, normed)?;
            std::mem::swap(h, normed);
        }
    }
    Ok(())
}

/// A step's buffers whose sizes follow a layer's heads and `d_ff`.
struct Sized<D: Device> {
    qkv: D::Tensor,
    q: D::Tensor,
    att: D::Tensor,
    f: D::Tensor,
}

/// What a block has that the device step does not do yet, if anything (`post_ln`: the model's
/// placement, every block the same; `(n_kv, d_head)`: layer 0's key/value shape).
pub(super) fn check_block(
    l: &SelfAttentionBlock<f32>,
    post_ln: bool,
    shape: (usize, usize),
) -> Option<&'static str> {
    if l.linear_attn.is_some() {
        return Some("a Gated DeltaNet (linear-attention) layer");
    }
    let Some(ffn) = l.ffn.dense() else {
        return Some(MIXTURE);
    };
    let parts = Parts {
        attn: &l.self_attn,
        attn_res: &l.self_attn_res,
        ffn,
        ffn_res: &l.ffn_res,
    };
    check_parts(&parts, post_ln, shape)
}

/// [`check_block`] of a block's sublayers.
pub(super) fn check_parts(
    l: &Parts<'_>,
    post_ln: bool,
    (n_kv, d_head): (usize, usize),
) -> Option<&'static str> {
    let a = l.attn;
    let placement = |p: NormPlacement| (p == NormPlacement::PostLn) == post_ln;
    if !placement(l.attn_res.placement) || !placement(l.ffn_res.placement) {
        return Some("pre-LN and post-LN sublayers mixed");
    }
    if post_ln && (l.attn_res.post_norm.is_some() || l.ffn_res.post_norm.is_some()) {
        return Some("post-norms in post-LN blocks");
    }
    if [l.attn_res, l.ffn_res].iter().any(|r| r.scale.is_some()) {
        return Some("sublayer outputs scaled before the residual sum (Granite)");
    }
    if [l.attn_res, l.ffn_res].iter().any(|r| r.norm.is_identity()) {
        return Some("sublayers without an input norm (OLMo 2)");
    }
    if a.pattern.is_some() || a.linear {
        return Some("sparse or linear attention");
    }
    if a.output_gate.is_some() || a.rotary_dim.is_some() {
        return Some("an attention output gate or a partial rotation (Qwen3.5)");
    }
    if a.relative_bias.is_some() {
        return Some("a relative position bias (T5's)");
    }
    if a.sinks.is_some() {
        return Some("attention sinks (gpt-oss)");
    }
    if a.q_norm.is_some() != a.k_norm.is_some() {
        return Some("a query norm without a key norm, or the reverse");
    }
    if let Some(n) = &a.q_norm {
        if n.gain.value.data.len() != a.d_head {
            return Some("query/key norms over the whole projection");
        }
    }
    if !a.gates.is_empty() {
        return Some("head gates");
    }
    if (a.n_kv_heads, a.d_head) != (n_kv, d_head) {
        return Some("key/value heads of another shape than layer 0's");
    }
    if let Some(gate) = &l.ffn.gate {
        if gate.bias.is_some() || l.ffn.linear1.bias.is_some() {
            return Some("biases of a gated feed-forward");
        }
    }
    None
}
