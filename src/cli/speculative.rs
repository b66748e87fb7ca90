//! The speculative-decoding flags of `generate` and `chat` (llama.cpp's names: `--draft`,
//! `--draft-max`, `--draft-min`; `--lookup` for prompt lookup), the draft model's loading and
//! the report of what was drafted and accepted.

use super::args::PrecisionArg;
use crate::decode::drafters::PromptLookup;
use crate::decode::speculative::{SpeculativeOptions, SpeculativeStats};
use crate::pipeline::generate::TextGenerator;
use crate::pipeline::speculative::{
    check_same_tokenizer, check_speculation, Drafting, Speculation,
};
use crate::text::decoder_tokenizer::DecoderTokenizer;
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

// Speculative decoding of `generate` and `chat`.
#[derive(Args, Debug, Clone)]
pub struct SpeculativeArgs {
    /// Speculative decoding with this draft model (same tokenizer as --model; a directory or a
    /// .gguf file): it proposes tokens, the model verifies them in one forward. Output is
    /// exactly what plain decoding gives (greedy: the same tokens; sampling: the same
    /// distribution).
    #[arg(long, conflicts_with = "lookup")]
    pub draft: Option<PathBuf>,
    /// The numbers the draft model multiplies its weights in (as --precision).
    #[arg(long, value_enum, default_value = "f32", requires = "draft")]
    pub draft_precision: PrecisionArg,
    /// Speculative decoding with prompt lookup: drafts are the tokens that followed the most
    /// recent earlier occurrence of the context's last n-gram (no second model).
    #[arg(long)]
    pub lookup: bool,
    /// With --lookup: the longest n-gram matched (then shorter ones, down to 1).
    #[arg(long, default_value_t = 3, requires = "lookup")]
    pub lookup_ngram: usize,
    /// Drafted tokens a step at most (the length adapts below it: +2 after a step whose drafts
    /// were all accepted, -1 after a rejection).
    #[arg(long, default_value_t = 8)]
    pub draft_max: usize,
    /// A draft shorter than this is not verified (the step is a plain one).
    #[arg(long, default_value_t = 0)]
    pub draft_min: usize,
    /// Always draft --draft-max tokens (no adaptation).
    #[arg(long)]
    pub draft_fixed: bool,
}

/// The draft model, when one is asked for.
pub struct DraftLoaded {
    pub model: Option<TextGenerator>,
}

impl SpeculativeArgs {
    /// Whether speculative decoding is asked for.
    pub fn enabled(&self) -> bool {
        self.lookup || self.draft.is_some()
    }

    /// Loads the draft model (if any), refusing one whose tokenizer differs from `tokenizer`'s.
    pub fn load(&self, tokenizer: &DecoderTokenizer) -> Result<DraftLoaded> {
        let Some(path) = &self.draft else {
            return Ok(DraftLoaded { model: None });
        };
        let draft = TextGenerator::load_prepared(path, self.draft_precision.model_precision())?;
        check_same_tokenizer(tokenizer, &draft.tokenizer, &path.display().to_string())?;
        Ok(DraftLoaded { model: Some(draft) })
    }

    /// The drafter and its lengths, checked against the target `model`; `None` without
    /// speculative decoding.
    pub fn speculation<'a>(
        &self,
        model: &crate::model::LanguageModel<f32>,
        loaded: &'a DraftLoaded,
    ) -> Result<Option<Speculation<'a>>> {
        if !self.enabled() {
            return Ok(None);
        }
        if self.draft_min > self.draft_max {
            anyhow::bail!(
                "--draft-min {} is above --draft-max {}",
                self.draft_min,
                self.draft_max
            );
        }
        let drafting = match &loaded.model {
            Some(g) => Drafting::Model(&g.model),
            None => Drafting::Lookup(PromptLookup {
                ngram_max: self.lookup_ngram,
            }),
        };
        let speculation = Speculation {
            drafting,
            options: SpeculativeOptions {
                draft_max: self.draft_max,
                draft_min: self.draft_min,
                adaptive: !self.draft_fixed,
            },
        };
        check_speculation(model, &speculation)?;
        Ok(Some(speculation))
    }
}

/// One line for stderr: drafted, accepted, acceptance, steps, tokens a step.
pub fn report(stats: &SpeculativeStats) -> String {
    format!(
        "speculative: {} drafted, {} accepted ({:.1}%), {} tokens in {} model steps ({:.2} a step)",
        stats.drafted,
        stats.accepted,
        100.0 * stats.acceptance(),
        stats.emitted,
        stats.target_steps + usize::from(stats.emitted > 0),
        stats.emitted as f64 / (stats.target_steps + usize::from(stats.emitted > 0)).max(1) as f64
    )
}

/// The counts as JSON (`--format json`).
pub fn json(stats: &SpeculativeStats) -> serde_json::Value {
    serde_json::json!({
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "verify_steps": stats.verify_steps,
        "model_steps": stats.target_steps,
        "emitted": stats.emitted,
    })
}
