#!/usr/bin/env bash
# Prefix caching and fair admission, measured against our own server (benches/compare/prefix_chat.py):
# a 10-turn chat with and without the prefix cache, then a mixed-size load with strict FIFO
# admission (--max-overtakes 0) and with overtaking (16), each against a fresh server.
# BIN=target/release/transformer MODEL=... THREADS=2 PRECISION=ggml KV_MEMORY=50 bash benches/compare/prefix_bench.sh
set -euo pipefail
BIN=${BIN:-target/release/transformer}
MODEL=${MODEL:-../shared/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${THREADS:-2}
PRECISION=${PRECISION:-ggml}
KV_MEMORY=${KV_MEMORY:-50}
PORT=${PORT:-18181}
TURNS=${TURNS:-10}
MAX_TOKENS=${MAX_TOKENS:-24}
HERE=$(dirname "$0")

serve() {
    "$BIN" serve --model "$MODEL" --port "$PORT" --threads "$THREADS" --precision "$PRECISION" \
        --kv-memory "$KV_MEMORY" "$@" 2>/dev/null &
    PID=$!
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && return 0
        sleep 0.2
    done
    echo "the server did not start" >&2
    exit 1
}
stop() { kill "$PID"; wait "$PID" || true; }

echo "load before: $(uptime)"
for mode in cache no-cache; do
    echo "## chat, $mode"
    if [ $mode = cache ]; then serve; else serve --no-prefix-cache; fi
    python3 "$HERE/prefix_chat.py" chat "127.0.0.1:$PORT" "$TURNS" "$MAX_TOKENS"
    curl -s "http://127.0.0.1:$PORT/metrics" | grep '^transformer_prefix_cache\|^transformer_kv_blocks_cached'
    stop
done
for overtakes in 0 16; do
    echo "## mixed load, --max-overtakes $overtakes"
    serve --max-overtakes "$overtakes"
    python3 "$HERE/prefix_chat.py" mixed "127.0.0.1:$PORT" ${MIXED:-6 6 2}
    stop
done
echo "load after: $(uptime)"
