//! Tests of beam search (`beam.rs`).

use super::*;

#[test]
fn top_tokens_skip_pad_and_bos_and_break_ties_low() {
    let row = [0.0f32, 0.0, -3.0, -1.0, -1.0, -2.0, -0.5];
    let rules = TokenRules::TRANSLATION;
    assert_eq!(
        top_tokens(&row, 3, rules, 0),
        vec![(-0.5, 6), (-1.0, 3), (-1.0, 4)]
    );
    assert_eq!(top_tokens(&row, 10, rules, 0).len(), 5);
    let all = TokenRules::document(9);
    assert_eq!(top_tokens(&row, 2, all, 0), vec![(0.0, 0), (0.0, 1)]);
}

/// The blocked scan against the plain one it replaced (every allowed entry compared), on
/// rows of few distinct values (ties across blocks) and lengths around the block width.
#[test]
fn top_tokens_equal_the_entry_by_entry_scan() {
    fn scan(row: &[f32], n: usize, rules: TokenRules) -> Vec<(f64, u32)> {
        let mut all: Vec<(f64, u32)> = (row.iter().enumerate())
            .filter(|&(id, _)| rules.allows(id as u32))
            .map(|(id, &lp)| (lp as f64, id as u32))
            .collect();
        all.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        all.truncate(n);
        all
    }
    let mut rng = crate::rng::Rng::new(3);
    for len in [3, 15, 16, 17, 40, 500] {
        for n in [1, 2, 8] {
            let row: Vec<f32> = (0..len).map(|_| -(rng.below(5) as f32)).collect();
            for rules in [TokenRules::TRANSLATION, TokenRules::document(2)] {
                assert_eq!(top_tokens(&row, n, rules, 0), scan(&row, n, rules), "{len} {n}");
            }
        }
    }
}

#[test]
fn length_penalty_is_gnmt() {
    assert_eq!(length_penalty(1, 0.6), 1.0);
    assert_eq!(length_penalty(7, 0.0), 1.0);
    assert!((length_penalty(7, 0.6) - 2f64.powf(0.6)).abs() < 1e-12);
}

#[test]
fn stopping_early_does_not_change_the_result() {
    use crate::model::{ModelConfig, NormPlacement};
    let mut stopped_early = 0;
    // A likely EOS, so that k hypotheses finish well before the limit; with a likely token 6
    // too, long cheap continuations that α > 0 favours (the case an unsafe bound gets wrong).
    for (seed, norm, eos, six) in [
        (1, NormPlacement::PostLn, 2.5, 1.0),
        (2, NormPlacement::PreLn, 2.5, 1.0),
        (5, NormPlacement::PostLn, 2.5, 3.0),
        (7, NormPlacement::PreLn, 1.5, 3.0),
        (7, NormPlacement::PostLn, 2.0, 5.0),
    ] {
        let config = ModelConfig {
            vocab_size: 12,
            d_model: 16,
            n_heads: 2,
            d_ff: 32,
            n_encoder_layers: 1,
            n_decoder_layers: 2,
            dropout: 0.0,
            norm,
            layer_norm_eps: 1e-6,
            tie_embeddings: true,
            max_len: 32,
            ..ModelConfig::preset("tiny", 12).unwrap()
        };
        let mut model = Seq2Seq::<f64>::new(config, &mut crate::rng::Rng::new(seed));
        let w = &mut model.embedding.weight.value.data;
        for (token, factor) in [(crate::batch::EOS as usize, eos), (6, six)] {
            w[token * 16..(token + 1) * 16]
                .iter_mut()
                .for_each(|x| *x *= factor);
        }
        let sources: Vec<Vec<u32>> = (0..6u32)
            .map(|n| (0..n).map(|j| 4 + (j * 5 + n) % 8).collect())
            .collect();
        let srcs: Vec<&[u32]> = sources.iter().map(|s| &s[..]).collect();
        let limits: Vec<usize> = srcs.iter().map(|s| s.len() + 12).collect();
        for k in [1, 2, 4] {
            for alpha in [0.0, 0.6, 1.0, 2.0] {
                let exact = Some(BeamStop::Exact);
                let rules = TokenRules::TRANSLATION;
                let (early, n) = search_chunk(&model, &srcs, &limits, k, (alpha, exact, BeamRules::Ours), rules);
                let (full, _) = search_chunk(&model, &srcs, &limits, k, (alpha, None, BeamRules::Ours), rules);
                stopped_early += n;
                // Equal up to rounding: dropping stopped rows changes the batch shapes.
                let name = format!("seed {seed}, k {k}, alpha {alpha}");
                for (a, b) in early.iter().zip(&full) {
                    assert_eq!(a.len(), b.len(), "{name}");
                    for (x, y) in a.iter().zip(b) {
                        assert_eq!((&x.tokens, x.finished), (&y.tokens, y.finished), "{name}");
                        assert!((x.score - y.score).abs() < 1e-9, "{name}");
                    }
                }
            }
        }
    }
    assert!(stopped_early >= 20, "{stopped_early}");
}

