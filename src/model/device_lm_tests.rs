//! The device step ([`DeviceLm`]) against the model's own step ([`LanguageModel::step_logits`])
//! on random models of several shape classes (grouped and plain heads, odd widths, gated and
//! plain FFNs, RMSNorm and LayerNorm, both RoPE pairings, tied and untied heads, biases): on the host
//! device, and on a GPU where one is found (lavapipe in CI).

use super::config::{Activation, Normalization, RopeStyle};
use super::device_lm::{DeviceLm, StepOut, Want};
use super::step_layout::StepLayout;
use super::{LanguageModel, ModelConfig, Module, NormPlacement, Positions};
use crate::backend::{Device, Host};
use crate::rng::Rng;

/// `(d_model, heads, kv heads, d_ff, activation, norm, pairing, tied)`.
type Shape = (usize, usize, usize, usize, Activation, Normalization, RopeStyle, bool);

const SHAPES: [Shape; 3] = [
    (24, 4, 2, 40, Activation::SiluGated, Normalization::RmsNorm, RopeStyle::HalfSplit, true),
    (20, 5, 5, 33, Activation::GeluTanhGated, Normalization::LayerNorm, RopeStyle::Interleaved, false),
    (16, 2, 1, 24, Activation::Relu, Normalization::RmsNorm, RopeStyle::HalfSplit, false),
];

fn model(s: Shape, seed: u64) -> LanguageModel<f32> {
    model_with(s, seed, |_| {})
}

/// [`model`] with `edit` applied to the config first.
fn model_with(s: Shape, seed: u64, edit: impl FnOnce(&mut ModelConfig)) -> LanguageModel<f32> {
    let (d, heads, kv, d_ff, act, norm, style, tied) = s;
    let mut c = ModelConfig::preset("tiny", 37).unwrap();
    (c.d_model, c.n_heads, c.d_ff, c.max_len) = (d, heads, d_ff, 64);
    (c.n_encoder_layers, c.n_decoder_layers) = (0, 3);
    (c.norm, c.positions, c.dropout) = (NormPlacement::PreLn, Positions::Rotary, 0.0);
    // The plain FFN's model has biases on every linear layer (the gated ones, none).
    (c.normalization, c.bias, c.activation) = (norm, act == Activation::Relu, act);
    (c.n_kv_heads, c.rope_style, c.tie_embeddings) = (Some(kv), style, tied);
    c.rope_base = 500.0;
    edit(&mut c);
    c.validate().unwrap();
    let mut rng = Rng::new(seed);
    let mut m = LanguageModel::<f32>::new(c, &mut rng);
    // Norm gains and biases away from 1 and 0, so that a swapped parameter shows.
    for (name, p) in m.params_mut() {
        if name.contains("norm") || name.ends_with("bias") {
            for v in p.value.data.iter_mut() {
                *v = rng.uniform_range(0.5, 1.5) as f32
                    - if name.ends_with("bias") { 1.0 } else { 0.0 };
            }
        }
    }
    m.prepare_inference();
    m
}

/// The model's own logits after the prompt and after each of `next`, fed one at a time.
fn own_logits(m: &LanguageModel<f32>, prompt: &[u32], next: &[u32]) -> Vec<Vec<f32>> {
    let mut state = m.start(1, prompt.len() + next.len());
    let mut out = vec![m.step_logits(&mut state, prompt, &StepLayout::last())];
    for &t in next {
        out.push(m.step_logits(&mut state, &[t], &StepLayout::last()));
    }
    out
}

fn device_logits<D: Device>(lm: &DeviceLm<D>, prompt: &[u32], next: &[u32]) -> Vec<Vec<f32>> {
    let mut state = lm.start(1, prompt.len() + next.len()).unwrap();
    let mut feed = prompt.to_vec();
    let mut out = Vec::new();
    for i in 0..=next.len() {
        let rows = vec![0; feed.len()];
        match lm.step(&mut state, &feed, &rows, &[feed.len() - 1], Want::Logits).unwrap() {
            StepOut::Logits(l) => out.push(l),
            StepOut::Ids(_) => unreachable!("logits asked"),
        }
        feed = next.get(i).map(|&t| vec![t]).unwrap_or_default();
    }
    out
}

