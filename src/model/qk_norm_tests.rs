//! Query/key norms ([`MultiHeadAttention::q_norm`], [`MultiHeadAttention::k_norm`], from
//! [`ModelConfig::qk_norm`]): each head's projected query and key is RMS-normalised over its
//! `d_k` columns, `q_h ← (g_q + o) ⊙ q_h / √(mean(q_h²) + ε)`, before the rotation. Checked
//! against float64 loops written out here (forward), central differences (backward, the gains
//! included), incremental decoding (every step layout and cross-attention's cached keys equal
//! the full forward) and a language model built from a config (names, offset, training step).
//!
//! Also heads of their own width ([`ModelConfig::head_dim`], Qwen3-0.6B's 16 heads of 128 over
//! a `d_model` of 1024): the same checks with `d_k ≠ d_model / h`, with and without the norms.

use super::attention::MultiHeadAttention;
use super::attention_checks::{
    self as checks, at_position, causal, check_decoding, linear_loops, max_diff, uniform,
};
use super::kv_cache::KvCache;
use super::norm::RmsNorm;
use super::step_layout::{Feed, Outputs, StepLayout};
use super::{LanguageModel, ModelConfig, Module, NormPlacement, Positions};
use crate::backend::{AttnMask, Backend, CPU, TILED_FROM_KEYS};
use crate::model::config::Normalization;
use crate::rng::Rng;
use crate::train::adam::{Adam, AdamConfig};

const D: usize = 8;
const HEADS: usize = 2;
const EPS: f64 = 1e-6;

/// A layer with random weights, biases and norm gains, `kv_heads` key/value heads, query/key
/// norms with gain offset `offset`.
fn layer(seed: u64, kv_heads: usize, rotary: bool, offset: f64) -> MultiHeadAttention<f64> {
    layer_of(seed, (kv_heads, D / HEADS), rotary, Some(offset))
}

/// A layer of `kv_heads` key/value heads of `d_head` columns, random weights and biases,
/// query/key norms with gain offset `offset` (random gains) when given.
fn layer_of(
    seed: u64,
    (kv_heads, d_head): (usize, usize),
    rotary: bool,
    offset: Option<f64>,
) -> MultiHeadAttention<f64> {
    let mut rng = Rng::new(seed);
    let mut m = MultiHeadAttention::with_head_width(D, (HEADS, kv_heads, d_head), true, &mut rng)
        .with_rotary(rotary);
    for l in [&mut m.q_proj, &mut m.k_proj, &mut m.v_proj, &mut m.out_proj] {
        for b in l.bias.as_mut().unwrap().value.data.iter_mut() {
            *b = rng.uniform_range(-0.5, 0.5);
        }
    }
    if let Some(offset) = offset {
        m = m.with_qk_norm(EPS, offset, &mut rng);
        for n in [m.q_norm.as_mut().unwrap(), m.k_norm.as_mut().unwrap()] {
            for g in n.gain.value.data.iter_mut() {
                *g = rng.uniform_range(0.5, 1.5) - offset;
            }
        }
    }
    m
}

/// Each `d_head` chunk of `x` (one head of one row) as `(g + o) ⊙ x_h / √(mean(x_h²) + ε)`.
fn head_norm_loops(x: &mut [f64], norm: &RmsNorm<f64>, d_head: usize) {
    for head in x.chunks_mut(d_head) {
        let ms: f64 = head.iter().map(|v| v * v).sum::<f64>() / d_head as f64;
        let inv = 1.0 / (ms + norm.eps).sqrt();
        for (v, g) in head.iter_mut().zip(&norm.gain.value.data) {
            *v *= (g + norm.offset) * inv;
        }
    }
}

