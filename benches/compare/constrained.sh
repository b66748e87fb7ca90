#!/usr/bin/env bash
# What constrained decoding costs: one server per binary and round, load-tested with plain
# requests, then all `json_object`, then all `json_schema` (benches/compare/book_schema.json: five
# fields), in turns, so the ratio of tokens/s is measured against the same server under the same
# load. With two binaries (BINS="a b"), each round serves a, then b.
#
#   MODEL=model.gguf bash benches/compare/constrained.sh
#
# Environment: BINS (default target/release/transformer), ROUNDS (default "1 2 3"), PRECISION
# (ggml), THREADS (2), CLIENTS (1,4,16), REQUESTS (2), MAX_TOKENS (64), PROMPT, OUT (default: a
# new temporary directory). Prints the table rows of every run; the outputs are kept under OUT.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
: "${MODEL:?MODEL: a model path}"
BINS=${BINS:-target/release/transformer}
OUT=${OUT:-$(mktemp -d)}
PROMPT=${PROMPT:-"Describe a book as JSON with its title, author, year, pages and summary"}
SCHEMA=benches/compare/book_schema.json
mkdir -p "$OUT"
for round in ${ROUNDS:-1 2 3}; do
    b=0
    for bin in $BINS; do
        b=$((b + 1))
        port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
        "$bin" serve --model "$MODEL" --precision "${PRECISION:-ggml}" --threads "${THREADS:-2}" \
            --addr "127.0.0.1:$port" > "$OUT/serve-$b-$round.log" 2>&1 &
        pid=$!
        for _ in $(seq 1 600); do
            curl -sf "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break
            sleep 0.2
        done
        for mode in plain json_object json_schema; do
            case $mode in
                plain) extra=() ;;
                json_object) extra=(--response-format json_object) ;;
                json_schema) extra=(--json-schema "$SCHEMA") ;;
            esac
            "$bin" loadtest --addr "127.0.0.1:$port" --clients "${CLIENTS:-1,4,16}" \
                --requests "${REQUESTS:-2}" --max-tokens "${MAX_TOKENS:-64}" --prompt "$PROMPT" \
                "${extra[@]}" > "$OUT/lt-$b-$mode-$round.txt" 2>&1 || true
            echo "binary $b ($bin) $mode round $round (load $(cut -d' ' -f1-3 /proc/loadavg))"
            grep -E '^\| *[0-9]' "$OUT/lt-$b-$mode-$round.txt" || echo "(no table: see $OUT)"
        done
        kill "$pid"; wait "$pid" 2>/dev/null || true
    done
done
echo "outputs in $OUT" >&2
