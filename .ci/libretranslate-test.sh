#!/usr/bin/env bash
# libretranslatepy 2.1.1 (the LibreTranslate client, pip-installed when missing) against
# `transformer serve` with a translation model trained here for a few seconds (`transformer
# demo`: English -> German number words), behind --api-key: tests/clients/libretranslate_test.py
# (languages, translate with the key as a form field, source "auto", detect, 401 for a wrong key,
# 400 for the reversed pair), then a multilingual model (tests/fixtures/nllb) with
# tests/clients/libretranslate_multilingual_test.py, then the demo's model and the Marian fixture
# served together (two --model) with tests/clients/libretranslate_routes_test.py. About 30 s,
# most of it the training. Uses the binary `cargo test`
# built (target/debug/transformer), or $TRANSFORMER_BIN.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c "import libretranslatepy" 2> /dev/null || python3 -m pip install -q "libretranslatepy==2.1.1"
bin=${TRANSFORMER_BIN:-target/debug/transformer}
[ -x "$bin" ] || cargo build --bin transformer
work=$(mktemp -d)
port=$((20000 + RANDOM % 20000))
server_pid=
trap 'kill $server_pid 2> /dev/null || true; rm -rf "$work"' EXIT
"$bin" demo --steps 20 --time-limit 20 --train-size 300 --held-out 20 --samples 0 --threads 2 \
    --out "$work/numbers" > "$work/demo.log" 2>&1 || { cat "$work/demo.log"; exit 1; }
"$bin" serve --model "$work/numbers" --port "$port" --source-lang en --target-lang de \
    --api-key ci-key > "$work/serve.log" 2>&1 &
server_pid=$!
for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
    sleep 0.1
done
python3 tests/clients/libretranslate_test.py "http://127.0.0.1:$port" ci-key en de \
    || { echo "server log:"; cat "$work/serve.log"; exit 1; }
# A multilingual model (tests/fixtures/nllb: NLLB's layout, 202 languages) behind the same API:
# every pair it knows, each answer what `translate --source-lang --target-lang` prints.
kill $server_pid 2> /dev/null || true
port=$((20000 + RANDOM % 20000))
"$bin" serve --model tests/fixtures/nllb --port "$port" > "$work/serve-nllb.log" 2>&1 &
server_pid=$!
for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
    sleep 0.1
done
python3 tests/clients/libretranslate_multilingual_test.py "http://127.0.0.1:$port" "$bin" \
    tests/fixtures/nllb || { echo "server log:"; cat "$work/serve-nllb.log"; exit 1; }
# Two models behind one server: the demo's English -> German and the Marian fixture's German ->
# English, routed by pair and by the detected language.
kill $server_pid 2> /dev/null || true
port=$((20000 + RANDOM % 20000))
"$bin" serve --model "$work/numbers" --model tests/fixtures/marian --source-lang en \
    --target-lang de --port "$port" > "$work/serve-two.log" 2>&1 &
server_pid=$!
for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
    sleep 0.1
done
python3 tests/clients/libretranslate_routes_test.py "http://127.0.0.1:$port" "$bin" \
    "$work/numbers" tests/fixtures/marian \
    || { echo "server log:"; cat "$work/serve-two.log"; exit 1; }
