//! The mixture of experts against float64 loops written out here (router, softmax, top-k,
//! normalised or not, each chosen expert's SwiGLU, the shared expert and its sigmoid gate),
//! its backward against central differences
//! (every parameter and the input), and a language model whose blocks are mixtures: names,
//! parameter count, config round trip, incremental decoding equal to the full forward.

use super::*;
use crate::model::attention_checks::{check_lm_decoding, linear_loops, max_diff, numeric, uniform};
use crate::model::{ExpertsConfig, LanguageModel, ModelConfig, NormPlacement, Positions, SwigluClamp};
use crate::model::config::Normalization;

/// One SwiGLU FFN written out: `down(silu(gate(x)) ⊙ up(x))`.
fn swiglu_loops(xr: &[f64], f: &FeedForward<f64>) -> Vec<f64> {
    let g = linear_loops(xr, f.gate.as_ref().unwrap());
    let u = linear_loops(xr, &f.linear1);
    let h: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(&g, &u)| match f.clamp {
            None => g / (1.0 + (-g).exp()) * u,
            // gpt-oss: min(g, l) σ(α min(g, l)) (clamp(u, −l, l) + 1)
            Some(c) => {
                let (g, u) = (g.min(c.limit), u.clamp(-c.limit, c.limit));
                (u + 1.0) * g / (1.0 + (-c.alpha * g).exp())
            }
        })
        .collect();
    linear_loops(&h, &f.linear2)
}

/// The mixture written out: per token, softmax of the router's logits, the `k` most likely
/// experts, their weights, `Σ w_e · down(silu(gate(x)) ⊙ up(x))`, and with a shared expert
/// `+ σ(x · w_g) · FFN_s(x)`.
fn loops(m: &MixtureOfExperts<f64>, x: &[f64]) -> Vec<f64> {
    let d = m.router.d_in;
    let e = m.experts.len();
    let mut y = vec![0.0; x.len()];
    for (r, xr) in x.chunks(d).enumerate() {
        let logits = linear_loops(xr, &m.router);
        let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = logits.iter().map(|l| (l - max).exp()).sum();
        let p: Vec<f64> = logits.iter().map(|l| (l - max).exp() / z).collect();
        let mut order: Vec<usize> = (0..e).collect();
        order.sort_by(|&a, &b| p[b].partial_cmp(&p[a]).unwrap());
        let chosen = &order[..m.top_k];
        let sum: f64 = chosen.iter().map(|&j| p[j]).sum();
        for &j in chosen {
            let w = if m.normalise { p[j] / sum } else { p[j] };
            let out = swiglu_loops(xr, &m.experts[j]);
            for (acc, v) in y[r * d..(r + 1) * d].iter_mut().zip(out) {
                *acc += w * v;
            }
        }
        if let Some(s) = &m.shared {
            let gate = 1.0 / (1.0 + (-linear_loops(xr, &s.gate)[0]).exp());
            let out = swiglu_loops(xr, &s.ffn);
            for (acc, v) in y[r * d..(r + 1) * d].iter_mut().zip(out) {
                *acc += gate * v;
            }
        }
    }
    y
}

/// Five experts of 4 units over 6 columns, two a token; with `shared`, a shared expert of 3
/// units and its gate.
fn mixture((normalise, shared): (bool, bool), seed: u64) -> MixtureOfExperts<f64> {
    let mut rng = Rng::new(seed);
    let mut m = MixtureOfExperts::new(6, (5, 2, 4), Activation::SiluGated, normalise, &mut rng);
    if shared {
        m = m.with_shared(3, Activation::SiluGated, &mut rng);
        // A gate away from 1/2 and different per token.
        let g = &mut m.shared.as_mut().unwrap().gate.weight.value.data;
        *g = uniform(g.len(), seed + 2).into_iter().map(|v| 3.0 * v).collect();
    }
    m.router.weight.value.data = uniform(m.router.weight.value.data.len(), seed + 1)
        .into_iter()
        .map(|v| 2.0 * v)
        .collect();
    m
}

#[test]
fn route_picks_the_k_most_likely_and_normalises_them() {
    let p = [0.1f64, 0.4, 0.2, 0.3];
    let c = route(&p, 2, true);
    assert_eq!(c.iter().map(|c| c.expert).collect::<Vec<_>>(), [1, 3]);
    assert!((c[0].weight - 0.4 / 0.7).abs() < 1e-15 && (c[1].weight - 0.3 / 0.7).abs() < 1e-15);
    let c = route(&p, 2, false);
    assert_eq!((c[0].weight, c[1].weight), (0.4, 0.3));
    // Every expert: normalised weights are the probabilities themselves.
    let c = route(&p, 4, true);
    assert_eq!(c.iter().map(|c| c.expert).collect::<Vec<_>>(), [1, 3, 2, 0]);
    // Ties go to the lower index.
    let c = route(&[0.25; 4], 2, true);
    assert_eq!(c.iter().map(|c| c.expert).collect::<Vec<_>>(), [0, 1]);
}

