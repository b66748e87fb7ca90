//! How the layers of a block are built from its [`BlockConfig`], and how many parameters a
//! [`ModelConfig`] implies: the arrows from the configs to the layers, kept out of
//! [`super::config`] so that the configs are a leaf the layers can import.

use super::attention::MultiHeadAttention;
use super::config::{BlockConfig, ModelConfig, NormPlacement, Normalization, RopeStyle};
use super::experts::{Ffn, MixtureOfExperts};
use super::feed_forward::FeedForward;
use super::layer_norm::LayerNorm;
use super::norm::{Norm, RmsNorm};
use super::param::{count_params, Init, ShapesOnly};
use super::residual::Residual;
use super::Seq2Seq;
use crate::backend::{Rope, RopeStyle as RotationStyle, Scores};
use crate::Float;

impl BlockConfig {
    /// A multi-head attention of this block, with its attention dropout; `rotary` for a
    /// self-attention when the block is rotary (never for a cross-attention). With
    /// [`qkv_bias`](BlockConfig::qkv_bias) the query, key and value projections get zero
    /// biases (drawing nothing from `init`'s generator). With [`qk_norm`](BlockConfig::qk_norm)
    /// every head's queries and keys are RMS-normalised (gains `[d_k]` of 1, with the block's ε
    /// and gain offset) before the rotation.
    pub fn attention<T: Float>(&self, rotary: bool, init: &mut impl Init) -> MultiHeadAttention<T> {
        let (d, h, kv, d_head) = (self.d_model, self.n_heads, self.n_kv_heads, self.d_head);
        let style = match self.rope_style {
            RopeStyle::Interleaved => RotationStyle::Interleaved,
            RopeStyle::HalfSplit => RotationStyle::HalfSplit,
        };
        let mut attention =
            MultiHeadAttention::with_head_width(d, (h, kv, d_head), self.bias, init)
                .with_dropout(self.attention_dropout)
                .with_rotary(rotary && self.rotary)
                .with_rope(Rope {
                    base: self.rope_base,
                    style,
                    attention_factor: 1.0,
                })
                .with_scores(Scores {
                    scale: self.query_pre_attn_scalar.map(|s| 1.0 / s.sqrt()),
                    softcap: self.attn_logit_softcap,
                });
        if self.qk_norm {
            let (eps, offset) = (self.layer_norm_eps, self.norm_weight_offset);
            attention = match self.qk_norm_whole {
                false => attention.with_qk_norm(eps, offset, init),
                true => attention.with_qk_norm_widths((h * d_head, kv * d_head), eps, offset, init),
            };
        }
        if self.qkv_bias && !self.bias {
            for linear in [
                &mut attention.q_proj,
                &mut attention.k_proj,
                &mut attention.v_proj,
            ] {
                linear.bias = Some(init.constant(&[linear.d_out], 0.0));
            }
        }
        attention
    }

    /// This block with `n_heads` heads of the same width (a pruned layer), keeping the
    /// key/value grouping: `n_heads · n_kv_heads / h` key/value heads.
    pub fn with_heads(&self, n_heads: usize) -> BlockConfig {
        BlockConfig {
            n_heads,
            n_kv_heads: n_heads * self.n_kv_heads / self.n_heads,
            ..*self
        }
    }

    /// The position-wise FFN of this block, with its activation dropout.
    pub fn feed_forward<T: Float>(&self, init: &mut impl Init) -> FeedForward<T> {
        FeedForward::with_bias(self.d_model, self.d_ff, self.activation, self.bias, init)
            .with_dropout(self.activation_dropout)
    }

