//! Attention sinks in the layer ([`MultiHeadAttention::sinks`], gpt-oss): the forward against
//! the float64 loops of `window_tests` with each head's sink one more logit of the softmax (plain
//! and tiled kernels, grouped heads, rotary, biases, a sliding window, padding), the backward —
//! the sinks' own gradient included — against central differences, every decoding layout
//! against the full forward, and a language model with gpt-oss's parts (sinks, biases,
//! alternating windows, experts with biases and the clamped SwiGLU) decoding as its forward.

use super::attention::MultiHeadAttention;
use super::attention_checks::{causal, check_backward, check_decoding, check_lm_decoding, max_diff, uniform};
use super::config::{ExpertsConfig, Normalization, SwigluClamp};
use super::param::Param;
use super::window_tests::{layer, windowed_loops, D, HEADS};
use super::{Activation, LanguageModel, ModelConfig, Module, NormPlacement, Positions};
use crate::backend::TILED_FROM_KEYS;
use crate::rng::Rng;

/// [`layer`] with sinks: one large enough to take most of its head's weight, one that takes
/// little.
fn sinked(seed: u64, kv_heads: usize, window: Option<usize>) -> MultiHeadAttention<f64> {
    let mut m = layer(seed, kv_heads, true, window);
    let mut sinks = Param::constant(&[HEADS], 0.0);
    sinks.value.data = vec![1.7, -0.6];
    m.sinks = Some(sinks);
    m
}

#[test]
fn sinked_forward_matches_float64_loops() {
    let long = TILED_FROM_KEYS + 5;
    for (batch, len, lens, kv_heads, w) in [
        (2, 9, vec![9, 6], HEADS, None),
        (2, 9, vec![9, 9], 1, Some(3)),
        (1, long, vec![long], 1, Some(40)),
        (1, long, vec![long], HEADS, None),
    ] {
        let m = sinked(len as u64, kv_heads, w);
        let x = uniform(batch * len * D, 3);
        let (y, cache) = m.forward(&x, &x, batch, causal(&lens), None);
        assert_eq!(cache.probs().is_none(), len >= TILED_FROM_KEYS, "kernel");
        let want = windowed_loops(&m, &x, batch, &lens);
        for (b, &real) in lens.iter().enumerate() {
            let rows = (b * len * D)..((b * len + real) * D);
            let err = max_diff(&y[rows.clone()], &want[rows]);
            assert!(err < 1e-12, "len {len} window {w:?} row {b}: {err:e}");
        }
        // The sinks matter: without them the output is another.
        let mut plain = m.clone();
        plain.sinks = None;
        assert!(max_diff(&plain.forward(&x, &x, batch, causal(&lens), None).0, &y) > 1e-3);
    }
}

#[test]
fn sinked_backward_matches_central_differences() {
    let long = TILED_FROM_KEYS + 3;
    for (len, kv_heads, w) in [(8, HEADS, None), (8, 1, Some(3)), (long, 1, Some(30))] {
        let mut m = sinked(20 + len as u64, kv_heads, w);
        let (x, r) = (uniform(len * D, 21), uniform(len * D, 22));
        let what = format!("len {len}");
        check_backward(&mut m, (&x, &r), 1, causal(&[len]), 23, |_, n| n / 5 + 1, &what);
        let sinks = m.sinks.as_ref().unwrap();
        assert!(sinks.grad.data.iter().all(|g| g.abs() > 1e-6), "{what}: the sinks' gradient");
    }
}

#[test]
fn sinked_decoding_matches_the_full_forward() {
    let (batch, len, split) = (2, 11, 5);
    for (kv_heads, w) in [(HEADS, None), (1, Some(3))] {
        let m = sinked(30, kv_heads, w);
        let x = uniform(batch * len * D, 31);
        let (want, _) = m.forward(&x, &x, batch, causal(&[len; 2]), None);
        check_decoding(&m, (&x, &want), (batch, len, split), "sinks", |_| {});
    }
}

/// A language model of gpt-oss's parts: every position decoded equals the full forward, the
/// sinks and the experts' biases are parameters under their names.
#[test]
fn a_language_model_of_gpt_oss_parts_decodes_as_its_forward() {
    let mut c = ModelConfig::preset("tiny", 40).unwrap();
    (c.d_model, c.n_heads, c.d_ff, c.n_encoder_layers, c.n_decoder_layers) = (16, 2, 24, 0, 2);
    (c.norm, c.normalization, c.positions) =
        (NormPlacement::PreLn, Normalization::RmsNorm, Positions::Rotary);
    (c.activation, c.bias, c.dropout, c.tie_embeddings) = (Activation::SiluGated, true, 0.0, false);
    (c.attention_sinks, c.layer_windows) = (true, vec![Some(3), None]);
    c.experts = Some(ExpertsConfig {
        n_experts: 4,
        top_k: 2,
        d_ff: 8,
        normalise: true,
        shared_d_ff: None,
        bias: true,
        swiglu_clamp: Some(SwigluClamp {
            alpha: 1.702,
            limit: 0.5,
        }),
    });
    c.validate().unwrap();
    let json = serde_json::to_string(&c).unwrap();
    assert_eq!(serde_json::from_str::<ModelConfig>(&json).unwrap(), c);
    let mut lm = LanguageModel::<f64>::new(c.clone(), &mut Rng::new(5));
    let mut rng = Rng::new(6);
    let mut names = Vec::new();
    for (name, p) in lm.params_mut() {
        if name.ends_with("sinks") || name.ends_with("bias") {
            p.value.data.iter_mut().for_each(|v| *v = rng.uniform_range(-1.0, 1.0));
        }
        names.push(name);
    }
    for want in [
        "layers.0.self_attn.sinks",
        "layers.1.self_attn.out_proj.bias",
        "layers.0.ffn.router.bias",
        "layers.1.ffn.experts.3.gate.bias",
        "layers.0.ffn.experts.0.linear2.bias",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing");
    }
    check_lm_decoding(&lm, &[3, 17, 5, 33, 8, 21, 1, 9, 30, 2, 11, 4], 2);
    // Refused: the clamp without the gated SwiGLU, sinks on pruned heads.
    let mut bad = c.clone();
    bad.activation = Activation::GeluErf;
    assert!(bad.validate().unwrap_err().contains("swiglu_clamp"));
    let mut bad = c;
    bad.n_encoder_layers = 1;
    assert!(bad.validate().is_err());
}
