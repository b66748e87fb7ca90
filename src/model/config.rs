//! Model hyper-parameters, with the paper's presets. Serialises to the checkpoint's `config.json`.
//!
//! A leaf of the model: the layers read these types, and how a layer is built from them lives
//! with the builders ([`super::build`]), so this file imports no layer.

use super::attention_kind::AttentionKind;
use serde::{Deserialize, Serialize};

pub use super::layer_heads::{AttentionSite, LayerHeads};

/// Where the layer norm sits in each residual block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NormPlacement {
    /// `LayerNorm(x + Dropout(Sublayer(x)))`, the paper's arrangement.
    PostLn,
    /// `x + Dropout(Sublayer(LayerNorm(x)))`, with a final norm after the last layer.
    PreLn,
}

/// The position-wise FFN's non-linearity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Activation {
    /// `max(0, x)`, the paper's choice.
    #[default]
    Relu,
    /// `x·Φ(x)` with the exact normal CDF (BERT's `gelu`).
    GeluErf,
    /// GPT-2's tanh approximation of GELU (`gelu_new`).
    GeluTanh,
    /// SiLU / swish, `x · σ(x)`, ungated (Marian's `swish`).
    Silu,
    /// SwiGLU (Shazeer 2020; Llama): `FFN(x) = (silu(x W_gateᵀ) ⊙ x W_upᵀ) W_downᵀ`, a gated
    /// FFN of three matrices, `silu(z) = z · σ(z)`.
    SiluGated,
    /// GeGLU with the tanh approximation of GELU (Shazeer 2020; Gemma):
    /// `FFN(x) = (gelu_tanh(x W_gateᵀ) ⊙ x W_upᵀ) W_downᵀ`, a gated FFN of three matrices.
    GeluTanhGated,
}

impl Activation {
    /// Whether the FFN is gated (three matrices: gate, up, down).
    pub fn is_gated(self) -> bool {
        matches!(self, Activation::SiluGated | Activation::GeluTanhGated)
    }
}

/// Which normalisation every residual connection (and a pre-LN stack's final norm) uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Normalization {
    /// `γ ⊙ (x − μ) / √(σ² + ε) + β`, the paper's.
    #[default]
    LayerNorm,
    /// `γ ⊙ x / √(mean(x²) + ε)` (Zhang & Sennrich 2019; Llama): no mean, no bias.
    RmsNorm,
}

/// How rotary positions pair the columns of a head (see `kernels::rope`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RopeStyle {
    /// Adjacent columns `(2i, 2i+1)`: RoFormer, GPT-J, and Llama weights as ggml stores them.
    #[default]
    Interleaved,
    /// Column `i` with `i + d_head/2` (`rotate_half`): Hugging Face's Llama checkpoints.
    HalfSplit,
}

pub use super::rope_scaling::RopeScaling;

/// How token positions enter the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Positions {
    /// The paper's fixed sinusoids added to the scaled token embeddings (section 3.5).
    #[default]
    Sinusoidal,
    /// The same sinusoids with the sines in the first half of the columns and the cosines in
    /// the second (Marian): `PE(pos, i) = sin(pos / 10000^(2i/d_model))` and
    /// `PE(pos, ⌈d/2⌉ + i) = cos(pos / 10000^(2i/d_model))`.
    SinusoidalHalves,
    /// A trained table `embedding.positions [max_len, d_model]` added to the scaled token
    /// embeddings; one table shared by the encoder and the decoder (like the token table).
    Learned,
    /// Rotary position embedding (RoPE, Su et al. 2021): queries and keys of every
    /// self-attention are rotated by their absolute positions (`kernels::rope`); nothing is
    /// added to the embeddings, and cross-attention is left unrotated.
    Rotary,
    /// T5's relative positions (encoder-decoders only): nothing is added to the embeddings;
    /// every self-attention adds a learned bias per head and bucket of each key's offset from
    /// the query to its scores (`super::relative_bias`; [`ModelConfig::relative_buckets`]).
    /// Inference only: the bias gets no gradient.
    Relative,
}

