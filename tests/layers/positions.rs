//! Position options (`ModelConfig::positions`): learned absolute positions and rotary positions
//! (RoPE), each checked forward (against f64 loops), backward (central finite differences in
//! f64, relative error below 1e-6 with the 1e-3 floor) and in cached incremental decoding.

use crate::common;

use common::*;
use transformer::batch::{Batch, EOS};
use transformer::decode::{greedy_decode, greedy_decode_full, GreedyOptions, Hypothesis};
use transformer::kernels::attention::AttnMask;
use transformer::kernels::rope::{rope_backward, rope_forward, Rope};
use transformer::model::attention::MultiHeadAttention;
use transformer::model::embedding::Embedding;
use transformer::model::kv_cache::KvCache;
use transformer::model::Module;
use transformer::model::{ModelConfig, NormPlacement, Positions, Seq2Seq, StepLayout};
use transformer::rng::Rng;
use transformer::Float;

const D: usize = 8;
const HEADS: usize = 2;
const BATCH: usize = 2;

// ---------------------------------------------------------------------------------------------
// Learned absolute positions in the embedding.

#[test]
fn learned_positions_forward_and_gradient() {
    for (p, pos_offset) in [(0.0, 0), (0.3, 3)] {
        let mut rng = Rng::new(10);
        let vocab = 7;
        let mut emb = Embedding::<f64>::with_positions(vocab, D, 16, Positions::Learned, &mut rng);
        let names: Vec<String> = params_of(&mut emb).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["weight", "positions"]);
        // Repeated tokens and positions: their gradients must accumulate.
        let tokens: [u32; 8] = [3, 1, 4, 1, 5, 0, 2, 3];
        let seq_len = 4;
        if p == 0.0 {
            let (x, _) = emb.forward(&tokens, seq_len, pos_offset, 0.0, None);
            let e = to_f64(&emb.weight.value.data);
            let table = to_f64(&emb.positions.as_ref().unwrap().value.data);
            for (r, &t) in tokens.iter().enumerate() {
                let pos = pos_offset + r % seq_len;
                for j in 0..D {
                    let want = e[t as usize * D + j] * (D as f64).sqrt() + table[pos * D + j];
                    assert!((x[r * D + j] - want).abs() < 1e-12, "row {r} dim {j}");
                }
            }
        }
        let r: Vec<f64> = randn(&mut rng, tokens.len() * D, 1.0);
        let drop = Rng::new(77);
        let (_, cache) = emb.forward(&tokens, seq_len, pos_offset, p, Some(&mut drop.clone()));
        assert_eq!(cache.dropout_mask.is_some(), p > 0.0);
        emb.backward(&cache, &r);
        let mut gc = GradCheck::new(format!("learned positions p={p} offset={pos_offset}"));
        gc.wrt_params(&emb, |m| {
            let (x, _) = m.forward(&tokens, seq_len, pos_offset, p, Some(&mut drop.clone()));
            dot(&x, &r)
        });
        gc.report();
    }
}

#[test]
fn rotary_embedding_adds_no_positions() {
    let mut rng = Rng::new(3);
    let mut emb = Embedding::<f64>::with_positions(9, D, 16, Positions::Rotary, &mut rng);
    assert_eq!(params_of(&mut emb).len(), 1);
    let tokens = [4u32, 4, 7, 2];
    let (x, _) = emb.forward(&tokens, 2, 5, 0.0, None);
    for (r, &t) in tokens.iter().enumerate() {
        for j in 0..D {
            let want = emb.weight.value.data[t as usize * D + j] * (D as f64).sqrt();
            assert_eq!(x[r * D + j], want);
        }
    }
    // Sinusoidal stays the paper's embedding, and draws the same table from the same seed.
    let a = Embedding::<f64>::new(9, D, 16, &mut Rng::new(3));
    let b = Embedding::<f64>::with_positions(9, D, 16, Positions::Sinusoidal, &mut Rng::new(3));
    assert_eq!(a.weight.value.data, b.weight.value.data);
    let (x, _) = b.forward(&tokens, 2, 5, 0.0, None);
    let want = naive_embedding(&to_f64(&b.weight.value.data), D, &tokens, 2, 5);
    assert!(max_abs_diff(&x, &want) < 1e-12);
}

