//! The options Gemma 2 and 3 need, each against float64 loops written out here (forward) and
//! central differences (backward): GeGLU ([`Activation::GeluTanhGated`]), post-norms
//! ([`ModelConfig::post_norms`]: `x + PostNorm(Sublayer(Norm(x)))`), and a language model with
//! every Gemma option at once (soft-capped scores and logits, `query_pre_attn_scalar`, local
//! and global layers with their own rotary bases, gains stored as `g − 1`, scaled embeddings):
//! its gradients, through the plain and the tiled attention kernels, against central
//! differences of its loss, and its incremental decoding against its full forward.

use super::attention_checks::{matmul_t, max_diff, numeric, sampled_gradients_match, uniform};
use super::config::Normalization;
use super::feed_forward::FeedForward;
use super::linear::Linear;
use super::norm::{Norm, RmsNorm};
use super::residual::Residual;
use super::{Activation, LanguageModel, ModelConfig, Module, NormPlacement, Positions};
use crate::backend::TILED_FROM_KEYS;
use crate::rng::Rng;

/// GPT-2's tanh GELU at one point, written out: `½ x (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
fn gelu_tanh(x: f64) -> f64 {
    let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044_715 * x * x * x);
    0.5 * x * (1.0 + u.tanh())
}

/// `(g + 1) ⊙ x / √(mean(x²) + ε)` per row, in loops.
fn rms_loops(x: &[f64], g: &[f64], eps: f64) -> Vec<f64> {
    let d = g.len();
    let mut y = x.to_vec();
    for row in y.chunks_exact_mut(d) {
        let rms = (row.iter().map(|v| v * v).sum::<f64>() / d as f64 + eps).sqrt();
        for (v, gk) in row.iter_mut().zip(g) {
            *v = (gk + 1.0) * *v / rms;
        }
    }
    y
}

/// GeGLU: `down(gelu_tanh(gate(x)) ⊙ up(x))` against loops; dx and the gate's weight gradient
/// against central differences of `L = Σ r ⊙ y`.
#[test]
fn geglu_matches_float64_loops_and_central_differences() {
    let (d, d_ff, rows) = (5, 7, 3);
    let mut ffn =
        FeedForward::<f64>::with_bias(d, d_ff, Activation::GeluTanhGated, false, &mut Rng::new(1));
    for l in [
        &mut ffn.linear1,
        &mut ffn.linear2,
        ffn.gate.as_mut().unwrap(),
    ] {
        l.weight.value.data = uniform(l.weight.value.data.len(), l.d_out as u64 + 7)
            .into_iter()
            .map(|v| 1.5 * v)
            .collect();
    }
    let x = uniform(rows * d, 2);
    let loops = |ffn: &FeedForward<f64>, x: &[f64]| -> Vec<f64> {
        let gate = ffn.gate.as_ref().unwrap();
        let g = matmul_t(x, &gate.weight.value.data, d, d_ff);
        let u = matmul_t(x, &ffn.linear1.weight.value.data, d, d_ff);
        let h: Vec<f64> = g.iter().zip(&u).map(|(g, u)| gelu_tanh(*g) * u).collect();
        matmul_t(&h, &ffn.linear2.weight.value.data, d_ff, d)
    };
    let (y, cache) = ffn.forward(&x);
    assert!(max_diff(&y, &loops(&ffn, &x)) < 1e-12);
    // Not SwiGLU: the same weights gated by silu give another output.
    let mut silu = ffn.clone();
    silu.activation = Activation::SiluGated;
    assert!(max_diff(&silu.forward(&x).0, &y) > 1e-3);
    let r = uniform(rows * d, 3);
    let loss = |ffn: &FeedForward<f64>, x: &[f64]| -> f64 {
        loops(ffn, x).iter().zip(&r).map(|(a, b)| a * b).sum()
    };
    let dx = ffn.backward(&x, cache, &r);
    for (i, &got) in dx.iter().enumerate() {
        let n = numeric(&|x: &[f64]| loss(&ffn, x), &x, i, 1e-6);
        assert!((got - n).abs() < 1e-8, "dx {i}: {got} {n}");
    }
    let grad = ffn.gate.as_ref().unwrap().weight.grad.data.clone();
    let w0 = ffn.gate.as_ref().unwrap().weight.value.data.clone();
    let by_gate = |w: &[f64]| {
        let mut f = ffn.clone();
        f.gate.as_mut().unwrap().weight.value.data = w.to_vec();
        loss(&f, &x)
    };
    for (i, &got) in grad.iter().enumerate() {
        let n = numeric(&by_gate, &w0, i, 1e-6);
        assert!((got - n).abs() < 1e-8, "dW_gate {i}: {got} {n}");
    }
}

