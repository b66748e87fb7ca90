//! CTranslate2 model directories (`model.bin`, `config.json`, a vocabulary) of its
//! encoder-decoder `TransformerSpec` (converted OpenNMT-py / Argos Translate models, and
//! Transformers' Marian models): the spec's options, read from `model.bin`'s scalars, become
//! our [`ModelConfig`] and its variables our tensors; what our [`Seq2Seq`] does not compute is
//! refused by name (any variable left unread is one: relative positions, ALiBi, RMSNorm, gated
//! FFNs, ...).
//!
//! Names (`encoder/…`, `decoder/…`): `embeddings_0/weight` / `embeddings/weight` (one table,
//! shared by both stacks; the `projection/weight` tied to it or its own), `scale_embeddings`
//! (a flag for √d_model, or the factor itself; older files: `embeddings/multiply_by_sqrt_depth`),
//! `position_encodings/encodings` (a stored table, else CTranslate2's sinusoids: position `t`
//! reads row `t + 1` of sines then cosines, `10000^(−i/(h−1))`), `pre_norm`, `activation`,
//! `num_heads`, `layer_norm/{gamma,beta}` (pre-norm's final norms), per layer
//! `self_attention/linear_0` (Q, K and V fused), `linear_1` (the output), the decoder's
//! `attention/linear_0` (Q), `linear_1` (K and V fused), `linear_2`, each `layer_norm`, and
//! `ffn/linear_0`, `ffn/linear_1`, `ffn/layer_norm`.
//!
//! Weights stored as float16 / bfloat16 are widened to f32; int8 / int16 ones (`w = q / scale`
//! per output row) are dequantised for f32 inference and their int8 rows kept as stored
//! ([`super::ctranslate2_int8`]) for int8 inference. The tokenizer and ids: see
//! `text::ct2_tokenizer` and [`super::ctranslate2_vocab`].

use super::ctranslate2_int8::StoredInt8;
use super::ctranslate2_vocab::{Ct2Config, VocabSetup};
use crate::error::Result;
use crate::model::checkpoint::build_filled;
use crate::model::config::{Activation, NormPlacement, Positions};
use crate::model::{ModelConfig, Seq2Seq};
use crate::store::ckpt_err;
use crate::store::ctranslate2::{Dtype, ModelBin};
use crate::store::package::Files;
use crate::store::TensorMap;
use crate::text::vocab::Vocab;
use std::collections::HashSet;
use std::path::Path;

/// The weights file of a CTranslate2 model directory.
pub const MODEL_BIN: &str = "model.bin";

/// Whether `dir` is a CTranslate2 model directory (it holds `model.bin`).
pub fn is_ctranslate2_dir(dir: &Path) -> bool {
    dir.join(MODEL_BIN).is_file()
}

/// Loads a CTranslate2 model from `files` (a directory, or a package's `model/`), the SentencePiece model
/// `spm` (bytes and where they are) when the package holds it beside the model; also the
/// int8 weights as stored, for int8 inference.
pub fn load_files(
    files: &Files,
    spm: Option<(&[u8], &Path)>,
) -> Result<(Seq2Seq<f32>, Vocab, Option<StoredInt8>)> {
    let config = Ct2Config::read(files)?;
    let bin_path = files.path(MODEL_BIN);
    let bin = ModelBin::parse(&bin_path, &files.read(MODEL_BIN)?)?;
    if bin.spec != "TransformerSpec" {
        let spec = if bin.spec.is_empty() { "(none: binary version 1)" } else { &bin.spec };
        return Err(ckpt_err(
            &bin_path,
            format!("spec {spec}: only CTranslate2's TransformerSpec (encoder-decoder) is supported"),
        ));
    }
    if bin.revision > 7 {
        return Err(ckpt_err(&bin_path, format!("TransformerSpec revision {} is newer than 7", bin.revision)));
    }
    let mut reader = Reader { bin: &bin, used: HashSet::new() };
    let shape = reader.shape().map_err(|e| ckpt_err(&bin_path, e))?;
    let zero_start = reader
        .scalar("decoder/start_from_zero_embedding")
        .map_err(|e| ckpt_err(&bin_path, e))?
        .is_some_and(|v| v != 0.0);
    let setup = VocabSetup::read(files, &config, spm, shape.vocab, zero_start)?;
    let mut model_config = shape.config(config.layer_norm_epsilon.unwrap_or(1e-5), setup.ids.len_ours());
    model_config.source_eos = setup.source_eos;
    model_config.validate().map_err(|e| ckpt_err(&bin_path, e))?;
    let (tensors, int8) = reader
        .tensors(&shape, &model_config, &setup)
        .map_err(|e| ckpt_err(&bin_path, e))?;
    let unread: Vec<&String> = {
        let mut v: Vec<&String> = (bin.variables.keys().chain(bin.aliases.keys()))
            .filter(|n| !reader.used.contains(n.as_str()))
            .collect();
        v.sort();
        v
    };
    if !unread.is_empty() {
        let few: Vec<&str> = unread.iter().take(6).map(|s| s.as_str()).collect();
        return Err(ckpt_err(
            &bin_path,
            format!("spec options or variables we do not compute: {}", few.join(", ")),
        ));
    }
    let model = build_filled(&bin_path, model_config, tensors, None)?;
    Ok((model, setup.vocab, int8))
}

