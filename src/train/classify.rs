//! Sentence-classification data for fine-tuning a BERT encoder
//! ([`crate::model::sentence_classifier`]): files of `text<TAB>label` lines
//! ([`read_labelled`]), the label set ([`Labels`], `labels.json` in the model directory),
//! training batches ([`ClassifyBatches`]) and validation ([`ClassifyValidation`]).
//!
//! Each update draws `batch` sentences uniformly (with replacement) from the training set with
//! the run's seeded generator, so a run and its resume see the same sentences; a part of an
//! update is padded to its longest sentence. The recipe is the language model's
//! ([`LmTrainConfig`]): its `context` is the truncation length (`[CLS]` and `[SEP]` included),
//! its `batch` the sentences per update.

use crate::error::{Error, Result};
use crate::model::sentence_classifier::SentenceClassifier;
use crate::model::ModelConfig;
use crate::rng::Rng;
use crate::store::CheckpointWriter;
use crate::train::batching::BatchOrder;
use crate::train::source::{BatchSource, Update};
use crate::train::state::Fnv1a;
use crate::train::trainer::Trainer;
use crate::train::validate::{ValidReport, Validator};
use crate::train::windows::LmTrainConfig;
use std::path::Path;

/// The label names of a classifier, in id order, in its directory.
pub const LABELS_FILE: &str = "labels.json";

/// The sentence classifier on labelled sentences.
pub type ClassifyTrainer = Trainer<SentenceClassifier<f32>, ClassifyBatches>;

/// One line of a `text<TAB>label` file.
#[derive(Clone, Debug, PartialEq)]
pub struct Labelled {
    pub text: String,
    pub label: String,
    /// The line's number in its file (from 1).
    pub line: usize,
}

/// Reads `path`: one `text<TAB>label` per line (split at the last tab; a `\r` before the
/// newline is dropped). A line without a tab, with an empty text or label, or that is not
/// UTF-8 is an error naming the file and the line; so is a file without lines.
pub fn read_labelled(path: &Path) -> Result<Vec<Labelled>> {
    let bytes = std::fs::read(path).map_err(|e| Error::Input(format!("{}: {e}", path.display())))?;
    let bad = |line: usize, what: &str| Error::Input(format!("{}:{line}: {what}", path.display()));
    let mut out = Vec::new();
    let mut lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    if lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    for (i, raw) in lines.into_iter().enumerate() {
        let line = i + 1;
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        let text = std::str::from_utf8(raw).map_err(|_| bad(line, "not valid UTF-8"))?;
        let Some((sentence, label)) = text.rsplit_once('\t') else {
            return Err(bad(line, "no tab: expected text<TAB>label"));
        };
        if sentence.trim().is_empty() {
            return Err(bad(line, "empty text"));
        }
        if label.trim().is_empty() {
            return Err(bad(line, "empty label"));
        }
        out.push(Labelled {
            text: sentence.to_string(),
            label: label.trim().to_string(),
            line,
        });
    }
    if out.is_empty() {
        return Err(Error::Input(format!(
            "{}: no text<TAB>label lines",
            path.display()
        )));
    }
    Ok(out)
}

/// The label set of a classifier: names in id order.
#[derive(Clone, Debug, PartialEq)]
pub struct Labels {
    pub names: Vec<String>,
}

impl Labels {
    /// The labels of a training set, sorted (ids do not depend on the order of the lines).
    pub fn collect(examples: &[Labelled]) -> Labels {
        let set: std::collections::BTreeSet<&str> =
            examples.iter().map(|e| e.label.as_str()).collect();
        Labels {
            names: set.into_iter().map(str::to_string).collect(),
        }
    }

    /// The id of each example's label; a label outside the set is an error naming it, the
    /// file `path` and the line.
    pub fn ids(&self, examples: &[Labelled], path: &Path) -> Result<Vec<u32>> {
        examples
            .iter()
            .map(|e| {
                self.names
                    .iter()
                    .position(|n| *n == e.label)
                    .map(|i| i as u32)
                    .ok_or_else(|| {
                        Error::Input(format!(
                            "{}:{}: label {:?} is not one of the training labels ({})",
                            path.display(),
                            e.line,
                            e.label,
                            self.names.join(", ")
                        ))
                    })
            })
            .collect()
    }

    /// Stages `labels.json` (a JSON array of the names) in a save.
    pub fn write(&self, writer: &mut CheckpointWriter) -> Result<()> {
        let json = serde_json::to_string(&self.names).expect("strings serialise");
        writer.add(LABELS_FILE, json.as_bytes())
    }

