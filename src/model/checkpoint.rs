//! Model directories: `config.json` and `model.safetensors` (see [`crate::store`]), saved from and
//! loaded into our models through one walk over their named parameters
//! ([`Module::visit`]), every tensor's name and shape checked.
//!
//! One loader serves every model: [`load`] for our own directories (tensor names are our module
//! paths), and [`fill_params`] with a [`RenameTable`] for imported layouts, whose tensor names
//! are mapped onto ours by an explicit table (BERT today, see `super::bert`). The weights in a
//! file are counted against the parameter count the config implies ([`count_params`] on a model
//! built with [`ShapesOnly`]) before anything is allocated, so an edited config cannot ask for
//! terabytes; a missing, unexpected or misshapen tensor is named, and so is a tensor that holds
//! a value that is not finite.
//!
//! Saving goes through [`crate::store::CheckpointWriter`] (all or nothing, see
//! [`crate::store::atomic`]) and refuses weights that are not finite, so a diverged run never
//! replaces a good checkpoint; reading goes through [`crate::store::read_file`], which checks
//! each file against the directory's manifest.

use super::param::{count_params, Init, Module, Param, ShapesOnly, Unfilled};
use super::{LanguageModel, ModelConfig, Seq2Seq};
use crate::error::{Error, Result};
use crate::store::{
    ckpt_err, read_file, read_tensors, strip_bom, tensors_to_bytes, CheckpointWriter, CONFIG_FILE,
    MODEL_FILE, TOKENIZER_FILE, VOCAB_FILE,
};
use crate::Tensor;
use rayon::prelude::*;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::HashMap;
use std::path::Path;

/// A model kept in a directory of ours: its config (`config.json`), how it is built from it,
/// and its parameters (the [`Module`] walk gives their names and order).
pub trait Model: Module<f32> + Sized {
    type Config: Clone;
    /// The model's config.
    fn config(&self) -> &Self::Config;
    /// Checks a config read from a directory; the message names the offending field.
    fn check_config(config: &Self::Config) -> std::result::Result<(), String>;
    /// When the directory `dir` with this config holds another kind of model (a language
    /// model given where a translation model is wanted, ...): what it is and what to use.
    fn other_kind(_config: &Self::Config, _dir: &Path) -> Option<String> {
        None
    }
    /// When a `config.json` this model cannot parse is recognisably another kind of model
    /// (its JSON given): what it is and what to use, for the error message.
    fn foreign_config(json: &serde_json::Value) -> Option<String> {
        let kind = json.get("model_type")?.as_str()?;
        use super::families::{hf_list, FamilyKind};
        Some(format!(
            "a Hugging Face model (model_type {kind:?}), not one of this command's models; \
             generate, chat and perplexity load Hugging Face {} decoders, embed loads {} \
             encoders",
            hf_list(FamilyKind::Decoder),
            hf_list(FamilyKind::Encoder)
        ))
    }
    /// A model of this shape, parameters drawn from `init` (random, or shapes only).
    fn build(config: Self::Config, init: &mut impl Init) -> Self;
}

impl Model for Seq2Seq<f32> {
    type Config = ModelConfig;
    fn config(&self) -> &ModelConfig {
        &self.config
    }
    fn check_config(config: &ModelConfig) -> std::result::Result<(), String> {
        config.validate()
    }
    fn other_kind(config: &ModelConfig, dir: &Path) -> Option<String> {
        let lm = config.n_encoder_layers == 0
            && dir.join(TOKENIZER_FILE).is_file()
            && !dir.join(VOCAB_FILE).exists();
        lm.then(|| {
            "a language model directory (train-lm: no encoder, tokenizer.json and no \
             vocab.json), not a translation model; use generate or perplexity with it, or \
             train-lm --resume"
                .to_string()
        })
    }
    fn build(config: ModelConfig, init: &mut impl Init) -> Self {
        Seq2Seq::new(config, init)
    }
}

impl Model for LanguageModel<f32> {
    type Config = ModelConfig;
    fn config(&self) -> &ModelConfig {
        &self.config
    }
    fn check_config(config: &ModelConfig) -> std::result::Result<(), String> {
        config.validate()?;
        if config.n_encoder_layers != 0 {
            return Err(format!(
                "n_encoder_layers is {}: a translation (encoder-decoder) model directory, \
                 not a language model; use translate, score or attention with it, or train \
                 --resume",
                config.n_encoder_layers
            ));
        }
        Ok(())
    }
    fn build(config: ModelConfig, init: &mut impl Init) -> Self {
        LanguageModel::new(config, init)
    }
}

