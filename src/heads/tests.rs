//! Float64 checks of the gates, the importance and pruning: the gates' gradient against
//! central finite differences, pruning against gating, nothing pruned against the model,
//! checkpoints with per-layer head counts, and the refusals.

use super::behaviour::Behaviour;
use super::importance::{lm_importance, seq2seq_importance, Importance};
use super::prune::{choose, prune, HeadId, Order};
use super::HeadModel;
use crate::batch::Batch;
use crate::model::config::{AttentionSite, ModelConfig, NormPlacement, Positions};
use crate::model::{LanguageModel, Seq2Seq, StepLayout};
use crate::rng::Rng;

/// A small config: `kv` key/value heads of 4 query heads, pre-LN rotary or post-LN sinusoidal.
fn config(kv: usize, rotary: bool, layers: (usize, usize)) -> ModelConfig {
    let mut c = ModelConfig::preset("tiny", 19).unwrap();
    (c.d_model, c.n_heads, c.d_ff, c.max_len, c.dropout) = (16, 4, 24, 32, 0.0);
    (c.n_encoder_layers, c.n_decoder_layers) = layers;
    c.n_kv_heads = Some(kv);
    if rotary {
        (c.norm, c.positions) = (NormPlacement::PreLn, Positions::Rotary);
    }
    c
}

fn lm_data() -> (Vec<u32>, Vec<u32>) {
    let tokens: Vec<u32> = (0..14).map(|i| (i * 7 + 3) % 19).collect();
    let targets: Vec<u32> = (0..14).map(|i| (i * 5 + 1) % 19).collect();
    (tokens, targets)
}

fn batch() -> Batch {
    Batch::from_pairs(&[
        (&[4, 5, 6, 7, 11][..], &[8, 9, 12][..]),
        (&[10, 13][..], &[4, 5, 6, 9, 17][..]),
    ])
}

/// Random gates in [0.5, 1.5] on every attention.
fn random_gates<M: HeadModel<f64>>(m: &mut M, seed: u64) {
    let mut rng = Rng::new(seed);
    for (_, _, a) in m.attentions_mut() {
        a.gates = (0..a.n_heads)
            .map(|_| rng.uniform_range(0.5, 1.5))
            .collect();
    }
}

/// `∂L/∂ξ_h` from the backward against `(L(ξ + ε) − L(ξ − ε)) / 2ε`, on every gate.
fn check_gate_gradients<M: HeadModel<f64> + Clone>(
    mut model: M,
    loss: impl Fn(&M) -> f64,
    backward: impl Fn(&mut M),
) {
    random_gates(&mut model, 5);
    for (_, _, a) in model.attentions_mut() {
        a.gate_grads = Some(vec![0.0; a.n_heads]);
    }
    backward(&mut model);
    let analytic: Vec<(AttentionSite, usize, Vec<f64>)> = model
        .attentions()
        .into_iter()
        .map(|(s, l, a)| (s, l, a.gate_grads.clone().unwrap()))
        .collect();
    let eps = 1e-5;
    let mut checked = 0;
    for (site, layer, grads) in analytic {
        for (h, &g) in grads.iter().enumerate() {
            let at = |delta: f64| {
                let mut m = model.clone();
                for (s, l, a) in m.attentions_mut() {
                    if s == site && l == layer {
                        a.gates[h] += delta;
                    }
                }
                loss(&m)
            };
            let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
            let err = (g - numeric).abs() / (1e-6 + g.abs().max(numeric.abs()));
            assert!(
                err < 1e-6,
                "{site:?} layer {layer} head {h}: backward {g} vs finite differences {numeric}"
            );
            assert!(
                g.abs() > 1e-8,
                "{site:?} layer {layer} head {h}: a zero gradient"
            );
            checked += 1;
        }
    }
    assert!(checked >= 8);
}

