//! What the pretrained encoder-decoders' tests (marian.rs, nllb.rs, t5.rs, ctranslate2*.rs)
//! share: encoder states and teacher-forced logits against transformers', every position and
//! token, through the model's id map; the fixtures' hashes of id lists; their ids in ours.

use transformer::batch::Batch;
use transformer::model::Seq2Seq;
use transformer::text::id_map::IdMap;

/// FNV-1a 32 of `ids` written as decimal numbers joined by spaces (how the fixtures' make.py
/// scripts hash each line's ids).
pub fn fnv1a(ids: &[u32]) -> u32 {
    let text = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ");
    text.bytes().fold(0x811C_9DC5, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// Our ids of the reference's `theirs`, without the closing `their_eos` the searches append.
pub fn ours(ids: &IdMap, theirs: &[u32], their_eos: u32) -> Vec<u32> {
    let body = theirs.strip_suffix(&[their_eos]).unwrap_or(theirs);
    body.iter().map(|&t| ids.ours(t)).collect()
}

/// The largest differences `(encoder states, logits)` of `model` on `src` -> `tgt` (our ids)
/// to transformers' `encoder` and `logits` (`[positions, n]` in their ids, `n` their
/// vocabulary); `own_rows` (our added rows) are checked to take no probability anywhere.
pub fn state_and_logit_errors(
    model: &Seq2Seq<f32>,
    ids: &IdMap,
    (src, tgt): (&[u32], &[u32]),
    (encoder, their_logits): (&[f64], &[f64]),
    own_rows: &[u32],
) -> (f64, f64) {
    let batch = Batch::from_pairs(&[(src, tgt)]);
    let (logits, cache) = model.forward(&batch, None);
    assert_eq!(cache.memory.len(), encoder.len(), "encoder states");
    let states = (cache.memory.iter().zip(encoder))
        .map(|(&a, &b)| (a as f64 - b).abs())
        .fold(0.0, f64::max);
    let (n, v) = (ids.len_theirs(), model.config.vocab_size);
    let positions = their_logits.len() / n;
    assert_eq!(positions, tgt.len() + 1, "logit positions");
    let mut worst = 0.0f64;
    for p in 0..positions {
        for theirs in 0..n {
            let got = logits[p * v + ids.ours(theirs as u32) as usize] as f64;
            worst = worst.max((got - their_logits[p * n + theirs]).abs());
        }
        for &row in own_rows {
            let logit = logits[p * v + row as usize];
            assert!(
                logit < -1e8,
                "position {p}: our row {row} has logit {logit}"
            );
        }
    }
    (states, worst)
}