#[test]
fn mixture_matches_float64_loops() {
    for (normalise, shared) in [(true, false), (false, false), (true, true), (false, true)] {
        let m = mixture((normalise, shared), 3);
        let x = uniform(7 * 6, 9);
        let y = m.forward(&x);
        assert!(max_diff(&y, &loops(&m, &x)) < 1e-12, "normalise {normalise} shared {shared}");
        // Every expert gets a token among these seven, and the choice matters: one expert
        // fewer per token is another output.
        let (choices, _) = m.choices(&x);
        for e in 0..5 {
            assert!(choices.iter().any(|c| c.expert == e), "expert {e} unused");
        }
        let mut top1 = m.clone();
        top1.top_k = 1;
        assert!(max_diff(&top1.forward(&x), &y) > 1e-3);
        // The shared expert adds what its gate lets through: without it, another output.
        if shared {
            let mut alone = m.clone();
            alone.shared = None;
            assert!(max_diff(&alone.forward(&x), &y) > 1e-3);
        }
    }
}

/// The mixture's backward of `L = Σ r ⊙ y` against central differences: the input's gradient
/// and every entry of every parameter's (`n_params` of them).
fn backward_matches_central_differences(mut m: MixtureOfExperts<f64>, n_params: usize, what: &str) {
    let x = uniform(4 * 6, 11);
    let r = uniform(4 * 6, 12);
    let loss = |m: &MixtureOfExperts<f64>, x: &[f64]| -> f64 {
        loops(m, x).iter().zip(&r).map(|(a, b)| a * b).sum()
    };
    let (_, cache) = m.forward_train(&x, None);
    let dx = m.backward(&x, cache, &r);
    for (i, &got) in dx.iter().enumerate() {
        let n = numeric(&|x: &[f64]| loss(&m, x), &x, i, 1e-6);
        assert!((got - n).abs() < 1e-7, "{what} dx {i}: {got} {n}");
    }
    let names: Vec<String> = m.params_mut().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.len(), n_params);
    for name in names {
        let (w0, grad) = {
            let mut params = m.params_mut();
            let p = &mut params.iter_mut().find(|(n, _)| *n == name).unwrap().1;
            (p.value.data.clone(), p.grad.data.clone())
        };
        let by_w = |w: &[f64]| {
            let mut f = m.clone();
            let mut params = f.params_mut();
            params.iter_mut().find(|(n, _)| *n == name).unwrap().1.value.data = w.to_vec();
            loss(&f, &x)
        };
        for (i, &got) in grad.iter().enumerate() {
            let n = numeric(&by_w, &w0, i, 1e-6);
            assert!((got - n).abs() < 1e-7, "{what} {name} {i}: {got} {n}");
        }
    }
}

#[test]
fn mixture_backward_matches_central_differences() {
    for (normalise, shared) in [(true, false), (false, true)] {
        let what = format!("normalise {normalise}, shared {shared}");
        // The router, each expert's three products; the shared expert's three and its gate.
        let n_params = 1 + 5 * 3 + if shared { 4 } else { 0 };
        backward_matches_central_differences(mixture((normalise, shared), 5), n_params, &what);
    }
}

/// gpt-oss's mixture ([`MixtureOfExperts::with_biases`], experts with the clamped SwiGLU):
/// random biases, a limit low enough that both clamps hold for some units. The forward
/// against the loops, the clamps shown to matter, the backward against central differences.
fn gpt_oss_mixture(seed: u64, limit: f64) -> MixtureOfExperts<f64> {
    let mut rng = Rng::new(seed);
    let mut m = mixture((true, false), seed).with_biases(&mut rng);
    for (_, p) in m.params_mut() {
        if p.value.shape.len() == 1 {
            p.value.data.iter_mut().for_each(|b| *b = rng.uniform_range(-0.5, 0.5));
        }
    }
    for e in &mut m.experts {
        e.clamp = Some(SwigluClamp { alpha: 1.702, limit });
    }
    m
}

#[test]
fn gpt_oss_mixture_matches_loops_and_central_differences() {
    let m = gpt_oss_mixture(8, 0.4);
    let x = uniform(7 * 6, 14);
    let y = m.forward(&x);
    assert!(max_diff(&y, &loops(&m, &x)) < 1e-12);
    // The clamp holds somewhere: a higher limit is another output.
    let loose = gpt_oss_mixture(8, 50.0);
    assert!(max_diff(&loose.forward(&x), &y) > 1e-3);
    // Router bias, 5 experts' three weights and three biases.
    backward_matches_central_differences(gpt_oss_mixture(9, 0.4), 2 + 5 * 6, "gpt-oss");
}