/// Saves the model's `config.json` and `model.safetensors` as the checkpoint of `dir` (created
/// if needed), all or nothing; see [`write_model`].
// Used outside the library only (feature `internals`).
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub fn save<M: Model>(dir: &Path, model: &mut M) -> Result<()>
where
    M::Config: Serialize,
{
    let mut writer = CheckpointWriter::begin(dir)?;
    write_model(&mut writer, model)?;
    writer.commit()
}

/// Stages the model's `config.json` and `model.safetensors` in a save; refuses (saving
/// nothing) a parameter that holds a value that is not finite, or no values at all (released
/// to inference, `Seq2Seq::prepare_alone`), naming it.
pub fn write_model<M: Model>(writer: &mut CheckpointWriter, model: &mut M) -> Result<()>
where
    M::Config: Serialize,
{
    let path = writer.dir().join(MODEL_FILE);
    let params = model.named_params("");
    let held = |p: &Param<f32>| p.value.data.len() == p.value.shape.iter().product::<usize>();
    if let Some((name, _)) = params.iter().find(|(_, p)| !held(p)) {
        return Err(ckpt_err(
            &path,
            format!(
                "parameter {name} holds no float32 values (its weight was released for \
                 inference, or is held in a GGUF file's blocks): this model cannot be saved"
            ),
        ));
    }
    check_finite(
        &path,
        params.iter().map(|(n, p)| (n.as_str(), &p.value.data[..])),
    )?;
    let tensors: Vec<(String, Vec<usize>, &[f32])> = params
        .iter()
        .map(|(n, p)| (n.clone(), p.value.shape.clone(), &p.value.data[..]))
        .collect();
    let bytes = tensors_to_bytes(&tensors, &path)?;
    let config = serde_json::to_string_pretty(model.config()).expect("config serialises");
    writer.add(CONFIG_FILE, config.as_bytes())?;
    writer.add(MODEL_FILE, &bytes)
}

/// Refuses (for saving at `path`) the first tensor that holds NaN or an infinity, naming it:
/// a diverged run must not replace its last good checkpoint.
pub fn check_finite<'a>(
    path: &Path,
    tensors: impl IntoIterator<Item = (&'a str, &'a [f32])>,
) -> Result<()> {
    for (name, values) in tensors {
        if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(Error::NotFinite {
                path: path.to_path_buf(),
                tensor: name.to_string(),
                index: i,
                value: *v,
            });
        }
    }
    Ok(())
}

/// Reads `config.json` from `dir` and checks it for `M`.
pub fn load_config_of<M: Model>(dir: &Path) -> Result<M::Config>
where
    M::Config: DeserializeOwned,
{
    let path = dir.join(CONFIG_FILE);
    let bytes = read_file(&path)?;
    parse_config::<M>(&bytes, &path, Some(dir))
}

/// Parses and checks the `config.json` bytes of `M` read from `path` (a leading UTF-8 byte
/// order mark is accepted); `dir`, when given, is looked at to say which kind of model it holds
/// when the config is not one of `M`.
pub fn parse_config<M: Model>(bytes: &[u8], path: &Path, dir: Option<&Path>) -> Result<M::Config>
where
    M::Config: DeserializeOwned,
{
    let config: M::Config = serde_json::from_slice(strip_bom(bytes)).map_err(|e| {
        let foreign = serde_json::from_slice::<serde_json::Value>(strip_bom(bytes))
            .ok()
            .and_then(|json| M::foreign_config(&json));
        ckpt_err(
            path,
            foreign.unwrap_or_else(|| format!("invalid model config: {e}")),
        )
    })?;
    if let Some(other) = dir.and_then(|d| M::other_kind(&config, d)) {
        let dir = dir.expect("checked");
        return Err(Error::Input(format!("{} is {other}", dir.display())));
    }
    M::check_config(&config).map_err(|e| ckpt_err(path, e))?;
    Ok(config)
}

/// Loads a model saved by [`save`]: the weights must match the config in count (checked before
/// allocating), names and shapes.
pub fn load<M: Model>(dir: &Path) -> Result<M>
where
    M::Config: DeserializeOwned,
{
    let config = load_config_of::<M>(dir)?;
    let path = dir.join(MODEL_FILE);
    let map = read_tensors(&path)?;
    build_filled(&path, config, map, None)
}

/// [`load`] from the bytes of `config.json` and `model.safetensors` (as read from `dir`, which
/// errors name): what [`load`] does once the files are read.
// Used outside the library only (feature `internals`).
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub fn load_bytes<M: Model>(config: &[u8], weights: &[u8], dir: &Path) -> Result<M>
where
    M::Config: DeserializeOwned,
{
    let config = parse_config::<M>(config, &dir.join(CONFIG_FILE), None)?;
    let path = dir.join(MODEL_FILE);
    let map = crate::store::parse_tensors(weights, &path, |_| false)?;
    build_filled(&path, config, map, None)
}

