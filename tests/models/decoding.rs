//! Greedy decoding and scoring: the KV-cached search against full recomputation, batching
//! invariance, and scores against the search's own log-probabilities.

use transformer::batch::{Batch, BOS, EOS, PAD};
use transformer::decode::{
    greedy_decode, greedy_decode_full, score_pairs, GreedyOptions, Hypothesis,
};
use transformer::model::Module;
use transformer::model::{ModelConfig, NormPlacement, Seq2Seq};
use transformer::rng::Rng;

const VOCAB: usize = 20;

fn config(norm: NormPlacement, tie: bool) -> ModelConfig {
    ModelConfig {
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
        positions: Default::default(),
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

fn model(norm: NormPlacement, tie: bool, seed: u64) -> Seq2Seq<f32> {
    let c = config(norm, tie);
    c.validate().unwrap();
    Seq2Seq::new(c, &mut Rng::new(seed))
}

/// Makes EOS likely by construction: its row of the output projection (the embedding row when
/// tied) is scaled by `alpha`, so its logit `h · w_EOS` dominates whenever it is positive and
/// large enough. Which step that happens at depends on the source and the prefix.
fn boost_eos(m: &mut Seq2Seq<f32>, alpha: f32) {
    let d = m.config.d_model;
    let w = match &mut m.head.output_proj {
        Some(p) => &mut p.value.data,
        None => &mut m.embedding.weight.value.data,
    };
    w[EOS as usize * d..(EOS as usize + 1) * d]
        .iter_mut()
        .for_each(|x| *x *= alpha);
}

/// Sources of the given lengths with random non-special ids.
fn sources(lens: &[usize], seed: u64) -> Vec<Vec<u32>> {
    let mut rng = Rng::new(seed);
    lens.iter()
        .map(|&n| (0..n).map(|_| 4 + rng.below(VOCAB - 4) as u32).collect())
        .collect()
}

const LENS: [usize; 9] = [5, 0, 12, 1, 7, 3, 9, 2, 5];

/// The models under test: both norm placements, tied and untied, with EOS boosted by various
/// amounts so that sentences stop at different steps or run to the length limit.
fn models() -> Vec<(&'static str, Seq2Seq<f32>)> {
    let mut out = Vec::new();
    for (name, norm, tie, alpha) in [
        ("post-ln tied", NormPlacement::PostLn, true, 1.0),
        ("pre-ln tied", NormPlacement::PreLn, true, 1.0),
        ("post-ln untied", NormPlacement::PostLn, false, 1.0),
        ("pre-ln untied", NormPlacement::PreLn, false, 1.0),
        ("pre-ln untied, EOS x2", NormPlacement::PreLn, false, 2.0),
        ("post-ln tied, EOS x3", NormPlacement::PostLn, true, 3.0),
    ] {
        let mut m = model(norm, tie, 3);
        boost_eos(&mut m, alpha);
        out.push((name, m));
    }
    out
}

const OPTIONS: GreedyOptions = GreedyOptions {
    max_len_extra: 6,
    batch_size: 4,
    forced_first: None,
    min_len: 0,
    forced_end: false,
};

fn assert_same(name: &str, a: &[Hypothesis], b: &[Hypothesis], tol: f64) {
    assert_eq!(a.len(), b.len(), "{name}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.tokens, y.tokens, "{name}: sentence {i} tokens");
        assert_eq!(x.finished, y.finished, "{name}: sentence {i} finished");
        assert_eq!(
            x.token_logprobs.len(),
            y.token_logprobs.len(),
            "{name}: {i}"
        );
        for (t, (p, q)) in x.token_logprobs.iter().zip(&y.token_logprobs).enumerate() {
            assert!(
                (p - q).abs() <= tol,
                "{name}: sentence {i} token {t}: log-prob {p} vs {q}"
            );
        }
        assert!((x.score - y.score).abs() <= tol * x.token_logprobs.len().max(1) as f64);
    }
}

fn check_shape(
    name: &str,
    srcs: &[Vec<u32>],
    hyps: &[Hypothesis],
    opts: &GreedyOptions,
    max_len: usize,
) {
    for (i, (s, h)) in srcs.iter().zip(hyps).enumerate() {
        let limit = (s.len().min(max_len - 1) + opts.max_len_extra).min(max_len);
        assert_eq!(
            h.n_emitted(),
            h.tokens.len() + h.finished as usize,
            "{name}: {i}"
        );
        assert!(h.n_emitted() <= limit, "{name}: {i} emitted past the limit");
        assert!(
            h.finished || h.n_emitted() == limit,
            "{name}: {i} stopped early"
        );
        assert!(
            h.tokens
                .iter()
                .all(|&t| t != PAD && t != BOS && t != EOS && (t as usize) < VOCAB),
            "{name}: {i} emitted a special"
        );
        assert!(h.token_logprobs.iter().all(|&p| p <= 0.0 && p.is_finite()));
        let sum: f64 = h.token_logprobs.iter().sum();
        assert!((sum - h.score).abs() < 1e-9);
    }
}

#[test]
fn cached_decoding_matches_full_recomputation() {
    let srcs = sources(&LENS, 5);
    let (mut n_finished, mut n_open) = (0, 0);
    for (name, m) in models() {
        let cached = greedy_decode(&m, &srcs, &OPTIONS);
        let full = greedy_decode_full(&m, &srcs, &OPTIONS);
        check_shape(name, &srcs, &cached, &OPTIONS, m.config.max_len);
        assert_same(name, &cached, &full, 1e-5);
        n_finished += cached
            .iter()
            .filter(|h| h.finished && !h.tokens.is_empty())
            .count();
        n_open += cached.iter().filter(|h| !h.finished).count();
    }
    // The construction must exercise both endings: EOS after some tokens, and the length limit.
    assert!(
        n_finished >= 5 && n_open >= 5,
        "{n_finished} finished, {n_open} open"
    );
}

#[test]
fn long_outputs_and_max_len_cap_match_full_recomputation() {
    // No EOS boost and a long budget: runs of 20+ cached steps.
    let m = model(NormPlacement::PostLn, true, 11);
    let opts = GreedyOptions {
        max_len_extra: 25,
        batch_size: 3,
        forced_first: None,
        min_len: 0,
        forced_end: false,
    };
    let srcs = sources(&[4, 9, 1, 15], 8);
    let cached = greedy_decode(&m, &srcs, &opts);
    assert!(cached.iter().any(|h| h.n_emitted() >= 25));
    check_shape("long", &srcs, &cached, &opts, 64);
    assert_same("long", &cached, &greedy_decode_full(&m, &srcs, &opts), 1e-5);

    // A model with a short position table: sources are truncated and outputs capped.
    let mut c = config(NormPlacement::PreLn, true);
    c.max_len = 10;
    let m = Seq2Seq::<f32>::new(c, &mut Rng::new(4));
    let srcs = sources(&[25, 9, 3, 0], 9);
    let cached = greedy_decode(&m, &srcs, &opts);
    check_shape("capped", &srcs, &cached, &opts, 10);
    assert!(cached.iter().all(|h| h.n_emitted() <= 10));
    assert_same(
        "capped",
        &cached,
        &greedy_decode_full(&m, &srcs, &opts),
        1e-5,
    );
    let trunc: Vec<Vec<u32>> = srcs.iter().map(|s| s[..s.len().min(9)].to_vec()).collect();
    assert_eq!(cached, greedy_decode(&m, &trunc, &opts));
}

#[test]
fn decoding_does_not_depend_on_batching() {
    let srcs = sources(&LENS, 6);
    for (name, m) in models() {
        let alone: Vec<Hypothesis> = srcs
            .iter()
            .map(|s| greedy_decode(&m, std::slice::from_ref(s), &OPTIONS).remove(0))
            .collect();
        for batch_size in [1, 3, 16] {
            let opts = GreedyOptions {
                batch_size,
                ..OPTIONS
            };
            let batched = greedy_decode(&m, &srcs, &opts);
            assert_same(
                &format!("{name}, batch {batch_size}"),
                &alone,
                &batched,
                1e-5,
            );
        }
        // Reversed input order: results follow the input.
        let rev: Vec<Vec<u32>> = srcs.iter().rev().cloned().collect();
        let mut back = greedy_decode(&m, &rev, &OPTIONS);
        back.reverse();
        assert_same(name, &alone, &back, 1e-5);
    }
    let m = model(NormPlacement::PostLn, true, 3);
    assert!(greedy_decode(&m, &[], &OPTIONS).is_empty());
    assert!(score_pairs(&m, &[], 4).is_empty());
}

#[test]
fn scores_equal_the_greedy_log_probabilities() {
    let srcs = sources(&LENS, 7);
    let mut checked = 0;
    for (name, m) in models() {
        let hyps = greedy_decode(&m, &srcs, &OPTIONS);
        // A finished hypothesis is exactly a target with its EOS: its score is the sum of the
        // search's token log-probabilities.
        let pairs: Vec<(Vec<u32>, Vec<u32>)> = srcs
            .iter()
            .zip(&hyps)
            .map(|(s, h)| (s.clone(), h.tokens.clone()))
            .collect();
        let scores = score_pairs(&m, &pairs, 4);
        for (i, (h, &sc)) in hyps.iter().zip(&scores).enumerate() {
            assert!(sc <= 0.0 && sc.is_finite());
            if h.finished {
                assert!(
                    (sc - h.score).abs() < 1e-4,
                    "{name}: {i}: {sc} vs {}",
                    h.score
                );
                checked += 1;
            } else {
                // The score adds log p(EOS) after the last token, which the search did not pick.
                assert!(sc < h.score, "{name}: {i}");
            }
        }
        // Batch invariance of scores, and agreement with the training loss's NLL.
        for batch_size in [1, 2, 100] {
            let other = score_pairs(&m, &pairs, batch_size);
            for (a, b) in scores.iter().zip(&other) {
                assert!(
                    (a - b).abs() < 1e-4,
                    "{name}: batch {batch_size}: {a} vs {b}"
                );
            }
        }
        for (s, t) in &pairs {
            let batch = Batch::from_pairs(&[(&s[..], &t[..])]);
            let nll = m.evaluate(&batch, 0.0).nll_sum;
            let sc = score_pairs(&m, &[(s.clone(), t.clone())], 1)[0];
            assert!((sc + nll).abs() < 1e-4, "{name}: {sc} vs -{nll}");
        }
    }
    assert!(
        checked >= 20,
        "only {checked} finished hypotheses were scored"
    );
}

#[test]
fn prepared_inference_weights_give_the_same_search() {
    // Transposed weight copies (Seq2Seq::prepare_inference) change only the memory layout gemm
    // reads: same tokens, log-probabilities equal up to float rounding.
    let srcs = sources(&LENS, 11);
    for (name, m) in models() {
        let want = greedy_decode(&m, &srcs, &OPTIONS);
        let mut prepared = m.clone();
        prepared.prepare_inference();
        let got = greedy_decode(&prepared, &srcs, &OPTIONS);
        assert_same(name, &got, &want, 1e-5);
        let beam = transformer::decode::beam::BeamOptions::default();
        let want = transformer::decode::beam::beam_search(&m, &srcs, &beam);
        let got = transformer::decode::beam::beam_search(&prepared, &srcs, &beam);
        for (a, b) in got.iter().zip(&want) {
            assert_eq!(a[0].tokens, b[0].tokens, "{name}: beam");
            assert!((a[0].score - b[0].score).abs() < 1e-4, "{name}: beam score");
        }
    }
}

#[test]
fn changing_weights_drops_the_prepared_copies() {
    // Any mutable access through params_mut (what training and checkpoint loading use) must
    // drop the transposed copies, or decoding would run on stale weights.
    let srcs = sources(&LENS, 12);
    for (name, mut m) in models() {
        m.prepare_inference();
        for (_, p) in m.params_mut() {
            p.value.data.iter_mut().for_each(|x| *x *= -1.5);
        }
        let got = greedy_decode(&m, &srcs, &OPTIONS);
        // A model with the same (changed) weights that never had copies: identical results.
        let fresh = model_from_params(&mut m);
        let want = greedy_decode(&fresh, &srcs, &OPTIONS);
        assert_same(name, &got, &want, 0.0);
    }
}

/// A new model of `m`'s config holding a copy of `m`'s parameter values.
fn model_from_params(m: &mut Seq2Seq<f32>) -> Seq2Seq<f32> {
    let mut fresh = Seq2Seq::new(m.config.clone(), &mut Rng::new(99));
    for ((_, dst), (_, src)) in fresh.params_mut().into_iter().zip(m.params_mut()) {
        dst.value.data.copy_from_slice(&src.value.data);
    }
    fresh
}

/// `f` inside a rayon pool of `threads` threads.
fn in_pool<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

#[test]
fn chunks_decoded_side_by_side_give_the_one_thread_result_bit_for_bit() {
    // Three sentences per chunk: with two threads the chunks run in parallel, each with
    // single-threaded products; with one, in turn. Same batches, so the same bits, in input order.
    let srcs = sources(&LENS, 8);
    let opts = GreedyOptions {
        batch_size: 3,
        ..OPTIONS
    };
    for (name, m) in models() {
        let one = in_pool(1, || greedy_decode(&m, &srcs, &opts));
        let two = in_pool(2, || greedy_decode(&m, &srcs, &opts));
        assert_eq!(one, two, "{name}");
        assert_eq!(one.len(), srcs.len());
    }
}
