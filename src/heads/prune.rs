//! Removing heads physically (Michel et al. 2019, section 4): a pruned layer computes
//! `Concat(head_h, h kept) W^O_kept`, exactly what the unpruned layer computes with the removed
//! heads' gates ξ_h = 0, with smaller matrices: the kept heads' `d_k`-row blocks of `W^Q`
//! (and its bias), the kept key/value heads' row blocks of `W^K` and `W^V`, the kept heads'
//! `d_k`-column blocks of `W^O` (its bias unchanged).
//!
//! With grouped-query attention a key/value head serves a group of query heads: only whole
//! groups are removed (a group is one unit of choice, scored by the sum of its heads'
//! importance). Every layer keeps at least one unit: a request that would empty a layer is
//! refused. The per-layer counts go to the config's
//! [`layer_heads`](crate::model::config::LayerHeads), so the pruned model loads and runs
//! wherever the unpruned one does.

use super::{HeadModel, PerHead};
use crate::error::{Error, Result};
use crate::model::attention::MultiHeadAttention;
use crate::model::config::AttentionSite;
use crate::model::linear::Linear;
use crate::rng::Rng;
use crate::tensor::Tensor;
use crate::Float;

/// One query head of a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HeadId {
    pub site: AttentionSite,
    pub layer: usize,
    pub head: usize,
}

/// The order in which heads go.
#[derive(Clone, Debug)]
pub enum Order {
    /// Lowest normalised importance first (`[site][layer][head]`, see [`super::importance`]).
    Importance(PerHead<f64>),
    /// A random order drawn from this seed.
    Random(u64),
}

/// One unit of removal: the query heads `first .. first + size` of a layer (one head, or one
/// key/value group).
#[derive(Clone, Copy, Debug)]
struct Unit {
    site: AttentionSite,
    layer: usize,
    first: usize,
    size: usize,
}

/// The query heads in the model, and the most that may go (every layer keeps one unit).
pub fn removable<T>(model: &impl HeadModel<T>) -> (usize, usize) {
    let mut total = 0;
    let mut most = 0;
    for (_, _, a) in model.attentions() {
        total += a.n_heads;
        most += a.n_heads - a.n_heads / a.n_kv_heads;
    }
    (total, most)
}

/// Chooses `n` query heads to remove in `order`, whole key/value groups at a time, never the
/// last group of a layer. Refuses `n` that is not a whole number of groups or more than can go.
pub fn choose<T>(model: &impl HeadModel<T>, n: usize, order: &Order) -> Result<Vec<HeadId>> {
    let attentions = model.attentions();
    let (total, most) = removable(model);
    if n > most {
        return Err(Error::Input(format!(
            "cannot remove {n} of the model's {total} heads: at most {most} can go (every \
             layer keeps at least one head{})",
            if most + attentions.len() < total {
                " group"
            } else {
                ""
            }
        )));
    }
    let mut units = Vec::new();
    let mut group = 1;
    for (site, layer, a) in &attentions {
        group = a.n_heads / a.n_kv_heads;
        for g in 0..a.n_kv_heads {
            units.push(Unit {
                site: *site,
                layer: *layer,
                first: g * group,
                size: group,
            });
        }
    }
    if !n.is_multiple_of(group) {
        return Err(Error::Input(format!(
            "cannot remove {n} heads: the model's query heads share key/value heads in groups \
             of {group}, and only whole groups can be removed (give a multiple of {group})"
        )));
    }
    match order {
        Order::Random(seed) => Rng::new(*seed).shuffle(&mut units),
        Order::Importance(scores) => {
            let score = |u: &Unit| -> f64 {
                let (_, layers) = scores
                    .iter()
                    .find(|(s, _)| *s == u.site)
                    .expect("scores of every site");
                layers[u.layer][u.first..u.first + u.size].iter().sum()
            };
            // Stable: equal scores keep the model's order.
            units.sort_by(|a, b| score(a).total_cmp(&score(b)));
        }
    }
    let mut left: Vec<(AttentionSite, usize, usize)> = attentions
        .iter()
        .map(|(s, l, a)| (*s, *l, a.n_kv_heads))
        .collect();
    let mut chosen = Vec::new();
    for u in units {
        if chosen.len() >= n {
            break;
        }
        let entry = left
            .iter_mut()
            .find(|(s, l, _)| *s == u.site && *l == u.layer)
            .expect("a unit of a layer");
        if entry.2 > 1 {
            entry.2 -= 1;
            chosen.extend((u.first..u.first + u.size).map(|head| HeadId {
                site: u.site,
                layer: u.layer,
                head,
            }));
        }
    }
    chosen.sort();
    Ok(chosen)
}

