//! Long-context checkpoints (issue 44): files whose context is 131,072 or 1,048,576 positions
//! (Llama 3.x with its llama3 rope scaling, Qwen2.5 with YaRN) load from Hugging Face
//! directories and GGUF files and generate; their rotary angles past position 65,536 equal a
//! float64 transcription of transformers' formulas, and so does an attention layer's output at
//! those positions; a context is a limit, not an allocation.
//!
//! The checkpoints are the tiny random ones of `../shared/reference/families` (llama, qwen2)
//! with their context (and rope scaling) patched into a temporary directory or file.

use super::families::{families_dir, greedy, load_gguf_file, load_hf, logits, max_diff, with_key};
use std::path::Path;
use transformer::kernels::attention::AttnMask;
use transformer::kernels::rope::rope_forward_scaled;
use transformer::model::attention::MultiHeadAttention;
use transformer::model::config::RopeScaling;
use transformer::model::families::GgufWeights;
use transformer::model::LanguageModel;
use transformer::pipeline::generate::TextGenerator;
use transformer::rng::Rng;
use transformer::store::gguf::{GgufFile, Value};

/// Positions past the old 65,536 limit at which angles and attention are checked.
const FAR: [usize; 3] = [70_000, 131_071, 1_000_000];

/// Llama 3.2's rope scaling (factor 32 over an original 8192) on a 131,072 context.
fn llama32_rope() -> serde_json::Value {
    serde_json::json!({"rope_theta": 500000.0, "rope_type": "llama3", "factor": 32.0,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
}

/// Qwen2.5's YaRN (Qwen's documented `rope_scaling`, transformers 4 layout) stretched to
/// 1M: factor 32 over an original 32768.
fn qwen_yarn() -> serde_json::Value {
    serde_json::json!({"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 32768})
}

/// A copy of the family's Hugging Face directory in a temporary directory with `context` as
/// `max_position_embeddings` and, if given, `rope_scaling` (replacing `rope_parameters`' kind).
fn patched_hf(family: &str, context: usize, rope: Option<serde_json::Value>) -> tempfile::TempDir {
    let from = families_dir().unwrap().join(family).join("hf");
    let to = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&from).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, to.path().join(path.file_name().unwrap())).unwrap();
    }
    let config_path = to.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    config["max_position_embeddings"] = context.into();
    if let Some(rope) = rope {
        let theta = config["rope_parameters"]["rope_theta"].clone();
        config.as_object_mut().unwrap().remove("rope_parameters");
        config["rope_theta"] = theta;
        config["rope_scaling"] = rope;
    }
    std::fs::write(&config_path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    to
}

/// The family's F16 GGUF file with `keys` set (replaced or added).
fn patched_gguf(family: &str, keys: &[(&str, Value)]) -> GgufFile {
    let path = families_dir()
        .unwrap()
        .join(family)
        .join(format!("{family}.f16.gguf"));
    let mut file = GgufFile::open(&path).unwrap();
    for (key, value) in keys {
        let bytes = with_key(&file, key, value.clone());
        file = GgufFile::from_bytes(bytes, Path::new("patched.gguf")).unwrap();
    }
    file
}

/// transformers' `_compute_llama3_parameters` in float64: the scaled inverse frequencies of a
/// head of `dim`.
fn llama3_inv_freq(base: f64, dim: usize, factor: f64, low: f64, high: f64, old: f64) -> Vec<f64> {
    let (low_wavelen, high_wavelen) = (old / low, old / high);
    (0..dim / 2)
        .map(|i| {
            let inv_freq = 1.0 / base.powf((2 * i) as f64 / dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / inv_freq;
            if wavelen < high_wavelen {
                inv_freq
            } else if wavelen > low_wavelen {
                inv_freq / factor
            } else {
                let smooth = (old / wavelen - low) / (high - low);
                (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
            }
        })
        .collect()
}

/// transformers' `_compute_yarn_parameters` in float64 (beta_fast 32, beta_slow 1, truncate):
/// the inverse frequencies and the attention factor `0.1 ln(factor) + 1`.
fn yarn_inv_freq(base: f64, dim: usize, factor: f64, original: f64) -> (Vec<f64>, f64) {
    let find_correction_dim = |rotations: f64| {
        (dim as f64 * (original / (rotations * 2.0 * std::f64::consts::PI)).ln())
            / (2.0 * base.ln())
    };
    let low = find_correction_dim(32.0).floor().max(0.0);
    let mut high = find_correction_dim(1.0).ceil().min(dim as f64 - 1.0);
    if low == high {
        high += 0.001;
    }
    let inv_freq = (0..dim / 2)
        .map(|i| {
            let pos_freq = base.powf((2 * i) as f64 / dim as f64);
            let (extrapolation, interpolation) = (1.0 / pos_freq, 1.0 / (factor * pos_freq));
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let extrapolation_factor = 1.0 - ramp;
            interpolation * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor
        })
        .collect();
    (inv_freq, 0.1 * factor.ln() + 1.0)
}

/// The layer's rotation of a head `[1, …, 1, 0, …, 0]` (half-split: pair `i` is columns `i` and
/// `i + d/2`) at `pos`: `(m·cos(pos·θᵢ), m·sin(pos·θᵢ))` in its two halves.
fn rotated_unit(attn: &MultiHeadAttention<f32>, pos: usize) -> Vec<f64> {
    let d = attn.d_head;
    let mut x: Vec<f64> = (0..d).map(|c| if c < d / 2 { 1.0 } else { 0.0 }).collect();
    rope_forward_scaled(&mut x, attn.rope, &attn.rope_freq_factors, 1, 1, (d, pos));
    x
}

/// The angles of the layer at the far positions against `(inv_freq, m)`, to 1e-9.
fn check_angles(name: &str, attn: &MultiHeadAttention<f32>, inv_freq: &[f64], m: f64) {
    let half = attn.d_head / 2;
    assert_eq!(inv_freq.len(), half);
    for pos in FAR {
        let got = rotated_unit(attn, pos);
        for (i, &f) in inv_freq.iter().enumerate() {
            let angle = pos as f64 * f;
            let (want_cos, want_sin) = (m * angle.cos(), m * angle.sin());
            let (c, s) = (got[i], got[half + i]);
            assert!(
                (c - want_cos).abs() < 1e-9 && (s - want_sin).abs() < 1e-9,
                "{name} position {pos} pair {i}: ({c}, {s}) vs ({want_cos}, {want_sin})"
            );
        }
    }
}

/// The rotary angles (cos and sin, with YaRN's attention factor) at positions 70,000,
/// 131,071 and 1,000,000 equal float64 transcriptions of transformers' llama3 and yarn
/// formulas, for the model loaded from a Hugging Face directory and (YaRN) from a GGUF file
/// with llama.cpp's `rope.scaling.*` keys.
#[test]
fn rotary_angles_past_65536_match_transformers_in_float64() {
    let Some(_) = families_dir() else { return };
    let dir = patched_hf("llama", 131_072, Some(llama32_rope()));
    let llama = load_hf(dir.path());
    assert_eq!(llama.max_len(), 131_072);
    let want = llama3_inv_freq(500000.0, 32, 32.0, 1.0, 4.0, 8192.0);
    // All three bands of llama3 occur in a head of 32.
    let base_inv = |i: usize| 1.0 / 500000f64.powf((2 * i) as f64 / 32.0);
    assert!(want[0] == base_inv(0) && (want[15] - base_inv(15) / 32.0).abs() < 1e-20);
    assert!((0..16).any(|i| want[i] < base_inv(i) && want[i] > base_inv(i) / 32.0));
    for layer in &llama.blocks.layers {
        check_angles("llama3 hf", &layer.self_attn, &want, 1.0);
    }

    let dir = patched_hf("qwen2", 1 << 20, Some(qwen_yarn()));
    let qwen = load_hf(dir.path());
    assert_eq!(qwen.max_len(), 1 << 20);
    let (want, m) = yarn_inv_freq(1e6, 32, 32.0, 32768.0);
    assert_eq!(
        qwen.config.rope_scaling,
        Some(RopeScaling::Yarn {
            factor: 32.0,
            original_max_position_embeddings: 32768.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: m,
            truncate: true,
        })
    );
    assert!((m - 1.346_573_590_279_972_6).abs() < 1e-15, "{m}");
    let base_inv = |i: usize| 1.0 / 1e6f64.powf((2 * i) as f64 / 32.0);
    assert_eq!(want[0], base_inv(0), "kept below the beta_fast band");
    assert!(
        (want[15] - base_inv(15) / 32.0).abs() < 1e-20,
        "slowed above beta_slow"
    );
    assert!((0..16).any(|i| want[i] < base_inv(i) * 0.99 && want[i] > base_inv(i) / 31.0));
    for layer in &qwen.blocks.layers {
        check_angles("yarn hf", &layer.self_attn, &want, m);
    }
    let gguf = load_gguf_file(&yarn_gguf(), GgufWeights::Dequantised);
    assert_eq!(gguf.max_len(), 1 << 20);
    assert_eq!(gguf.config.rope_scaling, qwen.config.rope_scaling);
    for layer in &gguf.blocks.layers {
        check_angles("yarn gguf", &layer.self_attn, &want, m);
    }
}

/// Qwen2's GGUF with YaRN as llama.cpp's converter writes it for Qwen2.5 (factor, original
/// context; beta and attention factors left to their defaults) and a 1M context.
fn yarn_gguf() -> GgufFile {
    patched_gguf(
        "qwen2",
        &[
            ("qwen2.context_length", Value::U32(1 << 20)),
            ("qwen2.rope.scaling.type", Value::String("yarn".into())),
            ("qwen2.rope.scaling.factor", Value::F32(32.0)),
            (
                "qwen2.rope.scaling.original_context_length",
                Value::U32(32768),
            ),
        ],
    )
}

/// The context is a limit: the same weights with a context of 131,072 or 1,048,576 (and the
/// same rotation) give the logits and the greedy continuation of the 256-context originals,
/// from Hugging Face directories (through `TextGenerator`, tokenizer included) and from GGUF
/// files.
#[test]
fn files_of_128k_and_1m_context_load_and_generate() {
    let Some(families) = families_dir() else {
        return;
    };
    let ids: Vec<u32> = vec![3, 17, 101, 250, 42, 7, 300];
    for (family, arch) in [("llama", "llama"), ("qwen2", "qwen2")] {
        let original = load_hf(&families.join(family).join("hf"));
        let want_logits = logits(&original, &ids);
        let want_greedy = greedy(&original, &ids, 8);
        let file = families.join(family).join(format!("{family}.f16.gguf"));
        let original_gguf =
            load_gguf_file(&GgufFile::open(&file).unwrap(), GgufWeights::Dequantised);
        let want_gguf_greedy = greedy(&original_gguf, &ids, 8);
        for context in [131_072usize, 1 << 20] {
            let dir = patched_hf(family, context, None);
            let g = TextGenerator::load(dir.path()).unwrap();
            assert_eq!(g.model.max_len(), context, "{family} hf {context}");
            let d = max_diff(&logits(&g.model, &ids), &want_logits);
            assert_eq!(
                d, 0.0,
                "{family} hf {context}: the context changed the logits"
            );
            assert_eq!(
                greedy(&g.model, &ids, 8),
                want_greedy,
                "{family} hf {context}"
            );
            let key = format!("{arch}.context_length");
            let gguf = patched_gguf(family, &[(&key, Value::U32(context as u32))]);
            let m = load_gguf_file(&gguf, GgufWeights::Dequantised);
            assert_eq!(m.max_len(), context, "{family} gguf {context}");
            assert_eq!(
                greedy(&m, &ids, 8),
                want_gguf_greedy,
                "{family} gguf {context}"
            );
        }
    }
}

/// YaRN from the GGUF keys and from the Hugging Face config give the same model (logits
/// within the F16 rounding of the GGUF weights, 1e-3, as the families' tests), and the
/// scaling is applied: the logits differ from the unscaled model's.
#[test]
fn yarn_gguf_and_hf_agree_and_differ_from_unscaled() {
    let Some(families) = families_dir() else {
        return;
    };
    let ids: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 512).collect();
    let hf_dir = patched_hf("qwen2", 1 << 20, Some(qwen_yarn()));
    let hf = load_hf(hf_dir.path());
    let gguf = load_gguf_file(&yarn_gguf(), GgufWeights::Dequantised);
    let (a, b) = (logits(&hf, &ids), logits(&gguf, &ids));
    let d = max_diff(&a, &b);
    assert!(d < 1e-3, "yarn hf vs gguf: {d:e}");
    let unscaled = load_hf(&families.join("qwen2").join("hf"));
    let d = max_diff(&a, &logits(&unscaled, &ids));
    assert!(d > 1e-2, "YaRN left the logits unchanged ({d:e})");
    let g = greedy(&hf, &ids, 4);
    assert_eq!(g.len(), 4);
}

/// transformers' attention in float64 for one batch row: `x [len, d_model]`, queries and keys
/// rotated (half-split) at `shift + i` by `inv_freq` with factor `m`, causal, grouped heads,
/// then the output projection.
fn attention_f64(
    attn: &MultiHeadAttention<f32>,
    x: &[f32],
    shift: usize,
    inv_freq: &[f64],
    m: f64,
) -> Vec<f64> {
    let (d_model, d_head) = (attn.d_model, attn.d_head);
    let len = x.len() / d_model;
    let project = |lin: &transformer::model::linear::Linear<f32>| -> Vec<f64> {
        let w = &lin.weight.value.data;
        let mut y = vec![0.0; len * lin.d_out];
        for t in 0..len {
            for o in 0..lin.d_out {
                let mut s = lin.bias.as_ref().map_or(0.0, |b| b.value.data[o] as f64);
                for i in 0..lin.d_in {
                    s += w[o * lin.d_in + i] as f64 * x[t * d_model + i] as f64;
                }
                y[t * lin.d_out + o] = s;
            }
        }
        y
    };
    let rotate = |v: &mut [f64], heads: usize| {
        let half = d_head / 2;
        for t in 0..len {
            let pos = (shift + t) as f64;
            for h in 0..heads {
                let head = &mut v[(t * heads + h) * d_head..(t * heads + h + 1) * d_head];
                for i in 0..half {
                    let (s, c) = (pos * inv_freq[i]).sin_cos();
                    let (a, b) = (head[i], head[i + half]);
                    head[i] = m * (a * c - b * s);
                    head[i + half] = m * (b * c + a * s);
                }
            }
        }
    };
    let (mut q, mut k, v) = (
        project(&attn.q_proj),
        project(&attn.k_proj),
        project(&attn.v_proj),
    );
    rotate(&mut q, attn.n_heads);
    rotate(&mut k, attn.n_kv_heads);
    let group = attn.n_heads / attn.n_kv_heads;
    let mut context = vec![0.0; len * attn.n_heads * d_head];
    for t in 0..len {
        for h in 0..attn.n_heads {
            let kv = h / group;
            let qh = &q[(t * attn.n_heads + h) * d_head..][..d_head];
            let scores: Vec<f64> = (0..=t)
                .map(|j| {
                    let kh = &k[(j * attn.n_kv_heads + kv) * d_head..][..d_head];
                    qh.iter().zip(kh).map(|(a, b)| a * b).sum::<f64>() / (d_head as f64).sqrt()
                })
                .collect();
            let top = scores.iter().cloned().fold(f64::MIN, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
            let total: f64 = weights.iter().sum();
            for (j, w) in weights.iter().enumerate() {
                let vh = &v[(j * attn.n_kv_heads + kv) * d_head..][..d_head];
                let out = &mut context[(t * attn.n_heads + h) * d_head..][..d_head];
                for (o, &vv) in out.iter_mut().zip(vh) {
                    *o += w / total * vv;
                }
            }
        }
    }
    let o = &attn.out_proj;
    let w = &o.weight.value.data;
    let mut y = vec![0.0; len * o.d_out];
    for t in 0..len {
        for r in 0..o.d_out {
            y[t * o.d_out + r] = (0..o.d_in)
                .map(|i| w[r * o.d_in + i] as f64 * context[t * o.d_in + i])
                .sum();
        }
    }
    y
}

/// Decoding past 65,536: an attention layer (its projections, rotation, grouped heads and
/// output projection) run at positions 70,000…, 131,071… and 1,000,000… equals the float64
/// loop of transformers' attention at those positions (llama3 and YaRN), to 1e-4 of the
/// output's scale.
#[test]
fn attention_past_65536_matches_float64_loop() {
    let Some(_) = families_dir() else { return };
    let llama_dir = patched_hf("llama", 131_072, Some(llama32_rope()));
    let qwen_dir = patched_hf("qwen2", 1 << 20, Some(qwen_yarn()));
    let cases: [(&str, LanguageModel<f32>, Vec<f64>, f64); 2] = [
        (
            "llama3",
            load_hf(llama_dir.path()),
            llama3_inv_freq(500000.0, 32, 32.0, 1.0, 4.0, 8192.0),
            1.0,
        ),
        {
            let (f, m) = yarn_inv_freq(1e6, 32, 32.0, 32768.0);
            ("yarn", load_hf(qwen_dir.path()), f, m)
        },
    ];
    let len = 6;
    let mut rng = Rng::new(44);
    for (name, model, inv_freq, m) in &cases {
        let attn = &model.blocks.layers[1].self_attn;
        let x: Vec<f32> = (0..len * attn.d_model)
            .map(|_| rng.uniform_range(-1.0, 1.0) as f32)
            .collect();
        for far in FAR {
            let shift = far + 1 - len;
            let mask = AttnMask {
                key_lens: &[len],
                causal: true,
                q_offset: 0,
            };
            let (got, _) = attn.forward_at(&x, &x, 1, mask, shift);
            let want = attention_f64(attn, &x, shift, inv_freq, *m);
            let scale = want.iter().map(|v| v.abs()).fold(0.0, f64::max);
            let d = got
                .iter()
                .zip(&want)
                .map(|(&a, b)| (a as f64 - b).abs())
                .fold(0.0, f64::max);
            assert!(
                d < 1e-4 * scale.max(1.0),
                "{name} at {shift}: {d:e} (scale {scale})"
            );
            // Not the same as at position 0 to the bit: the positions were used (the outputs
            // agree only up to rounding, since scores see relative positions).
            let (at_zero, _) = attn.forward_at(&x, &x, 1, mask, 0);
            assert_ne!(got, at_zero, "{name}: position {shift} not applied");
        }
    }
}

/// `--ctx-size` larger than memory allows: the error names the bytes needed (2 layers ·
/// 2 · 2 key/value heads of 32 · 1,048,576 positions · 4 bytes = 1 GiB) and those available.
#[test]
fn a_context_larger_than_memory_is_refused_naming_the_bytes() {
    let Some(_) = families_dir() else { return };
    let dir = patched_hf("qwen2", 1 << 20, Some(qwen_yarn()));
    let mut m = load_hf(dir.path());
    assert_eq!(m.kv_cache_bytes(1 << 20), 1 << 30);
    let err = m
        .set_context(1 << 20, Some(1 << 29))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("1073741824 bytes") && err.contains("536870912 bytes"),
        "{err}"
    );
    assert!(err.contains("--ctx-size 1048576"), "{err}");
    assert_eq!(m.max_len(), 1 << 20);
    assert_eq!(m.set_context(8192, Some(1 << 29)).unwrap(), 8192);
    assert_eq!(m.max_len(), 8192);
    assert_eq!(m.model_context(), 1 << 20);
}

/// The peak resident memory (`VmHWM`, bytes) of this process.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line[6..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kib * 1024
}

/// A 1M-context file loads and generates without per-position tables of its context: run
/// alone in a child process (this test binary, this test only), loading the Hugging Face
/// directory and the GGUF file of context 1,048,576 and generating 8 tokens from each keeps
/// the peak resident memory under 192 MiB (one table of 1M positions of the model's width in
/// float32 would be 512 MiB; the key/value cache of 1M positions 1 GiB).
#[test]
fn a_1m_context_file_allocates_nothing_per_position() {
    let Some(_) = families_dir() else { return };
    if std::env::var_os("LONG_CONTEXT_CHILD").is_some() {
        let dir = patched_hf("qwen2", 1 << 20, Some(qwen_yarn()));
        let g = TextGenerator::load(dir.path()).unwrap();
        assert_eq!(g.model.max_len(), 1 << 20);
        let ids: Vec<u32> = vec![3, 17, 101, 250];
        assert_eq!(greedy(&g.model, &ids, 8).len(), 8);
        let state = g.model.start_paged(16);
        assert_eq!(state.capacity(), 1 << 20);
        let m = load_gguf_file(&yarn_gguf(), GgufWeights::Dequantised);
        assert_eq!(greedy(&m, &ids, 8).len(), 8);
        assert_eq!(m.embedding.position_rows(), 0, "rotary: no position table");
        let peak = peak_rss();
        eprintln!("peak resident memory: {peak} bytes");
        assert!(peak < 192 << 20, "peak resident memory {peak} bytes");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "long_context::a_1m_context_file_allocates_nothing_per_position",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LONG_CONTEXT_CHILD", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("1 passed") && stderr.contains("peak resident memory"),
        "the child ran no test:\n{stdout}\n{stderr}"
    );
}
