//! The one decoding interface ([`IncrementalDecoder`]) with the language model: greedy, beam and
//! sampling searches written for the translator run a language model too, and agree with plain
//! full recomputation in float64.

use transformer::decode::beam::{search_rows, BeamRules};
use transformer::decode::greedy::greedy_search;
use transformer::decode::sample::{sample_search, SamplingOptions};
use transformer::decode::{DecodingState, IncrementalDecoder, TokenRules};
use transformer::kernels::softmax::log_softmax_inplace;
use transformer::model::{LanguageModel, ModelConfig, NormPlacement, Positions, StepLayout};
use transformer::rng::Rng;

const VOCAB: usize = 23;
const END: u32 = 5;

fn lm(seed: u64, positions: Positions) -> LanguageModel<f64> {
    let c = ModelConfig {
        vocab_size: VOCAB,
        d_model: 16,
        n_heads: 2,
        d_ff: 32,
        n_encoder_layers: 0,
        n_decoder_layers: 2,
        dropout: 0.1, // inference never applies it
        norm: NormPlacement::PreLn,
        layer_norm_eps: 1e-5,
        tie_embeddings: false,
        max_len: 40,
        positions,
        ..ModelConfig::preset("tiny", VOCAB).unwrap()
    };
    let mut m = LanguageModel::new(c, &mut Rng::new(seed));
    // Make the end token likely enough that some searches end early.
    let d = m.config.d_model;
    let w = &mut m.head.output_proj.as_mut().unwrap().value.data;
    w[END as usize * d..(END as usize + 1) * d]
        .iter_mut()
        .for_each(|x| *x *= 3.0);
    m
}

/// `log p(next | tokens)` over the vocabulary, by the full (uncached) forward.
fn full_logprobs(m: &LanguageModel<f64>, tokens: &[u32]) -> Vec<f64> {
    let (logits, _) = m.forward(tokens, 1, None);
    let mut last = logits[logits.len() - VOCAB..].to_vec();
    log_softmax_inplace(&mut last);
    last
}

/// Greedy continuation by full recomputation: argmax (ties to the lowest id), up to `limit`
/// tokens or the end token; the tokens, their summed log-probability, whether it ended.
fn greedy_reference(m: &LanguageModel<f64>, prompt: &[u32], limit: usize) -> (Vec<u32>, f64, bool) {
    let mut tokens = prompt.to_vec();
    let (mut out, mut score) = (Vec::new(), 0.0);
    for _ in 0..limit {
        let lp = full_logprobs(m, &tokens);
        let best = (0..VOCAB).fold(0, |b, i| if lp[i] > lp[b] { i } else { b });
        score += lp[best];
        if best as u32 == END {
            return (out, score, true);
        }
        out.push(best as u32);
        tokens.push(best as u32);
    }
    (out, score, false)
}

/// Starts one state for `prompts` (equal lengths): everything but each prompt's last token
/// prefilled; the last tokens are the searches' first inputs.
fn started(
    m: &LanguageModel<f64>,
    prompts: &[Vec<u32>],
) -> (
    <LanguageModel<f64> as IncrementalDecoder<f64>>::State,
    Vec<u32>,
) {
    let n = prompts[0].len();
    let mut state = m.start(prompts.len(), m.config.max_len);
    let head: Vec<u32> = prompts.iter().flat_map(|p| p[..n - 1].to_vec()).collect();
    if n > 1 {
        IncrementalDecoder::step(m, &mut state, &head, &StepLayout::dense());
    }
    let first = prompts.iter().map(|p| p[n - 1]).collect();
    (state, first)
}

