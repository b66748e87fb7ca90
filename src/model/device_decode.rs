//! The translation decoder's rows on a device ([`DeviceDecodeState`]), stepped through the
//! searches' own interface ([`IncrementalDecoder`]), so that greedy search and beam search are
//! the CPU's, written once.
//!
//! The source's keys and values are stored once per sentence (blocks of
//! [`BLOCK_SIZE`](super::device_lm::BLOCK_SIZE) positions); a decoder row reads its sentence's, and the rows of one sentence
//! may share them (beam search lays one source row out per sentence when every sentence has
//! the same number of beams). The decoder's own keys and values are kept in blocks with
//! reference counts. For beam search the blocks hold one position: a step writes each row's
//! new position into a fresh block, and when beams fork ([`DecodingState::gather_rows`] with
//! repeats) the children take their parent's block list, so beams share the keys of their
//! common prefix and nothing is copied. Greedy search, whose rows never fork, uses blocks of
//! [`BLOCK_SIZE`](super::device_lm::BLOCK_SIZE) positions as the language model does. A block
//! returns to the pool when no row lists it.
//!
//! A step the device fails leaves its error in the state ([`DecodingState::failed`]): the
//! search stops at once and its caller takes the error ([`DeviceDecodeState::take_error`]).

use super::device_block::CrossSource;
use super::device_rows::{kv_blocks, kv_blocks_of, Layout};
use super::device_seq2seq::DeviceSeq2Seq;
use super::step_layout::{Feed, Outputs};
use super::StepLayout;
use crate::backend::{Device, DeviceError};
use crate::decode::{DecodingState, IncrementalDecoder};
use crate::text::EOS;

/// The rows of a translation search on a device (see the module docs).
pub struct DeviceDecodeState<D: Device> {
    /// Each decoder layer's own keys and values, in blocks of `block_size` positions.
    self_kv: Vec<D::Kv>,
    block_size: usize,
    free: Vec<u32>,
    /// Per block, the rows listing it.
    refs: Vec<u32>,
    /// Per row, the block of each position fed.
    tables: Vec<Vec<u32>>,
    /// Positions fed to every row.
    len: usize,
    /// Positions a row may hold.
    capacity: usize,
    /// Each decoder layer's keys and values of the sources, in blocks of [`BLOCK_SIZE`](super::device_lm::BLOCK_SIZE).
    cross_kv: Vec<D::Kv>,
    /// Per sentence, its source's row of blocks (`cross_max_blocks` entries) and length.
    src_blocks: Vec<Vec<u32>>,
    src_lens: Vec<usize>,
    cross_max_blocks: usize,
    /// Per source row, its sentence.
    cross_rows: Vec<usize>,
    /// The error of a failed step, until taken.
    error: Option<DeviceError>,
}

impl<D: Device> DeviceDecodeState<D> {
    /// The error of a failed step, if one failed.
    pub fn take_error(&mut self) -> Result<(), DeviceError> {
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Row `table`'s blocks lose a reference; those no row lists go back to the pool.
    fn release(&mut self, table: Vec<u32>) {
        for b in table {
            let refs = &mut self.refs[b as usize];
            *refs -= 1;
            if *refs == 0 {
                self.free.push(b);
            }
        }
    }
}

impl<D: Device> DecodingState for DeviceDecodeState<D> {
    fn len(&self) -> usize {
        self.len
    }

    /// Row `j` takes the old row `rows[j]`'s blocks (shared, not copied; rows fork only over
    /// blocks of one position, which are full).
    fn gather_rows(&mut self, rows: &[usize]) {
        let forks = (1..rows.len()).any(|j| rows[..j].contains(&rows[j]));
        if forks && self.block_size > 1 && self.error.is_none() {
            self.error = Some(DeviceError::Device(format!(
                "device translation: rows fork over blocks of {} positions",
                self.block_size
            )));
        }
        let tables: Vec<Vec<u32>> = rows.iter().map(|&r| self.tables[r].clone()).collect();
        for &b in tables.iter().flatten() {
            self.refs[b as usize] += 1;
        }
        for table in std::mem::replace(&mut self.tables, tables) {
            self.release(table);
        }
    }

    fn gather_sources(&mut self, rows: &[usize]) {
        self.cross_rows = rows.iter().map(|&r| self.cross_rows[r]).collect();
    }