/// The values of a tensor on their way into a parameter: decoded already (`Vec<f32>`), or
/// decoded on demand straight into the parameter (a quantised GGUF tensor), so a loader never
/// holds every tensor twice.
pub trait TensorValues {
    /// Number of values.
    fn n_values(&self) -> usize;
    /// Writes the values into `out` (`n_values()` long).
    fn write_into(self, out: &mut [f32]) -> Result<()>;
    /// Whether the parameter stays without float32 values because the model multiplies the
    /// tensor in its stored format (a GGUF file's blocks, see
    /// [`super::families::load_gguf`]); its shape is still checked.
    fn stays_packed(&self) -> bool {
        false
    }
    /// The values as a vector of their own, when they are one already: moved into the
    /// parameter rather than copied into a new one (`Err(self)`: written by
    /// [`TensorValues::write_into`]).
    fn into_vec(self) -> std::result::Result<Vec<f32>, Self>
    where
        Self: Sized,
    {
        Err(self)
    }
}

impl TensorValues for Vec<f32> {
    fn n_values(&self) -> usize {
        self.len()
    }
    fn write_into(self, out: &mut [f32]) -> Result<()> {
        out.copy_from_slice(&self);
        Ok(())
    }
    fn into_vec(self) -> std::result::Result<Vec<f32>, Self> {
        Ok(self)
    }
}

/// Builds the model `config` describes and fills it from `map` (name -> (shape, values)): the
/// weights are counted against the config first, then each parameter takes the tensor of its
/// name (through `rename` for imported layouts), and tensors no parameter took are an error.
pub fn build_filled<M: Model, V: TensorValues>(
    path: &Path,
    config: M::Config,
    map: HashMap<String, (Vec<usize>, V)>,
    rename: Option<&RenameTable>,
) -> Result<M> {
    let mut map = match rename {
        Some(table) => table.import_map(path, map)?,
        None => map
            .into_iter()
            .map(|(name, t)| (name.clone(), (name, t)))
            .collect(),
    };
    // Compare names, shapes and sizes before allocating: a config edited to huge sizes is an
    // error, not an OOM; a missing or unexpected tensor is named.
    let mut shapes_only = M::build(config.clone(), &mut ShapesOnly);
    let expected = count_params(&mut shapes_only);
    let in_file: usize = map
        .values()
        .fold(0usize, |n, (_, (_, v))| n.saturating_add(v.n_values()));
    if expected != Some(in_file) {
        let wanted: Vec<(String, Vec<usize>)> = shapes_only
            .named_params("")
            .into_iter()
            .map(|(n, p)| (n, p.value.shape.clone()))
            .collect();
        let mut details = Vec::new();
        let named = |ours: &str| {
            rename
                .and_then(|t| t.export(ours))
                .unwrap_or_else(|| ours.to_string())
        };
        let missing: Vec<String> = wanted
            .iter()
            .filter(|(n, _)| !map.contains_key(n))
            .map(|(n, _)| named(n))
            .collect();
        if !missing.is_empty() {
            details.push(format!("missing tensors: {}", first_few(&missing)));
        }
        let mut extra: Vec<String> = map
            .iter()
            .filter(|(n, _)| !wanted.iter().any(|(w, _)| w == *n))
            .map(|(_, (theirs, _))| theirs.clone())
            .collect();
        extra.sort();
        if !extra.is_empty() {
            details.push(format!("unexpected tensors: {}", first_few(&extra)));
        }
        if let Some((shape, (theirs, (got, _)))) = wanted
            .iter()
            .find_map(|(n, s)| map.get(n).filter(|(_, (g, _))| g != s).map(|t| (s, t)))
        {
            details.push(format!(
                "tensor {theirs} has shape {got:?} but the config needs {shape:?}"
            ));
        }
        return Err(ckpt_err(
            path,
            format!(
                "holds {in_file} weights but config.json implies {} (config.json does not match the weights{})",
                expected.map_or("too many".to_string(), |n| n.to_string()),
                if details.is_empty() {
                    String::new()
                } else {
                    format!(": {}", details.join("; "))
                }
            ),
        ));
    }
    drop(shapes_only);
    let mut model = M::build(config, &mut Unfilled);
    fill_params(path, &mut model.named_params(""), &mut map, rename)?;
    if let Some(extra) = map.values().map(|(name, _)| name).min() {
        return Err(ckpt_err(
            path,
            format!("unexpected tensor {extra} (config.json does not match the weights)"),
        ));
    }
    Ok(model)
}

