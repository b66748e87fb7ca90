//! Every layer's hand-written backward against central finite differences, in f64.
//!
//! For an output `y` the objective is `L = Σ y ⊙ R` with a fixed random `R`, so the backward is
//! fed `dy = R`; the loss is already a scalar. Every element of every input and parameter is
//! checked (the sizes are small): relative error `|a − n| / max(|a| + |n|, 1e-3)` below 1e-6.

use crate::common;

use common::*;
use transformer::batch::PAD;
use transformer::kernels::attention::{AttnMask, TILED_FROM_KEYS};
use transformer::model::attention::{MultiHeadAttention, SavedWeights};
use transformer::model::embedding::Embedding;
use transformer::model::feed_forward::FeedForward;
use transformer::model::layer_norm::LayerNorm;
use transformer::model::loss::label_smoothed_cross_entropy;
use transformer::model::param::{Module, ParamVisitor};
use transformer::model::residual::Residual;
use transformer::model::{Activation, NormPlacement};
use transformer::rng::Rng;

const D: usize = 8;
const HEADS: usize = 2;
const D_FF: usize = 12;
const BATCH: usize = 2;
const EPS: f64 = 1e-5;

// ---------------------------------------------------------------------------------------------
// (a) Embedding with sinusoidal positions and dropout.

fn check_embedding(p: f64, pos_offset: usize) {
    let mut rng = Rng::new(10);
    let vocab = 7;
    let mut emb = Embedding::<f64>::new(vocab, D, 16, &mut rng);
    // Repeated tokens: their gradients must accumulate into one row.
    let tokens: [u32; 8] = [3, 1, 4, 1, 5, 0, 2, 3];
    let seq_len = 4;
    let r: Vec<f64> = randn(&mut rng, tokens.len() * D, 1.0);
    let drop = Rng::new(77);
    let objective = |m: &Embedding<f64>| {
        let (x, _) = m.forward(&tokens, seq_len, pos_offset, p, Some(&mut drop.clone()));
        dot(&x, &r)
    };
    let (_, cache) = emb.forward(&tokens, seq_len, pos_offset, p, Some(&mut drop.clone()));
    match &cache.dropout_mask {
        Some(m) => assert!(p > 0.0 && m.contains(&0.0), "dropout dropped nothing"),
        None => assert_eq!(p, 0.0),
    }
    emb.backward(&cache, &r);
    let mut gc = GradCheck::new(format!("embedding p={p} offset={pos_offset}"));
    gc.wrt_params(&emb, objective);
    gc.report();
}

#[test]
fn embedding_gradient() {
    check_embedding(0.0, 0);
}

#[test]
fn embedding_gradient_with_dropout_and_offset() {
    check_embedding(0.3, 3);
}

// ---------------------------------------------------------------------------------------------
// (b) Multi-head attention.

/// Checks d/dx_q, d/dx_kv (separately, and their sum when `self_attn` feeds one tensor to both)
/// and every projection's gradient.
fn check_attention(label: &str, q_len: usize, k_len: usize, key_lens: &[usize], causal: bool) {
    check_attention_scaled(label, q_len, k_len, key_lens, causal, 1.0, 0.0);
}

/// `r_scale` scales the objective's weights R (and so |L| and every gradient); `dropout` is the
/// layer's attention dropout (one fixed mask for every evaluation).
fn check_attention_scaled(
    label: &str,
    q_len: usize,
    k_len: usize,
    key_lens: &[usize],
    causal: bool,
    r_scale: f64,
    dropout: f64,
) {
    let self_attn = q_len == k_len;
    let mut rng = Rng::new(20);
    let mut mha = MultiHeadAttention::<f64>::new(D, HEADS, &mut rng).with_dropout(dropout);
    jitter_params(&mut mha, &mut rng, 0.2);
    let x_q: Vec<f64> = randn(&mut rng, BATCH * q_len * D, 1.0);
    let x_kv: Vec<f64> = if self_attn {
        x_q.clone()
    } else {
        randn(&mut rng, BATCH * k_len * D, 1.0)
    };
    let r: Vec<f64> = randn(&mut rng, BATCH * q_len * D, r_scale);
    let mask = AttnMask {
        key_lens,
        causal,
        q_offset: 0,
    };
    let drop = Rng::new(55);
    let forward = |m: &MultiHeadAttention<f64>, x_q: &[f64], x_kv: &[f64]| {
        m.forward(x_q, x_kv, BATCH, mask, Some(&mut drop.clone()))
    };
    let (_, cache) = forward(&mha, &x_q, &x_kv);
    // Attention dropout keeps the weights (its mask has their shape): the plain kernel.
    let tiled = k_len >= TILED_FROM_KEYS && dropout == 0.0;
    let drop_mask = match &cache.weights {
        SavedWeights::Probs { drop_mask, .. } => {
            assert!(!tiled);
            drop_mask.as_ref()
        }
        SavedWeights::LogSumExp(_) => {
            assert!(tiled);
            None
        }
        SavedWeights::Linear => panic!("exact attention saved linear attention's weights"),
    };
    match drop_mask {
        Some(m) => assert!(dropout > 0.0 && m.contains(&0.0), "dropped no weight"),
        None => assert_eq!(dropout, 0.0),
    }
    let (dx_q, dx_kv) = mha.backward(&x_q, &x_kv, cache, &r);
    let mut gc = GradCheck::new(format!("attention {label}"));
    let mha = &mha;
    gc.wrt_input("x_q", &x_q, &dx_q, |x| dot(&forward(mha, x, &x_kv).0, &r));
    gc.wrt_input("x_kv", &x_kv, &dx_kv, |x| dot(&forward(mha, &x_q, x).0, &r));
    if self_attn {
        gc.wrt_input("x", &x_q, &add(&dx_q, &dx_kv), |x| {
            dot(&forward(mha, x, x).0, &r)
        });
    }
    gc.wrt_params(mha, |m| dot(&forward(m, &x_q, &x_kv).0, &r));
    gc.report();
}

