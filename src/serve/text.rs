//! Generated ids to streamed text, with OpenAI's `stop` strings.
//!
//! Ids are decoded as they come; a piece that ends inside a UTF-8 character (byte-level BPE
//! splits characters across tokens) is held back until the character is complete. Text that
//! could be the beginning of a stop string is held back too, until it is clear whether the stop
//! string follows: the client never sees any part of a stop string, and the whole text is the
//! concatenation of the pieces (the stop string and everything after it cut).

use crate::error::Result;
use crate::text::decoder_tokenizer::DecoderTokenizer;

/// One sequence's text as it grows (see the module docs).
pub struct TextStream {
    /// Ids not yet turned into text (an incomplete character).
    pending: Vec<u32>,
    /// Decoded text not yet released (may start a stop string).
    held: String,
    stops: Vec<String>,
    /// Set once a stop string was found: nothing more is released.
    stopped: bool,
}

impl TextStream {
    /// `stops`: the stop strings (empty ones are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        TextStream {
            pending: Vec::new(),
            held: String::new(),
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            stopped: false,
        }
    }

    /// Whether a stop string ended the text.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Adds one id; returns the text that may be shown now (possibly empty).
    pub fn push(&mut self, tokenizer: &DecoderTokenizer, id: u32) -> Result<String> {
        if self.stopped {
            return Ok(String::new());
        }
        self.pending.push(id);
        let text = tokenizer.decode(&self.pending)?;
        if text.ends_with('\u{FFFD}') && self.pending.len() < 4 {
            return Ok(String::new());
        }
        self.pending.clear();
        self.held.push_str(&text);
        Ok(self.release(false))
    }

    /// The rest, at the end of generation.
    pub fn finish(&mut self, tokenizer: &DecoderTokenizer) -> Result<String> {
        if !self.stopped && !self.pending.is_empty() {
            let text = tokenizer.decode(&self.pending)?;
            self.held.push_str(&text);
            self.pending.clear();
        }
        Ok(self.release(true))
    }

    /// The held text up to a stop string (then stopped), or up to the longest suffix that
    /// starts a stop string (all of it at the end).
    fn release(&mut self, end: bool) -> String {
        if self.stopped {
            return String::new();
        }
        let first_stop = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first_stop {
            self.stopped = true;
            let out = self.held[..at].to_string();
            self.held.clear();
            return out;
        }
        let keep = if end {
            0
        } else {
            // The longest suffix of `held` that is a proper prefix of some stop string.
            self.stops
                .iter()
                .flat_map(|s| {
                    (1..s.len())
                        .filter(|&n| s.is_char_boundary(n) && self.held.ends_with(&s[..n]))
                        .max()
                })
                .max()
                .unwrap_or(0)
        };
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `release` on hand-fed text (no tokenizer needed): stop strings across pieces.
    #[test]
    fn stop_strings_are_cut_and_prefixes_held() {
        let mut t = TextStream::new(vec!["END".into(), "\n\n".into()]);
        let mut shown = String::new();
        for piece in ["Hello E", "N", "ough. \n", "x", " E", "ND and more"] {
            t.held.push_str(piece);
            let out = t.release(false);
            assert!(!out.contains("END"));
            shown.push_str(&out);
        }
        assert!(t.stopped());
        assert_eq!(shown, "Hello ENough. \nx ");
        let mut t = TextStream::new(vec!["ab".into()]);
        t.held.push_str("xa");
        assert_eq!(t.release(false), "x");
        assert_eq!(t.release(true), "a");
        assert!(!t.stopped());
    }
}
