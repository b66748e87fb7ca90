//! The metrics log `OUT/metrics.jsonl`: one JSON object per logged update, appended.
//!
//! Fields: `step`; `epoch` (sources with a batch order); `loss` and `nll`, the means of the
//! updates' losses since the previous line; `lr`; `tokens_per_s` and `elapsed_s` since the
//! start of the run; and on validation steps `valid_loss`, `valid_nll`, `valid_bleu` (greedy
//! BLEU, when measured) `valid_bits_per_char` (language model) and `valid_masked_accuracy` (masked-LM encoder). serde_json writes the keys
//! in sorted order.

use crate::error::{Error, Result};
use crate::train::trainer::StepReport;
use crate::train::validate::ValidReport;
use serde_json::{Map, Value};
use std::io::Write;
use std::path::{Path, PathBuf};

/// An append-only JSON-lines log.
pub struct MetricsLog {
    file: std::fs::File,
    path: PathBuf,
    /// (loss sum, NLL sum, updates) since the last line.
    window: (f64, f64, usize),
}

impl MetricsLog {
    /// Opens (creating it if needed) `path` for appending.
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|cause| Error::Write {
                path: path.to_path_buf(),
                cause,
            })?;
        Ok(MetricsLog {
            file,
            path: path.to_path_buf(),
            window: (0.0, 0.0, 0),
        })
    }

    /// Counts an update into the means of the next line.
    pub fn add(&mut self, report: &StepReport) {
        let w = &mut self.window;
        *w = (w.0 + report.loss, w.1 + report.nll, w.2 + 1);
    }

    /// Writes the line of `report` (with `valid` when the update was validated) and starts a
    /// new window.
    pub fn write(
        &mut self,
        report: &StepReport,
        valid: Option<&ValidReport>,
        tokens_per_s: f64,
        elapsed_s: f64,
    ) -> Result<()> {
        let mut record = Map::new();
        if let Some(v) = valid {
            record.insert("valid_loss".into(), v.loss.into());
            record.insert("valid_nll".into(), v.nll.into());
            if let Some(bleu) = &v.bleu {
                record.insert("valid_bleu".into(), bleu.score.into());
            }
            if let Some(bpc) = v.bits_per_char {
                record.insert("valid_bits_per_char".into(), bpc.into());
            }
            if let Some(accuracy) = v.accuracy {
                record.insert("valid_masked_accuracy".into(), accuracy.into());
            }
        }
        let n = self.window.2.max(1) as f64;
        record.insert("step".into(), report.step.into());
        if let Some(epoch) = report.epoch {
            record.insert("epoch".into(), epoch.into());
        }
        record.insert("loss".into(), (self.window.0 / n).into());
        record.insert("nll".into(), (self.window.1 / n).into());
        record.insert("lr".into(), report.lr.into());
        record.insert("tokens_per_s".into(), tokens_per_s.into());
        record.insert("elapsed_s".into(), elapsed_s.into());
        self.window = (0.0, 0.0, 0);
        writeln!(self.file, "{}", Value::Object(record)).map_err(|cause| Error::Write {
            path: self.path.clone(),
            cause,
        })
    }
}
