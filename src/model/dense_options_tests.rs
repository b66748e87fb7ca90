//! The options SmolLM3, Granite 3 and OLMo 2 need, each against float64 loops written out here
//! (forward) and central differences (backward): layers without rotary positions
//! ([`ModelConfig::layer_rope`]), a residual scale ([`ModelConfig::residual_scale`]:
//! `x + m · Sublayer(Norm(x))`), sublayers without input norms
//! ([`ModelConfig::input_norms`]: `x + PostNorm(Sublayer(x))`), logits divided by a constant
//! ([`ModelConfig::logit_divisor`]); then a language model with all of them at once: built as
//! configured, its incremental decoding against its full forward, its gradients against
//! central differences of its loss.

use super::attention_checks::{matmul_t, max_diff, numeric, sampled_gradients_match, uniform};
use super::config::Normalization;
use super::embedding::Embedding;
use super::head::OutputHead;
use super::linear::Linear;
use super::norm::{Norm, RmsNorm};
use super::residual::Residual;
use super::{Activation, LanguageModel, ModelConfig, Module, NormPlacement, Positions};
use crate::backend::TILED_FROM_KEYS;
use crate::rng::Rng;

/// `g ⊙ x / √(mean(x²) + ε)` per row, in loops.
fn rms_loops(x: &[f64], g: &[f64], eps: f64) -> Vec<f64> {
    let d = g.len();
    let mut y = x.to_vec();
    for row in y.chunks_exact_mut(d) {
        let rms = (row.iter().map(|v| v * v).sum::<f64>() / d as f64 + eps).sqrt();
        for (v, gk) in row.iter_mut().zip(g) {
            *v = gk * *v / rms;
        }
    }
    y
}

/// An RMSNorm of width `d` with random gains around 1.
fn rms_norm(d: usize, eps: f64, seed: u64) -> RmsNorm<f64> {
    let mut n = RmsNorm::<f64>::new(d, eps, &mut Rng::new(0));
    n.gain.value.data = uniform(d, seed)
        .into_iter()
        .map(|v| 1.0 + 0.5 * v)
        .collect();
    n
}

/// A residual scale `m`: pre-LN `x + m · W Norm(x)` and post-LN `Norm(x + m · W x)` against
/// loops (with `m` 1 they differ: the scale is applied); dx against central differences; the
/// inference paths agree with the training one.
#[test]
fn a_residual_scale_matches_float64_loops_and_central_differences() {
    let (d, rows, eps, m) = (6, 3, 1e-6, 0.37);
    let norm = rms_norm(d, eps, 4);
    let gain = norm.gain.value.data.clone();
    let mut lin = Linear::<f64>::with_bias(d, d, false, &mut Rng::new(6));
    let w = lin.weight.value.data.clone();
    let x: Vec<f64> = uniform(rows * d, 7).into_iter().map(|v| 2.0 * v).collect();
    let r = uniform(rows * d, 8);
    let dot = |y: Vec<f64>| -> f64 { y.iter().zip(&r).map(|(a, b)| a * b).sum() };
    for placement in [NormPlacement::PreLn, NormPlacement::PostLn] {
        let loops = |x: &[f64]| -> Vec<f64> {
            match placement {
                NormPlacement::PreLn => {
                    let sub = matmul_t(&rms_loops(x, &gain, eps), &w, d, d);
                    x.iter().zip(&sub).map(|(a, b)| a + m * b).collect()
                }
                NormPlacement::PostLn => {
                    let sub = matmul_t(x, &w, d, d);
                    let sum: Vec<f64> = x.iter().zip(&sub).map(|(a, b)| a + m * b).collect();
                    rms_loops(&sum, &gain, eps)
                }
            }
        };
        let plain = Residual::with_norm(Norm::Rms(norm.clone()), placement, 0.0);
        let mut res = plain.clone().with_scale(Some(m));
        let (y, cache) = res.forward(x.clone(), None, |u| (lin.forward(u), ()));
        assert!(max_diff(&y, &loops(&x)) < 1e-12, "{placement:?}");
        assert!(max_diff(&plain.apply(x.clone(), |u| lin.forward(u)), &y) > 1e-3);
        assert_eq!(res.apply(x.clone(), |u| lin.forward(u)), y);
        let last = res.apply_last(x.clone(), rows, d, |u| lin.forward(&u[(rows - 1) * d..]));
        assert!(
            max_diff(&last, &y[(rows - 1) * d..]) < 1e-14,
            "{placement:?}"
        );
        let dx = res.backward(cache, &r, |u, _, dy| lin.backward(u, dy));
        for (i, &got) in dx.iter().enumerate() {
            let n = numeric(&|x: &[f64]| dot(loops(x)), &x, i, 1e-6);
            assert!((got - n).abs() < 1e-8, "{placement:?} dx {i}: {got} {n}");
        }
    }
}

