//! The BERT encoder's training pass, forward and backward side by side, shared by the models
//! trained on top of it (masked-LM pre-training, [`super::masked_lm`]; sentence classification,
//! [`super::sentence_classifier`]):
//!
//! `x = Dropout(LayerNorm(E_word[t] + E_type[0] + E_pos[i]))`, `h = Encoder(x)` (post-LN blocks
//! with their dropout; every token sees every real token of its sequence, padding keys are
//! masked). Sequences are one segment: token type 0 throughout.
//!
//! Padding rows (after a sequence's `lens[b]` real tokens) are computed but carry no meaning; a
//! loss that reads only real rows gives them, and through them the padding ids' embeddings,
//! exactly zero gradient (their keys are masked, so no real row reads them).

use super::bert::Bert;
use super::block::SelfAttentionBlockCache;
use super::config::ModelConfig;
use super::encoder::padding_mask;
use super::masked_lm::bert_config_of;
use super::param::Init;
use super::stack::StackCache;
use crate::backend::{Backend, LayerNormStats, CPU};
use crate::rng::Rng;
use crate::Float;

/// What the encoder's forward keeps for its backward.
#[derive(Clone, Debug)]
pub struct EncoderCache<T> {
    ids: Vec<u32>,
    seq: usize,
    /// The embeddings' sum `[batch*seq, d]`, the layer norm's input, and its statistics.
    sum: Vec<T>,
    stats: LayerNormStats<T>,
    dropout: Option<Vec<T>>,
    blocks: StackCache<SelfAttentionBlockCache<T>, T>,
}

/// A fresh encoder of the masked-LM config `config` (see
/// [`super::masked_lm::mlm_config`]) with the config's dropout rates in its blocks:
/// tables and blocks drawn from `init` in that order.
pub fn training_bert<T: Float>(config: &ModelConfig, init: &mut impl Init) -> Bert<T> {
    let bert_config = bert_config_of(config);
    let mut block = bert_config.block();
    block.dropout = config.dropout;
    block.attention_dropout = config.attention_dropout;
    block.activation_dropout = config.activation_dropout;
    block.activation = config.activation;
    Bert::with_block(bert_config, &block, init)
}

/// `ids [batch, seq]` (sequence `b` padded after `lens[b]` tokens) -> the last hidden states
/// `h [batch*seq, d]` and the cache. Dropout at rate `dropout` on the embeddings (and the
/// blocks' own) when `rng` is given.
pub fn encoder_forward<T: Float>(
    bert: &Bert<T>,
    dropout: f64,
    ids: &[u32],
    lens: &[usize],
    mut rng: Option<&mut Rng>,
) -> (Vec<T>, EncoderCache<T>) {
    let batch = lens.len();
    assert!(
        batch > 0 && ids.len().is_multiple_of(batch),
        "ids must be [batch, seq]"
    );
    let seq = ids.len() / batch;
    let sum = bert.embedding_sum(ids, None, seq);
    let (mut x, stats) = bert.embeddings_norm.forward(&sum);
    let dropout = rng
        .as_deref_mut()
        .and_then(|r| CPU.dropout_mask::<T>(r, x.len(), dropout));
    if let Some(m) = &dropout {
        CPU.mul(&mut x, m);
    }
    let mask = padding_mask(lens);
    let (hidden, blocks) = bert
        .encoder
        .forward(x, rng, |l, x, r| l.forward(x, batch, mask, r));
    let cache = EncoderCache {
        ids: ids.to_vec(),
        seq,
        sum,
        stats,
        dropout,
        blocks,
    };
    (hidden, cache)
}

/// Backward from `dhidden [batch*seq, d]`: accumulates the gradients of the blocks, the
/// embeddings' layer norm and the three tables.
pub fn encoder_backward<T: Float>(bert: &mut Bert<T>, cache: EncoderCache<T>, dhidden: Vec<T>) {
    let d = bert.config.hidden_size;
    let mut dx = bert
        .encoder
        .backward(cache.blocks, dhidden, |l, c, dy| l.backward(c, dy));
    if let Some(m) = &cache.dropout {
        CPU.mul(&mut dx, m);
    }
    let dsum = bert.embeddings_norm.backward(&cache.sum, &cache.stats, &dx);
    let (word, pos, typ) = (
        &mut bert.word_embeddings.grad.data,
        &mut bert.position_embeddings.grad.data,
        &mut bert.token_type_embeddings.grad.data,
    );
    for (r, row) in dsum.chunks_exact(d).enumerate() {
        let (w, p) = (cache.ids[r] as usize * d, (r % cache.seq) * d);
        for j in 0..d {
            word[w + j] += row[j];
            pos[p + j] += row[j];
            typ[j] += row[j];
        }
    }
}