#[test]
fn attention_gradient_no_mask() {
    check_attention("no mask", 4, 4, &[4, 4], false);
}

#[test]
fn attention_gradient_padding_mask() {
    check_attention("padding", 5, 5, &[5, 3], false);
}

#[test]
fn attention_gradient_causal_mask() {
    check_attention("causal", 5, 5, &[5, 5], true);
}

#[test]
fn attention_gradient_causal_and_padding() {
    check_attention("causal+padding", 4, 4, &[2, 4], true);
}

#[test]
fn attention_gradient_cross_attention() {
    check_attention("cross", 3, 5, &[5, 2], false);
}

#[test]
fn attention_gradient_tiled_kernel_long_sequences() {
    // From TILED_FROM_KEYS keys on the layer saves log-sum-exps instead of weights.
    // The objective sums ~2,000 outputs, and a central difference's rounding error grows with
    // |L| (≈ 1e-16 |L| / h); R scaled by 0.1 keeps it under the checker's 1e-9 absolute floor.
    let n = TILED_FROM_KEYS + 3;
    check_attention_scaled(
        "tiled causal+padding",
        n,
        n,
        &[n, n / 2 + 1],
        true,
        0.1,
        0.0,
    );
    check_attention_scaled("tiled cross", 7, n + 60, &[n + 60, n - 1], false, 0.1, 0.0);
}

#[test]
fn attention_gradient_with_attention_dropout() {
    check_attention_scaled("dropout causal+padding", 5, 5, &[5, 3], true, 1.0, 0.3);
    check_attention_scaled("dropout cross", 3, 6, &[6, 2], false, 1.0, 0.3);
    // Long enough for the tiled kernel, which dropout on the weights turns off.
    let n = TILED_FROM_KEYS + 1;
    check_attention_scaled("dropout long cross", 2, n, &[n, 7], false, 0.3, 0.2);
}

// ---------------------------------------------------------------------------------------------
// (c) Position-wise feed-forward network.

#[test]
fn feed_forward_gradient() {
    let mut rng = Rng::new(30);
    let mut ffn = FeedForward::<f64>::new(D, D_FF, Activation::Relu, &mut rng);
    jitter_params(&mut ffn, &mut rng, 0.2);
    let rows = 7;
    let x: Vec<f64> = randn(&mut rng, rows * D, 1.0);
    let r: Vec<f64> = randn(&mut rng, rows * D, 1.0);
    let (_, cache) = ffn.forward(&x);
    // Some ReLUs are off, or the derivative mask is not exercised.
    let off = cache.hidden.iter().filter(|&&h| h == 0.0).count();
    assert!(off > 0 && off < cache.hidden.len());
    let dx = ffn.backward(&x, cache, &r);
    let mut gc = GradCheck::new("feed-forward");
    gc.wrt_input("x", &x, &dx, |x| dot(&ffn.forward(x).0, &r));
    gc.wrt_params(&ffn, |m| dot(&m.forward(&x).0, &r));
    gc.report();
}