/// OLMo 2's connection, `x + PostNorm(W x)` (the input norm the identity, no parameters),
/// against loops; dx and the post-norm's gain gradient against central differences.
#[test]
fn sublayers_without_input_norms_match_float64_loops_and_central_differences() {
    let (d, rows, eps) = (6, 3, 1e-6);
    let post = rms_norm(d, eps, 5);
    let mut res = Residual::with_norm(Norm::Identity, NormPlacement::PreLn, 0.0)
        .with_post_norm(Some(Norm::Rms(post.clone())));
    let mut lin = Linear::<f64>::with_bias(d, d, false, &mut Rng::new(6));
    let w = lin.weight.value.data.clone();
    let x: Vec<f64> = uniform(rows * d, 7).into_iter().map(|v| 2.0 * v).collect();
    let loops = |x: &[f64], post_gain: &[f64]| -> Vec<f64> {
        let out = rms_loops(&matmul_t(x, &w, d, d), post_gain, eps);
        x.iter().zip(&out).map(|(a, b)| a + b).collect()
    };
    let post_gain = post.gain.value.data.clone();
    let (y, cache) = res.forward(x.clone(), None, |u| (lin.forward(u), ()));
    assert!(max_diff(&y, &loops(&x, &post_gain)) < 1e-12);
    assert_eq!(res.apply(x.clone(), |u| lin.forward(u)), y);
    let r = uniform(rows * d, 8);
    let dot = |y: Vec<f64>| -> f64 { y.iter().zip(&r).map(|(a, b)| a * b).sum() };
    let dx = res.backward(cache, &r, |u, _, dy| lin.backward(u, dy));
    for (i, &got) in dx.iter().enumerate() {
        let n = numeric(&|x: &[f64]| dot(loops(x, &post_gain)), &x, i, 1e-6);
        assert!((got - n).abs() < 1e-8, "dx {i}: {got} {n}");
    }
    let Some(Norm::Rms(post_after)) = &res.post_norm else {
        unreachable!()
    };
    for i in 0..d {
        let n = numeric(&|g: &[f64]| dot(loops(&x, g)), &post_gain, i, 1e-6);
        let got = post_after.gain.grad.data[i];
        assert!((got - n).abs() < 1e-8, "d post gain {i}: {got} {n}");
    }
    // The identity has no parameters.
    assert_eq!(Norm::<f64>::Identity.n_params(), 0);
}

/// Logits divided by `s`, `z = h Wᵀ / s`, against loops; dh and dW against central
/// differences.
#[test]
fn a_logit_divisor_matches_float64_loops_and_central_differences() {
    let (vocab, d, rows, s) = (7, 4, 3, 2.5);
    let mut init = Rng::new(3);
    let mut emb = Embedding::<f64>::with_positions(vocab, d, 16, Positions::Rotary, &mut init);
    let mut head = OutputHead::<f64>::new(vocab, d, false, &mut init).with_divisor(Some(s));
    let w = head.output_proj.as_ref().unwrap().value.data.clone();
    let h = uniform(rows * d, 9);
    let loops = |h: &[f64], w: &[f64]| -> Vec<f64> {
        matmul_t(h, w, d, vocab).iter().map(|z| z / s).collect()
    };
    let z = head.logits(&emb, &h);
    assert!(max_diff(&z, &loops(&h, &w)) < 1e-13);
    let r = uniform(rows * vocab, 10);
    let dot = |z: Vec<f64>| -> f64 { z.iter().zip(&r).map(|(a, b)| a * b).sum() };
    let dh = head.backward(&mut emb, &h, &r);
    for (i, &got) in dh.iter().enumerate() {
        let n = numeric(&|h: &[f64]| dot(loops(h, &w)), &h, i, 1e-6);
        assert!((got - n).abs() < 1e-9, "dh {i}: {got} {n}");
    }
    let dw = head.output_proj.as_ref().unwrap().grad.data.clone();
    for (i, &got) in dw.iter().enumerate() {
        let n = numeric(&|w: &[f64]| dot(loops(&h, w)), &w, i, 1e-6);
        assert!((got - n).abs() < 1e-9, "dW {i}: {got} {n}");
    }
}

