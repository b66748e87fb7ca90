//! Masked-LM pre-training data (BERT, Devlin et al., 2019, section 3.1 and appendix A.1): each
//! update samples `batch` random spans of `context − 2` tokens from the training stream, each
//! made a sequence `[CLS] span [SEP]`, and in each sequence chooses
//! `max(1, round(0.15 · n))` of its `n` non-special tokens (uniformly, without replacement). A
//! chosen token is replaced by `[MASK]` with probability 0.8, by a random non-special token with
//! probability 0.1, and kept with probability 0.1; the model predicts the original token at
//! every chosen position, and only there. Every draw comes from the run's seeded generator, so a
//! run (and its resume) sees the same masks. The recipe is the language model's
//! ([`LmTrainConfig`]: its `context` is the sequence length, specials included).
//!
//! Validation ([`MlmValidation`]) masks the held-out text once, with a fixed seed, in
//! consecutive sequences: the same positions at every validation, scored by the NLL and the
//! share of chosen tokens predicted exactly (masked-token accuracy).

use crate::error::{Error, Result};
use crate::model::masked_lm::MaskedLm;
use crate::model::ModelConfig;
use crate::rng::Rng;
use crate::text::mlm_tokenizer::{CLS, MASK, N_SPECIAL, SEP};
use crate::train::batching::BatchOrder;
use crate::train::source::{BatchSource, Update};
use crate::train::state::Fnv1a;
use crate::train::trainer::Trainer;
use crate::train::validate::{ValidReport, Validator};
use crate::train::windows::LmTrainConfig;

/// The share of a sequence's non-special tokens chosen for prediction.
pub const CHOSEN: f64 = 0.15;
/// Of the chosen tokens, the share replaced by `[MASK]` ...
pub const TO_MASK: f64 = 0.8;
/// ... and the share replaced by a random token (the rest is kept).
pub const TO_RANDOM: f64 = 0.1;
/// The seed of the validation's masks.
pub const VALID_SEED: u64 = 0x6d6c_6d5f_7661_6c69;

/// The masked-LM encoder on a token stream.
pub type MlmTrainer = Trainer<MaskedLm<f32>, MlmWindows>;

/// Masked sequences, one part of an update: `inputs [count, seq]` (after replacement), and for
/// each chosen token its row index into `[count*seq]` and its original id.
#[derive(Clone, Debug, PartialEq)]
pub struct MlmBatch {
    pub inputs: Vec<u32>,
    pub positions: Vec<usize>,
    pub labels: Vec<u32>,
    pub count: usize,
}

impl MlmBatch {
    fn new() -> MlmBatch {
        MlmBatch {
            inputs: Vec::new(),
            positions: Vec::new(),
            labels: Vec::new(),
            count: 0,
        }
    }

    /// Appends `[CLS] span [SEP]`, masked (see [`mask_sequence`]).
    fn push(&mut self, span: &[u32], vocab: usize, rng: &mut Rng) {
        let offset = self.inputs.len();
        self.inputs.push(CLS);
        self.inputs.extend_from_slice(span);
        self.inputs.push(SEP);
        mask_sequence(
            &mut self.inputs[offset..],
            offset,
            vocab,
            rng,
            &mut self.positions,
            &mut self.labels,
        );
        self.count += 1;
    }
}

/// Chooses `max(1, round(0.15 · n))` of the `n` non-special tokens of `seq` (none when `n` is
/// 0), replaces them 80/10/10 (`[MASK]`, a random non-special id below `vocab`, unchanged), and
/// appends their indices plus `offset` to `positions` (ascending) and their original ids to
/// `labels`.
pub fn mask_sequence(
    seq: &mut [u32],
    offset: usize,
    vocab: usize,
    rng: &mut Rng,
    positions: &mut Vec<usize>,
    labels: &mut Vec<u32>,
) {
    let mut candidates: Vec<usize> = (0..seq.len()).filter(|&i| seq[i] >= N_SPECIAL).collect();
    let n = candidates.len();
    if n == 0 {
        return;
    }
    let k = ((CHOSEN * n as f64).round() as usize).clamp(1, n);
    // A partial Fisher–Yates shuffle: the first k candidates are a uniform choice.
    for i in 0..k {
        let j = i + rng.below(n - i);
        candidates.swap(i, j);
    }
    let chosen = &mut candidates[..k];
    chosen.sort_unstable();
    let randoms = vocab.saturating_sub(N_SPECIAL as usize).max(1);
    for &i in chosen.iter() {
        positions.push(offset + i);
        labels.push(seq[i]);
        let u = rng.uniform();
        if u < TO_MASK {
            seq[i] = MASK;
        } else if u < TO_MASK + TO_RANDOM {
            seq[i] = N_SPECIAL + rng.below(randoms) as u32;
        }
    }
}

/// One token stream (no special tokens), sampled in random spans and masked.
pub struct MlmWindows {
    tokens: Vec<u32>,
    vocab: usize,
}

impl MlmWindows {
    /// Tokens in the training stream.
    pub fn n_tokens(&self) -> usize {
        self.tokens.len()
    }
}