/// A pre-LN residual with a post-norm, `x + PostNorm(W · Norm(x))`, against loops; dx and the
/// post-norm's gain gradient against central differences. Without a post-norm it is the plain
/// pre-LN connection.
#[test]
fn post_norms_match_float64_loops_and_central_differences() {
    let (d, rows, eps) = (6, 3, 1e-6);
    let gains = |seed| {
        let mut n = RmsNorm::<f64>::new(d, eps, &mut Rng::new(0)).with_offset(1.0);
        n.gain.value.data = uniform(d, seed).into_iter().map(|v| 0.5 * v).collect();
        n
    };
    let (pre, post) = (gains(4), gains(5));
    let mut res = Residual::with_norm(Norm::Rms(pre.clone()), NormPlacement::PreLn, 0.0)
        .with_post_norm(Some(Norm::Rms(post.clone())));
    let mut lin = Linear::<f64>::with_bias(d, d, false, &mut Rng::new(6));
    let x: Vec<f64> = uniform(rows * d, 7).into_iter().map(|v| 2.0 * v).collect();
    let w = lin.weight.value.data.clone();
    let loops = |x: &[f64], post_gain: &[f64]| -> Vec<f64> {
        let normed = rms_loops(x, &pre.gain.value.data, eps);
        let sub = matmul_t(&normed, &w, d, d);
        let out = rms_loops(&sub, post_gain, eps);
        x.iter().zip(&out).map(|(a, b)| a + b).collect()
    };
    let post_gain = post.gain.value.data.clone();
    let (y, cache) = res.forward(x.clone(), None, |u| (lin.forward(u), ()));
    assert!(max_diff(&y, &loops(&x, &post_gain)) < 1e-12);
    let plain = Residual::with_norm(Norm::Rms(pre.clone()), NormPlacement::PreLn, 0.0);
    assert!(max_diff(&plain.apply(x.clone(), |u| lin.forward(u)), &y) > 1e-3);
    // The inference paths agree with the training one.
    assert_eq!(res.apply(x.clone(), |u| lin.forward(u)), y);
    let last = res.apply_last(x.clone(), rows, d, |u| lin.forward(&u[(rows - 1) * d..]));
    assert!(max_diff(&last, &y[(rows - 1) * d..]) < 1e-14);
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
}

/// A small language model with every Gemma option: GeGLU, post-norms, gains stored as `g − 1`,
/// embeddings scaled by `√d`, a soft cap of 1 on the scores (it bites) and of 3 on the logits,
/// `query_pre_attn_scalar` 3, a local layer of window 3 rotating with base 100 and a global one
/// with base 10000, tied output projection.
fn gemma_like(max_len: usize) -> ModelConfig {
    let mut c = ModelConfig::preset("tiny", 13).unwrap();
    (c.d_model, c.n_heads, c.d_ff, c.max_len) = (8, 2, 12, max_len);
    (c.n_encoder_layers, c.n_decoder_layers, c.n_kv_heads) = (0, 2, Some(1));
    (c.norm, c.normalization, c.positions) = (
        NormPlacement::PreLn,
        Normalization::RmsNorm,
        Positions::Rotary,
    );
    (c.bias, c.scale_embeddings, c.dropout) = (false, false, 0.0);
    c.activation = Activation::GeluTanhGated;
    (c.post_norms, c.norm_weight_offset) = (true, 1.0);
    c.embedding_scale = Some((8f32).sqrt() as f64);
    (c.attn_logit_softcap, c.final_logit_softcap) = (Some(1.0), Some(3.0));
    c.query_pre_attn_scalar = Some(3.0);
    c.layer_windows = vec![Some(3), None];
    (c.rope_base, c.sliding_rope_base) = (10000.0, Some(100.0));
    c
}

/// Random gains (`g − 1` around 0) and larger weights, so every option matters.
fn randomised(c: ModelConfig, seed: u64) -> LanguageModel<f64> {
    let mut m = LanguageModel::<f64>::new(c, &mut Rng::new(seed));
    let mut rng = Rng::new(seed + 1);
    for (name, p) in m.params_mut() {
        let scale = if name.ends_with("norm.weight") {
            0.3
        } else {
            1.2
        };
        for v in p.value.data.iter_mut() {
            *v = scale * rng.uniform_range(-1.0, 1.0);
        }
    }
    m
}