/// A one-layer model of RMSNorm blocks and unscaled embeddings, rotary unless `nope`.
fn one_layer(nope: bool) -> LanguageModel<f64> {
    let mut c = ModelConfig::preset("tiny", 13).unwrap();
    (c.d_model, c.n_heads, c.d_ff, c.max_len) = (8, 2, 12, 16);
    (c.n_encoder_layers, c.n_decoder_layers) = (0, 1);
    (c.norm, c.normalization, c.positions) = (
        NormPlacement::PreLn,
        Normalization::RmsNorm,
        Positions::Rotary,
    );
    (c.bias, c.scale_embeddings, c.dropout) = (false, false, 0.0);
    if nope {
        c.layer_rope = vec![false];
    }
    c.validate().unwrap();
    LanguageModel::<f64>::new(c, &mut Rng::new(11))
}

/// A NoPE layer sees no positions: one such layer's output at the last position is the same
/// whatever the order of the tokens before it (attention over a set of keys), to rounding;
/// the same layer rotating tells the orders apart.
#[test]
fn a_layer_without_rotary_positions_sees_no_order() {
    let last = |m: &LanguageModel<f64>, tokens: &[u32]| -> Vec<f64> {
        let v = m.config.vocab_size;
        m.forward(tokens, 1, None).0[(tokens.len() - 1) * v..].to_vec()
    };
    let (a, b) = ([3, 9, 4, 7, 2, 5], [7, 4, 9, 2, 3, 5]);
    let nope = one_layer(true);
    assert!(!nope.blocks.layers[0].self_attn.rotary);
    assert!(max_diff(&last(&nope, &a), &last(&nope, &b)) < 1e-12);
    let rotary = one_layer(false);
    assert!(rotary.blocks.layers[0].self_attn.rotary);
    assert!(max_diff(&last(&rotary, &a), &last(&rotary, &b)) > 1e-6);
    // The two models hold the same parameters: only the rotation differs.
    assert!(max_diff(&last(&rotary, &a), &last(&nope, &a)) > 1e-6);
}

/// A small language model with every option of the three families at once: a rotary layer
/// and a NoPE one (SmolLM3), sublayer outputs scaled by 0.4 and logits divided by 2.5
/// (Granite), no input norms but post-norms, query/key norms over the whole projections
/// (OLMo 2), grouped-query attention, SwiGLU.
fn dense_like(max_len: usize) -> ModelConfig {
    let mut c = ModelConfig::preset("tiny", 13).unwrap();
    (c.d_model, c.n_heads, c.d_ff, c.max_len) = (8, 2, 12, max_len);
    (c.n_encoder_layers, c.n_decoder_layers, c.n_kv_heads) = (0, 2, Some(1));
    (c.norm, c.normalization, c.positions) = (
        NormPlacement::PreLn,
        Normalization::RmsNorm,
        Positions::Rotary,
    );
    (c.bias, c.scale_embeddings, c.dropout) = (false, false, 0.0);
    c.activation = Activation::SiluGated;
    c.layer_rope = vec![true, false];
    (c.residual_scale, c.logit_divisor) = (Some(0.4), Some(2.5));
    (c.post_norms, c.input_norms) = (true, false);
    (c.qk_norm, c.qk_norm_whole) = (true, true);
    c.embedding_scale = Some(3.0);
    c
}

/// Random gains around 1 and larger weights, so every option matters.
fn randomised(c: ModelConfig, seed: u64) -> LanguageModel<f64> {
    let mut m = LanguageModel::<f64>::new(c, &mut Rng::new(seed));
    let mut rng = Rng::new(seed + 1);
    for (name, p) in m.params_mut() {
        let norm = name.ends_with("norm.weight");
        for v in p.value.data.iter_mut() {
            let u = rng.uniform_range(-1.0, 1.0);
            *v = if norm { 1.0 + 0.3 * u } else { 1.2 * u };
        }
    }
    m
}

