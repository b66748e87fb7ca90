//! What each attention head does and how much the model needs it (Michel et al. 2019, "Are
//! Sixteen Heads Really Better than One?"), and removing the heads it needs least.
//!
//! - [`importance`]: `I_h = E_x |∂L(x)/∂ξ_h|` for the gate ξ_h on each head's output
//!   (`crate::model::head_gate`), at ξ = 1, the expectation taken over the batches of a data
//!   set (the absolute value of each batch's gradient of the mean token loss, averaged over the
//!   batches), then normalised per layer by the ℓ2 norm over the layer's heads as the paper
//!   does: `Î_h = I_h / ‖I_layer‖₂`.
//! - [`behaviour`]: from each head's attention weights `α_ij` on the same data, the mean
//!   attention distance `Σ_j α_ij |i − j|`, the entropy `−Σ_j α_ij ln α_ij` (nats), and the
//!   weight on the previous key (`j = i − 1`), the same position (`j = i`) and the first key
//!   (`j = 0`), each averaged over the queries.
//! - [`prune`]: the heads chosen by importance (lowest normalised score first, over all layers
//!   and sites at once, as the paper prunes) or at random, removed physically: smaller query,
//!   key and value row blocks and output-projection column blocks, per-layer head counts in
//!   `config.json` ([`LayerHeads`](crate::model::config::LayerHeads)).
//! - [`fine_tune`]: a short fine-tune of a pruned language model from fresh Adam moments.
//!
//! Every model is seen through [`HeadModel`]: its attentions, each with its
//! [`AttentionSite`] (encoder self, decoder self, cross) and layer.

pub mod behaviour;
pub mod fine_tune;
pub mod importance;
pub mod prune;
pub mod report;
pub mod run;

use crate::model::attention::MultiHeadAttention;
use crate::model::config::{AttentionSite, ModelConfig};
use crate::model::{LanguageModel, Seq2Seq};

/// A model whose attention heads can be gated, scored and removed.
pub trait HeadModel<T> {
    /// Every attention with its site and layer, in the order encoder, decoder self, cross.
    fn attentions(&self) -> Vec<(AttentionSite, usize, &MultiHeadAttention<T>)>;
    /// [`attentions`](Self::attentions), to change.
    fn attentions_mut(&mut self) -> Vec<(AttentionSite, usize, &mut MultiHeadAttention<T>)>;
    /// The model's config (its per-layer head counts are updated by pruning).
    fn model_config_mut(&mut self) -> &mut ModelConfig;
    /// The sites this kind of model has.
    fn sites(&self) -> &'static [AttentionSite];
}

impl<T> HeadModel<T> for LanguageModel<T> {
    fn attentions(&self) -> Vec<(AttentionSite, usize, &MultiHeadAttention<T>)> {
        let layers = self.blocks.layers.iter().enumerate();
        layers
            .map(|(i, l)| (AttentionSite::Decoder, i, &l.self_attn))
            .collect()
    }
    fn attentions_mut(&mut self) -> Vec<(AttentionSite, usize, &mut MultiHeadAttention<T>)> {
        let layers = self.blocks.layers.iter_mut().enumerate();
        layers
            .map(|(i, l)| (AttentionSite::Decoder, i, &mut l.self_attn))
            .collect()
    }
    fn model_config_mut(&mut self) -> &mut ModelConfig {
        &mut self.config
    }
    fn sites(&self) -> &'static [AttentionSite] {
        &[AttentionSite::Decoder]
    }
}

impl<T> HeadModel<T> for Seq2Seq<T> {
    fn attentions(&self) -> Vec<(AttentionSite, usize, &MultiHeadAttention<T>)> {
        let mut all = Vec::new();
        for (i, l) in self.encoder.layers.iter().enumerate() {
            all.push((AttentionSite::Encoder, i, &l.self_attn));
        }
        for (i, l) in self.decoder.layers.iter().enumerate() {
            all.push((AttentionSite::Decoder, i, &l.self_attn));
        }
        for (i, l) in self.decoder.layers.iter().enumerate() {
            all.push((AttentionSite::Cross, i, &l.cross_attn));
        }
        all
    }
    fn attentions_mut(&mut self) -> Vec<(AttentionSite, usize, &mut MultiHeadAttention<T>)> {
        let mut all = Vec::new();
        for (i, l) in self.encoder.layers.iter_mut().enumerate() {
            all.push((AttentionSite::Encoder, i, &mut l.self_attn));
        }
        let mut cross = Vec::new();
        for (i, l) in self.decoder.layers.iter_mut().enumerate() {
            all.push((AttentionSite::Decoder, i, &mut l.self_attn));
            cross.push((AttentionSite::Cross, i, &mut l.cross_attn));
        }
        all.extend(cross);
        all
    }
    fn model_config_mut(&mut self) -> &mut ModelConfig {
        &mut self.config
    }
    fn sites(&self) -> &'static [AttentionSite] {
        &AttentionSite::ALL
    }
}

/// Per site, per layer, one value per head: `[site][layer][head]`, sites in the model's
/// [`HeadModel::sites`] order.
pub type PerHead<V> = Vec<(AttentionSite, Vec<Vec<V>>)>;

/// A [`PerHead`] table of the model's shape, every entry `value`.
pub fn per_head<T, V: Clone>(model: &impl HeadModel<T>, value: V) -> PerHead<V> {
    let attentions = model.attentions();
    model
        .sites()
        .iter()
        .map(|&site| {
            let layers = attentions
                .iter()
                .filter(|(s, _, _)| *s == site)
                .map(|(_, _, a)| vec![value.clone(); a.n_heads])
                .collect();
            (site, layers)
        })
        .collect()
}

/// The entry of `site` in a [`PerHead`] table.
pub fn site_of<V>(table: &mut PerHead<V>, site: AttentionSite) -> &mut Vec<Vec<V>> {
    let i = table.iter().position(|(s, _)| *s == site);
    &mut table[i.expect("a site of the model")].1
}

#[cfg(test)]
mod tests;
