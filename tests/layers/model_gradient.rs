//! The whole model's hand-written gradient against central finite differences in f64.

use transformer::batch::Batch;
use transformer::model::Module;
use transformer::model::{ModelConfig, NormPlacement, Seq2Seq};
use transformer::rng::Rng;

fn tiny_config(norm: NormPlacement, tie: bool, dropout: f64) -> ModelConfig {
    ModelConfig {
        vocab_size: 11,
        d_model: 8,
        n_heads: 2,
        d_ff: 12,
        n_encoder_layers: 2,
        n_decoder_layers: 2,
        dropout,
        norm,
        layer_norm_eps: 1e-5,
        tie_embeddings: tie,
        max_len: 32,
        activation: Default::default(),
        positions: Default::default(),
        // The dropout cases also drop attention weights and FFN activations.
        attention_dropout: dropout,
        activation_dropout: dropout,
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

fn batch() -> Batch {
    Batch::from_pairs(&[
        (&[4, 5, 6, 7][..], &[8, 9][..]),
        (&[10][..], &[4, 5, 6, 9][..]),
        (&[6, 6][..], &[7][..]),
    ])
}

fn check(norm: NormPlacement, tie: bool, dropout: f64) {
    check_config(tiny_config(norm, tie, dropout));
}

fn check_config(config: ModelConfig) {
    let (norm, tie, dropout) = (config.norm, config.tie_embeddings, config.dropout);
    let mut model = Seq2Seq::<f64>::new(config, &mut Rng::new(1));
    let batch = batch();
    let rng = Rng::new(99); // the same dropout masks for every evaluation
    let loss_at = |m: &Seq2Seq<f64>| {
        let mut m = m.clone();
        m.forward_backward(&batch, 0.1, 1.0, Some(&mut rng.clone()))
            .loss_sum
    };
    model.zero_grads();
    model.forward_backward(&batch, 0.1, 1.0, Some(&mut rng.clone()));
    let names: Vec<(String, usize)> = model
        .params_mut()
        .iter()
        .map(|(n, p)| (n.clone(), p.value.len()))
        .collect();
    let mut worst = 0.0f64;
    let mut checked = 0;
    for (pi, (name, len)) in names.iter().enumerate() {
        // a few elements of every parameter tensor
        for e in [0, len / 3, len - 1] {
            let h = 1e-5;
            let analytic = model.params_mut()[pi].1.grad.data[e];
            let mut plus = model.clone();
            plus.params_mut()[pi].1.value.data[e] += h;
            let mut minus = model.clone();
            minus.params_mut()[pi].1.value.data[e] -= h;
            let numeric = (loss_at(&plus) - loss_at(&minus)) / (2.0 * h);
            let err = (analytic - numeric).abs() / (analytic.abs() + numeric.abs()).max(1e-3); // floor: gradients that are exactly 0 (key biases)
            assert!(
                err < 1e-6,
                "{name}[{e}]: analytic {analytic:e} numeric {numeric:e} (rel err {err:e})"
            );
            worst = worst.max(err);
            checked += 1;
        }
    }
    eprintln!("{norm:?} tie={tie} dropout={dropout}: {checked} checks, worst rel err {worst:e}");
}

#[test]
fn whole_model_gradient_post_ln_tied() {
    check(NormPlacement::PostLn, true, 0.0);
}

#[test]
fn whole_model_gradient_pre_ln_untied_with_dropout() {
    check(NormPlacement::PreLn, false, 0.2);
}

#[test]
fn whole_model_gradient_post_ln_with_dropout() {
    check(NormPlacement::PostLn, true, 0.3);
}

/// mBART's and BART's inputs: the decoder's own learned positions and a norm of each stack's
/// embedded input before the dropout (the gradient reaches both tables and both norms).
#[test]
fn whole_model_gradient_with_each_stacks_own_input() {
    for norm in [NormPlacement::PreLn, NormPlacement::PostLn] {
        let mut config = tiny_config(norm, true, 0.2);
        config.positions = transformer::model::config::Positions::Learned;
        config.target_positions = true;
        config.embedding_norm = true;
        let model = Seq2Seq::<f64>::new(config.clone(), &mut Rng::new(1));
        let names: Vec<String> = model
            .clone()
            .params_mut()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        for own in [
            "embedding.target_positions",
            "embedding.norm.weight",
            "embedding.target_norm.bias",
        ] {
            assert!(
                names.iter().any(|n| n == own),
                "{own} missing from {names:?}"
            );
        }
        check_config(config);
    }
}
