#!/usr/bin/env bash
# Two builds of `transformer serve` side by side: each round starts A, load-tests it, stops it,
# then the same for B, for each precision; the load test is A's `transformer loadtest`.
#
#   BIN_A=old/transformer BIN_B=new/transformer MODEL=model.gguf bash benches/compare/serve_ab.sh
#
# Environment: ROUNDS (default "1 2 3 4"), PRECISIONS (default "f32 ggml"), THREADS (2),
# CLIENTS (1,4,16), REQUESTS (2), MAX_TOKENS (32), OUT (default: a new temporary directory).
# Prints the table rows of every run; the whole load-test output is kept under OUT.
set -euo pipefail
: "${BIN_A:?BIN_A: the first binary}" "${BIN_B:?BIN_B: the second binary}" "${MODEL:?MODEL: a model path}"
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
for round in ${ROUNDS:-1 2 3 4}; do
    for prec in ${PRECISIONS:-f32 ggml}; do
        for who in A B; do
            bin=$BIN_A; [[ $who = B ]] && bin=$BIN_B
            port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
            "$bin" serve --model "$MODEL" --precision "$prec" --threads "${THREADS:-2}" \
                --addr "127.0.0.1:$port" > "$OUT/serve-$who-$prec-$round.log" 2>&1 &
            pid=$!
            for _ in $(seq 1 600); do
                curl -sf "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break
                sleep 0.2
            done
            "$BIN_A" loadtest --addr "127.0.0.1:$port" --clients "${CLIENTS:-1,4,16}" \
                --requests "${REQUESTS:-2}" --max-tokens "${MAX_TOKENS:-32}" \
                > "$OUT/lt-$who-$prec-$round.txt" 2>&1 || true
            kill "$pid"; wait "$pid" 2>/dev/null || true
            echo "$who $prec round $round"
            grep -E '^\| *[0-9]' "$OUT/lt-$who-$prec-$round.txt" || echo "(no table: see $OUT)"
        done
    done
done
echo "outputs in $OUT" >&2