fn assert_close(got: &[Vec<f32>], want: &[Vec<f32>], tol: f32, what: &str) {
    for (step, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{what} step {step}");
        let scale = w.iter().fold(1f32, |m, v| m.max(v.abs()));
        for (j, (a, b)) in g.iter().zip(w).enumerate() {
            assert!((a - b).abs() <= tol * scale, "{what} step {step} logit {j}: {a} vs {b}");
        }
    }
}

const PROMPT: [u32; 21] = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6];
const NEXT: [u32; 4] = [36, 0, 17, 17];

#[test]
fn host_device_step_is_the_models_step() {
    for (i, s) in SHAPES.into_iter().enumerate() {
        let m = model(s, 10 + i as u64);
        let lm = DeviceLm::new(Host, &m).unwrap();
        let what = format!("shape {i}");
        assert_close(&device_logits(&lm, &PROMPT, &NEXT), &own_logits(&m, &PROMPT, &NEXT), 1e-5, &what);
    }
}

/// Two rows in one step, their tokens interleaved and of different lengths, give each row's
/// logits alone; greedy ids on the device are the logits' arg-max.
#[test]
fn ragged_rows_and_argmax_on_the_host_device() {
    let m = model(SHAPES[0], 3);
    let lm = DeviceLm::new(Host, &m).unwrap();
    let (a, b) = (&PROMPT[..7], &PROMPT[7..10]);
    let mut state = lm.start(2, 16).unwrap();
    let (tokens, rows) = (
        [a[0], b[0], a[1], a[2], b[1], a[3], a[4], a[5], b[2], a[6]],
        [0, 1, 0, 0, 1, 0, 0, 0, 1, 0],
    );
    let StepOut::Logits(both) = lm.step(&mut state, &tokens, &rows, &[9, 8], Want::Logits).unwrap() else {
        unreachable!()
    };
    let v = lm.vocab_size();
    assert_close(&[both[..v].to_vec()], &own_logits(&m, a, &[])[..1], 1e-5, "row 0");
    assert_close(&[both[v..].to_vec()], &own_logits(&m, b, &[])[..1], 1e-5, "row 1");
    assert_eq!((state.row_len(0), state.row_len(1)), (7, 3));
    let StepOut::Ids(ids) = lm.step(&mut state, &[5, 6], &[0, 1], &[0, 1], Want::Argmax).unwrap() else {
        unreachable!()
    };
    let want: Vec<u32> = [(a, 5u32), (b, 6)]
        .iter()
        .map(|(p, t)| {
            let l = own_logits(&m, p, &[*t]).pop().unwrap();
            (0..l.len()).fold(0, |best, j| if l[j] > l[best] { j } else { best }) as u32
        })
        .collect();
    assert_eq!(ids, want);
}

/// Sliding windows shorter than the prompt, soft caps of the scores and of the logits,
/// query/key norms with a gain offset, and post-norms (Gemma's), through both devices.
fn gemma_like(seed: u64) -> LanguageModel<f32> {
    let mut m = model_with(SHAPES[0], seed, |c| {
        (c.qk_norm, c.norm_weight_offset) = (true, 1.0);
    });
    m.blocks.layers[0].self_attn.window = Some(6);
    m.blocks.layers[2].self_attn.window = Some(1);
    m.blocks.layers[1].self_attn.scores.softcap = Some(0.7);
    m.head.softcap = Some(4.0);
    let mut rng = Rng::new(seed + 1);
    for layer in &mut m.blocks.layers {
        let mut post = layer.self_attn_res.norm.clone();
        if let super::norm::Norm::Rms(n) = &mut post {
            n.gain.value.data.iter_mut().for_each(|g| *g = rng.uniform_range(0.5, 1.5) as f32 - 1.0);
        }
        layer.self_attn_res.post_norm = Some(post.clone());
        layer.ffn_res.post_norm = Some(post);
    }
    m.prepare_inference();
    m
}

