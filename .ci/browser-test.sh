#!/usr/bin/env bash
# The page of `transformer serve` in headless Chromium (tests/browser/page_test.py), with the
# tiny Hugging Face Llama of ../shared. Installs Debian's chromium and chromium-driver when
# missing (apt-get, as root). Uses the binary `cargo test` built (target/debug/transformer),
# or $TRANSFORMER_BIN.
set -euo pipefail
cd "$(dirname "$0")/.."
model=../shared/reference/hf-decoders/llama-tiny
if [ ! -d "$model" ]; then
    echo "browser test skipped: $model is absent"
    exit 0
fi
if ! command -v chromium > /dev/null || ! command -v chromedriver > /dev/null; then
    echo "installing chromium and chromium-driver"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium chromium-driver > /dev/null \
        || { apt-get update > /dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium chromium-driver > /dev/null; }
fi
bin=${TRANSFORMER_BIN:-target/debug/transformer}
[ -x "$bin" ] || cargo build --bin transformer
port=$((20000 + RANDOM % 20000))
driver_port=$((port + 1))
"$bin" serve --model "$model" --addr "127.0.0.1:$port" > /tmp/browser-serve.$$.log 2>&1 &
server_pid=$!
chromedriver --port="$driver_port" > /tmp/browser-driver.$$.log 2>&1 &
driver_pid=$!
trap 'kill "$server_pid" "$driver_pid" 2> /dev/null || true' EXIT
for _ in $(seq 300); do
    if curl -sf "http://127.0.0.1:$port/health" > /dev/null && curl -sf "http://127.0.0.1:$driver_port/status" > /dev/null; then
        break
    fi
    sleep 0.1
done
python3 tests/browser/page_test.py "http://127.0.0.1:$port" "http://127.0.0.1:$driver_port" "$(command -v chromium)"
