//! Pictures: training curves from a metrics log, attention heat maps, and the `attention`
//! command on a freshly trained tiny model.
//!
//! Set `VIZ_TEST_OUT=DIR` to keep a copy of every picture written (to look at them).

use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use transformer::model::{ModelConfig, Seq2Seq};
use transformer::rng::Rng;
use transformer::text::vocab::{Vocab, VocabLevel};
use transformer::viz::{
    attention_maps, draw_attention_grid, plot_metrics, AttentionPanel, VizError,
};

const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];

/// Copies `path` into `$VIZ_TEST_OUT` when set.
fn keep(path: &Path) {
    if let Some(dir) = std::env::var_os("VIZ_TEST_OUT") {
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(path, dir.join(path.file_name().unwrap())).unwrap();
    }
}

/// Checks a PNG's signature and that it holds more than a blank white picture of its size;
/// returns (width, height).
fn assert_drawn_png(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap();
    assert!(bytes.len() > 33, "{} is too short", path.display());
    assert_eq!(bytes[..8], PNG_SIGNATURE, "{} is not a PNG", path.display());
    assert_eq!(&bytes[12..16], b"IHDR");
    let width = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    assert!(width > 100 && height > 100, "{width} x {height}");
    let blank = path.with_file_name("blank.png");
    {
        let root = BitMapBackend::new(&blank, (width, height)).into_drawing_area();
        root.fill(&WHITE).unwrap();
        root.present().unwrap();
    }
    let blank_len = std::fs::metadata(&blank).unwrap().len() as usize;
    assert!(
        bytes.len() > 2 * blank_len,
        "{}: {} bytes, barely more than a blank picture ({blank_len} bytes)",
        path.display(),
        bytes.len()
    );
    keep(path);
    (width, height)
}

fn assert_svg(path: &Path, needles: &[&str]) {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.starts_with("<svg"), "{} is not an SVG", path.display());
    assert!(text.trim_end().ends_with("</svg>"));
    for needle in needles {
        assert!(text.contains(needle), "{} lacks {needle:?}", path.display());
    }
    keep(path);
}

