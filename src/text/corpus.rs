//! Reading corpora: `source<TAB>target` pairs for training and plain lines for translation.
//!
//! Files are read as bytes and split on `'\n'`; a trailing `'\r'` is stripped (CRLF files
//! work), a final newline does not start an extra line, a UTF-8 byte order mark at the start
//! is ignored, and each line is validated as UTF-8 on its own so one bad line does not lose
//! the file. Line numbers are 1-based.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::TextError;

/// How many malformed lines a [`MalformedReport`] keeps as examples.
pub const MAX_MALFORMED_EXAMPLES: usize = 5;

/// One sentence pair of a corpus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pair {
    /// Source sentence, surrounding whitespace trimmed.
    pub source: String,
    /// Target sentence, surrounding whitespace trimmed.
    pub target: String,
    /// 1-based line number in the file.
    pub line: usize,
}

/// The lines of a corpus that could not be parsed: how many, and the first few.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MalformedReport {
    /// Number of malformed lines.
    pub count: usize,
    /// The first [`MAX_MALFORMED_EXAMPLES`] malformed lines: (1-based line number, reason).
    pub examples: Vec<(usize, String)>,
}

impl MalformedReport {
    /// Records one malformed line.
    fn record(&mut self, line: usize, reason: &str) {
        self.count += 1;
        if self.examples.len() < MAX_MALFORMED_EXAMPLES {
            self.examples.push((line, reason.to_string()));
        }
    }

    /// One line for humans, e.g. `3 malformed lines (line 4: no tab; line 9: empty target;
    /// line 12: invalid UTF-8)`; `...` closes the list when more lines were malformed than shown.
    pub fn summary(&self) -> String {
        if self.count == 0 {
            return "no malformed lines".to_string();
        }
        let noun = if self.count == 1 { "line" } else { "lines" };
        let mut listed: Vec<String> = self
            .examples
            .iter()
            .map(|(line, reason)| format!("line {line}: {reason}"))
            .collect();
        if self.count > self.examples.len() {
            listed.push("...".to_string());
        }
        format!("{} malformed {noun} ({})", self.count, listed.join("; "))
    }
}

/// The lines of `bytes` as Python iterates a text file: split on `'\n'`, trailing `'\r'`
/// stripped, no line after a final newline, a leading UTF-8 byte order mark removed. An empty
/// input has no lines; a lone newline is one empty line (sacreBLEU scores such a hypothesis
/// file as one empty hypothesis). Yields (1-based line number, bytes).
fn split_lines(bytes: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let no_lines = bytes.is_empty();
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    bytes
        .split(|&byte| byte == b'\n')
        .filter(move |_| !no_lines)
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
        .enumerate()
        .map(|(index, line)| (index + 1, line))
}

/// Parses one line of a pair file, or says why it is malformed.
fn parse_pair_line(line_bytes: &[u8], line: usize) -> Result<Pair, &'static str> {
    let text = std::str::from_utf8(line_bytes).map_err(|_| "invalid UTF-8")?;
    let mut fields = text.split('\t');
    let (source, target) = match (fields.next(), fields.next(), fields.next()) {
        (Some(whole), None, _) if whole.trim().is_empty() => return Err("empty line"),
        (Some(_), None, _) => return Err("no tab"),
        (Some(source), Some(target), None) => (source.trim(), target.trim()),
        _ => return Err("more than one tab"),
    };
    if source.is_empty() {
        return Err("empty source");
    }
    if target.is_empty() {
        return Err("empty target");
    }
    Ok(Pair {
        source: source.to_string(),
        target: target.to_string(),
        line,
    })
}

/// Parses `source<TAB>target` lines from `bytes`; `path_for_messages` names the data in
/// errors.
///
/// Malformed lines (`"no tab"`, `"more than one tab"`, `"empty source"`, `"empty target"`,
/// `"empty line"`, `"invalid UTF-8"`) are skipped and reported; the caller decides whether they
/// are fatal. Returns [`TextError::Empty`] when no line is a valid pair.
pub fn parse_pairs(
    bytes: &[u8],
    path_for_messages: &Path,
) -> Result<(Vec<Pair>, MalformedReport), TextError> {
    let mut pairs = Vec::new();
    let mut report = MalformedReport::default();
    for (line, line_bytes) in split_lines(bytes) {
        match parse_pair_line(line_bytes, line) {
            Ok(pair) => pairs.push(pair),
            Err(reason) => report.record(line, reason),
        }
    }
    if pairs.is_empty() {
        return Err(TextError::Empty {
            path: path_for_messages.to_path_buf(),
        });
    }
    Ok((pairs, report))
}

/// Reads a `source<TAB>target` file; see [`parse_pairs`].
pub fn read_pairs(path: &Path) -> Result<(Vec<Pair>, MalformedReport), TextError> {
    let bytes = std::fs::read(path).map_err(|cause| TextError::Io {
        path: path.to_path_buf(),
        cause,
    })?;
    parse_pairs(&bytes, path)
}

