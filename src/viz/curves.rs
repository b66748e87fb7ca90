//! Training curves from the JSON-lines metrics log that `transformer train` and `train-lm` write
//! (`OUT/metrics.jsonl`, see `train::metrics`: one object per line with `step`, `loss`, `nll`,
//! `lr`, `tokens_per_s`, and on validation steps `valid_loss`, `valid_nll`, possibly
//! `valid_bleu`; other fields are ignored here).
//!
//! The picture stacks one panel per quantity: the training loss (with the validation loss when
//! the log has any) against the step, the learning rate against the step, and the validation
//! BLEU against the step when the log has any.

use super::{msg, render, VizError, FONT};
use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::{Map, Value};
use std::path::Path;

/// One line of the metrics log.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsRecord {
    /// The update the line was written after.
    pub step: u64,
    /// Label-smoothed training loss per token (mean over the steps since the previous line).
    pub loss: f64,
    /// Training negative log-likelihood per token (mean over the steps since the previous line).
    pub nll: Option<f64>,
    /// The learning rate of the update.
    pub lr: f64,
    /// Tokens per second since the start of the run.
    pub tokens_per_s: Option<f64>,
    /// Validation loss per token, on validation steps.
    pub valid_loss: Option<f64>,
    /// Validation negative log-likelihood per token, on validation steps.
    pub valid_nll: Option<f64>,
    /// Greedy BLEU on the validation pairs, when measured.
    pub valid_bleu: Option<f64>,
}

/// Reads and checks a metrics log: blank lines are skipped; any other line must be a JSON
/// object with an integer `step` and numbers `loss` and `lr` (the other fields are optional,
/// `null` counts as absent). Errors name the file and the 1-based line.
pub fn read_metrics(path: &Path) -> Result<Vec<MetricsRecord>, VizError> {
    let text = std::fs::read_to_string(path).map_err(|cause| VizError::Read {
        path: path.to_path_buf(),
        cause,
    })?;
    let mut records = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |reason: String| VizError::Log {
            path: path.to_path_buf(),
            line: i + 1,
            reason,
        };
        let value: Value = serde_json::from_str(line)
            .map_err(|e| bad(format!("not valid JSON (column {}: {e})", e.column())))?;
        let Value::Object(map) = value else {
            return Err(bad("not a JSON object".into()));
        };
        records.push(parse_record(&map).map_err(bad)?);
    }
    if records.is_empty() {
        return Err(VizError::Input(format!(
            "{}: the metrics log has no records",
            path.display()
        )));
    }
    Ok(records)
}

fn parse_record(map: &Map<String, Value>) -> Result<MetricsRecord, String> {
    let number = |key: &str| -> Result<Option<f64>, String> {
        match map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .map(Some)
                .ok_or_else(|| format!("`{key}` is not a number: {v}")),
        }
    };
    let required = |key: &str| -> Result<f64, String> {
        number(key)?.ok_or_else(|| format!("missing field `{key}`"))
    };
    let step = match map.get("step") {
        None | Some(Value::Null) => return Err("missing field `step`".into()),
        Some(v) => v
            .as_u64()
            .ok_or_else(|| format!("`step` is not a non-negative integer: {v}"))?,
    };
    Ok(MetricsRecord {
        step,
        loss: required("loss")?,
        nll: number("nll")?,
        lr: required("lr")?,
        tokens_per_s: number("tokens_per_s")?,
        valid_loss: number("valid_loss")?,
        valid_nll: number("valid_nll")?,
        valid_bleu: number("valid_bleu")?,
    })
}

/// Reads the metrics log `metrics_jsonl` and draws its curves to `out` (`.png` or `.svg`).
///
/// To draw the curves of a training run: `plot_metrics(&out.join("metrics.jsonl"),
/// &out.join("curves.png"))`.
pub fn plot_metrics(metrics_jsonl: &Path, out: &Path) -> Result<(), VizError> {
    let records = read_metrics(metrics_jsonl)?;
    plot_records(&records, out)
}

/// One curve: a legend label, a colour and its (step, value) points.
struct Curve {
    label: &'static str,
    color: RGBColor,
    points: Vec<(f64, f64)>,
}

/// One panel: a title, a y-axis description, its curves.
struct Panel {
    title: &'static str,
    y_desc: &'static str,
    scientific: bool,
    curves: Vec<Curve>,
}

fn series(records: &[MetricsRecord], f: impl Fn(&MetricsRecord) -> Option<f64>) -> Vec<(f64, f64)> {
    records
        .iter()
        .filter_map(|r| f(r).map(|y| (r.step as f64, y)))
        .collect()
}