#[test]
fn gate_gradients_match_finite_differences() {
    let (tokens, targets) = lm_data();
    for (kv, rotary) in [(4, false), (2, true)] {
        let lm = LanguageModel::<f64>::new(config(kv, rotary, (0, 2)), &mut Rng::new(1));
        check_gate_gradients(
            lm,
            |m| m.evaluate(&tokens, &targets, 2).loss_sum,
            |m| {
                m.forward_backward(&tokens, &targets, 2, 0.0, 1.0, None);
            },
        );
    }
    let b = batch();
    let s2s = Seq2Seq::<f64>::new(config(4, false, (2, 2)), &mut Rng::new(2));
    check_gate_gradients(
        s2s,
        |m| m.evaluate(&b, 0.0).loss_sum,
        |m| {
            m.forward_backward(&b, 0.0, 1.0, None);
        },
    );
}

/// Gates of 0 on `remove` (the rest 1).
fn zero_gates<M: HeadModel<f64>>(m: &mut M, remove: &[HeadId]) {
    for (site, layer, a) in m.attentions_mut() {
        a.gates = (0..a.n_heads)
            .map(|h| {
                let gone = remove.contains(&HeadId {
                    site,
                    layer,
                    head: h,
                });
                if gone {
                    0.0
                } else {
                    1.0
                }
            })
            .collect();
    }
}

fn assert_close(a: &[f64], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol, "{what} [{i}]: {x} vs {y}");
    }
}

#[test]
fn a_pruned_language_model_equals_its_gated_model_and_nothing_pruned_is_the_model() {
    let (tokens, targets) = lm_data();
    for (kv, rotary) in [(4, false), (2, true)] {
        let model = LanguageModel::<f64>::new(config(kv, rotary, (0, 3)), &mut Rng::new(3));
        // Nothing removed: the same model, bit for bit.
        let mut same = model.clone();
        prune(&mut same, &[]).unwrap();
        assert_eq!(same.config, model.config);
        assert_eq!(
            same.forward(&tokens, 2, None).0,
            model.forward(&tokens, 2, None).0
        );
        let remove = choose(&model, 4, &Order::Random(7)).unwrap();
        assert_eq!(remove.len(), 4);
        let mut gated = model.clone();
        zero_gates(&mut gated, &remove);
        let mut pruned = model.clone();
        prune(&mut pruned, &remove).unwrap();
        let heads = &pruned.config.layer_heads.decoder;
        assert_eq!(heads.iter().sum::<usize>(), 12 - 4, "{heads:?}");
        let (want, got) = (
            gated.forward(&tokens, 2, None).0,
            pruned.forward(&tokens, 2, None).0,
        );
        assert_close(&got, &want, 1e-12, "training forward");
        let (a, b) = (
            gated.evaluate(&tokens, &targets, 2),
            pruned.evaluate(&tokens, &targets, 2),
        );
        assert!((a.loss_sum - b.loss_sum).abs() < 1e-10);
        // Decoding: a prompt then one token, through the KV caches.
        let (mut sg, mut sp) = (gated.start(2, 16), pruned.start(2, 16));
        let dense = StepLayout::dense();
        let (x, y) = (
            gated.step(&mut sg, &tokens[..6], &dense),
            pruned.step(&mut sp, &tokens[..6], &dense),
        );
        assert_close(&y, &x, 1e-12, "prompt step");
        let (x, y) = (
            gated.step(&mut sg, &[3, 4], &dense),
            pruned.step(&mut sp, &[3, 4], &dense),
        );
        assert_close(&y, &x, 1e-12, "next step");
        // The pruned model is what its config builds.
        let rebuilt = LanguageModel::<f64>::new(pruned.config.clone(), &mut Rng::new(0));
        for (a, b) in rebuilt.attentions().iter().zip(pruned.attentions()) {
            assert_eq!(
                (
                    a.2.n_heads,
                    a.2.n_kv_heads,
                    a.2.q_proj.d_out,
                    a.2.out_proj.d_in
                ),
                (
                    b.2.n_heads,
                    b.2.n_kv_heads,
                    b.2.q_proj.d_out,
                    b.2.out_proj.d_in
                )
            );
        }
    }
}