/// Reads a parallel corpus as two line files, line `i` of `source_path` translating line `i`
/// of `target_path`. Different line counts are an error naming both files and counts;
/// lines that are empty (after trimming) or not UTF-8 on either side are skipped and reported
/// like the malformed lines of [`parse_pairs`] (`"empty source"`, `"empty target"`,
/// `"invalid UTF-8 in source"`, ...). Returns [`TextError::Empty`] when no pair is left.
pub fn read_parallel(
    source_path: &Path,
    target_path: &Path,
) -> Result<(Vec<Pair>, MalformedReport), TextError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|cause| TextError::Io {
            path: path.to_path_buf(),
            cause,
        })
    };
    let (source_bytes, target_bytes) = (read(source_path)?, read(target_path)?);
    let sources: Vec<_> = split_lines(&source_bytes).collect();
    let targets: Vec<_> = split_lines(&target_bytes).collect();
    if sources.len() != targets.len() {
        return Err(TextError::Malformed {
            path: source_path.to_path_buf(),
            report: format!(
                "{} lines, but {} has {} lines (parallel files need one target line per source line)",
                sources.len(),
                target_path.display(),
                targets.len()
            ),
        });
    }
    let mut pairs = Vec::new();
    let mut report = MalformedReport::default();
    for ((line, source), (_, target)) in sources.into_iter().zip(targets) {
        let (source, target) = match (std::str::from_utf8(source), std::str::from_utf8(target)) {
            (Err(_), _) => {
                report.record(line, "invalid UTF-8 in source");
                continue;
            }
            (_, Err(_)) => {
                report.record(line, "invalid UTF-8 in target");
                continue;
            }
            (Ok(source), Ok(target)) => (source.trim(), target.trim()),
        };
        match (source.is_empty(), target.is_empty()) {
            (true, true) => report.record(line, "empty line"),
            (true, false) => report.record(line, "empty source"),
            (false, true) => report.record(line, "empty target"),
            (false, false) => pairs.push(Pair {
                source: source.to_string(),
                target: target.to_string(),
                line,
            }),
        }
    }
    if pairs.is_empty() {
        return Err(TextError::Empty {
            path: source_path.to_path_buf(),
        });
    }
    Ok((pairs, report))
}

/// Reads a `source<TAB>target` file in which every line must be a valid pair: any malformed
/// line gives [`TextError::Malformed`] with the report's summary.
// Used outside the library only (feature `internals`).
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub fn read_pairs_strict(path: &Path) -> Result<Vec<Pair>, TextError> {
    let (pairs, report) = read_pairs(path)?;
    if report.count > 0 {
        return Err(TextError::Malformed {
            path: path.to_path_buf(),
            report: report.summary(),
        });
    }
    Ok(pairs)
}

/// How many offending line numbers an error message lists before `...`.
// Used by the binary (feature `cli`) and outside the library (feature `internals`).
#[cfg_attr(not(any(feature = "cli", feature = "internals")), allow(dead_code))]
const MAX_LISTED_LINES: usize = 10;

