//! Speculative decoding on tiny random language models: greedy output identical to plain
//! greedy decoding (through context-window rebuilds and sliding windows), and sampled tokens
//! distributed as plain sampling's (a chi-square test against the exact joint distribution of
//! the first three tokens, computed by enumeration).

use super::*;
use crate::decode::drafters::{DraftModel, Drafted, Drafter, PromptLookup};
use crate::decode::sample::sample_search;
use crate::model::{NormPlacement, Positions};
use crate::model::{LanguageModel, ModelConfig};
use crate::pipeline::generate::ContextWindow;

/// A pre-LN rotary model of `vocab` tokens, two layers (the first with a sliding window of 5),
/// a context of `max_len`, random weights from `seed`.
fn tiny_lm(vocab: usize, max_len: usize, seed: u64) -> LanguageModel<f32> {
    let mut c = ModelConfig::preset("tiny", vocab).unwrap();
    c.n_encoder_layers = 0;
    c.n_decoder_layers = 2;
    c.d_model = 32;
    c.n_heads = 2;
    c.d_ff = 64;
    c.norm = NormPlacement::PreLn;
    c.positions = Positions::Rotary;
    c.max_len = max_len;
    c.dropout = 0.0;
    c.layer_windows = vec![Some(5), None];
    let mut model = LanguageModel::new(c, &mut Rng::new(seed));
    model.prepare_inference();
    model
}

fn window(model: &LanguageModel<f32>) -> ContextWindow<'_, f32> {
    ContextWindow {
        model,
        capacity: model.max_len(),
    }
}

/// Always proposes `token`, `n` times: a deliberately bad drafter.
struct Stubborn {
    token: u32,
}

impl Drafter for Stubborn {
    fn draft(&mut self, _: &[u32], max: usize, _: SamplingOptions, _: &mut Rng) -> Vec<Drafted> {
        vec![Drafted::certain(self.token); max]
    }
}

fn plain(
    model: &LanguageModel<f32>,
    prompt: &[u32],
    n: usize,
    opts: SamplingOptions,
    rng: &mut Rng,
) -> Vec<u32> {
    let w = window(model);
    let mut state = w.start();
    sample_search(&w, &mut state, prompt, n, opts, rng, &[], |_| {
        Ok::<(), ()>(())
    })
    .unwrap()
}

#[allow(clippy::too_many_arguments)]
fn speculative(
    model: &LanguageModel<f32>,
    prompt: &[u32],
    n: usize,
    opts: SamplingOptions,
    rng: &mut Rng,
    drafter: &mut dyn Drafter,
    spec: SpeculativeOptions,
    stats: &mut SpeculativeStats,
) -> Vec<u32> {
    let w = window(model);
    let mut state = w.start();
    speculative_search(
        &w,
        &mut state,
        prompt,
        n,
        opts,
        rng,
        &[],
        drafter,
        spec,
        stats,
        |_| Ok::<(), ()>(()),
    )
    .unwrap()
}

/// Greedy with prompt lookup, a draft model (another random model, and the model itself) and
/// the stubborn drafter gives plain greedy's tokens, on a context of 24 positions (so the
/// window is rebuilt several times in 60 tokens) and with a sliding window; drafts are
/// accepted (and, from the poor drafters, rejected).
#[test]
fn greedy_output_is_plain_greedy_output() {
    let vocab = 12;
    let model = tiny_lm(vocab, 24, 3);
    let other = tiny_lm(vocab, 24, 4);
    let greedy = SamplingOptions {
        temperature: 0.0,
        ..Default::default()
    };
    let prompts: [&[u32]; 3] = [&[1, 2, 3, 1, 2, 3, 1, 2], &[5], &[7, 7, 7, 7, 0, 11, 4]];
    let (w_self, w_other) = (window(&model), window(&other));
    for prompt in prompts {
        let want = plain(&model, prompt, 60, greedy, &mut Rng::new(1));
        for spec in [
            SpeculativeOptions::default(),
            SpeculativeOptions {
                draft_max: 3,
                draft_min: 2,
                adaptive: false,
            },
        ] {
            let mut drafters: Vec<(&str, Box<dyn Drafter>)> = vec![
                ("lookup", Box::new(PromptLookup { ngram_max: 3 })),
                ("stubborn", Box::new(Stubborn { token: 0 })),
                ("other", Box::new(DraftModel::new(&w_other, w_other.start()))),
                ("self", Box::new(DraftModel::new(&w_self, w_self.start()))),
            ];
            for (name, drafter) in &mut drafters {
                let mut stats = SpeculativeStats::default();
                let got = speculative(
                    &model,
                    prompt,
                    60,
                    greedy,
                    &mut Rng::new(1),
                    drafter.as_mut(),
                    spec,
                    &mut stats,
                );
                assert_eq!(got, want, "{name} {spec:?} prompt {prompt:?}");
                assert_eq!(stats.emitted, 60);
                if *name == "self" {
                    // The model drafting for itself: most drafts accepted (not all: its own
                    // window is rebuilt at other times than the model's).
                    assert!(stats.drafted > 30, "{stats:?}");
                    assert!(2 * stats.accepted > stats.drafted, "{stats:?}");
                }
                if *name == "stubborn" {
                    assert!(stats.accepted < stats.drafted, "{stats:?}");
                }
            }
        }
    }
}

