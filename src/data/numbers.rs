//! The embedded demo task: English number words to German number words.
//!
//! Small enough to learn on a CPU, yet a real translation problem: German puts units before
//! tens ("twenty-one" -> "einundzwanzig"), writes the whole number as one word
//! ("dreihunderteinundzwanzig") and inflects "one" by position ("eins", "einhundert").

use std::collections::HashSet;

use crate::rng::Rng;

/// The largest number [`english`] and [`german`] spell.
pub const MAX_NUMBER: u32 = 999_999;

const ENGLISH_BELOW_TWENTY: [&str; 20] = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
];

const ENGLISH_TENS: [&str; 10] = [
    "", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
];

/// German 0..=19 as written at the end of a number ("eins", not "ein").
const GERMAN_BELOW_TWENTY: [&str; 20] = [
    "null",
    "eins",
    "zwei",
    "drei",
    "vier",
    "fünf",
    "sechs",
    "sieben",
    "acht",
    "neun",
    "zehn",
    "elf",
    "zwölf",
    "dreizehn",
    "vierzehn",
    "fünfzehn",
    "sechzehn",
    "siebzehn",
    "achtzehn",
    "neunzehn",
];

const GERMAN_TENS: [&str; 10] = [
    "", "", "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig", "achtzig", "neunzig",
];

/// English words for 1..=999 ("three hundred twenty-one", no "and").
fn english_below_thousand(n: u32) -> String {
    let hundreds = n / 100;
    let rest = n % 100;
    let mut words = Vec::new();
    if hundreds > 0 {
        words.push(format!(
            "{} hundred",
            ENGLISH_BELOW_TWENTY[hundreds as usize]
        ));
    }
    if rest >= 20 {
        let tens = ENGLISH_TENS[(rest / 10) as usize];
        match rest % 10 {
            0 => words.push(tens.to_string()),
            unit => words.push(format!("{tens}-{}", ENGLISH_BELOW_TWENTY[unit as usize])),
        }
    } else if rest > 0 {
        words.push(ENGLISH_BELOW_TWENTY[rest as usize].to_string());
    }
    words.join(" ")
}

/// The English words for `n`: 321 -> "three hundred twenty-one", 1005 -> "one thousand five",
/// 40_000 -> "forty thousand", 0 -> "zero".
///
/// # Panics
///
/// If `n` > [`MAX_NUMBER`]; the task generator never asks for more.
pub fn english(n: u32) -> String {
    assert!(
        n <= MAX_NUMBER,
        "english({n}): only 0..={MAX_NUMBER} are spelled"
    );
    if n == 0 {
        return ENGLISH_BELOW_TWENTY[0].to_string();
    }
    let thousands = n / 1000;
    let rest = n % 1000;
    let mut parts = Vec::new();
    if thousands > 0 {
        parts.push(format!("{} thousand", english_below_thousand(thousands)));
    }
    if rest > 0 {
        parts.push(english_below_thousand(rest));
    }
    parts.join(" ")
}

/// German for 1..=999 as one word. `ends_number` says whether nothing follows: a final 1 is
/// "eins" ("einhunderteins"), one followed by "tausend" is "ein" ("einhunderteintausend").
fn german_below_thousand(n: u32, ends_number: bool, pieces: &mut Vec<&'static str>) {
    let hundreds = n / 100;
    let rest = n % 100;
    if hundreds > 0 {
        pieces.push(german_unit_in_compound(hundreds));
        pieces.push("hundert");
    }
    if rest >= 20 {
        let unit = rest % 10;
        if unit > 0 {
            pieces.push(german_unit_in_compound(unit));
            pieces.push("und");
        }
        pieces.push(GERMAN_TENS[(rest / 10) as usize]);
    } else if rest == 1 && !ends_number {
        pieces.push("ein");
    } else if rest > 0 {
        pieces.push(GERMAN_BELOW_TWENTY[rest as usize]);
    }
}

/// A digit 1..=9 inside a compound: "ein" for 1, otherwise as written alone.
fn german_unit_in_compound(digit: u32) -> &'static str {
    if digit == 1 {
        "ein"
    } else {
        GERMAN_BELOW_TWENTY[digit as usize]
    }
}

