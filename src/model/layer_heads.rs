//! Per-layer head counts (what `transformer prune` leaves, Michel et al. 2019): the sites an
//! attention sits at and, per site, the heads each layer keeps. A leaf like [`super::config`],
//! which re-exports both types and holds them in [`ModelConfig::layer_heads`](
//! super::config::ModelConfig::layer_heads).

use serde::{Deserialize, Serialize};

/// Where an attention sits in a model: the encoder's self-attention, the decoder's (or a
/// language model's) self-attention, or the decoder's cross-attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttentionSite {
    /// The encoder's self-attention.
    Encoder,
    /// The decoder's (a language model's) causal self-attention.
    Decoder,
    /// The decoder's attention over the encoder's output.
    Cross,
}

impl AttentionSite {
    /// Every site, in the order encoder, decoder, cross.
    pub const ALL: [AttentionSite; 3] = [
        AttentionSite::Encoder,
        AttentionSite::Decoder,
        AttentionSite::Cross,
    ];

    /// The site's name in tables, JSON and `config.json`.
    pub fn name(self) -> &'static str {
        match self {
            AttentionSite::Encoder => "encoder",
            AttentionSite::Decoder => "decoder",
            AttentionSite::Cross => "cross",
        }
    }
}

/// The heads each layer keeps after pruning, per [`AttentionSite`]: a list per site, one count
/// per layer of it, or empty when every layer of that site has `n_heads`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerHeads {
    /// The encoder layers' self-attention heads.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub encoder: Vec<usize>,
    /// The decoder layers' (a language model's blocks') self-attention heads.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decoder: Vec<usize>,
    /// The decoder layers' cross-attention heads.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cross: Vec<usize>,
}

impl LayerHeads {
    /// No layer pruned.
    pub fn is_empty(&self) -> bool {
        self.encoder.is_empty() && self.decoder.is_empty() && self.cross.is_empty()
    }

    /// The list of `site`.
    pub fn of(&self, site: AttentionSite) -> &Vec<usize> {
        match site {
            AttentionSite::Encoder => &self.encoder,
            AttentionSite::Decoder => &self.decoder,
            AttentionSite::Cross => &self.cross,
        }
    }

    /// The list of `site`, to edit.
    pub fn of_mut(&mut self, site: AttentionSite) -> &mut Vec<usize> {
        match site {
            AttentionSite::Encoder => &mut self.encoder,
            AttentionSite::Decoder => &mut self.decoder,
            AttentionSite::Cross => &mut self.cross,
        }
    }
}
