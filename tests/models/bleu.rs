//! Corpus BLEU against golden values from sacreBLEU 2.x with its defaults (13a tokenizer, `exp`
//! smoothing, mixed case, one reference), and the `transformer bleu` command line.
//!
//! Every golden value below was produced by sacreBLEU 2.6.0 (`pip install sacrebleu` in a
//! virtualenv): `sacrebleu.metrics.BLEU().corpus_score(hyps, [refs])` for the corpus cases (the
//! `display` string is `str(score)`), and `sacrebleu.tokenizers.tokenizer_13a.Tokenizer13a()(line)`
//! for the tokenizer cases. The English lines are the targets of the first 12 lines of
//! `/work/shared/data/de-en/ding.valid.tsv` (references) and perturbed copies of them (a word
//! dropped, two words swapped, a word replaced, or the line cut to two thirds: hypotheses).

use std::io::Write;
use std::process::{Command, Stdio};
use transformer::eval::{corpus_bleu, tokenize_13a, BleuError};

struct Case {
    name: &'static str,
    hyps: &'static [&'static str],
    refs: &'static [&'static str],
    score: f64,
    precisions: [f64; 4],
    bp: f64,
    hyp_len: usize,
    ref_len: usize,
    counts: [usize; 4],
    totals: [usize; 4],
    display: &'static str,
}