/// Tensors by our parameter name: `(name in the file, (shape, values))`.
pub type NamedTensors<V = Vec<f32>> = HashMap<String, (String, (Vec<usize>, V))>;

/// Writes the tensor of each parameter's name from `map` into its value, checking shapes
/// (errors name the tensor as the file names it, through `rename` for imported layouts). A
/// parameter built without values ([`Unfilled`]) is allocated here, value and (zero) gradient,
/// unless its tensor [stays packed](TensorValues::stays_packed).
pub fn fill_params<V: TensorValues>(
    path: &Path,
    params: &mut [(String, &mut Param<f32>)],
    map: &mut NamedTensors<V>,
    rename: Option<&RenameTable>,
) -> Result<()> {
    for (key, p) in params.iter_mut() {
        let (name, (shape, values)) = map.remove(key.as_str()).ok_or_else(|| {
            let theirs = rename.and_then(|t| t.export(key));
            ckpt_err(
                path,
                format!("missing tensor {}", theirs.as_deref().unwrap_or(key)),
            )
        })?;
        if shape != p.value.shape {
            return Err(ckpt_err(
                path,
                format!(
                    "tensor {name} has shape {shape:?} but the config needs {:?} (config.json does not match the weights)",
                    p.value.shape
                ),
            ));
        }
        if values.stays_packed() {
            continue;
        }
        let numel = shape.iter().product::<usize>();
        match values.into_vec() {
            // An unfilled parameter takes a vector of its size as it is (no copy).
            Ok(data) if p.value.data.is_empty() && data.len() == numel => {
                **p = Param::new(Tensor { data, shape });
            }
            Ok(data) => fill_from(p, &shape, data)?,
            Err(values) => fill_from(p, &shape, values)?,
        }
        let data = &p.value.data;
        // Checked over the thread pool (a 1B model holds 1.2 billion values); the first bad
        // value's index is then found in order.
        let finite = data.par_chunks(1 << 16).all(|c| c.iter().all(|v| v.is_finite()));
        if let Some((i, v)) = (!finite)
            .then(|| data.iter().enumerate().find(|(_, v)| !v.is_finite()))
            .flatten()
        {
            return Err(ckpt_err(
                path,
                format!(
                    "tensor {name} holds {v} at index {i}: the weights are not finite (saved by a run that diverged?)"
                ),
            ));
        }
    }
    Ok(())
}

/// Writes `values` into `p`, allocating its values first when it has none (`shape`).
fn fill_from(p: &mut Param<f32>, shape: &[usize], values: impl TensorValues) -> Result<()> {
    if p.value.data.is_empty() {
        *p = Param::new(Tensor::zeros(shape));
    }
    values.write_into(&mut p.value.data)
}

/// The first five of `names`, and how many more.
fn first_few(names: &[String]) -> String {
    let mut s = names.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > 5 {
        s.push_str(&format!(" and {} more", names.len() - 5));
    }
    s
}

/// How an imported checkpoint's tensor names map onto our module paths: `(theirs, ours)` name
/// prefixes, where `{i}` stands for a layer number and `{e}` for an expert's, e.g.
/// `("encoder.layer.{i}.attention.self.query.", "layers.{i}.self_attn.q_proj.")`, in groups
/// ([`Renames`]: a family's table is the groups it shares with others plus its own, e.g. Llama's
/// attention, norms and FFN with Qwen3's query/key norms). The first matching rule wins, group
/// by group in order; the rest of the name (`weight`, `bias`) is kept.
#[derive(Clone, Copy, Debug)]
pub struct RenameTable(pub &'static [Renames]);

/// One group of a [`RenameTable`]'s `(theirs, ours)` rules.
pub type Renames = &'static [(&'static str, &'static str)];

/// `name` with the prefix `pattern` (which may hold a `{i}` and an `{e}`) replaced by `to`
/// (with the same numbers), or `None` when it does not match.
fn replace_prefix(name: &str, pattern: &str, to: &str) -> Option<String> {
    let (mut rest, mut pattern, mut to) = (name, pattern, to.to_string());
    loop {
        // The next placeholder: `{i}` (a layer) or `{e}` (an expert), each a run of digits.
        let next = ["{i}", "{e}"]
            .into_iter()
            .filter_map(|p| pattern.find(p).map(|at| (at, p)))
            .min();
        let Some((at, placeholder)) = next else {
            return rest
                .strip_prefix(pattern)
                .map(|tail| format!("{to}{tail}"));
        };
        rest = rest.strip_prefix(&pattern[..at])?;
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return None;
        }
        let (n, tail) = rest.split_at(digits);
        to = to.replace(placeholder, n);
        (rest, pattern) = (tail, &pattern[at + placeholder.len()..]);
    }
}