/// Draws already-read records (see [`plot_metrics`]).
pub fn plot_records(records: &[MetricsRecord], out: &Path) -> Result<(), VizError> {
    if records.is_empty() {
        return Err(VizError::Input("no metrics records to plot".into()));
    }
    let mut loss = vec![Curve {
        label: "train loss",
        color: RGBColor(31, 119, 180),
        points: series(records, |r| Some(r.loss)),
    }];
    let valid_loss = series(records, |r| r.valid_loss);
    if !valid_loss.is_empty() {
        loss.push(Curve {
            label: "valid loss",
            color: RGBColor(214, 39, 40),
            points: valid_loss,
        });
    }
    let mut panels = vec![
        Panel {
            title: "Loss per token",
            y_desc: "loss",
            scientific: false,
            curves: loss,
        },
        Panel {
            title: "Learning rate",
            y_desc: "lr",
            scientific: true,
            curves: vec![Curve {
                label: "lr",
                color: RGBColor(44, 160, 44),
                points: series(records, |r| Some(r.lr)),
            }],
        },
    ];
    let bleu = series(records, |r| r.valid_bleu);
    if !bleu.is_empty() {
        panels.push(Panel {
            title: "Validation BLEU",
            y_desc: "BLEU",
            scientific: false,
            curves: vec![Curve {
                label: "valid BLEU",
                color: RGBColor(148, 103, 189),
                points: bleu,
            }],
        });
    }
    let first = records.iter().map(|r| r.step).min().unwrap_or(0) as f64;
    let last = records.iter().map(|r| r.step).max().unwrap_or(0) as f64;
    let steps = padded(first, last, 0.02);
    let height = 60 + 300 * panels.len() as u32;
    render!(out, (960, height), |root| draw(&root, &panels, steps))
}

/// `lo..hi`, widened when empty, and by `margin` of its width on each side.
fn padded(lo: f64, hi: f64, margin: f64) -> std::ops::Range<f64> {
    if hi - lo <= f64::EPSILON * hi.abs().max(1.0) {
        let d = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
        return (lo - d)..(hi + d);
    }
    let m = (hi - lo) * margin;
    (lo - m)..(hi + m)
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    panels: &[Panel],
    steps: std::ops::Range<f64>,
) -> Result<(), String> {
    root.fill(&WHITE).map_err(msg)?;
    let root = root.titled("Training curves", (FONT, 26)).map_err(msg)?;
    let areas = root.split_evenly((panels.len(), 1));
    for (area, panel) in areas.iter().zip(panels) {
        let (lo, hi) = panel
            .curves
            .iter()
            .flat_map(|c| c.points.iter().map(|p| p.1))
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), y| {
                (lo.min(y), hi.max(y))
            });
        let lo = if panel.scientific { lo.min(0.0) } else { lo };
        let ys = padded(lo, hi, 0.05);
        let mut chart = ChartBuilder::on(area)
            .caption(panel.title, (FONT, 20))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(80)
            .build_cartesian_2d(steps.clone(), ys.clone())
            .map_err(msg)?;
        // Enough decimals to tell the labels apart.
        let span = ys.end - ys.start;
        let decimals = if span >= 20.0 {
            0
        } else if span >= 2.0 {
            1
        } else if span >= 0.2 {
            2
        } else {
            3
        };
        let scientific = panel.scientific;
        let y_fmt = move |v: &f64| {
            if scientific {
                format!("{v:.1e}")
            } else {
                format!("{v:.decimals$}")
            }
        };
        chart
            .configure_mesh()
            .x_desc("step")
            .y_desc(panel.y_desc)
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&y_fmt)
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 15))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(msg)?;
        for curve in &panel.curves {
            let color = curve.color;
            let style = color.stroke_width(2);
            chart
                .draw_series(LineSeries::new(curve.points.iter().copied(), style))
                .map_err(msg)?
                .label(curve.label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            if curve.points.len() == 1 {
                // A single record is a point, not a line: mark it.
                let p = curve.points[0];
                chart
                    .draw_series(std::iter::once(Circle::new(p, 4, color.filled())))
                    .map_err(msg)?;
            }
        }
        // The legend sits in the right-hand corner the curves end away from (a rising BLEU curve
        // ends top right).
        let middle = (ys.start + ys.end) / 2.0;
        let ends_high = panel
            .curves
            .iter()
            .filter_map(|c| c.points.last())
            .any(|p| p.1 > middle);
        let corner = if ends_high {
            SeriesLabelPosition::LowerRight
        } else {
            SeriesLabelPosition::UpperRight
        };
        chart
            .configure_series_labels()
            .label_font((FONT, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(180, 180, 180))
            .position(corner)
            .draw()
            .map_err(msg)?;
    }
    Ok(())
}