#[rustfmt::skip]
const CASES: &[Case] = &[
    // english: BLEU = 71.71 97.4/85.6/78.3/70.4 (BP = 0.871 ratio = 0.879 hyp_len = 116 ref_len = 132)
    Case { name: "english",
      hyps: &["Students would do well to take the professor at his Read slowly and thoughtfully, make lots of notes.", "Given (the fact) that has she had six months to do this, she hasn’t made much progress.", "I’m unable to something modern music.", "Trespassers will", "We all supposed him to be German, but in fact was Austrian.", "a Yesterday tragedy unfolded.", "A something had assembled in front of/outside the courthouse.", "It's good to", "Hurry up, or we’ll miss the", "friendship True will last/persist forever.", "I’m sorry something (that was) my bad!", "You should be more guarded in what"],
      refs: &["Students would do well to take the professor at his word: Read slowly and thoughtfully, make lots of notes.", "Given (the fact) that she has had six months to do this, she hasn’t made much progress.", "I’m unable to appreciate modern music.", "Trespassers will be prosecuted!", "We all supposed him to be German, but in fact he was Austrian.", "Yesterday a tragedy unfolded.", "A crowd had assembled in front of/outside the courthouse.", "It's good to be alive.", "Hurry up, or we’ll miss the train.", "True friendship will last/persist forever.", "I’m sorry – (that was) my bad!", "You should be more guarded in what you say to journalists."],
      score: 71.7092565104378, precisions: [97.41379310344827, 85.57692307692308, 78.26086956521739, 70.37037037037037], bp: 0.8711587695892689,
      hyp_len: 116, ref_len: 132, counts: [113, 89, 72, 57], totals: [116, 104, 92, 81],
      display: "BLEU = 71.71 97.4/85.6/78.3/70.4 (BP = 0.871 ratio = 0.879 hyp_len = 116 ref_len = 132)" },
    // some_empty_hypotheses: BLEU = 34.73 100.0/88.2/80.6/72.4 (BP = 0.410 ratio = 0.529 hyp_len = 37 ref_len = 70)
    Case { name: "some_empty_hypotheses",
      hyps: &["", "Given (the fact) that has she had six months to do this, she hasn’t made much progress.", "", "Trespassers will", "We all supposed him to be German, but in fact was Austrian."],
      refs: &["Students would do well to take the professor at his word: Read slowly and thoughtfully, make lots of notes.", "Given (the fact) that she has had six months to do this, she hasn’t made much progress.", "I’m unable to appreciate modern music.", "Trespassers will be prosecuted!", "We all supposed him to be German, but in fact he was Austrian."],
      score: 34.726959474082555, precisions: [100.0, 88.23529411764706, 80.64516129032258, 72.41379310344827], bp: 0.40987957092092403,
      hyp_len: 37, ref_len: 70, counts: [37, 30, 25, 21], totals: [37, 34, 31, 29],
      display: "BLEU = 34.73 100.0/88.2/80.6/72.4 (BP = 0.410 ratio = 0.529 hyp_len = 37 ref_len = 70)" },
    // all_empty_hypotheses: BLEU = 0.00 0.0/0.0/0.0/0.0 (BP = 0.000 ratio = 0.000 hyp_len = 0 ref_len = 50)
    Case { name: "all_empty_hypotheses",
      hyps: &["", "", ""],
      refs: &["Students would do well to take the professor at his word: Read slowly and thoughtfully, make lots of notes.", "Given (the fact) that she has had six months to do this, she hasn’t made much progress.", "I’m unable to appreciate modern music."],
      score: 0.0, precisions: [0.0, 0.0, 0.0, 0.0], bp: 0.0,
      hyp_len: 0, ref_len: 50, counts: [0, 0, 0, 0], totals: [0, 0, 0, 0],
      display: "BLEU = 0.00 0.0/0.0/0.0/0.0 (BP = 0.000 ratio = 0.000 hyp_len = 0 ref_len = 50)" },
    // no_matching_ngrams: BLEU = 0.00 0.0/0.0/0.0/0.0 (BP = 0.779 ratio = 0.800 hyp_len = 8 ref_len = 10)
    Case { name: "no_matching_ngrams",
      hyps: &["alpha beta gamma delta epsilon", "zeta eta theta"],
      refs: &["one two three four five six", "seven eight nine ten"],
      score: 0.0, precisions: [0.0, 0.0, 0.0, 0.0], bp: 0.7788007830714049,
      hyp_len: 8, ref_len: 10, counts: [0, 0, 0, 0], totals: [8, 6, 4, 2],
      display: "BLEU = 0.00 0.0/0.0/0.0/0.0 (BP = 0.779 ratio = 0.800 hyp_len = 8 ref_len = 10)" },
    // unigram_matches_only: BLEU = 19.28 87.5/16.7/12.5/12.5 (BP = 0.882 ratio = 0.889 hyp_len = 8 ref_len = 9)
    Case { name: "unigram_matches_only",
      hyps: &["the cat the dog a", "house car tree"],
      refs: &["a dog and the cat", "tree house red car"],
      score: 19.28112618738097, precisions: [87.5, 16.666666666666668, 12.5, 12.5], bp: 0.8824969025845955,
      hyp_len: 8, ref_len: 9, counts: [7, 1, 0, 0], totals: [8, 6, 4, 2],
      display: "BLEU = 19.28 87.5/16.7/12.5/12.5 (BP = 0.882 ratio = 0.889 hyp_len = 8 ref_len = 9)" },
    // hypotheses_longer: BLEU = 20.37 41.7/26.5/15.6/10.0 (BP = 1.000 ratio = 2.400 hyp_len = 36 ref_len = 15)
    Case { name: "hypotheses_longer",
      hyps: &["the cat sat on the mat and then it sat on the other mat too , again and again .", "I think that this is a very good idea indeed , my friend , really ."],
      refs: &["the cat sat on the mat .", "I think this is a good idea ."],
      score: 20.374787792684362, precisions: [41.666666666666664, 26.470588235294116, 15.625, 10.0], bp: 1.0,
      hyp_len: 36, ref_len: 15, counts: [15, 9, 5, 3], totals: [36, 34, 32, 30],
      display: "BLEU = 20.37 41.7/26.5/15.6/10.0 (BP = 1.000 ratio = 2.400 hyp_len = 36 ref_len = 15)" },
    // short_hypotheses: BLEU = 0.00 100.0/100.0/100.0/0.0 (BP = 1.000 ratio = 1.000 hyp_len = 6 ref_len = 6)
    Case { name: "short_hypotheses",
      hyps: &["yes", "no thanks", "ok then go"],
      refs: &["yes", "no thanks", "ok then go"],
      score: 0.0, precisions: [100.0, 100.0, 100.0, 0.0], bp: 1.0,
      hyp_len: 6, ref_len: 6, counts: [6, 3, 1, 0], totals: [6, 3, 1, 0],
      display: "BLEU = 0.00 100.0/100.0/100.0/0.0 (BP = 1.000 ratio = 1.000 hyp_len = 6 ref_len = 6)" },
    // unicode_punctuation: BLEU = 30.20 66.7/39.4/26.7/18.5 (BP = 0.895 ratio = 0.900 hyp_len = 36 ref_len = 40)
    Case { name: "unicode_punctuation",
      hyps: &["“Hello,” she said – it cost 5 € … ©2023 «quoted» — done!", "Ein „Test“ mit ‚Zitat‘ – 10 % × 3 ≈ 30 ™ …", "Café naïve — résumé… ½ → ∞"],
      refs: &["“Hello,” she said — it cost 5€… © 2023 «quoted» – done!", "Ein „Test“ mit ‚Zitat’ – 10% × 3 ≈ 30™ ...", "Cafe naïve – résumé ... ½ -> ∞"],
      score: 30.197663337610077, precisions: [66.66666666666667, 39.39393939393939, 26.666666666666668, 18.51851851851852], bp: 0.8948393168143697,
      hyp_len: 36, ref_len: 40, counts: [24, 13, 8, 5], totals: [36, 33, 30, 27],
      display: "BLEU = 30.20 66.7/39.4/26.7/18.5 (BP = 0.895 ratio = 0.900 hyp_len = 36 ref_len = 40)" },
    // numbers_with_separators: BLEU = 72.19 88.9/78.6/66.7/58.3 (BP = 1.000 ratio = 1.023 hyp_len = 45 ref_len = 44)
    Case { name: "numbers_with_separators",
      hyps: &["It costs $1,000.50 or 3.14 per unit, i.e. 1.000,5 in 2020-2021.", "Pi is 3.14159, e is 2.718; 10,000 people - 5.5%.", "Version 1.2.3 at 12:30, 1-2 items."],
      refs: &["It costs $1,000.50 or about 3.14 per unit, i.e. 1.000,50 in 2020 - 2021.", "Pi is 3.14, e is 2.718; 10,000 people-5.5 %.", "Version 1.2.3 at 12:30 , 1 - 2 items ."],
      score: 72.19122568893313, precisions: [88.88888888888889, 78.57142857142857, 66.66666666666667, 58.333333333333336], bp: 1.0,
      hyp_len: 45, ref_len: 44, counts: [40, 33, 26, 21], totals: [45, 42, 39, 36],
      display: "BLEU = 72.19 88.9/78.6/66.7/58.3 (BP = 1.000 ratio = 1.023 hyp_len = 45 ref_len = 44)" },
    // punctuation_only: BLEU = 0.00 83.3/75.0/50.0/0.0 (BP = 1.000 ratio = 1.091 hyp_len = 12 ref_len = 11)
    Case { name: "punctuation_only",
      hyps: &["...", "!?!", "-- , .", "hello world ."],
      refs: &[". . .", "!?", "--,.", "hello world!"],
      score: 0.0, precisions: [83.33333333333333, 75.0, 50.0, 0.0], bp: 1.0,
      hyp_len: 12, ref_len: 11, counts: [10, 6, 2, 0], totals: [12, 8, 4, 0],
      display: "BLEU = 0.00 83.3/75.0/50.0/0.0 (BP = 1.000 ratio = 1.091 hyp_len = 12 ref_len = 11)" },
    // whitespace: BLEU = 100.00 100.0/100.0/100.0/100.0 (BP = 1.000 ratio = 1.000 hyp_len = 18 ref_len = 18)
    Case { name: "whitespace",
      hyps: &["the\tcat  sat\t\ton   the mat  ", "  leading and trailing   \t", "a\u{a0}non-breaking\u{3000}space\u{2009}thin", "carriage return\r", "sep\u{1c}arated words\u{b}"],
      refs: &["the cat sat on the mat", "leading and trailing", "a non-breaking space thin", "carriage return", "sep arated words"],
      score: 100.00000000000004, precisions: [100.0, 100.0, 100.0, 100.0], bp: 1.0,
      hyp_len: 18, ref_len: 18, counts: [18, 13, 8, 4], totals: [18, 13, 8, 4],
      display: "BLEU = 100.00 100.0/100.0/100.0/100.0 (BP = 1.000 ratio = 1.000 hyp_len = 18 ref_len = 18)" },
    // html_entities: BLEU = 55.05 60.5/57.1/53.1/50.0 (BP = 1.000 ratio = 1.520 hyp_len = 38 ref_len = 25)
    Case { name: "html_entities",
      hyps: &["He said &quot;yes&quot; &amp; left &lt;quickly&gt; &amp;quot; &#39;ok&#39; &nbsp;", "Tom &amp; Jerry &lt;b&gt;bold&lt;/b&gt;", "a <skipped> b"],
      refs: &["He said \"yes\" & left <quickly> &quot; 'ok'  ", "Tom & Jerry <b>bold</b>", "a b"],
      score: 55.054621920087634, precisions: [60.526315789473685, 57.142857142857146, 53.125, 50.0], bp: 1.0,
      hyp_len: 38, ref_len: 25, counts: [23, 20, 17, 15], totals: [38, 35, 32, 30],
      display: "BLEU = 55.05 60.5/57.1/53.1/50.0 (BP = 1.000 ratio = 1.520 hyp_len = 38 ref_len = 25)" },
    // empty_references: BLEU = 0.00 0.0/0.0/0.0/0.0 (BP = 1.000 ratio = 0.000 hyp_len = 5 ref_len = 0)
    Case { name: "empty_references",
      hyps: &["some words here", "more words"],
      refs: &["", ""],
      score: 0.0, precisions: [0.0, 0.0, 0.0, 0.0], bp: 1.0,
      hyp_len: 5, ref_len: 0, counts: [0, 0, 0, 0], totals: [5, 3, 1, 0],
      display: "BLEU = 0.00 0.0/0.0/0.0/0.0 (BP = 1.000 ratio = 0.000 hyp_len = 5 ref_len = 0)" },
    // repeated_ngrams_clipped: BLEU = 9.55 46.2/9.1/5.6/3.6 (BP = 1.000 ratio = 1.300 hyp_len = 13 ref_len = 10)
    Case { name: "repeated_ngrams_clipped",
      hyps: &["the the the the the the the", "a a a b b b"],
      refs: &["the cat is on the mat", "a b a b"],
      score: 9.55204080682377, precisions: [46.15384615384615, 9.090909090909092, 5.555555555555555, 3.5714285714285716], bp: 1.0,
      hyp_len: 13, ref_len: 10, counts: [6, 1, 0, 0], totals: [13, 11, 9, 7],
      display: "BLEU = 9.55 46.2/9.1/5.6/3.6 (BP = 1.000 ratio = 1.300 hyp_len = 13 ref_len = 10)" },
];

