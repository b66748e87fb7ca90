//! Prefix caching: a request whose prompt starts with tokens another request already fed
//! takes that request's KV blocks instead of computing them again (vLLM's automatic prefix
//! caching). A chat client re-sends its whole history every turn; with the cache only the new
//! turn is prefilled.
//!
//! A full block `i` of a row is named by a **chain key** over its tokens and the key of the
//! block before it:
//!
//! ```text
//! key_0 = H(SEED, tokens[0 .. b])        key_i = H(key_{i−1}, tokens[i·b .. (i+1)·b])
//! ```
//!
//! so equal keys mean equal tokens at every position up to the block's end, which (the model
//! being fixed for the engine's life, and a position's keys and values depending only on the
//! tokens up to it) means equal keys and values. `H` is SipHash (the standard library's, with
//! fixed keys); the index also keeps each block's own tokens and compares them on a hit, so a
//! hash collision would have to collide the whole chain and the last block's tokens.
//!
//! The index maps keys to block ids; the cache ([`crate::model::kv_cache`], its `prefix`
//! module) keeps a keyed block's keys and values after its last row leaves and evicts it only
//! under memory pressure, forgetting its key, so an entry here is valid only while the cache
//! still carries its key on that block ([`PrefixIndex::lookup`] checks, and drops stale ones).

use crate::model::lm::LmState;
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

/// The key before the first block.
const SEED: u64 = 0x7072_6566_6978;

/// The chain key of a block of `tokens` after the block keyed `parent` ([`SEED`] for the
/// first block).
pub fn chain_key(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// What a lookup found for one prompt.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hit {
    /// The cached blocks of the prompt's start, in order.
    pub blocks: Vec<u32>,
    /// The chain key of the last of them ([`SEED`] when none).
    pub last_key: u64,
    /// Full blocks looked up (hits + the first miss, if any).
    pub looked_up: usize,
}

/// Block ids by chain key (see the module docs).
#[derive(Debug, Default)]
pub struct PrefixIndex {
    /// Key → (block id, the block's tokens).
    blocks: HashMap<u64, (u32, Vec<u32>)>,
    /// Entries at most before stale ones are swept (twice the pool, at least 64).
    sweep_at: usize,
}

impl PrefixIndex {
    /// An index for a pool of `pool_blocks` blocks.
    pub fn new(pool_blocks: usize) -> Self {
        PrefixIndex {
            blocks: HashMap::new(),
            sweep_at: pool_blocks.saturating_mul(2).max(64),
        }
    }

    /// The cached blocks `prompt` may start with: at most `max_blocks` full blocks of
    /// `block_rows` tokens, as long as each is still cached in `state` under its key with
    /// these tokens.
    pub fn lookup(
        &mut self,
        prompt: &[u32],
        block_rows: usize,
        max_blocks: usize,
        state: &LmState<f32>,
    ) -> Hit {
        let mut hit = Hit {
            last_key: SEED,
            ..Hit::default()
        };
        for tokens in prompt.chunks_exact(block_rows).take(max_blocks) {
            hit.looked_up += 1;
            let key = chain_key(hit.last_key, tokens);
            let Some((id, held)) = self.blocks.get(&key) else {
                break;
            };
            let id = *id;
            if state.block_key(id) != Some(key) {
                // Evicted (and maybe reused) since: a stale entry.
                self.blocks.remove(&key);
                break;
            }
            if held != tokens {
                break;
            }
            hit.blocks.push(id);
            hit.last_key = key;
        }
        hit
    }

    /// Records that block `id` of `state` now holds the block of `tokens` keyed `key`.
    pub fn insert(&mut self, key: u64, id: u32, tokens: &[u32], state: &LmState<f32>) {
        self.blocks.insert(key, (id, tokens.to_vec()));
        if self.blocks.len() > self.sweep_at {
            self.blocks
                .retain(|key, (id, _)| state.block_key(*id) == Some(*key));
            self.sweep_at = self.sweep_at.max(2 * self.blocks.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_keys_name_the_whole_prefix() {
        let a = chain_key(SEED, &[1, 2, 3]);
        assert_eq!(a, chain_key(SEED, &[1, 2, 3]));
        assert_ne!(a, chain_key(SEED, &[1, 2, 4]));
        // The same block after different prefixes has different keys.
        let after_a = chain_key(a, &[9, 9, 9]);
        let after_b = chain_key(chain_key(SEED, &[3, 2, 1]), &[9, 9, 9]);
        assert_ne!(after_a, after_b);
    }
}

#[cfg(test)]
mod cacheable_tests {
    use crate::model::attention_kind::AttentionKind;
    use crate::model::{LanguageModel, ModelConfig};
    use crate::rng::Rng;
    use crate::serve::load::prefix_cacheable;

    /// Exact layers share prefixes; one windowed or linear layer turns the cache off.
    #[test]
    fn only_models_that_keep_every_block_share_prefixes() {
        let mut c = ModelConfig::preset("tiny", 29).unwrap();
        c.n_encoder_layers = 0;
        c.n_decoder_layers = 2;
        let lm = |c: &ModelConfig| LanguageModel::<f32>::new(c.clone(), &mut Rng::new(1));
        assert!(prefix_cacheable(&lm(&c)));
        let mut windowed = c.clone();
        windowed.layer_windows = vec![None, Some(4)];
        assert!(!prefix_cacheable(&lm(&windowed)));
        for kind in [AttentionKind::Linear, AttentionKind::Window { window: 8 }] {
            let mut other = c.clone();
            other.layer_attention = vec![AttentionKind::Exact, kind];
            assert!(!prefix_cacheable(&lm(&other)), "{kind:?}");
        }
    }
}