/// A synthetic log: 40 training records, validation every 10 steps (with BLEU when `bleu`).
fn metrics_log(path: &Path, bleu: bool) {
    let mut lines = Vec::new();
    for i in 1..=40u32 {
        let step = i * 25;
        let loss = 6.0 * (-(step as f64) / 400.0).exp() + 1.5;
        let lr = 0.07
            * (step as f64)
                .powf(-0.5)
                .min(step as f64 * 400f64.powf(-1.5));
        let mut line = format!(
            r#"{{"step":{step},"epoch":1,"loss":{loss},"nll":{},"lr":{lr},"tokens_per_s":1234.5,"elapsed_s":{i}"#,
            loss - 0.4
        );
        if i % 10 == 0 {
            line += &format!(r#","valid_loss":{},"valid_nll":{}"#, loss + 0.2, loss - 0.2);
            if bleu {
                line += &format!(r#","valid_bleu":{}"#, 4.0 * i as f64 / 10.0 + 3.0);
            }
        }
        line += "}";
        lines.push(line);
    }
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

#[test]
fn metrics_curves_as_png_and_svg() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("metrics.jsonl");
    metrics_log(&log, true);
    let png = tmp.path().join("curves.png");
    plot_metrics(&log, &png).unwrap();
    let (_, height) = assert_drawn_png(&png);
    let svg = tmp.path().join("curves.svg");
    plot_metrics(&log, &svg).unwrap();
    assert_svg(
        &svg,
        &[
            "Loss per token",
            "Learning rate",
            "Validation BLEU",
            "valid loss",
        ],
    );

    // Without BLEU the picture has one panel less; a single record still draws.
    metrics_log(&log, false);
    let png2 = tmp.path().join("curves-no-bleu.png");
    plot_metrics(&log, &png2).unwrap();
    let (_, height2) = assert_drawn_png(&png2);
    assert!(height2 < height);
    std::fs::write(&log, "{\"step\":1,\"loss\":9.5,\"nll\":9.0,\"lr\":1e-4}\n").unwrap();
    let one = tmp.path().join("one.svg");
    plot_metrics(&log, &one).unwrap();
    assert_svg(&one, &["Loss per token"]);
}

#[test]
fn bad_metrics_logs_are_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("metrics.jsonl");
    let out = tmp.path().join("curves.png");
    let err = |text: Option<&str>| -> String {
        if let Some(text) = text {
            std::fs::write(&log, text).unwrap();
        }
        plot_metrics(&log, &out).unwrap_err().to_string()
    };
    let good = r#"{"step":1,"loss":2.0,"lr":0.001}"#;

    let e = err(None);
    assert!(
        e.contains("cannot read") && e.contains("metrics.jsonl"),
        "{e}"
    );
    let e = err(Some("\n  \n"));
    assert!(e.contains("no records"), "{e}");
    let e = err(Some(&format!("{good}\n{good}\n{{\"step\":3,\"loss\":")));
    assert!(e.contains("metrics.jsonl line 3: not valid JSON"), "{e}");
    let e = err(Some(&format!("{good}\n\n[1, 2]\n")));
    assert!(e.contains("line 3: not a JSON object"), "{e}");
    let e = err(Some(&format!("{good}\n{{\"step\":2,\"lr\":0.1}}\n")));
    assert!(e.contains("line 2: missing field `loss`"), "{e}");
    let e = err(Some(&format!(
        "{{\"step\":-1,\"loss\":1,\"lr\":1}}\n{good}"
    )));
    assert!(
        e.contains("line 1: `step` is not a non-negative integer"),
        "{e}"
    );
    let e = err(Some(&format!(
        "{good}\n{{\"step\":2,\"loss\":\"x\",\"lr\":1}}"
    )));
    assert!(e.contains("line 2: `loss` is not a number"), "{e}");

    std::fs::write(&log, good).unwrap();
    let e = plot_metrics(&log, &tmp.path().join("curves.jpg")).unwrap_err();
    assert!(matches!(e, VizError::Format { .. }), "{e}");
    assert!(e.to_string().contains("curves.jpg"), "{e}");
    let e = plot_metrics(&log, &tmp.path().join("no/such/dir/curves.png")).unwrap_err();
    assert!(e.to_string().contains("curves.png"), "{e}");
}

fn tiny_model_and_vocab() -> (Seq2Seq<f32>, Vocab) {
    let vocab = Vocab::build(["the cat sat on the mat", "die katze"], VocabLevel::Char, 1);
    let config = ModelConfig::preset("tiny", vocab.len()).unwrap();
    (Seq2Seq::new(config, &mut Rng::new(7)), vocab)
}

#[test]
fn extracted_attention_is_normalised_and_causal() {
    let (model, vocab) = tiny_model_and_vocab();
    let src = vocab.encode("the cat");
    let tgt = vocab.encode("die katze");
    let maps = attention_maps(&model, &src, &tgt, &vocab);
    let (layers, heads) = (model.config.n_encoder_layers, model.config.n_heads);
    assert_eq!(maps.heads, heads);
    assert_eq!(maps.encoder.len(), layers * heads);
    assert_eq!(maps.decoder.len(), model.config.n_decoder_layers * heads);
    assert_eq!(maps.cross.len(), maps.decoder.len());
    assert_eq!(maps.src_tokens.len(), src.len() + 1);
    assert_eq!(maps.src_tokens.last().unwrap(), "</s>");
    assert_eq!(maps.src_tokens[3], "␣");
    assert_eq!(maps.tgt_tokens.len(), tgt.len() + 1);
    assert_eq!(maps.tgt_tokens[0], "<s>");
    assert_eq!(maps.encoder[5].label, "encoder layer 2 head 2");
    assert_eq!(maps.cross[0].label, "cross layer 1 head 1");

    let all = maps.encoder.iter().chain(&maps.decoder).chain(&maps.cross);
    for panel in all {
        assert_eq!(panel.weights.len(), panel.rows.len());
        for (i, row) in panel.weights.iter().enumerate() {
            assert_eq!(row.len(), panel.cols.len());
            let sum: f64 = row.iter().map(|&w| w as f64).sum();
            assert!(
                (sum - 1.0).abs() < 1e-5,
                "{} row {i} sums to {sum}",
                panel.label
            );
            assert!(row.iter().all(|&w| (0.0..=1.0).contains(&w)));
        }
    }
    for panel in &maps.decoder {
        assert_eq!(panel.rows, maps.tgt_tokens);
        assert_eq!(panel.cols, maps.tgt_tokens);
        for (i, row) in panel.weights.iter().enumerate() {
            assert!(row[..=i].iter().any(|&w| w > 0.0));
            for (j, &w) in row.iter().enumerate().skip(i + 1) {
                assert_eq!(w, 0.0, "{}: query {i} sees future key {j}", panel.label);
            }
        }
    }
    for panel in &maps.cross {
        assert_eq!(panel.rows, maps.tgt_tokens);
        assert_eq!(panel.cols, maps.src_tokens);
    }
}

/// Sentences long enough that training attends with the tiled kernel (which keeps no weights):
/// the maps come from the explicit inference call with the plain kernel, one per layer, and are
/// normalised (`transformer attention` panicked here before).
#[test]
fn attention_maps_of_long_sentences() {
    let (model, vocab) = tiny_model_and_vocab();
    let text: String = "the cat sat on the mat ".repeat(7);
    let (src, tgt) = (vocab.encode(&text), vocab.encode(&text[..150]));
    assert!(src.len() + 1 >= transformer::kernels::attention::TILED_FROM_KEYS);
    let maps = attention_maps(&model, &src, &tgt, &vocab);
    assert_eq!(maps.encoder[0].weights.len(), src.len() + 1);
    for panel in maps.encoder.iter().chain(&maps.decoder).chain(&maps.cross) {
        for row in &panel.weights {
            let sum: f64 = row.iter().map(|&w| w as f64).sum();
            assert!((sum - 1.0).abs() < 1e-4, "{} sums to {sum}", panel.label);
        }
    }
    let batch = transformer::batch::Batch::from_pairs(&[(&src[..], &tgt[..])]);
    let (enc, dec) = model.attention_weights(&batch);
    assert_eq!(enc.len(), model.config.n_encoder_layers);
    assert_eq!(dec.len(), model.config.n_decoder_layers);
}

#[test]
fn attention_grid_as_png_and_svg() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, vocab) = tiny_model_and_vocab();
    let maps = attention_maps(
        &model,
        &vocab.encode("the cat sat"),
        &vocab.encode("katze"),
        &vocab,
    );
    let png = tmp.path().join("grid.png");
    draw_attention_grid(&png, "Encoder self-attention", &maps.encoder).unwrap();
    assert_drawn_png(&png);
    let svg = tmp.path().join("grid.svg");
    draw_attention_grid(&svg, "Cross attention", &maps.cross).unwrap();
    assert_svg(
        &svg,
        &["Cross attention", "cross layer 2 head 4", "&lt;s&gt;"],
    );

    let bad = AttentionPanel {
        label: "broken".into(),
        rows: vec!["a".into()],
        cols: vec!["b".into(), "c".into()],
        weights: vec![vec![1.0]],
    };
    let e = draw_attention_grid(&png, "t", &[bad])
        .unwrap_err()
        .to_string();
    assert!(e.contains("broken") && e.contains("1 x 2"), "{e}");
    let e = draw_attention_grid(&png, "t", &[]).unwrap_err().to_string();
    assert!(e.contains("no attention maps"), "{e}");
}

