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
//! pre-softmax projection.

use super::config::Positions;
use super::param::{Init, Module, Param, ParamVisitor};
use crate::backend::{Backend, GgmlType, RawBytes, WeightSource, CPU};
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
        Positions::Learned | Positions::Rotary => None,
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
}

/// What the embedding forward keeps: the tokens, their positions and the dropout mask.
#[derive(Clone, Debug)]
pub struct EmbeddingCache<T> {
    pub tokens: Vec<u32>,
    pub dropout_mask: Option<Vec<T>>,
    /// Row `r` was at position `pos_offset + r % seq_len`.
    pub seq_len: usize,
    pub pos_offset: usize,
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

    /// The additive position row of `pos`, `[d_model]`, if positions are added: a row of the
    /// table, or (sinusoids past [`SINUSOID_TABLE_ROWS`]) computed.
    fn additive_row(&self, pos: usize) -> Option<std::borrow::Cow<'_, [T]>> {
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
                let table = &self.positions.as_ref()?.value.data;
                Some(table[pos * d..(pos + 1) * d].into())
            }
            Positions::Rotary => None,
        }
    }

    /// The additive position rows of positions `0 .. rows`, `[rows, d_model]` (learned rows, or
    /// the sinusoids, computed past the table as the forward computes them); `None` for rotary
    /// positions, which add nothing. What a device uploads to add positions as this model does.
    pub fn position_table(&self, rows: usize) -> Option<Vec<T>> {
        let mut table = Vec::with_capacity(rows * self.d_model);
        for pos in 0..rows {
            table.extend_from_slice(&self.additive_row(pos)?);
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
            Positions::Rotary => 0,
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
                None => self
                    .weight
                    .value
                    .data
                    .get(tok as usize * d..(tok as usize + 1) * d)
                    .unwrap_or_else(|| outside()),
            };
            let out = &mut x[r * d..(r + 1) * d];
            match self.additive_row(pos) {
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
        let dropout_mask = rng.and_then(|rng| CPU.dropout_mask(rng, x.len(), p));
        if let Some(m) = &dropout_mask {
            CPU.mul(&mut x, m);
        }
        let cache = EmbeddingCache {
            tokens: tokens.to_vec(),
            dropout_mask,
            seq_len,
            pos_offset,
        };
        (x, cache)
    }

    /// Accumulates `dE[token] += √d_model · dx` and, for learned positions, `dP[pos] += dx`
    /// (after the dropout mask).
    pub fn backward(&mut self, cache: &EmbeddingCache<T>, dx: &[T]) {
        let d = self.d_model;
        let scale = self.scale();
        let masked: Option<Vec<T>> = cache
            .dropout_mask
            .as_ref()
            .map(|m| dx.iter().zip(m).map(|(&g, &mv)| g * mv).collect());
        let dx = masked.as_deref().unwrap_or(dx);
        for (r, &tok) in cache.tokens.iter().enumerate() {
            let g = &mut self.weight.grad.data[tok as usize * d..(tok as usize + 1) * d];
            for (gi, &dxi) in g.iter_mut().zip(&dx[r * d..(r + 1) * d]) {
                *gi += dxi * scale;
            }
        }
        if let Some(p) = &mut self.positions {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table looked up in its stored Q8_0 blocks gives the rows of the dequantised table,
    /// holds no float32 values, and refuses data of the wrong size.
    #[test]
    fn stored_rows_are_the_dequantised_table() {
        let (vocab, d) = (5, 64);
        let mut rng = Rng::new(3);
        let mut data = Vec::new();
        for _ in 0..vocab * d / 32 {
            // f16 scales between 2^-8 and 2^-5, then 32 signed bytes.
            let scale: u16 = 0x1c00 + (rng.next_u64() % 0x0c00) as u16;
            data.extend_from_slice(&scale.to_le_bytes());
            data.extend((0..32).map(|_| rng.next_u64() as u8));
        }
        let table = {
            let mut t = vec![0f32; vocab * d];
            CPU.dequantise_ggml(GgmlType::Q8_0, &data, &mut t).unwrap();
            t
        };
        let mut plain =
            Embedding::<f32>::with_positions(vocab, d, 8, Positions::Rotary, &mut rng).unscaled();
        plain.weight.value.data.copy_from_slice(&table);
        let mut stored = plain.clone();
        assert!(stored
            .set_stored_rows(
                GgmlType::Q8_0,
                RawBytes::owned(data[..data.len() - 34].to_vec())
            )
            .unwrap_err()
            .contains("needs"));
        stored
            .set_stored_rows(GgmlType::Q8_0, RawBytes::owned(data))
            .unwrap();
        assert!(stored.weight.value.data.is_empty() && stored.has_stored_rows());
        assert_eq!(stored.vocab_size(), vocab);
        let tokens = [4, 0, 2, 2, 1, 3];
        let (want, _) = plain.forward(&tokens, 3, 0, 0.0, None);
        let (got, _) = stored.forward(&tokens, 3, 0, 0.0, None);
        assert_eq!(got, want);
        for (r, &t) in tokens.iter().enumerate() {
            assert_eq!(
                got[r * d..(r + 1) * d],
                table[t as usize * d..(t as usize + 1) * d]
            );
        }
    }

    /// A context of 2^20 positions keeps a table of SINUSOID_TABLE_ROWS rows; positions
    /// past it get the paper's values, computed (position 1,000,000: `sin(10^6 / 10000^(2i/d))`).
    #[test]
    fn long_contexts_keep_a_bounded_sinusoid_table() {
        let (vocab, d, context) = (4, 8, 1 << 20);
        let mut rng = Rng::new(5);
        let e = Embedding::<f64>::with_positions(vocab, d, context, Positions::Sinusoidal, &mut rng)
            .unscaled();
        assert_eq!(e.position_rows(), SINUSOID_TABLE_ROWS);
        assert_eq!(e.max_len(), context);
        for pos in [SINUSOID_TABLE_ROWS - 1, SINUSOID_TABLE_ROWS, 1_000_000, context - 1] {
            let (x, _) = e.forward(&[2], 1, pos, 0.0, None);
            for (dim, &got) in x.iter().enumerate() {
                let angle = pos as f64 / 10000f64.powf((dim - dim % 2) as f64 / d as f64);
                let pe = if dim % 2 == 0 { angle.sin() } else { angle.cos() };
                let want = e.weight.value.data[2 * d + dim] + pe;
                assert!((got - want).abs() < 1e-12, "pos {pos} dim {dim}: {got} vs {want}");
            }
        }
    }

    #[test]
    fn sinusoid_matches_the_paper() {
        // PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...)
        let d = 8;
        assert_eq!(sinusoid(0, 0, d), 0.0);
        assert_eq!(sinusoid(0, 1, d), 1.0);
        assert!((sinusoid(3, 4, d) - (3.0f64 / 10000f64.powf(4.0 / 8.0)).sin()).abs() < 1e-15);
        assert!((sinusoid(3, 5, d) - (3.0f64 / 10000f64.powf(4.0 / 8.0)).cos()).abs() < 1e-15);
    }

    /// Marian's halves are the paper's columns reordered: even columns first, then the odd
    /// ones (odd widths too, where the sines take one more column); past the precomputed table
    /// the computed rows are the same values.
    #[test]
    fn sinusoid_halves_are_the_papers_columns_reordered() {
        for d in [8usize, 7] {
            let sines = d.div_ceil(2);
            for pos in [0, 1, 5, 77] {
                for i in 0..d {
                    let paper = if i < sines { 2 * i } else { 2 * (i - sines) + 1 };
                    assert_eq!(sinusoid_halves(pos, i, d), sinusoid(pos, paper, d), "{d} {pos} {i}");
                }
            }
        }
        let d = 6;
        let e = Embedding::<f64>::with_positions(3, d, 1 << 14, Positions::SinusoidalHalves, &mut Rng::new(2))
            .unscaled();
        for pos in [3, SINUSOID_TABLE_ROWS + 3] {
            let (x, _) = e.forward(&[1], 1, pos, 0.0, None);
            for (dim, &got) in x.iter().enumerate() {
                let want = e.weight.value.data[d + dim] + sinusoid_halves(pos, dim, d);
                assert!((got - want).abs() < 1e-12, "pos {pos} dim {dim}");
            }
        }
    }
}
