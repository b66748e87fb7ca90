//! Head gates (Michel et al. 2019, "Are Sixteen Heads Really Better than One?"): a scalar ξ_h
//! on each head's output before the output projection,
//! `MultiHead(Q, K, V) = Concat(ξ₁ head₁ … ξ_h head_h) W^O`, all 1 in a plain model.
//!
//! Its gradient comes from the backward the layer already has: `W^O`'s backward returns
//! `∂L/∂(ξ_h head_h)` for the gated concatenation, and `∂L/∂ξ_h = Σ_rows head_h · ∂L/∂(ξ_h head_h)`
//! (the dot product of head `h`'s slice of the forward's saved heads with its slice of that
//! gradient). Head importance (`crate::heads`) is the expectation of `|∂L/∂ξ_h|` at ξ = 1;
//! a gate of 0 removes the head, which `crate::heads::prune` does physically.

use crate::Float;
use std::borrow::Cow;

/// `ctx [rows, heads·d_k]` with head `h`'s `d_k` columns multiplied by `gates[h]`; `ctx` itself
/// (borrowed) when there are no gates.
pub fn gated<'a, T: Float>(gates: &[f64], ctx: &'a [T], d_head: usize) -> Cow<'a, [T]> {
    if gates.is_empty() {
        return Cow::Borrowed(ctx);
    }
    let mut out = ctx.to_vec();
    for row in out.chunks_mut(gates.len() * d_head) {
        for (head, &g) in row.chunks_mut(d_head).zip(gates) {
            head.iter_mut().for_each(|x| *x = T::of(x.f64() * g));
        }
    }
    Cow::Owned(out)
}

/// The gates' backward. `dctx [rows, heads·d_k]` holds `∂L/∂(ξ_h head_h)` on entry (the
/// gradient `W^O`'s backward returns); adds `∂L/∂ξ_h = Σ_rows head_h · ∂L/∂(ξ_h head_h)` to
/// `grads` (when given) from the ungated heads `ctx`, then leaves `∂L/∂head_h =
/// ξ_h ∂L/∂(ξ_h head_h)` in `dctx`.
pub fn gate_backward<T: Float>(
    (gates, grads): (&[f64], Option<&mut Vec<f64>>),
    ctx: &[T],
    dctx: &mut [T],
    d_head: usize,
) {
    if let Some(grads) = grads {
        let width = grads.len() * d_head;
        for (row, drow) in ctx.chunks(width).zip(dctx.chunks(width)) {
            let heads = row.chunks(d_head).zip(drow.chunks(d_head));
            for (g, (h, dh)) in grads.iter_mut().zip(heads) {
                *g += h
                    .iter()
                    .zip(dh)
                    .map(|(a, b)| a.f64() * b.f64())
                    .sum::<f64>();
            }
        }
    }
    if !gates.is_empty() {
        for drow in dctx.chunks_mut(gates.len() * d_head) {
            for (dh, &g) in drow.chunks_mut(d_head).zip(gates) {
                dh.iter_mut().for_each(|x| *x = T::of(x.f64() * g));
            }
        }
    }
}
