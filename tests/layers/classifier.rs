//! BERT fine-tuned for sentence classification, in f64: the classification head's forward
//! against a plain loop of its formula (pooling over the real tokens, dense, tanh, linear), and
//! the hand-written backward of the head alone and of the whole encoder + head (padded
//! sentences, dropout, both poolings) against central finite differences.

use crate::common::{jitter_params, naive_linear, randn, GradCheck};
use transformer::model::classifier_head::{ClassifierHead, Pooling};
use transformer::model::masked_lm::mlm_config;
use transformer::model::sentence_classifier::{ClassifierConfig, SentenceClassifier};
use transformer::model::Module;
use transformer::rng::Rng;

const D: usize = 6;
const LABELS: usize = 3;
const SEQ: usize = 5;
/// Real tokens of the three sentences of a batch padded to `SEQ`.
const LENS: [usize; 3] = [5, 2, 4];

fn head(pooling: Pooling, dropout: f64) -> ClassifierHead<f64> {
    let mut h = ClassifierHead::<f64>::new(D, LABELS, pooling, dropout, &mut Rng::new(4));
    jitter_params(&mut h, &mut Rng::new(5), 0.3);
    h
}

/// The head as the formula reads, in plain loops (no dropout).
fn naive_head(h: &ClassifierHead<f64>, hidden: &[f64]) -> Vec<f64> {
    let mut out = Vec::new();
    for (b, &n) in LENS.iter().enumerate() {
        let row = |i: usize| &hidden[(b * SEQ + i) * D..(b * SEQ + i + 1) * D];
        let u: Vec<f64> = match h.pooling {
            Pooling::Cls => row(0).to_vec(),
            Pooling::Mean => (0..D)
                .map(|j| (0..n).map(|i| row(i)[j]).sum::<f64>() / n as f64)
                .collect(),
        };
        let pooler_bias = &h.pooler.bias.as_ref().unwrap().value.data;
        let a = naive_linear(&u, &h.pooler.weight.value.data, pooler_bias, D, D);
        let p: Vec<f64> = a.iter().map(|v| v.tanh()).collect();
        let bias = &h.classifier.bias.as_ref().unwrap().value.data;
        out.extend(naive_linear(
            &p,
            &h.classifier.weight.value.data,
            bias,
            D,
            LABELS,
        ));
    }
    out
}

#[test]
fn classifier_head_forward_matches_the_formula() {
    for pooling in [Pooling::Cls, Pooling::Mean] {
        let h = head(pooling, 0.0);
        let hidden: Vec<f64> = randn(&mut Rng::new(6), LENS.len() * SEQ * D, 1.0);
        let (got, _) = h.forward(&hidden, SEQ, &LENS, None);
        let want = naive_head(&h, &hidden);
        assert_eq!(got.len(), LENS.len() * LABELS);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!((a - b).abs() < 1e-12, "{pooling:?} logit {i}: {a} vs {b}");
        }
        // the padding rows are not read: changing them changes nothing
        let mut padded = hidden.clone();
        for (b, &n) in LENS.iter().enumerate() {
            for v in &mut padded[(b * SEQ + n) * D..(b + 1) * SEQ * D] {
                *v += 7.0;
            }
        }
        assert_eq!(h.forward(&padded, SEQ, &LENS, None).0, got);
    }
}

#[test]
fn classifier_head_backward_matches_finite_differences() {
    for (pooling, dropout) in [
        (Pooling::Cls, 0.0),
        (Pooling::Mean, 0.0),
        (Pooling::Cls, 0.4),
    ] {
        let mut rng = Rng::new(7);
        let hidden: Vec<f64> = randn(&mut rng, LENS.len() * SEQ * D, 1.0);
        // L = Σ logits ⊙ R, R fixed; dropout draws the same mask at every evaluation
        let r: Vec<f64> = randn(&mut rng, LENS.len() * LABELS, 1.0);
        let masks = Rng::new(11);
        let loss = |h: &ClassifierHead<f64>, x: &[f64]| -> f64 {
            let (z, _) = h.forward(x, SEQ, &LENS, Some(&mut masks.clone()));
            z.iter().zip(&r).map(|(a, b)| a * b).sum()
        };
        let mut h = head(pooling, dropout);
        h.zero_grads();
        let (_, cache) = h.forward(&hidden, SEQ, &LENS, Some(&mut masks.clone()));
        let dx = h.backward(cache, &r);
        let mut check = GradCheck::new(format!("classifier head, {pooling:?}, dropout {dropout}"));
        check.wrt_params(&h, |m| loss(m, &hidden));
        check.wrt_input("hidden", &hidden, &dx, |x| loss(&h, x));
        check.report();
    }
}

