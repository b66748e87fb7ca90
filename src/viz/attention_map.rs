//! Attention heat maps: the weights `softmax(Q Kᵀ / √d_k)` of every layer and head, one small
//! matrix per panel with the query tokens down the left side and the key tokens along the top.
//!
//! [`attention_maps`] runs one teacher-forced inference of a single sentence pair that returns
//! its attention weights ([`Seq2Seq::attention_weights`], the plain kernel at any length) and
//! collects the encoder self-attention, decoder self-attention and encoder-decoder (cross)
//! attention of every layer and head; [`draw_attention_grid`] draws panels as a grid of heat
//! maps.

use super::{msg, render, VizError, FONT};
use crate::batch::{Batch, BOS, EOS, PAD, UNK};
use crate::model::Seq2Seq;
use crate::text::vocab::{Vocab, SPECIAL_TOKENS};
use crate::Float;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;

/// One heat map: `weights[i][j]` is how much query `rows[i]` attends to key `cols[j]`.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionPanel {
    /// What the panel shows, e.g. "encoder layer 1 head 2".
    pub label: String,
    /// Query tokens, top to bottom.
    pub rows: Vec<String>,
    /// Key tokens, left to right.
    pub cols: Vec<String>,
    /// `[rows.len()][cols.len()]`, each value in 0..=1.
    pub weights: Vec<Vec<f32>>,
}

/// Every attention map of one sentence pair, layer-major (layer 1 heads 1..h, layer 2 ...).
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionMaps {
    /// Heads per layer.
    pub heads: usize,
    /// Source tokens, EOS included: the encoder's positions.
    pub src_tokens: Vec<String>,
    /// Decoder input tokens: BOS then the target.
    pub tgt_tokens: Vec<String>,
    /// Encoder self-attention: source x source.
    pub encoder: Vec<AttentionPanel>,
    /// Decoder (causal) self-attention: target x target.
    pub decoder: Vec<AttentionPanel>,
    /// Encoder-decoder attention: target x source.
    pub cross: Vec<AttentionPanel>,
}

/// How a token is written on an axis: specials as `<s>`, `</s>`, ...; a space as `␣`; ids
/// outside the vocabulary as `<unk>`; long tokens cut to 14 characters.
pub fn token_label(vocab: &Vocab, id: u32) -> String {
    if id <= UNK {
        return SPECIAL_TOKENS[id as usize].to_string();
    }
    let token = vocab.token(id).unwrap_or(SPECIAL_TOKENS[UNK as usize]);
    if token.trim().is_empty() {
        return token.chars().map(|_| '␣').collect();
    }
    let mut chars = token.chars();
    let short: String = chars.by_ref().take(13).collect();
    if chars.next().is_some() {
        format!("{short}…")
    } else {
        short
    }
}

/// Attention weights of one sentence pair (`src`, `tgt`: token ids without specials): one
/// teacher-forced inference without dropout on the batch `src EOS` / `BOS tgt` that returns
/// every layer's and head's attention probabilities.
pub fn attention_maps<T: Float>(
    model: &Seq2Seq<T>,
    src: &[u32],
    tgt: &[u32],
    vocab: &Vocab,
) -> AttentionMaps {
    let batch = Batch::from_pairs(&[(src, tgt)]);
    let (encoder, decoder) = model.attention_weights(&batch);
    let src_tokens: Vec<String> = batch.src.iter().map(|&id| token_label(vocab, id)).collect();
    let tgt_tokens: Vec<String> = batch
        .tgt_in
        .iter()
        .map(|&id| token_label(vocab, id))
        .collect();
    debug_assert!(!batch.src.contains(&PAD) && batch.src.last() == Some(&EOS));
    debug_assert!(!batch.tgt_in.contains(&PAD) && batch.tgt_in.first() == Some(&BOS));
    let mut maps = AttentionMaps {
        heads: model.config.n_heads,
        src_tokens,
        tgt_tokens,
        encoder: Vec::new(),
        decoder: Vec::new(),
        cross: Vec::new(),
    };
    for (l, w) in encoder.iter().enumerate() {
        let src = &maps.src_tokens;
        maps.encoder.extend(panels(w, "encoder", l, src, src));
    }
    for (l, w) in decoder.iter().enumerate() {
        let (src, tgt) = (&maps.src_tokens, &maps.tgt_tokens);
        maps.decoder
            .extend(panels(&w.self_attn, "decoder", l, tgt, tgt));
        maps.cross
            .extend(panels(&w.cross_attn, "cross", l, tgt, src));
    }
    maps
}

