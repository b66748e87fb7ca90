//! A padded batch of sentence pairs, the one input the model consumes.

use crate::rng::Rng;
use serde::{Deserialize, Serialize};

/// The special token ids of every translation vocabulary (defined with the vocabularies, in
/// [`crate::text`]).
pub use crate::text::{BOS, EOS, PAD, UNK};

/// Source and target token ids of `batch_size` pairs, padded with [`PAD`] to the longest.
///
/// The source of each pair ends with [`EOS`]; the decoder reads `tgt_in = BOS y1 .. yn` and
/// is trained to predict `tgt_out = y1 .. yn EOS` (teacher forcing).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    pub batch_size: usize,
    /// Padded source length (longest source in the batch, EOS included).
    pub src_len: usize,
    /// Padded target length (longest target plus one).
    pub tgt_len: usize,
    /// [batch_size, src_len]
    pub src: Vec<u32>,
    /// Unpadded source lengths, each >= 1.
    pub src_lens: Vec<usize>,
    /// [batch_size, tgt_len]: BOS y1 .. yn PAD..
    pub tgt_in: Vec<u32>,
    /// [batch_size, tgt_len]: y1 .. yn EOS PAD..
    pub tgt_out: Vec<u32>,
    /// Unpadded target lengths (n + 1), each >= 1.
    pub tgt_lens: Vec<usize>,
}

impl Batch {
    /// Builds a batch from (source ids, target ids) pairs without specials; EOS/BOS are added.
    pub fn from_pairs(pairs: &[(&[u32], &[u32])]) -> Batch {
        let batch_size = pairs.len();
        let src_len = pairs.iter().map(|(s, _)| s.len() + 1).max().unwrap_or(1);
        let tgt_len = pairs.iter().map(|(_, t)| t.len() + 1).max().unwrap_or(1);
        let mut src = vec![PAD; batch_size * src_len];
        let mut tgt_in = vec![PAD; batch_size * tgt_len];
        let mut tgt_out = vec![PAD; batch_size * tgt_len];
        let mut src_lens = Vec::with_capacity(batch_size);
        let mut tgt_lens = Vec::with_capacity(batch_size);
        for (b, (s, t)) in pairs.iter().enumerate() {
            let row = &mut src[b * src_len..(b + 1) * src_len];
            row[..s.len()].copy_from_slice(s);
            row[s.len()] = EOS;
            src_lens.push(s.len() + 1);
            let row_in = &mut tgt_in[b * tgt_len..(b + 1) * tgt_len];
            row_in[0] = BOS;
            row_in[1..=t.len()].copy_from_slice(t);
            let row_out = &mut tgt_out[b * tgt_len..(b + 1) * tgt_len];
            row_out[..t.len()].copy_from_slice(t);
            row_out[t.len()] = EOS;
            tgt_lens.push(t.len() + 1);
        }
        Batch {
            batch_size,
            src_len,
            tgt_len,
            src,
            src_lens,
            tgt_in,
            tgt_out,
            tgt_lens,
        }
    }

    /// Real (unpadded) source tokens, EOS included.
    pub fn n_src_tokens(&self) -> usize {
        self.src_lens.iter().sum()
    }

    /// Real (unpadded) target tokens, EOS included: the tokens the loss is taken over.
    pub fn n_tgt_tokens(&self) -> usize {
        self.tgt_lens.iter().sum()
    }

    /// Word dropout (Sennrich & Zhang 2019, after Gal & Ghahramani 2016): each real token of the
    /// source and of the decoder input `tgt_in` becomes [`UNK`] with probability `p`, one draw
    /// from `rng` per token in order; specials and padding stay, and so does `tgt_out` (the
    /// words to predict). Draws nothing when `p == 0`. Returns the number of tokens replaced.
    pub fn drop_words(&mut self, p: f64, rng: &mut Rng) -> usize {
        if p <= 0.0 {
            return 0;
        }
        let mut dropped = 0;
        for t in self.src.iter_mut().chain(self.tgt_in.iter_mut()) {
            if !matches!(*t, PAD | BOS | EOS) && rng.uniform() < p {
                *t = UNK;
                dropped += 1;
            }
        }
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_and_adds_specials() {
        let b = Batch::from_pairs(&[(&[5, 6][..], &[7][..]), (&[8][..], &[9, 10, 11][..])]);
        assert_eq!((b.batch_size, b.src_len, b.tgt_len), (2, 3, 4));
        assert_eq!(b.src, vec![5, 6, EOS, 8, EOS, PAD]);
        assert_eq!(b.tgt_in, vec![BOS, 7, PAD, PAD, BOS, 9, 10, 11]);
        assert_eq!(b.tgt_out, vec![7, EOS, PAD, PAD, 9, 10, 11, EOS]);
        assert_eq!((b.n_src_tokens(), b.n_tgt_tokens()), (5, 6));
    }

    #[test]
    fn word_dropout_replaces_about_p_of_the_real_tokens_only() {
        let src: Vec<u32> = (4..40).collect();
        let tgt: Vec<u32> = (40..70).collect();
        let pairs: Vec<(&[u32], &[u32])> = (0..100)
            .map(|i| (&src[..1 + i % 36], &tgt[..1 + i % 30]))
            .collect();
        let clean = Batch::from_pairs(&pairs);
        let mut b = clean.clone();
        let mut rng = Rng::new(5);
        let dropped = b.drop_words(0.25, &mut rng);
        let real = clean.n_src_tokens() - 100 + clean.n_tgt_tokens() - 100;
        let frac = dropped as f64 / real as f64;
        assert!((0.22..0.28).contains(&frac), "{dropped} of {real}");
        let unk = |v: &[u32]| v.iter().filter(|&&t| t == UNK).count();
        assert_eq!(unk(&b.src) + unk(&b.tgt_in), dropped);
        assert_eq!(b.tgt_out, clean.tgt_out);
        for (got, want) in b
            .src
            .iter()
            .zip(&clean.src)
            .chain(b.tgt_in.iter().zip(&clean.tgt_in))
        {
            assert!(got == want || (*got == UNK && !matches!(*want, PAD | BOS | EOS)));
        }
        // Same seed, same replacements; p = 0 leaves the batch and the generator alone.
        let mut again = clean.clone();
        again.drop_words(0.25, &mut Rng::new(5));
        assert_eq!(again, b);
        let mut untouched = clean.clone();
        let mut r0 = Rng::new(5);
        assert_eq!(untouched.drop_words(0.0, &mut r0), 0);
        assert_eq!((untouched, r0), (clean, Rng::new(5)));
    }
}
