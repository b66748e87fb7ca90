//! Generation with speculative decoding (`generate` and `chat` with `--lookup` or `--draft`):
//! the target model in its [`ContextWindow`], a drafter (prompt lookup, or a draft model in a
//! window of its own), and the search of `crate::decode::speculative`. What is refused, by
//! name: a draft model whose tokenizer differs from the target's (its ids would mean other
//! text), and a model with linear-attention layers (their running sums cannot be cut back).

use super::generate::ContextWindow;
use crate::decode::drafters::{DraftModel, Drafter, PromptLookup};
use crate::decode::sample::SamplingOptions;
use crate::decode::speculative::{speculative_search, SpeculativeOptions, SpeculativeStats};
use crate::error::{Error, Result};
use crate::model::LanguageModel;
use crate::rng::Rng;
use crate::text::decoder_tokenizer::DecoderTokenizer;

/// Who drafts.
#[derive(Clone, Copy)]
pub enum Drafting<'a> {
    /// N-grams of the context (no second model).
    Lookup(PromptLookup),
    /// A draft model with the target's tokenizer.
    Model(&'a LanguageModel<f32>),
}

/// A drafter and its draft lengths.
#[derive(Clone, Copy)]
pub struct Speculation<'a> {
    /// Who drafts.
    pub drafting: Drafting<'a>,
    /// How many tokens a step.
    pub options: SpeculativeOptions,
}

/// Refuses a draft tokenizer that differs from the target's: another vocabulary size, another
/// token text for some id, or other end tokens (the first difference named).
pub fn check_same_tokenizer(
    target: &DecoderTokenizer,
    draft: &DecoderTokenizer,
    draft_name: &str,
) -> Result<()> {
    let bad = |why: String| {
        Err(Error::Input(format!(
            "--draft {draft_name}: its tokenizer differs from the model's ({why}); a draft model \
             must share the model's tokenizer"
        )))
    };
    let (n, m) = (target.vocab_size(), draft.vocab_size());
    if n != m {
        return bad(format!("{m} tokens against {n}"));
    }
    for id in 0..n as u32 {
        let (a, b) = (target.token_text(id), draft.token_text(id));
        if a != b {
            return bad(format!("token {id} is {b:?} there, {a:?} here"));
        }
    }
    let (a, b) = (target.end_tokens(), draft.end_tokens());
    if a != b {
        return bad(format!("end tokens {b:?} against {a:?}"));
    }
    Ok(())
}

/// Refuses what speculative decoding cannot run exactly: a target or draft model with
/// linear-attention layers, or a draft model of another vocabulary size than the target's.
pub fn check_speculation(model: &LanguageModel<f32>, speculation: &Speculation<'_>) -> Result<()> {
    let refuse = |which: &str| {
        Err(Error::Input(format!(
            "speculative decoding: the {which} has linear-attention layers, whose running sums \
             cannot be cut back past rejected drafts"
        )))
    };
    if !model.can_roll_back() {
        return refuse("model");
    }
    if let Drafting::Model(draft) = speculation.drafting {
        if !draft.can_roll_back() {
            return refuse("draft model");
        }
        let (n, m) = (model.config.vocab_size, draft.config.vocab_size);
        if n != m {
            return Err(Error::Input(format!(
                "--draft: the draft model's output has {m} tokens, the model's {n}"
            )));
        }
    }
    if let Drafting::Lookup(lookup) = speculation.drafting {
        if lookup.ngram_max == 0 {
            return Err(Error::Input("--lookup-ngram must be at least 1".into()));
        }
    }
    Ok(())
}

/// [`super::generate::generate_ids`] with speculative decoding: the same tokens for greedy
/// `opts`, the same distribution when sampling; `stats` counts the drafts. Check the models
/// with [`check_speculation`] first.
#[allow(clippy::too_many_arguments)]
pub fn generate_ids_speculative<E>(
    model: &LanguageModel<f32>,
    prompt: &[u32],
    max_tokens: usize,
    opts: SamplingOptions,
    rng: &mut Rng,
    until: &[u32],
    speculation: &Speculation<'_>,
    stats: &mut SpeculativeStats,
    emit: impl FnMut(u32) -> std::result::Result<(), E>,
) -> std::result::Result<Vec<u32>, E> {
    let needed = prompt.len().saturating_add(max_tokens);
    let window = ContextWindow {
        model,
        capacity: needed.clamp(1, model.max_len()),
    };
    let mut state = window.start();
    let run = |drafter: &mut dyn Drafter| {
        speculative_search(
            &window,
            &mut state,
            prompt,
            max_tokens,
            opts,
            rng,
            until,
            drafter,
            speculation.options,
            stats,
            emit,
        )
    };
    match speculation.drafting {
        Drafting::Model(draft) => {
            let draft_window = ContextWindow {
                model: draft,
                capacity: needed.clamp(1, draft.max_len()),
            };
            run(&mut DraftModel::new(&draft_window, draft_window.start()))
        }
        Drafting::Lookup(lookup) => run(&mut { lookup }),
    }
}

/// [`generate_ids_speculative`] with `speculation`, [`super::generate::generate_ids`] without.
#[allow(clippy::too_many_arguments)]
pub fn generate_ids_with<E>(
    model: &LanguageModel<f32>,
    prompt: &[u32],
    max_tokens: usize,
    opts: SamplingOptions,
    rng: &mut Rng,
    until: &[u32],
    speculation: Option<&Speculation<'_>>,
    stats: &mut SpeculativeStats,
    emit: impl FnMut(u32) -> std::result::Result<(), E>,
) -> std::result::Result<Vec<u32>, E> {
    match speculation {
        Some(s) => {
            generate_ids_speculative(model, prompt, max_tokens, opts, rng, until, s, stats, emit)
        }
        None => super::generate::generate_ids(model, prompt, max_tokens, opts, rng, until, emit),
    }
}
