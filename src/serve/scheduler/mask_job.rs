//! A constrained row's allowed tokens, computed beside the forward pass.

use crate::decode::constraint::{AllowedTokens, Constraint};
use std::time::Instant;

/// One constrained row's `A_t` for this step, computed beside the forward pass.
pub(super) struct MaskJob<'a> {
    /// Its index among the step's outputs.
    pub output: usize,
    pub constraint: &'a mut Constraint,
    pub allowed: Option<crate::error::Result<AllowedTokens>>,
    /// How long [`Constraint::allowed`] took.
    pub seconds: f64,
}

impl MaskJob<'_> {
    /// Computes the row's allowed tokens.
    pub fn run(&mut self) {
        let start = Instant::now();
        self.allowed = Some(self.constraint.allowed());
        self.seconds = start.elapsed().as_secs_f64();
    }
}
