//! The BPE port against the `sentencepiece` package (0.2.3): the checks of tests.rs on the BPE
//! models of make.py (`BPE_MODELS`), its hand-made and truncated BPE models
//! (malformed-bpe.json), and damaged copies of the BPE model files.

use super::load_tests::{check_damaged, check_malformed};
use super::tests::{
    check_long_texts, check_odd_sequences, check_samples, check_test_corpora, check_vocabulary,
};

/// The BPE models of make.py: each has `<name>.json` and `<name>.lines`.
const BPE_MODELS: [&str; 5] = [
    "bpe-en",
    "bpe-de",
    "bpe-fallback",
    "bpe-user",
    "bpe-unused",
];

#[test]
fn bpe_samples_encode_and_decode_as_the_package() {
    check_samples(&BPE_MODELS);
}

#[test]
fn bpe_odd_sequences_decode_as_the_package() {
    check_odd_sequences(&BPE_MODELS);
}

#[test]
fn bpe_vocabulary_lookups_agree_with_the_package() {
    check_vocabulary(&BPE_MODELS);
}

#[test]
fn bpe_long_texts_encode_and_decode_as_the_package() {
    check_long_texts(&BPE_MODELS);
}

#[test]
fn bpe_every_test_corpus_line_encodes_and_decodes_as_the_package() {
    check_test_corpora(&BPE_MODELS);
}

#[test]
fn malformed_bpe_models_are_refused_where_the_package_refuses_them() {
    check_malformed("malformed-bpe.json");
}

#[test]
fn damaged_bpe_files_give_errors_or_working_models_never_panics() {
    check_damaged(
        &[
            "bpe-user.model",
            "bpe-fallback.model",
            "bpe-unused.model",
            "bpe.model",
        ],
        0x2545_F491_4F6C_DD1D,
    );
}