    fn failed(&self) -> bool {
        self.error.is_some()
    }
}

impl<D: Device> DeviceSeq2Seq<D> {
    /// Encodes `sources` (EOS appended, one step) and stores their keys and values in every
    /// decoder layer; the state holds one row per sentence, empty, and room for `max_rows`
    /// rows of `capacity` positions in blocks of `block_size`.
    pub(super) fn start_decoding(
        &self,
        sources: &[&[u32]],
        capacity: usize,
        (max_rows, block_size): (usize, usize),
    ) -> Result<DeviceDecodeState<D>, DeviceError> {
        let d = &self.device;
        let src: Vec<Vec<u32>> = sources.iter().map(|s| [s, &[EOS][..]].concat()).collect();
        let lens: Vec<usize> = src.iter().map(Vec::len).collect();
        let (enc, enc_blocks) = Layout::whole_sequences(&lens);
        let enc_ids = enc.upload(d)?;
        let enc_rows = enc_ids.rows();
        let mut enc_kv = kv_blocks(d, self.encoder.len(), enc_blocks, self.encoder_shape)?;
        let ids = d.upload_ids(&src.concat())?;
        let h = self.embedding.embed(d, &ids, &enc_ids.pos, enc.pos.len())?;
        let norm = self.encoder_norm.as_ref();
        let memory = self.run(h, &self.encoder, norm, self.encoder_shape, &enc_rows, &mut enc_kv, None)?;
        drop(enc_kv);
        let mut cross_kv = kv_blocks(d, self.decoder.len(), enc_blocks, self.cross_shape)?;
        let width = self.cross_shape.0 * self.cross_shape.1;
        for (block, kv) in self.decoder.iter().zip(cross_kv.iter_mut()) {
            let cross = block.cross.as_ref().expect("decoder layers have cross-attention");
            cross.store(d, &memory, &enc_rows, width, kv)?;
        }
        let block_size = block_size.max(1);
        let blocks = max_rows * capacity.div_ceil(block_size);
        let self_kv = kv_blocks_of(d, self.decoder.len(), (blocks, block_size), self.self_shape)?;
        Ok(DeviceDecodeState {
            self_kv,
            block_size,
            free: (0..blocks as u32).rev().collect(),
            refs: vec![0; blocks],
            tables: vec![Vec::new(); sources.len()],
            len: 0,
            capacity,
            cross_kv,
            src_blocks: (0..sources.len()).map(|r| enc.row_of(&lens, r).to_vec()).collect(),
            src_lens: lens,
            cross_max_blocks: enc.max_blocks,
            cross_rows: (0..sources.len()).collect(),
            error: None,
        })
    }

    /// Feeds `tokens` (one per row) at the rows' next position; the log-probabilities
    /// `[rows, vocab]`.
    fn decode_step(
        &self,
        state: &mut DeviceDecodeState<D>,
        tokens: &[u32],
    ) -> Result<Vec<f32>, DeviceError> {
        let (d, n) = (&self.device, tokens.len());
        let bad = |what: String| DeviceError::Device(format!("device translation: {what}"));
        let sources = state.cross_rows.len();
        if n != state.tables.len() || sources == 0 || n % sources != 0 {
            return Err(bad(format!(
                "{n} tokens for {} rows of {sources} sources",
                state.tables.len()
            )));
        }
        if state.len >= state.capacity {
            return Err(bad(format!("past the capacity of {} positions", state.capacity)));
        }
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(bad(format!("token id {t} is outside the vocabulary of {}", self.vocab)));
        }
        if state.len.is_multiple_of(state.block_size) {
            for table in state.tables.iter_mut() {
                let block = state.free.pop().ok_or_else(|| bad("no free key/value block".into()))?;
                state.refs[block as usize] = 1;
                table.push(block);
            }
        }
        let (t, rows_per_source) = (state.len + 1, n / sources);
        let own = Layout {
            pos: vec![state.len as u32; n],
            ctx: vec![t as u32; n],
            table: state.tables.concat(),
            max_blocks: t.div_ceil(state.block_size),
        };
        let sentence = |r: usize| state.cross_rows[r / rows_per_source];
        let cross = Layout {
            pos: vec![0; n],
            ctx: (0..n).map(|r| state.src_lens[sentence(r)] as u32).collect(),
            table: (0..n).flat_map(|r| state.src_blocks[sentence(r)].iter().copied()).collect(),
            max_blocks: state.cross_max_blocks,
        };
        let (own_ids, cross_ids) = (own.upload(d)?, cross.upload(d)?);
        let source = CrossSource {
            kv: &state.cross_kv,
            rows: cross_ids.rows(),
            shape: self.cross_shape,
        };
        let h = self.embedding.embed(d, &d.upload_ids(tokens)?, &own_ids.pos, n)?;
        let norm = self.decoder_norm.as_ref();
        let (shape, rows) = (self.self_shape, own_ids.rows());
        let hidden = self.run(h, &self.decoder, norm, shape, &rows, &mut state.self_kv, Some(&source))?;
        let mut logits = d.zeros(n * self.vocab)?;
        d.product(&mut logits, &hidden, n, self.embedding.head())?;
        let mut logprobs = d.zeros(n * self.vocab)?;
        d.log_softmax(&logits, &mut logprobs, self.vocab)?;
        let logprobs = d.read(&logprobs)?;
        state.len = t;
        Ok(logprobs)
    }
}

/// One token per row and step (the searches' dense layout); a failed step's error stays in
/// the state and its distributions are zeros (see the module docs).
impl<D: Device> IncrementalDecoder<f32> for DeviceSeq2Seq<D>
where
    Self: Sync,
{
    type State = DeviceDecodeState<D>;

    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn step(&self, state: &mut Self::State, tokens: &[u32], layout: &StepLayout<'_>) -> Vec<f32> {
        let dense = matches!((&layout.feed, &layout.outputs), (Feed::Uniform, Outputs::All));
        if state.error.is_none() {
            let result = match dense {
                true => self.decode_step(state, tokens),
                false => Err(DeviceError::Device(
                    "device translation: one token per row and step".into(),
                )),
            };
            match result {
                Ok(logprobs) => return logprobs,
                Err(e) => state.error = Some(e),
            }
        }
        vec![0.0; tokens.len() * self.vocab]
    }
}
