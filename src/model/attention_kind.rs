//! Which attention a self-attention layer computes (config.json's `layer_attention` for the
//! decoder's or language model's layers, `encoder_layer_attention` for the encoder's): exact
//! `softmax(Q Kᵀ / √d_k) V`, or one of the approximations that trade accuracy for less than
//! O(N²) work or memory:
//!
//! - `{"kind": "exact"}`: every key the mask allows.
//! - `{"kind": "window", "window": w}`: local attention. Causal (decoder): the query at `p` sees
//!   `p − w < j ≤ p` (Mistral's sliding window; decoding keeps about `w` positions of the KV
//!   cache). Not causal (encoder): `|p − j| < w`.
//! - `{"kind": "sparse", "local": l, "stride": s}`: the Sparse Transformer's strided pattern
//!   (Child et al. 2019): `|p − j| < l` or `|p − j|` a multiple of `s`.
//! - `{"kind": "global", "local": l, "global_tokens": g}`: local attention plus `g` global
//!   tokens (Longformer): the first `g` positions see and are seen by every position.
//! - `{"kind": "linear"}`: linear attention (Katharopoulos et al. 2020), `φ(x) = elu(x) + 1`
//!   in place of the softmax's exponential; O(N) training, a constant-size state in decoding.
//!
//! The patterns are the kernels' `kernels::sparse_pattern`; linear attention is
//! `kernels::linear_attention`.

use crate::backend::Pattern;
use serde::{Deserialize, Serialize};

/// One layer's attention (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum AttentionKind {
    /// Every key the mask allows.
    #[default]
    Exact,
    /// The last `window` keys (causal) or those within `window − 1` positions (not causal).
    Window {
        /// Keys seen per query (itself included).
        window: usize,
    },
    /// Local keys (`|p − j| < local`) and every `stride`-th key before them.
    Sparse {
        /// Width of the local band (`|p − j| < local`).
        local: usize,
        /// Every `stride`-th earlier key is also seen.
        stride: usize,
    },
    /// Local keys and the first `global_tokens` positions, which also see everything.
    Global {
        /// Width of the local band (`|p − j| < local`).
        local: usize,
        /// The first positions, seen by every query and seeing everything.
        global_tokens: usize,
    },
    /// Linear attention, `φ(x) = elu(x) + 1`.
    Linear,
}

impl AttentionKind {
    /// The key pattern of a masked kind (`None` for exact and linear attention).
    pub fn pattern(&self) -> Option<Pattern> {
        match *self {
            AttentionKind::Exact | AttentionKind::Linear => None,
            AttentionKind::Window { window } => Some(Pattern::Band { window }),
            AttentionKind::Sparse { local, stride } => Some(Pattern::Strided { local, stride }),
            AttentionKind::Global {
                local,
                global_tokens,
            } => Some(Pattern::Global {
                local,
                global: global_tokens,
            }),
        }
    }

    /// Refuses sizes of 0 by name (`what`: the config field and layer).
    pub fn validate(&self, what: &str) -> Result<(), String> {
        let zero = |name: &str, v: usize| match v {
            0 => Err(format!(
                "{what}: {name} must be at least 1 (a query must see at least itself)"
            )),
            _ => Ok(()),
        };
        match *self {
            AttentionKind::Exact | AttentionKind::Linear => Ok(()),
            AttentionKind::Window { window } => zero("window", window),
            AttentionKind::Sparse { local, stride } => {
                zero("local", local)?;
                zero("stride", stride)
            }
            AttentionKind::Global {
                local,
                global_tokens,
            } => {
                zero("local", local)?;
                zero("global_tokens", global_tokens)
            }
        }
    }

    /// A short name for tables and logs: `exact`, `window64`, `sparse8x8`, `global16+4`,
    /// `linear`.
    pub fn label(&self) -> String {
        match *self {
            AttentionKind::Exact => "exact".into(),
            AttentionKind::Window { window } => format!("window{window}"),
            AttentionKind::Sparse { local, stride } => format!("sparse{local}x{stride}"),
            AttentionKind::Global {
                local,
                global_tokens,
            } => format!("global{local}+{global_tokens}"),
            AttentionKind::Linear => "linear".into(),
        }
    }
}

/// The command-line form: `exact`, `linear`, `window:W`, `sparse:L:S`, `global:L:G`.
impl std::str::FromStr for AttentionKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let number = |i: usize| -> Result<usize, String> {
            parts[i]
                .parse()
                .map_err(|_| format!("attention {s:?}: {:?} is not a whole number", parts[i]))
        };
        let kind = match (parts[0], parts.len()) {
            ("exact", 1) => AttentionKind::Exact,
            ("linear", 1) => AttentionKind::Linear,
            ("window", 2) => AttentionKind::Window { window: number(1)? },
            ("sparse", 3) => AttentionKind::Sparse {
                local: number(1)?,
                stride: number(2)?,
            },
            ("global", 3) => AttentionKind::Global {
                local: number(1)?,
                global_tokens: number(2)?,
            },
            _ => {
                return Err(format!(
                    "unknown attention {s:?}: exact, linear, window:W, sparse:LOCAL:STRIDE or \
                     global:LOCAL:GLOBAL_TOKENS"
                ))
            }
        };
        kind.validate("attention")?;
        Ok(kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The JSON forms read and written back; unknown kinds and fields refused by name.
    #[test]
    fn json_forms() {
        let text = r#"[{"kind":"exact"},{"kind":"window","window":64},{"kind":"sparse","local":8,"stride":8},{"kind":"global","local":16,"global_tokens":4},{"kind":"linear"}]"#;
        let kinds: Vec<AttentionKind> = serde_json::from_str(text).unwrap();
        assert_eq!(kinds[1], AttentionKind::Window { window: 64 });
        assert_eq!(serde_json::to_string(&kinds).unwrap(), text);
        let bad = serde_json::from_str::<AttentionKind>(r#"{"kind":"performer"}"#);
        assert!(bad.unwrap_err().to_string().contains("performer"));
        let extra =
            serde_json::from_str::<AttentionKind>(r#"{"kind":"window","window":4,"dilation":2}"#);
        assert!(extra.unwrap_err().to_string().contains("dilation"));
        let missing = serde_json::from_str::<AttentionKind>(r#"{"kind":"window"}"#);
        assert!(missing.unwrap_err().to_string().contains("window"));
        let err = AttentionKind::Sparse {
            local: 4,
            stride: 0,
        }
        .validate("layer_attention[1]")
        .unwrap_err();
        assert!(
            err.contains("layer_attention[1]") && err.contains("stride"),
            "{err}"
        );
        let global = AttentionKind::Global {
            local: 16,
            global_tokens: 4,
        };
        assert_eq!("global:16:4".parse(), Ok(global));
        assert_eq!("linear".parse(), Ok(AttentionKind::Linear));
        assert!("window:0"
            .parse::<AttentionKind>()
            .unwrap_err()
            .contains("window"));
        assert!("sparse:8"
            .parse::<AttentionKind>()
            .unwrap_err()
            .contains("unknown attention"));
        assert!("window:x"
            .parse::<AttentionKind>()
            .unwrap_err()
            .contains("\"x\""));
    }
}