/// Causal self-attention of `x [batch*len, D]` in float64 loops, queries and keys normalised
/// per head, then rotated (the crate's rotation, at positions `0 ..`).
fn qk_normed_loops(m: &MultiHeadAttention<f64>, x: &[f64], batch: usize) -> Vec<f64> {
    let len = x.len() / (batch * D);
    let (d_head, d_kv, d_q) = (m.d_head, m.d_kv(), HEADS * m.d_head);
    let group = HEADS / m.n_kv_heads;
    let (mut q, mut k, v) = (
        linear_loops(x, &m.q_proj),
        linear_loops(x, &m.k_proj),
        linear_loops(x, &m.v_proj),
    );
    // Each norm spans its gain's width: one head, or the whole projection (OLMoE).
    if let (Some(qn), Some(kn)) = (&m.q_norm, &m.k_norm) {
        head_norm_loops(&mut q, qn, qn.gain.value.data.len());
        head_norm_loops(&mut k, kn, kn.gain.value.data.len());
    }
    if m.rotary {
        CPU.rope(&mut q, m.rope, &[], len, HEADS, (d_head, 0));
        CPU.rope(&mut k, m.rope, &[], len, m.n_kv_heads, (d_head, 0));
    }
    let mut ctx = vec![0.0; batch * len * d_q];
    for b in 0..batch {
        for h in 0..HEADS {
            for p in 0..len {
                let qp = &q[(b * len + p) * d_q + h * d_head..][..d_head];
                let at = |t: usize| (b * len + t) * d_kv + (h / group) * d_head;
                let scores: Vec<f64> = (0..=p)
                    .map(|t| {
                        let kt = &k[at(t)..][..d_head];
                        qp.iter().zip(kt).map(|(a, c)| a * c).sum::<f64>() / (d_head as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                for (t, s) in scores.iter().enumerate() {
                    let weight = (s - max).exp() / z;
                    for e in 0..d_head {
                        ctx[(b * len + p) * d_q + h * d_head + e] += weight * v[at(t) + e];
                    }
                }
            }
        }
    }
    linear_loops(&ctx, &m.out_proj)
}

/// (a) The forward against the loops: plain kernel and tiled, multi-head and grouped, rotary
/// or not, gain offset 0 (Qwen3) and 1 (Gemma 3); the norms change the output.
#[test]
fn qk_normed_forward_matches_float64_loops() {
    let long = TILED_FROM_KEYS + 5;
    for (batch, len, kv_heads, rotary, offset) in [
        (2, 7, HEADS, false, 0.0),
        (2, 9, 1, true, 0.0),
        (1, 6, 1, true, 1.0),
        (1, long, 1, true, 1.0),
    ] {
        let m = layer(len as u64, kv_heads, rotary, offset);
        let x = uniform(batch * len * D, 5 + len as u64);
        let lens = vec![len; batch];
        let (y, cache) = m.forward(&x, &x, batch, causal(&lens), None);
        assert_eq!(cache.probs().is_none(), len >= TILED_FROM_KEYS, "kernel");
        let want = qk_normed_loops(&m, &x, batch);
        let err = max_diff(&y, &want);
        assert!(err < 1e-12, "len {len} offset {offset}: {err:e}");
        // Attention maps go through the same projections.
        let (y_maps, _) = m.forward_weights(&x, &x, batch, causal(&lens));
        assert!(max_diff(&y_maps, &want) < 1e-12);
        let mut plain = m.clone();
        (plain.q_norm, plain.k_norm) = (None, None);
        let (unnormed, _) = plain.forward(&x, &x, batch, causal(&lens), None);
        assert!(max_diff(&unnormed, &want) > 1e-3, "the norms did nothing");
    }
}

/// (b) The backward (input, projection and both gains' gradients) against central
/// differences, plain and tiled kernels, offsets 0 and 1.
#[test]
fn qk_normed_backward_matches_central_differences() {
    let long = TILED_FROM_KEYS + 3;
    for (len, kv_heads, rotary, offset) in [
        (7, HEADS, false, 0.0),
        (8, 1, true, 1.0),
        (long, HEADS, true, 0.0),
    ] {
        check_backward(layer(40 + len as u64, kv_heads, rotary, offset), len);
    }
}

/// The backward of `m` over a causal sequence of `len` positions (inputs, every parameter:
/// the norms' gains whole, a sample of the others) against central differences.
fn check_backward(mut m: MultiHeadAttention<f64>, len: usize) {
    let (x, r) = (uniform(len * D, 41), uniform(len * D, 42));
    let has_norms = {
        let names: Vec<String> = m.params_mut().into_iter().map(|(n, _)| n).collect();
        names.iter().any(|n| n == "q_norm.weight") && names.iter().any(|n| n == "k_norm.weight")
    };
    assert_eq!(has_norms, m.q_norm.is_some());
    // The norms' gains whole, a sample of the others.
    let step = |name: &str, n: usize| if name.contains("norm") { 1 } else { n / 5 + 1 };
    let what = format!("len {len}");
    checks::check_backward(&mut m, (&x, &r), 1, causal(&[len]), 37, step, &what);
}

/// (c) Decoding with query/key norms equals the full forward at every position: one token at a
/// time (dense and paged caches), a prompt then steps (every output, and only the last), a
/// continuous batch of ragged rows; and cross-attention over `project_kv`'s cache equals the
/// unmasked forward.
#[test]
fn qk_normed_decoding_matches_the_full_forward() {
    let (batch, len, split) = (2, 9, 4);
    let m = layer(70, 1, true, 1.0);
    let x = uniform(batch * len * D, 71);
    let lens = [len; 2];
    let (want, _) = m.forward(&x, &x, batch, causal(&lens), None);
    check_decoding(&m, (&x, &want), (batch, len, split), "qk norms", |_| {});
    let close = |got: &[f64], want: &[f64], what: &str| {
        let err = max_diff(got, want);
        assert!(err < 1e-12, "{what}: {err:e}");
    };
    // Cross-attention (not rotary): the cached keys are normalised like the forward's.
    let cross = layer(72, HEADS, false, 0.0);
    let src = uniform(batch * 5 * D, 73);
    let q_x = uniform(batch * 3 * D, 74);
    let src_lens = [5, 5];
    let mask = AttnMask {
        key_lens: &src_lens,
        causal: false,
        q_offset: 0,
    };
    let (want, _) = cross.forward(&q_x, &src, batch, mask, None);
    let mut kv = cross.project_kv(&src, batch);
    let (got, _) = cross.cross_cached(&q_x, &mut kv, &src_lens);
    close(&got, &want, "cross-attention");
}

/// (d) Norms over each row's whole projection (all heads at once, OLMo 2 / OLMoE): the forward
/// against the loops (and not the per-head norm's output), the backward against central
/// differences, decoding against the full forward.
#[test]
fn qk_norms_over_the_whole_projection() {
    for (len, kv_heads) in [(7, HEADS), (TILED_FROM_KEYS + 3, 1)] {
        let per_head = layer(90 + len as u64, kv_heads, true, 0.0);
        let mut whole = per_head.clone();
        let mut rng = Rng::new(91);
        let widths = (HEADS * whole.d_head, kv_heads * whole.d_head);
        whole = whole.with_qk_norm_widths(widths, EPS, 0.0, &mut rng);
        for n in [whole.q_norm.as_mut().unwrap(), whole.k_norm.as_mut().unwrap()] {
            for g in n.gain.value.data.iter_mut() {
                *g = rng.uniform_range(0.5, 1.5);
            }
        }
        let x = uniform(len * D, 92);
        let (y, _) = whole.forward(&x, &x, 1, causal(&[len]), None);
        let want = qk_normed_loops(&whole, &x, 1);
        assert!(max_diff(&y, &want) < 1e-12, "len {len}");
        let (by_head, _) = per_head.forward(&x, &x, 1, causal(&[len]), None);
        assert!(max_diff(&by_head, &y) > 1e-3, "whole and per-head norms agree");
        check_backward(whole.clone(), len);
        if len < TILED_FROM_KEYS {
            let x2 = uniform(2 * len * D, 93);
            let (want, _) = whole.forward(&x2, &x2, 2, causal(&[len, len]), None);
            check_decoding(&whole, (&x2, &want), (2, len, 3), "whole qk norms", |_| {});
        }
    }
}

/// A small rotary pre-LN RMSNorm language model with query/key norms.
fn qk_norm_lm_config(offset: f64) -> ModelConfig {
    let mut c = ModelConfig::preset("tiny", 13).unwrap();
    (c.d_model, c.n_heads, c.d_ff, c.max_len) = (8, 2, 12, 16);
    (c.n_encoder_layers, c.n_decoder_layers) = (0, 2);
    (c.norm, c.positions, c.dropout) = (NormPlacement::PreLn, Positions::Rotary, 0.0);
    (c.normalization, c.norm_weight_offset) = (Normalization::RmsNorm, offset);
    (c.bias, c.qk_norm) = (false, true);
    c
}

/// (d) A language model with `qk_norm`: every layer has `self_attn.{q,k}_norm.weight [d_k]`
/// carrying the model's ε and gain offset, the count from shapes agrees, its
/// log-probabilities are those of decoding, the config round-trips through JSON, and one
/// training step runs and moves the gains.
#[test]
fn language_model_with_qk_norm_decodes_and_trains() {
    for offset in [0.0, 1.0] {
        let c = qk_norm_lm_config(offset);
        c.validate().unwrap();
        let json = serde_json::to_string(&c).unwrap();
        assert!(json.contains(r#""qk_norm":true"#), "{json}");
        assert_eq!(serde_json::from_str::<ModelConfig>(&json).unwrap(), c);
        let mut m = LanguageModel::<f64>::new(c.clone(), &mut Rng::new(80));
        let attn = &m.blocks.layers[1].self_attn;
        let q_norm = attn.q_norm.as_ref().unwrap();
        assert_eq!((q_norm.offset, q_norm.eps), (offset, c.layer_norm_eps));
        assert_eq!(attn.k_norm.as_ref().unwrap().gain.value.shape, [4]);
        let shapes: Vec<(String, Vec<usize>)> = m
            .params_mut()
            .into_iter()
            .filter(|(n, _)| n.contains("_norm.weight") && n.contains("self_attn."))
            .map(|(n, p)| (n, p.value.shape.clone()))
            .collect();
        let want: Vec<(String, Vec<usize>)> = (0..2)
            .flat_map(|i| {
                ["q", "k"].map(|p| (format!("layers.{i}.self_attn.{p}_norm.weight"), vec![4]))
            })
            .collect();
        assert_eq!(shapes, want);
        assert_eq!(crate::model::lm::lm_n_params(&c), Some(m.n_params()));

        // Random gains, so that a layer reading the wrong one would show.
        let mut rng = Rng::new(5);
        for (name, p) in m.params_mut() {
            if name.contains("q_norm") || name.contains("k_norm") {
                p.value
                    .data
                    .iter_mut()
                    .for_each(|g| *g = rng.uniform_range(0.5, 1.5) - offset);
            }
        }
        let tokens: Vec<u32> = vec![1, 5, 2, 7, 3, 3, 9, 4, 0, 2, 6, 8, 1, 1];
        let targets: Vec<u32> = tokens[1..].iter().chain(&[5]).copied().collect();
        let (_, full) = m.evaluate_with_logprobs(&tokens, &targets, 2);
        let mut state = m.start(2, 7);
        for p in 0..7 {
            let got = m.step(
                &mut state,
                &[tokens[p], tokens[7 + p]],
                &StepLayout::dense(),
            );
            let want: Vec<f64> = (0..2)
                .flat_map(|b| full[(b * 7 + p) * 13..(b * 7 + p + 1) * 13].to_vec())
                .collect();
            assert!(
                max_diff(&got, &want) < 1e-10,
                "offset {offset} position {p}"
            );
        }

        let mut f32_model = LanguageModel::<f32>::new(c, &mut Rng::new(81));
        let before = f32_model.evaluate(&tokens, &targets, 2);
        let stats = f32_model.forward_backward(&tokens, &targets, 2, 0.1, 1.0, None);
        assert!(stats.loss_sum.is_finite(), "{stats:?}");
        let mut params = f32_model.params_mut();
        let gain_grad = params
            .iter()
            .find(|(n, _)| n == "layers.0.self_attn.k_norm.weight")
            .map(|(_, p)| p.grad.data.clone())
            .unwrap();
        assert!(gain_grad.iter().all(|g| g.is_finite()) && gain_grad.iter().any(|&g| g != 0.0));
        let mut adam = Adam::new(AdamConfig::default(), &params);
        adam.update(&mut params, 1e-2);
        drop(params);
        let after = f32_model.evaluate(&tokens, &targets, 2);
        assert!(
            after.loss_sum.is_finite() && after.nll_sum != before.nll_sum,
            "{before:?} -> {after:?}"
        );
    }
}

/// Heads of their own width (`d_k = 6` with `d_model = 8` and 2 heads; grouped, rotary, with
/// and without the norms): the projections have their shapes, the forward equals the float64
/// loops (plain and tiled kernels), the backward central differences, and decoding (dense,
/// paged and ragged) the full forward; a language model with `head_dim` counts, decodes and
/// trains.
#[test]
fn heads_of_their_own_width_match_float64_loops_decoding_and_gradients() {
    for (kv_heads, offset) in [(1, None), (HEADS, Some(0.0))] {
        let m = layer_of(100, (kv_heads, 6), true, offset);
        assert_eq!(m.q_proj.weight.value.shape, [12, D]);
        assert_eq!(m.k_proj.weight.value.shape, [6 * kv_heads, D]);
        assert_eq!(m.out_proj.weight.value.shape, [D, 12]);
        for (batch, len) in [(2, 7), (1, TILED_FROM_KEYS + 2)] {
            let x = uniform(batch * len * D, 101);
            let lens = vec![len; batch];
            let (y, _) = m.forward(&x, &x, batch, causal(&lens), None);
            let err = max_diff(&y, &qk_normed_loops(&m, &x, batch));
            assert!(err < 1e-12, "len {len} kv {kv_heads}: {err:e}");
        }
        check_backward(m.clone(), 7);
        // Decoding: one token a step through a paged cache, and ragged rows.
        let (batch, len) = (2, 6);
        let x = uniform(batch * len * D, 102);
        let (want, _) = m.forward(&x, &x, batch, causal(&[len; 2]), None);
        let mut cache = KvCache::new(batch, len, m.d_kv(), 2);
        for p in 0..len {
            let (y, _) = m.step(
                &at_position(&x, batch, len, p),
                &mut cache,
                &StepLayout::dense(),
            );
            assert!(
                max_diff(&y, &at_position(&want, batch, len, p)) < 1e-12,
                "step {p}"
            );
        }
        let rows = [0, 0, 0, 1];
        let positions = [0, 1, 2, 0];
        let xs: Vec<f64> = rows
            .iter()
            .zip(&positions)
            .flat_map(|(&b, &p)| x[(b * len + p) * D..][..D].to_vec())
            .collect();
        let expect: Vec<f64> = rows
            .iter()
            .zip(&positions)
            .flat_map(|(&b, &p)| want[(b * len + p) * D..][..D].to_vec())
            .collect();
        let layout = StepLayout {
            feed: Feed::Ragged {
                rows: &rows,
                positions: &positions,
            },
            outputs: Outputs::All,
        };
        let mut cache = KvCache::new(batch, len, m.d_kv(), 2);
        let (y, _) = m.step(&xs, &mut cache, &layout);
        assert!(max_diff(&y, &expect) < 1e-12, "ragged");
    }
    let mut c = qk_norm_lm_config(0.0);
    c.head_dim = Some(6);
    c.validate().unwrap();
    let json = serde_json::to_string(&c).unwrap();
    assert!(json.contains(r#""head_dim":6"#), "{json}");
    let mut m = LanguageModel::<f64>::new(c.clone(), &mut Rng::new(7));
    assert_eq!(crate::model::lm::lm_n_params(&c), Some(m.n_params()));
    assert_eq!(
        m.blocks.layers[0]
            .self_attn
            .q_norm
            .as_ref()
            .unwrap()
            .gain
            .value
            .shape,
        [6]
    );
    let tokens: Vec<u32> = vec![1, 5, 2, 7, 3, 3, 9, 4, 0, 2];
    let targets: Vec<u32> = tokens[1..].iter().chain(&[5]).copied().collect();
    let (_, full) = m.evaluate_with_logprobs(&tokens, &targets, 2);
    let mut state = m.start(2, 5);
    for p in 0..5 {
        let got = m.step(
            &mut state,
            &[tokens[p], tokens[5 + p]],
            &StepLayout::dense(),
        );
        let want: Vec<f64> = (0..2)
            .flat_map(|b| full[(b * 5 + p) * 13..(b * 5 + p + 1) * 13].to_vec())
            .collect();
        assert!(max_diff(&got, &want) < 1e-10, "position {p}");
    }
    let stats = m.forward_backward(&tokens, &targets, 2, 0.1, 1.0, None);
    assert!(stats.loss_sum.is_finite());
    let mut odd = c.clone();
    odd.head_dim = Some(5);
    assert!(
        odd.validate().unwrap_err().contains("even"),
        "rotary needs even heads"
    );
    odd.head_dim = Some(0);
    assert!(odd.validate().unwrap_err().contains("head_dim"));
}