    /// Reads `dir/labels.json`, which must hold `n` distinct names.
    pub fn load(dir: &Path, n: usize) -> Result<Labels> {
        let path = dir.join(LABELS_FILE);
        let bytes = crate::store::read_file(&path)?;
        let bad = |reason: String| Error::Checkpoint {
            path: path.clone(),
            reason,
        };
        let names: Vec<String> = serde_json::from_slice(crate::store::strip_bom(&bytes))
            .map_err(|e| bad(format!("not a JSON array of label names: {e}")))?;
        let distinct: std::collections::HashSet<&String> = names.iter().collect();
        if names.len() != n || distinct.len() != n {
            return Err(bad(format!(
                "{} names ({} distinct), the model has {n} labels",
                names.len(),
                distinct.len()
            )));
        }
        Ok(Labels { names })
    }
}

/// A sentence in token ids (specials included) and its label's id.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassifyExample {
    pub ids: Vec<u32>,
    pub label: u32,
}

/// Sentences padded to the longest, one part of an update: `ids [count, seq]` (padding id 0),
/// the real tokens of each and their labels.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassifyBatch {
    pub ids: Vec<u32>,
    pub lens: Vec<usize>,
    pub labels: Vec<u32>,
}

impl ClassifyBatch {
    /// `examples` padded to the longest of them.
    pub fn new<'a>(examples: impl IntoIterator<Item = &'a ClassifyExample>) -> ClassifyBatch {
        let examples: Vec<&ClassifyExample> = examples.into_iter().collect();
        let seq = examples.iter().map(|e| e.ids.len()).max().unwrap_or(0);
        let mut ids = vec![0u32; examples.len() * seq];
        for (row, e) in ids.chunks_exact_mut(seq.max(1)).zip(&examples) {
            row[..e.ids.len()].copy_from_slice(&e.ids);
        }
        ClassifyBatch {
            ids,
            lens: examples.iter().map(|e| e.ids.len()).collect(),
            labels: examples.iter().map(|e| e.label).collect(),
        }
    }
}

/// Refuses an example the encoder cannot take: no tokens, more than `max_tokens`, or an id
/// outside the vocabulary.
fn check_example(i: usize, e: &ClassifyExample, max_tokens: usize, vocab: usize) -> Result<()> {
    if e.ids.is_empty() || e.ids.len() > max_tokens {
        return Err(Error::Input(format!(
            "sentence {i} has {} tokens; 1 to {max_tokens}",
            e.ids.len()
        )));
    }
    if let Some(&t) = e.ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(Error::Input(format!(
            "sentence {i}: token id {t} is outside the vocabulary of {vocab}"
        )));
    }
    Ok(())
}

/// The training sentences, drawn at random.
pub struct ClassifyBatches {
    examples: Vec<ClassifyExample>,
}

impl ClassifyBatches {
    /// Training sentences.
    pub fn n_sentences(&self) -> usize {
        self.examples.len()
    }
}

impl BatchSource for ClassifyBatches {
    type Recipe = LmTrainConfig;
    type Data = Vec<ClassifyExample>;
    type Part = ClassifyBatch;

    fn new(examples: Vec<ClassifyExample>, config: &LmTrainConfig, model: &ModelConfig) -> Result<Self> {
        if examples.is_empty() {
            return Err(Error::Input("no training sentences".into()));
        }
        if config.context > model.max_len {
            return Err(Error::Config(format!(
                "context {} is longer than the model's max_len {}",
                config.context, model.max_len
            )));
        }
        for (i, e) in examples.iter().enumerate() {
            check_example(i, e, config.context, model.vocab_size)?;
        }
        Ok(ClassifyBatches { examples })
    }

    /// FNV-1a over each sentence's length, ids and label, xor-ed with their count.
    fn fingerprint(&self) -> u64 {
        let mut h = Fnv1a::default();
        for e in &self.examples {
            h.eat(e.ids.len() as u64);
            e.ids.iter().for_each(|&t| h.eat(t as u64));
            h.eat(e.label as u64);
        }
        h.value() ^ self.examples.len() as u64
    }

    /// `batch` sentences drawn from `rng`, in `parts` parts; dropout draws from a generator
    /// forked once per update.
    fn next(
        &mut self,
        config: &LmTrainConfig,
        _: &mut Option<BatchOrder>,
        rng: &mut Rng,
        parts: usize,
    ) -> Update<ClassifyBatch> {
        let drawn: Vec<&ClassifyExample> = (0..config.batch)
            .map(|_| &self.examples[rng.below(self.examples.len())])
            .collect();
        let per_part = config.batch.div_ceil(parts.max(1));
        let batches: Vec<ClassifyBatch> = drawn
            .chunks(per_part)
            .map(|c| ClassifyBatch::new(c.iter().copied()))
            .collect();
        Update {
            batches: vec![batches],
            targets: config.batch,
            tokens: drawn.iter().map(|e| e.ids.len()).sum(),
            dropout_rng: Some(rng.fork()),
        }
    }
}

