//! `transformer embed --model DIR < sentences.txt`: one JSON line `{"embedding": [...]}` per input
//! line, the L2-normalised mean of a pretrained BERT encoder's last hidden states (the
//! sentence-transformers recipe, e.g. all-MiniLM-L6-v2).

use super::{read_stdin_lines, set_threads};
use crate::model::bert::Bert;
use crate::text::tokenizer::Tokenizer;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The tokenizer file inside a Hugging Face model directory.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// sentence-transformers' settings file, whose `max_seq_length` sets the truncation.
pub const SENTENCE_CONFIG_FILE: &str = "sentence_bert_config.json";
/// Word pieces kept per sentence when the directory does not say.
pub const DEFAULT_MAX_LEN: usize = 256;

#[derive(Args, Debug)]
pub struct EmbedArgs {
    /// Hugging Face BERT directory: config.json, model.safetensors, tokenizer.json.
    #[arg(long)]
    pub model: PathBuf,
    /// Sentences embedded together (sorted by length, padded to the longest of each batch).
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    /// Word pieces kept per sentence, special tokens included [default: max_seq_length of the
    /// directory's sentence_bert_config.json, else 256].
    #[arg(long)]
    pub max_len: Option<usize>,
    /// Worker threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

/// A pretrained encoder with its tokenizer.
pub struct SentenceEncoder {
    pub model: Bert<f32>,
    pub tokenizer: Tokenizer,
}

impl SentenceEncoder {
    /// Loads a model directory; `max_len` overrides the directory's truncation length.
    pub fn load(dir: &Path, max_len: Option<usize>) -> Result<SentenceEncoder> {
        if !dir.is_dir() {
            bail!("model directory {} does not exist", dir.display());
        }
        let model = Bert::load(dir)?;
        let max_len = match max_len {
            Some(n) => n,
            None => configured_max_len(dir)?,
        };
        let positions = model.config.max_position_embeddings;
        if max_len == 0 || max_len > positions {
            bail!("max length {max_len} must be in 1..={positions} (the model's positions)");
        }
        let tokenizer = Tokenizer::load(&dir.join(TOKENIZER_FILE), max_len)?;
        if tokenizer.vocab_size() > model.config.vocab_size {
            bail!(
                "{}: {} tokens but config.json says vocab_size {}",
                dir.join(TOKENIZER_FILE).display(),
                tokenizer.vocab_size(),
                model.config.vocab_size
            );
        }
        Ok(SentenceEncoder { model, tokenizer })
    }

    /// Embeds `sentences`, `batch_size` at a time (sorted by length so that little is padded),
    /// returning the embeddings in input order.
    pub fn embed(&self, sentences: &[String], batch_size: usize) -> Result<Vec<Vec<f32>>> {
        let ids = sentences
            .iter()
            .map(|s| self.tokenizer.encode(s))
            .collect::<crate::error::Result<Vec<_>>>()?;
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(ids[i].len()));
        let mut out = vec![Vec::new(); ids.len()];
        for chunk in order.chunks(batch_size.max(1)) {
            let seqs: Vec<&[u32]> = chunk.iter().map(|&i| &ids[i][..]).collect();
            for (&i, e) in chunk.iter().zip(self.model.embed(&seqs)?) {
                out[i] = e;
            }
        }
        Ok(out)
    }
}

/// `max_seq_length` from the directory's `sentence_bert_config.json`, or 256 without that file.
fn configured_max_len(dir: &Path) -> Result<usize> {
    let path = dir.join(SENTENCE_CONFIG_FILE);
    if !path.is_file() {
        return Ok(DEFAULT_MAX_LEN);
    }
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}: invalid JSON", path.display()))?;
    match v.get("max_seq_length") {
        None => Ok(DEFAULT_MAX_LEN),
        Some(n) => n
            .as_u64()
            .map(|n| n as usize)
            .with_context(|| format!("{}: max_seq_length is not a count", path.display())),
    }
}

pub fn run(args: EmbedArgs) -> Result<()> {
    set_threads(args.threads)?;
    let encoder = SentenceEncoder::load(&args.model, args.max_len)?;
    let lines = read_stdin_lines()?;
    let start = std::time::Instant::now();
    let embeddings = encoder.embed(&lines, args.batch_size)?;
    let secs = start.elapsed().as_secs_f64();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for e in &embeddings {
        serde_json::to_writer(&mut out, &serde_json::json!({ "embedding": e }))?;
        writeln!(out)?;
    }
    out.flush()?;
    eprintln!(
        "embedded {} sentences in {secs:.2} s ({:.1} sentences/s)",
        lines.len(),
        lines.len() as f64 / secs.max(1e-9)
    );
    Ok(())
}