#[test]
fn feed_forward_gradient_with_activation_dropout() {
    for activation in [Activation::Relu, Activation::GeluTanh] {
        let mut rng = Rng::new(31);
        let mut ffn = FeedForward::<f64>::new(D, D_FF, activation, &mut rng).with_dropout(0.3);
        jitter_params(&mut ffn, &mut rng, 0.2);
        let rows = 6;
        let x: Vec<f64> = randn(&mut rng, rows * D, 1.0);
        let r: Vec<f64> = randn(&mut rng, rows * D, 1.0);
        let drop = Rng::new(8);
        let forward = |m: &FeedForward<f64>, x: &[f64]| {
            dot(&m.forward_train(x, Some(&mut drop.clone())).0, &r)
        };
        let (_, cache) = ffn.forward_train(&x, Some(&mut drop.clone()));
        let mask = cache
            .dropout_mask
            .as_ref()
            .expect("activation dropout mask");
        assert!(mask.contains(&0.0) && mask.iter().any(|&m| m > 1.0));
        let dx = ffn.backward(&x, cache, &r);
        let mut gc = GradCheck::new(format!("feed-forward {activation:?} activation dropout"));
        gc.wrt_input("x", &x, &dx, |x| forward(&ffn, x));
        gc.wrt_params(&ffn, |m| forward(m, &x));
        gc.report();
    }
}

// ---------------------------------------------------------------------------------------------
// (d) Layer norm.

/// Random rows with per-row offsets and scales, so the mean and variance both matter.
fn ln_input(rng: &mut Rng, rows: usize) -> Vec<f64> {
    let mut x = randn(rng, rows * D, 1.0);
    for row in x.chunks_exact_mut(D) {
        let (shift, scale) = (2.0 * rng.normal(), 0.5 + rng.uniform());
        row.iter_mut().for_each(|v| *v = shift + scale * *v);
    }
    x
}

fn layer_norm_with_grads(rng: &mut Rng) -> (LayerNorm<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut ln = LayerNorm::<f64>::new(D, EPS);
    jitter_params(&mut ln, rng, 0.5);
    let x = ln_input(rng, 6);
    let r: Vec<f64> = randn(rng, x.len(), 1.0);
    let (_, stats) = ln.forward(&x);
    let dx = ln.backward(&x, &stats, &r);
    (ln, x, r, dx)
}

#[test]
fn layer_norm_gradient() {
    let (ln, x, r, dx) = layer_norm_with_grads(&mut Rng::new(40));
    let mut gc = GradCheck::new("layer norm");
    gc.wrt_input("x", &x, &dx, |x| dot(&ln.forward(x).0, &r));
    gc.wrt_params(&ln, |m| dot(&m.forward(&x).0, &r));
    gc.report();
}

/// The checker itself must reject a gradient that is off by 1e-4 relative.
#[test]
#[should_panic(expected = "rel err")]
fn gradient_check_rejects_a_slightly_wrong_gradient() {
    let (ln, x, r, mut dx) = layer_norm_with_grads(&mut Rng::new(40));
    dx.iter_mut().for_each(|g| *g *= 1.0 + 1e-4);
    GradCheck::new("wrong").wrt_input("x", &x, &dx, |x| dot(&ln.forward(x).0, &r));
}

// ---------------------------------------------------------------------------------------------
// (e) Residual blocks, post-LN and pre-LN, with and without dropout.

/// A residual connection around an FFN, as one module for the parameter check.
#[derive(Clone)]
struct ResFfn {
    res: Residual<f64>,
    ffn: FeedForward<f64>,
}

impl Module<f64> for ResFfn {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, f64>) {
        v.module("norm", &mut self.res);
        v.module("ffn", &mut self.ffn);
    }
}

impl ResFfn {
    fn forward(&self, x: &[f64], drop: &Rng) -> Vec<f64> {
        let mut rng = drop.clone();
        self.res
            .forward(x.to_vec(), Some(&mut rng), |u| self.ffn.forward(u))
            .0
    }
}

fn check_residual_ffn(placement: NormPlacement, dropout: f64) {
    let mut rng = Rng::new(50);
    let mut m = ResFfn {
        res: Residual::new(D, EPS, placement, dropout, &mut Rng::new(0)),
        ffn: FeedForward::new(D, D_FF, Activation::Relu, &mut rng),
    };
    jitter_params(&mut m, &mut rng, 0.3);
    let rows = 6;
    let x = ln_input(&mut rng, rows);
    let r: Vec<f64> = randn(&mut rng, rows * D, 1.0);
    let drop = Rng::new(123); // cloned for every evaluation: the same dropout mask each time
    let (_, cache) = m
        .res
        .forward(x.clone(), Some(&mut drop.clone()), |u| m.ffn.forward(u));
    match &cache.dropout_mask {
        Some(mask) => assert!(dropout > 0.0 && mask.contains(&0.0)),
        None => assert_eq!(dropout, 0.0),
    }
    let dx = m.res.backward(cache, &r, |u, c, d| m.ffn.backward(u, c, d));
    let mut gc = GradCheck::new(format!("residual+ffn {placement:?} dropout={dropout}"));
    gc.wrt_input("x", &x, &dx, |x| dot(&m.forward(x, &drop), &r));
    gc.wrt_params(&m, |m| dot(&m.forward(&x, &drop), &r));
    gc.report();
}

