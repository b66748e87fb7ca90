//! Sliding-window self-attention ([`MultiHeadAttention::window`], from
//! [`ModelConfig::layer_windows`]): the query at position `p` sees the keys
//! `max(0, p + 1 − w) ..= p`. Checked against float64 loops written out here (forward),
//! central differences (backward), the unwindowed layer (a window covering the sequence is
//! the same call), incremental decoding (every step layout equals the full windowed forward)
//! and a language model's training step.

use super::attention::MultiHeadAttention;
use super::attention_checks::{
    at_position, causal, check_backward, check_decoding, linear_loops, max_diff, uniform,
};
use super::kv_cache::KvCache;
use super::step_layout::{Feed, Outputs, StepLayout};
use super::{LanguageModel, ModelConfig, Module, NormPlacement, Positions, Seq2Seq};
use crate::backend::{Backend, CPU, TILED_FROM_KEYS};
use crate::rng::Rng;
use crate::train::adam::{Adam, AdamConfig};

pub(super) const D: usize = 8;
pub(super) const HEADS: usize = 2;

/// A layer with random weights and biases (so the biases matter), `kv_heads` key/value heads.
pub(super) fn layer(
    seed: u64,
    kv_heads: usize,
    rotary: bool,
    window: Option<usize>,
) -> MultiHeadAttention<f64> {
    let mut rng = Rng::new(seed);
    let mut m = MultiHeadAttention::grouped(D, HEADS, kv_heads, true, &mut rng)
        .with_rotary(rotary)
        .with_window(window);
    for l in [&mut m.q_proj, &mut m.k_proj, &mut m.v_proj, &mut m.out_proj] {
        for b in l.bias.as_mut().unwrap().value.data.iter_mut() {
            *b = rng.uniform_range(-0.5, 0.5);
        }
    }
    m
}

/// Causal self-attention of `x [batch*len, D]` in float64 loops, query `p` of row `b` seeing
/// the keys `max(0, p + 1 − w) .. min(p + 1, lens[b])` (rotary: the crate's rotation of the
/// projected queries and keys, at positions `0 ..`; with sinks, head `h`'s sink `s_h` one more
/// logit of each softmax, of no value).
pub(super) fn windowed_loops(
    m: &MultiHeadAttention<f64>,
    x: &[f64],
    batch: usize,
    lens: &[usize],
) -> Vec<f64> {
    let len = x.len() / (batch * D);
    let (d_head, d_kv) = (D / HEADS, m.d_kv());
    let group = HEADS / m.n_kv_heads;
    let (mut q, mut k, v) = (
        linear_loops(x, &m.q_proj),
        linear_loops(x, &m.k_proj),
        linear_loops(x, &m.v_proj),
    );
    if m.rotary {
        CPU.rope(&mut q, m.rope, &[], len, HEADS, (d_head, 0));
        CPU.rope(&mut k, m.rope, &[], len, m.n_kv_heads, (d_head, 0));
    }
    let w = m.window.unwrap_or(usize::MAX);
    let mut ctx = vec![0.0; batch * len * D];
    for b in 0..batch {
        for h in 0..HEADS {
            for p in 0..len {
                let keys = (p + 1).saturating_sub(w)..(p + 1).min(lens[b]);
                let qp = &q[(b * len + p) * D + h * d_head..][..d_head];
                let at = |t: usize| (b * len + t) * d_kv + (h / group) * d_head;
                let scores: Vec<f64> = keys
                    .clone()
                    .map(|t| {
                        let kt = &k[at(t)..][..d_head];
                        qp.iter().zip(kt).map(|(a, c)| a * c).sum::<f64>() / (d_head as f64).sqrt()
                    })
                    .collect();
                let sink = m.sinks.as_ref().map(|s| s.value.data[h]);
                let max = scores.iter().chain(&sink).cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = scores.iter().chain(&sink).map(|s| (s - max).exp()).sum();
                for (s, t) in scores.iter().zip(keys) {
                    let weight = (s - max).exp() / z;
                    for e in 0..d_head {
                        ctx[(b * len + p) * D + h * d_head + e] += weight * v[at(t) + e];
                    }
                }
            }
        }
    }
    linear_loops(&ctx, &m.out_proj)
}