/// Absolute positions: GPT-2's shape (pre-LN LayerNorm, learned positions, biases, GELU,
/// tied head) and the paper's (post-LN, sinusoids, embeddings scaled by √d_model, ReLU).
fn absolute_models(seed: u64) -> Vec<(&'static str, LanguageModel<f32>)> {
    let gpt2 = model_with(SHAPES[1], seed, |c| {
        (c.positions, c.scale_embeddings, c.bias) = (Positions::Learned, false, true);
        (c.activation, c.tie_embeddings) = (Activation::GeluTanh, true);
    });
    let paper = model_with(SHAPES[2], seed + 1, |c| {
        (c.positions, c.scale_embeddings, c.norm) = (Positions::Sinusoidal, true, NormPlacement::PostLn);
    });
    vec![("gpt2-like", gpt2), ("paper", paper)]
}

#[test]
fn absolute_positions_and_post_ln_on_the_host_device() {
    for (name, m) in absolute_models(50) {
        let lm = DeviceLm::new(Host, &m).unwrap();
        assert_close(&device_logits(&lm, &PROMPT, &NEXT), &own_logits(&m, &PROMPT, &NEXT), 1e-5, name);
    }
}

/// SmolLM3's layers without rotary positions: the device step rotates per layer as the model.
#[test]
fn nope_layers_on_the_host_device() {
    let m = model_with(SHAPES[0], 41, |c| c.layer_rope = vec![true, false, true]);
    assert!(!m.blocks.layers[1].self_attn.rotary);
    let lm = DeviceLm::new(Host, &m).unwrap();
    assert_close(&device_logits(&lm, &PROMPT, &NEXT), &own_logits(&m, &PROMPT, &NEXT), 1e-5, "nope");
}

#[test]
fn windows_soft_caps_qk_norms_and_post_norms_on_the_host_device() {
    let m = gemma_like(40);
    let lm = DeviceLm::new(Host, &m).unwrap();
    assert_close(&device_logits(&lm, &PROMPT, &NEXT), &own_logits(&m, &PROMPT, &NEXT), 1e-5, "gemma-like");
}

#[test]
fn bad_steps_and_unsupported_models_are_errors_naming_them() {
    let m = model(SHAPES[2], 4);
    let lm = DeviceLm::new(Host, &m).unwrap();
    let mut state = lm.start(1, 4).unwrap();
    let e = lm.step(&mut state, &[37], &[0], &[0], Want::Argmax).unwrap_err().to_string();
    assert!(e.contains("token id 37 is outside the vocabulary of 37"), "{e}");
    let e = lm.step(&mut state, &[1, 2, 3, 4, 5], &[0; 5], &[4], Want::Argmax).unwrap_err().to_string();
    assert!(e.contains("row 0 is full (4 positions)"), "{e}");
    let e = lm.step(&mut state, &[1], &[1], &[0], Want::Argmax).unwrap_err().to_string();
    assert!(e.contains("row 1 of a state of 1"), "{e}");

    let mut linear = model(SHAPES[0], 5);
    linear.blocks.layers[1].self_attn.linear = true;
    let e = DeviceLm::new(Host, &linear).err().unwrap().to_string();
    assert!(e.contains("--device cpu: layer 1: sparse or linear attention"), "{e}");
    let mut post = model(SHAPES[0], 6);
    post.blocks.layers[2].ffn_res.placement = NormPlacement::PostLn;
    let e = DeviceLm::new(Host, &post).err().unwrap().to_string();
    assert!(e.contains("layer 2: pre-LN and post-LN sublayers mixed"), "{e}");
    // Mixtures of experts and whole-projection query/key norms are the CPU's for now.
    let moe = model_with(SHAPES[0], 7, |c| {
        c.experts = Some(crate::model::ExpertsConfig {
            n_experts: 4,
            top_k: 2,
            d_ff: 8,
            normalise: true,
            shared_d_ff: None,
            bias: false,
            swiglu_clamp: None,
        })
    });
    let e = DeviceLm::new(Host, &moe).err().unwrap().to_string();
    assert!(e.contains("layer 0: mixture-of-experts FFNs"), "{e}");
    let whole = model_with(SHAPES[0], 8, |c| (c.qk_norm, c.qk_norm_whole) = (true, true));
    let e = DeviceLm::new(Host, &whole).err().unwrap().to_string();
    assert!(e.contains("layer 0: query/key norms over the whole projection"), "{e}");
    // Granite's scales and OLMo 2's sublayers without input norms too.
    let scaled = model_with(SHAPES[0], 9, |c| c.residual_scale = Some(0.5));
    let e = DeviceLm::new(Host, &scaled).err().unwrap().to_string();
    assert!(e.contains("layer 0: sublayer outputs scaled before the residual sum"), "{e}");
    let divided = model_with(SHAPES[0], 10, |c| c.logit_divisor = Some(2.0));
    let e = DeviceLm::new(Host, &divided).err().unwrap().to_string();
    assert!(e.contains("logits divided by logits_scaling"), "{e}");
    let olmo = model_with(SHAPES[0], 11, |c| (c.post_norms, c.input_norms) = (true, false));
    let e = DeviceLm::new(Host, &olmo).err().unwrap().to_string();
    assert!(e.contains("layer 0: sublayers without an input norm"), "{e}");
}

