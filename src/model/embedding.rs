//! Input embeddings: `x = E[token] · √d_model + PE(pos)`, then dropout on the sum (the paper's
//! scale; GPT-2 and Llama add their table unscaled: [`Embedding::unscaled`]).
//!
//! `PE` depends on [`Positions`]:
//! - `Sinusoidal`, the paper's encoding (section 3.5):
//!   `PE(pos, 2i) = sin(pos / 10000^(2i/d_model))`, `PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))`;
//! - `SinusoidalHalves`, Marian's layout of the same waves: `PE(pos, i) = sin(pos / 10000^(2i/d))`
//!   and `PE(pos, ⌈d/2⌉ + i) = cos(pos / 10000^(2i/d))`;
//! - `Learned`: row `pos` of a trained table `P [max_len, d_model]` (parameter
//!   `embedding.positions`), Xavier-uniform initialised like BERT's tables in `bert.rs`
//!   (fan_in = max_len, fan_out = d_model); the backward accumulates `dP[pos] += dx`;
//! - `Rotary`: nothing is added here; positions enter the self-attentions (`kernels::rope`).
//!
//! One table `E [vocab, d_model]` (and `P`) is shared by the encoder, the decoder and (tied) the
//! pre-softmax projection. mBART and BART give each stack ([`Side`]) its own input: the decoder
//! its own learned table `P_tgt` (`embedding.target_positions`), and each side a norm of the
//! sum before the dropout (`layernorm_embedding`: `x = Norm(E[token] · s + P(pos))`, parameters
//! `embedding.norm` and `embedding.target_norm`).

use super::config::Positions;
use super::norm::{Norm, NormStats};
use super::param::{Init, Module, Param, ParamVisitor};
use crate::backend::{
    Backend, GgmlType, PackedWeight, Precision, RawBytes, WeightRef, WeightSource, CPU,
};
use crate::rng::Rng;
use crate::Float;

/// Inference only: the token table as a GGUF file stores it (`[vocab]` rows of ggml blocks),
/// each row dequantised when its token is looked up, so that no float32 table is kept (see
/// [`Embedding::set_stored_rows`]).
#[derive(Clone, Debug)]
pub struct StoredRows {
    ty: GgmlType,
    row_bytes: usize,
    /// `[vocab, row_bytes]`, read where the file stores them (its map, shared, not copied).
    data: RawBytes,
}

/// The form a table released to inference is held in (see [`Embedding::hold_alone`]).
#[derive(Clone, Debug)]
enum TableForm<T> {
    /// The float32 values of `weight` (or its stored GGUF rows).
    Values,
    /// `Eᵀ [d_model, vocab]`, as the backend's `transpose_weight` lays it out.
    Transposed(Vec<T>),
    /// The rows packed (int8 `s_o · q_ok`, as CTranslate2 keeps an int8 embedding; bf16).
    Packed(PackedWeight),
}

/// The sinusoidal encoding of position `pos` in dimension `dim` of a `d_model`-wide model.
pub fn sinusoid(pos: usize, dim: usize, d_model: usize) -> f64 {
    let i2 = (dim - dim % 2) as f64;
    let angle = pos as f64 / 10000f64.powf(i2 / d_model as f64);
    if dim.is_multiple_of(2) {
        angle.sin()
    } else {
        angle.cos()
    }
}

/// Marian's layout of the same sinusoids: the sines of the `⌈d/2⌉` frequencies in the first
/// columns, their cosines after them (`PE(pos, i) = sin(pos / 10000^(2i/d))`,
/// `PE(pos, ⌈d/2⌉ + i) = cos(pos / 10000^(2i/d))`).
pub fn sinusoid_halves(pos: usize, dim: usize, d_model: usize) -> f64 {
    let sines = d_model.div_ceil(2);
    let (i, sine) = if dim < sines {
        (dim, true)
    } else {
        (dim - sines, false)
    };
    let angle = pos as f64 / 10000f64.powf((2 * i) as f64 / d_model as f64);
    if sine {
        angle.sin()
    } else {
        angle.cos()
    }
}

