//! The decoder-only language model: whole-model gradients against central finite differences in
//! f64, KV-cached decoding against the full forward, seeded sampling, byte-level BPE round trips,
//! exact resume of training, and the train-lm / generate / perplexity commands end to end.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use transformer::decode::sample::SamplingOptions;
use transformer::decode::score::score_stream;
use transformer::model::checkpoint;
use transformer::model::config::{Activation, Positions};
use transformer::model::lm::lm_n_params;
use transformer::model::Module;
use transformer::model::{LanguageModel, ModelConfig, NormPlacement, StepLayout};
use transformer::pipeline::generate::generate_ids;
use transformer::rng::Rng;
use transformer::text::bpe::{chunk_bounds, Bpe};
use transformer::train::trainer::LmTrainer;
use transformer::train::windows::LmTrainConfig;

fn config(norm: NormPlacement, tie: bool, dropout: f64, d_model: usize) -> ModelConfig {
    ModelConfig {
        vocab_size: 11,
        d_model,
        n_heads: 2,
        d_ff: d_model + 4,
        n_encoder_layers: 0,
        n_decoder_layers: 2,
        dropout,
        norm,
        layer_norm_eps: 1e-5,
        tie_embeddings: tie,
        max_len: 16,
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

fn gradient_check(norm: NormPlacement, tie: bool, dropout: f64, smoothing: f64) {
    gradient_check_with(config(norm, tie, dropout, 8), smoothing);
}

fn gradient_check_with(c: ModelConfig, smoothing: f64) {
    let (norm, tie, dropout) = (c.norm, c.tie_embeddings, c.dropout);
    let mut model = LanguageModel::<f64>::new(c, &mut Rng::new(1));
    let tokens = [1u32, 4, 5, 6, 7, 10, 3, 2, 9, 9];
    let targets = [4u32, 5, 6, 7, 8, 3, 2, 9, 9, 0];
    let rng = Rng::new(99); // the same dropout masks in every evaluation
    let loss_at = |m: &LanguageModel<f64>| {
        m.clone()
            .forward_backward(&tokens, &targets, 2, smoothing, 1.0, Some(&mut rng.clone()))
            .loss_sum
    };
    model.zero_grads();
    model.forward_backward(&tokens, &targets, 2, smoothing, 1.0, Some(&mut rng.clone()));
    let names: Vec<(String, usize)> = model
        .params_mut()
        .iter()
        .map(|(n, p)| (n.clone(), p.value.len()))
        .collect();
    assert!(names
        .iter()
        .any(|(n, _)| n == "layers.1.self_attn.q_proj.weight"));
    assert_eq!(names[0].0, "embedding.weight");
    let (mut worst, mut checked) = (0.0f64, 0);
    for (pi, (name, len)) in names.iter().enumerate() {
        for e in [0, len / 3, len / 2, len - 1] {
            let h = 1e-5;
            let analytic = model.params_mut()[pi].1.grad.data[e];
            let mut plus = model.clone();
            plus.params_mut()[pi].1.value.data[e] += h;
            let mut minus = model.clone();
            minus.params_mut()[pi].1.value.data[e] -= h;
            let numeric = (loss_at(&plus) - loss_at(&minus)) / (2.0 * h);
            let err = (analytic - numeric).abs() / (analytic.abs() + numeric.abs()).max(1e-3);
            assert!(
                err < 1e-6,
                "{name}[{e}]: analytic {analytic:e} numeric {numeric:e} (rel err {err:e})"
            );
            worst = worst.max(err);
            checked += 1;
        }
    }
    eprintln!("{norm:?} tie={tie} dropout={dropout}: {checked} checks, worst {worst:e}");
}

#[test]
fn whole_lm_gradient_post_ln_tied() {
    gradient_check(NormPlacement::PostLn, true, 0.0, 0.0);
}

#[test]
fn whole_lm_gradient_pre_ln_untied_dropout_smoothing() {
    gradient_check(NormPlacement::PreLn, false, 0.2, 0.1);
}

#[test]
fn whole_lm_gradient_with_rotary_and_learned_positions() {
    for positions in [Positions::Rotary, Positions::Learned] {
        let mut c = config(NormPlacement::PreLn, true, 0.1, 8);
        c.positions = positions;
        c.activation = Activation::GeluErf;
        gradient_check_with(c, 0.0);
    }
}

#[test]
fn cached_incremental_logprobs_equal_the_full_forward() {
    let cases = [
        (NormPlacement::PostLn, Positions::Sinusoidal),
        (NormPlacement::PreLn, Positions::Sinusoidal),
        (NormPlacement::PreLn, Positions::Rotary),
        (NormPlacement::PostLn, Positions::Learned),
    ];
    for (norm, positions) in cases {
        let mut c = config(norm, true, 0.1, 32);
        c.vocab_size = 50;
        c.positions = positions;
        let model = LanguageModel::<f32>::new(c, &mut Rng::new(3));
        let (batch, seq) = (2, 12);
        let mut rng = Rng::new(5);
        let tokens: Vec<u32> = (0..batch * seq).map(|_| rng.below(50) as u32).collect();
        let (_, full) = model.evaluate_with_logprobs(&tokens, &tokens, batch);
        let mut state = model.start(batch, seq);
        // A 3-token prompt at once, then one token per step.
        let row = |b: usize, from: usize, to: usize| tokens[b * seq + from..b * seq + to].to_vec();
        let mut got = vec![Vec::new(); batch];
        let first = [row(0, 0, 3), row(1, 0, 3)].concat();
        let lp = model.step(&mut state, &first, &StepLayout::dense());
        for (b, g) in got.iter_mut().enumerate() {
            g.extend_from_slice(&lp[b * 3 * 50..(b + 1) * 3 * 50]);
        }
        for i in 3..seq {
            let next = [row(0, i, i + 1), row(1, i, i + 1)].concat();
            let lp = model.step(&mut state, &next, &StepLayout::dense());
            for (b, g) in got.iter_mut().enumerate() {
                g.extend_from_slice(&lp[b * 50..(b + 1) * 50]);
            }
        }
        let got = got.concat();
        let worst = got
            .iter()
            .zip(&full)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "{norm:?} {positions:?}: max diff {worst:e}");
    }
}

#[test]
fn sampling_is_seeded_and_top_k_one_is_greedy() {
    let mut c = config(NormPlacement::PreLn, true, 0.0, 16);
    c.vocab_size = 30;
    let model = LanguageModel::<f32>::new(c, &mut Rng::new(4));
    let run = |opts: SamplingOptions, seed: u64| {
        // 40 tokens from a 16-token context: the caches are rebuilt on the way.
        generate_ids(
            &model,
            &[1, 2, 3],
            40,
            opts,
            &mut Rng::new(seed),
            &[],
            |_| Ok::<(), ()>(()),
        )
        .unwrap()
    };
    let free = SamplingOptions::default();
    assert_eq!(run(free, 7), run(free, 7));
    assert_ne!(run(free, 7), run(free, 8));
    let greedy = SamplingOptions {
        temperature: 0.0,
        ..free
    };
    let top1 = SamplingOptions { top_k: 1, ..free };
    assert_eq!(run(top1, 1), run(greedy, 2));
    let nucleus = SamplingOptions {
        top_p: 0.5,
        top_k: 5,
        temperature: 0.7,
    };
    assert_eq!(run(nucleus, 3), run(nucleus, 3));
}

const TEXT: &str = "The quick brown fox jumps over the lazy dog.\nThe dog sleeps; the fox runs.\n\
Über naïve café — 日本語のテキスト, emoji 🦀🦀 and more text.\n  indented line\n\n\
numbers 12345 67890 and punctuation!?\n";

#[test]
fn bpe_round_trips_any_utf8_and_chunked_encoding_matches() {
    let corpus: String = TEXT.repeat(20);
    let bpe = Bpe::train(corpus.split_inclusive('\n'), 400).unwrap();
    assert!(bpe.vocab_size() > 257 && bpe.vocab_size() <= 400);
    for s in [
        "",
        "plain",
        " leading space and trailing  ",
        "\r\n\t\u{0}\u{7f}",
        "e\u{301} combining, 👩‍👩‍👧 zero-width joiner, \u{200b}, \u{feff}BOM",
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \u{10ffff} 😀 never seen: ꙮ",
        "<|endoftext|> as text",
    ] {
        let ids = bpe.encode(s).unwrap();
        assert_eq!(bpe.decode(&ids).unwrap(), s, "{ids:?}");
    }
    // Chunked encoding equals encoding the whole text at once.
    let long = corpus.repeat(20);
    assert!(chunk_bounds(&long, 1 << 10).len() > 3);
    let whole = bpe.tokenizer().encode(long.as_str(), false).unwrap();
    assert_eq!(bpe.encode(&long).unwrap(), whole.get_ids());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    bpe.save(&path).unwrap();
    let again = Bpe::load(&path).unwrap();
    assert_eq!(again.encode(TEXT).unwrap(), bpe.encode(TEXT).unwrap());
    assert!(Bpe::train(corpus.split_inclusive('\n'), 100).is_err());
}

fn tiny_lm_config(vocab: usize) -> ModelConfig {
    let mut c = config(NormPlacement::PreLn, true, 0.1, 16);
    c.vocab_size = vocab;
    c
}

#[test]
fn training_resumes_bit_for_bit_and_checkpoints_are_checked() {
    let corpus: String = TEXT.repeat(10);
    let bpe = Bpe::train(corpus.split_inclusive('\n'), 300).unwrap();
    let tokens = bpe.encode(&corpus).unwrap();
    let config = LmTrainConfig {
        context: 8,
        batch: 3,
        lr: 3e-3,
        warmup: 2,
        total_steps: 6,
        ..LmTrainConfig::default()
    };
    let mc = tiny_lm_config(bpe.vocab_size());
    let mut straight = LmTrainer::new(mc.clone(), config.clone(), tokens.clone()).unwrap();
    let losses: Vec<f64> = (0..6).map(|_| straight.step().unwrap().loss).collect();
    assert!(losses[5] < losses[0], "{losses:?}");

    let dir = tempfile::tempdir().unwrap();
    let mut first = LmTrainer::new(mc, config, tokens.clone()).unwrap();
    for _ in 0..3 {
        first.step().unwrap();
    }
    first.save(dir.path()).unwrap();
    let mut resumed = LmTrainer::resume(dir.path(), tokens.clone()).unwrap();
    let rest: Vec<f64> = (0..3).map(|_| resumed.step().unwrap().loss).collect();
    assert_eq!(rest, losses[3..]);
    for ((n, a), (_, b)) in straight
        .model
        .params_mut()
        .iter()
        .zip(resumed.model.params_mut().iter())
    {
        assert_eq!(a.value.data, b.value.data, "{n}");
    }
    // Another text refuses to resume; a config that does not match the weights is refused.
    assert!(LmTrainer::resume(dir.path(), tokens[1..].to_vec()).is_err());
    let model = checkpoint::load::<LanguageModel<f32>>(dir.path()).unwrap();
    assert_eq!(lm_n_params(&model.config), Some(model.clone().n_params()));
    let cfg_path = dir.path().join("config.json");
    let text = std::fs::read_to_string(&cfg_path).unwrap();
    let edited = text.replace("\"d_ff\": 20", "\"d_ff\": 24");
    assert_ne!(edited, text);
    std::fs::write(&cfg_path, edited).unwrap();
    let err = checkpoint::load::<LanguageModel<f32>>(dir.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("does not match"), "{err}");
    // Scoring: every target once, whatever the stride.
    let s1 = score_stream(&model, &tokens[..50], 8, 8, 4);
    let s2 = score_stream(&model, &tokens[..50], 8, 3, 4);
    assert_eq!((s1.n_tokens, s2.n_tokens), (49, 49));
    assert!(s1.nll() > 0.0 && s2.nll() > 0.0);
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn run(args: &[&str], stdin: &[u8]) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_transformer"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A command that fails before reading its input closes the pipe first.
    if let Err(e) = child.stdin.take().unwrap().write_all(stdin) {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    }
    let out = child.wait_with_output().unwrap();
    let r = Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    };
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    r
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn cli_train_lm_generate_perplexity_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, TEXT.repeat(15)).unwrap();
    let out = dir.path().join("lm");
    let train = |extra: &[&str]| {
        let mut args = vec![
            "train-lm",
            "--text",
            s(&text),
            "--out",
            s(&out),
            "--vocab-size",
            "300",
            "--context",
            "16",
            "--batch",
            "4",
            "--d-model",
            "16",
            "--n-heads",
            "2",
            "--d-ff",
            "32",
            "--layers",
            "2",
            "--threads",
            "2",
            "--eval-every",
            "2",
            "--pre-ln",
        ];
        args.extend_from_slice(extra);
        run(&args, b"")
    };
    let r = train(&[
        "--max-steps",
        "3",
        "--log-every",
        "1",
        "--save-every",
        "1",
        "--keep-last",
        "2",
    ]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stderr.contains("bits/char"), "{}", r.stderr);
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "trainer_state.json",
        "metrics.jsonl",
        "curves.png",
    ] {
        assert!(out.join(f).is_file(), "{f}");
    }
    // One metrics line per update; the evaluation at step 2 with bits per character.
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let steps: Vec<u64> = records
        .iter()
        .map(|r| r["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [1, 2, 3], "{metrics}");
    let bpc = records[1]["valid_bits_per_char"].as_f64().unwrap();
    assert!(bpc > 0.0 && bpc < 20.0, "{bpc}");
    assert!(records[0].get("valid_loss").is_none() && records[2].get("valid_loss").is_none());
    // Rotating step checkpoints: the last two, each a model directory with its tokenizer.
    let ckpts = out.join("checkpoints");
    let mut names: Vec<String> = std::fs::read_dir(&ckpts)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["step-00000002", "step-00000003"]);
    assert!(ckpts.join("step-00000002/tokenizer.json").is_file());
    // The step-3 checkpoint and the final save are the same model.
    assert_eq!(
        std::fs::read(ckpts.join("step-00000003/model.safetensors")).unwrap(),
        std::fs::read(out.join("model.safetensors")).unwrap()
    );
    let r = train(&["--max-steps", "5", "--resume", s(&out)]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stderr.contains("resumed"), "{}", r.stderr);

    let gen = |seed: &str| {
        run(
            &[
                "generate",
                "--model",
                s(&out),
                "--prompt",
                "The fox é",
                "--max-tokens",
                "20",
                "--seed",
                seed,
                "--top-k",
                "5",
                "--threads",
                "2",
            ],
            b"",
        )
    };
    let (a, b) = (gen("4"), gen("4"));
    assert_eq!(a.code, Some(0), "{}", a.stderr);
    assert!(a.stdout.starts_with("The fox é"), "{}", a.stdout);
    assert_eq!(a.stdout, b.stdout);

    let r = run(
        &["perplexity", "--model", s(&out), "--threads", "2"],
        TEXT.as_bytes(),
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.contains("perplexity") && r.stdout.contains("bits/char"),
        "{}",
        r.stdout
    );
    // --context: the model's own (16) is the default; a shorter window scores the same
    // tokens with less history, so the loss differs; outside 1..=16 is an error.
    let ppl = |extra: &[&str]| {
        let mut args = vec!["perplexity", "--model", s(&out), "--threads", "2"];
        args.extend_from_slice(extra);
        run(&args, TEXT.as_bytes())
    };
    assert_eq!(ppl(&["--context", "16"]).stdout, r.stdout);
    let short = ppl(&["--context", "4"]);
    assert_eq!(short.code, Some(0), "{}", short.stderr);
    let tokens = |out: &str| out.split_whitespace().nth(1).map(str::to_string);
    assert_eq!(tokens(&short.stdout), tokens(&r.stdout), "{}", short.stdout);
    assert_ne!(short.stdout, r.stdout);
    for bad in ["0", "17"] {
        let e = ppl(&["--context", bad]);
        assert!(
            e.code == Some(1) && e.stderr.contains("context is 1 to 16"),
            "--context {bad}: {}",
            e.stderr
        );
    }

    // Clear errors, no panics.
    let missing = dir.path().join("nope");
    let r = run(&["generate", "--model", s(&missing), "--prompt", "x"], b"");
    assert!(
        r.code == Some(1) && r.stderr.contains("does not exist"),
        "{}",
        r.stderr
    );
    let r = run(&["perplexity", "--model", s(&missing)], b"abc");
    assert!(
        r.code == Some(1) && r.stderr.contains("does not exist"),
        "{}",
        r.stderr
    );
    let r = run(&["perplexity", "--model", s(&out)], b"");
    assert!(
        r.code == Some(1) && r.stderr.contains("empty"),
        "{}",
        r.stderr
    );
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let r = run(
        &[
            "train-lm",
            "--text",
            s(&empty),
            "--out",
            s(&dir.path().join("x")),
        ],
        b"",
    );
    assert!(
        r.code == Some(1) && r.stderr.contains("empty"),
        "{}",
        r.stderr
    );
    let r = run(
        &[
            "train-lm",
            "--text",
            s(&missing),
            "--out",
            s(&dir.path().join("x")),
        ],
        b"",
    );
    assert!(
        r.code == Some(1) && r.stderr.contains("cannot read"),
        "{}",
        r.stderr
    );
}

