#!/usr/bin/env bash
# The reader fuzzing of tests/robustness/fuzz_readers.rs at length: every reader runs SECONDS
# seconds (default 60) instead of the suite's 2.5 s, with no case limit.
#
#   tests/fuzz/fuzz.sh [SECONDS]
#
# Prints one line per reader: "fuzz READER: N cases in S s (loaded, refused, 0 panics)"; a panic
# or an unclear error fails its test and saves the input under target/fuzz-failures/.
# Coverage-guided fuzzing with cargo-fuzz (nightly): see fuzz/README.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
SECONDS_PER_READER="${1:-60}"
TRANSFORMER_FUZZ_SECONDS="$SECONDS_PER_READER" TRANSFORMER_FUZZ_CASES=1000000000 \
    cargo test --test robustness -- fuzz_readers:: --nocapture --test-threads 2 2>&1 \
    | grep -E 'fuzz [a-z_.]+: |^test |test result|panicked|unclear'