/// (input, sacreBLEU's 13a tokenization).
#[rustfmt::skip]
const TOKENIZER_CASES: &[(&str, &str)] = &[
    ("Hello, world!", "Hello , world !"),
    ("It costs $1,000.50 (or 3.14).", "It costs $ 1,000.50 ( or 3.14 ) ."),
    ("end of sentence.", "end of sentence ."),
    ("1.5-2.5 and 10-20", "1.5 - 2.5 and 10 - 20"),
    ("x-ray co-operate -5 --flag", "x-ray co-operate -5 --flag"),
    ("don't can't O'Neil's", "don't can't O'Neil's"),
    ("&quot;quoted&quot; &amp;amp; &lt;tag&gt; &amp;quot;", "\" quoted \" & amp ; < tag > & quot ;"),
    ("a <skipped> b", "a b"),
    ("line-\nbreak and\nnewline", "linebreak and newline"),
    ("“Hello,” she said – 5 € … ©", "“Hello , ” she said – 5 € … ©"),
    ("e.g. U.S.A. etc.", "e . g . U . S . A . etc ."),
    ("3.14.15 ,5 5, .5 5.", "3.14.15 , 5 5 , . 5 5 ."),
    ("a..b,,c", "a . . b , , c"),
    ("[x]{y}~z|w^v_u`t\\s", "[ x ] { y } ~ z | w ^ v _ u ` t \\ s"),
    ("@user #tag 50% a*b+c=d", "@ user # tag 50 % a * b + c = d"),
    ("tab\there  and   spaces", "tab here and spaces"),
    (".,.,", ". , . ,"),
    ("1,000,000.00", "1,000,000.00"),
    ("Mr.Smith,Jr.", "Mr . Smith , Jr ."),
    ("10:30/11:45;done?", "10 : 30 / 11 : 45 ; done ?"),
    ("...", ". . ."),
    ("1...2", "1 . . .2"),
    ("a\u{1c}b\u{85}c", "a b c"),
    ("", ""),
];