/// Reads plain text lines (the input of `translate`); `name` names the input in errors
/// (a path, or `<stdin>`).
///
/// Empty lines are kept as empty strings so output lines stay aligned with input lines. Lines
/// that are not valid UTF-8 make the whole read fail with [`TextError::Malformed`] listing
/// their line numbers.
// Used by the binary (feature `cli`) and outside the library (feature `internals`).
#[cfg_attr(not(any(feature = "cli", feature = "internals")), allow(dead_code))]
pub fn read_lines(mut reader: impl Read, name: &str) -> Result<Vec<String>, TextError> {
    let mut bytes = Vec::new();
    reader
        .read_to_end(&mut bytes)
        .map_err(|cause| TextError::Io {
            path: PathBuf::from(name),
            cause,
        })?;
    let mut lines = Vec::new();
    let mut invalid_lines = Vec::new();
    for (line, line_bytes) in split_lines(&bytes) {
        match std::str::from_utf8(line_bytes) {
            Ok(text) => lines.push(text.to_string()),
            Err(_) => invalid_lines.push(line),
        }
    }
    if !invalid_lines.is_empty() {
        let mut listed: Vec<String> = invalid_lines
            .iter()
            .take(MAX_LISTED_LINES)
            .map(usize::to_string)
            .collect();
        if invalid_lines.len() > MAX_LISTED_LINES {
            listed.push("...".to_string());
        }
        let noun = if invalid_lines.len() == 1 {
            "line"
        } else {
            "lines"
        };
        return Err(TextError::Malformed {
            path: PathBuf::from(name),
            report: format!(
                "{} {noun} not valid UTF-8 ({noun} {})",
                invalid_lines.len(),
                listed.join(", ")
            ),
        });
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> Result<(Vec<Pair>, MalformedReport), TextError> {
        parse_pairs(bytes, Path::new("corpus.tsv"))
    }

    #[test]
    fn parses_pairs_with_line_numbers_and_crlf() {
        let (pairs, report) = parse(b"one\teins\r\n two \t zwei\r\nthree\tdrei").unwrap();
        assert_eq!(report, MalformedReport::default());
        assert_eq!(pairs.len(), 3);
        assert_eq!(
            pairs[1],
            Pair {
                source: "two".into(),
                target: "zwei".into(),
                line: 2
            }
        );
        assert_eq!((pairs[2].target.as_str(), pairs[2].line), ("drei", 3));
        // A final newline is not a line; a byte order mark is not part of the first source.
        let (pairs, report) = parse(b"\xEF\xBB\xBFa\tb\n").unwrap();
        assert_eq!((pairs.len(), report.count), (1, 0));
        assert_eq!(pairs[0].source, "a");
    }

    #[test]
    fn reports_each_malformed_kind_with_its_line() {
        let bytes = b"ok\tgut\nno tab here\na\tb\tc\n\tonly target\nonly source\t\n\n  \r\nbad \xFF\tx\nfine\tgut\n";
        let (pairs, report) = parse(bytes).unwrap();
        assert_eq!(pairs.iter().map(|p| p.line).collect::<Vec<_>>(), vec![1, 9]);
        assert_eq!(report.count, 7);
        let expected: Vec<(usize, String)> = [
            (2, "no tab"),
            (3, "more than one tab"),
            (4, "empty source"),
            (5, "empty target"),
            (6, "empty line"),
        ]
        .iter()
        .map(|&(line, reason)| (line, reason.to_string()))
        .collect();
        assert_eq!(report.examples, expected);
        assert_eq!(
            report.summary(),
            "7 malformed lines (line 2: no tab; line 3: more than one tab; line 4: empty source; \
             line 5: empty target; line 6: empty line; ...)"
        );
    }

    #[test]
    fn invalid_utf8_in_the_middle_loses_only_that_line() {
        let (pairs, report) = parse(b"a\tb\r\n\xC3\x28\tc\r\nd\t\xC3\xA4\r\n").unwrap();
        assert_eq!(pairs.len(), 2);
        assert_eq!((pairs[1].target.as_str(), pairs[1].line), ("ä", 3));
        assert_eq!(report.count, 1);
        assert_eq!(report.summary(), "1 malformed line (line 2: invalid UTF-8)");
    }

    #[test]
    fn no_valid_pair_is_an_empty_error_naming_the_file() {
        for bytes in [&b""[..], b"\n", b"no tab\n\n"] {
            let error = parse(bytes).unwrap_err();
            assert!(matches!(error, TextError::Empty { .. }));
            assert_eq!(error.to_string(), "corpus.tsv: no usable lines");
        }
    }

    #[test]
    fn read_pairs_from_files_strict_and_lenient() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pairs.tsv");
        std::fs::write(&path, "one\teins\nbroken\ntwo\tzwei\n").unwrap();
        let (pairs, report) = read_pairs(&path).unwrap();
        assert_eq!((pairs.len(), report.count), (2, 1));
        let error = read_pairs_strict(&path).unwrap_err();
        let message = error.to_string();
        assert!(message.contains("pairs.tsv"), "{message}");
        assert!(
            message.ends_with("1 malformed line (line 2: no tab)"),
            "{message}"
        );
        std::fs::write(&path, "one\teins\n").unwrap();
        assert_eq!(read_pairs_strict(&path).unwrap().len(), 1);
        let missing = dir.path().join("missing.tsv");
        let error = read_pairs(&missing).unwrap_err();
        assert!(matches!(error, TextError::Io { .. }));
        assert!(error.to_string().starts_with("cannot read "));
        assert!(error.to_string().contains("missing.tsv"));
    }

    #[test]
    fn read_lines_keeps_empty_lines_and_lists_invalid_ones() {
        let lines = read_lines(&b"one\r\n\ntwo three\n"[..], "<stdin>").unwrap();
        assert_eq!(lines, vec!["one", "", "two three"]);
        assert!(read_lines(&b""[..], "<stdin>").unwrap().is_empty());
        assert!(read_lines(&b"\xEF\xBB\xBF"[..], "<stdin>")
            .unwrap()
            .is_empty());
        assert_eq!(read_lines(&b"\n"[..], "<stdin>").unwrap(), vec![""]);
        assert_eq!(read_lines(&b"\r\n"[..], "<stdin>").unwrap(), vec![""]);
        assert_eq!(read_lines(&b"a\n\n"[..], "<stdin>").unwrap(), vec!["a", ""]);
        let error = read_lines(&b"ok\n\xFF\nok\n\xFE\xFE\n"[..], "input.txt").unwrap_err();
        assert_eq!(
            error.to_string(),
            "input.txt: 2 lines not valid UTF-8 (lines 2, 4)"
        );
    }
}