/// The panels of every head of one attention layer's weights `[1, heads, rows, cols]` (a
/// pruned layer has fewer heads than the config's `n_heads`).
fn panels<T: Float>(
    weights: &[T],
    kind: &str,
    layer: usize,
    rows: &[String],
    cols: &[String],
) -> Vec<AttentionPanel> {
    let (q_len, k_len) = (rows.len(), cols.len());
    let heads = weights.len() / (q_len * k_len);
    assert_eq!(weights.len(), heads * q_len * k_len);
    (0..heads)
        .map(|h| {
            let head = &weights[h * q_len * k_len..(h + 1) * q_len * k_len];
            AttentionPanel {
                label: format!("{kind} layer {} head {}", layer + 1, h + 1),
                rows: rows.to_vec(),
                cols: cols.to_vec(),
                weights: head
                    .chunks(k_len)
                    .map(|row| row.iter().map(|&p| p.f64() as f32).collect())
                    .collect(),
            }
        })
        .collect()
}

/// Draws `maps` as a grid of heat maps (columns chosen from the count: up to 4 per row) under
/// `title`, to `out` (`.png` or `.svg`).
pub fn draw_attention_grid(
    out: &Path,
    title: &str,
    maps: &[AttentionPanel],
) -> Result<(), VizError> {
    let columns = maps.len().clamp(1, 4);
    draw_attention_grid_with_columns(out, title, maps, columns)
}

/// Pixels of the grid layout of one panel.
struct Layout {
    cell: u32,
    /// Font size of the tokens (smaller for small cells).
    font: u32,
    /// Left of the matrix: room for the row tokens.
    left: u32,
    /// Above the matrix: the panel label and the (vertical) column tokens.
    top: u32,
    width: u32,
    height: u32,
}

const LABEL_FONT: u32 = 15;
const HEADER: u32 = 80;

/// Like [`draw_attention_grid`] with `columns` panels per row (e.g. the number of heads, so
/// each row of the grid is one layer).
pub fn draw_attention_grid_with_columns(
    out: &Path,
    title: &str,
    maps: &[AttentionPanel],
    columns: usize,
) -> Result<(), VizError> {
    if maps.is_empty() {
        return Err(VizError::Input(format!(
            "{}: no attention maps to draw",
            out.display()
        )));
    }
    for m in maps {
        if m.rows.is_empty()
            || m.cols.is_empty()
            || m.weights.len() != m.rows.len()
            || m.weights.iter().any(|r| r.len() != m.cols.len())
        {
            return Err(VizError::Input(format!(
                "attention map \"{}\": weights must be {} x {} (rows x column tokens) and non-empty",
                m.label,
                m.rows.len(),
                m.cols.len()
            )));
        }
    }
    let columns = columns.clamp(1, maps.len());
    let grid_rows = maps.len().div_ceil(columns);
    let max_rows = maps.iter().map(|m| m.rows.len()).max().unwrap_or(1);
    let max_cols = maps.iter().map(|m| m.cols.len()).max().unwrap_or(1);
    let longest = |tokens: &dyn Fn(&AttentionPanel) -> &Vec<String>| {
        maps.iter()
            .flat_map(|m| tokens(m).iter().map(|t| t.chars().count()))
            .max()
            .unwrap_or(1) as u32
    };
    // Cells shrink for long sentences so a panel stays within about 600 pixels; tokens are
    // written in a font that fits the cell (and left out below 8 pixels).
    let cell = (600 / max_rows.max(max_cols) as u32).clamp(4, 26);
    let font = (cell - 1).min(13);
    let char_w = if cell >= 8 { font * 6 / 10 + 1 } else { 0 };
    let left = 12 + char_w * longest(&|m| &m.rows).min(15);
    let top = LABEL_FONT + 14 + char_w * longest(&|m| &m.cols).min(15);
    let label_chars = maps
        .iter()
        .map(|m| m.label.chars().count())
        .max()
        .unwrap_or(1);
    let label_width = 24 + LABEL_FONT * 6 / 10 * label_chars as u32;
    let panel = Layout {
        cell,
        font,
        left,
        top,
        width: (left + cell * max_cols as u32 + 24).max(label_width),
        height: top + cell * max_rows as u32 + 24,
    };
    let width = (panel.width * columns as u32).max(420);
    let height = HEADER + panel.height * grid_rows as u32;
    render!(out, (width, height), |root| draw_grid(
        &root, title, maps, columns, &panel
    ))
}