fn run(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_transformer"))
        .args(args)
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{stderr}");
    (out.status.success(), stderr)
}

#[test]
fn attention_command_on_a_tiny_trained_model() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("train.tsv");
    let pairs: Vec<String> = (0..30)
        .map(|i| {
            let src = format!("red {}", i * 7 % 23);
            let tgt: String = src.chars().rev().collect();
            format!("{src}\t{tgt}")
        })
        .collect();
    std::fs::write(&data, pairs.join("\n")).unwrap();
    let model = tmp.path().join("model");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let (data_arg, model_arg) = (s(&data), s(&model));
    let mut train = vec!["train", "--train", &data_arg, "--out", &model_arg];
    train.extend(super::cli_run::TINY_TRAIN);
    train.extend(["--max-steps", "2"]);
    let (ok, stderr) = run(&train);
    assert!(ok, "{stderr}");

    // Given target, PNG.
    let out = tmp.path().join("attn.png");
    let (ok, stderr) = run(&[
        "attention",
        "--model",
        &s(&model),
        "--src",
        "red 14",
        "--tgt",
        "41 der",
        "--out",
        &s(&out),
        "--threads",
        "1",
    ]);
    assert!(ok, "{stderr}");
    for kind in ["encoder", "decoder", "cross"] {
        let path = tmp.path().join(format!("attn-{kind}.png"));
        assert!(
            stderr.contains(&format!("wrote {}", path.display())),
            "{stderr}"
        );
        assert_drawn_png(&path);
    }
    assert!(!out.exists());

    // Greedy target, SVG.
    let out = tmp.path().join("greedy.svg");
    let (ok, stderr) = run(&[
        "attention",
        "--model",
        &s(&model),
        "--src",
        "red 3",
        "--out",
        &s(&out),
        "--threads",
        "1",
    ]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("target (greedy):"), "{stderr}");
    // The source ends with </s>; the decoder input starts with <s>.
    let needles = [
        ("encoder", "&lt;/s&gt;"),
        ("decoder", "&lt;s&gt;"),
        ("cross", "&lt;/s&gt;"),
    ];
    for (kind, special) in needles {
        let path = tmp.path().join(format!("greedy-{kind}.svg"));
        assert_svg(&path, &["layer 2 head 4", special]);
    }

    // Errors: a bad extension, a missing model.
    let (ok, stderr) = run(&[
        "attention",
        "--model",
        &s(&model),
        "--src",
        "red",
        "--out",
        &s(&tmp.path().join("a.gif")),
    ]);
    assert!(
        !ok && stderr.contains("a.gif") && stderr.contains(".png or .svg"),
        "{stderr}"
    );
    let (ok, stderr) = run(&[
        "attention",
        "--model",
        &s(&tmp.path().join("none")),
        "--src",
        "red",
        "--out",
        &s(&out),
    ]);
    assert!(!ok && stderr.contains("does not exist"), "{stderr}");
}