// ---------------------------------------------------------------------------------------------
// The RoPE kernel.

/// Written from the RoFormer formula: pair (2i, 2i+1) of each head rotated by
/// `pos / 10000^(2i/d_head)`.
fn naive_rope(x: &[f64], seq_len: usize, heads: usize, d_head: usize, pos0: usize) -> Vec<f64> {
    let d = heads * d_head;
    let mut y = x.to_vec();
    for r in 0..x.len() / d {
        let pos = (pos0 + r % seq_len) as f64;
        for h in 0..heads {
            for i in 0..d_head / 2 {
                let angle = pos / 10000f64.powf((2 * i) as f64 / d_head as f64);
                let a = x[r * d + h * d_head + 2 * i];
                let b = x[r * d + h * d_head + 2 * i + 1];
                y[r * d + h * d_head + 2 * i] = a * angle.cos() - b * angle.sin();
                y[r * d + h * d_head + 2 * i + 1] = a * angle.sin() + b * angle.cos();
            }
        }
    }
    y
}

#[test]
fn rope_forward_matches_f64_loop() {
    let mut rng = Rng::new(5);
    for (heads, d_head, seq_len, pos0) in [(2, 8, 5, 0), (3, 4, 3, 7), (1, 16, 4, 1000)] {
        let n = BATCH * seq_len * heads * d_head;
        let x: Vec<f64> = randn(&mut rng, n, 1.0);
        let want = naive_rope(&x, seq_len, heads, d_head, pos0);
        let mut y = x.clone();
        rope_forward(&mut y, Rope::default(), seq_len, heads, d_head, pos0);
        let err = max_abs_diff(&y, &want);
        assert!(err < 1e-12, "f64: {err:e}");
        let mut y32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        rope_forward(&mut y32, Rope::default(), seq_len, heads, d_head, pos0);
        assert_close("rope f32", &y32, &want, 1e-5, 1e-5);
        // Rotations keep norms.
        let norm = |v: &[f64]| v.iter().map(|a| a * a).sum::<f64>();
        assert!((norm(&y) - norm(&x)).abs() < 1e-10);
    }
}

#[test]
fn rope_backward_is_the_gradient() {
    let mut rng = Rng::new(6);
    let (heads, d_head, seq_len, pos0) = (2, 6, 4, 3);
    let x: Vec<f64> = randn(&mut rng, BATCH * seq_len * heads * d_head, 1.0);
    let r: Vec<f64> = randn(&mut rng, x.len(), 1.0);
    let mut dx = r.clone();
    rope_backward(&mut dx, Rope::default(), seq_len, heads, d_head, pos0);
    let mut gc = GradCheck::new("rope");
    gc.wrt_input("x", &x, &dx, |x| {
        let mut y = x.to_vec();
        rope_forward(&mut y, Rope::default(), seq_len, heads, d_head, pos0);
        dot(&y, &r)
    });
    gc.report();
}

/// Scores `q_i · k_j` per head of rotated rows.
fn head_scores(q: &[f64], k: &[f64], heads: usize, d_head: usize) -> Vec<f64> {
    let d = heads * d_head;
    let mut s = Vec::new();
    for h in 0..heads {
        for qi in q.chunks_exact(d) {
            for kj in k.chunks_exact(d) {
                s.push(dot(
                    &qi[h * d_head..(h + 1) * d_head],
                    &kj[h * d_head..(h + 1) * d_head],
                ));
            }
        }
    }
    s
}

#[test]
fn rope_scores_depend_only_on_relative_position() {
    let mut rng = Rng::new(7);
    let (heads, d_head, len) = (2, 8, 5);
    let q: Vec<f64> = randn(&mut rng, len * heads * d_head, 1.0);
    let k: Vec<f64> = randn(&mut rng, len * heads * d_head, 1.0);
    let scores = |q_pos: usize, k_pos: usize| {
        let (mut qr, mut kr) = (q.clone(), k.clone());
        rope_forward(&mut qr, Rope::default(), len, heads, d_head, q_pos);
        rope_forward(&mut kr, Rope::default(), len, heads, d_head, k_pos);
        head_scores(&qr, &kr, heads, d_head)
    };
    let base = scores(0, 0);
    for shift in [1, 9, 500] {
        let err = max_abs_diff(&base, &scores(shift, shift));
        assert!(err < 1e-10, "shift {shift}: {err:e}");
    }
    assert!(max_abs_diff(&scores(3, 1), &scores(12, 10)) < 1e-10);
    assert!(
        max_abs_diff(&scores(3, 1), &base) > 1e-2,
        "rotation had no effect"
    );
}