/// The exact joint distribution of the first three sampled tokens `[vocab³]` after `prompt`,
/// by enumeration through plain one-token steps.
fn exact_joint(model: &LanguageModel<f32>, prompt: &[u32], opts: SamplingOptions) -> Vec<f64> {
    let v = model.config.vocab_size;
    let w = window(model);
    let dist = |context: &[u32]| {
        let mut state = w.start();
        let lp = IncrementalDecoder::step(&w, &mut state, context, &StepLayout::last());
        Candidates::new(&lp[lp.len() - v..], opts).dense(v)
    };
    let mut joint = vec![0.0; v * v * v];
    let p1 = dist(prompt);
    for a in 0..v {
        let ctx_a: Vec<u32> = prompt.iter().copied().chain([a as u32]).collect();
        let p2 = dist(&ctx_a);
        for b in 0..v {
            if p1[a] * p2[b] == 0.0 {
                continue;
            }
            let ctx_ab: Vec<u32> = ctx_a.iter().copied().chain([b as u32]).collect();
            let p3 = dist(&ctx_ab);
            for c in 0..v {
                joint[(a * v + b) * v + c] = p1[a] * p2[b] * p3[c];
            }
        }
    }
    joint
}

/// Pearson's chi-square of `counts` against `probs` (cells of expected count below 5 pooled
/// into one), and its degrees of freedom.
fn chi_square(counts: &[usize], probs: &[f64]) -> (f64, usize) {
    let n: usize = counts.iter().sum();
    let (mut stat, mut cells) = (0.0, 0);
    let (mut pooled_obs, mut pooled_exp) = (0.0, 0.0);
    for (&c, &p) in counts.iter().zip(probs) {
        let e = p * n as f64;
        if e < 5.0 {
            pooled_obs += c as f64;
            pooled_exp += e;
            continue;
        }
        stat += (c as f64 - e).powi(2) / e;
        cells += 1;
    }
    if pooled_exp > 0.0 {
        stat += (pooled_obs - pooled_exp).powi(2) / pooled_exp.max(1e-9);
        cells += 1;
    }
    (stat, cells - 1)
}

/// The chi-square quantile of `df` degrees of freedom exceeded with probability 1e-6
/// (Wilson–Hilferty: `df (1 − 2/(9 df) + z √(2/(9 df)))³`, z = 4.7534 the standard normal's
/// 1 − 1e-6 quantile; within ~1% of the exact quantile for df ≥ 10).
fn chi_square_bound(df: usize) -> f64 {
    let (df, z) = (df as f64, 4.7534);
    let a = 2.0 / (9.0 * df);
    df * (1.0 - a + z * a.sqrt()).powi(3)
}

