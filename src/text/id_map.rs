//! The token ids of a pretrained translation model mapped onto this project's fixed specials
//! (PAD 0, BOS 1, EOS 2, UNK 3), so that greedy and beam search, scoring and the server run on
//! it unchanged.
//!
//! A model of `n` ids becomes one of `n + 1` (one padding row of our own, only ever masked) or
//! `n + 2` (also a start row of our own):
//! - our **BOS** is the decoder's start token: Marian's padding token (which Marian never
//!   emits), or, for fairseq's models (M2M100, NLLB, mBART), a copy of EOS: they start the
//!   decoder from `</s>`, a token they also emit; the copy keeps EOS emittable as ours;
//! - our **EOS** and **UNK** are theirs; our **PAD** is the added row;
//! - every other token keeps the model's order after them (their padding and `<s>` included:
//!   ordinary tokens to us, as the model can emit them).
//!
//! Tables are reordered with [`IdMap::reorder_rows`]; the rows of our own (padding, and a copied
//! start) get a logit of [`PAD_LOGIT`] from [`IdMap::logit_bias`], so their probability is
//! exactly zero and the softmax over the others is the model's.

use super::{BOS, EOS, UNK};

/// The logit of our added rows: `exp(−10⁹ − max)` is exactly 0 in f32 and f64.
pub const PAD_LOGIT: f32 = -1e9;

/// How a model's token ids (`0 .. n`) map onto ours (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdMap {
    /// Their id -> ours.
    to_ours: Vec<u32>,
    /// Our id -> theirs (`None`: our added padding row).
    to_theirs: Vec<Option<u32>>,
    /// Whether our BOS is a copy of their EOS (the decoder starts from EOS).
    start_is_eos: bool,
}

impl IdMap {
    /// The map of a vocabulary of `n` ids whose decoder starts from `start` and whose EOS and
    /// unknown tokens are `eos` and `unk` (`start` may be `eos`; otherwise the three differ);
    /// an error says which id is out of range or repeated.
    pub fn new(n: usize, start: u32, eos: u32, unk: u32) -> std::result::Result<IdMap, String> {
        for (what, id) in [("decoder start", start), ("eos_token_id", eos), ("<unk>", unk)] {
            if id as usize >= n {
                return Err(format!("{what} {id} is not below the vocabulary size {n}"));
            }
        }
        let start_is_eos = start == eos;
        if (!start_is_eos && (start == unk)) || eos == unk {
            return Err(format!(
                "the decoder start ({start}), EOS ({eos}) and <unk> ({unk}) must be different \
                 tokens (the start may be EOS)"
            ));
        }
        let first_other = UNK as usize + 1;
        let n_ours = n + 1 + usize::from(start_is_eos);
        let mut to_theirs = vec![None; n_ours];
        to_theirs[BOS as usize] = Some(start);
        to_theirs[EOS as usize] = Some(eos);
        to_theirs[UNK as usize] = Some(unk);
        let others = (0..n as u32).filter(|t| ![start, eos, unk].contains(t));
        for (ours, theirs) in (first_other..).zip(others) {
            to_theirs[ours] = Some(theirs);
        }
        let mut to_ours = vec![0; n];
        for (ours, theirs) in to_theirs.iter().enumerate() {
            // A copied start comes before EOS: EOS's own id wins.
            if let Some(t) = theirs {
                to_ours[*t as usize] = ours as u32;
            }
        }
        Ok(IdMap {
            to_ours,
            to_theirs,
            start_is_eos,
        })
    }

    /// Our id of their `theirs` (below [`len_theirs`](Self::len_theirs)).
    pub fn ours(&self, theirs: u32) -> u32 {
        self.to_ours[theirs as usize]
    }

    /// Their id of our `ours`; `None` for our padding row and ids past the vocabulary.
    pub fn theirs(&self, ours: u32) -> Option<u32> {
        self.to_theirs.get(ours as usize).copied().flatten()
    }

    /// Their vocabulary size.
    pub fn len_theirs(&self) -> usize {
        self.to_ours.len()
    }

    /// Ours: theirs and our added rows.
    pub fn len_ours(&self) -> usize {
        self.to_theirs.len()
    }

