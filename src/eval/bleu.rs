//! Corpus BLEU (Papineni et al., 2002) computed exactly as sacreBLEU 2.x does with its defaults:
//! `BLEU(tokenize='13a', smooth_method='exp', lowercase=False, effective_order=False)`, one
//! reference per hypothesis, n-grams of order 1 to 4.
//!
//! Each line is right-stripped of whitespace (Python's `str.rstrip`) and tokenized with the
//! mteval-v13a tokenizer ([`tokenize_13a`]); n-gram counts are clipped by the reference counts
//! and summed over the corpus; an order with no match gets the NIST (`exp`) smoothed precision
//! `100 / (2^k · total)`; the score is the brevity penalty times the geometric mean of the four
//! precisions, where an order with no n-gram at all makes the score 0.

use std::collections::HashMap;
use std::fmt;

/// The highest n-gram order.
pub const MAX_ORDER: usize = 4;

/// What sacreBLEU's `my_log` returns for `log(0)`.
const LOG_ZERO: f64 = -9_999_999_999.0;

/// Why BLEU could not be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BleuError {
    /// Hypotheses and references must pair up line by line.
    #[error("{hyps} hypothesis lines but {refs} reference lines: they must pair up line by line")]
    LineCountMismatch { hyps: usize, refs: usize },
}

/// A corpus BLEU score with the statistics behind it, printed (`Display`) as sacreBLEU prints
/// it: `BLEU = 27.33 60.0/33.3/21.4/15.4 (BP = 1.000 ratio = 1.000 hyp_len = 10 ref_len = 10)`.
#[derive(Debug, Clone, PartialEq)]
pub struct BleuScore {
    /// BLEU on a 0-100 scale.
    pub score: f64,
    /// n-gram precisions (0-100) for n = 1..4, smoothed as sacreBLEU's `exp` method does.
    pub precisions: [f64; MAX_ORDER],
    /// Brevity penalty.
    pub bp: f64,
    /// `hyp_len / ref_len` (0 when `ref_len` is 0).
    pub ratio: f64,
    /// Tokens in all hypotheses.
    pub hyp_len: usize,
    /// Tokens in all references.
    pub ref_len: usize,
    /// Clipped matching n-grams for n = 1..4.
    pub counts: [usize; MAX_ORDER],
    /// Hypothesis n-grams for n = 1..4.
    pub totals: [usize; MAX_ORDER],
}

impl fmt::Display for BleuScore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [p1, p2, p3, p4] = self.precisions;
        write!(
            f,
            "BLEU = {:.2} {p1:.1}/{p2:.1}/{p3:.1}/{p4:.1} (BP = {:.3} ratio = {:.3} hyp_len = {} ref_len = {})",
            self.score, self.bp, self.ratio, self.hyp_len, self.ref_len
        )
    }
}

/// Python's `str.isspace`: Unicode `White_Space` plus the ASCII separators U+001C..U+001F.
fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// The characters sacreBLEU's first regex pads with spaces:
/// `[\{-\~\[-\` -\&\(-\+\:-\@\/]`, i.e. ASCII punctuation and symbols except `'` `,` `-` `.`
/// (and the space itself, which padding leaves harmless).
fn is_padded_symbol(c: char) -> bool {
    matches!(c, '{'..='~' | '['..='`' | ' '..='&' | '('..='+' | ':'..='@' | '/')
}