#[cfg(feature = "gpu")]
#[test]
fn gpu_device_step_is_the_host_devices() {
    use crate::backend::GpuDevice;
    if transformer_gpu::testing::gpu().is_none() {
        return;
    }
    for (i, s) in SHAPES.into_iter().enumerate() {
        let m = model(s, 20 + i as u64);
        let host = DeviceLm::new(Host, &m).unwrap();
        let gpu = DeviceLm::new(GpuDevice::open(None).unwrap(), &m).unwrap();
        let what = format!("gpu shape {i}");
        let want = device_logits(&host, &PROMPT, &NEXT);
        assert_close(&device_logits(&gpu, &PROMPT, &NEXT), &want, 1e-4, &what);
        let counters = gpu.device.gpu.counters();
        counters.reset();
        let mut state = gpu.start(1, 4).unwrap();
        let StepOut::Ids(ids) = gpu.step(&mut state, &[1], &[0], &[0], Want::Argmax).unwrap() else {
            unreachable!()
        };
        let c = counters.get();
        // Per layer: (add +) norm, Q‖K‖V, RoPE + KV store, attention, W_o, add + norm, the
        // gated product (a plain FFN: product, activation), W_down, and with biases one add
        // after each of Q‖K‖V, W_o, W_1, W_2; per step the gather, the embedding's factor,
        // the final add + norm, the row copy (not a dispatch), the head, the arg-max.
        let per_layer = if i == 2 { 13 } else { 8 };
        assert_eq!(c.dispatches, 3 * per_layer + 5, "{what}: dispatches");
        assert_eq!(c.submissions, 1, "{what}: one submission a step");
        assert_eq!(c.bytes_down, 4, "{what}: one id read back");
        let mut host_state = host.start(1, 4).unwrap();
        let want = host.step(&mut host_state, &[1], &[0], &[0], Want::Argmax).unwrap();
        assert_eq!(StepOut::Ids(ids), want, "{what}");
    }
    let mut others = absolute_models(51);
    others.push(("gemma-like", gemma_like(41)));
    for (name, m) in others {
        let host = DeviceLm::new(Host, &m).unwrap();
        let gpu = DeviceLm::new(GpuDevice::open(None).unwrap(), &m).unwrap();
        let want = device_logits(&host, &PROMPT, &NEXT);
        assert_close(&device_logits(&gpu, &PROMPT, &NEXT), &want, 1e-4, name);
    }
}