fn classifier(pooling: Pooling, dropout: f64) -> SentenceClassifier<f64> {
    let config = ClassifierConfig {
        encoder: mlm_config(11, (D, 2, 10, 2), 8, dropout),
        n_labels: LABELS,
        pooling,
        classifier_dropout: dropout,
        max_tokens: 8,
    };
    config.check().unwrap();
    let mut model = SentenceClassifier::<f64>::new(config, &mut Rng::new(1));
    jitter_params(&mut model, &mut Rng::new(2), 0.2);
    model
}

/// Three sentences padded to 5 tokens: `[CLS] … [SEP]` then padding id 0.
const IDS: [u32; 15] = [1, 7, 4, 9, 2, 1, 2, 0, 0, 0, 1, 5, 10, 2, 0];
const TARGETS: [u32; 3] = [2, 0, 1];

/// Every parameter of a two-block encoder with its head, padded sentences, both poolings, with
/// and without dropout (the same masks at every evaluation), against central differences of
/// the summed cross-entropy.
#[test]
fn sentence_classifier_backward_matches_finite_differences() {
    for (pooling, dropout) in [
        (Pooling::Cls, 0.0),
        (Pooling::Mean, 0.0),
        (Pooling::Cls, 0.2),
    ] {
        let mut model = classifier(pooling, dropout);
        let rng = Rng::new(99);
        let loss = |m: &SentenceClassifier<f64>| {
            let mut m = m.clone();
            m.forward_backward(&IDS, &LENS, &TARGETS, 0.0, 1.0, Some(&mut rng.clone()))
                .loss_sum
        };
        model.zero_grads();
        let stats = model.forward_backward(&IDS, &LENS, &TARGETS, 0.0, 1.0, Some(&mut rng.clone()));
        assert_eq!(stats.n_tokens, 3);
        let mut check = GradCheck::new(format!(
            "sentence classifier, {pooling:?}, dropout {dropout}"
        ));
        check.wrt_params(&model, loss);
        check.report();
    }
}

/// Without dropout: the padding ids do not change any prediction, the probabilities are the
/// softmax of the logits, and evaluation counts the sentences whose most probable label is
/// theirs.
#[test]
fn sentence_classifier_ignores_padding_and_reports_probabilities() {
    for pooling in [Pooling::Cls, Pooling::Mean] {
        let model = classifier(pooling, 0.1);
        let (logits, _) = model.forward(&IDS, &LENS, None);
        let mut other = IDS;
        for i in [7, 8, 9, 14] {
            other[i] = 6;
        }
        let (again, _) = model.forward(&other, &LENS, None);
        for (a, b) in logits.iter().zip(&again) {
            assert!(
                (a - b).abs() < 1e-12,
                "{pooling:?}: padding changed a logit"
            );
        }
        // each sentence alone, unpadded, gives the same logits
        let mut start = 0;
        for (b, &n) in LENS.iter().enumerate() {
            let alone = &IDS[b * SEQ..b * SEQ + n];
            let (z, _) = model.forward(alone, &[n], None);
            for (k, v) in z.iter().enumerate() {
                assert!(
                    (v - logits[start + k]).abs() < 1e-10,
                    "{pooling:?} sentence {b}"
                );
            }
            start += LABELS;
        }
        let probs = model.probabilities(&IDS, &LENS);
        let mut right = 0;
        for (row, (z, &y)) in probs
            .chunks(LABELS)
            .zip(logits.chunks(LABELS).zip(&TARGETS))
        {
            let max = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = z.iter().map(|v| (v - max).exp()).sum();
            for (p, v) in row.iter().zip(z) {
                assert!((p - (v - max).exp() / sum).abs() < 1e-12);
            }
            let best = (0..LABELS).fold(0, |b, i| if row[i] > row[b] { i } else { b });
            right += usize::from(best == y as usize);
        }
        let (stats, correct) = model.evaluate(&IDS, &LENS, &TARGETS);
        assert_eq!((stats.n_tokens, correct), (3, right));
        let nll: f64 = probs
            .chunks(LABELS)
            .zip(&TARGETS)
            .map(|(row, &y)| -row[y as usize].ln())
            .sum();
        assert!(
            (stats.nll_sum - nll).abs() < 1e-10,
            "{} vs {nll}",
            stats.nll_sum
        );
    }
}