/// The sinusoid of a layout (`None`: positions that are not sinusoids).
fn sinusoid_of(kind: Positions) -> Option<fn(usize, usize, usize) -> f64> {
    match kind {
        Positions::Sinusoidal => Some(sinusoid),
        Positions::SinusoidalHalves => Some(sinusoid_halves),
        Positions::Learned | Positions::Rotary | Positions::Relative => None,
    }
}

/// The most positions of the precomputed sinusoid table (4 MiB of f32 at d_model 128);
/// positions past it are computed per token.
pub const SINUSOID_TABLE_ROWS: usize = 8192;

/// The token embedding table with positions added.
#[derive(Clone, Debug)]
pub struct Embedding<T> {
    /// E [vocab, d_model]
    pub weight: Param<T>,
    pub d_model: usize,
    /// How positions are encoded.
    pub kind: Positions,
    /// P [max_len, d_model], trained (`Positions::Learned` only).
    pub positions: Option<Param<T>>,
    /// PE [min(max_len, SINUSOID_TABLE_ROWS), d_model], precomputed in f64 and rounded once
    /// (`Positions::Sinusoidal` only, empty otherwise); rows past it are computed when used,
    /// the same values (a long context allocates no table of its length).
    sinusoids: Vec<T>,
    max_len: usize,
    /// Multiply the token embedding by √d_model (section 3.4); false for GPT-2 and Llama.
    pub scaled: bool,
    /// The factor of the token embedding when a config states one (`embedding_scale`),
    /// instead of √d_model or 1.
    pub scale_override: Option<f64>,
    /// Inference only: the table in its stored blocks, `weight` then without values.
    stored: Option<StoredRows>,
    /// Inference only: the table's one form once its float32 values were released
    /// ([`Embedding::hold_alone`]): `Eᵀ` (in panels for a vocabulary) or its packed rows, which
    /// lookups read rows from and the tied output projection multiplies.
    alone: TableForm<T>,
    /// P_tgt [max_len, d_model]: the decoder's own learned positions (mBART, BART); `None`:
    /// the decoder adds [`positions`](Self::positions) too.
    pub target_positions: Option<Param<T>>,
    /// The norm of the source's (or a decoder-only model's) embedded input (mBART, BART).
    pub norm: Option<Norm<T>>,
    /// The norm of the target's embedded input (mBART, BART).
    pub target_norm: Option<Norm<T>>,
}

/// Which stack an embedded sequence enters: the encoder's source, or the decoder's target
/// (decoder-only models embed as the source).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Source,
    Target,
}

/// What the embedding forward keeps: the tokens, their positions and the dropout mask.
#[derive(Clone, Debug)]
pub struct EmbeddingCache<T> {
    pub tokens: Vec<u32>,
    pub dropout_mask: Option<Vec<T>>,
    /// Row `r` was at position `pos_offset + r % seq_len`.
    pub seq_len: usize,
    pub pos_offset: usize,
    /// The side whose positions and norm the rows took.
    pub side: Side,
    /// The side's norm's input and statistics, where it has one.
    pub norm_input: Option<(Vec<T>, NormStats<T>)>,
}

impl<T: Float> Embedding<T> {
    /// Xavier-uniform table (fan_in = vocab, fan_out = d_model), sinusoidal positions.
    pub fn new(vocab: usize, d_model: usize, max_len: usize, init: &mut impl Init) -> Self {
        Self::with_positions(vocab, d_model, max_len, Positions::Sinusoidal, init)
    }