    /// The rows of their table `[n, width]` in our order (`[len_ours, width]`), the padding row
    /// filled with `pad_value` (a copied start is a copy of the EOS row).
    pub fn reorder_rows(&self, table: &[f32], width: usize, pad_value: f32) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.len_ours() * width);
        for theirs in &self.to_theirs {
            match theirs {
                Some(t) => {
                    out.extend_from_slice(&table[*t as usize * width..(*t as usize + 1) * width])
                }
                None => out.extend(std::iter::repeat_n(pad_value, width)),
            }
        }
        out
    }

    /// [`reorder_rows`](Self::reorder_rows) in the table's own memory (grown by our added
    /// rows), so that a vocabulary-sized table is never held twice while a model loads: the
    /// rows of our specials saved first, then every other row moved to its place from the last
    /// down (ours at or after theirs, as [`IdMap::new`] orders them).
    pub fn reorder_rows_owned(&self, mut table: Vec<f32>, width: usize, pad_value: f32) -> Vec<f32> {
        assert_eq!(table.len(), self.len_theirs() * width, "the table is not [n, width]");
        let first_other = UNK as usize + 1;
        let moved_up = (first_other..self.len_ours())
            .all(|o| self.to_theirs[o].is_some_and(|t| t as usize <= o));
        if !moved_up {
            return self.reorder_rows(&table, width, pad_value);
        }
        let row = |t: &Vec<f32>, i: usize| t[i * width..(i + 1) * width].to_vec();
        let specials: Vec<Option<Vec<f32>>> = (self.to_theirs[..first_other].iter())
            .map(|t| t.map(|t| row(&table, t as usize)))
            .collect();
        table.resize(self.len_ours() * width, pad_value);
        for ours in (first_other..self.len_ours()).rev() {
            let t = self.to_theirs[ours].expect("checked above") as usize;
            table.copy_within(t * width..(t + 1) * width, ours * width);
        }
        for (ours, values) in specials.iter().enumerate() {
            let dst = &mut table[ours * width..(ours + 1) * width];
            match values {
                Some(v) => dst.copy_from_slice(v),
                None => dst.fill(pad_value),
            }
        }
        table
    }

    /// Their logit bias `[n]` in our order, our own rows (padding, a copied start) at
    /// [`PAD_LOGIT`]: they are never emitted and take no probability from the others.
    pub fn logit_bias(&self, bias: &[f32]) -> Vec<f32> {
        let mut out = self.reorder_rows(bias, 1, PAD_LOGIT);
        if self.start_is_eos {
            out[BOS as usize] = PAD_LOGIT;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::PAD;

    /// The in-place reordering is the copying one, for Marian's and fairseq's maps.
    #[test]
    fn tables_reordered_in_place_are_the_copies() {
        for ids in [IdMap::new(9, 5, 0, 1).unwrap(), IdMap::new(9, 2, 2, 3).unwrap()] {
            let table: Vec<f32> = (0..9 * 3).map(|v| v as f32).collect();
            let want = ids.reorder_rows(&table, 3, -7.0);
            assert_eq!(ids.reorder_rows_owned(table, 3, -7.0), want);
        }
    }

    #[test]
    fn marian_ids_put_the_specials_where_ours_are() {
        // Marian: EOS 0, <unk> 1, padding (and decoder start) 5 of 6 tokens.
        let ids = IdMap::new(6, 5, 0, 1).unwrap();
        assert_eq!(ids.len_ours(), 7);
        assert_eq!([ids.ours(5), ids.ours(0), ids.ours(1)], [BOS, EOS, UNK]);
        assert_eq!((2..5).map(|t| ids.ours(t)).collect::<Vec<_>>(), [4, 5, 6]);
        assert_eq!(ids.theirs(PAD), None);
        for t in 0..6 {
            assert_eq!(ids.theirs(ids.ours(t)), Some(t));
        }
        assert_eq!(ids.theirs(7), None);
        let table: Vec<f32> = (0..12).map(|v| v as f32).collect(); // [6, 2]
        assert_eq!(
            ids.reorder_rows(&table, 2, -1.0),
            [-1., -1., 10., 11., 0., 1., 2., 3., 4., 5., 6., 7., 8., 9.]
        );
        let bias: Vec<f32> = (0..6).map(|v| v as f32).collect();
        assert_eq!(ids.logit_bias(&bias), [PAD_LOGIT, 5., 0., 1., 2., 3., 4.]);
        assert!(IdMap::new(6, 6, 0, 1).unwrap_err().contains("decoder start 6"));
        assert!(IdMap::new(6, 1, 0, 1).unwrap_err().contains("must be different"));
        assert!(IdMap::new(6, 0, 0, 0).unwrap_err().contains("must be different"));
    }

    #[test]
    fn a_decoder_that_starts_from_eos_gets_a_start_row_of_its_own() {
        // fairseq: <s> 0, <pad> 1, </s> 2 (also the decoder start), <unk> 3, then 2 pieces.
        let ids = IdMap::new(6, 2, 2, 3).unwrap();
        assert_eq!(ids.len_ours(), 8);
        assert_eq!([ids.ours(2), ids.ours(3)], [EOS, UNK]);
        assert_eq!((ids.theirs(BOS), ids.theirs(EOS)), (Some(2), Some(2)));
        // <s> and <pad> are ordinary tokens, in their order, then the pieces.
        assert_eq!([0, 1, 4, 5].map(|t| ids.ours(t)), [4, 5, 6, 7]);
        for t in 0..6 {
            assert_eq!(ids.theirs(ids.ours(t)), Some(t));
        }
        let table: Vec<f32> = (0..6).map(|v| v as f32).collect(); // [6, 1]
        assert_eq!(
            ids.reorder_rows(&table, 1, -1.0),
            [-1., 2., 2., 3., 0., 1., 4., 5.]
        );
        assert_eq!(
            ids.logit_bias(&[0.0; 6]),
            [PAD_LOGIT, PAD_LOGIT, 0., 0., 0., 0., 0., 0.]
        );
    }
}