/// Removes the heads `remove` from `model` and writes the per-layer counts into its config.
/// Refuses an unknown head, a partial key/value group, or a layer left without heads.
pub fn prune<T: Float>(model: &mut impl HeadModel<T>, remove: &[HeadId]) -> Result<()> {
    let sites = model.sites();
    for r in remove {
        let found = model
            .attentions()
            .into_iter()
            .find(|(s, l, _)| *s == r.site && *l == r.layer);
        match found {
            Some((_, _, a)) if r.head < a.n_heads => {}
            _ => {
                return Err(Error::Input(format!(
                    "no head {} in layer {} of the {} attention",
                    r.head,
                    r.layer,
                    r.site.name()
                )))
            }
        }
    }
    let mut counts: Vec<(AttentionSite, Vec<usize>)> = Vec::new();
    for (site, layer, a) in model.attentions_mut() {
        let gone: Vec<usize> = remove
            .iter()
            .filter(|r| r.site == site && r.layer == layer)
            .map(|r| r.head)
            .collect();
        let keep: Vec<usize> = (0..a.n_heads).filter(|h| !gone.contains(h)).collect();
        if !gone.is_empty() {
            *a = prune_attention(a, &keep).map_err(|e| {
                Error::Input(format!(
                    "layer {layer} of the {} attention: {e}",
                    site.name()
                ))
            })?;
        }
        match counts.iter_mut().find(|(s, _)| *s == site) {
            Some((_, c)) => c.push(a.n_heads),
            None => counts.push((site, vec![a.n_heads])),
        }
    }
    let config = model.model_config_mut();
    for (site, heads) in counts {
        if sites.contains(&site) && heads.iter().any(|&h| h != config.n_heads) {
            *config.layer_heads.of_mut(site) = heads;
        }
    }
    config.validate().map_err(Error::Config)
}

/// The attention with only the query heads `keep` (ascending), which must be whole key/value
/// groups and not empty.
pub fn prune_attention<T: Float>(
    a: &MultiHeadAttention<T>,
    keep: &[usize],
) -> std::result::Result<MultiHeadAttention<T>, String> {
    let group = a.n_heads / a.n_kv_heads;
    if keep.is_empty() {
        return Err("every head would be removed (a layer keeps at least one)".into());
    }
    let groups: Vec<usize> = keep
        .iter()
        .filter(|h| *h % group == 0)
        .map(|h| h / group)
        .collect();
    let whole = groups.len() * group == keep.len()
        && groups
            .iter()
            .all(|g| (g * group..(g + 1) * group).all(|h| keep.contains(&h)));
    if !whole {
        return Err(format!(
            "heads share key/value heads in groups of {group}: only whole groups can be removed"
        ));
    }
    let d = a.d_head;
    let mut out = a.clone();
    out.q_proj = keep_rows(&a.q_proj, keep, d);
    out.k_proj = keep_rows(&a.k_proj, &groups, d);
    out.v_proj = keep_rows(&a.v_proj, &groups, d);
    out.out_proj = keep_columns(&a.out_proj, keep, d);
    out.n_heads = keep.len();
    out.n_kv_heads = groups.len();
    if !a.gates.is_empty() {
        out.gates = keep.iter().map(|&h| a.gates[h]).collect();
    }
    out.gate_grads = None;
    Ok(out)
}

/// A linear layer of the row blocks `blocks` (each `d` rows) of `w [d_out, d_in]` and its bias.
fn keep_rows<T: Float>(w: &Linear<T>, blocks: &[usize], d: usize) -> Linear<T> {
    let d_in = w.d_in;
    let rows: Vec<usize> = blocks.iter().flat_map(|b| b * d..(b + 1) * d).collect();
    let mut out = Linear::with_bias(d_in, rows.len(), w.bias.is_some(), &mut Rng::new(0));
    let value = &w.weight.value.data;
    let data = rows
        .iter()
        .flat_map(|&r| value[r * d_in..(r + 1) * d_in].iter().copied())
        .collect();
    out.weight.value = Tensor::from_vec(data, &[rows.len(), d_in]);
    if let (Some(b), Some(new)) = (&w.bias, &mut out.bias) {
        let data = rows.iter().map(|&r| b.value.data[r]).collect();
        new.value = Tensor::from_vec(data, &[rows.len()]);
    }
    out
}

/// A linear layer of the column blocks `blocks` (each `d` columns) of `w [d_out, d_in]`, its
/// bias unchanged.
fn keep_columns<T: Float>(w: &Linear<T>, blocks: &[usize], d: usize) -> Linear<T> {
    let (d_in, d_out) = (w.d_in, w.d_out);
    let cols: Vec<usize> = blocks.iter().flat_map(|b| b * d..(b + 1) * d).collect();
    let mut out = Linear::with_bias(cols.len(), d_out, w.bias.is_some(), &mut Rng::new(0));
    let value = &w.weight.value.data;
    let data = (0..d_out)
        .flat_map(|r| cols.iter().map(move |&c| value[r * d_in + c]))
        .collect();
    out.weight.value = Tensor::from_vec(data, &[d_out, cols.len()]);
    if let (Some(b), Some(new)) = (&w.bias, &mut out.bias) {
        new.value = b.value.clone();
    }
    out
}
