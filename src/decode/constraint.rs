//! Constrained decoding: a row's output held to a formal language (a JSON schema, a regular
//! expression, a Lark or GBNF grammar) by masking the next-token distribution, with
//! `llguidance` (the Earley parser over a token trie that vLLM, SGLang and mistral.rs use).
//!
//! At each step of a constrained row, with `A_t ⊆ V` the tokens whose bytes extend the text so
//! far to a prefix of some sentence of the language (end tokens included once the text is a
//! whole sentence):
//!
//! `z_j ← z_j` for `j ∈ A_t`, `z_j ← −∞` otherwise,
//!
//! so that sampling (any temperature, top-k, top-p) picks only from `A_t`, renormalised; then the
//! chosen token advances the parser ([`Constraint::advance`]). Once the language admits nothing
//! more (a JSON object closed), `A_t` holds only the end tokens: the row stops as at any end
//! token. Rows without a constraint are not touched.
//!
//! [`ConstraintVocab`] is built once per model from the bytes of every token
//! ([`crate::text::token_bytes`]) and compiles each request's [`Grammar`] into its
//! [`Constraint`] (an invalid schema or grammar: an error with llguidance's message, cleaned).
//! A request's grammar is checked against the bounds of [`super::grammar_limits`] and compiled
//! on a thread of its own with a large stack; a panic inside llguidance, while compiling or at a
//! step, is an error of that one request.

use super::gbnf::gbnf_to_lark;
use super::grammar_limits::{check_lark, check_schema, check_size, clean_message};
use super::grammar_limits::{COMPILE_STACK, MAX_GRAMMAR_BYTES};
use crate::error::{Error, Result};
use crate::text::token_bytes::TokenBytes;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;
use toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};

/// What a request's output must be.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// A JSON value valid under this JSON schema.
    JsonSchema(Value),
    /// Text matching this regular expression (Rust `regex` syntax), whole.
    Regex(String),
    /// A sentence of this grammar in llguidance's Lark syntax.
    Lark(String),
    /// A sentence of this grammar in llama.cpp's GBNF (`root ::= ...`), read as Lark.
    Gbnf(String),
}

impl Grammar {
    /// llguidance's form, once within the limits of [`super::grammar_limits`]. JSON is written
    /// without optional whitespace (`{"a":1}`) unless the schema says otherwise through
    /// llguidance's `x-guidance` options: a model cannot wander into endless blank lines.
    fn top_level(&self) -> Result<TopLevelGrammar> {
        let compact = |mut schema: Value| {
            if let Value::Object(map) = &mut schema {
                map.entry("x-guidance")
                    .or_insert_with(|| json!({"whitespace_flexible": false}));
            }
            schema
        };
        Ok(match self {
            Grammar::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(json!({"type": "object"})))
            }
            Grammar::JsonSchema(schema) => {
                check_schema(schema)?;
                TopLevelGrammar::from_json_schema(compact(schema.clone()))
            }
            Grammar::Regex(rx) => {
                check_size("the regular expression", rx.len(), MAX_GRAMMAR_BYTES)?;
                TopLevelGrammar::from_regex(rx)
            }
            Grammar::Lark(text) => {
                check_lark("grammar (Lark)", text)?;
                TopLevelGrammar::from_lark(text.clone())
            }
            Grammar::Gbnf(text) => {
                let lark = gbnf_to_lark(text)?;
                check_lark("grammar (GBNF)", &lark)?;
                TopLevelGrammar::from_lark(lark)
            }
        })
    }
}

/// A model's vocabulary as llguidance reads it, and its compiler of grammars (one per model).
pub struct ConstraintVocab {
    factory: Arc<ParserFactory>,
    /// Entries of the model's distributions (may exceed the tokenizer's vocabulary).
    vocab_size: usize,
}

impl ConstraintVocab {
    /// The trie of `tokens` (id = index) over `vocab_size` logits, `end_tokens` (at least one)
    /// allowed where the language is complete.
    pub fn new(tokens: &[TokenBytes], vocab_size: usize, end_tokens: &[u32]) -> Result<Self> {
        let Some(&first_end) = end_tokens.first() else {
            return Err(Error::Input(
                "constrained decoding needs an end-of-sequence token; this model has none".into(),
            ));
        };
        if let Some(&bad) = end_tokens.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(Error::Input(format!(
                "end token {bad} is outside the vocabulary of {vocab_size}"
            )));
        }
        // Tokens past the model's distribution can never be chosen: left out.
        let tokens = &tokens[..tokens.len().min(vocab_size)];
        // Special tokens start with llguidance's marker byte 0xFF (never in UTF-8 text), so no
        // grammar writes them; tokens the tokenizer lacks have no bytes and are never allowed.
        let mut words: Vec<Vec<u8>> = tokens
            .iter()
            .map(|t| match t.special {
                true => [&[TokTrie::SPECIAL_TOKEN_MARKER][..], &t.bytes].concat(),
                false => t.bytes.clone(),
            })
            .collect();
        words.resize(vocab_size, Vec::new());
        let info = TokRxInfo::new(vocab_size as u32, first_end);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(end_tokens);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| Error::Input(format!("constrained decoding: {e}")))?;
        factory.quiet();
        // llguidance's own bounds stay its defaults (grammar size, lexer fuel, Earley items per
        // mask); its errors carry no parser state or grammar dump.
        factory.limits_mut().verbose_errors = false;
        Ok(ConstraintVocab {
            factory: Arc::new(factory),
            vocab_size,
        })
    }

    /// Whether token `id` is a special (control) token.
    pub fn is_special(&self, id: u32) -> bool {
        (id as usize) < self.vocab_size && self.factory.tok_env().tok_trie().is_special_token(id)
    }

    /// Compiles `grammar` into a row's constraint; an invalid schema or grammar (or one no
    /// text satisfies, where llguidance sees it at once), one past the limits, or one whose
    /// compiling panics or takes longer than [`COMPILE_TIMEOUT`] is an error of one short
    /// sentence. The work runs on a thread of its own with [`COMPILE_STACK`] bytes of stack;
    /// the caller blocks until it ends (so: never call this on an async runtime's thread).
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint> {
        let (tx, rx) = std::sync::mpsc::channel();
        let factory = self.factory.clone();
        let grammar = grammar.clone();
        let vocab_size = self.vocab_size;
        std::thread::Builder::new()
            .name("grammar-compile".into())
            .stack_size(COMPILE_STACK)
            .spawn(move || {
                let compiled = catch_unwind(AssertUnwindSafe(|| {
                    compile_here(&factory, &grammar, vocab_size)
                }))
                .unwrap_or_else(|_| Err(Error::Input(clean_message("panic:"))));
                let _ = tx.send(compiled);
            })
            .map_err(|e| Error::Input(format!("cannot start the grammar compiler: {e}")))?;
        match rx.recv_timeout(COMPILE_TIMEOUT) {
            Ok(compiled) => compiled,
            // The thread goes on until llguidance's fuel runs out; nobody waits for it.
            Err(_) => Err(Error::Input(format!(
                "compiling it took longer than {} s",
                COMPILE_TIMEOUT.as_secs()
            ))),
        }
    }
}