#[test]
fn corpus_bleu_matches_sacrebleu() {
    for case in CASES {
        let got = corpus_bleu(case.hyps, case.refs).unwrap();
        let name = case.name;
        assert!(
            (got.score - case.score).abs() < 0.005,
            "{name}: score {} vs sacreBLEU {}",
            got.score,
            case.score
        );
        for n in 0..4 {
            assert!(
                (got.precisions[n] - case.precisions[n]).abs() < 1e-9,
                "{name}: precision {} is {} vs sacreBLEU {}",
                n + 1,
                got.precisions[n],
                case.precisions[n]
            );
        }
        assert!((got.bp - case.bp).abs() < 1e-12, "{name}: bp {}", got.bp);
        assert_eq!(got.hyp_len, case.hyp_len, "{name}: hyp_len");
        assert_eq!(got.ref_len, case.ref_len, "{name}: ref_len");
        assert_eq!(got.counts, case.counts, "{name}: counts");
        assert_eq!(got.totals, case.totals, "{name}: totals");
        let ratio = if case.ref_len == 0 {
            0.0
        } else {
            case.hyp_len as f64 / case.ref_len as f64
        };
        assert!((got.ratio - ratio).abs() < 1e-12, "{name}: ratio");
        assert_eq!(got.to_string(), case.display, "{name}: display");
    }
}

