//! `transformer tokenize --model PATH (--json | --text T)`: the token ids of texts under a
//! model's tokenizer, as the model's own tooling computes them: a GGUF file's as llama.cpp's
//! `llama_tokenize` does (the vocabulary-only `ggml-vocab-*.gguf` files too: no weights are
//! read), a `tokenizer.json` (a Hugging Face directory, or one of ours) as the `tokenizers`
//! library does.
//!
//! `--json` reads a JSON array of strings on standard input and prints a JSON array of id
//! arrays; `--text T` prints the ids of `T` as one JSON array. Nothing is added and special
//! tokens written in the text are plain text, unless `--add-special` (BOS/EOS, or `[CLS]` /
//! `[SEP]`, as the model's metadata says) and `--parse-special` (control tokens written in the
//! text are recognised) say otherwise.

use crate::store::gguf::GgufFile;
use crate::store::TOKENIZER_FILE;
use crate::text::gguf_tokenizer::GgufTokenizer;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::Read;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["json", "text"])))]
pub struct TokenizeArgs {
    /// A GGUF file, a `tokenizer.json`, or a model directory holding a `tokenizer.json`.
    #[arg(long, value_name = "PATH")]
    pub model: PathBuf,
    /// Read a JSON array of strings on standard input; print a JSON array of id arrays.
    #[arg(long)]
    pub json: bool,
    /// Print the ids of this one text (a JSON array).
    #[arg(long, value_name = "T")]
    pub text: Option<String>,
    /// Add the special tokens the model adds around a text (BOS/EOS; BERT's `[CLS]`/`[SEP]`).
    #[arg(long)]
    pub add_special: bool,
    /// Recognise special (control) tokens written in the text.
    #[arg(long)]
    pub parse_special: bool,
}

/// A tokenizer from a GGUF file or a `tokenizer.json`.
enum Loaded {
    Gguf(Box<GgufTokenizer>),
    /// `parse_special` is set when loaded (the `tokenizers` library's `encode_special_tokens`).
    Json(Box<tokenizers::Tokenizer>, PathBuf),
}

impl Loaded {
    fn open(path: &Path, parse_special: bool) -> Result<Loaded> {
        let json = if path.is_dir() {
            let json = path.join(TOKENIZER_FILE);
            if !json.is_file() {
                bail!(
                    "{} holds no {TOKENIZER_FILE}: give a GGUF file, a {TOKENIZER_FILE}, or a \
                     directory with one",
                    path.display()
                );
            }
            json
        } else if path.extension().is_some_and(|e| e == "json") {
            path.to_path_buf()
        } else {
            let file = GgufFile::open(path)?;
            return Ok(Loaded::Gguf(Box::new(GgufTokenizer::from_gguf(&file)?)));
        };
        let bytes = crate::store::read_file(&json)?;
        let mut tk = crate::text::vocab::parse_tokenizer(&bytes, &json)?;
        tk.set_encode_special_tokens(!parse_special);
        Ok(Loaded::Json(Box::new(tk), json))
    }

    fn ids(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        match self {
            Loaded::Gguf(tk) => Ok(tk.tokenize(text, add_special, parse_special)?),
            Loaded::Json(tk, path) => {
                let enc = tk.encode(text, add_special).map_err(|e| {
                    anyhow::anyhow!("{}: cannot tokenize {text:?}: {e}", path.display())
                })?;
                Ok(enc.get_ids().to_vec())
            }
        }
    }
}

pub fn run(args: TokenizeArgs) -> Result<()> {
    let tk = Loaded::open(&args.model, args.parse_special)?;
    let ids = |text: &str| tk.ids(text, args.add_special, args.parse_special);
    let json = match &args.text {
        Some(text) => serde_json::to_string(&ids(text)?)?,
        None => {
            let mut input = String::new();
            std::io::stdin()
                .read_to_string(&mut input)
                .context("reading standard input (it must be UTF-8)")?;
            let texts: Vec<String> = serde_json::from_str(&input)
                .context("standard input is not a JSON array of strings")?;
            let all = texts
                .iter()
                .map(|t| ids(t))
                .collect::<Result<Vec<Vec<u32>>>>()?;
            serde_json::to_string(&all)?
        }
    };
    super::outln!("{json}")?;
    Ok(())
}