    /// The FFN sublayer of this block: the position-wise FFN, or with
    /// [`experts`](BlockConfig::experts) a mixture of experts (router, then each expert's
    /// parameters from `init`, then the shared expert's and its gate's if it has one), with
    /// the activation dropout.
    pub fn ffn<T: Float>(&self, init: &mut impl Init) -> Ffn<T> {
        match self.experts {
            None => Ffn::Dense(Box::new(self.feed_forward(init))),
            Some(e) => {
                let mut moe = MixtureOfExperts::new(
                    self.d_model,
                    (e.n_experts, e.top_k, e.d_ff),
                    self.activation,
                    e.normalise,
                    init,
                );
                if let Some(width) = e.shared_d_ff {
                    moe = moe.with_shared(width, self.activation, init);
                }
                if e.bias {
                    moe = moe.with_biases(init);
                }
                for expert in &mut moe.experts {
                    expert.clamp = e.swiglu_clamp;
                }
                let shared = moe.shared.as_mut().map(|s| &mut s.ffn);
                for expert in moe.experts.iter_mut().chain(shared) {
                    expert.dropout = self.activation_dropout;
                }
                Ffn::Experts(Box::new(moe))
            }
        }
    }

    /// A norm of this block's kind and width (its parameters from `init`).
    pub fn norm<T: Float>(&self, init: &mut impl Init) -> Norm<T> {
        let (d, eps) = (self.d_model, self.layer_norm_eps);
        match self.normalization {
            Normalization::LayerNorm => Norm::Layer(LayerNorm::with_init(d, eps, init)),
            Normalization::RmsNorm => {
                Norm::Rms(RmsNorm::new(d, eps, init).with_offset(self.norm_weight_offset))
            }
        }
    }

    /// A residual connection of this block (its norm's parameters from `init`, then its
    /// post-norm's with [`post_norms`](BlockConfig::post_norms)); without
    /// [`input_norms`](BlockConfig::input_norms) the input norm is the identity, with
    /// [`residual_scale`](BlockConfig::residual_scale) the output is scaled before the sum.
    pub fn residual<T: Float>(&self, init: &mut impl Init) -> Residual<T> {
        let norm = match self.input_norms {
            true => self.norm(init),
            false => Norm::Identity,
        };
        let residual = Residual::with_norm(norm, self.norm, self.dropout);
        (residual.with_post_norm(self.post_norms.then(|| self.norm(init))))
            .with_scale(self.residual_scale)
    }

    /// The final norm a pre-LN stack ends with; `None` for post-LN.
    pub fn final_norm<T: Float>(&self, init: &mut impl Init) -> Option<Norm<T>> {
        (self.norm == NormPlacement::PreLn).then(|| self.norm(init))
    }
}

impl ModelConfig {
    /// The number of trainable scalars of the encoder-decoder this config describes (`None` on
    /// overflow), counted from the parameters' shapes (see `ShapesOnly`). Checked against a
    /// weights file before the model is allocated, so an edited config cannot ask for
    /// terabytes.
    pub fn n_params(&self) -> Option<usize> {
        count_params(&mut Seq2Seq::<f32>::new(self.clone(), &mut ShapesOnly))
    }
}