#[test]
fn tokenize_13a_matches_sacrebleu() {
    for (input, expected) in TOKENIZER_CASES {
        assert_eq!(tokenize_13a(input), *expected, "input {input:?}");
    }
}

#[test]
fn mismatched_line_counts_are_an_error_naming_both() {
    let err = corpus_bleu(&["a", "b", "c"], &["a", "b"]).unwrap_err();
    assert_eq!(err, BleuError::LineCountMismatch { hyps: 3, refs: 2 });
    let msg = err.to_string();
    assert!(msg.contains('3') && msg.contains('2'), "{msg}");
}

#[test]
fn empty_corpus_scores_zero() {
    let none: &[String] = &[];
    let s = corpus_bleu(none, none).unwrap();
    assert_eq!(s.score, 0.0);
    assert_eq!((s.hyp_len, s.ref_len), (0, 0));
}

// ---- the command line ----

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn transformer(args: &[&str], stdin: &[u8]) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_transformer"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary runs");
    // The binary may fail (and close stdin) before reading it all.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Asserts one clear `error:` line, a nonzero exit and no panic.
fn assert_error(run: &Run, needles: &[&str]) {
    assert_ne!(run.code, Some(0), "expected failure: {}", run.stderr);
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    assert_eq!(run.stderr.trim().lines().count(), 1, "{}", run.stderr);
    assert!(run.stderr.starts_with("error: "), "{}", run.stderr);
    for needle in needles {
        assert!(
            run.stderr.contains(needle),
            "{needle:?} not in {}",
            run.stderr
        );
    }
    assert!(run.stdout.is_empty(), "{}", run.stdout);
}