impl RenameTable {
    /// Every `(theirs, ours)` rule, group by group in order.
    pub fn rules(&self) -> impl Iterator<Item = &'static (&'static str, &'static str)> {
        self.0.iter().flat_map(|group| group.iter())
    }

    /// Our name for a tensor of the imported layout.
    pub fn import(&self, theirs: &str) -> Option<String> {
        self.rules()
            .find_map(|(from, to)| replace_prefix(theirs, from, to))
    }

    /// The imported layout's name for one of our parameters.
    pub fn export(&self, ours: &str) -> Option<String> {
        self.rules()
            .find_map(|(from, to)| replace_prefix(ours, to, from))
    }

    /// `map` keyed by our names; a tensor the table does not know, or two tensors that map to
    /// one name, is an error naming it.
    pub fn import_map<V>(
        &self,
        path: &Path,
        map: HashMap<String, (Vec<usize>, V)>,
    ) -> Result<NamedTensors<V>> {
        let mut out = NamedTensors::<V>::new();
        let mut names: Vec<&String> = map.keys().collect();
        names.sort();
        for name in names {
            if self.import(name).is_none() {
                return Err(ckpt_err(
                    path,
                    format!("unexpected tensor {name} (not a parameter of this model)"),
                ));
            }
        }
        for (name, t) in map {
            let ours = self.import(&name).expect("checked above");
            if let Some((first, _)) = out.insert(ours.clone(), (name, t)) {
                return Err(ckpt_err(
                    path,
                    format!("tensor {ours} appears twice ({first})"),
                ));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: RenameTable = RenameTable(&[&[
        ("embeddings.LayerNorm.", "embeddings_norm."),
        (
            "encoder.layer.{i}.attention.self.query.",
            "layers.{i}.self_attn.q_proj.",
        ),
    ]]);

    #[test]
    fn rename_tables_map_both_ways() {
        assert_eq!(
            TABLE
                .import("encoder.layer.11.attention.self.query.weight")
                .as_deref(),
            Some("layers.11.self_attn.q_proj.weight")
        );
        assert_eq!(
            TABLE.export("layers.3.self_attn.q_proj.bias").as_deref(),
            Some("encoder.layer.3.attention.self.query.bias")
        );
        assert_eq!(
            TABLE.import("embeddings.LayerNorm.weight").as_deref(),
            Some("embeddings_norm.weight")
        );
        assert_eq!(
            TABLE.import("encoder.layer.x.attention.self.query.weight"),
            None
        );
        assert_eq!(
            TABLE.import("encoder.layer.1.attention.self.key.weight"),
            None
        );
        assert_eq!(TABLE.import("pooler.dense.weight"), None);
        // A layer's and an expert's number in one name, both ways.
        let experts = RenameTable(&[&[(
            "model.layers.{i}.mlp.experts.{e}.up_proj.",
            "layers.{i}.ffn.experts.{e}.linear1.",
        )]]);
        assert_eq!(
            experts
                .import("model.layers.12.mlp.experts.7.up_proj.weight")
                .as_deref(),
            Some("layers.12.ffn.experts.7.linear1.weight")
        );
        assert_eq!(
            experts
                .export("layers.0.ffn.experts.63.linear1.weight")
                .as_deref(),
            Some("model.layers.0.mlp.experts.63.up_proj.weight")
        );
        assert_eq!(
            experts.import("model.layers.1.mlp.experts.x.up_proj.weight"),
            None
        );
        // A table of groups: a later group's rules are found, an earlier group's rule wins
        // where two match, both ways.
        const GROUPS: RenameTable = RenameTable(&[
            &[("h.{i}.attn.q.", "layers.{i}.q_norm.")],
            &[("h.{i}.attn.", "layers.{i}.attn."), ("wte.", "embedding.")],
        ]);
        assert_eq!(GROUPS.rules().count(), 3);
        assert_eq!(
            GROUPS.import("h.2.attn.q.weight").as_deref(),
            Some("layers.2.q_norm.weight")
        );
        assert_eq!(
            GROUPS.import("h.2.attn.k.weight").as_deref(),
            Some("layers.2.attn.k.weight")
        );
        assert_eq!(
            GROUPS.export("embedding.weight").as_deref(),
            Some("wte.weight")
        );
        assert_eq!(
            GROUPS.export("layers.0.q_norm.weight").as_deref(),
            Some("h.0.attn.q.weight")
        );
    }
}