/// The options reach the layers (per-layer rotary bases, windows, score scale and cap,
/// post-norm parameters by name), and incremental decoding gives the full forward's
/// log-probabilities at every position.
#[test]
fn gemma_like_model_is_built_as_configured_and_decodes_as_it_forwards() {
    let c = gemma_like(16);
    c.validate().unwrap();
    let mut m = randomised(c.clone(), 20);
    let layers = &m.blocks.layers;
    let bases: Vec<f64> = layers.iter().map(|l| l.self_attn.rope.base).collect();
    assert_eq!(bases, [100.0, 10000.0]);
    assert_eq!(layers[1].self_attn.window, None);
    let scores = layers[0].self_attn.scores;
    assert_eq!(
        (scores.scale, scores.softcap),
        (Some(1.0 / 3f64.sqrt()), Some(1.0))
    );
    let names: Vec<String> = m.params_mut().into_iter().map(|(n, _)| n).collect();
    for want in [
        "layers.1.self_attn_norm.weight",
        "layers.1.self_attn_post_norm.weight",
        "layers.1.ffn_norm.weight",
        "layers.1.ffn_post_norm.weight",
        "layers.1.ffn.gate.weight",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }
    assert_eq!(crate::model::lm::lm_n_params(&c), Some(m.n_params()));
    super::attention_checks::check_lm_decoding(
        &m,
        &[1, 5, 2, 7, 3, 3, 9, 4, 0, 2, 6, 8, 1, 1],
        2,
    );
}

/// The loss's gradient in a sample of every parameter against central differences, over a
/// short sequence (plain attention kernel) and one of `TILED_FROM_KEYS + 2` tokens (the tiled
/// kernel, whose backward recomputes the capped scores).
#[test]
fn gemma_like_model_gradients_match_central_differences() {
    for len in [6, TILED_FROM_KEYS + 2] {
        let c = gemma_like(len);
        let m = randomised(c, 30);
        let tokens: Vec<u32> = (0..len as u32).map(|i| (i * 7 + 3) % 13).collect();
        let targets: Vec<u32> = (0..len as u32).map(|i| (i * 5 + 1) % 13).collect();
        let mut with_grads = m.clone();
        with_grads.forward_backward(&tokens, &targets, 1, 0.0, 1.0, None);
        let loss = |m: &LanguageModel<f64>| m.evaluate(&tokens, &targets, 1).loss_sum;
        // The caps bite: without them the loss is another.
        let mut uncapped = m.clone();
        for l in uncapped.blocks.layers.iter_mut() {
            l.self_attn.scores.softcap = None;
        }
        assert!((loss(&uncapped) - loss(&m)).abs() > 1e-3);
        let what = format!("len {len}");
        let checked = sampled_gradients_match(&m, &mut with_grads, loss, &what);
        assert!(checked > 40, "{checked}");
    }
}

/// Invalid values of the options are refused by name; the options are written to
/// `config.json` only when set, and read back.
#[test]
fn gemma_options_are_validated_and_round_trip() {
    let c = gemma_like(16);
    let json = serde_json::to_string(&c).unwrap();
    for key in ["query_pre_attn_scalar", "post_norms", "sliding_rope_base"] {
        assert!(json.contains(key), "{json}");
    }
    assert_eq!(serde_json::from_str::<ModelConfig>(&json).unwrap(), c);
    type Set = fn(&mut ModelConfig);
    let bad: [(&str, Set); 6] = [
        ("attn_logit_softcap", |c| c.attn_logit_softcap = Some(0.0)),
        ("attn_logit_softcap", |c| {
            c.attn_logit_softcap = Some(f64::NAN)
        }),
        ("query_pre_attn_scalar", |c| {
            c.query_pre_attn_scalar = Some(-1.0)
        }),
        ("sliding_rope_base", |c| c.sliding_rope_base = Some(1.0)),
        ("sliding_rope_base", |c| {
            c.sliding_rope_base = Some(f64::INFINITY)
        }),
        ("post_norms", |c| c.norm = NormPlacement::PostLn),
    ];
    for (field, set) in bad {
        let mut c = gemma_like(16);
        set(&mut c);
        let err = c.validate().unwrap_err();
        assert!(err.contains(field), "{field}: {err}");
    }
}