    /// Xavier-uniform token table, then (learned positions) the Xavier-uniform position table
    /// (fan_in = max_len, fan_out = d_model), drawn in that order from `rng`.
    pub fn with_positions(
        vocab: usize,
        d_model: usize,
        max_len: usize,
        kind: Positions,
        init: &mut impl Init,
    ) -> Self {
        let weight = init.xavier(&[vocab, d_model], vocab, d_model);
        let mut sinusoids = Vec::new();
        if let Some(wave) = sinusoid_of(kind).filter(|_| init.computes()) {
            let rows = max_len.min(SINUSOID_TABLE_ROWS);
            sinusoids = vec![T::zero(); rows * d_model];
            for pos in 0..rows {
                for dim in 0..d_model {
                    sinusoids[pos * d_model + dim] = T::of(wave(pos, dim, d_model));
                }
            }
        }
        let positions = (kind == Positions::Learned)
            .then(|| init.xavier(&[max_len, d_model], max_len, d_model));
        Embedding {
            weight,
            d_model,
            kind,
            positions,
            sinusoids,
            max_len,
            scaled: true,
            scale_override: None,
            stored: None,
            alone: TableForm::Values,
            target_positions: None,
            norm: None,
            target_norm: None,
        }
    }

    /// Looks the tokens up in `data` (`[vocab, d_model]` of ggml `ty`, as a GGUF file stores
    /// the table) from now on, and drops the float32 values of the table: for inference with
    /// a model that never trains or saves. Refuses data of the wrong size or type.
    pub fn set_stored_rows(&mut self, ty: GgmlType, data: RawBytes) -> Result<(), String> {
        let (vocab, d) = (self.vocab_size(), self.d_model);
        let (block_n, block_bytes) = ty
            .block()
            .filter(|&(n, _)| d.is_multiple_of(n))
            .ok_or_else(|| format!("rows of {d} elements are not whole {} blocks", ty.name()))?;
        let row_bytes = d / block_n * block_bytes;
        if data.len() != vocab * row_bytes {
            return Err(format!(
                "{vocab} x {d} {} needs {} bytes, the data has {}",
                ty.name(),
                vocab * row_bytes,
                data.len()
            ));
        }
        self.stored = Some(StoredRows {
            ty,
            row_bytes,
            data,
        });
        self.weight = Param {
            value: crate::Tensor {
                data: Vec::new(),
                shape: self.weight.value.shape.clone(),
            },
            grad: crate::Tensor {
                data: Vec::new(),
                shape: self.weight.value.shape.clone(),
            },
        };
        Ok(())
    }

    /// Holds the table in one form only for inference, and releases its float32 values and
    /// gradient: f32 `Eᵀ` (panels made in the table's own memory), bf16 or int8 packed rows.
    /// Lookups then read rows from that form (int8: `s_o · q_ok`, as CTranslate2 dequantises
    /// its int8 embeddings), and a tied output projection multiplies it
    /// ([`Embedding::table_ref`]). The table can no longer train or be saved. A table already
    /// released keeps its form.
    pub fn hold_alone(&mut self, precision: Precision) -> Result<(), String> {
        let (vocab, d) = (self.vocab_size(), self.d_model);
        if self.weight.value.data.is_empty() {
            return Ok(());
        }
        self.alone = match precision {
            Precision::F32 => {
                let w = std::mem::take(&mut self.weight.value.data);
                TableForm::Transposed(CPU.transpose_weight_owned(w, vocab, d))
            }
            precision => {
                let w = T::as_f32(&self.weight.value.data)
                    .ok_or("low-precision inference needs an f32 model")?;
                match CPU.pack_weight(precision, w, vocab, d)? {
                    Some(p) => TableForm::Packed(p),
                    None => return Err(format!("{precision:?} packs nothing")),
                }
            }
        };
        self.weight.value.data = Vec::new();
        self.weight.grad.data = Vec::new();
        Ok(())
    }

