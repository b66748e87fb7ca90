#!/usr/bin/env bash
# The crash test at length: kill -9 training runs many times (translation and language model,
# resumed in place with --resume D --out D and into new directories) and check after every
# kill that the directory loads, that its checkpoint and every listed step checkpoint are one
# consistent save equal to an uninterrupted run's at that step, and that the resumed runs end
# bit-identical to the uninterrupted one (tests/robustness/crash.rs; `cargo test` makes 3 kills
# per case).
#
#   tests/crash/crash.sh [KILLS_PER_CASE]      default 100 (4 cases: 400 kills)
#
# Prints one line per case: "crash CASE: S of K kills survived (N during a save)".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
KILLS="${1:-100}"
TRANSFORMER_CRASH_KILLS="$KILLS" \
    cargo test --test robustness -- crash:: --nocapture --test-threads 2 2>&1 \
    | grep -E 'crash [a-z ,]+: |^test |test result|panicked|differs'