/// What the spec's options say, before the tensors are read.
pub(super) struct Shape {
    pub d_model: usize,
    pub d_ff: usize,
    pub heads: usize,
    pub encoder_layers: usize,
    pub decoder_layers: usize,
    pub vocab: usize,
    pub pre_norm: bool,
    pub activation: Activation,
    /// The token embeddings' factor (`None`: none, 1).
    pub scale: Option<f64>,
    /// Rows of the stored position table (`None`: computed sinusoids).
    pub positions: Option<usize>,
    pub bias: bool,
    pub tied: bool,
}

impl Shape {
    /// Our config of this shape, `eps` its norms' epsilon, `vocab` our vocabulary size.
    fn config(&self, eps: f64, vocab: usize) -> ModelConfig {
        let mut c = ModelConfig::preset("base", vocab).expect("a preset");
        c.d_model = self.d_model;
        c.n_heads = self.heads;
        c.d_ff = self.d_ff;
        c.n_encoder_layers = self.encoder_layers;
        c.n_decoder_layers = self.decoder_layers;
        c.dropout = 0.0;
        c.norm = if self.pre_norm { NormPlacement::PreLn } else { NormPlacement::PostLn };
        c.layer_norm_eps = eps;
        c.tie_embeddings = self.tied;
        c.max_len = self.positions.unwrap_or(COMPUTED_POSITIONS);
        c.activation = self.activation;
        c.positions = Positions::Learned;
        c.bias = self.bias;
        c.scale_embeddings = self.scale.is_some();
        c.embedding_scale = self.scale;
        c.output_bias = true;
        c
    }
}

/// The positions of a model whose sinusoids CTranslate2 computes (it has no limit).
const COMPUTED_POSITIONS: usize = 1024;

/// CTranslate2's own sinusoids for `n` positions of width `d` (see the module docs), in f32 as
/// its `generate_sinusoidal_position_encoding` computes them.
pub fn ct2_sinusoids(n: usize, d: usize) -> Vec<f32> {
    let half = d / 2;
    let step = 10000f32.ln() / (half as f32 - 1.0);
    let scales: Vec<f32> = (0..half).map(|i| (-step * i as f32).exp()).collect();
    let mut out = vec![0f32; n * d];
    for (t, row) in out.chunks_exact_mut(d).enumerate() {
        for (i, &s) in scales.iter().enumerate() {
            let angle = (t + 1) as f32 * s;
            row[i] = angle.sin();
            row[half + i] = angle.cos();
        }
    }
    out
}

/// Reads variables from `model.bin`, noting each one read (and the alias it was read by).
pub(super) struct Reader<'a> {
    pub bin: &'a ModelBin,
    pub used: HashSet<String>,
}

type Parse<T> = std::result::Result<T, String>;