/// The longest [`ConstraintVocab::compile`] waits for its thread.
pub const COMPILE_TIMEOUT: Duration = Duration::from_secs(5);

/// [`ConstraintVocab::compile`]'s work, on the calling thread.
fn compile_here(
    factory: &ParserFactory,
    grammar: &Grammar,
    vocab_size: usize,
) -> Result<Constraint> {
    let parser = factory
        .create_parser(grammar.top_level()?)
        .map_err(|e| Error::Input(clean_message(&e.to_string())))?;
    let mut matcher = Matcher::new(Ok(parser));
    if let Some(e) = matcher.get_error() {
        return Err(Error::Input(clean_message(&e)));
    }
    // The first step's mask, so that a grammar llguidance cannot start (a row of more Earley
    // items than its limit: a 3,000-way `anyOf`) is refused here, naming the request's field,
    // rather than failing the row at its first step.
    if let Err(e) = matcher.compute_mask() {
        return Err(Error::Input(clean_message(&e.to_string())));
    }
    Ok(Constraint {
        matcher,
        vocab_size,
    })
}

/// One row's parser state (see the module docs); a clone starts from the same state.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    vocab_size: usize,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

impl Constraint {
    /// `A_t`, the tokens the language allows next (a walk of the token trie; then
    /// [`AllowedTokens::mask`] sets the logits of the others to `−∞`). It depends only on the
    /// tokens taken so far, not on this step's logits, so the engine computes it while the
    /// forward pass that gives them runs. An error when no token is allowed (the language
    /// cannot be continued: an unsatisfiable schema) or the parser failed.
    pub fn allowed(&mut self) -> Result<AllowedTokens> {
        let matcher = &mut self.matcher;
        let allowed = catch_unwind(AssertUnwindSafe(|| matcher.compute_mask_or_eos()))
            .map_err(|_| step_panic())?
            .map_err(step_error)?;
        if allowed.is_zero() {
            return Err(Error::Input(
                "constrained decoding: no token can continue the output \
                 (is the schema or grammar satisfiable?)"
                    .into(),
            ));
        }
        Ok(AllowedTokens {
            allowed,
            vocab_size: self.vocab_size,
        })
    }

    /// Advances the parser by the chosen `token`; `true` when the output is complete and
    /// nothing may follow (the row ends). A token the language does not allow here is an error.
    pub fn advance(&mut self, token: u32) -> Result<bool> {
        let matcher = &mut self.matcher;
        let taken = catch_unwind(AssertUnwindSafe(|| matcher.try_consume_tokens(&[token])))
            .map_err(|_| step_panic())?
            .map_err(step_error)?;
        if taken != 1 {
            return Err(Error::Input(format!(
                "constrained decoding: token {token} does not continue the grammar"
            )));
        }
        Ok(self.matcher.is_stopped())
    }
}

/// The error of a step whose parser failed, its message cleaned.
fn step_error(e: impl std::fmt::Display) -> Error {
    let message = clean_message(&e.to_string());
    Error::Input(format!("constrained decoding: {message}"))
}

/// The error of a step whose parser panicked (the row ends with it; the parser is not used
/// again).
fn step_panic() -> Error {
    Error::Input("constrained decoding: the grammar library failed at this step".into())
}

/// `A_t` of one row at one step (see [`Constraint::allowed`]): one bit per token.
pub struct AllowedTokens {
    allowed: SimpleVob,
    vocab_size: usize,
}

impl AllowedTokens {
    /// `z_j ← −∞` for every `j ∉ A_t` of `logits [vocab]`.
    pub fn mask(&self, logits: &mut [f32]) {
        let n = self.vocab_size.min(logits.len());
        self.allowed.iter_unset_entries(|j| {
            if j < n {
                logits[j] = f32::NEG_INFINITY;
            }
        });
    }
}

#[cfg(test)]
#[path = "constraint_tests.rs"]
pub(crate) mod tests;