#[test]
fn a_pruned_translation_model_equals_its_gated_model_at_every_site() {
    let model = Seq2Seq::<f64>::new(config(4, false, (2, 2)), &mut Rng::new(4));
    let b = batch();
    let remove = vec![
        HeadId {
            site: AttentionSite::Encoder,
            layer: 0,
            head: 1,
        },
        HeadId {
            site: AttentionSite::Decoder,
            layer: 1,
            head: 0,
        },
        HeadId {
            site: AttentionSite::Decoder,
            layer: 1,
            head: 3,
        },
        HeadId {
            site: AttentionSite::Cross,
            layer: 0,
            head: 2,
        },
    ];
    let mut gated = model.clone();
    zero_gates(&mut gated, &remove);
    let mut pruned = model.clone();
    prune(&mut pruned, &remove).unwrap();
    let h = &pruned.config.layer_heads;
    assert_eq!(
        (&h.encoder[..], &h.decoder[..], &h.cross[..]),
        (&[3, 4][..], &[4, 2][..], &[3, 4][..])
    );
    assert_close(
        &pruned.forward(&b, None).0,
        &gated.forward(&b, None).0,
        1e-12,
        "seq2seq forward",
    );
    let mut same = model.clone();
    prune(&mut same, &[]).unwrap();
    assert_eq!(same.forward(&b, None).0, model.forward(&b, None).0);
}

#[test]
fn importance_is_the_mean_absolute_gate_gradient_normalised_per_layer() {
    let (tokens, targets) = lm_data();
    let mut model = LanguageModel::<f64>::new(config(4, true, (0, 2)), &mut Rng::new(6));
    let mut windows = Vec::new();
    for w in 0..2 {
        let mut window = tokens[w * 7..w * 7 + 7].to_vec();
        window.push(targets[w * 7 + 6]);
        windows.push(window);
    }
    let importance = lm_importance(&mut model, &windows, 1);
    assert_eq!(importance.batches, 2);
    // By hand: each window's mean-loss gate gradients, absolute, averaged.
    let mut want = [[0.0; 4]; 2];
    for w in &windows {
        let mut m = model.clone();
        Importance::start(&mut m);
        let n = (w.len() - 1) as f64;
        m.forward_backward(&w[..w.len() - 1], &w[1..], 1, 0.0, 1.0 / n, None);
        for (_, layer, a) in m.attentions() {
            for (h, g) in a.gate_grads.as_ref().unwrap().iter().enumerate() {
                want[layer][h] += g.abs() / 2.0;
            }
        }
    }
    let mean = &importance.mean()[0].1;
    let normalised = &importance.normalised()[0].1;
    for ((got, norm), want) in mean.iter().zip(normalised).zip(&want) {
        assert_close(got, want, 1e-12, "mean |dL/dξ|");
        let l2 = want.iter().map(|x| x * x).sum::<f64>().sqrt();
        let expect: Vec<f64> = want.iter().map(|x| x / l2).collect();
        assert_close(norm, &expect, 1e-12, "normalised");
    }
    assert!(model.attentions().iter().all(|a| a.2.gate_grads.is_none()));
    let s2s_importance = seq2seq_importance(
        &mut Seq2Seq::<f64>::new(config(4, false, (1, 1)), &mut Rng::new(2)),
        &[batch()],
    );
    assert_eq!(s2s_importance.sums.len(), 3);
}