/// The shape of an encoder-decoder Transformer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Shared source/target vocabulary size.
    pub vocab_size: usize,
    /// Width of every residual stream (d_model).
    pub d_model: usize,
    /// Attention heads h; d_k = d_v = d_model / h.
    pub n_heads: usize,
    /// Inner width of the position-wise feed-forward network (d_ff).
    pub d_ff: usize,
    /// Encoder layers N.
    pub n_encoder_layers: usize,
    /// Decoder layers N.
    pub n_decoder_layers: usize,
    /// Dropout on embeddings+positions and on each sublayer output (P_drop).
    pub dropout: f64,
    /// Norm placement in the residual blocks.
    pub norm: NormPlacement,
    /// Layer-norm ε.
    pub layer_norm_eps: f64,
    /// Tie the pre-softmax projection to the shared embedding matrix (the paper's tying).
    pub tie_embeddings: bool,
    /// Longest sequence (in tokens, specials included) the model accepts: its context, a limit
    /// (at most `MAX_CONTEXT`); nothing is allocated per position of it except a learned
    /// position table the checkpoint holds.
    pub max_len: usize,
    /// The FFN activation (ReLU when absent, as in configs written before the option existed).
    #[serde(default)]
    pub activation: Activation,
    /// How positions are encoded (sinusoidal when absent, as in configs written before the
    /// option existed).
    #[serde(default)]
    pub positions: Positions,
    /// Dropout on the attention weights, `softmax(Q Kᵀ / √d_k)`, in training (not in the
    /// paper; tensor2tensor's `attention_dropout`). Absent means 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attention_dropout: f64,
    /// Dropout on the FFN's hidden units after the activation, in training (not in the paper;
    /// fairseq's `activation_dropout`). Absent means 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub activation_dropout: f64,
    /// Whether the linear layers have biases (absent: true; Llama has none).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub bias: bool,
    /// Whether the token embeddings are multiplied by √d_model (absent: true, the paper's;
    /// GPT-2 and Llama add them unscaled).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub scale_embeddings: bool,
    /// Key/value heads of grouped-query attention (Ainslie et al. 2023): each serves
    /// `n_heads / n_kv_heads` query heads. Absent: `n_heads` (multi-head attention).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_kv_heads: Option<usize>,
    /// Width of each attention head d_k where it is not `d_model / n_heads` (Qwen3-0.6B:
    /// 1024 / 16 heads of 128): the query projection `[n_heads · d_k, d_model]`, the output
    /// projection `[d_model, n_heads · d_k]`. Absent: `d_model / n_heads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// Attention heads per layer where heads were pruned (`transformer prune`; Michel et al.
    /// 2019), per attention site; an empty list: every layer of that site has `n_heads`.
    /// Absent: no pruning.
    #[serde(default, skip_serializing_if = "LayerHeads::is_empty")]
    pub layer_heads: LayerHeads,
    /// Layer norm or RMSNorm (absent: layer norm).
    #[serde(default, skip_serializing_if = "is_default")]
    pub normalization: Normalization,
    /// Rotary positions: the base of the angles (absent: 10000).
    #[serde(
        default = "rope_base_default",
        skip_serializing_if = "is_rope_base_default"
    )]
    pub rope_base: f64,
    /// Rotary positions: how the columns are paired (absent: interleaved).
    #[serde(default, skip_serializing_if = "is_default")]
    pub rope_style: RopeStyle,
    /// Rotary positions: the frequencies rescaled (Llama 3.1). Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeScaling>,
    /// The query, key and value projections have biases even where [`bias`](Self::bias) is
    /// false (Qwen2: `q = x W_qᵀ + b_q`, the output projection and the FFN without). Absent:
    /// false.
    #[serde(default, skip_serializing_if = "is_default")]
    pub qkv_bias: bool,
    /// RMSNorm of each head's queries and keys before the rotation and the scores (Qwen3,
    /// Gemma 3): `q_h ← (g_q + o) ⊙ q_h / √(mean(q_h²) + ε)`, one gain `[d_k]` for the queries
    /// and one for the keys, shared by the heads, with the model's ε and
    /// [`norm_weight_offset`](Self::norm_weight_offset) `o`. Absent: false.
    #[serde(default, skip_serializing_if = "is_default")]
    pub qk_norm: bool,
    /// With [`qk_norm`](Self::qk_norm): each row's queries normalised over all their heads at
    /// once, gain `[heads·d_k]` (likewise the keys, `[kv_heads·d_k]`), as OLMo 2 and OLMoE
    /// do, instead of head by head. Absent: false.
    #[serde(default, skip_serializing_if = "is_default")]
    pub qk_norm_whole: bool,
    /// Soft-capping of the attention scores, `s ← c · tanh(s / c)` before the mask and the
    /// softmax (Gemma 2), in every attention. Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attn_logit_softcap: Option<f64>,
    /// Soft-capping of the output logits, `z ← c · tanh(z / c)` (Gemma 2). Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_logit_softcap: Option<f64>,
    /// A bias `[vocab]` added to the logits (`output_proj.bias`; Marian's `final_logits_bias`).
    /// Absent: false.
    #[serde(default, skip_serializing_if = "is_default")]
    pub output_bias: bool,
    /// Added to every RMSNorm gain: `y = (g + offset) ⊙ x / rms(x)` (Gemma stores `g − 1`:
    /// offset 1). Absent: 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub norm_weight_offset: f64,
    /// The factor of the token embeddings, instead of √d_model or 1 ([`scale_embeddings`](
    /// Self::scale_embeddings)). Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding_scale: Option<f64>,
    /// Per decoder layer, the most recent keys a query may see (`None`: all, the causal
    /// prefix): with window `w` the query at position `p` sees the keys
    /// `max(0, p + 1 − w) ..= p` of the layer's causal self-attention (Mistral, Gemma 2's
    /// alternating layers); empty: every layer sees all. Absent: empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layer_windows: Vec<Option<usize>>,
    // Gemma 2 / Gemma 3 options.
    /// The attention scores are `q·k / √query_pre_attn_scalar` instead of `q·k / √d_k`
    /// (Gemma 2 and 3). Absent: `d_k`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_pre_attn_scalar: Option<f64>,
    /// A second norm of every sublayer's output before the residual sum (pre-LN only, Gemma 2
    /// and 3: `x + PostNorm(Sublayer(Norm(x)))`; parameters `self_attn_post_norm`,
    /// `cross_attn_post_norm`, `ffn_post_norm`). Absent: false.
    #[serde(default, skip_serializing_if = "is_default")]
    pub post_norms: bool,
    /// The rotary base of the decoder layers with a sliding window ([`layer_windows`](
    /// Self::layer_windows); Gemma 3's local layers: 10000), unscaled; the others keep
    /// [`rope_base`](Self::rope_base) and [`rope_scaling`](Self::rope_scaling). Absent:
    /// `rope_base` on every layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_rope_base: Option<f64>,
    // SmolLM3, Granite 3 and OLMo 2 options.
    /// Per decoder layer, whether its self-attention rotates the queries and keys (with
    /// [`Positions::Rotary`]); a layer with `false` attends without positions (NoPE:
    /// `softmax(q·kᵀ / √d_k)` of the unrotated projections; the causal mask alone orders the
    /// sequence), as SmolLM3's every fourth layer. Empty: every layer rotates. Absent: empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layer_rope: Vec<bool>,
    /// The factor `m` of every sublayer's output before the residual sum (Granite's
    /// `residual_multiplier`): pre-LN `y = x + m · Sublayer(Norm(x))`, post-LN
    /// `y = Norm(x + m · Sublayer(x))`. Absent: none (1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub residual_scale: Option<f64>,
    /// The logits divided by `s` (Granite's `logits_scaling`): `z ← (h Eᵀ) / s`, before a
    /// soft cap. Absent: none (1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_divisor: Option<f64>,
    /// Pre-LN only: whether each sublayer's input is normalised. `false` with
    /// [`post_norms`](Self::post_norms) gives OLMo 2's blocks, a norm after each sublayer and
    /// none before: `y = x + PostNorm(Sublayer(x))` (the final norm stays). Absent: true.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub input_norms: bool,
    // Attention beyond O(N²) (`super::attention_kind`).
    /// Per decoder (language-model) layer, the self-attention it computes: exact, a sliding
    /// window, a sparse pattern, local + global tokens or linear attention (see
    /// [`AttentionKind`]); empty: exact everywhere. Absent: empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layer_attention: Vec<AttentionKind>,
    /// The same per encoder layer (its self-attention is not causal: a window `w` sees
    /// `|p − j| < w`). Absent: empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub encoder_layer_attention: Vec<AttentionKind>,
    /// Every decoder layer's FFN a mixture of experts (`super::experts`); `None`: the dense
    /// FFN of [`d_ff`](Self::d_ff). Absent: `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts: Option<ExpertsConfig>,
    // Hybrid stacks (Qwen3.5): `super::gated_delta` and the gated, partially rotated attention.
    /// An output gate on every decoder self-attention: the heads multiplied by `σ(x W_gᵀ)`
    /// before `W^O` (Qwen3-Next, Qwen3.5; parameter `self_attn.gate_proj`; inference only).
    /// Absent: false.
    #[serde(default, skip_serializing_if = "is_default")]
    pub attn_output_gate: bool,
    /// An attention sink on every decoder self-attention: one learned logit per head that joins
    /// each softmax's denominator and carries no value (gpt-oss; parameter `self_attn.sinks
    /// [n_heads]`, `super::attention`). Absent: false.
    #[serde(default, skip_serializing_if = "is_default")]
    pub attention_sinks: bool,
    /// Rotary positions on each head's first `rotary_dim` columns only, as a head of that
    /// width (Qwen3.5's `partial_rotary_factor`: a quarter). Absent: the whole head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotary_dim: Option<usize>,
    /// The decoder layers that are Gated DeltaNet layers instead of attention, and their
    /// shape (a hybrid stack, Qwen3.5). Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gated_delta: Option<GatedDeltaConfig>,
    // mBART / BART options (encoder-decoders only).
    /// A norm of each stack's embedded input, after the positions are added and before the
    /// dropout (mBART's and BART's `layernorm_embedding`; parameters `embedding.norm` for the
    /// source, `embedding.target_norm` for the target). Absent: false.
    #[serde(default, skip_serializing_if = "is_default")]
    pub embedding_norm: bool,
    /// The decoder adds its own learned position table (`embedding.target_positions`), the
    /// encoder the shared one (mBART, BART; learned positions only). Absent: false, one table
    /// for both.
    #[serde(default, skip_serializing_if = "is_default")]
    pub target_positions: bool,
    /// Whether the encoder reads the EOS every search and batch appends to a source (ours,
    /// Marian, NLLB: true); false: that position is masked like padding, for models trained on
    /// sources without one (OpenNMT-py / Argos Translate models run by CTranslate2). Absent:
    /// true.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub source_eos: bool,
    /// With [`Positions::Relative`]: the number of buckets of key offsets and the offset from
    /// which they all share the outermost ones (T5's `relative_attention_num_buckets` and
    /// `relative_attention_max_distance`). Absent: 32 and 128, T5's.
    #[serde(default = "t5_buckets", skip_serializing_if = "is_t5_buckets")]
    pub relative_buckets: (usize, usize),
}