/// (a) The forward against the loops: plain kernel (short) and tiled (from
/// [`TILED_FROM_KEYS`] keys), multi-head and grouped, rotary or not, with padding.
#[test]
fn windowed_forward_matches_float64_loops() {
    let long = TILED_FROM_KEYS + 5;
    let cases = [
        (2, 7, vec![7, 5], HEADS, false, 3),
        (2, 9, vec![9, 9], 1, true, 4),
        (1, long, vec![long], HEADS, false, 40),
        (1, long, vec![long], 1, true, 17),
    ];
    for (batch, len, lens, kv_heads, rotary, w) in cases {
        let m = layer(len as u64, kv_heads, rotary, Some(w));
        let x = uniform(batch * len * D, 5 + w as u64);
        let (y, cache) = m.forward(&x, &x, batch, causal(&lens), None);
        assert_eq!(cache.probs().is_none(), len >= TILED_FROM_KEYS, "kernel");
        let want = windowed_loops(&m, &x, batch, &lens);
        // Rows past a row's length are padding: compare the real ones.
        for (b, &real) in lens.iter().enumerate() {
            let rows = (b * len * D)..((b * len + real) * D);
            let err = max_diff(&y[rows.clone()], &want[rows]);
            assert!(err < 1e-12, "len {len} window {w} row {b}: {err:e}");
        }
        // The weights of the real queries vanish outside the window.
        if let Some(p) = cache.probs() {
            for (idx, &pr) in p.iter().enumerate() {
                let (b, i, j) = (idx / (HEADS * len * len), (idx / len) % len, idx % len);
                if i < lens[b] && (j + w <= i || j > i) {
                    assert_eq!(pr, 0.0, "weight of key {j} for query {i}");
                }
            }
        }
    }
}

/// (b) The backward (input and weight gradients) against central differences, plain and
/// tiled kernels.
#[test]
fn windowed_backward_matches_central_differences() {
    let long = TILED_FROM_KEYS + 3;
    for (len, kv_heads, rotary, w) in [
        (7, HEADS, false, 3),
        (8, 1, true, 2),
        (long, HEADS, true, 30),
    ] {
        let mut m = layer(40 + len as u64, kv_heads, rotary, Some(w));
        let (x, r) = (uniform(len * D, 41), uniform(len * D, 42));
        let what = format!("len {len}");
        check_backward(&mut m, (&x, &r), 1, causal(&[len]), 37, |_, n| n / 5 + 1, &what);
    }
}

/// (c) A window covering the whole sequence is the unwindowed layer to the bit: forward,
/// backward and decoding, plain and tiled.
#[test]
fn window_covering_the_sequence_is_bit_identical_to_none() {
    for len in [6, TILED_FROM_KEYS + 2] {
        let full = layer(60, 1, true, None);
        let lens = [len, len];
        let x = uniform(2 * len * D, 61);
        let r = uniform(2 * len * D, 62);
        let (y0, c0) = full.forward(&x, &x, 2, causal(&lens), None);
        let mut full_grads = full.clone();
        let g0 = full_grads.backward(&x, &x, c0, &r);
        for w in [len, len + 1, 10_000] {
            let mut windowed = full.clone().with_window(Some(w));
            let (y, c) = windowed.forward(&x, &x, 2, causal(&lens), None);
            assert_eq!(y, y0, "len {len} window {w}");
            assert_eq!(windowed.backward(&x, &x, c, &r), g0, "len {len} window {w}");
            let (a, b) = (full_grads.params_mut(), windowed.params_mut());
            for ((name, p), (_, q)) in a.iter().zip(&b) {
                assert_eq!(p.grad.data, q.grad.data, "{name}");
            }
        }
        let mut c0 = KvCache::new(2, len, full.d_kv(), 2);
        let mut c1 = c0.clone();
        let windowed = full.clone().with_window(Some(len));
        let layout = StepLayout::dense();
        assert_eq!(
            full.step(&x, &mut c0, &layout),
            windowed.step(&x, &mut c1, &layout)
        );
    }
}

/// (d) Decoding with a window equals the full windowed forward at every position: one token
/// at a time (dense and paged caches), a prompt then steps (every output, and only the last),
/// and a continuous batch of ragged rows.
#[test]
fn windowed_decoding_matches_the_full_forward() {
    let (batch, len, w, split) = (2, 11, 3, 5);
    for (kv_heads, rotary) in [(HEADS, false), (1, true)] {
        let m = layer(70, kv_heads, rotary, Some(w));
        let x = uniform(batch * len * D, 71);
        let lens = [len; 2];
        let (want, _) = m.forward(&x, &x, batch, causal(&lens), None);
        let what = format!("kv heads {kv_heads}");
        check_decoding(&m, (&x, &want), (batch, len, split), &what, |_| {});
    }
}