/// The German number word for `n`, written as one word: 321 -> "dreihunderteinundzwanzig",
/// 21_000 -> "einundzwanzigtausend", 101 -> "einhunderteins", 1001 -> "eintausendeins",
/// 0 -> "null".
///
/// # Panics
///
/// If `n` > [`MAX_NUMBER`]; the task generator never asks for more.
pub fn german(n: u32) -> String {
    german_pieces(n).concat()
}

/// The German number word for `n` as its morphemes, which concatenate to [`german`]:
/// 321 -> ["drei", "hundert", "ein", "und", "zwanzig"]. A subword segmentation like the one BPE
/// learns, used by the demo as its target tokens.
///
/// # Panics
///
/// If `n` > [`MAX_NUMBER`].
pub fn german_pieces(n: u32) -> Vec<&'static str> {
    assert!(
        n <= MAX_NUMBER,
        "german({n}): only 0..={MAX_NUMBER} are spelled"
    );
    if n == 0 {
        return vec![GERMAN_BELOW_TWENTY[0]];
    }
    let thousands = n / 1000;
    let rest = n % 1000;
    let mut pieces = Vec::new();
    if thousands > 0 {
        german_below_thousand(thousands, false, &mut pieces);
        pieces.push("tausend");
    }
    if rest > 0 {
        german_below_thousand(rest, true, &mut pieces);
    }
    pieces
}

/// The number translation task: (English, German) pairs to train on and disjoint pairs held
/// out for evaluation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumberTask {
    pub train: Vec<(String, String)>,
    pub held_out: Vec<(String, String)>,
    /// The numbers behind `train`, in the same order.
    pub train_numbers: Vec<u32>,
    /// The numbers behind `held_out`, in the same order.
    pub held_out_numbers: Vec<u32>,
}

/// Draws distinct numbers in `1..=max` (with `max` capped at [`MAX_NUMBER`]) and spells them
/// in both languages; the held-out numbers never appear in training. Deterministic for a seed.
///
/// Draws alternate between uniform over `1..=max` and log-uniform (about as many numbers below
/// 1000 as above), so both short and long spellings appear. When `1..=max` holds fewer than
/// `n_train + n_held_out` numbers, every number is used and the task is smaller than asked:
/// the training set is filled first, the held-out set gets what remains (possibly nothing).
pub fn number_task(max: u32, n_train: usize, n_held_out: usize, seed: u64) -> NumberTask {
    let max = max.min(MAX_NUMBER);
    let available = max as usize;
    let wanted = n_train.saturating_add(n_held_out).min(available);
    let mut rng = Rng::new(seed);
    let mut numbers: Vec<u32> = if wanted.saturating_mul(2) > available {
        // Most of the range is wanted: take a shuffled prefix of all of it.
        let mut all: Vec<u32> = (1..=max).collect();
        rng.shuffle(&mut all);
        all.truncate(wanted);
        all
    } else {
        draw_distinct(&mut rng, max, wanted)
    };
    rng.shuffle(&mut numbers);
    let spell = |&n: &u32| (english(n), german(n));
    let train_count = n_train.min(numbers.len());
    NumberTask {
        train: numbers[..train_count].iter().map(spell).collect(),
        held_out: numbers[train_count..].iter().map(spell).collect(),
        train_numbers: numbers[..train_count].to_vec(),
        held_out_numbers: numbers[train_count..].to_vec(),
    }
}

