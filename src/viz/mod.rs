//! Pictures: training curves from the metrics log ([`curves`]) and attention heat maps
//! ([`attention_map`]), drawn with `plotters` in pure Rust.
//!
//! The format follows the output file's extension: `.png` (bitmap) or `.svg` (vector). Text is
//! drawn with DejaVu Sans, embedded in the binary (`assets/fonts`, licence next to it) and
//! registered with plotters' `ab_glyph` renderer, so no system font is ever looked up.

pub mod attention_map;
pub mod curves;

pub use attention_map::{
    attention_maps, draw_attention_grid, draw_attention_grid_with_columns, AttentionMaps,
    AttentionPanel,
};
pub use curves::{plot_metrics, read_metrics, MetricsRecord};

use std::path::{Path, PathBuf};
use std::sync::Once;

/// The font every picture uses, embedded at compile time.
static FONT_BYTES: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");

/// The family name the pictures ask plotters for.
pub(crate) const FONT: &str = "sans-serif";

/// What can go wrong while reading a log or drawing a picture.
#[derive(Debug, thiserror::Error)]
pub enum VizError {
    /// A file that cannot be read.
    #[error("cannot read {path}: {cause}")]
    Read {
        /// The file concerned.
        path: PathBuf,
        /// The operating system's error.
        cause: std::io::Error,
    },
    /// A metrics log line that is not a valid record (1-based line number).
    #[error("{path} line {line}: {reason}")]
    Log {
        /// The file concerned.
        path: PathBuf,
        /// The line's number, from 1.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// Input with nothing (or nothing usable) to draw.
    #[error("{0}")]
    Input(String),
    /// An output file name whose extension is neither `.png` nor `.svg`.
    #[error("{}: unsupported picture format (use a .png or .svg file name)", path.display())]
    Format {
        /// The output file.
        path: PathBuf,
    },
    /// Drawing or writing the picture failed.
    #[error("cannot draw {}: {cause}", path.display())]
    Draw {
        /// The output file.
        path: PathBuf,
        /// What plotters or the file system reported.
        cause: String,
    },
}

impl VizError {
    pub(crate) fn draw(path: &Path, cause: impl std::fmt::Display) -> Self {
        VizError::Draw {
            path: path.to_path_buf(),
            cause: cause.to_string(),
        }
    }
}

/// The picture formats, chosen by the output file's extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PictureFormat {
    /// A bitmap (`.png`).
    Png,
    /// A vector picture (`.svg`).
    Svg,
}

impl PictureFormat {
    /// `.png` or `.svg` (any case); anything else is an error naming the file.
    pub fn from_path(path: &Path) -> Result<Self, VizError> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("png") => Ok(PictureFormat::Png),
            Some("svg") => Ok(PictureFormat::Svg),
            _ => Err(VizError::Format {
                path: path.to_path_buf(),
            }),
        }
    }
}

/// Registers the embedded font with plotters (once per process).
pub(crate) fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        use plotters::style::FontStyle;
        for family in [FONT, "serif", "monospace"] {
            for style in [FontStyle::Normal, FontStyle::Bold] {
                // The bytes are a valid TrueType font (checked by the tests).
                let _ = plotters::style::register_font(family, style, FONT_BYTES);
            }
        }
    });
}

/// Renders with the backend the extension of `out` selects: `$draw` is a generic function
/// `fn(&DrawingArea<DB, Shift>, ...) -> Result<(), String>` called with the root area, then the
/// picture is written.
macro_rules! render {
    ($out:expr, $size:expr, |$root:ident| $body:expr) => {{
        let out: &std::path::Path = $out;
        let size: (u32, u32) = $size;
        $crate::viz::register_font();
        match $crate::viz::PictureFormat::from_path(out)? {
            $crate::viz::PictureFormat::Png => {
                let $root = plotters::prelude::IntoDrawingArea::into_drawing_area(
                    plotters::prelude::BitMapBackend::new(out, size),
                );
                $body.map_err(|e| $crate::viz::VizError::draw(out, e))?;
                $root
                    .present()
                    .map_err(|e| $crate::viz::VizError::draw(out, e))?;
            }
            $crate::viz::PictureFormat::Svg => {
                let $root = plotters::prelude::IntoDrawingArea::into_drawing_area(
                    plotters::prelude::SVGBackend::new(out, size),
                );
                $body.map_err(|e| $crate::viz::VizError::draw(out, e))?;
                $root
                    .present()
                    .map_err(|e| $crate::viz::VizError::draw(out, e))?;
            }
        }
        Ok(())
    }};
}
pub(crate) use render;

/// A plotters error as text.
pub(crate) fn msg<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}
