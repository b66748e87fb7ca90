//! Every layer's f32 forward against a plain f64 loop implementation written in the test
//! (`common`), plus the invariants of attention masking, the strided key/value cache of the
//! attention kernel, and incremental decoding against the full causal forward.
//!
//! The f32 layers and the references see the same (f32-representable) inputs and parameters, so
//! the only difference is f32 arithmetic: `|f32 − f64 ref| <= 1e-6 + 1e-5·|ref|`.

use crate::common;

use common::*;
use transformer::batch::PAD;
use transformer::kernels::attention::{
    attention_forward, AttnDims, AttnMask, STEP_KERNEL_MAX_QUERIES,
};
use transformer::kernels::dropout::dropout_mask;
use transformer::model::attention::{MultiHeadAttention, SavedWeights};
use transformer::model::embedding::Embedding;
use transformer::model::feed_forward::FeedForward;
use transformer::model::kv_cache::KvCache;
use transformer::model::layer_norm::LayerNorm;
use transformer::model::loss::label_smoothed_cross_entropy;
use transformer::model::norm::Norm;
use transformer::model::residual::Residual;
use transformer::model::{Activation, NormPlacement, StepLayout};
use transformer::rng::Rng;

const D: usize = 8;
const HEADS: usize = 2;
const D_FF: usize = 12;
const BATCH: usize = 2;
const EPS: f64 = 1e-5;
const REL: f64 = 1e-5;
const ABS: f64 = 1e-6;

// ---------------------------------------------------------------------------------------------
// (a) Embedding with sinusoidal positions and dropout.

#[test]
fn embedding_forward_matches_reference() {
    let mut rng = Rng::new(1);
    let vocab = 9;
    let mut emb = Embedding::<f32>::new(vocab, D, 20, &mut rng);
    jitter_params(&mut emb, &mut rng, 0.1);
    let table = to_f64(&emb.weight.value.data);
    let tokens: [u32; 10] = [4, 8, 0, 4, 1, 7, 7, 2, 3, 5];
    let seq_len = 5;
    let mut worst = 0.0f64;
    for pos_offset in [0, 1, 15] {
        let (x, cache) = emb.forward(&tokens, seq_len, pos_offset, 0.0, None);
        assert!(cache.dropout_mask.is_none());
        let want = naive_embedding(&table, D, &tokens, seq_len, pos_offset);
        worst = worst.max(assert_close("embedding", &x, &want, REL, ABS));
    }
    // Dropout: the reference times the saved mask, whose factors are 0 or 1/(1 − p).
    let p = 0.25;
    let (x, cache) = emb.forward(&tokens, seq_len, 2, p, Some(&mut Rng::new(5)));
    let mask = cache
        .dropout_mask
        .expect("a mask when p > 0 and an rng is given");
    let keep = (1.0 / (1.0 - p)) as f32;
    assert!(mask.iter().all(|&m| m == 0.0 || m == keep));
    let dropped = mask.iter().filter(|&&m| m == 0.0).count();
    assert!(dropped > 0 && dropped < mask.len() / 2, "{dropped} dropped");
    let want: Vec<f64> = naive_embedding(&table, D, &tokens, seq_len, 2)
        .iter()
        .zip(&mask)
        .map(|(v, &m)| v * m as f64)
        .collect();
    worst = worst.max(assert_close("embedding+dropout", &x, &want, REL, ABS));
    // Without an rng (inference) there is no dropout even when p > 0.
    let (x, cache) = emb.forward(&tokens, seq_len, 2, p, None);
    assert!(cache.dropout_mask.is_none());
    assert_close(
        "embedding eval",
        &x,
        &naive_embedding(&table, D, &tokens, seq_len, 2),
        REL,
        ABS,
    );
    eprintln!("embedding: worst |diff| / allowance {worst:.3}");
}

// ---------------------------------------------------------------------------------------------
// (b) Multi-head attention.