/// `wanted` distinct numbers in `1..=max`, half drawn uniformly and half log-uniformly.
/// Needs `wanted <= max`. Rejection sampling stops after a bounded number of draws and tops up
/// from the unused numbers, so it always ends.
fn draw_distinct(rng: &mut Rng, max: u32, wanted: usize) -> Vec<u32> {
    let mut chosen = HashSet::with_capacity(wanted);
    let mut numbers = Vec::with_capacity(wanted);
    let log_range = (f64::from(max) + 1.0).ln();
    let max_draws = wanted.saturating_mul(20).saturating_add(1000);
    let mut draws = 0;
    while numbers.len() < wanted && draws < max_draws {
        // Alternate on accepted numbers, so half of those kept are log-uniform draws even
        // when small numbers run out and log-uniform draws get rejected more often.
        let candidate = if numbers.len() % 2 == 0 {
            1 + rng.below(max as usize) as u32
        } else {
            (rng.uniform_range(0.0, log_range).exp().floor() as u32).clamp(1, max)
        };
        draws += 1;
        if chosen.insert(candidate) {
            numbers.push(candidate);
        }
    }
    if numbers.len() < wanted {
        let mut unused: Vec<u32> = (1..=max).filter(|n| !chosen.contains(n)).collect();
        rng.shuffle(&mut unused);
        unused.truncate(wanted - numbers.len());
        numbers.extend(unused);
    }
    numbers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_german_spellings() {
        let table = [
            (0, "null"),
            (1, "eins"),
            (7, "sieben"),
            (11, "elf"),
            (12, "zwölf"),
            (16, "sechzehn"),
            (17, "siebzehn"),
            (21, "einundzwanzig"),
            (30, "dreißig"),
            (36, "sechsunddreißig"),
            (60, "sechzig"),
            (70, "siebzig"),
            (77, "siebenundsiebzig"),
            (99, "neunundneunzig"),
            (100, "einhundert"),
            (101, "einhunderteins"),
            (200, "zweihundert"),
            (321, "dreihunderteinundzwanzig"),
            (1000, "eintausend"),
            (1001, "eintausendeins"),
            (1100, "eintausendeinhundert"),
            (16_017, "sechzehntausendsiebzehn"),
            (21_000, "einundzwanzigtausend"),
            (101_000, "einhunderteintausend"),
            (201_001, "zweihunderteintausendeins"),
            (
                999_999,
                "neunhundertneunundneunzigtausendneunhundertneunundneunzig",
            ),
        ];
        for (n, expected) in table {
            assert_eq!(german(n), expected, "german({n})");
        }
    }

    #[test]
    fn known_english_spellings() {
        let table = [
            (0, "zero"),
            (1, "one"),
            (13, "thirteen"),
            (20, "twenty"),
            (21, "twenty-one"),
            (40, "forty"),
            (99, "ninety-nine"),
            (100, "one hundred"),
            (115, "one hundred fifteen"),
            (321, "three hundred twenty-one"),
            (1005, "one thousand five"),
            (12_000, "twelve thousand"),
            (40_000, "forty thousand"),
            (101_000, "one hundred one thousand"),
            (
                999_999,
                "nine hundred ninety-nine thousand nine hundred ninety-nine",
            ),
        ];
        for (n, expected) in table {
            assert_eq!(english(n), expected, "english({n})");
        }
    }

    #[test]
    fn task_is_disjoint_deterministic_and_spans_magnitudes() {
        let task = number_task(999_999, 2000, 300, 42);
        assert_eq!((task.train.len(), task.held_out.len()), (2000, 300));
        let train: HashSet<&String> = task.train.iter().map(|(en, _)| en).collect();
        assert_eq!(train.len(), 2000, "training numbers are distinct");
        assert!(task.held_out.iter().all(|(en, _)| !train.contains(en)));
        assert_eq!(task, number_task(999_999, 2000, 300, 42));
        assert_ne!(task.train, number_task(999_999, 2000, 300, 43).train);
        let (en, de) = &task.train[0];
        let english_of: std::collections::HashMap<String, u32> =
            (1..=999_999).map(|n| (english(n), n)).collect();
        assert_eq!(german(english_of[en]), *de);
        let numbers: Vec<u32> = task.train.iter().map(|(en, _)| english_of[en]).collect();
        // Uniform draws alone would give about 2 numbers below 1000 and none below 100.
        let tiny = numbers.iter().filter(|&&n| n < 100).count();
        let small = numbers.iter().filter(|&&n| n < 1000).count();
        let large = numbers.iter().filter(|&&n| n >= 100_000).count();
        assert!(
            tiny > 50 && small > 150 && large > 600,
            "tiny {tiny}, small {small}, large {large}"
        );
    }

    #[test]
    fn small_ranges_give_fewer_pairs_without_hanging() {
        let task = number_task(10, 8, 5, 1);
        assert_eq!((task.train.len(), task.held_out.len()), (8, 2));
        let mut all: Vec<&String> = task
            .train
            .iter()
            .chain(&task.held_out)
            .map(|(en, _)| en)
            .collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 10);
        let empty = number_task(0, 5, 5, 1);
        assert!(empty.train.is_empty() && empty.held_out.is_empty());
        // Over the spelled range: capped, not a panic.
        assert_eq!(number_task(u32::MAX, 3, 3, 1).train.len(), 3);
    }
}