/// Applies a two-character pattern `(a)(b)` the way Python's `re.sub` does: scanning left to
/// right, non-overlapping, each match replaced by `replace(a, b)`.
fn sub_pairs(
    chars: &[char],
    matches: impl Fn(char, char) -> bool,
    replace: impl Fn(char, char, &mut Vec<char>),
) -> Vec<char> {
    let mut out = Vec::with_capacity(chars.len() + chars.len() / 2);
    let mut i = 0;
    while i < chars.len() {
        if i + 1 < chars.len() && matches(chars[i], chars[i + 1]) {
            replace(chars[i], chars[i + 1], &mut out);
            i += 2;
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

/// The mteval-v13a tokenization of one line, as sacreBLEU's `Tokenizer13a` produces it: tokens
/// joined by single spaces, no leading or trailing space.
///
/// Steps: remove `<skipped>`, join `-\n` line breaks, turn other `\n` into spaces, unescape
/// `&quot;` `&amp;` `&lt;` `&gt;` (in that order, once each); then pad ASCII punctuation and
/// symbols except `'` `,` `-` `.` with spaces; split off `.` and `,` unless between digits
/// (`1,000.50` and `3.14` stay whole); split off `-` after a digit; collapse whitespace.
pub fn tokenize_13a(line: &str) -> String {
    let mut line = line
        .replace("<skipped>", "")
        .replace("-\n", "")
        .replace('\n', " ");
    if line.contains('&') {
        line = line
            .replace("&quot;", "\"")
            .replace("&amp;", "&")
            .replace("&lt;", "<")
            .replace("&gt;", ">");
    }
    // sacreBLEU tokenizes f" {line} ".
    let mut chars: Vec<char> = Vec::with_capacity(line.len() * 2 + 2);
    chars.push(' ');
    for c in line.chars() {
        if is_padded_symbol(c) {
            chars.extend([' ', c, ' ']);
        } else {
            chars.push(c);
        }
    }
    chars.push(' ');
    let digit = |c: char| c.is_ascii_digit();
    let period_comma = |c: char| c == '.' || c == ',';
    // ([^0-9])([\.,]) -> "\1 \2 "
    let chars = sub_pairs(
        &chars,
        |a, b| !digit(a) && period_comma(b),
        |a, b, out| out.extend([a, ' ', b, ' ']),
    );
    // ([\.,])([^0-9]) -> " \1 \2"
    let chars = sub_pairs(
        &chars,
        |a, b| period_comma(a) && !digit(b),
        |a, b, out| out.extend([' ', a, ' ', b]),
    );
    // ([0-9])(-) -> "\1 \2 "
    let chars = sub_pairs(
        &chars,
        |a, b| digit(a) && b == '-',
        |a, b, out| out.extend([a, ' ', b, ' ']),
    );
    let text: String = chars.into_iter().collect();
    text.split(is_py_space)
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A sentence as sacreBLEU preprocesses it: right-stripped, then tokenized.
fn preprocess(line: &str) -> String {
    tokenize_13a(line.trim_end_matches(is_py_space))
}

/// All n-grams of order 1..=4 of `tokens` with their counts.
fn ngram_counts<'a>(tokens: &'a [&'a str]) -> HashMap<&'a [&'a str], usize> {
    let mut counts = HashMap::new();
    for n in 1..=MAX_ORDER {
        for gram in tokens.windows(n) {
            *counts.entry(gram).or_insert(0) += 1;
        }
    }
    counts
}

/// BLEU from corpus statistics, exactly as sacreBLEU's `BLEU.compute_bleu` with
/// `smooth_method='exp'` and `effective_order=False`.
pub fn compute_bleu(
    counts: [usize; MAX_ORDER],
    totals: [usize; MAX_ORDER],
    hyp_len: usize,
    ref_len: usize,
) -> BleuScore {
    let bp = if hyp_len < ref_len {
        if hyp_len > 0 {
            (1.0 - ref_len as f64 / hyp_len as f64).exp()
        } else {
            0.0
        }
    } else {
        1.0
    };
    let ratio = if ref_len > 0 {
        hyp_len as f64 / ref_len as f64
    } else {
        0.0
    };
    let mut precisions = [0.0; MAX_ORDER];
    let mut score = 0.0;
    // No match at any order: 0 (sacreBLEU's early stop, issue #141).
    if counts.iter().any(|&c| c > 0) {
        let mut smooth = 1.0;
        for n in 0..MAX_ORDER {
            if totals[n] == 0 {
                break;
            }
            precisions[n] = if counts[n] == 0 {
                smooth *= 2.0;
                100.0 / (smooth * totals[n] as f64)
            } else {
                100.0 * counts[n] as f64 / totals[n] as f64
            };
        }
        let log_sum: f64 = precisions
            .iter()
            .map(|&p| if p == 0.0 { LOG_ZERO } else { p.ln() })
            .sum();
        score = bp * (log_sum / MAX_ORDER as f64).exp();
    }
    BleuScore {
        score,
        precisions,
        bp,
        ratio,
        hyp_len,
        ref_len,
        counts,
        totals,
    }
}

/// Corpus BLEU of `hyps` against `refs` (one reference per hypothesis, same order), equal to
/// `sacrebleu.corpus_bleu(hyps, [refs])` with sacreBLEU 2.x defaults. An empty corpus scores 0.
pub fn corpus_bleu<S: AsRef<str>, R: AsRef<str>>(
    hyps: &[S],
    refs: &[R],
) -> Result<BleuScore, BleuError> {
    if hyps.len() != refs.len() {
        return Err(BleuError::LineCountMismatch {
            hyps: hyps.len(),
            refs: refs.len(),
        });
    }
    let mut counts = [0usize; MAX_ORDER];
    let mut totals = [0usize; MAX_ORDER];
    let (mut hyp_len, mut ref_len) = (0usize, 0usize);
    for (hyp, reference) in hyps.iter().zip(refs) {
        let hyp = preprocess(hyp.as_ref());
        let reference = preprocess(reference.as_ref());
        let hyp_tokens: Vec<&str> = hyp.split(' ').filter(|t| !t.is_empty()).collect();
        let ref_tokens: Vec<&str> = reference.split(' ').filter(|t| !t.is_empty()).collect();
        hyp_len += hyp_tokens.len();
        ref_len += ref_tokens.len();
        let ref_grams = ngram_counts(&ref_tokens);
        for (gram, count) in ngram_counts(&hyp_tokens) {
            let n = gram.len() - 1;
            totals[n] += count;
            if let Some(&in_ref) = ref_grams.get(gram) {
                counts[n] += count.min(in_ref);
            }
        }
    }
    Ok(compute_bleu(counts, totals, hyp_len, ref_len))
}
