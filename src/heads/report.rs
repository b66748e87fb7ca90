//! The table `transformer heads` prints: one row per head with its importance and what it does.

use super::behaviour::Behaviour;
use super::importance::Importance;
use serde::Serialize;

/// One head's line.
#[derive(Clone, Debug, Serialize)]
pub struct HeadRow {
    /// `encoder`, `decoder` or `cross`.
    pub site: &'static str,
    pub layer: usize,
    pub head: usize,
    /// `Î_h`: the importance normalised by the layer's ℓ2 norm.
    pub importance: f64,
    /// `I_h = E|∂L/∂ξ_h|` before the normalisation.
    pub importance_raw: f64,
    /// Mean `Σ_j α_ij |i − j|`.
    pub distance: f64,
    /// Mean entropy of the weights, nats.
    pub entropy: f64,
    /// Mean weight on the previous key.
    pub previous: f64,
    /// Mean weight on the same position.
    pub same: f64,
    /// Mean weight on the first key.
    pub first: f64,
}

/// The rows of every head, sites in the model's order, then layers, then heads.
pub fn rows(importance: &Importance, behaviour: &Behaviour) -> Vec<HeadRow> {
    let (raw, normalised, means) = (
        importance.mean(),
        importance.normalised(),
        behaviour.means(),
    );
    let mut rows = Vec::new();
    for (((site, raw), (_, norm)), (_, what)) in raw.iter().zip(&normalised).zip(&means) {
        for (layer, ((raw, norm), what)) in raw.iter().zip(norm).zip(what).enumerate() {
            for (head, ((&r, &n), w)) in raw.iter().zip(norm).zip(what).enumerate() {
                rows.push(HeadRow {
                    site: site.name(),
                    layer,
                    head,
                    importance: n,
                    importance_raw: r,
                    distance: w.distance,
                    entropy: w.entropy,
                    previous: w.previous,
                    same: w.same,
                    first: w.first,
                });
            }
        }
    }
    rows
}

/// The rows as an aligned text table.
pub fn text_table(rows: &[HeadRow]) -> String {
    let mut out = format!(
        "{:<8} {:>5} {:>4} {:>10} {:>12} {:>8} {:>7} {:>6} {:>6} {:>6}\n",
        "site",
        "layer",
        "head",
        "importance",
        "raw E|dL/dξ|",
        "distance",
        "entropy",
        "prev",
        "same",
        "first"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<8} {:>5} {:>4} {:>10.4} {:>12.4e} {:>8.2} {:>7.3} {:>6.3} {:>6.3} {:>6.3}\n",
            r.site,
            r.layer,
            r.head,
            r.importance,
            r.importance_raw,
            r.distance,
            r.entropy,
            r.previous,
            r.same,
            r.first
        ));
    }
    out
}