/// The options reach the layers (rotation per layer, scales, the head's divisor, the norms'
/// parameters by name), and incremental decoding gives the full forward's log-probabilities
/// at every position.
#[test]
fn dense_like_model_is_built_as_configured_and_decodes_as_it_forwards() {
    let c = dense_like(16);
    c.validate().unwrap();
    let mut m = randomised(c.clone(), 40);
    let layers = &m.blocks.layers;
    let rotary: Vec<bool> = layers.iter().map(|l| l.self_attn.rotary).collect();
    assert_eq!(rotary, [true, false]);
    assert_eq!(layers[1].ffn_res.scale, Some(0.4));
    assert!(layers[0].self_attn_res.norm.is_identity());
    assert_eq!(m.head.divisor, Some(2.5));
    let names: Vec<String> = m.params_mut().into_iter().map(|(n, _)| n).collect();
    for want in [
        "layers.1.self_attn_post_norm.weight",
        "layers.1.ffn_post_norm.weight",
        "layers.1.self_attn.q_norm.weight",
        "final_norm.weight",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }
    for absent in ["layers.0.self_attn_norm.weight", "layers.0.ffn_norm.weight"] {
        assert!(!names.iter().any(|n| n == absent), "{absent} in {names:?}");
    }
    assert_eq!(crate::model::lm::lm_n_params(&c), Some(m.n_params()));
    super::attention_checks::check_lm_decoding(&m, &[1, 5, 2, 7, 3, 3, 9, 4, 0, 2, 6, 8, 1, 1], 2);
}

/// The loss's gradient in a sample of every parameter against central differences, over a
/// short sequence (plain attention kernel) and one of `TILED_FROM_KEYS + 2` tokens (the tiled
/// kernel).
#[test]
fn dense_like_model_gradients_match_central_differences() {
    for len in [6, TILED_FROM_KEYS + 2] {
        let m = randomised(dense_like(len), 50);
        let tokens: Vec<u32> = (0..len as u32).map(|i| (i * 7 + 3) % 13).collect();
        let targets: Vec<u32> = (0..len as u32).map(|i| (i * 5 + 1) % 13).collect();
        let mut with_grads = m.clone();
        with_grads.forward_backward(&tokens, &targets, 1, 0.0, 1.0, None);
        let loss = |m: &LanguageModel<f64>| m.evaluate(&tokens, &targets, 1).loss_sum;
        let what = format!("len {len}");
        let checked = sampled_gradients_match(&m, &mut with_grads, loss, &what);
        assert!(checked > 30, "{checked}");
    }
}

/// Invalid values are refused by name; the options are written to `config.json` only when
/// set, and read back.
#[test]
fn dense_options_are_validated_and_round_trip() {
    let plain = ModelConfig::preset("base", 100).unwrap();
    let json = serde_json::to_string(&plain).unwrap();
    for key in [
        "layer_rope",
        "residual_scale",
        "logit_divisor",
        "input_norms",
    ] {
        assert!(!json.contains(key), "{key} written at its default: {json}");
    }
    let c = dense_like(16);
    let json = serde_json::to_string(&c).unwrap();
    for key in [
        "layer_rope",
        "residual_scale",
        "logit_divisor",
        r#""input_norms":false"#,
    ] {
        assert!(json.contains(key), "{key}: {json}");
    }
    assert_eq!(serde_json::from_str::<ModelConfig>(&json).unwrap(), c);
    type Set = fn(&mut ModelConfig);
    let bad: [(&str, Set); 8] = [
        ("layer_rope has 3 entries for 2", |c| {
            c.layer_rope = vec![true; 3]
        }),
        ("layer_rope is set but the positions are not rotary", |c| {
            c.positions = Positions::Learned
        }),
        ("residual_scale 0", |c| c.residual_scale = Some(0.0)),
        ("residual_scale NaN", |c| c.residual_scale = Some(f64::NAN)),
        ("logit_divisor -1", |c| c.logit_divisor = Some(-1.0)),
        ("logit_divisor inf", |c| {
            c.logit_divisor = Some(f64::INFINITY)
        }),
        ("input_norms false needs pre-LN", |c| {
            (c.norm, c.post_norms) = (NormPlacement::PostLn, false)
        }),
        ("decoder-only option", |c| c.n_encoder_layers = 2),
    ];
    for (named, set) in bad {
        let mut c = dense_like(16);
        set(&mut c);
        let err = c.validate().unwrap_err();
        assert!(err.contains(named), "{named}: {err}");
    }
}
