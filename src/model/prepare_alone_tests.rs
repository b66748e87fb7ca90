//! `Seq2Seq::prepare_alone`: every weight held in one form, its float32 values released,
//! against the model prepared with them kept (`prepare_precision`).

use super::linear::Linear;
use super::param::Module;
use super::{ModelConfig, Positions, Seq2Seq};
use crate::backend::Precision;
use crate::decode::greedy::{greedy_decode, GreedyOptions, Hypothesis};
use crate::rng::Rng;

/// A tied pre-LN model whose vocabulary is wide enough for the projection's panels, and an
/// untied post-LN one with sinusoids; random weights made sharp enough that greedy choices
/// have margins.
fn models() -> Vec<(&'static str, Seq2Seq<f32>)> {
    let cases = [
        ("tied, panelled vocabulary", 16_411, super::NormPlacement::PreLn, true),
        ("untied", 29, super::NormPlacement::PostLn, false),
    ];
    cases
        .into_iter()
        .enumerate()
        .map(|(i, (name, vocab, norm, tied))| {
            let mut c = ModelConfig::preset("tiny", vocab).unwrap();
            (c.d_model, c.n_heads, c.d_ff, c.max_len, c.dropout) = (24, 4, 40, 40, 0.0);
            (c.norm, c.tie_embeddings) = (norm, tied);
            c.positions = if tied { Positions::Learned } else { Positions::Sinusoidal };
            c.validate().unwrap();
            let mut m = Seq2Seq::<f32>::new(c, &mut Rng::new(3 + i as u64));
            for (n, p) in m.params_mut() {
                let f = if n.contains("embedding") || n.contains("output_proj") { 3.0 } else { 1.0 };
                p.value.data.iter_mut().for_each(|v| *v *= f);
            }
            (name, m)
        })
        .collect()
}

const SOURCES: [&[u32]; 5] = [
    &[5, 9, 14, 3, 7],
    &[4],
    &[10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 8],
    &[6, 6, 6],
    &[27, 4, 19, 8, 8, 12],
];

/// Greedy outputs one sentence at a time (a row per step: the products of a few rows) and
/// eight at a time (many rows: gemm and the panels).
fn greedy(m: &Seq2Seq<f32>) -> Vec<Hypothesis> {
    let sources: Vec<Vec<u32>> = SOURCES.iter().map(|s| s.to_vec()).collect();
    [1, 8]
        .into_iter()
        .flat_map(|batch_size| {
            let options = GreedyOptions {
                max_len_extra: 8,
                batch_size,
                forced_first: None,
                min_len: 0,
                forced_end: false,
            };
            greedy_decode(m, &sources, &options)
        })
        .collect()
}

fn same(got: &[Hypothesis], want: &[Hypothesis], tol: f64, what: &str) {
    let emitted: usize = want.iter().map(|h| h.token_logprobs.len()).sum();
    assert!(emitted >= 40, "{what}: {emitted} tokens emitted: a search worth comparing");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!((&g.tokens, g.finished), (&w.tokens, w.finished), "{what}: sentence {i}");
        for (a, b) in g.token_logprobs.iter().zip(&w.token_logprobs) {
            assert!((a - b).abs() <= tol, "{what}: sentence {i}: {a} vs {b}");
        }
    }
}

/// Every linear layer of `m` holds no float32 values.
fn linears_released(m: &mut Seq2Seq<f32>) -> bool {
    let mut all = true;
    super::linear::for_each_linear(m, |_, l: &mut Linear<f32>| all &= l.is_released());
    all
}

#[test]
fn f32_in_one_form_translates_as_with_the_weights_kept() {
    for (name, m) in models() {
        let mut kept = m.clone();
        kept.prepare_precision(Precision::F32).unwrap();
        let mut alone = m.clone();
        alone.prepare_alone(Precision::F32).unwrap();
        assert!(linears_released(&mut alone), "{name}");
        let tied = m.config.tie_embeddings;
        // Tied: the table is held once, as the projection's panels; untied: as its rows.
        assert_eq!(alone.embedding.weight.value.data.is_empty(), tied, "{name}");
        assert!(alone.head.output_proj.as_ref().is_none_or(|p| p.value.data.is_empty()));
        let want = greedy(&kept);
        same(&greedy(&alone), &want, 1e-4, name);
        // A mutable visit keeps the only forms: the model still translates the same.
        let _ = alone.params_mut();
        same(&greedy(&alone), &want, 1e-4, name);
        // Preparing again changes nothing.
        alone.prepare_alone(Precision::F32).unwrap();
        alone.prepare_precision(Precision::F32).unwrap();
        same(&greedy(&alone), &want, 1e-4, name);
    }
}

#[test]
fn int8_in_one_form_looks_the_table_up_in_its_int8_rows() {
    for (name, m) in models() {
        let mut alone = m.clone();
        alone.prepare_alone(Precision::Int8).unwrap();
        assert!(linears_released(&mut alone), "{name}");
        assert!(alone.embedding.weight.value.data.is_empty(), "{name}: the f32 table");
        // The reference: the f32 table replaced by its int8 rows dequantised (s_o · q_ok,
        // s_o = max_k |E_ok| / 127), then prepared with the weights kept.
        let mut dequantised = m.clone();
        let d = m.config.d_model;
        for row in dequantised.embedding.weight.value.data.chunks_exact_mut(d) {
            let s = row.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
            let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
            row.iter_mut().for_each(|v| *v = s * (*v * inv).clamp(-127.0, 127.0).round_ties_even());
        }
        // Each entry moved by at most half a step of its row.
        let (e, q) = (&m.embedding.weight.value.data, &dequantised.embedding.weight.value.data);
        for (row, qrow) in e.chunks_exact(d).zip(q.chunks_exact(d)) {
            let s = row.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
            assert!(row.iter().zip(qrow).all(|(a, b)| (a - b).abs() <= 0.5 * s + 1e-6));
        }
        let mut kept = dequantised;
        kept.prepare_precision(Precision::Int8).unwrap();
        same(&greedy(&alone), &greedy(&kept), 1e-4, name);
    }
}

#[test]
fn a_released_model_is_not_saved_and_does_not_train() {
    let (_, mut m) = models().remove(1);
    m.prepare_alone(Precision::F32).unwrap();
    let dir = std::env::temp_dir().join(format!("released-{}", std::process::id()));
    let e = super::checkpoint::save(&dir, &mut m).unwrap_err().to_string();
    assert!(
        e.contains("parameter encoder.layers.0.") && e.contains("holds no float32 values"),
        "{e}"
    );
    assert!(!dir.join("model.safetensors").exists());
    let _ = std::fs::remove_dir_all(&dir);
    let mut layer = Linear::<f32>::new(3, 2, &mut Rng::new(1));
    layer.prepare_alone(Precision::F32).unwrap();
    let x = [1.0f32, 2.0, 3.0];
    assert_eq!(layer.forward(&x).len(), 2);
    let backward = std::panic::AssertUnwindSafe(move || layer.backward(&x, &[1.0, 1.0]));
    let refused = std::panic::catch_unwind(backward);
    let message = refused.unwrap_err();
    let message = message.downcast_ref::<String>().unwrap();
    assert!(message.contains("released for inference"), "{message}");
}