/// The options of [`ModelConfig`] the coming families need: each one computed against float64
/// arithmetic written out here, each one not computed yet refused by name, and the defaults
/// leaving every config (and the `config.json` written for it) as it was.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::Positions;
    use crate::model::embedding::Embedding;
    use crate::model::head::OutputHead;
    use crate::model::{LanguageModel, Module};
    use crate::rng::Rng;

    /// A small pre-LN RMSNorm decoder without biases (Llama's shape).
    fn llama_like() -> ModelConfig {
        let mut c = ModelConfig::preset("tiny", 13).unwrap();
        (c.d_model, c.n_heads, c.d_ff, c.max_len) = (8, 2, 12, 16);
        (c.n_encoder_layers, c.n_decoder_layers) = (0, 2);
        (c.norm, c.normalization, c.positions) = (
            NormPlacement::PreLn,
            Normalization::RmsNorm,
            Positions::Rotary,
        );
        (c.bias, c.scale_embeddings, c.dropout) = (false, false, 0.0);
        c
    }

    #[test]
    fn defaults_leave_configs_and_their_json_as_they_were() {
        let c = ModelConfig::preset("base", 100).unwrap();
        let json = serde_json::to_string(&c).unwrap();
        for key in [
            "qkv_bias",
            "qk_norm",
            "qk_norm_whole",
            "attn_logit_softcap",
            "final_logit_softcap",
            "norm_weight_offset",
            "embedding_scale",
            "layer_windows",
            "query_pre_attn_scalar",
            "post_norms",
            "sliding_rope_base",
        ] {
            assert!(!json.contains(key), "{key} written at its default: {json}");
        }
        assert_eq!(serde_json::from_str::<ModelConfig>(&json).unwrap(), c);
        let mut set = llama_like();
        (set.qkv_bias, set.final_logit_softcap) = (true, Some(30.0));
        (set.norm_weight_offset, set.embedding_scale) = (1.0, Some(2.5));
        let json = serde_json::to_string(&set).unwrap();
        assert!(json.contains(r#""qkv_bias":true"#), "{json}");
        assert_eq!(serde_json::from_str::<ModelConfig>(&json).unwrap(), set);
        set.validate().unwrap();
    }

    #[test]
    fn options_not_computed_yet_are_refused_by_name() {
        type Set = fn(&mut ModelConfig);
        let refused: [(&str, Set); 1] = [("norm_weight_offset", |c| {
            c.normalization = Normalization::LayerNorm;
            c.norm_weight_offset = 1.0;
        })];
        for (field, set) in refused {
            let mut c = llama_like();
            set(&mut c);
            let err = c.validate().unwrap_err();
            assert!(err.contains(field), "{field}: {err}");
            assert!(err.contains("not supported yet"), "{field}: {err}");
            // Loading a config.json that asks for it fails the same way.
            let json = serde_json::to_vec(&c).unwrap();
            let got = serde_json::from_slice::<ModelConfig>(&json).unwrap();
            assert_eq!(got.validate().unwrap_err(), err);
        }
        let mut c = llama_like();
        c.layer_windows = vec![None; 2];
        c.validate().unwrap();
        c.layer_windows = vec![Some(4), None];
        c.validate().unwrap();
        c.layer_windows = vec![None; 3];
        assert!(c.validate().unwrap_err().contains("layer_windows"));
        c.layer_windows = vec![None, Some(0)];
        let err = c.validate().unwrap_err();
        assert!(
            err.contains("layer_windows") && err.contains("0 keys"),
            "{err}"
        );
        for bad in [0.0, -1.0, f64::NAN] {
            let mut c = llama_like();
            c.final_logit_softcap = Some(bad);
            assert!(c.validate().unwrap_err().contains("final_logit_softcap"));
        }
    }

    /// Q, K and V have biases, the output projection and the FFN none; the biases enter the
    /// products (`x Wᵀ + b`, checked in float64), and zero biases compute the bias-free model.
    #[test]
    fn qkv_bias_is_on_the_query_key_and_value_projections_only() {
        let mut c = llama_like();
        c.qkv_bias = true;
        let mut m = LanguageModel::<f64>::new(c.clone(), &mut Rng::new(3));
        let names: Vec<String> = m.params_mut().into_iter().map(|(n, _)| n).collect();
        let biases: Vec<&String> = names.iter().filter(|n| n.ends_with(".bias")).collect();
        let want: Vec<String> = (0..2)
            .flat_map(|i| ["q", "k", "v"].map(|p| format!("layers.{i}.self_attn.{p}_proj.bias")))
            .collect();
        assert_eq!(biases, want.iter().collect::<Vec<_>>());
        assert_eq!(crate::model::lm::lm_n_params(&c), Some(m.n_params()));
        // Zero biases: the model without them, to the bit (same draws from the generator).
        let plain = LanguageModel::<f64>::new(llama_like(), &mut Rng::new(3));
        let tokens = [1, 5, 2, 7, 3, 3];
        let (want, _) = plain.forward(&tokens, 2, None);
        assert_eq!(m.forward(&tokens, 2, None).0, want);
        // Set biases: each projection is x Wᵀ + b.
        let mut rng = Rng::new(9);
        for (name, p) in m.params_mut() {
            if name.ends_with(".bias") {
                p.value
                    .data
                    .iter_mut()
                    .for_each(|b| *b = rng.uniform_range(-1.0, 1.0));
            }
        }
        let q = &m.blocks.layers[0].self_attn.q_proj;
        let x: Vec<f64> = (0..16).map(|i| (i as f64 * 0.37).sin()).collect();
        let (w, b) = (&q.weight.value.data, &q.bias.as_ref().unwrap().value.data);
        let got = q.forward(&x);
        for r in 0..2 {
            for o in 0..8 {
                let dot: f64 = (0..8).map(|k| x[r * 8 + k] * w[o * 8 + k]).sum();
                assert!((got[r * 8 + o] - (dot + b[o])).abs() < 1e-12);
            }
        }
        assert_ne!(m.forward(&tokens, 2, None).0, want);
    }

    /// `embedding_scale` multiplies the token rows by its factor (rotary: nothing added).
    #[test]
    fn embedding_scale_multiplies_the_token_rows() {
        let mut c = llama_like();
        c.embedding_scale = Some(2.5);
        let m = LanguageModel::<f64>::new(c, &mut Rng::new(1));
        let tokens = [4u32, 0, 12];
        let (x, _) = m.embedding.forward(&tokens, 3, 0, 0.0, None);
        let table = &m.embedding.weight.value.data;
        for (r, &t) in tokens.iter().enumerate() {
            for k in 0..8 {
                assert_eq!(x[r * 8 + k], 2.5 * table[t as usize * 8 + k]);
            }
        }
        let unscaled =
            Embedding::<f64>::with_positions(13, 8, 16, Positions::Rotary, &mut Rng::new(1));
        assert_eq!(unscaled.scale_override, None);
    }

    /// RMSNorm with a gain offset: `(g + o) ⊙ x / √(mean(x²) + ε)` in float64; its backward is
    /// that of the norm whose stored gain is `g + o`.
    #[test]
    fn norm_weight_offset_adds_to_the_gain() {
        let d = 6;
        let mut shifted = RmsNorm::<f64>::new(d, 1e-6, &mut Rng::new(0)).with_offset(1.0);
        let mut plain = RmsNorm::<f64>::new(d, 1e-6, &mut Rng::new(0));
        for (i, (g, h)) in shifted
            .gain
            .value
            .data
            .iter_mut()
            .zip(&mut plain.gain.value.data)
            .enumerate()
        {
            *g = (i as f64 * 0.7).cos() - 1.0;
            *h = *g + 1.0;
        }
        let x: Vec<f64> = (0..2 * d).map(|i| (i as f64 * 1.3).sin() + 0.1).collect();
        let (y, stats) = shifted.forward(&x);
        for r in 0..2 {
            let row = &x[r * d..(r + 1) * d];
            let rms = (row.iter().map(|v| v * v).sum::<f64>() / d as f64 + 1e-6).sqrt();
            for k in 0..d {
                let want = (shifted.gain.value.data[k] + 1.0) * row[k] / rms;
                assert!(
                    (y[r * d + k] - want).abs() < 1e-12,
                    "{} {want}",
                    y[r * d + k]
                );
            }
        }
        let (y_plain, stats_plain) = plain.forward(&x);
        assert_eq!(y, y_plain);
        let dy: Vec<f64> = (0..2 * d).map(|i| (i as f64 * 0.9).cos()).collect();
        assert_eq!(
            shifted.backward(&x, &stats, &dy),
            plain.backward(&x, &stats_plain, &dy)
        );
        assert_eq!(shifted.gain.grad.data, plain.gain.grad.data);
        // Built from a config, every RMSNorm of the model carries the offset.
        let mut c = llama_like();
        c.norm_weight_offset = 1.0;
        match &c.block().final_norm::<f64>(&mut Rng::new(0)) {
            Some(Norm::Rms(n)) => assert_eq!(n.offset, 1.0),
            other => panic!("{other:?}"),
        }
    }

    /// A logit bias (Marian's `final_logits_bias`): `z = h Wᵀ + b` against a float64 loop;
    /// the bias's gradient (and dhidden) against central differences of `L = Σ r ⊙ z`, through
    /// soft-capping too.
    #[test]
    fn an_output_bias_is_added_to_every_row_and_gets_its_gradient() {
        use crate::model::param::Module;
        let (vocab, d) = (5, 4);
        let mut rng = Rng::new(6);
        let embedding = Embedding::<f64>::new(vocab, d, 8, &mut rng);
        for cap in [None, Some(2.0)] {
            let mut head = OutputHead::<f64>::new(vocab, d, true, &mut rng)
                .with_softcap(cap)
                .with_bias(true, &mut rng);
            let b: Vec<f64> = (0..vocab).map(|i| 0.7 * (i as f64 * 1.3).sin()).collect();
            head.bias.as_mut().unwrap().value.data = b.clone();
            let hidden: Vec<f64> = (0..3 * d).map(|i| (i as f64 * 0.43).cos()).collect();
            let logits = head.logits(&embedding, &hidden);
            let w = &embedding.weight.value.data;
            for r in 0..3 {
                for v in 0..vocab {
                    let z: f64 = (0..d).map(|k| hidden[r * d + k] * w[v * d + k]).sum::<f64>() + b[v];
                    let want = cap.map_or(z, |c| c * (z / c).tanh());
                    assert!((logits[r * vocab + v] - want).abs() < 1e-12);
                }
            }
            let weights: Vec<f64> = (0..3 * vocab).map(|i| (i as f64 * 0.3).cos()).collect();
            let loss = |head: &OutputHead<f64>, h: &[f64]| -> f64 {
                let l = head.logits(&embedding, h);
                l.iter().zip(&weights).map(|(a, b)| a * b).sum()
            };
            head.zero_grads();
            let mut embedding_grad = embedding.clone();
            let dhidden = head.backward(&mut embedding_grad, &hidden, &weights);
            let db = head.bias.as_ref().unwrap().grad.data.clone();
            for (v, &got) in db.iter().enumerate() {
                let mut shifted = head.clone();
                shifted.bias.as_mut().unwrap().value.data[v] += 1e-6;
                let up = loss(&shifted, &hidden);
                shifted.bias.as_mut().unwrap().value.data[v] -= 2e-6;
                let numeric = (up - loss(&shifted, &hidden)) / 2e-6;
                assert!((got - numeric).abs() < 1e-6, "db {v}: {got} {numeric}");
            }
            for i in 0..hidden.len() {
                let (mut up, mut down) = (hidden.clone(), hidden.clone());
                up[i] += 1e-6;
                down[i] -= 1e-6;
                let numeric = (loss(&head, &up) - loss(&head, &down)) / 2e-6;
                assert!((dhidden[i] - numeric).abs() < 1e-6, "dh {i}");
            }
        }
    }

    /// Soft-capped logits are `c · tanh(h Wᵀ / c)` in float64, and the backward is their
    /// derivative (against central differences).
    #[test]
    fn final_logit_softcap_caps_the_logits_and_their_gradient() {
        let (vocab, d, cap) = (5, 4, 1.5);
        let mut rng = Rng::new(4);
        let embedding = Embedding::<f64>::new(vocab, d, 8, &mut rng);
        let mut head = OutputHead::<f64>::new(vocab, d, false, &mut rng).with_softcap(Some(cap));
        let hidden: Vec<f64> = (0..2 * d).map(|i| 3.0 * (i as f64 * 0.61).sin()).collect();
        let logits = head.logits(&embedding, &hidden);
        let w = head.output_proj.as_ref().unwrap().value.data.clone();
        for r in 0..2 {
            for v in 0..vocab {
                let z: f64 = (0..d).map(|k| hidden[r * d + k] * w[v * d + k]).sum();
                let want = cap * (z / cap).tanh();
                assert!((logits[r * vocab + v] - want).abs() < 1e-12);
            }
        }
        // L = Σ r·logits: dL/dhidden against central differences.
        let weights: Vec<f64> = (0..2 * vocab).map(|i| (i as f64 * 0.3).cos()).collect();
        let loss = |head: &OutputHead<f64>, h: &[f64]| -> f64 {
            let l = head.logits(&embedding, h);
            l.iter().zip(&weights).map(|(a, b)| a * b).sum()
        };
        let mut embedding_grad = embedding.clone();
        let dhidden = head.backward(&mut embedding_grad, &hidden, &weights);
        for i in 0..hidden.len() {
            let (mut up, mut down) = (hidden.clone(), hidden.clone());
            up[i] += 1e-6;
            down[i] -= 1e-6;
            let numeric = (loss(&head, &up) - loss(&head, &down)) / 2e-6;
            assert!(
                (dhidden[i] - numeric).abs() < 1e-6,
                "{i}: {} {numeric}",
                dhidden[i]
            );
        }
    }
}
