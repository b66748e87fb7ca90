//! `transformer template --model PATH | --template FILE.jinja [--now TIME]`: a conversation (a
//! JSON object on stdin) rendered by a chat template into the prompt text, printed exactly (no
//! newline added), as transformers' `apply_chat_template(..., tokenize=False)` renders it.
//!
//! The object holds `messages` and optionally `tools`, `add_generation_prompt` (false unless
//! given, as in transformers), `bos_token`, `eos_token` and any variable the template reads
//! (`enable_thinking`, `date_string`, ...). With `--model`, the template and the BOS/EOS tokens
//! are the model's: a GGUF file's `tokenizer.chat_template` and vocabulary, or a Hugging Face
//! directory's `tokenizer_config.json` (or `chat_template.jinja`).

use crate::pipeline::chat::{gguf_chat_template, hf_chat_template, ChatContext, ChatTemplate};
use crate::pipeline::jinja::{Clock, DateTime};
use crate::store::gguf::GgufFile;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct TemplateArgs {
    /// A GGUF file or a Hugging Face model directory whose chat template (and BOS/EOS tokens)
    /// to use.
    #[arg(
        long,
        value_name = "PATH",
        required_unless_present = "template",
        conflicts_with = "template"
    )]
    pub model: Option<PathBuf>,
    /// A Jinja chat template file (BOS/EOS tokens then only as the input gives them).
    #[arg(long, value_name = "FILE.jinja")]
    pub template: Option<PathBuf>,
    /// The time `strftime_now` formats, YYYY-MM-DDTHH:MM:SS (default: now, UTC).
    #[arg(long, value_name = "TIME")]
    pub now: Option<String>,
}

/// The chat template of a GGUF file or a Hugging Face directory.
fn model_template(path: &Path) -> Result<ChatTemplate> {
    let template = if path.is_dir() {
        hf_chat_template(path)?.with_context(|| {
            format!(
                "{} has no chat template (no chat_template in tokenizer_config.json, no \
                 chat_template.jinja)",
                path.display()
            )
        })?
    } else if path.is_file() {
        let file = GgufFile::open(path)?;
        gguf_chat_template(&file)?
            .with_context(|| format!("{} has no tokenizer.chat_template", path.display()))?
    } else {
        bail!("{} does not exist", path.display());
    };
    Ok(template)
}

pub fn run(args: TemplateArgs) -> Result<()> {
    let template = match (&args.model, &args.template) {
        (Some(model), _) => model_template(model)?,
        (None, Some(file)) => {
            let bytes =
                std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
            let source = String::from_utf8(bytes).map_err(|e| {
                anyhow::anyhow!(
                    "{} is not UTF-8 (byte {})",
                    file.display(),
                    e.utf8_error().valid_up_to()
                )
            })?;
            ChatTemplate {
                template: source,
                bos: String::new(),
                eos: String::new(),
            }
        }
        (None, None) => bail!("give --model PATH or --template FILE.jinja"),
    };
    let clock = match &args.now {
        Some(time) => Clock::Fixed(DateTime::parse(time)?),
        None => Clock::Now,
    };
    let mut input = Vec::new();
    std::io::stdin()
        .read_to_end(&mut input)
        .context("cannot read standard input")?;
    let input = String::from_utf8(input).map_err(|e| {
        anyhow::anyhow!(
            "standard input is not UTF-8 (byte {})",
            e.utf8_error().valid_up_to()
        )
    })?;
    let context = ChatContext::from_json(&input)?;
    let prompt = template.render(&context, clock)?;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(prompt.as_bytes())?;
    stdout.flush()?;
    Ok(())
}