/// A mixture-of-experts FFN (`super::experts`): `n_experts` FFNs of `d_ff` hidden units each
/// (the block's activation; biases only with [`bias`](Self::bias)), `top_k` of them picked per
/// token by a linear router.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpertsConfig {
    pub n_experts: usize,
    pub top_k: usize,
    /// Each expert's hidden width.
    pub d_ff: usize,
    /// Whether the chosen experts' probabilities are divided by their sum (Mixtral,
    /// Qwen3-MoE, gpt-oss) or used as they are (OLMoE).
    pub normalise: bool,
    /// The hidden width of a shared expert every token passes through, its output scaled by a
    /// sigmoid gate `σ(x w_gᵀ)` (Qwen2-MoE, Qwen3-Next, Qwen3.5-MoE; parameters
    /// `ffn.shared_expert.*` and `ffn.shared_expert_gate`). Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_d_ff: Option<usize>,
    /// The router and every expert's three projections have biases (gpt-oss). Absent: false.
    #[serde(default, skip_serializing_if = "is_default")]
    pub bias: bool,
    /// The experts' SwiGLU clamped as gpt-oss computes it ([`SwigluClamp`]). Absent: the plain
    /// SwiGLU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swiglu_clamp: Option<SwigluClamp>,
}

/// gpt-oss's clamped SwiGLU (`super::feed_forward`): the gate clamped above, the up projection
/// on both sides, a sigmoid of gain `alpha` and the up projection shifted by one,
/// `h = (clamp(u, −limit, limit) + 1) ⊙ g' σ(alpha · g')`, `g' = min(g, limit)`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwigluClamp {
    /// The sigmoid's gain (1.702 in gpt-oss).
    pub alpha: f64,
    /// The clamp (7 in gpt-oss).
    pub limit: f64,
}