// ---------------------------------------------------------------------------------------------
// Multi-head attention with rotary positions.

fn rotary_mha(seed: u64) -> MultiHeadAttention<f64> {
    let mut rng = Rng::new(seed);
    let mut mha = MultiHeadAttention::<f64>::new(D, HEADS, &mut rng).with_rotary(true);
    jitter_params(&mut mha, &mut rng, 0.2);
    mha
}

fn check_rotary_attention(label: &str, len: usize, key_lens: &[usize], causal: bool, shift: usize) {
    let mut mha = rotary_mha(20);
    let mut rng = Rng::new(21);
    let x: Vec<f64> = randn(&mut rng, BATCH * len * D, 1.0);
    let x_kv: Vec<f64> = randn(&mut rng, BATCH * len * D, 1.0);
    let r: Vec<f64> = randn(&mut rng, BATCH * len * D, 1.0);
    let mask = AttnMask {
        key_lens,
        causal,
        q_offset: 0,
    };
    let mut gc = GradCheck::new(format!("rotary attention {label}"));
    // Self-attention: one tensor feeds queries, keys and values.
    let (_, cache) = mha.forward_at(&x, &x, BATCH, mask, shift);
    let (dx_q, dx_kv) = mha.clone().backward(&x, &x, cache, &r);
    let m = &mha;
    gc.wrt_input("x", &x, &add(&dx_q, &dx_kv), |x| {
        dot(&m.forward_at(x, x, BATCH, mask, shift).0, &r)
    });
    // Separate inputs, to check the query and key paths each on their own.
    let (_, cache) = mha.forward_at(&x, &x_kv, BATCH, mask, shift);
    let (dx_q, dx_kv) = mha.backward(&x, &x_kv, cache, &r);
    let m = &mha;
    gc.wrt_input("x_q", &x, &dx_q, |xq| {
        dot(&m.forward_at(xq, &x_kv, BATCH, mask, shift).0, &r)
    });
    gc.wrt_input("x_kv", &x_kv, &dx_kv, |xkv| {
        dot(&m.forward_at(&x, xkv, BATCH, mask, shift).0, &r)
    });
    gc.wrt_params(m, |m| {
        dot(&m.forward_at(&x, &x_kv, BATCH, mask, shift).0, &r)
    });
    gc.report();
}

#[test]
fn rotary_attention_gradient_causal_padding() {
    check_rotary_attention("causal+padding", 5, &[5, 3], true, 0);
}

#[test]
fn rotary_attention_gradient_padding_shifted() {
    check_rotary_attention("padding, shift 7", 4, &[4, 2], false, 7);
}

#[test]
fn rotary_attention_scores_depend_only_on_relative_position() {
    let mha = rotary_mha(30);
    let plain = MultiHeadAttention {
        rotary: false,
        ..mha.clone()
    };
    let x: Vec<f64> = randn(&mut Rng::new(31), BATCH * 6 * D, 1.0);
    let mask = AttnMask {
        key_lens: &[6, 4],
        causal: true,
        q_offset: 0,
    };
    let (y0, c0) = mha.forward_at(&x, &x, BATCH, mask, 0);
    for shift in [1, 5, 300] {
        let (y, c) = mha.forward_at(&x, &x, BATCH, mask, shift);
        let err = max_abs_diff(c0.probs().unwrap(), c.probs().unwrap()).max(max_abs_diff(&y0, &y));
        assert!(err < 1e-12, "shift {shift}: {err:e}");
    }
    // ... but rotary attention is not the unrotated one.
    let (_, cp) = plain.forward(&x, &x, BATCH, mask, None);
    assert!(max_abs_diff(c0.probs().unwrap(), cp.probs().unwrap()) > 1e-3);
}