/// The Llama-family parts trained end to end: RMSNorm, the gated SwiGLU FFN, grouped-query
/// attention (4 query heads on 2 and on 1 key/value heads), no biases, unscaled embeddings,
/// rotary positions in both pairings; every parameter checked by finite differences.
#[test]
fn whole_lm_gradient_with_llama_parts() {
    use transformer::model::config::{Normalization, RopeStyle};
    for (kv, style, tie) in [
        (2, RopeStyle::HalfSplit, false),
        (1, RopeStyle::Interleaved, true),
    ] {
        let mut c = config(NormPlacement::PreLn, tie, 0.1, 16);
        c.n_heads = 4;
        c.n_kv_heads = Some(kv);
        c.activation = Activation::SiluGated;
        c.normalization = Normalization::RmsNorm;
        c.positions = Positions::Rotary;
        c.rope_style = style;
        c.rope_base = 500.0;
        c.bias = false;
        c.scale_embeddings = false;
        c.validate().unwrap();
        let mut m = LanguageModel::<f64>::new(c.clone(), &mut Rng::new(2));
        let names: Vec<String> = m.params_mut().into_iter().map(|(n, _)| n).collect();
        assert!(names.contains(&"layers.0.ffn.gate.weight".to_string()));
        assert!(!names.iter().any(|n| n.ends_with(".bias")), "{names:?}");
        let k = m
            .params_mut()
            .into_iter()
            .find(|(n, _)| n == "layers.0.self_attn.k_proj.weight");
        assert_eq!(k.unwrap().1.value.shape, [kv * 4, 16]);
        assert_eq!(lm_n_params(&c), Some(m.n_params()));
        gradient_check_with(c, 0.0);
    }
}