#[test]
fn behaviour_reads_the_weights_of_each_head() {
    use super::behaviour::{add_weights, HeadSums, WeightsShape};
    // One row, one head, 3 queries over 3 keys (causal): rows [1], [0.5 0.5], [0.2 0.3 0.5].
    let w = [1.0, 0.0, 0.0, 0.5, 0.5, 0.0, 0.2, 0.3, 0.5];
    let mut sums = [HeadSums::default()];
    let shape = WeightsShape {
        heads: 1,
        q_len: 3,
        k_len: 3,
        q_lens: &[3],
        k_lens: &[3],
    };
    add_weights(&mut sums, &w, &shape);
    let m = sums[0].mean();
    let entropy = |p: &[f64]| -p.iter().map(|x| x * x.ln()).sum::<f64>();
    assert!((m.distance - (0.0 + 0.5 + (2.0 * 0.2 + 0.3)) / 3.0).abs() < 1e-12);
    let e = (0.0 + entropy(&[0.5, 0.5]) + entropy(&[0.2, 0.3, 0.5])) / 3.0;
    assert!((m.entropy - e).abs() < 1e-12);
    assert!((m.previous - (0.5 + 0.3) / 2.0).abs() < 1e-12);
    assert!((m.same - (1.0 + 0.5 + 0.5) / 3.0).abs() < 1e-12);
    assert!((m.first - (1.0 + 0.5 + 0.2) / 3.0).abs() < 1e-12);
    // On a model: every head's weights sum to one per query, so distance ≤ seq − 1.
    let model = LanguageModel::<f64>::new(config(2, true, (0, 2)), &mut Rng::new(8));
    let mut behaviour = Behaviour::new(&model);
    behaviour.add_lm(&model, &lm_data().0, 2);
    for layer in &behaviour.means()[0].1 {
        for h in layer {
            assert!(h.distance >= 0.0 && h.distance <= 6.0 && h.entropy >= 0.0);
            assert!((0.0..=1.0).contains(&h.first) && (0.0..=1.0).contains(&h.same));
        }
    }
}

#[test]
fn bad_prune_requests_are_refused_by_name() {
    let model = LanguageModel::<f64>::new(config(2, true, (0, 2)), &mut Rng::new(1));
    // Groups of 2 query heads per key/value head: an odd count is refused.
    let e = choose(&model, 3, &Order::Random(1))
        .unwrap_err()
        .to_string();
    assert!(e.contains("groups of 2"), "{e}");
    // 8 heads in 2 layers, one group of 2 must stay in each: at most 4 can go.
    let e = choose(&model, 6, &Order::Random(1))
        .unwrap_err()
        .to_string();
    assert!(e.contains("at most 4"), "{e}");
    // Every head of a layer, by hand.
    let all: Vec<HeadId> = (0..4)
        .map(|head| HeadId {
            site: AttentionSite::Decoder,
            layer: 0,
            head,
        })
        .collect();
    let e = prune(&mut model.clone(), &all).unwrap_err().to_string();
    assert!(e.contains("every head"), "{e}");
    let half = &all[..1];
    let e = prune(&mut model.clone(), half).unwrap_err().to_string();
    assert!(e.contains("whole groups"), "{e}");
    let e = prune(
        &mut model.clone(),
        &[HeadId {
            site: AttentionSite::Cross,
            layer: 0,
            head: 0,
        }],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("no head 0 in layer 0 of the cross"), "{e}");
    // By importance: the lowest-scored groups go, never a layer's last.
    let scores = vec![(
        AttentionSite::Decoder,
        vec![vec![0.1, 0.1, 0.9, 0.9], vec![0.05, 0.05, 0.01, 0.01]],
    )];
    let chosen = choose(&model, 4, &Order::Importance(scores)).unwrap();
    let layers: Vec<(usize, usize)> = chosen.iter().map(|h| (h.layer, h.head)).collect();
    assert_eq!(layers, [(0, 0), (0, 1), (1, 2), (1, 3)]);
}