/// The Gated DeltaNet layers of a hybrid stack (`super::gated_delta`): which decoder layers
/// they are and their heads (transformers' `linear_*` fields of Qwen3.5).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatedDeltaConfig {
    /// Per decoder layer: a Gated DeltaNet layer (`true`) or attention.
    pub layers: Vec<bool>,
    /// Query/key heads and their width d_k.
    pub key_heads: usize,
    pub d_key: usize,
    /// Value heads (a multiple of `key_heads`) and their width d_v.
    pub value_heads: usize,
    pub d_value: usize,
    /// Taps of the causal short convolution.
    pub conv_kernel: usize,
}

impl GatedDeltaConfig {
    /// Whether decoder layer `i` is a Gated DeltaNet layer.
    pub fn is_delta(&self, i: usize) -> bool {
        self.layers.get(i).copied().unwrap_or(false)
    }
}

/// T5's relative position buckets: 32 buckets, offsets told apart up to 128.
pub const T5_BUCKETS: (usize, usize) = (32, 128);

fn t5_buckets() -> (usize, usize) {
    T5_BUCKETS
}

fn is_t5_buckets(b: &(usize, usize)) -> bool {
    *b == T5_BUCKETS
}

fn is_zero(p: &f64) -> bool {
    *p == 0.0
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

fn is_default<T: Default + PartialEq>(x: &T) -> bool {
    *x == T::default()
}

/// The rotary base of the RoFormer paper and Llama 1/2.
pub const ROPE_BASE: f64 = 10000.0;

fn rope_base_default() -> f64 {
    ROPE_BASE
}

fn is_rope_base_default(b: &f64) -> bool {
    *b == ROPE_BASE
}

/// The shape of one attention block, shared by every model family: what
/// [`SelfAttentionBlock`](super::block::SelfAttentionBlock), the decoder layer and their parts
/// are built from. Each model's config gives its blocks' ([`ModelConfig::block`],
/// [`BertConfig::block`](super::bert::BertConfig::block)).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockConfig {
    /// Width of the residual stream.
    pub d_model: usize,
    /// Attention heads; d_k = d_model / n_heads.
    pub n_heads: usize,
    /// Inner width of the FFN.
    pub d_ff: usize,
    pub activation: Activation,
    /// Where each residual connection's layer norm sits.
    pub norm: NormPlacement,
    pub layer_norm_eps: f64,
    /// Dropout on each sublayer's output.
    pub dropout: f64,
    /// Dropout on the attention weights.
    pub attention_dropout: f64,
    /// Dropout on the FFN's hidden units.
    pub activation_dropout: f64,
    /// Rotary positions in the self-attention.
    pub rotary: bool,
    /// Key/value heads (grouped-query attention; `n_heads` for multi-head attention).
    pub n_kv_heads: usize,
    /// Width of each head, d_k (`d_model / n_heads` unless a checkpoint says otherwise).
    pub d_head: usize,
    /// Biases in the linear layers.
    pub bias: bool,
    /// Layer norm or RMSNorm.
    pub normalization: Normalization,
    /// Rotary base and pairing.
    pub rope_base: f64,
    pub rope_style: RopeStyle,
    /// Biases on the query, key and value projections even without [`bias`](Self::bias).
    pub qkv_bias: bool,
    /// Added to every RMSNorm gain.
    pub norm_weight_offset: f64,
    /// The attention scores' scale `1/√query_pre_attn_scalar` (`None`: `1/√d_k`).
    pub query_pre_attn_scalar: Option<f64>,
    /// The attention scores' soft cap.
    pub attn_logit_softcap: Option<f64>,
    /// A norm of every sublayer's output before the residual sum.
    pub post_norms: bool,
    /// RMSNorm of each head's queries and keys (see [`ModelConfig::qk_norm`]).
    pub qk_norm: bool,
    /// The query/key norms over the whole projection ([`ModelConfig::qk_norm_whole`]).
    pub qk_norm_whole: bool,
    /// The FFN a mixture of experts ([`ModelConfig::experts`]).
    pub experts: Option<ExpertsConfig>,
    /// The factor of every sublayer's output ([`ModelConfig::residual_scale`]).
    pub residual_scale: Option<f64>,
    /// Whether each sublayer's input is normalised ([`ModelConfig::input_norms`]).
    pub input_norms: bool,
}

