//! The encoder (section 3.1): a [`Stack`] of N identical [`SelfAttentionBlock`]s over the
//! embedded source, each self-attention seeing every real source token (padding keys masked),
//! and a final norm when the blocks are pre-LN. Its output, the "memory", is what every decoder
//! layer's cross-attention reads.

use super::block::SelfAttentionBlock;
use super::stack::Stack;
use crate::backend::AttnMask;

/// N self-attention blocks with a padding mask.
pub type Encoder<T> = Stack<SelfAttentionBlock<T>, T>;

/// The encoder's mask: every query sees the real keys of its sentence, `0 .. src_lens[b]`.
pub fn padding_mask(src_lens: &[usize]) -> AttnMask<'_> {
    AttnMask {
        key_lens: src_lens,
        causal: false,
        q_offset: 0,
    }
}