fn attention_vs_reference(
    label: &str,
    q_len: usize,
    k_len: usize,
    key_lens: &[usize],
    causal: bool,
) {
    let mut rng = Rng::new(2);
    let mut mha = MultiHeadAttention::<f32>::new(D, HEADS, &mut rng);
    jitter_params(&mut mha, &mut rng, 0.2);
    let x_q: Vec<f32> = randn(&mut rng, BATCH * q_len * D, 1.0);
    let x_kv: Vec<f32> = if q_len == k_len {
        x_q.clone()
    } else {
        randn(&mut rng, BATCH * k_len * D, 1.0)
    };
    let mask = AttnMask {
        key_lens,
        causal,
        q_offset: 0,
    };
    let (y, cache) = mha.forward(&x_q, &x_kv, BATCH, mask, None);
    let reference = NaiveMha::of(&mha);
    let (want_y, want_p) =
        reference.forward(&to_f64(&x_q), &to_f64(&x_kv), BATCH, key_lens, causal);
    let wy = assert_close(&format!("{label} output"), &y, &want_y, REL, ABS);
    let probs = match &cache.weights {
        SavedWeights::Probs { probs, .. } => probs,
        SavedWeights::LogSumExp(lse) => {
            // The tiled kernel (long sequences) keeps no weights; its output was checked above.
            assert_eq!(
                lse.len(),
                BATCH * HEADS * q_len,
                "{label}: no saved log-sum-exp"
            );
            eprintln!("attention {label} (tiled): worst |diff| / allowance: output {wy:.3}");
            // The explicit call for the weights uses the plain kernel at any length.
            let (y2, p) = mha.forward_weights(&x_q, &x_kv, BATCH, mask);
            assert_close(&format!("{label} weights call"), &y2, &want_y, REL, ABS);
            assert_close(
                &format!("{label} weights call probs"),
                &p,
                &want_p,
                REL,
                ABS,
            );
            return;
        }
        SavedWeights::Linear => panic!("exact attention saved linear attention's weights"),
    };
    let wp = assert_close(&format!("{label} probs"), probs, &want_p, REL, ABS);
    // Masked weights are exactly zero; visible ones are positive and sum to one.
    let mut worst_sum = 0.0f64;
    for b in 0..BATCH {
        for h in 0..HEADS {
            for i in 0..q_len {
                let off = ((b * HEADS + h) * q_len + i) * k_len;
                let row = &probs[off..off + k_len];
                let mut sum = 0.0f64;
                for (j, &p) in row.iter().enumerate() {
                    if is_visible(key_lens, causal, 0, b, i, j) {
                        assert!(
                            p > 0.0,
                            "{label}: visible key {j} of query {i} has weight {p}"
                        );
                        sum += p as f64;
                    } else {
                        assert_eq!(
                            p, 0.0,
                            "{label}: masked key {j} of query {i} (b {b}, h {h})"
                        );
                    }
                }
                worst_sum = worst_sum.max((sum - 1.0).abs());
            }
        }
    }
    assert!(
        worst_sum < 1e-6,
        "{label}: probability rows sum to 1 ± {worst_sum:e}"
    );
    eprintln!(
        "attention {label}: worst |diff| / allowance: output {wy:.3}, probs {wp:.3}; \
         |row sum − 1| <= {worst_sum:e}"
    );
}

#[test]
fn attention_forward_no_mask_matches_reference() {
    attention_vs_reference("no mask", 4, 4, &[4, 4], false);
}

#[test]
fn attention_forward_padding_mask_matches_reference() {
    attention_vs_reference("padding", 5, 5, &[5, 3], false);
}

#[test]
fn attention_forward_causal_mask_matches_reference() {
    attention_vs_reference("causal", 5, 5, &[5, 5], true);
}

#[test]
fn attention_forward_causal_and_padding_matches_reference() {
    attention_vs_reference("causal+padding", 5, 5, &[3, 5], true);
}

#[test]
fn tiled_attention_forward_matches_reference() {
    let n = transformer::kernels::attention::TILED_FROM_KEYS + 5;
    attention_vs_reference("tiled causal+padding", n, n, &[n, n / 3], true);
    attention_vs_reference("tiled cross", 9, n + 70, &[n + 70, n - 2], false);
}

#[test]
fn cross_attention_forward_matches_reference() {
    attention_vs_reference("cross", 3, 5, &[5, 2], false);
}