/// Sampled speculative decoding draws the first three tokens from the exact joint distribution
/// of plain sampling (temperature, top-k and top-p applied), for prompt lookup, a draft model of
/// other weights, and a stubborn drafter proposing one token always; 12,000 runs each, four
/// tokens a run (two drafted positions verified), a chi-square test whose false-failure
/// probability is 1e-6 per case (the seeds are fixed, so the test is deterministic). The
/// drafts are both accepted and rejected, so both branches of the rule are exercised.
#[test]
fn sampled_tokens_follow_the_exact_distribution() {
    let vocab = 6;
    let model = tiny_lm(vocab, 64, 11);
    let other = tiny_lm(vocab, 64, 12);
    let w_other = window(&other);
    let prompt = [1u32, 2, 3, 1, 2];
    let options = [
        SamplingOptions {
            temperature: 0.6,
            ..Default::default()
        },
        SamplingOptions {
            temperature: 1.3,
            top_k: 4,
            top_p: 0.9,
        },
    ];
    let runs = 12_000;
    for opts in options {
        let joint = exact_joint(&model, &prompt, opts);
        assert!((joint.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        // The stubborn drafter proposes the most likely first token (never cut by top-k).
        let marginal: Vec<f64> = joint.chunks(vocab * vocab).map(|c| c.iter().sum()).collect();
        let stubborn = argmax(&marginal);
        for name in ["lookup", "other", "stubborn"] {
            let mut rng = Rng::new(2026);
            let mut counts = vec![0usize; joint.len()];
            let mut stats = SpeculativeStats::default();
            let spec = SpeculativeOptions {
                draft_max: 2,
                draft_min: 0,
                adaptive: false,
            };
            for _ in 0..runs {
                let mut drafter: Box<dyn Drafter> = match name {
                    "lookup" => Box::new(PromptLookup { ngram_max: 2 }),
                    "other" => Box::new(DraftModel::new(&w_other, w_other.start())),
                    _ => Box::new(Stubborn { token: stubborn }),
                };
                let ids = speculative(
                    &model,
                    &prompt,
                    4,
                    opts,
                    &mut rng,
                    drafter.as_mut(),
                    spec,
                    &mut stats,
                );
                let (a, b, c) = (ids[0] as usize, ids[1] as usize, ids[2] as usize);
                counts[(a * vocab + b) * vocab + c] += 1;
            }
            assert!(
                stats.accepted > runs / 10 && stats.accepted < stats.drafted,
                "{name} {opts:?}: {stats:?}"
            );
            let (stat, df) = chi_square(&counts, &joint);
            let bound = chi_square_bound(df);
            assert!(
                stat < bound,
                "{name} {opts:?}: chi-square {stat:.1} over {df} degrees of freedom (bound {bound:.1})"
            );
            // And the same test can fail: the counts of plain sampling from another model.
            if name == "lookup" {
                let mut wrong = vec![0usize; joint.len()];
                let mut rng = Rng::new(7);
                for _ in 0..runs {
                    let ids = plain(&other, &prompt, 3, opts, &mut rng);
                    wrong[(ids[0] as usize * vocab + ids[1] as usize) * vocab + ids[2] as usize] +=
                        1;
                }
                let (stat, df) = chi_square(&wrong, &joint);
                assert!(stat > chi_square_bound(df), "{stat} {df}");
            }
        }
    }
}

/// The rule on one hand-made distribution: with `p = (0.5, 0.3, 0.2)` and a draft `q = (0.2,
/// 0.2, 0.6)` always drafting from q, the emitted token is distributed as `p` (the residual is
/// `(0.3, 0.1, 0) / 0.4`), and a point-mass draft of token 2 is accepted 20% of the time.
#[test]
fn one_verdict_has_the_target_distribution() {
    let p_row: Vec<f64> = [0.5f64, 0.3, 0.2].iter().map(|p| p.ln()).collect();
    let q_row: Vec<f64> = [0.2f64, 0.2, 0.6].iter().map(|p| p.ln()).collect();
    let opts = SamplingOptions::default();
    let q = Candidates::new(&q_row, opts);
    let mut rng = Rng::new(5);
    let n = 200_000;
    let mut counts = [0usize; 3];
    let mut accepted_point = 0;
    for _ in 0..n {
        let token = q.draw(&mut rng);
        let drafted = Drafted {
            token,
            q: DraftProb::Sampled(q.clone()),
        };
        let emitted = match verify_token(&p_row, &drafted, opts, &mut rng) {
            Verdict::Accept => token,
            Verdict::Reject(y) => y,
        };
        counts[emitted as usize] += 1;
        if verify_token(&p_row, &Drafted::certain(2), opts, &mut rng) == Verdict::Accept {
            accepted_point += 1;
        }
    }
    // Binomial standard deviations at n = 200,000 are ≤ 0.0012: 6 of them is 0.007.
    for (c, p) in counts.iter().zip([0.5, 0.3, 0.2]) {
        assert!((*c as f64 / n as f64 - p).abs() < 0.007, "{counts:?}");
    }
    assert!((accepted_point as f64 / n as f64 - 0.2).abs() < 0.007);
}
