//! The attention kinds of `layer_attention` / `encoder_layer_attention` in the layers and
//! models, float64: backward against central differences (each kind, causal and not, plain and
//! tiled), decoding against the full forward (every step layout; linear attention's running
//! state), a window covering the sequence against exact attention bit for bit, bounded caches,
//! and the config read, written and refused.

use super::attention::MultiHeadAttention;
use super::attention_checks::{check_backward, check_decoding, max_diff, uniform};
use super::attention_kind::AttentionKind;
use super::kv_cache::KvCache;
use super::step_layout::StepLayout;
use super::{checkpoint, LanguageModel, ModelConfig, Module, NormPlacement, Positions, Seq2Seq};
use crate::batch::Batch;
use crate::backend::{AttnMask, TILED_FROM_KEYS};
use crate::rng::Rng;

const D: usize = 8;
const HEADS: usize = 2;

const SPARSE: AttentionKind = AttentionKind::Sparse {
    local: 2,
    stride: 3,
};
const GLOBAL: AttentionKind = AttentionKind::Global {
    local: 2,
    global_tokens: 2,
};

fn layer(
    seed: u64,
    kv_heads: usize,
    rotary: bool,
    kind: AttentionKind,
    causal: bool,
) -> MultiHeadAttention<f64> {
    let mut rng = Rng::new(seed);
    let mut m = MultiHeadAttention::grouped(D, HEADS, kv_heads, true, &mut rng)
        .with_rotary(rotary)
        .with_kind(kind, causal);
    for l in [&mut m.q_proj, &mut m.k_proj, &mut m.v_proj, &mut m.out_proj] {
        for b in l.bias.as_mut().unwrap().value.data.iter_mut() {
            *b = rng.uniform_range(-0.5, 0.5);
        }
    }
    m
}

/// The input and every parameter's gradient of `Σ r ⊙ y` against central differences.
#[test]
fn backward_of_each_kind_matches_central_differences() {
    let long = TILED_FROM_KEYS + 3;
    let cases = [
        (SPARSE, true, 9, false),
        (SPARSE, false, 9, true),
        (GLOBAL, true, 8, true),
        (GLOBAL, false, 8, false),
        (AttentionKind::Window { window: 3 }, false, 9, false),
        (AttentionKind::Linear, true, 7, true),
        (AttentionKind::Linear, false, 7, false),
        (
            AttentionKind::Sparse {
                local: 8,
                stride: 16,
            },
            true,
            long,
            true,
        ),
    ];
    for (n, &(kind, causal, len, rotary)) in cases.iter().enumerate() {
        let mut m = layer(100 + n as u64, 1, rotary, kind, causal);
        let lens = [len, len - 2];
        let mask = AttnMask {
            key_lens: &lens,
            causal,
            q_offset: 0,
        };
        let (x, r) = (uniform(2 * len * D, 101), uniform(2 * len * D, 102));
        let what = format!("{} causal {causal} len {len}", kind.label());
        check_backward(&mut m, (&x, &r), 2, mask, 41, |_, n| n / 5 + 1, &what);
    }
}

/// Decoding a causal layer of each kind equals its full forward: one token a row at a time
/// (dense and paged caches), a prompt then tokens (all outputs, or the last only), and ragged
/// rows; linear attention's cache holds no keys or values.
#[test]
fn decoding_each_kind_matches_the_full_forward() {
    let (batch, len, split) = (2, 11, 5);
    let kinds = [
        SPARSE,
        GLOBAL,
        AttentionKind::Window { window: 3 },
        AttentionKind::Linear,
    ];
    for (n, kind) in kinds.into_iter().enumerate() {
        let m = layer(110 + n as u64, 1, true, kind, true);
        let x = uniform(batch * len * D, 111);
        let lens = [len; 2];
        let mask = AttnMask {
            key_lens: &lens,
            causal: true,
            q_offset: 0,
        };
        let (want, _) = m.forward(&x, &x, batch, mask, None);
        let inspect = |cache: &KvCache<f64>| {
            if kind == AttentionKind::Linear {
                assert_eq!(cache.blocks_in_use(), 0, "linear attention stores no keys");
                assert_eq!(cache.row_len(1), len);
            }
        };
        check_decoding(&m, (&x, &want), (batch, len, split), &kind.label(), inspect);
    }
}

