//! `transformer classify --model DIR < sentences.txt`: one JSON line
//! `{"label": "...", "probabilities": {"label": p, ...}}` per input line, from a classifier of
//! `train-classifier`; with `--eval FILE.tsv`, the accuracy on `text<TAB>label` lines and the
//! counts of each label instead.

use super::args::ThreadsArgs;
use super::read_stdin_lines;
use crate::model::checkpoint::load;
use crate::model::masked_lm::argmax;
use crate::model::sentence_classifier::SentenceClassifier;
use crate::pipeline::check_model_dir;
use crate::store::TOKENIZER_FILE;
use crate::text::tokenizer::Tokenizer;
use crate::train::classify::{read_labelled, ClassifyBatch, ClassifyExample, Labels};
use crate::train::setup::classify::encode;
use anyhow::{bail, Result};
use clap::Args;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct ClassifyArgs {
    /// A model directory written by train-classifier.
    #[arg(long)]
    pub model: PathBuf,
    /// Instead of classifying stdin: score the `text<TAB>label` lines of this file and print
    /// the accuracy and, per label, the sentences, those classified right and those predicted.
    #[arg(long)]
    pub eval: Option<PathBuf>,
    /// Sentences classified together (sorted by length, padded to the longest of each batch).
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    #[command(flatten)]
    pub pool: ThreadsArgs,
}

/// A trained classifier with its tokenizer and label names.
struct Classifier {
    model: SentenceClassifier<f32>,
    tokenizer: Tokenizer,
    labels: Labels,
}

impl Classifier {
    fn load(dir: &Path) -> Result<Classifier> {
        check_model_dir(dir)?;
        let model: SentenceClassifier<f32> = load(dir)?;
        let labels = Labels::load(dir, model.config.n_labels)?;
        let path = dir.join(TOKENIZER_FILE);
        let tokenizer = Tokenizer::load(&path, model.config.max_tokens)?;
        crate::pipeline::check_vocab(
            &path,
            tokenizer.vocab_size(),
            model.config.encoder.vocab_size,
            false,
        )?;
        Ok(Classifier {
            model,
            tokenizer,
            labels,
        })
    }

    /// The label probabilities of each sequence (in input order), `batch` at a time.
    fn probabilities(&self, seqs: &[ClassifyExample], batch: usize) -> Vec<Vec<f64>> {
        let mut order: Vec<usize> = (0..seqs.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(seqs[i].ids.len()));
        let n = self.model.config.n_labels;
        let mut out = vec![Vec::new(); seqs.len()];
        for chunk in order.chunks(batch.max(1)) {
            let b = ClassifyBatch::new(chunk.iter().map(|&i| &seqs[i]));
            let probs = self.model.probabilities(&b.ids, &b.lens);
            for (&i, row) in chunk.iter().zip(probs.chunks_exact(n)) {
                out[i] = row.to_vec();
            }
        }
        out
    }
}

pub fn run(args: ClassifyArgs) -> Result<()> {
    let classifier = Classifier::load(&args.model)?;
    match &args.eval {
        Some(path) => evaluate(&classifier, path, args.batch_size),
        None => classify_stdin(&classifier, args.batch_size),
    }
}

fn classify_stdin(c: &Classifier, batch: usize) -> Result<()> {
    let lines = read_stdin_lines()?;
    if let Some(i) = lines.iter().position(|l| l.trim().is_empty()) {
        bail!("<stdin>:{}: empty sentence", i + 1);
    }
    let seqs = lines
        .iter()
        .map(|l| {
            Ok(ClassifyExample {
                ids: c.tokenizer.encode(l)?,
                label: 0,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let start = std::time::Instant::now();
    let probs = c.probabilities(&seqs, batch);
    let secs = start.elapsed().as_secs_f64();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for row in &probs {
        let mut map = serde_json::Map::new();
        for (name, &p) in c.labels.names.iter().zip(row) {
            map.insert(name.clone(), p.into());
        }
        let line = serde_json::json!({
            "label": c.labels.names[argmax(row)],
            "probabilities": map,
        });
        serde_json::to_writer(&mut out, &line)?;
        writeln!(out)?;
    }
    out.flush()?;
    eprintln!(
        "classified {} sentences in {secs:.2} s ({:.1} sentences/s)",
        lines.len(),
        lines.len() as f64 / secs.max(1e-9)
    );
    Ok(())
}

fn evaluate(c: &Classifier, path: &Path, batch: usize) -> Result<()> {
    let lines = read_labelled(path)?;
    let examples = encode(&c.tokenizer, &c.labels, &lines, path)?;
    let probs = c.probabilities(&examples, batch);
    let n = c.labels.names.len();
    // per label: (sentences, right, predicted)
    let mut counts = vec![(0usize, 0usize, 0usize); n];
    for (e, row) in examples.iter().zip(&probs) {
        let (y, guess) = (e.label as usize, argmax(row));
        counts[y].0 += 1;
        counts[guess].2 += 1;
        if guess == y {
            counts[y].1 += 1;
        }
    }
    let right: usize = counts.iter().map(|c| c.1).sum();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "accuracy {:.4} ({right} of {} sentences)",
        right as f64 / examples.len() as f64,
        examples.len()
    )?;
    for (name, (total, ok, predicted)) in c.labels.names.iter().zip(&counts) {
        writeln!(
            out,
            "{name}\t{total} sentences\t{ok} right\t{predicted} predicted"
        )?;
    }
    Ok(())
}