fn moe_config() -> ModelConfig {
    let mut c = ModelConfig::preset("tiny", 40).unwrap();
    (c.d_model, c.n_heads, c.d_ff, c.n_encoder_layers, c.n_decoder_layers) = (16, 2, 24, 0, 2);
    (c.norm, c.normalization, c.positions) =
        (NormPlacement::PreLn, Normalization::RmsNorm, Positions::Rotary);
    (c.activation, c.bias, c.dropout, c.tie_embeddings) = (Activation::SiluGated, false, 0.0, false);
    c.experts = Some(ExpertsConfig {
        n_experts: 4,
        top_k: 2,
        d_ff: 8,
        normalise: true,
        shared_d_ff: None,
        bias: false,
        swiglu_clamp: None,
    });
    c
}

#[test]
fn a_language_model_of_mixtures_names_counts_and_decodes_them() {
    let c = moe_config();
    c.validate().unwrap();
    let json = serde_json::to_string(&c).unwrap();
    assert!(json.contains("\"experts\":{\"n_experts\":4,\"top_k\":2,\"d_ff\":8,\"normalise\":true}"));
    assert_eq!(serde_json::from_str::<ModelConfig>(&json).unwrap(), c);
    let mut lm = LanguageModel::<f64>::new(c.clone(), &mut Rng::new(4));
    let names: Vec<String> = lm.params_mut().into_iter().map(|(n, _)| n).collect();
    for want in [
        "layers.0.ffn.router.weight",
        "layers.1.ffn.experts.3.gate.weight",
        "layers.1.ffn.experts.0.linear2.weight",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing");
    }
    assert!(!names.iter().any(|n| n == "layers.0.ffn.linear1.weight"));
    // Attention and norms as a dense model's; each FFN 4 experts of 3 · 16 · 8 and a router.
    let mut dense = c.clone();
    dense.experts = None;
    let (per_layer_dense, per_layer_moe) = (3 * 16 * 24, 4 * 16 + 4 * 3 * 16 * 8);
    let count = |c: &ModelConfig| crate::model::lm::lm_n_params(c).unwrap();
    assert_eq!(count(&c) + 2 * per_layer_dense, count(&dense) + 2 * per_layer_moe);
    assert_eq!(crate::model::lm::lm_n_params(&c), Some(lm.n_params()));
    // Incremental decoding, two rows token by token, equals the full forward; so does a
    // prompt at once (the experts then see several tokens each).
    check_lm_decoding(&lm, &[3, 17, 5, 33, 8, 21, 1, 9, 30, 2], 2);
    // Refused: more experts a token than there are, and mixtures beside an encoder.
    let mut bad = c.clone();
    bad.experts.as_mut().unwrap().top_k = 5;
    assert!(bad.validate().unwrap_err().contains("top_k 5"));
    let mut bad = c;
    bad.n_encoder_layers = 1;
    assert!(bad.validate().unwrap_err().contains("decoder-only"));
}

#[test]
fn a_language_model_with_a_shared_expert_names_counts_and_decodes_it() {
    let mut c = moe_config();
    c.experts.as_mut().unwrap().shared_d_ff = Some(6);
    c.validate().unwrap();
    let json = serde_json::to_string(&c).unwrap();
    assert!(json.contains("\"normalise\":true,\"shared_d_ff\":6}"), "{json}");
    assert_eq!(serde_json::from_str::<ModelConfig>(&json).unwrap(), c);
    let mut lm = LanguageModel::<f64>::new(c.clone(), &mut Rng::new(5));
    let names: Vec<String> = lm.params_mut().into_iter().map(|(n, _)| n).collect();
    for want in [
        "layers.0.ffn.shared_expert.gate.weight",
        "layers.1.ffn.shared_expert.linear1.weight",
        "layers.1.ffn.shared_expert.linear2.weight",
        "layers.1.ffn.shared_expert_gate.weight",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing");
    }
    // Each layer: a SwiGLU of 6 units over 16 columns and a gate of 16 weights more.
    let mut plain = c.clone();
    plain.experts.as_mut().unwrap().shared_d_ff = None;
    let count = |c: &ModelConfig| crate::model::lm::lm_n_params(c).unwrap();
    assert_eq!(count(&c), count(&plain) + 2 * (3 * 16 * 6 + 16));
    assert_eq!(count(&c), lm.n_params());
    check_lm_decoding(&lm, &[3, 17, 5, 33, 8, 21, 1, 9, 30, 2], 2);
    let mut bad = c;
    bad.experts.as_mut().unwrap().shared_d_ff = Some(0);
    assert!(bad.validate().unwrap_err().contains("shared_d_ff"));
}