/// The span length of sequences of `context` tokens (`[CLS]` and `[SEP]` take two).
fn span_len(context: usize) -> usize {
    context.saturating_sub(2)
}

impl BatchSource for MlmWindows {
    type Recipe = LmTrainConfig;
    type Data = Vec<u32>;
    type Part = MlmBatch;

    fn new(tokens: Vec<u32>, config: &LmTrainConfig, model: &ModelConfig) -> Result<Self> {
        if config.context < 3 || config.batch == 0 {
            return Err(Error::Config(
                "context must be at least 3 ([CLS], a token, [SEP]) and batch positive".into(),
            ));
        }
        if config.context > model.max_len {
            return Err(Error::Config(format!(
                "context {} is longer than the model's max_len {}",
                config.context, model.max_len
            )));
        }
        let span = span_len(config.context);
        if tokens.len() < span {
            return Err(Error::Input(format!(
                "the training text has {} tokens; a sequence needs context - 2 = {span} (use a longer text or a smaller --context)",
                tokens.len(),
            )));
        }
        if let Some(&t) = tokens
            .iter()
            .find(|&&t| t < N_SPECIAL || t as usize >= model.vocab_size)
        {
            return Err(Error::Input(format!(
                "token id {t} is a special token or outside the vocabulary of {}",
                model.vocab_size
            )));
        }
        Ok(MlmWindows {
            tokens,
            vocab: model.vocab_size,
        })
    }

    /// FNV-1a over the token ids, xor-ed with their count.
    fn fingerprint(&self) -> u64 {
        Fnv1a::of_tokens(&self.tokens)
    }

    /// `batch` masked sequences drawn from `rng` (span starts, then each sequence's masks), in
    /// `parts` parts of whole sequences; dropout draws from a generator forked once per update.
    fn next(
        &mut self,
        config: &LmTrainConfig,
        _: &mut Option<BatchOrder>,
        rng: &mut Rng,
        parts: usize,
    ) -> Update<MlmBatch> {
        let span = span_len(config.context);
        let starts = self.tokens.len() - span + 1;
        let per_part = config.batch.div_ceil(parts.max(1));
        let (mut batches, mut left, mut targets) = (Vec::new(), config.batch, 0);
        while left > 0 {
            let mut part = MlmBatch::new();
            for _ in 0..per_part.min(left) {
                let s = rng.below(starts);
                part.push(&self.tokens[s..s + span], self.vocab, rng);
            }
            left -= part.count;
            targets += part.labels.len();
            batches.push(part);
        }
        Update {
            batches: vec![batches],
            targets,
            tokens: config.batch * config.context,
            dropout_rng: Some(rng.fork()),
        }
    }
}

/// The held-out text, masked once (see the module's description).
pub struct MlmValidation {
    pub batches: Vec<MlmBatch>,
}

impl MlmValidation {
    /// `tokens` (no specials) cut into consecutive spans of `context − 2` (the last one
    /// shorter), masked with [`VALID_SEED`], `batch` sequences of one length per batch.
    pub fn new(tokens: &[u32], context: usize, batch: usize, vocab: usize) -> MlmValidation {
        let span = span_len(context).max(1);
        let mut rng = Rng::new(VALID_SEED);
        let mut batches: Vec<MlmBatch> = Vec::new();
        let spans: Vec<&[u32]> = tokens.chunks(span).collect();
        // Sequences of one length per batch: full spans together, the short last one alone.
        for group in spans.chunk_by(|a, b| a.len() == b.len()) {
            for chunk in group.chunks(batch.max(1)) {
                let mut part = MlmBatch::new();
                chunk.iter().for_each(|s| part.push(s, vocab, &mut rng));
                batches.push(part);
            }
        }
        MlmValidation { batches }
    }

    /// Chosen tokens over all batches.
    pub fn n_targets(&self) -> usize {
        self.batches.iter().map(|b| b.labels.len()).sum()
    }
}