#[test]
fn config_with_layer_heads_round_trips_and_is_validated() {
    let mut c = config(2, true, (0, 2));
    c.layer_heads.decoder = vec![2, 4];
    c.validate().unwrap();
    let json = serde_json::to_string(&c).unwrap();
    assert!(
        json.contains(r#""layer_heads":{"decoder":[2,4]}"#),
        "{json}"
    );
    assert_eq!(serde_json::from_str::<ModelConfig>(&json).unwrap(), c);
    let plain = serde_json::to_string(&config(2, true, (0, 2))).unwrap();
    assert!(!plain.contains("layer_heads"), "{plain}");
    for (bad, what) in [
        (vec![2], "1 entries for 2 layers"),
        (vec![0, 4], "layer 0 0 heads"),
        (vec![3, 4], "layer 0 3 heads"),
        (vec![2, 6], "layer 1 6 heads"),
    ] {
        c.layer_heads.decoder = bad;
        let e = c.validate().unwrap_err();
        assert!(e.contains("layer_heads.decoder") && e.contains(what), "{e}");
    }
    let unknown = json.replace(r#"{"decoder""#, r#"{"decoders""#);
    let e = serde_json::from_str::<ModelConfig>(&unknown).unwrap_err();
    assert!(e.to_string().contains("decoders"), "{e}");
}

#[test]
fn a_pruned_checkpoint_round_trips() {
    let mut model = LanguageModel::<f32>::new(config(2, true, (0, 2)), &mut Rng::new(1));
    let remove = choose(&model, 2, &Order::Random(3)).unwrap();
    prune(&mut model, &remove).unwrap();
    let dir = std::env::temp_dir().join(format!("heads-ckpt-{}", std::process::id()));
    crate::model::checkpoint::save(&dir, &mut model).unwrap();
    let loaded: LanguageModel<f32> = crate::model::checkpoint::load(&dir).unwrap();
    assert_eq!(loaded.config, model.config);
    let tokens: Vec<u32> = (0..8).collect();
    assert_eq!(
        loaded.forward(&tokens, 1, None).0,
        model.forward(&tokens, 1, None).0
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn fine_tuning_a_pruned_translation_model_lowers_its_loss_and_repeats_for_a_seed() {
    use super::fine_tune::{fine_tune_seq2seq, FineTune};
    use crate::model::Module;
    let mut model = Seq2Seq::<f32>::new(config(2, false, (2, 2)), &mut Rng::new(5));
    let remove = choose(&model, 4, &Order::Random(3)).unwrap();
    prune(&mut model, &remove).unwrap();
    // 12 pairs: a short source and its reverse shifted by one, all ids in 4..19.
    let pairs: Vec<(Vec<u32>, Vec<u32>)> = (0..12u32)
        .map(|i| {
            let src: Vec<u32> = (0..3 + i % 4).map(|j| 4 + (i * 5 + j * 3) % 14).collect();
            let tgt = src.iter().rev().map(|t| 4 + (t - 3) % 15).collect();
            (src, tgt)
        })
        .collect();
    let mean_nll = |m: &Seq2Seq<f32>| {
        let refs: Vec<(&[u32], &[u32])> = pairs.iter().map(|(s, t)| (&s[..], &t[..])).collect();
        let s = m.evaluate(&Batch::from_pairs(&refs), 0.0);
        s.nll_sum / s.n_tokens as f64
    };
    let plan = FineTune {
        steps: 30,
        batch: 4,
        lr: 1e-2,
        seed: 9,
    };
    let mut a = model.clone();
    let losses = fine_tune_seq2seq(&mut a, &pairs, plan, 0.1).unwrap();
    let (before, after) = (mean_nll(&model), mean_nll(&a));
    assert!(after < before - 0.5, "nll {before} -> {after}");
    let mut b = model.clone();
    assert_eq!(fine_tune_seq2seq(&mut b, &pairs, plan, 0.1).unwrap(), losses);
    for ((name, pa), (_, pb)) in a.params_mut().into_iter().zip(b.params_mut()) {
        assert_eq!(pa.value.data, pb.value.data, "{name} differs for equal seeds");
    }
    // The smoothed loss reported is the one the update minimised: with ε_ls = 0 it is the nll.
    let mut c = model.clone();
    let plain = fine_tune_seq2seq(&mut c, &pairs, FineTune { steps: 1, batch: 12, ..plan }, 0.0);
    assert!((plain.unwrap()[0] - before).abs() < 1e-5);
    let bad = fine_tune_seq2seq(&mut c, &pairs, plan, 1.0).unwrap_err();
    assert!(bad.to_string().contains("label-smoothing"), "{bad}");
    let none = fine_tune_seq2seq(&mut c, &[], plan, 0.1).unwrap_err();
    assert!(none.to_string().contains("at least one example"), "{none}");
}
