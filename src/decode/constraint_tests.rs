//! Constraints on a small vocabulary (every printable ASCII byte, a few longer pieces, a
//! special end token): the mask allows exactly the tokens that keep the text a prefix of the
//! language, and random walks through it end in sentences of the language.

use super::*;
use crate::rng::Rng;

/// Printable ASCII one byte each, then the pieces `longer`, then `<|end|>` (special) last; the
/// tokens and the end token's id. Shared by the grammar tests of `decode` and `serve`.
pub(crate) fn byte_tokens(longer: &[&str]) -> (Vec<TokenBytes>, u32) {
    let mut words: Vec<Vec<u8>> = (0x20u8..0x7f).map(|b| vec![b]).collect();
    words.extend(longer.iter().map(|w| w.as_bytes().to_vec()));
    let mut tokens: Vec<TokenBytes> = words
        .into_iter()
        .map(|bytes| TokenBytes {
            bytes,
            special: false,
        })
        .collect();
    tokens.push(TokenBytes {
        bytes: b"<|end|>".to_vec(),
        special: true,
    });
    let end = tokens.len() as u32 - 1;
    (tokens, end)
}

/// The compiler of [`byte_tokens`] without longer pieces, and its end token.
pub(crate) fn byte_vocab() -> (ConstraintVocab, u32) {
    let (tokens, end) = byte_tokens(&[]);
    let vocab = ConstraintVocab::new(&tokens, tokens.len(), &[end]).unwrap();
    (vocab, end)
}

/// Printable ASCII one byte each, longer pieces, then `<|end|>` (special) last.
fn vocab() -> (Vec<TokenBytes>, u32) {
    byte_tokens(&[
        "{\"", "\":", "\",\"", "true", "false", "null", "12", "abc", "\"}", "\n",
    ])
}

/// Samples from random logits under `grammar` until the end token (at most 400 tokens); the
/// text written.
fn walk(
    cv: &ConstraintVocab,
    tokens: &[TokenBytes],
    end: u32,
    grammar: &Grammar,
    rng: &mut Rng,
) -> String {
    let mut c = cv.compile(grammar).unwrap();
    let mut text = Vec::new();
    for _ in 0..400 {
        let mut logits: Vec<f32> = (0..cv.vocab_size)
            .map(|_| rng.uniform() as f32 * 4.0)
            .collect();
        // The end token likelier, so walks finish.
        logits[end as usize] += 3.0;
        c.allowed().unwrap().mask(&mut logits);
        let id = crate::decode::sample::sample(&logits, Default::default(), rng);
        assert!(logits[id as usize].is_finite());
        if id == end {
            return String::from_utf8(text).unwrap();
        }
        text.extend_from_slice(&tokens[id as usize].bytes);
        if c.advance(id).unwrap() {
            return String::from_utf8(text).unwrap();
        }
    }
    panic!(
        "no end after 400 tokens: {:?}",
        String::from_utf8_lossy(&text)
    );
}

#[test]
fn the_mask_allows_exactly_the_prefixes_of_the_language() {
    let (tokens, end) = vocab();
    let cv = ConstraintVocab::new(&tokens, tokens.len() + 3, &[end]).unwrap();
    let mut c = cv.compile(&Grammar::Regex("ab+c".into())).unwrap();
    let mut logits = vec![1.0f32; cv.vocab_size];
    c.allowed().unwrap().mask(&mut logits);
    let allowed: Vec<usize> = (0..logits.len())
        .filter(|&j| logits[j].is_finite())
        .collect();
    // "a" alone and "abc" (a sentence, then nothing more may follow but the end).
    let a = tokens.iter().position(|t| t.bytes == b"a").unwrap();
    let abc = tokens.iter().position(|t| t.bytes == b"abc").unwrap();
    assert_eq!(allowed, vec![a, abc]);
    assert!(!c.advance(a as u32).unwrap());
    let mut logits = vec![1.0f32; cv.vocab_size];
    c.allowed().unwrap().mask(&mut logits);
    let b = tokens.iter().position(|t| t.bytes == b"b").unwrap();
    let allowed: Vec<usize> = (0..logits.len())
        .filter(|&j| logits[j].is_finite())
        .collect();
    assert_eq!(allowed, vec![b]);
    assert!(!c.advance(b as u32).unwrap());
    let cc = tokens.iter().position(|t| t.bytes == b"c").unwrap();
    // "abc" is whole and nothing may follow: the row is complete, only the end token is left
    // (entries past the tokenizer's are never allowed).
    assert!(c.advance(cc as u32).unwrap());
    let mut logits = vec![1.0f32; cv.vocab_size];
    c.allowed().unwrap().mask(&mut logits);
    let allowed: Vec<usize> = (0..logits.len())
        .filter(|&j| logits[j].is_finite())
        .collect();
    assert_eq!(allowed, vec![end as usize]);
    // A token outside the mask is an error, not silently taken.
    let mut c = cv.compile(&Grammar::Regex("ab+c".into())).unwrap();
    assert!(c.advance(cc as u32).is_err());
}

