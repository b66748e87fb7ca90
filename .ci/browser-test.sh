#!/usr/bin/env bash
# The page of `transformer serve` in headless Chromium (tests/browser/page_test.py): the chat
# view with the tiny Hugging Face Llama of ../shared, the encoder view with all-MiniLM-L6-v2 (each
# skipped when absent), and the translation
# view with a model trained here for a few seconds (`transformer demo`: English -> German
# number words, 100 updates). Installs Debian's chromium and chromium-driver when missing
# (apt-get, as root). Uses the binary `cargo test` built (target/debug/transformer), or
# $TRANSFORMER_BIN.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium > /dev/null || ! command -v chromedriver > /dev/null; then
    echo "installing chromium and chromium-driver"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium chromium-driver > /dev/null \
        || { apt-get update > /dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium chromium-driver > /dev/null; }
fi
bin=${TRANSFORMER_BIN:-target/debug/transformer}
[ -x "$bin" ] || cargo build --bin transformer
work=$(mktemp -d)
port=$((20000 + RANDOM % 20000))
driver_port=$((port + 1))
chromedriver --port="$driver_port" > "$work/driver.log" 2>&1 &
driver_pid=$!
server_pid=
trap 'kill $server_pid $driver_pid 2> /dev/null || true; rm -rf "$work"' EXIT

# Serves $1 on $port, runs the page test against it, stops the server.
page_test() {
    "$bin" serve --model "$1" --addr "127.0.0.1:$port" > "$work/serve.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 600); do
        if curl -sf "http://127.0.0.1:$port/health" > /dev/null && curl -sf "http://127.0.0.1:$driver_port/status" > /dev/null; then
            break
        fi
        sleep 0.1
    done
    python3 tests/browser/page_test.py "http://127.0.0.1:$port" "http://127.0.0.1:$driver_port" "$(command -v chromium)" \
        || { echo "server log:"; cat "$work/serve.log"; exit 1; }
    kill "$server_pid"
    wait "$server_pid" 2> /dev/null || true
    server_pid=
}

llama=../shared/reference/hf-decoders/llama-tiny
if [ -d "$llama" ]; then
    page_test "$llama"
else
    echo "browser chat test skipped: $llama is absent"
fi
encoder=../shared/models/all-MiniLM-L6-v2
if [ -d "$encoder" ]; then
    page_test "$encoder"
else
    echo "browser encoder test skipped: $encoder is absent"
fi
"$bin" demo --steps 100 --time-limit 20 --train-size 2000 --held-out 20 --samples 0 --threads 2 \
    --out "$work/numbers" > "$work/demo.log" 2>&1 || { cat "$work/demo.log"; exit 1; }
page_test "$work/numbers"