    /// `E [vocab, d_model]` with the form it holds: its values, or, released to inference
    /// ([`Embedding::hold_alone`]), its `Eᵀ` or packed rows (what a tied projection multiplies).
    pub fn table_ref(&self) -> WeightRef<'_, T> {
        let (transposed, packed) = match &self.alone {
            TableForm::Values => (None, None),
            TableForm::Transposed(t) => (Some(&t[..]), None),
            TableForm::Packed(p) => (None, Some(p)),
        };
        WeightRef {
            w: &self.weight.value.data,
            d_in: self.d_model,
            d_out: self.vocab_size(),
            transposed,
            packed,
            bf16: None,
        }
    }

    /// Whether the table's float32 values were released ([`Embedding::hold_alone`]).
    pub fn is_released(&self) -> bool {
        !matches!(self.alone, TableForm::Values)
    }

    /// The factor of the token embedding: √d_model when scaled (section 3.4), a config's own,
    /// or 1.
    pub fn token_scale(&self) -> f64 {
        self.scale().f64()
    }

    /// The table as a device uploads it: its stored GGUF rows, or its float values.
    pub fn table_source(&self) -> WeightSource<'_> {
        let d_out = self.vocab_size();
        match (&self.stored, T::as_f32(&self.weight.value.data)) {
            (Some(s), _) => WeightSource::Rows {
                ty: s.ty,
                bytes: &s.data[..],
                d_out,
                d_in: self.d_model,
            },
            (None, w) => WeightSource::Layer(crate::backend::WeightRef {
                w: w.unwrap_or(&[]),
                d_in: self.d_model,
                d_out,
                transposed: None,
                packed: None,
                bf16: None,
            }),
        }
    }

    /// Whether the table is looked up in its stored blocks.
    pub fn has_stored_rows(&self) -> bool {
        self.stored.is_some()
    }

    /// The stored blocks rows are looked up in, as [`Embedding::set_stored_rows`] took them.
    pub fn stored_rows(&self) -> Option<&RawBytes> {
        self.stored.as_ref().map(|s| &s.data)
    }

    /// The same embedding without the √d_model scale (GPT-2, Llama).
    pub fn unscaled(mut self) -> Self {
        self.scaled = false;
        self
    }

    /// The factor of the token embedding: the config's own, else √d_model, or 1 when unscaled.
    fn scale(&self) -> T {
        if let Some(s) = self.scale_override {
            T::of(s)
        } else if self.scaled {
            T::of((self.d_model as f64).sqrt())
        } else {
            T::one()
        }
    }

    /// Whether a stack has an input of its own (mBART, BART): the decoder's own positions or a
    /// norm of the embedded input.
    pub fn has_side_inputs(&self) -> bool {
        self.target_positions.is_some() || self.norm.is_some() || self.target_norm.is_some()
    }

    /// The learned position table `side` adds.
    fn learned_table(&self, side: Side) -> Option<&Param<T>> {
        match side {
            Side::Target => self.target_positions.as_ref().or(self.positions.as_ref()),
            Side::Source => self.positions.as_ref(),
        }
    }

    /// The norm of `side`'s embedded input, if any.
    fn side_norm(&self, side: Side) -> Option<&Norm<T>> {
        match side {
            Side::Source => self.norm.as_ref(),
            Side::Target => self.target_norm.as_ref(),
        }
    }

    /// The additive position row of `pos` on `side`, `[d_model]`, if positions are added: a
    /// row of the table, or (sinusoids past [`SINUSOID_TABLE_ROWS`]) computed.
    fn additive_row(&self, side: Side, pos: usize) -> Option<std::borrow::Cow<'_, [T]>> {
        let d = self.d_model;
        match self.kind {
            Positions::Sinusoidal | Positions::SinusoidalHalves => {
                Some(match self.sinusoids.get(pos * d..(pos + 1) * d) {
                    Some(row) => row.into(),
                    None => {
                        let wave = sinusoid_of(self.kind)?;
                        (0..d).map(|dim| T::of(wave(pos, dim, d))).collect()
                    }
                })
            }
            Positions::Learned => {
                let table = &self.learned_table(side)?.value.data;
                Some(table[pos * d..(pos + 1) * d].into())
            }
            Positions::Rotary | Positions::Relative => None,
        }
    }

    /// The additive position rows of positions `0 .. rows`, `[rows, d_model]` (learned rows, or
    /// the sinusoids, computed past the table as the forward computes them); `None` for rotary
    /// positions, which add nothing. What a device uploads to add positions as this model does.
    pub fn position_table(&self, rows: usize) -> Option<Vec<T>> {
        let mut table = Vec::with_capacity(rows * self.d_model);
        for pos in 0..rows {
            table.extend_from_slice(&self.additive_row(Side::Source, pos)?);
        }
        Some(table)
    }

    /// How many position rows the embedding holds (the sinusoid table is at most
    /// [`SINUSOID_TABLE_ROWS`] rows whatever the context; a learned table has the context's).
    pub fn position_rows(&self) -> usize {
        match self.kind {
            Positions::Sinusoidal | Positions::SinusoidalHalves => {
                self.sinusoids.len() / self.d_model.max(1)
            }
            Positions::Learned => self.positions.as_ref().map_or(0, |p| p.value.shape[0]),
            Positions::Rotary | Positions::Relative => 0,
        }
    }

    /// The longest sequence the position table covers.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The number of token ids the table has rows for.
    pub fn vocab_size(&self) -> usize {
        self.weight.value.shape[0]
    }

    /// Refuses the first token id with no row in the table (an error naming it), so that
    /// ids from outside (a tokenizer, a caller) never reach [`Embedding::forward`] unchecked:
    /// every public entry point that takes ids calls it.
    pub fn check_ids(&self, ids: &[u32]) -> crate::error::Result<()> {
        let vocab = self.vocab_size();
        match ids.iter().find(|&&t| t as usize >= vocab) {
            Some(t) => Err(crate::error::Error::Input(format!(
                "token id {t} is outside the model's vocabulary of {vocab} (ids 0..{vocab})"
            ))),
            None => Ok(()),
        }
    }

    /// `tokens [batch, seq_len]` (row-major) -> `x [batch*seq_len, d_model]`, positions starting
    /// at `pos_offset` (for incremental decoding). Dropout with probability `p` when `rng` is given.
    pub fn forward(
        &self,
        tokens: &[u32],
        seq_len: usize,
        pos_offset: usize,
        p: f64,
        rng: Option<&mut Rng>,
    ) -> (Vec<T>, EmbeddingCache<T>) {
        self.forward_on(Side::Source, tokens, seq_len, pos_offset, p, rng)
    }

    /// [`forward`](Self::forward) into the stack of `side`: its positions, then its norm.
    pub fn forward_on(
        &self,
        side: Side,
        tokens: &[u32],
        seq_len: usize,
        pos_offset: usize,
        p: f64,
        rng: Option<&mut Rng>,
    ) -> (Vec<T>, EmbeddingCache<T>) {
        let d = self.d_model;
        let scale = self.scale();
        assert!(
            pos_offset + seq_len <= self.max_len,
            "sequence longer than max_len"
        );
        // x: [batch*seq_len, d_model]
        let mut x = vec![T::zero(); tokens.len() * d];
        for (r, &tok) in tokens.iter().enumerate() {
            let pos = pos_offset + r % seq_len;
            let row: Vec<T>;
            let outside = || -> ! {
                panic!(
                    "token id {tok} is outside the vocabulary of {} (callers check ids \
                     with Embedding::check_ids first)",
                    self.vocab_size()
                )
            };
            let e: &[T] = match &self.stored {
                Some(s) => {
                    let bytes = s
                        .data
                        .get(tok as usize * s.row_bytes..(tok as usize + 1) * s.row_bytes)
                        .unwrap_or_else(|| outside());
                    let mut values = vec![0f32; d];
                    CPU.dequantise_ggml(s.ty, bytes, &mut values)
                        .expect("sizes checked by set_stored_rows");
                    row = values.into_iter().map(|v| T::of(f64::from(v))).collect();
                    &row
                }
                None if self.is_released() => {
                    if tok as usize >= self.vocab_size() {
                        outside();
                    }
                    let mut values = vec![T::zero(); d];
                    CPU.weight_row(self.table_ref(), tok as usize, &mut values)
                        .expect("hold_alone keeps a form rows are read from");
                    row = values;
                    &row
                }
                None => self
                    .weight
                    .value
                    .data
                    .get(tok as usize * d..(tok as usize + 1) * d)
                    .unwrap_or_else(|| outside()),
            };
            let out = &mut x[r * d..(r + 1) * d];
            match self.additive_row(side, pos) {
                Some(pe) => {
                    for ((o, &ev), &pv) in out.iter_mut().zip(e).zip(pe.iter()) {
                        *o = ev * scale + pv;
                    }
                }
                None => {
                    for (o, &ev) in out.iter_mut().zip(e) {
                        *o = ev * scale;
                    }
                }
            }
        }
        let mut norm_input = None;
        if let Some(norm) = self.side_norm(side) {
            let (y, stats) = norm.forward(&x);
            norm_input = Some((std::mem::replace(&mut x, y), stats));
        }
        let dropout_mask = rng.and_then(|rng| CPU.dropout_mask(rng, x.len(), p));
        if let Some(m) = &dropout_mask {
            CPU.mul(&mut x, m);
        }
        let cache = EmbeddingCache {
            tokens: tokens.to_vec(),
            dropout_mask,
            seq_len,
            pos_offset,
            side,
            norm_input,
        };
        (x, cache)
    }

    /// Accumulates `dE[token] += √d_model · dx` and, for learned positions, `dP[pos] += dx`
    /// (after the dropout mask and, where the side has one, back through its norm).
    pub fn backward(&mut self, cache: &EmbeddingCache<T>, dx: &[T]) {
        assert!(
            !self.is_released() && self.stored.is_none(),
            "the backward of an embedding table whose float32 values were released for \
             inference (Embedding::hold_alone, or GGUF rows): such a model cannot train"
        );
        let d = self.d_model;
        let scale = self.scale();
        let mut dx: std::borrow::Cow<'_, [T]> = match &cache.dropout_mask {
            Some(m) => dx.iter().zip(m).map(|(&g, &mv)| g * mv).collect(),
            None => dx.into(),
        };
        let norm = match cache.side {
            Side::Source => self.norm.as_mut(),
            Side::Target => self.target_norm.as_mut(),
        };
        if let (Some(norm), Some((x, stats))) = (norm, &cache.norm_input) {
            dx = norm.backward(x, stats, &dx).into();
        }
        let dx = &dx[..];
        for (r, &tok) in cache.tokens.iter().enumerate() {
            let g = &mut self.weight.grad.data[tok as usize * d..(tok as usize + 1) * d];
            for (gi, &dxi) in g.iter_mut().zip(&dx[r * d..(r + 1) * d]) {
                *gi += dxi * scale;
            }
        }
        let table = match (cache.side, &mut self.target_positions) {
            (Side::Target, Some(own)) => Some(own),
            _ => self.positions.as_mut(),
        };
        if let Some(p) = table {
            for r in 0..cache.tokens.len() {
                let pos = cache.pos_offset + r % cache.seq_len;
                let g = &mut p.grad.data[pos * d..(pos + 1) * d];
                for (gi, &dxi) in g.iter_mut().zip(&dx[r * d..(r + 1) * d]) {
                    *gi += dxi;
                }
            }
        }
    }
}

impl<T> Module<T> for Embedding<T> {
    fn visit<'a>(&'a mut self, v: &mut ParamVisitor<'a, T>) {
        v.param("weight", &mut self.weight);
        if let Some(p) = &mut self.positions {
            v.param("positions", p);
        }
        if let Some(p) = &mut self.target_positions {
            v.param("target_positions", p);
        }
        v.optional("norm", self.norm.as_mut());
        v.optional("target_norm", self.target_norm.as_mut());
    }
}

#[cfg(test)]
#[path = "embedding_tests.rs"]
mod tests;