/// The most layers a configuration may ask for (a guard against edited configs).
pub const MAX_LAYERS: usize = 4096;

/// The longest context ([`ModelConfig::max_len`]) a configuration may state: 2^24 positions
/// (16× Llama 4's 1M). A context is a limit, not an allocation (memory follows the positions
/// a run holds); the bound keeps positions and block ids within 32-bit integers.
pub const MAX_CONTEXT: usize = 1 << 24;

impl ModelConfig {
    /// The names accepted by [`ModelConfig::preset`].
    pub const PRESETS: [&'static str; 3] = ["tiny", "base", "big"];

    /// `tiny` (tests and the demo), `base` and `big` (the paper's sizes).
    pub fn preset(name: &str, vocab_size: usize) -> Option<ModelConfig> {
        let (d_model, n_heads, d_ff, layers, dropout) = match name {
            "tiny" => (128, 4, 512, 2, 0.1),
            "base" => (512, 8, 2048, 6, 0.1),
            "big" => (1024, 16, 4096, 6, 0.3),
            _ => return None,
        };
        Some(ModelConfig {
            vocab_size,
            d_model,
            n_heads,
            d_ff,
            n_encoder_layers: layers,
            n_decoder_layers: layers,
            dropout,
            norm: NormPlacement::PostLn,
            layer_norm_eps: 1e-6,
            tie_embeddings: true,
            max_len: 1024,
            activation: Activation::Relu,
            positions: Positions::Sinusoidal,
            attention_dropout: 0.0,
            activation_dropout: 0.0,
            bias: true,
            scale_embeddings: true,
            n_kv_heads: None,
            head_dim: None,
            layer_heads: LayerHeads::default(),
            normalization: Normalization::LayerNorm,
            rope_base: ROPE_BASE,
            rope_style: RopeStyle::Interleaved,
            rope_scaling: None,
            qkv_bias: false,
            qk_norm: false,
            qk_norm_whole: false,
            attention_sinks: false,
            attn_logit_softcap: None,
            final_logit_softcap: None,
            output_bias: false,
            norm_weight_offset: 0.0,
            embedding_scale: None,
            layer_windows: Vec::new(),
            query_pre_attn_scalar: None,
            post_norms: false,
            sliding_rope_base: None,
            layer_rope: Vec::new(),
            residual_scale: None,
            logit_divisor: None,
            input_norms: true,
            layer_attention: Vec::new(),
            encoder_layer_attention: Vec::new(),
            experts: None,
            embedding_norm: false,
            target_positions: false,
            source_eos: true,
            relative_buckets: T5_BUCKETS,
            attn_output_gate: false,
            rotary_dim: None,
            gated_delta: None,
        })
    }

    /// d_k = d_v = d_model / h, or [`head_dim`](Self::head_dim) when set.
    pub fn d_head(&self) -> usize {
        self.head_dim.unwrap_or(self.d_model / self.n_heads)
    }

    /// The attention heads of layer `i` at `site` ([`layer_heads`](Self::layer_heads), or
    /// `n_heads` where that site was not pruned).
    pub fn layer_n_heads(&self, site: AttentionSite, i: usize) -> usize {
        self.layer_heads
            .of(site)
            .get(i)
            .copied()
            .unwrap_or(self.n_heads)
    }

    /// The number of layers with an attention at `site`.
    pub fn site_layers(&self, site: AttentionSite) -> usize {
        match site {
            AttentionSite::Encoder => self.n_encoder_layers,
            AttentionSite::Decoder | AttentionSite::Cross => self.n_decoder_layers,
        }
    }

    /// The sliding window of decoder layer `i` ([`layer_windows`](Self::layer_windows);
    /// `None`: the whole causal prefix).
    /// A `{"kind": "window"}` entry of [`layer_attention`](Self::layer_attention) is the same
    /// window.
    pub fn layer_window(&self, i: usize) -> Option<usize> {
        match self.layer_attention_kind(i) {
            AttentionKind::Window { window } => Some(window),
            _ => self.layer_windows.get(i).copied().flatten(),
        }
    }

    /// The self-attention of decoder layer `i` ([`layer_attention`](Self::layer_attention);
    /// exact when absent).
    pub fn layer_attention_kind(&self, i: usize) -> AttentionKind {
        self.layer_attention.get(i).copied().unwrap_or_default()
    }

    /// The self-attention of encoder layer `i` ([`encoder_layer_attention`](
    /// Self::encoder_layer_attention); exact when absent).
    pub fn encoder_attention_kind(&self, i: usize) -> AttentionKind {
        self.encoder_layer_attention
            .get(i)
            .copied()
            .unwrap_or_default()
    }

    /// The rotary base of decoder layer `i`: [`sliding_rope_base`](Self::sliding_rope_base)
    /// on a layer with a sliding window when it is set, otherwise [`rope_base`](
    /// Self::rope_base).
    pub fn layer_rope_base(&self, i: usize) -> f64 {
        match (self.layer_window(i), self.sliding_rope_base) {
            (Some(_), Some(base)) => base,
            _ => self.rope_base,
        }
    }

    /// Whether decoder layer `i`'s self-attention rotates its queries and keys: rotary
    /// positions, and not a NoPE layer of [`layer_rope`](Self::layer_rope).
    pub fn layer_rotary(&self, i: usize) -> bool {
        self.positions == Positions::Rotary && self.layer_rope.get(i).copied().unwrap_or(true)
    }

    /// Whether decoder layer `i` rotates with [`sliding_rope_base`](Self::sliding_rope_base)
    /// (a layer with a window when the base is set): then [`rope_scaling`](Self::rope_scaling),
    /// which belongs to `rope_base`, does not apply to it (Gemma 3's local layers).
    pub fn has_sliding_rope(&self, i: usize) -> bool {
        self.layer_window(i).is_some() && self.sliding_rope_base.is_some()
    }

    /// The blocks' shape: every self-attention is rotary when the positions are.
    pub fn block(&self) -> BlockConfig {
        BlockConfig {
            d_model: self.d_model,
            n_heads: self.n_heads,
            d_ff: self.d_ff,
            activation: self.activation,
            norm: self.norm,
            layer_norm_eps: self.layer_norm_eps,
            dropout: self.dropout,
            attention_dropout: self.attention_dropout,
            activation_dropout: self.activation_dropout,
            rotary: self.positions == Positions::Rotary,
            n_kv_heads: self.n_kv_heads.unwrap_or(self.n_heads),
            d_head: self.d_head(),
            bias: self.bias,
            normalization: self.normalization,
            rope_base: self.rope_base,
            rope_style: self.rope_style,
            qkv_bias: self.qkv_bias,
            norm_weight_offset: self.norm_weight_offset,
            query_pre_attn_scalar: self.query_pre_attn_scalar,
            attn_logit_softcap: self.attn_logit_softcap,
            post_norms: self.post_norms,
            qk_norm: self.qk_norm,
            qk_norm_whole: self.qk_norm_whole,
            experts: self.experts,
            residual_scale: self.residual_scale,
            input_norms: self.input_norms,
        }
    }

    /// The arithmetic count [`n_params`](Self::n_params) replaced, kept to test it against.
    #[cfg(test)]
    pub(crate) fn n_params_formula(&self) -> Option<usize> {
        let (v, d, f) = (
            self.vocab_size as u128,
            self.d_model as u128,
            self.d_ff as u128,
        );
        let attention = 4 * (d * d + d);
        let norm = 2 * d;
        let ffn = f * d + f + d * f + d;
        let encoder = self.n_encoder_layers as u128 * (attention + norm + ffn + norm);
        let decoder = self.n_decoder_layers as u128 * (2 * (attention + norm) + ffn + norm);
        let final_norms = match self.norm {
            NormPlacement::PreLn => 2 * norm,
            NormPlacement::PostLn => 0,
        };
        let output = if self.tie_embeddings { 0 } else { v * d };
        // Learned positions: one [max_len, d_model] table, shared by encoder and decoder.
        let positions = match self.positions {
            Positions::Learned => self.max_len as u128 * d,
            // A table [buckets, heads] in each self-attention.
            Positions::Relative => {
                let layers = (self.n_encoder_layers + self.n_decoder_layers) as u128;
                layers * (self.relative_buckets.0 * self.n_heads) as u128
            }
            Positions::Sinusoidal | Positions::SinusoidalHalves | Positions::Rotary => 0,
        };
        usize::try_from(v * d + positions + encoder + decoder + final_norms + output).ok()
    }
}

#[path = "config_validate.rs"]
mod validate;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Module;