#[test]
fn finished_list_keeps_the_k_best_in_order() {
    let h = |score: f64, tok: u32| BeamHypothesis {
        tokens: vec![tok],
        logprob: score,
        score,
        finished: true,
    };
    let mut list = Vec::new();
    for (s, t) in [(-3.0, 3), (-1.0, 4), (-2.0, 5), (-1.0, 6), (-5.0, 7)] {
        keep_finished(&mut list, h(s, t), 3);
    }
    let toks: Vec<u32> = list.iter().map(|h| h.tokens[0]).collect();
    assert_eq!(toks, vec![4, 6, 5]);
}

#[test]
fn cross_rows_follow_sentences_or_beams() {
    let config = crate::model::ModelConfig::preset("tiny", 12).unwrap();
    let model = Seq2Seq::<f64>::new(config, &mut crate::rng::Rng::new(3));
    let sources: [&[u32]; 3] = [&[4, 5], &[6, 7, 8], &[9]];
    let pairs: Vec<(&[u32], &[u32])> = sources.iter().map(|&s| (s, &[][..])).collect();
    let batch = Batch::from_pairs(&pairs);
    let mut state = model.start_decoding(&batch.src, batch.src_len, &batch.src_lens, 8);
    let original = state.cross_caches.clone();
    let src_len = batch.src_len;
    let beams = |sentences: &[usize]| -> Vec<Live> {
        sentences
            .iter()
            .map(|&sentence| Live {
                sentence,
                tokens: Vec::new(),
                raw: 0.0,
            })
            .collect()
    };
    let mut cross_of = vec![0, 1, 2];
    // Uneven beams per sentence: one cross row per beam, copies of its sentence's row.
    for (live, want) in [
        (vec![0, 0, 1, 2, 2], vec![0, 0, 1, 2, 2]),
        (vec![0, 0, 2, 2], vec![0, 2]), // even again: one row per sentence
        (vec![2, 2, 2], vec![2]),
    ] {
        gather_cross(&mut state, &mut cross_of, &beams(&live));
        assert_eq!(cross_of, want);
        let lens: Vec<usize> = want.iter().map(|&s| batch.src_lens[s]).collect();
        assert_eq!(state.src_lens, lens);
        for (cache, orig) in state.cross_caches.iter().zip(&original) {
            assert_eq!(cache.batch, want.len());
            for (row, &s) in want.iter().enumerate() {
                for t in 0..src_len {
                    assert_eq!(cache.row(row, t, false), orig.row(s, t, false));
                    assert_eq!(cache.row(row, t, true), orig.row(s, t, true));
                }
            }
        }
    }
}

/// A bigram model: the next token's log-probabilities given the last one (rows of `table`).
struct Bigram {
    table: Vec<Vec<f32>>,
}

/// The rows of a [`Bigram`] search (they hold nothing but their number).
struct Rows(usize);