/// A small rotary pre-LN language model.
fn lm_config(kinds: Vec<AttentionKind>) -> ModelConfig {
    let mut c = ModelConfig::preset("tiny", 13).unwrap();
    (c.d_model, c.n_heads, c.d_ff, c.max_len) = (8, 2, 12, 40);
    (c.n_encoder_layers, c.n_decoder_layers) = (0, 2);
    (c.norm, c.positions, c.dropout) = (NormPlacement::PreLn, Positions::Rotary, 0.0);
    c.layer_attention = kinds;
    c
}

/// A window covering the sequence is exact attention to the bit (the same kernels run), in a
/// language model (log-probabilities and every gradient) and in a translator's encoder (a
/// band of `|p − j| < w`).
#[test]
fn a_window_covering_the_sequence_is_exact_bit_for_bit() {
    let tokens: Vec<u32> = (0..2 * 20).map(|i| (i * 7 % 13) as u32).collect();
    let targets: Vec<u32> = tokens[1..].iter().chain(&[5]).copied().collect();
    let exact = LanguageModel::<f64>::new(lm_config(vec![]), &mut Rng::new(120));
    let (_, want) = exact.evaluate_with_logprobs(&tokens, &targets, 2);
    for w in [20, 21, 1000] {
        let window = AttentionKind::Window { window: w };
        let c = lm_config(vec![window, window]);
        c.validate().unwrap();
        let mut m = LanguageModel::<f64>::new(c, &mut Rng::new(120));
        assert_eq!(m.blocks.layers[0].self_attn.window, Some(w));
        let (_, got) = m.evaluate_with_logprobs(&tokens, &targets, 2);
        assert_eq!(got, want, "window {w}");
        let mut e = exact.clone();
        e.forward_backward(&tokens, &targets, 2, 0.0, 1.0, None);
        m.forward_backward(&tokens, &targets, 2, 0.0, 1.0, None);
        for ((name, a), (_, b)) in e.params_mut().iter().zip(&m.params_mut()) {
            assert_eq!(a.grad.data, b.grad.data, "{name}, window {w}");
        }
    }
    // A shorter window changes the log-probabilities.
    let m = LanguageModel::<f64>::new(
        lm_config(vec![AttentionKind::Window { window: 4 }; 2]),
        &mut Rng::new(120),
    );
    assert!(max_diff(&m.evaluate_with_logprobs(&tokens, &targets, 2).1, &want) > 1e-6);

    let mut c = lm_config(vec![]);
    c.n_encoder_layers = 2;
    let src: Vec<Vec<u32>> = vec![(1..12).collect(), (3..9).collect()];
    let tgt: Vec<Vec<u32>> = vec![(2..8).collect(), (4..10).collect()];
    let pairs: Vec<(&[u32], &[u32])> = src
        .iter()
        .zip(&tgt)
        .map(|(s, t)| (&s[..], &t[..]))
        .collect();
    let batch = Batch::from_pairs(&pairs);
    let exact = Seq2Seq::<f64>::new(c.clone(), &mut Rng::new(121));
    let (want, _) = exact.forward(&batch, None);
    for (w, same) in [(12, true), (50, true), (3, false)] {
        c.encoder_layer_attention = vec![AttentionKind::Window { window: w }; 2];
        c.validate().unwrap();
        let m = Seq2Seq::<f64>::new(c.clone(), &mut Rng::new(121));
        assert_eq!(
            m.encoder.layers[0].self_attn.window, None,
            "the encoder's band is not causal"
        );
        let (got, _) = m.forward(&batch, None);
        assert_eq!(got == want, same, "encoder window {w}");
    }
}