fn english() -> &'static Case {
    CASES.iter().find(|c| c.name == "english").unwrap()
}

#[test]
fn cli_prints_sacrebleu_line_from_file_and_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let case = english();
    let reference = dir.path().join("ref.txt");
    let hyp = dir.path().join("hyp.txt");
    std::fs::write(&reference, case.refs.join("\n") + "\n").unwrap();
    std::fs::write(&hyp, case.hyps.join("\n")).unwrap();
    let reference = reference.to_str().unwrap();

    let run = transformer(&["bleu", "--ref", reference, hyp.to_str().unwrap()], b"");
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, format!("{}\n", case.display));

    let stdin = case.hyps.join("\r\n") + "\r\n";
    let run = transformer(&["bleu", "--ref", reference], stdin.as_bytes());
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, format!("{}\n", case.display));
}

/// A hypothesis file of one empty line is one empty hypothesis, as sacreBLEU reads it:
/// `BLEU = 0.00 0.0/0.0/0.0/0.0 (BP = 0.000 ratio = 0.000 hyp_len = 0 ref_len = 3)`.
#[test]
fn cli_reads_one_empty_line_as_one_empty_hypothesis() {
    let dir = tempfile::tempdir().unwrap();
    let reference = dir.path().join("ref.txt");
    std::fs::write(&reference, "a b c\n").unwrap();
    let hyp = dir.path().join("hyp.txt");
    std::fs::write(&hyp, "\n").unwrap();
    let reference = reference.to_str().unwrap();
    let expected = "BLEU = 0.00 0.0/0.0/0.0/0.0 (BP = 0.000 ratio = 0.000 hyp_len = 0 ref_len = 3)";
    for run in [
        transformer(&["bleu", "--ref", reference, hyp.to_str().unwrap()], b""),
        transformer(&["bleu", "--ref", reference], b"\n"),
    ] {
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        assert!(run.stdout.starts_with(expected), "{}", run.stdout);
    }
    // An empty file is no hypotheses, which do not pair with one reference.
    assert_error(
        &transformer(&["bleu", "--ref", reference], b""),
        &["0 lines", "1 line"],
    );
}

#[test]
fn cli_errors_are_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let reference = dir.path().join("ref.txt");
    std::fs::write(&reference, "a b c\nd e f\n").unwrap();
    let reference = reference.to_str().unwrap();
    let missing = dir.path().join("missing.txt");
    let missing = missing.to_str().unwrap();

    assert_error(
        &transformer(&["bleu", "--ref", missing], b"a\n"),
        &[missing],
    );
    assert_error(
        &transformer(&["bleu", "--ref", reference, missing], b""),
        &[missing],
    );
    assert_error(
        &transformer(&["bleu", "--ref", reference], b"a b c\n"),
        &["<stdin> has 1 line but", "has 2 lines"],
    );
    assert_error(
        &transformer(
            &["bleu", "--ref", reference],
            b"ok\n\xff\xfe bad\nok\n\xc3\n",
        ),
        &["<stdin>", "not valid UTF-8", "2, 4"],
    );
    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, b"fine\nfine\n\x80\n").unwrap();
    assert_error(
        &transformer(&["bleu", "--ref", bad.to_str().unwrap()], b"a\nb\nc\n"),
        &["bad.txt", "line 3"],
    );
}