/// (f) A long decode through a paged cache with a window releases the blocks older than the
/// window: every row holds at most `⌈w / block_rows⌉ + 1` blocks at every step, and the
/// outputs still equal the full windowed forward. One token a row at a time, then ragged
/// (a prompt chunk and single tokens), then rows re-gathered (beam search) and a row copied
/// into another cache (serve's admission).
#[test]
fn windowed_paged_cache_releases_blocks_older_than_the_window() {
    let (batch, len, w) = (2, 40, 5);
    let m = layer(90, 1, true, Some(w));
    let x = uniform(batch * len * D, 91);
    let (want, _) = m.forward(&x, &x, batch, causal(&[len; 2]), None);
    for block_rows in [1, 2, 4] {
        let bound = w.div_ceil(block_rows) + 1;
        let mut cache = KvCache::new(batch, len, m.d_kv(), block_rows);
        for p in 0..len {
            let (y, _) = m.step(
                &at_position(&x, batch, len, p),
                &mut cache,
                &StepLayout::dense(),
            );
            let err = max_diff(&y, &at_position(&want, batch, len, p));
            assert!(err < 1e-12, "step {p}, blocks of {block_rows}: {err:e}");
            let held = cache.blocks_in_use();
            assert!(
                held <= batch * bound,
                "step {p}: {held} blocks (bound {bound} a row)"
            );
        }
        assert!(cache.blocks_in_use() < batch * len.div_ceil(block_rows));
        // Ragged: row 0 in chunks of 7 positions, row 1 one position a call.
        let mut cache = KvCache::new(batch, len, m.d_kv(), block_rows);
        let mut fed = [0, 0];
        while fed[1] < len {
            let (mut rows, mut positions, mut xs, mut expect) = (vec![], vec![], vec![], vec![]);
            for (b, chunk) in [(0, 7), (1, 1)] {
                for p in fed[b]..(fed[b] + chunk).min(len) {
                    rows.push(b);
                    positions.push(p);
                    xs.extend_from_slice(&x[(b * len + p) * D..][..D]);
                    expect.extend_from_slice(&want[(b * len + p) * D..][..D]);
                }
                fed[b] = (fed[b] + chunk).min(len);
            }
            let layout = StepLayout {
                feed: Feed::Ragged {
                    rows: &rows,
                    positions: &positions,
                },
                outputs: Outputs::All,
            };
            let (y, _) = m.step(&xs, &mut cache, &layout);
            assert!(
                max_diff(&y, &expect) < 1e-12,
                "ragged, blocks of {block_rows}"
            );
            // A chunk of 7 new positions holds its window and the chunk.
            let chunk_bound = (w + 7).div_ceil(block_rows) + 1;
            assert!(cache.blocks_in_use() <= chunk_bound + bound);
        }
    }
    // Re-gathered rows share the live blocks only; a row copied elsewhere goes on decoding.
    let mut cache = KvCache::new(batch, len, m.d_kv(), 2);
    let half = len / 2;
    for p in 0..half {
        m.step(
            &at_position(&x, batch, len, p),
            &mut cache,
            &StepLayout::dense(),
        );
    }
    cache.gather_rows(&[1, 1, 0]);
    cache.gather_rows(&[0, 2]);
    let mut joined = KvCache::new(0, len, m.d_kv(), 4);
    for b in 0..batch {
        joined.push_row_from(&cache, b, half);
    }
    assert!(joined.blocks_in_use() <= batch * (w.div_ceil(4) + 1));
    // Rows swapped: the inputs and outputs of position p in the other order.
    let swapped =
        |rows: Vec<f64>| -> Vec<f64> { rows.chunks(D).rev().flatten().copied().collect() };
    for p in half..len {
        let (rows, positions) = (vec![0, 1], vec![p, p]);
        let layout = StepLayout {
            feed: Feed::Ragged {
                rows: &rows,
                positions: &positions,
            },
            outputs: Outputs::All,
        };
        let x_p = swapped(at_position(&x, batch, len, p));
        let want_p = swapped(at_position(&want, batch, len, p));
        let (y, _) = m.step(&x_p, &mut joined, &layout);
        assert!(max_diff(&y, &want_p) < 1e-12, "joined step {p}");
        let (y, _) = m.step(&x_p, &mut cache, &StepLayout::dense());
        assert!(max_diff(&y, &want_p) < 1e-12, "gathered step {p}");
    }
}