/// Held-out sentences in batches of `batch`, in file order.
pub struct ClassifyValidation {
    pub batches: Vec<ClassifyBatch>,
}

impl ClassifyValidation {
    /// `examples` (checked against the model's `max_tokens` and `vocab`) in batches of `batch`.
    pub fn new(
        examples: &[ClassifyExample],
        batch: usize,
        max_tokens: usize,
        vocab: usize,
    ) -> Result<ClassifyValidation> {
        for (i, e) in examples.iter().enumerate() {
            check_example(i, e, max_tokens, vocab)?;
        }
        Ok(ClassifyValidation {
            batches: examples.chunks(batch.max(1)).map(ClassifyBatch::new).collect(),
        })
    }

    /// Sentences over all batches.
    pub fn n_sentences(&self) -> usize {
        self.batches.iter().map(|b| b.lens.len()).sum()
    }
}

impl Validator<SentenceClassifier<f32>> for ClassifyValidation {
    /// The NLL per sentence and the accuracy, without dropout.
    fn validate(&self, model: &SentenceClassifier<f32>, _extras: bool) -> Result<ValidReport> {
        let (mut stats, mut correct) = (crate::model::loss::LossStats::default(), 0);
        for b in &self.batches {
            let (s, c) = model.evaluate(&b.ids, &b.lens, &b.labels);
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

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn labelled_files_are_read_and_bad_lines_named() {
        let tmp = tempfile::tempdir().unwrap();
        let good = write(tmp.path(), "a.tsv", b"a cat\tpets\r\nsome\ttabs\tbirds\n");
        let got = read_labelled(&good).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!((got[1].text.as_str(), got[1].label.as_str()), ("some\ttabs", "birds"));
        let labels = Labels::collect(&got);
        assert_eq!(labels.names, ["birds", "pets"]);
        assert_eq!(labels.ids(&got, &good).unwrap(), [1, 0]);
        for (bytes, want) in [
            (&b"ok\tx\nno tab here\n"[..], ":2: no tab"),
            (b"ok\tx\n \tx\n", ":2: empty text"),
            (b"ok\tx\nfine\t\n", ":2: empty label"),
            (b"ok\tx\n\xff\tx\n", ":2: not valid UTF-8"),
            (b"", "no text<TAB>label lines"),
        ] {
            let path = write(tmp.path(), "bad.tsv", bytes);
            let e = read_labelled(&path).unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("bad.tsv"), "{e}");
        }
        let other = write(tmp.path(), "v.tsv", b"a dog\tpets\na fish\tfish\n");
        let e = labels.ids(&read_labelled(&other).unwrap(), &other).unwrap_err();
        assert!(e.to_string().contains("v.tsv:2: label \"fish\""), "{e}");
    }

    #[test]
    fn batches_are_padded_drawn_deterministically_and_checked() {
        let examples: Vec<ClassifyExample> = (0..7)
            .map(|i| ClassifyExample {
                ids: (0..(3 + i % 3)).map(|t| 1 + t as u32).collect(),
                label: (i % 2) as u32,
            })
            .collect();
        let model = crate::model::masked_lm::mlm_config(20, (8, 2, 16, 1), 8, 0.0);
        let recipe = LmTrainConfig {
            context: 6,
            batch: 5,
            ..LmTrainConfig::default()
        };
        let draw = |seed| {
            let mut source = ClassifyBatches::new(examples.clone(), &recipe, &model).unwrap();
            source.next(&recipe, &mut None, &mut Rng::new(seed), 2)
        };
        let (a, b, c) = (draw(1), draw(1), draw(2));
        assert_eq!(a.batches, b.batches);
        assert_ne!(a.batches, c.batches);
        let parts = &a.batches[0];
        assert_eq!(parts.iter().map(|p| p.lens.len()).collect::<Vec<_>>(), [3, 2]);
        assert_eq!(a.targets, 5);
        for p in parts {
            let seq = p.ids.len() / p.lens.len();
            assert_eq!(seq, *p.lens.iter().max().unwrap());
            for (row, &n) in p.ids.chunks(seq).zip(&p.lens) {
                assert!(row[n..].iter().all(|&t| t == 0));
                assert_eq!(row[..n], (1..=n as u32).collect::<Vec<_>>()[..]);
            }
        }
        let long = vec![ClassifyExample {
            ids: vec![1; 7],
            label: 0,
        }];
        assert!(ClassifyBatches::new(long, &recipe, &model).is_err());
        let unknown = vec![ClassifyExample {
            ids: vec![1, 20],
            label: 0,
        }];
        assert!(ClassifyBatches::new(unknown, &recipe, &model).is_err());
    }
}