#[test]
fn rotary_cached_attention_matches_full_forward() {
    let mha = rotary_mha(40);
    let len = 7;
    let x: Vec<f64> = randn(&mut Rng::new(41), BATCH * len * D, 1.0);
    let lens = [len, len];
    let mask = AttnMask {
        key_lens: &lens,
        causal: true,
        q_offset: 0,
    };
    let (full, cache_full) = mha.forward(&x, &x, BATCH, mask, None);
    let mut cache = KvCache::new(BATCH, len, D, len);
    let mut start = 0;
    for chunk in [2, 1, 3, 1] {
        let rows = |b: usize| &x[(b * len + start) * D..(b * len + start + chunk) * D];
        let x_q: Vec<f64> = (0..BATCH).flat_map(|b| rows(b).to_vec()).collect();
        let (y, _) = mha.step(&x_q, &mut cache, &StepLayout::dense());
        for b in 0..BATCH {
            let want = &full[(b * len + start) * D..(b * len + start + chunk) * D];
            let got = &y[b * chunk * D..(b + 1) * chunk * D];
            let err = max_abs_diff(got, want);
            assert!(err < 1e-12, "rows {start}..+{chunk}: {err:e}");
        }
        start += chunk;
    }
    // The cache holds the rotated keys the full forward scored.
    assert!(max_abs_diff(&cache.dense().0, &cache_full.k) < 1e-12);
    // project_kv builds the same (full) cache at once.
    assert!(max_abs_diff(&mha.project_kv(&x, BATCH).dense().0, &cache_full.k) < 1e-12);
}

// ---------------------------------------------------------------------------------------------
// The whole model with each option (the pattern of tests/model_gradient.rs).

fn tiny_config(positions: Positions, norm: NormPlacement, tie: bool, dropout: f64) -> ModelConfig {
    ModelConfig {
        vocab_size: 11,
        d_model: 8,
        n_heads: 2,
        d_ff: 12,
        n_encoder_layers: 2,
        n_decoder_layers: 2,
        dropout,
        norm,
        layer_norm_eps: 1e-5,
        tie_embeddings: tie,
        max_len: 32,
        activation: Default::default(),
        positions,
        attention_dropout: 0.0,
        activation_dropout: 0.0,
        bias: true,
        scale_embeddings: true,
        n_kv_heads: None,
        normalization: Default::default(),
        rope_base: transformer::model::config::ROPE_BASE,
        rope_style: Default::default(),
        qkv_bias: false,
        qk_norm: false,
        rope_scaling: None,
        head_dim: None,
        layer_heads: Default::default(),
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
        relative_buckets: transformer::model::config::T5_BUCKETS,
        attn_output_gate: false,
        rotary_dim: None,
        gated_delta: None,
        qk_norm_whole: false,
        attention_sinks: false,
    }
}