/// Language models of each kind: decoding one token at a time gives the full forward's
/// log-probabilities, also after the rows swap places (a beam search's reordering); a windowed
/// model's decoding state holds about its window.
#[test]
fn language_models_of_each_kind_decode_like_their_forward() {
    let len = 30;
    let tokens: Vec<u32> = (0..2 * len).map(|i| (i * 5 % 13) as u32).collect();
    let targets: Vec<u32> = tokens[1..].iter().chain(&[5]).copied().collect();
    let kinds = [
        AttentionKind::Window { window: 4 },
        SPARSE,
        GLOBAL,
        AttentionKind::Linear,
    ];
    for kind in kinds {
        let m = LanguageModel::<f64>::new(
            lm_config(vec![kind, AttentionKind::Exact]),
            &mut Rng::new(130),
        );
        let (_, full) = m.evaluate_with_logprobs(&tokens, &targets, 2);
        let mut state = m.start(2, len);
        let mut most_blocks = 0;
        // Halfway the two rows swap places (as a beam search reorders its hypotheses): from
        // then on state row 0 continues sequence 1 and row 1 sequence 0.
        let mut order = [0, 1];
        for p in 0..len {
            if p == len / 2 {
                state.gather_rows(&[1, 0]);
                order = [1, 0];
            }
            let got = m.step(
                &mut state,
                &order.map(|b| tokens[b * len + p]),
                &StepLayout::dense(),
            );
            let want: Vec<f64> = order
                .iter()
                .flat_map(|&b| full[(b * len + p) * 13..(b * len + p + 1) * 13].to_vec())
                .collect();
            assert!(
                max_diff(&got, &want) < 1e-10,
                "{} position {p}",
                kind.label()
            );
            most_blocks = most_blocks.max(state.caches[0].blocks_in_use());
        }
        match kind {
            // blocks of 4 positions: at most ⌈4/4⌉ + 1 per row
            AttentionKind::Window { .. } => assert!(most_blocks <= 2 * 2, "{most_blocks} blocks"),
            AttentionKind::Linear => assert_eq!(most_blocks, 0),
            _ => {}
        }
    }
}

/// `layer_attention` and `encoder_layer_attention` saved in config.json and loaded back;
/// bad entries refused by name.
#[test]
fn the_config_field_is_saved_loaded_and_checked() {
    let kinds = vec![SPARSE, AttentionKind::Linear];
    let mut m = LanguageModel::<f32>::new(lm_config(kinds.clone()), &mut Rng::new(140));
    let dir = tempfile::tempdir().unwrap();
    checkpoint::save(dir.path(), &mut m).unwrap();
    let text = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    assert!(
        text.contains(r#""layer_attention""#) && text.contains(r#""linear""#),
        "{text}"
    );
    let back: LanguageModel<f32> = checkpoint::load(dir.path()).unwrap();
    assert_eq!(back.config.layer_attention, kinds);
    assert!(back.blocks.layers[1].self_attn.linear);
    assert!(back.blocks.layers[0].self_attn.pattern.is_some());

    let refused = |edit: &dyn Fn(&mut ModelConfig), words: &[&str]| {
        let mut c = lm_config(vec![]);
        edit(&mut c);
        let err = c.validate().unwrap_err();
        assert!(words.iter().all(|w| err.contains(w)), "{err}");
    };
    refused(
        &|c| c.layer_attention = vec![AttentionKind::Exact],
        &["layer_attention", "1 entries", "2 decoder"],
    );
    refused(
        &|c| c.layer_attention = vec![AttentionKind::Exact, AttentionKind::Window { window: 0 }],
        &["layer_attention[1]", "window"],
    );
    refused(
        &|c| {
            c.layer_attention = vec![AttentionKind::Linear, AttentionKind::Exact];
            c.attention_dropout = 0.1;
        },
        &["layer_attention[0]", "attention_dropout"],
    );
    refused(
        &|c| {
            c.layer_attention = vec![AttentionKind::Exact, SPARSE];
            c.layer_windows = vec![None, Some(4)];
        },
        &["layer 1", "layer_windows", "sparse2x3"],
    );
    refused(
        &|c| c.encoder_layer_attention = vec![SPARSE],
        &["encoder_layer_attention", "0 encoder"],
    );
    // an unknown kind in config.json: the config's parse names it, and the load refuses it
    let bad = text.replace(r#""linear""#, r#""performer""#);
    let err = serde_json::from_str::<ModelConfig>(&bad)
        .unwrap_err()
        .to_string();
    assert!(err.contains("performer"), "{err}");
    std::fs::write(dir.path().join("config.json"), bad).unwrap();
    assert!(checkpoint::load::<LanguageModel<f32>>(dir.path()).is_err());
}