/// Viridis, from 0 (dark purple) to 1 (yellow), linearly between 9 stops.
fn viridis(t: f32) -> RGBColor {
    const STOPS: [(u8, u8, u8); 9] = [
        (68, 1, 84),
        (71, 44, 122),
        (59, 81, 139),
        (44, 113, 142),
        (33, 144, 141),
        (39, 173, 129),
        (92, 200, 99),
        (170, 220, 50),
        (253, 231, 37),
    ];
    let t = if t.is_finite() {
        t.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let x = t * (STOPS.len() - 1) as f32;
    let i = (x.floor() as usize).min(STOPS.len() - 2);
    let f = x - i as f32;
    let mix = |a: u8, b: u8| (a as f32 + (b as f32 - a as f32) * f).round() as u8;
    let (a, b) = (STOPS[i], STOPS[i + 1]);
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

fn draw_grid<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    maps: &[AttentionPanel],
    columns: usize,
    layout: &Layout,
) -> Result<(), String> {
    root.fill(&WHITE).map_err(msg)?;
    let (width, _) = root.dim_in_pixel();
    let title_style = TextStyle::from((FONT, 22).into_font())
        .color(&BLACK)
        .pos(Pos::new(HPos::Center, VPos::Top));
    root.draw(&Text::new(
        title.to_string(),
        (width as i32 / 2, 12),
        title_style,
    ))
    .map_err(msg)?;
    // Colour scale: 0 .. 1 under the title.
    let small = TextStyle::from((FONT, 13).into_font()).color(&BLACK);
    let (bar_x, bar_y, bar_w) = (width as i32 / 2 - 100, 48, 200);
    for i in 0..bar_w {
        let c = viridis(i as f32 / (bar_w - 1) as f32);
        root.draw(&Rectangle::new(
            [(bar_x + i, bar_y), (bar_x + i + 1, bar_y + 12)],
            c.filled(),
        ))
        .map_err(msg)?;
    }
    let right = small.pos(Pos::new(HPos::Right, VPos::Center));
    root.draw(&Text::new("weight 0", (bar_x - 6, bar_y + 6), right))
        .map_err(msg)?;
    let left = small.pos(Pos::new(HPos::Left, VPos::Center));
    root.draw(&Text::new("1", (bar_x + bar_w + 6, bar_y + 6), left))
        .map_err(msg)?;

    let label_style = TextStyle::from((FONT, LABEL_FONT).into_font())
        .color(&BLACK)
        .pos(Pos::new(HPos::Left, VPos::Top));
    let row_style = TextStyle::from((FONT, layout.font).into_font())
        .color(&BLACK)
        .pos(Pos::new(HPos::Right, VPos::Center));
    // Column tokens read bottom-up, ending just above their column.
    let col_style = TextStyle::from((FONT, layout.font).into_font())
        .color(&BLACK)
        .transform(FontTransform::Rotate270)
        .pos(Pos::new(HPos::Left, VPos::Center));
    let cell = layout.cell as i32;
    let show_tokens = layout.cell >= 8;
    for (n, m) in maps.iter().enumerate() {
        let x0 = (n % columns) as i32 * layout.width as i32;
        let y0 = HEADER as i32 + (n / columns) as i32 * layout.height as i32;
        root.draw(&Text::new(
            m.label.clone(),
            (x0 + 8, y0 + 4),
            label_style.clone(),
        ))
        .map_err(msg)?;
        let mx = x0 + layout.left as i32;
        let my = y0 + layout.top as i32;
        for (i, row) in m.weights.iter().enumerate() {
            for (j, &w) in row.iter().enumerate() {
                let (x, y) = (mx + j as i32 * cell, my + i as i32 * cell);
                root.draw(&Rectangle::new(
                    [(x, y), (x + cell, y + cell)],
                    viridis(w).filled(),
                ))
                .map_err(msg)?;
            }
        }
        let (w, h) = (m.cols.len() as i32 * cell, m.rows.len() as i32 * cell);
        root.draw(&Rectangle::new(
            [(mx, my), (mx + w, my + h)],
            RGBColor(120, 120, 120).stroke_width(1),
        ))
        .map_err(msg)?;
        if show_tokens {
            for (i, t) in m.rows.iter().enumerate() {
                let y = my + i as i32 * cell + cell / 2;
                root.draw(&Text::new(t.clone(), (mx - 5, y), row_style.clone()))
                    .map_err(msg)?;
            }
            for (j, t) in m.cols.iter().enumerate() {
                let x = mx + j as i32 * cell + cell / 2;
                root.draw(&Text::new(t.clone(), (x, my - 5), col_style.clone()))
                    .map_err(msg)?;
            }
        }
    }
    Ok(())
}