impl DecodingState for Rows {
    fn len(&self) -> usize {
        self.0
    }
    fn gather_rows(&mut self, rows: &[usize]) {
        self.0 = rows.len();
    }
}

impl IncrementalDecoder<f32> for Bigram {
    type State = Rows;
    fn vocab_size(&self) -> usize {
        self.table.len()
    }
    fn step(&self, _: &mut Rows, tokens: &[u32], _: &StepLayout<'_>) -> Vec<f32> {
        tokens.iter().flat_map(|&t| self.table[t as usize].clone()).collect()
    }
}

/// After the forced token F, EOS ranks second: ours keeps the empty translation among the
/// finished hypotheses and a second live beam (`b`); CTranslate2's ends nothing there and goes
/// on with `a` alone. Where EOS ranks first, both end the empty translation.
#[test]
fn ctranslate2_rules_end_only_the_best_candidate_after_the_forced_token() {
    use crate::batch::EOS;
    const F: u32 = 3;
    let (a, b, c) = (4usize, 5usize, 6usize);
    let row = |entries: &[(usize, f32)]| {
        let mut r = vec![-30.0f32; 7];
        for &(t, lp) in entries {
            r[t] = lp;
        }
        r
    };
    let mut table = vec![row(&[(EOS as usize, -0.01)]); 7];
    table[F as usize] = row(&[(a, -0.5), (EOS as usize, -1.0), (b, -1.6), (c, -2.0)]);
    table[a] = row(&[(EOS as usize, -0.1), (c, -3.0)]);
    table[b] = row(&[(EOS as usize, -0.05), (c, -3.0)]);
    let model = Bigram { table };
    let rules = TokenRules::TRANSLATION.forcing(Some(F));
    let run = |beam_rules, model: &Bigram| -> Vec<(Vec<u32>, f64)> {
        let mut state = Rows(1);
        let (lists, _) = search_rows(model, &mut state, &[BOS], &[6], 2, (0.0, None, beam_rules), rules);
        lists[0].iter().map(|h| (h.tokens.clone(), h.logprob)).collect()
    };
    let close = |got: Vec<(Vec<u32>, f64)>, want: &[(Vec<u32>, f64)]| {
        assert_eq!(got.len(), want.len(), "{got:?}");
        for ((g, gs), (w, ws)) in got.iter().zip(want) {
            assert_eq!(g, w);
            assert!((gs - ws).abs() < 1e-6, "{got:?}");
        }
    };
    let (fa, fb) = (vec![F, a as u32], vec![F, b as u32]);
    close(run(BeamRules::Ours, &model), &[(fa.clone(), -0.6), (vec![F], -1.0)]);
    // CTranslate2: no empty translation; `b` never live, its cheap EOS never reached.
    let ct2 = run(BeamRules::CTranslate2, &model);
    assert_eq!(ct2[0].0, fa);
    assert!(ct2.iter().all(|(t, _)| *t != vec![F] && *t != fb), "{ct2:?}");
    // EOS first after F: the empty translation, under both rules.
    let mut table = model.table.clone();
    table[F as usize] = row(&[(EOS as usize, -0.2), (a, -0.5)]);
    let model = Bigram { table };
    for beam_rules in [BeamRules::Ours, BeamRules::CTranslate2] {
        assert_eq!(run(beam_rules, &model)[0].0, vec![F], "{beam_rules:?}");
    }
}

/// CTranslate2's rules round a beam's score to f32 at every step; ours sum exactly.
#[test]
fn ctranslate2_rules_sum_scores_in_f32() {
    let (raw, lp) = (-282.082_057_f64, -0.000_123_4_f64);
    assert_eq!(BeamRules::Ours.add(raw, lp), raw + lp);
    let f32_sum = BeamRules::CTranslate2.add(raw, lp);
    assert_eq!(f32_sum, f64::from(raw as f32 + lp as f32));
    assert_ne!(f32_sum, raw + lp);
}
