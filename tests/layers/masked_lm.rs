//! BERT's masked-LM pre-training in f64: the MLM head's forward against a plain loop of its
//! formula (dense, GELU, layer norm, tied decoder, bias), and the hand-written backward of the
//! head alone and of the whole encoder + head (embeddings' sum and layer norm, dropout, post-LN
//! blocks, gathering of the chosen rows) against central finite differences.

use crate::common::{jitter_params, naive_layer_norm, naive_linear, randn, GradCheck};
use transformer::kernels::activations::gelu_erf;
use transformer::model::masked_lm::{mlm_config, MaskedLm};
use transformer::model::mlm_head::MlmHead;
use transformer::model::Module;
use transformer::rng::Rng;

const D: usize = 8;
const VOCAB: usize = 13;

fn head() -> MlmHead<f64> {
    let mut h = MlmHead::<f64>::new(D, VOCAB, 1e-12, &mut Rng::new(4));
    jitter_params(&mut h, &mut Rng::new(5), 0.3);
    h
}

/// The head as the formula reads, in plain loops.
fn naive_head(h: &MlmHead<f64>, embedding: &[f64], x: &[f64]) -> Vec<f64> {
    let bias = h.dense.bias.as_ref().unwrap();
    let u = naive_linear(x, &h.dense.weight.value.data, &bias.value.data, D, D);
    let g: Vec<f64> = u.iter().map(|&v| gelu_erf(v)).collect();
    let (t, _, _) = naive_layer_norm(&g, &h.norm.gamma.value.data, &h.norm.beta.value.data, 1e-12);
    naive_linear(&t, embedding, &h.bias.value.data, D, VOCAB)
}

#[test]
fn mlm_head_forward_matches_the_formula() {
    let h = head();
    let mut rng = Rng::new(6);
    let embedding: Vec<f64> = randn(&mut rng, VOCAB * D, 0.5);
    let x: Vec<f64> = randn(&mut rng, 5 * D, 1.0);
    let (got, _) = h.forward(&embedding, x.clone());
    let want = naive_head(&h, &embedding, &x);
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!((a - b).abs() < 1e-12, "logit {i}: {a} vs {b}");
    }
}

#[test]
fn mlm_head_backward_matches_finite_differences() {
    let mut rng = Rng::new(7);
    let embedding: Vec<f64> = randn(&mut rng, VOCAB * D, 0.5);
    let x: Vec<f64> = randn(&mut rng, 3 * D, 1.0);
    // L = Σ logits ⊙ R, R fixed
    let r: Vec<f64> = randn(&mut rng, 3 * VOCAB, 1.0);
    let loss = |h: &MlmHead<f64>, e: &[f64], x: &[f64]| -> f64 {
        let (z, _) = h.forward(e, x.to_vec());
        z.iter().zip(&r).map(|(a, b)| a * b).sum()
    };
    let mut h = head();
    h.zero_grads();
    let (_, cache) = h.forward(&embedding, x.clone());
    let mut de = vec![0.0; embedding.len()];
    let dx = h.backward(&embedding, &mut de, cache, &r);
    let mut check = GradCheck::new("mlm head");
    check.wrt_params(&h, |m| loss(m, &embedding, &x));
    check.wrt_input("x", &x, &dx, |x| loss(&h, &embedding, x));
    check.wrt_input("E", &embedding, &de, |e| loss(&h, e, &x));
    check.report();
}

/// Every parameter of a two-block encoder with its head, with dropout (the same masks at every
/// evaluation), against central differences of the summed masked-token loss.
#[test]
fn masked_lm_backward_matches_finite_differences() {
    for dropout in [0.0, 0.2] {
        let config = mlm_config(VOCAB, (D, 2, 12, 2), 6, dropout);
        let mut model = MaskedLm::<f64>::new(config, &mut Rng::new(1));
        jitter_params(&mut model, &mut Rng::new(2), 0.2);
        // two sequences of 6 tokens; predictions at 4 of the 12 rows
        let ids = [1u32, 7, 3, 9, 12, 2, 1, 4, 5, 3, 6, 2];
        let positions = [2usize, 4, 9, 10];
        let labels = [8u32, 12, 11, 6];
        let rng = Rng::new(99);
        let loss = |m: &MaskedLm<f64>| {
            let mut m = m.clone();
            m.forward_backward(
                &ids,
                2,
                &positions,
                &labels,
                0.0,
                1.0,
                Some(&mut rng.clone()),
            )
            .loss_sum
        };
        model.zero_grads();
        model.forward_backward(
            &ids,
            2,
            &positions,
            &labels,
            0.0,
            1.0,
            Some(&mut rng.clone()),
        );
        let mut check = GradCheck::new(format!("masked LM, dropout {dropout}"));
        check.wrt_params(&model, loss);
        check.report();
        // evaluate: the loss of the same rows without dropout, and an accuracy in range
        let (stats, correct) = model.evaluate(&ids, 2, &positions, &labels);
        assert_eq!(stats.n_tokens, 4);
        assert!(correct <= 4 && stats.nll_sum.is_finite());
    }
}