fn check_model(positions: Positions, norm: NormPlacement, tie: bool, dropout: f64) {
    let c = tiny_config(positions, norm, tie, dropout);
    c.validate().unwrap();
    let mut model = Seq2Seq::<f64>::new(c.clone(), &mut Rng::new(1));
    assert_eq!(Some(model.n_params()), c.n_params());
    let batch = Batch::from_pairs(&[
        (&[4, 5, 6, 7][..], &[8, 9][..]),
        (&[10][..], &[4, 5, 6, 9][..]),
        (&[6, 6][..], &[7][..]),
    ]);
    let rng = Rng::new(99); // the same dropout masks for every evaluation
    let loss_at = |m: &Seq2Seq<f64>| {
        let mut m = m.clone();
        m.forward_backward(&batch, 0.1, 1.0, Some(&mut rng.clone()))
            .loss_sum
    };
    model.zero_grads();
    model.forward_backward(&batch, 0.1, 1.0, Some(&mut rng.clone()));
    let names: Vec<(String, usize)> = model
        .params_mut()
        .iter()
        .map(|(n, p)| (n.clone(), p.value.len()))
        .collect();
    assert_eq!(
        names.iter().any(|(n, _)| n == "embedding.positions"),
        positions == Positions::Learned
    );
    let mut worst = 0.0f64;
    let mut checked = 0;
    for (pi, (name, len)) in names.iter().enumerate() {
        // a few elements of every tensor; the used rows (positions 0..5) of the position table
        let elements: Vec<usize> = if name == "embedding.positions" {
            (0..5 * 8).step_by(3).chain([len - 1]).collect()
        } else {
            vec![0, len / 3, len - 1]
        };
        for e in elements {
            let h = 1e-5;
            let analytic = model.params_mut()[pi].1.grad.data[e];
            let mut plus = model.clone();
            plus.params_mut()[pi].1.value.data[e] += h;
            let mut minus = model.clone();
            minus.params_mut()[pi].1.value.data[e] -= h;
            let numeric = (loss_at(&plus) - loss_at(&minus)) / (2.0 * h);
            let err = rel_err(analytic, numeric);
            assert!(
                err < GRAD_TOL,
                "{name}[{e}]: analytic {analytic:e} numeric {numeric:e} (rel err {err:e})"
            );
            worst = worst.max(err);
            checked += 1;
        }
    }
    eprintln!(
        "{positions:?} {norm:?} tie={tie} dropout={dropout}: {checked} checks, worst rel err {worst:e}"
    );
}

#[test]
fn whole_model_gradient_learned_post_ln_tied() {
    check_model(Positions::Learned, NormPlacement::PostLn, true, 0.0);
}

#[test]
fn whole_model_gradient_learned_pre_ln_untied_with_dropout() {
    check_model(Positions::Learned, NormPlacement::PreLn, false, 0.2);
}

#[test]
fn whole_model_gradient_rotary_post_ln_tied() {
    check_model(Positions::Rotary, NormPlacement::PostLn, true, 0.0);
}

#[test]
fn whole_model_gradient_rotary_pre_ln_untied_with_dropout() {
    check_model(Positions::Rotary, NormPlacement::PreLn, false, 0.2);
}

// ---------------------------------------------------------------------------------------------
// Cached incremental decoding against full recomputation (as tests/decoding.rs).

const VOCAB: usize = 20;

fn decoding_model(positions: Positions, norm: NormPlacement, tie: bool, eos: f32) -> Seq2Seq<f32> {
    let c = ModelConfig {
        vocab_size: VOCAB,
        d_model: 32,
        n_heads: 4,
        d_ff: 64,
        n_encoder_layers: 2,
        n_decoder_layers: 2,
        dropout: 0.1, // inference never applies it
        norm,
        layer_norm_eps: 1e-6,
        tie_embeddings: tie,
        max_len: 64,
        activation: Default::default(),
        positions,
        attention_dropout: 0.0,
        activation_dropout: 0.0,
        bias: true,
        scale_embeddings: true,
        n_kv_heads: None,
        normalization: Default::default(),
        rope_base: transformer::model::config::ROPE_BASE,
        rope_style: Default::default(),
        qkv_bias: false,
        qk_norm: false,
        rope_scaling: None,
        head_dim: None,
        layer_heads: Default::default(),
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
        relative_buckets: transformer::model::config::T5_BUCKETS,
        attn_output_gate: false,
        rotary_dim: None,
        gated_delta: None,
        qk_norm_whole: false,
        attention_sinks: false,
    };
    c.validate().unwrap();
    let mut m = Seq2Seq::new(c, &mut Rng::new(3));
    let w = match &mut m.head.output_proj {
        Some(p) => &mut p.value.data,
        None => &mut m.embedding.weight.value.data,
    };
    w[EOS as usize * 32..(EOS as usize + 1) * 32]
        .iter_mut()
        .for_each(|x| *x *= eos);
    m
}

fn assert_same(name: &str, a: &[Hypothesis], b: &[Hypothesis], tol: f64) -> f64 {
    assert_eq!(a.len(), b.len(), "{name}");
    let mut worst = 0.0f64;
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.tokens, y.tokens, "{name}: sentence {i} tokens");
        assert_eq!(x.finished, y.finished, "{name}: sentence {i} finished");
        assert_eq!(x.token_logprobs.len(), y.token_logprobs.len(), "{name}");
        for (t, (p, q)) in x.token_logprobs.iter().zip(&y.token_logprobs).enumerate() {
            assert!(
                (p - q).abs() <= tol,
                "{name}: sentence {i} token {t}: log-prob {p} vs {q}"
            );
            worst = worst.max((p - q).abs());
        }
    }
    worst
}