#[test]
fn greedy_search_runs_the_language_model_like_full_recomputation() {
    let mut ended = 0;
    for (seed, positions) in [
        (1, Positions::Sinusoidal),
        (2, Positions::Rotary),
        (3, Positions::Learned),
    ] {
        let m = lm(seed, positions);
        let prompts: Vec<Vec<u32>> = vec![vec![1, 7, 9], vec![4, 4, 12], vec![20, 3, 8]];
        let limits = [12, 6, 0];
        let (mut state, first) = started(&m, &prompts);
        let hyps = greedy_search(&m, &mut state, &first, &limits, TokenRules::document(END));
        for ((p, &limit), h) in prompts.iter().zip(&limits).zip(&hyps) {
            let (want, score, finished) = greedy_reference(&m, p, limit);
            assert_eq!(h.tokens, want, "seed {seed} prompt {p:?}");
            assert!((h.score - score).abs() < 1e-9, "{} vs {score}", h.score);
            assert_eq!(h.finished, finished);
            ended += (finished && want.len() + 1 < limit) as usize;
        }
        // Every row finished and left the state, after at most 12 steps.
        assert!(DecodingState::len(&state) <= 2 + 12);
    }
    assert!(ended >= 1, "no hypothesis ended before its limit");
}

#[test]
fn beam_search_runs_the_language_model_and_scores_are_its_logprobs() {
    let m = lm(4, Positions::Rotary);
    let prompts: Vec<Vec<u32>> = vec![vec![2, 6], vec![11, 1]];
    let limits = [7, 5];
    // Beam 1 with alpha 0 is greedy search.
    let (mut state, first) = started(&m, &prompts);
    let rules = TokenRules::document(END);
    let (one, _) = search_rows(
        &m,
        &mut state,
        &first,
        &limits,
        1,
        (0.0, None, BeamRules::Ours),
        rules,
    );
    for ((p, &limit), list) in prompts.iter().zip(&limits).zip(&one) {
        assert_eq!(list[0].tokens, greedy_reference(&m, p, limit).0);
    }
    // Beam 3: three distinct hypotheses, best first, each scored with the model's own
    // log-probabilities of its tokens (and the end token when finished).
    let (mut state, first) = started(&m, &prompts);
    let (lists, _) = search_rows(
        &m,
        &mut state,
        &first,
        &limits,
        3,
        (0.6, None, BeamRules::Ours),
        rules,
    );
    for (p, list) in prompts.iter().zip(&lists) {
        assert_eq!(list.len(), 3);
        assert!(list.windows(2).all(|w| w[0].score >= w[1].score));
        assert!(list[0].tokens != list[1].tokens && list[1].tokens != list[2].tokens);
        for h in list {
            let mut tokens = p.clone();
            let mut logprob = 0.0;
            for &t in h.tokens.iter().chain(h.finished.then_some(&END)) {
                logprob += full_logprobs(&m, &tokens)[t as usize];
                tokens.push(t);
            }
            assert!(
                (h.logprob - logprob).abs() < 1e-9,
                "{} vs {logprob}",
                h.logprob
            );
        }
        // At least as likely (per the length-normalised score) as the greedy continuation.
        let greedy = &one[prompts.iter().position(|q| q == p).unwrap()][0];
        assert!(list[0].score >= greedy.score - 1e-12);
    }
}

#[test]
fn sampling_through_the_interface_draws_from_the_models_distributions() {
    let m = lm(5, Positions::Sinusoidal);
    let prompt = [3u32, 14, 2];
    let opts = SamplingOptions {
        temperature: 0.8,
        top_k: 6,
        top_p: 0.95,
    };
    let mut state = m.start(1, m.config.max_len);
    let mut emitted = Vec::new();
    let out = sample_search(
        &m,
        &mut state,
        &prompt,
        10,
        opts,
        &mut Rng::new(9),
        &[],
        |t| {
            emitted.push(t);
            Ok::<(), ()>(())
        },
    )
    .unwrap();
    assert_eq!((out.len(), &out), (10, &emitted));
    // Replayed by hand: the same draws from the full forward's distributions.
    let mut rng = Rng::new(9);
    let mut tokens = prompt.to_vec();
    for &t in &out {
        let lp = full_logprobs(&m, &tokens);
        assert_eq!(transformer::decode::sample::sample(&lp, opts, &mut rng), t);
        tokens.push(t);
    }
    // An error from `emit` stops the search.
    let mut state = m.start(1, m.config.max_len);
    let mut n = 0;
    let r = sample_search(
        &m,
        &mut state,
        &prompt,
        10,
        opts,
        &mut Rng::new(9),
        &[],
        |_| {
            n += 1;
            if n == 3 {
                Err("stop")
            } else {
                Ok(())
            }
        },
    );
    assert_eq!(r, Err("stop"));
    assert_eq!(n, 3);
}