#[test]
fn random_walks_end_in_sentences_of_the_language() {
    let (tokens, end) = vocab();
    let cv = ConstraintVocab::new(&tokens, tokens.len(), &[end]).unwrap();
    let mut rng = Rng::new(11);
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 3, "maximum": 41},
            "ok": {"type": "boolean"},
            "tag": {"enum": ["red", "green"]},
            "s": {"type": "string", "maxLength": 4, "pattern": "^[a-c]*$"}
        },
        "required": ["n", "tag", "s"],
        "additionalProperties": false
    });
    for _ in 0..20 {
        let text = walk(
            &cv,
            &tokens,
            end,
            &Grammar::JsonSchema(schema.clone()),
            &mut rng,
        );
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let n = v["n"].as_i64().unwrap();
        assert!((3..=41).contains(&n), "{text}");
        assert!(
            ["red", "green"].contains(&v["tag"].as_str().unwrap()),
            "{text}"
        );
        let s = v["s"].as_str().unwrap();
        assert!(
            s.len() <= 4 && s.chars().all(|c| ('a'..='c').contains(&c)),
            "{text}"
        );
        assert!(v
            .as_object()
            .unwrap()
            .keys()
            .all(|k| ["n", "ok", "tag", "s"].contains(&k.as_str())));
        assert!(
            !text.contains(' ') && !text.contains('\n'),
            "compact JSON: {text}"
        );
    }
    for _ in 0..10 {
        let text = walk(
            &cv,
            &tokens,
            end,
            &Grammar::Regex("(ab|c){1,3}-[0-9]{2}".into()),
            &mut rng,
        );
        let ok = text.len() >= 4 && text[text.len() - 3..].starts_with('-');
        assert!(ok, "{text}");
        let gbnf = "root ::= (\"yes\" | \"no\") \" \" digit{1,2}\ndigit ::= [0-9]\n";
        let text = walk(&cv, &tokens, end, &Grammar::Gbnf(gbnf.into()), &mut rng);
        let (word, num) = text.split_once(' ').unwrap();
        assert!(
            ["yes", "no"].contains(&word) && (1..=2).contains(&num.len()),
            "{text}"
        );
        let lark = "start: \"[\" item (\",\" item)* \"]\"\nitem: /[a-c]/";
        let text = walk(&cv, &tokens, end, &Grammar::Lark(lark.into()), &mut rng);
        assert!(text.starts_with('[') && text.ends_with(']'), "{text}");
    }
    let text = walk(&cv, &tokens, end, &Grammar::JsonObject, &mut rng);
    assert!(
        serde_json::from_str::<Value>(&text).unwrap().is_object(),
        "{text}"
    );
}

#[test]
fn bad_grammars_are_errors_with_a_message() {
    let (tokens, end) = vocab();
    let cv = ConstraintVocab::new(&tokens, tokens.len(), &[end]).unwrap();
    let err = |g: Grammar| cv.compile(&g).unwrap_err().to_string();
    assert!(!err(Grammar::Regex("(ab".into())).is_empty());
    assert!(!err(Grammar::Lark("start: missing_rule".into())).is_empty());
    assert!(err(Grammar::Gbnf("root ::= nothing".into())).contains("nothing"));
    let e = err(Grammar::JsonSchema(
        serde_json::json!({"type": "no-such-type"}),
    ));
    assert!(!e.is_empty());
    let e = err(Grammar::JsonSchema(
        serde_json::json!({"type": "integer", "minimum": 5, "maximum": 2}),
    ));
    assert!(!e.is_empty(), "an empty interval is refused");
    assert!(ConstraintVocab::new(&tokens, tokens.len(), &[]).is_err());
    assert!(
        ConstraintVocab::new(&tokens, tokens.len() - 1, &[end]).is_err(),
        "the end token is outside"
    );
}