#[test]
fn cached_decoding_matches_full_recomputation_for_learned_and_rotary() {
    let mut rng = Rng::new(5);
    let srcs: Vec<Vec<u32>> = [5, 0, 12, 1, 7, 3, 9, 2, 5]
        .iter()
        .map(|&n| (0..n).map(|_| 4 + rng.below(VOCAB - 4) as u32).collect())
        .collect();
    let opts = GreedyOptions {
        max_len_extra: 8,
        batch_size: 4,
        forced_first: None,
        min_len: 0,
        forced_end: false,
    };
    let mut emitted = 0;
    for positions in [Positions::Learned, Positions::Rotary] {
        for (norm, tie, eos) in [
            (NormPlacement::PostLn, true, 1.0),
            (NormPlacement::PreLn, false, 1.0),
            (NormPlacement::PostLn, true, 3.0),
        ] {
            let name = format!("{positions:?} {norm:?} tie={tie} eos x{eos}");
            let m = decoding_model(positions, norm, tie, eos);
            let cached = greedy_decode(&m, &srcs, &opts);
            let full = greedy_decode_full(&m, &srcs, &opts);
            let worst = assert_same(&name, &cached, &full, 1e-5);
            emitted += cached.iter().map(|h| h.tokens.len()).sum::<usize>();
            eprintln!("{name}: worst log-prob difference {worst:e}");
        }
    }
    assert!(emitted > 50, "only {emitted} tokens decoded");
}

/// Rotary keys are cached rotated; an f32 model's single step matches its f64 twin.
#[test]
fn rotary_decode_step_in_f32_matches_f64() {
    let m32 = decoding_model(Positions::Rotary, NormPlacement::PreLn, true, 1.0);
    let c = m32.config.clone();
    let mut m64 = Seq2Seq::<f64>::new(c, &mut Rng::new(3));
    let mut src32 = m32.clone();
    for ((_, p64), (_, p32)) in m64.params_mut().into_iter().zip(src32.params_mut()) {
        for (a, &b) in p64.value.data.iter_mut().zip(&p32.value.data) {
            *a = b.f64();
        }
    }
    let src = [5u32, 9, 11, 4];
    let mut s32 = m32.start_decoding(&src, 4, &[4], 10);
    let mut s64 = m64.start_decoding(&src, 4, &[4], 10);
    for tok in [1u32, 7, 8, 12, 6] {
        let a = m32.step(&mut s32, &[tok], &StepLayout::dense());
        let b = m64.step(&mut s64, &[tok], &StepLayout::dense());
        assert_close("decode step", &a, &b, 1e-4, 1e-4);
    }
}

/// `embedding.positions` is saved and loaded with the other weights, and `n_params` of the
/// config (checked on load) counts it.
#[test]
fn learned_positions_survive_a_checkpoint() {
    for positions in [Positions::Learned, Positions::Rotary] {
        let mut m = decoding_model(positions, NormPlacement::PreLn, true, 1.0);
        let dir = tempfile::tempdir().unwrap();
        transformer::model::checkpoint::save(dir.path(), &mut m).unwrap();
        let mut back: Seq2Seq<f32> = transformer::model::checkpoint::load(dir.path()).unwrap();
        assert_eq!(back.config.positions, positions);
        let a: Vec<(String, Vec<f32>)> = m
            .params_mut()
            .into_iter()
            .map(|(n, p)| (n, p.value.data.clone()))
            .collect();
        let b: Vec<(String, Vec<f32>)> = back
            .params_mut()
            .into_iter()
            .map(|(n, p)| (n, p.value.data.clone()))
            .collect();
        assert_eq!(a, b);
        assert_eq!(
            a.iter().any(|(n, _)| n == "embedding.positions"),
            positions == Positions::Learned
        );
    }
}