#[test]
fn attention_dropout_kernel_matches_reference() {
    // ctx = (P ⊙ M) V with P from the reference loops and the given mask M; the kernel's saved
    // weights stay the undropped P.
    let mut rng = Rng::new(12);
    let (q_len, k_len, d_head) = (4, 5, D / HEADS);
    let key_lens = [5, 3];
    let q: Vec<f64> = randn(&mut rng, BATCH * q_len * D, 1.0);
    let k: Vec<f64> = randn(&mut rng, BATCH * k_len * D, 1.0);
    let v: Vec<f64> = randn(&mut rng, BATCH * k_len * D, 1.0);
    let n = BATCH * HEADS * q_len * k_len;
    let drop: Vec<f64> = dropout_mask(&mut rng, n, 0.4).unwrap();
    assert!(drop.contains(&0.0));
    for causal in [false, true] {
        let mask = AttnMask {
            key_lens: &key_lens,
            causal,
            q_offset: 0,
        };
        let dims = AttnDims {
            batch: BATCH,
            heads: HEADS,
            kv_heads: HEADS,
            d_head,
            q_len,
            k_len,
            kv_stride: k_len,
            scores: Default::default(),
        };
        let mut ctx = vec![0.0; BATCH * q_len * D];
        let mut probs = vec![0.0; n];
        attention_forward(&mut ctx, &mut probs, &q, &k, &v, dims, mask, Some(&drop));
        let reference = NaiveAttn {
            batch: BATCH,
            heads: HEADS,
            d_head,
            q_len,
            k_len,
            kv_stride: k_len,
            key_lens: &key_lens,
            causal,
            q_offset: 0,
        };
        let (_, want_p) = reference.run(&q, &k, &v);
        let mut want_ctx = vec![0.0; ctx.len()];
        for b in 0..BATCH {
            for h in 0..HEADS {
                for i in 0..q_len {
                    let p_off = ((b * HEADS + h) * q_len + i) * k_len;
                    for c in 0..d_head {
                        let mut acc = 0.0;
                        for j in 0..k_len {
                            let vrow = (b * k_len + j) * D + h * d_head;
                            acc += want_p[p_off + j] * drop[p_off + j] * v[vrow + c];
                        }
                        want_ctx[(b * q_len + i) * D + h * d_head + c] = acc;
                    }
                }
            }
        }
        let (dc, dp) = (max_abs_diff(&ctx, &want_ctx), max_abs_diff(&probs, &want_p));
        assert!(
            dc < 1e-12 && dp < 1e-12,
            "causal {causal}: ctx {dc:e}, probs {dp:e}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// (c) Feed-forward, (d) layer norm.

#[test]
fn feed_forward_matches_reference() {
    let mut rng = Rng::new(3);
    let mut ffn = FeedForward::<f32>::new(D, D_FF, Activation::Relu, &mut rng);
    jitter_params(&mut ffn, &mut rng, 0.2);
    let x: Vec<f32> = randn(&mut rng, 7 * D, 1.0);
    let (y, cache) = ffn.forward(&x);
    assert!(cache.hidden.contains(&0.0), "no ReLU was off");
    let w = assert_close("ffn", &y, &naive_ffn(&ffn, &to_f64(&x)), REL, ABS);
    eprintln!("ffn: worst |diff| / allowance {w:.3}");
}

#[test]
fn feed_forward_activation_dropout_matches_reference() {
    // y = (max(0, x W₁ᵀ + b₁) ⊙ M) W₂ᵀ + b₂, computed in f64 loops with the layer's mask M.
    let mut rng = Rng::new(4);
    let mut ffn = FeedForward::<f64>::new(D, D_FF, Activation::Relu, &mut rng).with_dropout(0.25);
    jitter_params(&mut ffn, &mut rng, 0.2);
    let rows = 7;
    let x: Vec<f64> = randn(&mut rng, rows * D, 1.0);
    let (y, cache) = ffn.forward_train(&x, Some(&mut Rng::new(6)));
    let mask = cache.dropout_mask.expect("a mask");
    let kept = mask.iter().filter(|&&m| m != 0.0).count();
    assert!(kept > 0 && kept < mask.len());
    assert!(mask
        .iter()
        .all(|&m| m == 0.0 || (m - 1.0 / 0.75).abs() < 1e-15));
    let (w1, b1) = (
        &ffn.linear1.weight.value.data,
        &ffn.linear1.bias.as_ref().unwrap().value.data,
    );
    let (w2, b2) = (
        &ffn.linear2.weight.value.data,
        &ffn.linear2.bias.as_ref().unwrap().value.data,
    );
    let mut want = vec![0.0; rows * D];
    for r in 0..rows {
        let mut hidden = [0.0; D_FF];
        for (f, h) in hidden.iter_mut().enumerate() {
            let mut acc = b1[f];
            for c in 0..D {
                acc += w1[f * D + c] * x[r * D + c];
            }
            *h = acc.max(0.0) * mask[r * D_FF + f];
        }
        for c in 0..D {
            let mut acc = b2[c];
            for (f, h) in hidden.iter().enumerate() {
                acc += w2[c * D_FF + f] * h;
            }
            want[r * D + c] = acc;
        }
    }
    let diff = max_abs_diff(&y, &want);
    assert!(diff < 1e-12, "activation dropout: max diff {diff:e}");
    // Without a generator the layer is the plain FFN.
    let (plain, c) = ffn.forward_train(&x, None);
    assert!(c.dropout_mask.is_none());
    assert_eq!(plain, ffn.forward(&x).0);
}

/// Rows with their own offsets and spreads.
fn shifted_rows(rng: &mut Rng, rows: usize) -> Vec<f32> {
    let mut x: Vec<f32> = randn(rng, rows * D, 1.0);
    for row in x.chunks_exact_mut(D) {
        let (shift, scale) = (3.0 * rng.normal(), 0.3 + 2.0 * rng.uniform());
        row.iter_mut()
            .for_each(|v| *v = (shift + scale * *v as f64) as f32);
    }
    x
}

#[test]
fn layer_norm_matches_reference() {
    let mut rng = Rng::new(4);
    let mut ln = LayerNorm::<f32>::new(D, EPS);
    jitter_params(&mut ln, &mut rng, 0.5);
    let x = shifted_rows(&mut rng, 6);
    let (y, stats) = ln.forward(&x);
    let (want, means, rstds) = naive_layer_norm(
        &to_f64(&x),
        &to_f64(&ln.gamma.value.data),
        &to_f64(&ln.beta.value.data),
        EPS,
    );
    let w = assert_close("layer norm", &y, &want, REL, ABS);
    assert_close("layer norm mean", &stats.mean, &means, REL, ABS);
    assert_close("layer norm rstd", &stats.rstd, &rstds, REL, ABS);
    // A constant row has zero variance: the output is β (ε keeps it finite).
    let (y, _) = ln.forward(&[2.5f32; D]);
    assert_close("constant row", &y, &to_f64(&ln.beta.value.data), REL, ABS);
    eprintln!("layer norm: worst |diff| / allowance {w:.3}");
}

// ---------------------------------------------------------------------------------------------
// (e) Residual blocks.

fn residual_vs_reference(placement: NormPlacement, dropout: f64) {
    let mut rng = Rng::new(5);
    let mut res = Residual::<f32>::new(D, EPS, placement, dropout, &mut Rng::new(0));
    jitter_params(&mut res, &mut rng, 0.5);
    let mut ffn = FeedForward::<f32>::new(D, D_FF, Activation::Relu, &mut rng);
    jitter_params(&mut ffn, &mut rng, 0.2);
    let x = shifted_rows(&mut rng, 6);
    let (y, cache) = res.forward(x.clone(), Some(&mut Rng::new(9)), |u| ffn.forward(u));
    let mask: Vec<f64> = match &cache.dropout_mask {
        Some(m) => {
            assert!(dropout > 0.0 && m.contains(&0.0));
            to_f64(m)
        }
        None => {
            assert_eq!(dropout, 0.0);
            vec![1.0; x.len()]
        }
    };
    let Norm::Layer(ln) = &res.norm else {
        panic!("a layer norm")
    };
    let (gamma, beta) = (to_f64(&ln.gamma.value.data), to_f64(&ln.beta.value.data));
    let x64 = to_f64(&x);
    let dropped = |v: Vec<f64>| -> Vec<f64> { v.iter().zip(&mask).map(|(a, m)| a * m).collect() };
    let want = match placement {
        // LayerNorm(x + Dropout(FFN(x)))
        NormPlacement::PostLn => {
            let sum = add(&x64, &dropped(naive_ffn(&ffn, &x64)));
            naive_layer_norm(&sum, &gamma, &beta, EPS).0
        }
        // x + Dropout(FFN(LayerNorm(x)))
        NormPlacement::PreLn => {
            let normed = naive_layer_norm(&x64, &gamma, &beta, EPS).0;
            add(&x64, &dropped(naive_ffn(&ffn, &normed)))
        }
    };
    let w = assert_close(&format!("residual {placement:?}"), &y, &want, REL, ABS);
    // Inference (`apply`) never drops.
    if dropout > 0.0 {
        let y_eval = res.apply(x.clone(), |u| ffn.forward(u).0);
        let (y_nodrop, _) = res.forward(x.clone(), None, |u| ffn.forward(u));
        assert_eq!(y_eval, y_nodrop);
        assert_ne!(y_eval, y);
    }
    eprintln!("residual {placement:?} dropout={dropout}: worst |diff| / allowance {w:.3}");
}

#[test]
fn residual_post_ln_matches_reference() {
    residual_vs_reference(NormPlacement::PostLn, 0.0);
}

#[test]
fn residual_post_ln_with_dropout_matches_reference() {
    residual_vs_reference(NormPlacement::PostLn, 0.3);
}

#[test]
fn residual_pre_ln_matches_reference() {
    residual_vs_reference(NormPlacement::PreLn, 0.0);
}

#[test]
fn residual_pre_ln_with_dropout_matches_reference() {
    residual_vs_reference(NormPlacement::PreLn, 0.3);
}

// ---------------------------------------------------------------------------------------------
// (f) Label-smoothed cross-entropy with padding targets.

#[test]
fn label_smoothed_loss_matches_reference() {
    let mut rng = Rng::new(6);
    let vocab = 11;
    let targets: [u32; 7] = [5, PAD, 10, 1, PAD, PAD, 3];
    let logits: Vec<f32> = randn(&mut rng, targets.len() * vocab, 3.0);
    let logits64 = to_f64(&logits);
    for eps in [0.0, 0.1, 0.3] {
        let want = naive_label_smoothed(&logits64, &targets, vocab, eps, PAD);
        // Without a gradient: the logits become log-probabilities (padding rows are not used).
        let mut logp = logits.clone();
        let stats = label_smoothed_cross_entropy(&mut logp, &targets, vocab, eps, None);
        assert_eq!(stats.n_tokens, want.n_tokens);
        assert_eq!(stats.n_tokens, 4);
        for (r, &t) in targets.iter().enumerate() {
            if t != PAD {
                let s = r * vocab..(r + 1) * vocab;
                assert_close("log-probs", &logp[s.clone()], &want.log_probs[s], REL, ABS);
            }
        }
        let per_token = |x: f64| x / want.n_tokens as f64;
        assert!((per_token(stats.loss_sum) - per_token(want.loss_sum)).abs() < 1e-5);
        assert!((per_token(stats.nll_sum) - per_token(want.nll_sum)).abs() < 1e-5);
        assert!((stats.loss() - per_token(want.loss_sum)).abs() < 1e-5);
        // With a gradient: grad_scale · (p − q), zero rows for padding.
        let scale = 0.25;
        let mut grad = logits.clone();
        let stats_g = label_smoothed_cross_entropy(&mut grad, &targets, vocab, eps, Some(scale));
        assert_eq!(stats_g, stats);
        let want_grad: Vec<f64> = want.grad.iter().map(|g| g * scale).collect();
        assert_close("loss gradient", &grad, &want_grad, REL, ABS);
        for (row, &t) in grad.chunks_exact(vocab).zip(&targets) {
            if t == PAD {
                assert!(row.iter().all(|&g| g == 0.0));
            }
        }
        eprintln!(
            "loss eps={eps}: {} vs reference {} (per token)",
            stats.loss(),
            per_token(want.loss_sum)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 3. The attention kernel with a key/value cache of spare capacity, and incremental decoding.

/// Copies compact `[batch*k_len, d]` rows into `[batch*stride, d]`, the spare rows NaN.
fn with_spare_rows(x: &[f64], k_len: usize, stride: usize) -> Vec<f64> {
    let mut out = vec![f64::NAN; BATCH * stride * D];
    for b in 0..BATCH {
        out[b * stride * D..(b * stride + k_len) * D]
            .copy_from_slice(&x[b * k_len * D..(b + 1) * k_len * D]);
    }
    out
}

#[test]
fn attention_kernel_with_spare_kv_capacity_matches_compact() {
    let mut rng = Rng::new(7);
    let (k_len, stride, d_head) = (4, 7, D / HEADS);
    for (q_len, causal, q_offset, key_lens) in [
        (4, false, 0, [4, 2]),
        (1, true, 3, [4, 4]),
        (2, true, 2, [4, 4]),
        (3, false, 0, [3, 4]),
    ] {
        let q: Vec<f64> = randn(&mut rng, BATCH * q_len * D, 1.0);
        let k: Vec<f64> = randn(&mut rng, BATCH * k_len * D, 1.0);
        let v: Vec<f64> = randn(&mut rng, BATCH * k_len * D, 1.0);
        let mask = AttnMask {
            key_lens: &key_lens,
            causal,
            q_offset,
        };
        let dims = AttnDims {
            batch: BATCH,
            heads: HEADS,
            kv_heads: HEADS,
            d_head,
            q_len,
            k_len,
            kv_stride: k_len,
            scores: Default::default(),
        };
        let run = |k: &[f64], v: &[f64], kv_stride: usize| {
            let mut ctx = vec![0.0; BATCH * q_len * D];
            let mut probs = vec![0.0; BATCH * HEADS * q_len * k_len];
            let dims = AttnDims { kv_stride, ..dims };
            attention_forward(&mut ctx, &mut probs, &q, k, v, dims, mask, None);
            (ctx, probs)
        };
        let (ctx, probs) = run(&k, &v, k_len);
        let (ctx_s, probs_s) = run(
            &with_spare_rows(&k, k_len, stride),
            &with_spare_rows(&v, k_len, stride),
            stride,
        );
        assert!(
            ctx_s.iter().all(|x| x.is_finite()),
            "a spare (NaN) row was read"
        );
        let (dc, dp) = (max_abs_diff(&ctx, &ctx_s), max_abs_diff(&probs, &probs_s));
        assert!(
            dc < 1e-12 && dp < 1e-12,
            "strided vs compact: ctx {dc:e}, probs {dp:e}"
        );
        // And both against the reference loops, reading the strided buffers.
        let reference = NaiveAttn {
            batch: BATCH,
            heads: HEADS,
            d_head,
            q_len,
            k_len,
            kv_stride: stride,
            key_lens: &key_lens,
            causal,
            q_offset,
        };
        let (want_c, want_p) = reference.run(
            &q,
            &with_spare_rows(&k, k_len, stride),
            &with_spare_rows(&v, k_len, stride),
        );
        let (rc, rp) = (
            max_abs_diff(&ctx_s, &want_c),
            max_abs_diff(&probs_s, &want_p),
        );
        assert!(
            rc < 1e-12 && rp < 1e-12,
            "vs reference: ctx {rc:e}, probs {rp:e}"
        );
        eprintln!(
            "kernel q_len={q_len} causal={causal} offset={q_offset}: strided vs compact {:e}, \
             vs reference {:e}",
            dc.max(dp),
            rc.max(rp)
        );
    }
}

#[test]
fn forward_cached_matches_full_causal_forward() {
    let mut rng = Rng::new(8);
    let mut mha = MultiHeadAttention::<f64>::new(D, HEADS, &mut rng);
    jitter_params(&mut mha, &mut rng, 0.2);
    let len = 5;
    let x: Vec<f64> = randn(&mut rng, BATCH * len * D, 1.0);
    let full_lens = [len; BATCH];
    let mask = AttnMask {
        key_lens: &full_lens,
        causal: true,
        q_offset: 0,
    };
    let (y_full, cache) = mha.forward(&x, &x, BATCH, mask, None);
    let full_probs = cache.probs().unwrap();
    // Rows t0..t1 of every batch element.
    let rows = |t0: usize, t1: usize| -> Vec<f64> {
        (0..BATCH)
            .flat_map(|b| x[(b * len + t0) * D..(b * len + t1) * D].to_vec())
            .collect()
    };
    // One position at a time and in uneven chunks, in dense caches with spare capacity (the
    // language model's prefill), and one position at a time through paged caches (the
    // decoder's step, one position per block, and blocks of 2).
    let mut worst = 0.0f64;
    let dense = |n: usize| n;
    for (chunks, block_rows) in [
        (vec![1, 1, 1, 1, 1], dense(len + 3)),
        (vec![2, 3], dense(len + 3)),
        (vec![1, 3, 1], dense(len + 3)),
        (vec![1, 1, 1, 1, 1], 1),
        (vec![1, 1, 1, 1, 1], 2),
    ] {
        let mut kv = KvCache::<f64>::new(BATCH, len + 3, D, block_rows);
        let mut t0 = 0;
        for n in chunks {
            let (y, probs) = mha.step(&rows(t0, t0 + n), &mut kv, &StepLayout::dense());
            assert_eq!(kv.len, t0 + n);
            let k_len = t0 + n;
            for b in 0..BATCH {
                for i in 0..n {
                    let t = t0 + i;
                    let got = &y[(b * n + i) * D..(b * n + i + 1) * D];
                    let want = &y_full[(b * len + t) * D..(b * len + t + 1) * D];
                    worst = worst.max(max_abs_diff(got, want));
                    for h in 0..HEADS {
                        let p = &probs[((b * HEADS + h) * n + i) * k_len..][..k_len];
                        let p_full = &full_probs[((b * HEADS + h) * len + t) * len..][..k_len];
                        worst = worst.max(max_abs_diff(p, p_full));
                        assert!(p[t + 1..].iter().all(|&w| w == 0.0), "future key visible");
                    }
                }
            }
            t0 += n;
        }
    }
    assert!(
        worst < 1e-12,
        "incremental vs full causal forward: {worst:e}"
    );
    eprintln!("forward_cached (self, causal) vs full forward: worst |diff| {worst:e}");
}

#[test]
fn forward_cached_cross_attention_matches_full_forward() {
    let mut rng = Rng::new(9);
    let mut mha = MultiHeadAttention::<f64>::new(D, HEADS, &mut rng);
    jitter_params(&mut mha, &mut rng, 0.2);
    let (q_len, k_len) = (3, 5);
    let key_lens = [5, 2];
    let x_q: Vec<f64> = randn(&mut rng, BATCH * q_len * D, 1.0);
    let memory: Vec<f64> = randn(&mut rng, BATCH * k_len * D, 1.0);
    let mask = AttnMask {
        key_lens: &key_lens,
        causal: false,
        q_offset: 0,
    };
    let (y_full, cache) = mha.forward(&x_q, &memory, BATCH, mask, None);
    let mut kv = mha.project_kv(&memory, BATCH);
    let (y, probs) = mha.cross_cached(&x_q, &mut kv, &key_lens);
    assert_eq!(kv.len, k_len, "cross-attention must not append");
    let full_probs = cache.probs().unwrap();
    let mut worst = max_abs_diff(&y, &y_full).max(max_abs_diff(&probs, full_probs));
    // More queries than the step kernel takes: the same through matrix products.
    let many = STEP_KERNEL_MAX_QUERIES + 1;
    let x_many: Vec<f64> = randn(&mut rng, BATCH * many * D, 1.0);
    let (y_full, cache) = mha.forward(&x_many, &memory, BATCH, mask, None);
    let (y, probs) = mha.cross_cached(&x_many, &mut kv, &key_lens);
    worst = worst
        .max(max_abs_diff(&y, &y_full))
        .max(max_abs_diff(&probs, cache.probs().unwrap()));
    assert!(worst < 1e-12, "cached cross-attention vs full: {worst:e}");
    eprintln!("forward_cached (cross) vs full forward: worst |diff| {worst:e}");
}