/// A small rotary pre-LN language model whose first layer has a window of 3.
fn windowed_lm_config() -> ModelConfig {
    let mut c = ModelConfig::preset("tiny", 13).unwrap();
    (c.d_model, c.n_heads, c.d_ff, c.max_len) = (8, 2, 12, 16);
    (c.n_encoder_layers, c.n_decoder_layers) = (0, 2);
    (c.norm, c.positions, c.dropout) = (NormPlacement::PreLn, Positions::Rotary, 0.0);
    c.layer_windows = vec![Some(3), None];
    c
}

/// (e) A language model with `layer_windows [Some(3), None]`: the windows reach its layers
/// (and only the translator's decoder self-attention), its log-probabilities are those of
/// decoding, and one training step runs and lowers nothing to NaN.
#[test]
fn language_model_with_layer_windows_decodes_and_trains() {
    let c = windowed_lm_config();
    c.validate().unwrap();
    let m = LanguageModel::<f64>::new(c.clone(), &mut Rng::new(80));
    let windows: Vec<_> = m.blocks.layers.iter().map(|l| l.self_attn.window).collect();
    assert_eq!(windows, [Some(3), None]);
    let mut s2s_config = c.clone();
    s2s_config.n_encoder_layers = 1;
    let s2s = Seq2Seq::<f64>::new(s2s_config, &mut Rng::new(80));
    assert_eq!(s2s.decoder.layers[0].self_attn.window, Some(3));
    assert_eq!(s2s.decoder.layers[0].cross_attn.window, None);
    assert_eq!(s2s.encoder.layers[0].self_attn.window, None);

    let tokens: Vec<u32> = vec![1, 5, 2, 7, 3, 3, 9, 4, 0, 2, 6, 8, 1, 1];
    let targets: Vec<u32> = tokens[1..].iter().chain(&[5]).copied().collect();
    let (_, full) = m.evaluate_with_logprobs(&tokens, &targets, 2);
    let mut state = m.start(2, 7);
    for p in 0..7 {
        let step: Vec<u32> = vec![tokens[p], tokens[7 + p]];
        let got = m.step(&mut state, &step, &StepLayout::dense());
        let want = at_rows(&full, 7, p, 13);
        assert!(max_diff(&got, &want) < 1e-10, "position {p}");
    }
    // Unwindowed, the same weights give other log-probabilities from position 3 on.
    let mut plain = m.clone();
    plain.blocks.layers[0].self_attn.window = None;
    let (_, unwindowed) = plain.evaluate_with_logprobs(&tokens, &targets, 2);
    assert_eq!(at_rows(&full, 7, 2, 13), at_rows(&unwindowed, 7, 2, 13));
    assert!(max_diff(&at_rows(&full, 7, 6, 13), &at_rows(&unwindowed, 7, 6, 13)) > 1e-6);

    let mut f32_model = LanguageModel::<f32>::new(c, &mut Rng::new(81));
    let before = f32_model.evaluate(&tokens, &targets, 2);
    let stats = f32_model.forward_backward(&tokens, &targets, 2, 0.1, 1.0, None);
    assert!(stats.loss_sum.is_finite(), "{stats:?}");
    let mut params = f32_model.params_mut();
    assert!(params
        .iter()
        .all(|(_, p)| p.grad.data.iter().all(|g| g.is_finite())));
    let mut adam = Adam::new(AdamConfig::default(), &params);
    adam.update(&mut params, 1e-2);
    drop(params);
    let after = f32_model.evaluate(&tokens, &targets, 2);
    assert!(
        after.loss_sum.is_finite() && after.nll_sum != before.nll_sum,
        "{before:?} -> {after:?}"
    );
}

/// The rows of position `p` of each of the 2 rows of `x [2*len, width]`.
fn at_rows(x: &[f64], len: usize, p: usize, width: usize) -> Vec<f64> {
    (0..2)
        .flat_map(|b| x[(b * len + p) * width..(b * len + p + 1) * width].to_vec())
        .collect()
}