#[test]
fn residual_post_ln_gradient() {
    check_residual_ffn(NormPlacement::PostLn, 0.0);
}

#[test]
fn residual_post_ln_gradient_with_dropout() {
    check_residual_ffn(NormPlacement::PostLn, 0.3);
}

#[test]
fn residual_pre_ln_gradient() {
    check_residual_ffn(NormPlacement::PreLn, 0.0);
}

#[test]
fn residual_pre_ln_gradient_with_dropout() {
    check_residual_ffn(NormPlacement::PreLn, 0.3);
}

/// A residual connection around masked self-attention (as in the encoder and decoder).
#[derive(Clone)]
struct ResAttn {
    res: Residual<f64>,
    attn: MultiHeadAttention<f64>,
}

impl Module<f64> for ResAttn {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, f64>) {
        v.module("norm", &mut self.res);
        v.module("attn", &mut self.attn);
    }
}

fn check_residual_attention(placement: NormPlacement) {
    let mut rng = Rng::new(60);
    let mut m = ResAttn {
        res: Residual::new(D, EPS, placement, 0.25, &mut Rng::new(0)),
        attn: MultiHeadAttention::new(D, HEADS, &mut rng),
    };
    jitter_params(&mut m, &mut rng, 0.3);
    let len = 4;
    let key_lens = [4, 2];
    let mask = AttnMask {
        key_lens: &key_lens,
        causal: true,
        q_offset: 0,
    };
    let x = ln_input(&mut rng, BATCH * len);
    let r: Vec<f64> = randn(&mut rng, x.len(), 1.0);
    let drop = Rng::new(321);
    let forward = |m: &ResAttn, x: &[f64]| {
        m.res
            .forward(x.to_vec(), Some(&mut drop.clone()), |u| {
                m.attn.forward(u, u, BATCH, mask, None)
            })
            .0
    };
    let (_, cache) = m.res.forward(x.clone(), Some(&mut drop.clone()), |u| {
        m.attn.forward(u, u, BATCH, mask, None)
    });
    let dx = m.res.backward(cache, &r, |u, c, d| {
        let (dq, dkv) = m.attn.backward(u, u, c, d);
        add(&dq, &dkv)
    });
    let mut gc = GradCheck::new(format!("residual+self-attention {placement:?} dropout"));
    gc.wrt_input("x", &x, &dx, |x| dot(&forward(&m, x), &r));
    gc.wrt_params(&m, |m| dot(&forward(m, &x), &r));
    gc.report();
}

#[test]
fn residual_post_ln_attention_gradient_with_dropout() {
    check_residual_attention(NormPlacement::PostLn);
}

#[test]
fn residual_pre_ln_attention_gradient_with_dropout() {
    check_residual_attention(NormPlacement::PreLn);
}

// ---------------------------------------------------------------------------------------------
// (f) Label-smoothed cross-entropy with padding targets.

fn check_loss(epsilon: f64) {
    let mut rng = Rng::new(70);
    let vocab = 7;
    let targets: [u32; 6] = [3, PAD, 1, 6, PAD, 2];
    let logits: Vec<f64> = randn(&mut rng, targets.len() * vocab, 2.0);
    let scale = 0.7;
    let mut grad = logits.clone();
    let stats = label_smoothed_cross_entropy(&mut grad, &targets, vocab, epsilon, Some(scale));
    assert_eq!(stats.n_tokens, 4);
    for (row, &t) in grad.chunks_exact(vocab).zip(&targets) {
        if t == PAD {
            assert!(row.iter().all(|&g| g == 0.0), "padding row has a gradient");
        }
    }
    let mut gc = GradCheck::new(format!("label-smoothed CE eps={epsilon}"));
    gc.wrt_input("logits", &logits, &grad, |z| {
        let mut z = z.to_vec();
        scale * label_smoothed_cross_entropy(&mut z, &targets, vocab, epsilon, None).loss_sum
    });
    gc.report();
}

#[test]
fn label_smoothed_loss_gradient() {
    check_loss(0.1);
}

#[test]
fn unsmoothed_loss_gradient() {
    check_loss(0.0);
}