    #[test]
    fn presets_have_the_papers_sizes_and_round_trip() {
        let base = ModelConfig::preset("base", 8000).unwrap();
        assert_eq!(
            (
                base.d_model,
                base.n_heads,
                base.d_ff,
                base.n_encoder_layers,
                base.d_head()
            ),
            (512, 8, 2048, 6, 64)
        );
        let big = ModelConfig::preset("big", 8000).unwrap();
        assert_eq!(
            (big.d_model, big.n_heads, big.d_ff, big.dropout),
            (1024, 16, 4096, 0.3)
        );
        let json = serde_json::to_string(&base).unwrap();
        assert_eq!(serde_json::from_str::<ModelConfig>(&json).unwrap(), base);
        assert!(ModelConfig::preset("huge", 10).is_none());
        for (name, norm, tie, positions) in [
            ("base", NormPlacement::PostLn, true, Positions::Sinusoidal),
            ("tiny", NormPlacement::PreLn, false, Positions::Learned),
            ("tiny", NormPlacement::PostLn, true, Positions::Learned),
            ("tiny", NormPlacement::PreLn, true, Positions::Rotary),
        ] {
            let mut c = ModelConfig::preset(name, 37).unwrap();
            c.norm = norm;
            c.tie_embeddings = tie;
            c.positions = positions;
            let want = crate::model::Seq2Seq::<f32>::new(c.clone(), &mut crate::rng::Rng::new(0))
                .n_params();
            assert_eq!(c.n_params(), Some(want));
            assert_eq!(c.n_params_formula(), Some(want));
        }
        let mut old: serde_json::Value = serde_json::from_str(&json).unwrap();
        old.as_object_mut().unwrap().remove("activation");
        old.as_object_mut().unwrap().remove("positions");
        let old: ModelConfig = serde_json::from_value(old).unwrap();
        assert_eq!(old.activation, Activation::Relu);
        assert_eq!(old.positions, Positions::Sinusoidal);
        for (positions, name) in [
            (Positions::Sinusoidal, "sinusoidal"),
            (Positions::Learned, "learned"),
            (Positions::Rotary, "rotary"),
        ] {
            let c = ModelConfig {
                positions,
                ..base.clone()
            };
            let json = serde_json::to_string(&c).unwrap();
            assert!(json.contains(&format!(r#""positions":"{name}""#)), "{json}");
            assert_eq!(serde_json::from_str::<ModelConfig>(&json).unwrap(), c);
        }
        let mut odd = ModelConfig::preset("tiny", 37).unwrap();
        (odd.d_model, odd.n_heads, odd.positions) = (12, 4, Positions::Rotary);
        assert!(odd.validate().unwrap_err().contains("rotary"));
        odd.positions = Positions::Learned;
        odd.validate().unwrap();
        let mut gelu = base.clone();
        gelu.activation = Activation::GeluErf;
        let json = serde_json::to_string(&gelu).unwrap();
        assert!(json.contains(r#""activation":"gelu-erf""#), "{json}");
        assert_eq!(serde_json::from_str::<ModelConfig>(&json).unwrap(), gelu);
        let mut bad = base.clone();
        bad.n_heads = 7;
        assert!(bad.validate().unwrap_err().contains("n_heads"));
        // The inner dropouts: written only when set, read back, range-checked by name.
        assert!(!json.contains("attention_dropout"), "{json}");
        let mut inner = base.clone();
        (inner.attention_dropout, inner.activation_dropout) = (0.1, 0.2);
        let json = serde_json::to_string(&inner).unwrap();
        assert!(json.contains(r#""attention_dropout":0.1"#), "{json}");
        assert_eq!(serde_json::from_str::<ModelConfig>(&json).unwrap(), inner);
        inner.activation_dropout = 1.0;
        assert!(inner.validate().unwrap_err().contains("activation_dropout"));
        inner.activation_dropout = f64::NAN;
        assert!(inner.validate().unwrap_err().contains("activation_dropout"));
    }
}