impl Validator<MaskedLm<f32>> for MlmValidation {
    /// The NLL per chosen token and the masked-token accuracy, without dropout.
    fn validate(&self, model: &MaskedLm<f32>, _extras: bool) -> Result<ValidReport> {
        let (mut stats, mut correct) = (crate::model::loss::LossStats::default(), 0);
        for b in &self.batches {
            let (s, c) = model.evaluate(&b.inputs, b.count, &b.positions, &b.labels);
            stats.add(s);
            correct += c;
        }
        Ok(ValidReport {
            loss: stats.loss(),
            nll: stats.nll(),
            bleu: None,
            bits_per_char: None,
            accuracy: Some(correct as f64 / stats.n_tokens.max(1) as f64),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 20,000 sequences of 40 tokens with specials scattered among them: every sequence gets
    /// exactly max(1, round(0.15 n)) predictions, never on a special; over the sample the
    /// replacements are 80/10/10 within 0.01, each non-special position is chosen at 0.15
    /// within 0.01, and random replacements cover the non-special ids only.
    #[test]
    fn masking_statistics_hold_on_a_large_sample() {
        let vocab = 1000;
        let mut rng = Rng::new(3);
        let mut data = Rng::new(4);
        let (mut chosen, mut masked, mut kept, mut random) = (0usize, 0usize, 0usize, 0usize);
        let mut per_position = vec![(0usize, 0usize); 40]; // (times non-special, times chosen)
        for _ in 0..20_000 {
            let original: Vec<u32> = (0..40)
                .map(|_| match data.below(10) {
                    0 => data.below(N_SPECIAL as usize) as u32,
                    _ => N_SPECIAL + data.below(vocab - N_SPECIAL as usize) as u32,
                })
                .collect();
            let mut seq = original.clone();
            let (mut positions, mut labels) = (Vec::new(), Vec::new());
            mask_sequence(&mut seq, 100, vocab, &mut rng, &mut positions, &mut labels);
            let n = original.iter().filter(|&&t| t >= N_SPECIAL).count();
            let want = if n == 0 {
                0
            } else {
                ((0.15 * n as f64).round() as usize).clamp(1, n)
            };
            assert_eq!(positions.len(), want);
            assert!(positions.windows(2).all(|w| w[0] < w[1]));
            for (i, &t) in original.iter().enumerate() {
                if t >= N_SPECIAL {
                    per_position[i].0 += 1;
                }
            }
            for (&p, &label) in positions.iter().zip(&labels) {
                let i = p - 100;
                assert!(original[i] >= N_SPECIAL, "a special token was chosen");
                assert_eq!(label, original[i]);
                per_position[i].1 += 1;
                chosen += 1;
                match seq[i] {
                    MASK => masked += 1,
                    t if t == original[i] => kept += 1,
                    t => {
                        assert!(t >= N_SPECIAL && (t as usize) < vocab, "random token {t}");
                        random += 1
                    }
                }
            }
            // untouched elsewhere
            for (i, (&a, &b)) in seq.iter().zip(&original).enumerate() {
                if !positions.contains(&(i + 100)) {
                    assert_eq!(a, b);
                }
            }
        }
        let share = |k: usize| k as f64 / chosen as f64;
        assert!(chosen > 100_000, "{chosen}");
        assert!((share(masked) - 0.8).abs() < 0.01, "mask {}", share(masked));
        assert!(
            (share(random) - 0.1).abs() < 0.01,
            "random {}",
            share(random)
        );
        assert!((share(kept) - 0.1).abs() < 0.01, "kept {}", share(kept));
        for (i, &(seen, picked)) in per_position.iter().enumerate() {
            let rate = picked as f64 / seen as f64;
            assert!((rate - 0.15).abs() < 0.01, "position {i}: chosen at {rate}");
        }
    }

    #[test]
    fn a_sequence_of_specials_gets_no_prediction() {
        let mut seq = vec![CLS, SEP];
        let (mut p, mut l) = (Vec::new(), Vec::new());
        mask_sequence(&mut seq, 0, 100, &mut Rng::new(1), &mut p, &mut l);
        assert!(p.is_empty() && l.is_empty());
        assert_eq!(seq, vec![CLS, SEP]);
    }

    /// One seed gives one update (spans and masks); `[CLS]`/`[SEP]` frame every sequence; the
    /// update's targets are its chosen tokens; the validation masks do not depend on the run.
    #[test]
    fn updates_are_deterministic_and_framed() {
        let tokens: Vec<u32> = (0..500).map(|i| 4 + (i * 7 % 90) as u32).collect();
        let model = crate::model::masked_lm::mlm_config(100, (8, 2, 16, 1), 10, 0.0);
        let recipe = LmTrainConfig {
            context: 10,
            batch: 5,
            ..LmTrainConfig::default()
        };
        let draw = |seed| {
            let mut source = MlmWindows::new(tokens.clone(), &recipe, &model).unwrap();
            source.next(&recipe, &mut None, &mut Rng::new(seed), 2)
        };
        let (a, b, c) = (draw(1), draw(1), draw(2));
        assert_eq!(a.batches, b.batches);
        assert_ne!(a.batches, c.batches);
        let parts = &a.batches[0];
        assert_eq!(parts.iter().map(|p| p.count).collect::<Vec<_>>(), [3, 2]);
        assert_eq!(
            a.targets,
            parts.iter().map(|p| p.labels.len()).sum::<usize>()
        );
        for p in parts {
            for row in p.inputs.chunks(10) {
                assert_eq!((row[0], row[9]), (CLS, SEP));
            }
            // 8 non-special tokens: round(1.2) = 1 prediction each
            assert_eq!(p.labels.len(), p.count);
        }
        let v = MlmValidation::new(&tokens[..45], 10, 2, 100);
        // spans of 8: five full ones (batches of 2, 2, 1) and one of 5
        assert_eq!(
            v.batches.iter().map(|b| b.count).collect::<Vec<_>>(),
            [2, 2, 1, 1]
        );
        assert_eq!(v.batches[3].inputs.len(), 7);
        assert_eq!(
            v.batches,
            MlmValidation::new(&tokens[..45], 10, 2, 100).batches
        );
        let bad = MlmWindows::new(vec![5, 6, MASK, 7, 8, 9, 10, 11], &recipe, &model);
        assert!(bad.is_err());
    }
}