impl Reader<'_> {
    /// Marks `name` read; its variable, if stored.
    pub fn take(&mut self, name: &str) -> Option<&crate::store::ctranslate2::Variable> {
        let v = self.bin.get(name)?;
        self.used.insert(name.to_string());
        if let Some(target) = self.bin.aliases.get(name) {
            self.used.insert(target.clone());
        }
        Some(v)
    }

    /// A scalar option, marked read.
    fn scalar(&mut self, name: &str) -> Parse<Option<f64>> {
        let value = self.bin.scalar(name)?;
        self.take(name);
        Ok(value)
    }

    /// A scalar option that must be the same for both stacks.
    fn both(&mut self, name: &str) -> Parse<Option<f64>> {
        let (e, d) = (self.scalar(&format!("encoder/{name}"))?, self.scalar(&format!("decoder/{name}"))?);
        if e != d {
            return Err(format!("encoder/{name} {e:?} and decoder/{name} {d:?} differ (not supported)"));
        }
        Ok(e)
    }

    /// A flag that must be off (or absent).
    fn off(&mut self, name: &str, what: &str) -> Parse<()> {
        match self.scalar(name)? {
            Some(v) if v != 0.0 => Err(format!("{name} is set: {what} is not supported")),
            _ => Ok(()),
        }
    }

    /// The spec's options and sizes.
    fn shape(&mut self) -> Parse<Shape> {
        let heads = self.both("num_heads")?.unwrap_or(8.0) as usize;
        let pre_norm = self.both("pre_norm")?.unwrap_or(1.0) != 0.0;
        let activation = match self.both("activation")?.unwrap_or(0.0) as i64 {
            0 => Activation::Relu,
            1 => Activation::GeluTanh,
            2 => Activation::Silu,
            3 => Activation::GeluErf,
            a => return Err(format!("activation {a} (GELUSigmoid, Tanh or Sigmoid) is not supported")),
        };
        self.off("encoder/multi_query_attention", "multi-query attention")?;
        self.off("decoder/alibi", "ALiBi")?;
        for name in ["decoder/alibi_use_positive_positions", "decoder/scale_alibi",
                     "decoder/alignment_layer", "decoder/alignment_heads", "encoder/embeddings_merge"] {
            self.scalar(name)?; // Without ALiBi, or only for alignments: nothing to compute.
        }
        let scale = self.embedding_scale()?;
        let count = |prefix: &str| (0..).take_while(|i| self.bin.has(&format!("{prefix}/layer_{i}/ffn/linear_0/weight"))).count();
        let (encoder_layers, decoder_layers) = (count("encoder"), count("decoder"));
        let emb = self.bin.get("decoder/embeddings/weight").ok_or("no decoder/embeddings/weight")?;
        let [vocab, d_model] = emb.shape[..] else {
            return Err(format!("decoder/embeddings/weight has shape {:?}, not a matrix", emb.shape));
        };
        let ffn = self.bin.get("encoder/layer_0/ffn/linear_0/weight").ok_or("no encoder/layer_0 (an encoder of no layers)")?;
        let d_ff = ffn.shape.first().copied().unwrap_or(0);
        let positions = (self.bin.get("encoder/position_encodings/encodings"))
            .map(|p| p.shape.first().copied().unwrap_or(0));
        let bias = self.bin.variables.keys().chain(self.bin.aliases.keys()).any(|n| n.ends_with("/bias") && !n.contains("layer_norm") && !n.starts_with("decoder/projection"));
        let target = |n: &str| self.bin.aliases.get(n).cloned().unwrap_or_else(|| n.to_string());
        let tied = target("decoder/projection/weight") == target("decoder/embeddings/weight")
            || self.bin.get("decoder/projection/weight") == Some(emb);
        Ok(Shape { d_model, d_ff, heads, encoder_layers, decoder_layers, vocab, pre_norm, activation, scale, positions, bias, tied })
    }

    /// The token embeddings' factor: `scale_embeddings` (a flag for √d_model, or the factor),
    /// else the older `embeddings/multiply_by_sqrt_depth`, else √d_model (CTranslate2's
    /// default); `None` for 1.
    fn embedding_scale(&mut self) -> Parse<Option<f64>> {
        let mut read = |stack: &str, emb: &str| -> Parse<Option<f64>> {
            let d = self.bin.get(&format!("{stack}/{emb}/weight")).map_or(0, |v| v.shape.get(1).copied().unwrap_or(0));
            let var = ["scale_embeddings", &format!("{emb}/multiply_by_sqrt_depth")]
                .iter()
                .map(|n| format!("{stack}/{n}"))
                .find(|n| self.bin.has(n));
            let Some(name) = var else { return Ok(Some((d as f64).sqrt())) };
            let v = self.take(&name).expect("present").clone();
            let x = v.scalar().ok_or_else(|| format!("{name} is not a scalar"))?;
            Ok(match v.dtype {
                Dtype::I8 if x != 0.0 => Some((d as f64).sqrt()),
                Dtype::I8 => None,
                _ if x == 1.0 => None,
                _ => Some(x),
            })
        };
        let (e, d) = (read("encoder", "embeddings_0")?, read("decoder", "embeddings")?);
        if e != d {
            return Err(format!("the encoder's embedding scale {e:?} and the decoder's {d:?} differ (not supported)"));
        }
        Ok(e)
    }

    /// Our tensors, and the int8 weights as stored.
    fn tensors(&mut self, s: &Shape, c: &ModelConfig, setup: &VocabSetup) -> Parse<(TensorMap, Option<StoredInt8>)> {
        let mut t = TensorMap::new();
        let mut int8 = StoredInt8::default();
        let d = s.d_model;
        let ids = &setup.ids;
        // The token table: one for both stacks.
        let dec = self.weight("decoder/embeddings/weight", &[s.vocab, d])?;
        let enc = self.weight("encoder/embeddings_0/weight", &[s.vocab, d])?;
        if enc.0 != dec.0 {
            return Err("encoder/embeddings_0/weight differs from decoder/embeddings/weight: separate source and target embeddings are not supported".into());
        }
        if self.bin.has("encoder/embeddings_1/weight") {
            return Err("encoder/embeddings_1: source features (several source embeddings) are not supported".into());
        }
        let mut table = ids.reorder_rows(&dec.0, d, 0.0);
        if setup.zero_start {
            table[crate::text::BOS as usize * d..(crate::text::BOS as usize + 1) * d].fill(0.0);
        }
        t.insert("embedding.weight".into(), (vec![ids.len_ours(), d], table));
        let proj = self.weight("decoder/projection/weight", &[s.vocab, d])?;
        if let Some(q) = &proj.1 {
            int8.head = Some(q.reordered(ids, d));
        }
        if !s.tied {
            t.insert("output_proj.weight".into(), (vec![ids.len_ours(), d], ids.reorder_rows(&proj.0, d, 0.0)));
        }
        let bias = match self.take("decoder/projection/bias") {
            Some(b) => b.to_f32(),
            None => vec![0.0; s.vocab],
        };
        if bias.len() != s.vocab {
            return Err(format!("decoder/projection/bias has {} values, not {}", bias.len(), s.vocab));
        }
        t.insert("output_proj.bias".into(), (vec![ids.len_ours()], ids.logit_bias(&bias)));
        // Positions: one table for both stacks.
        let positions = match s.positions {
            Some(n) => {
                let e = self.weight("encoder/position_encodings/encodings", &[n, d])?.0;
                let p = self.weight("decoder/position_encodings/encodings", &[n, d])?.0;
                if e != p {
                    return Err("the encoder's and the decoder's position_encodings differ (not supported)".into());
                }
                p
            }
            None => ct2_sinusoids(c.max_len, d),
        };
        t.insert("embedding.positions".into(), (vec![c.max_len, d], positions));
        for (stack, n) in [("encoder", s.encoder_layers), ("decoder", s.decoder_layers)] {
            for i in 0..n {
                self.layer(&mut t, &mut int8, s, stack, i)?;
            }
            if s.pre_norm {
                self.norm(&mut t, &format!("{stack}/layer_norm"), &format!("{stack}.final_norm"), d)?;
            } else if self.bin.has(&format!("{stack}/layer_norm/gamma")) {
                return Err(format!("{stack}/layer_norm: a final norm after post-norm layers is not supported"));
            }
        }
        Ok((t, int8.is_some().then_some(int8)))
    }

    /// One layer's tensors (see the module docs for the names).
    fn layer(&mut self, t: &mut TensorMap, int8: &mut StoredInt8, s: &Shape, stack: &str, i: usize) -> Parse<()> {
        let (d, ours) = (s.d_model, format!("{stack}.layers.{i}"));
        let scope = format!("{stack}/layer_{i}");
        self.norm(t, &format!("{scope}/self_attention/layer_norm"), &format!("{ours}.self_attn_norm"), d)?;
        let self_attn = [("q_proj", 0), ("k_proj", 1), ("v_proj", 2)];
        self.linear(t, int8, s, &format!("{scope}/self_attention/linear_0"), &format!("{ours}.self_attn"), &self_attn)?;
        self.linear(t, int8, s, &format!("{scope}/self_attention/linear_1"), &format!("{ours}.self_attn"), &[("out_proj", 0)])?;
        if stack == "decoder" {
            self.norm(t, &format!("{scope}/attention/layer_norm"), &format!("{ours}.cross_attn_norm"), d)?;
            let a = format!("{scope}/attention");
            self.linear(t, int8, s, &format!("{a}/linear_0"), &format!("{ours}.cross_attn"), &[("q_proj", 0)])?;
            self.linear(t, int8, s, &format!("{a}/linear_1"), &format!("{ours}.cross_attn"), &[("k_proj", 0), ("v_proj", 1)])?;
            self.linear(t, int8, s, &format!("{a}/linear_2"), &format!("{ours}.cross_attn"), &[("out_proj", 0)])?;
        }
        self.norm(t, &format!("{scope}/ffn/layer_norm"), &format!("{ours}.ffn_norm"), d)?;
        self.linear(t, int8, s, &format!("{scope}/ffn/linear_0"), &format!("{ours}.ffn"), &[("linear1", 0)])?;
        self.linear(t, int8, s, &format!("{scope}/ffn/linear_1"), &format!("{ours}.ffn"), &[("linear2", 0)])?;
        Ok(())
    }

    /// A layer norm (`gamma`, `beta`; RMSNorm, without `beta`, is refused).
    fn norm(&mut self, t: &mut TensorMap, scope: &str, ours: &str, d: usize) -> Parse<()> {
        let gamma = self.weight(&format!("{scope}/gamma"), &[d])?.0;
        if !self.bin.has(&format!("{scope}/beta")) {
            return Err(format!("{scope} has no beta: RMSNorm is not supported"));
        }
        let beta = self.weight(&format!("{scope}/beta"), &[d])?.0;
        t.insert(format!("{ours}.weight"), (vec![d], gamma));
        t.insert(format!("{ours}.bias"), (vec![d], beta));
        Ok(())
    }

    /// A linear layer `scope` (`weight`, optional `bias`), its rows split in equal parts onto
    /// our layers `ours.{part}` (the fused projections).
    fn linear(&mut self, t: &mut TensorMap, int8: &mut StoredInt8, s: &Shape, scope: &str, ours: &str, parts: &[(&str, usize)]) -> Parse<()> {
        let name = format!("{scope}/weight");
        let v = self.bin.get(&name).ok_or_else(|| format!("no {name}"))?;
        let [rows, cols] = v.shape[..] else { return Err(format!("{name} has shape {:?}, not a matrix", v.shape)) };
        let (w, q) = self.weight(&name, &[rows, cols])?;
        let b = match self.take(&format!("{scope}/bias")) {
            Some(b) if b.elements() == rows => b.to_f32(),
            Some(b) => return Err(format!("{scope}/bias has {} values, not {rows}", b.elements())),
            None => vec![0.0; rows],
        };
        let part = rows / parts.len();
        if part * parts.len() != rows {
            return Err(format!("{name} has {rows} rows, not {} equal parts", parts.len()));
        }
        for &(p, k) in parts {
            let name = format!("{ours}.{p}");
            t.insert(format!("{name}.weight"), (vec![part, cols], w[k * part * cols..(k + 1) * part * cols].to_vec()));
            if s.bias {
                t.insert(format!("{name}.bias"), (vec![part], b[k * part..(k + 1) * part].to_vec()));
            } else if b.iter().any(|&x| x != 0.0) {
                return Err(format!("{scope}/bias is set where other layers have none"));
            }
            if let Some(q) = &q {
                int8.linears.push((name, q.rows(k * part..(k + 1) * part)));
            }
        }
        Ok(())
    }

    /// A weight of shape `shape` as f32 (widened, or dequantised `q / scale` per row), and
    /// its int8 rows when stored as int8.
    fn weight(&mut self, name: &str, shape: &[usize]) -> Parse<(Vec<f32>, Option<super::ctranslate2_int8::Rows>)> {
        let v = self.take(name).ok_or_else(|| format!("no {name}"))?.clone();
        if v.shape != shape {
            return Err(format!("{name} has shape {:?}, not {shape:?}", v.shape));
        }
        match v.dtype {
            Dtype::F32 | Dtype::F16 | Dtype::Bf16 => Ok((v.to_f32(), None)),
            Dtype::I8 | Dtype::I16 => {
                let scale = self.scale_of(name)?;
                super::ctranslate2_int8::dequantise(name, &v, &scale)
            }
            Dtype::I32 => Err(format!("{name} is int32, not a weight type")),
        }
    }

    /// The `weight_scale` of a quantised weight (through the alias it was stored under).
    fn scale_of(&mut self, name: &str) -> Parse<Vec<f32>> {
        let own = format!("{name}_scale");
        let via = self.bin.aliases.get(name).map(|t| format!("{t}_scale"));
        let found = [Some(own), via].into_iter().flatten().find(|n| self.bin.has(n));
        let found = found.ok_or_else(|| format!("{name} is quantised but has no {name}_scale"))?;
        Ok(self.take(&found).expect("present").to_f32())
    }
}
