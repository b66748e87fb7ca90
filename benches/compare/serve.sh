#!/usr/bin/env bash
# Load test of `transformer serve` side by side with llama.cpp's own server on the same GGUF
# and threads, and against our offline batched engine; optionally a translation model and a
# memory soak. Every figure comes from `transformer loadtest` (a closed-loop client on loopback).
#
#   bash benches/compare/serve.sh
#
# Environment (all optional):
#   THREADS=2            model threads of each server and of the offline engine
#   CLIENTS=1,4,16,64    concurrencies
#   REQUESTS=2           requests per client at each concurrency
#   MAX_TOKENS=32        max_tokens of every completion
#   PRECISIONS="f32 ggml"  our servers' --precision, one run each
#   IMPLS="ours llama.cpp offline"   (also: llama-server, llama.cpp's own C++ server with
#                        continuous batching, -np N slots: the issue's peer)
#   LLAMA_SERVER=PATH    llama-server binary (bash ../shared/tools/llama-cpp.sh builds it)
#   NP=N                 llama-server's slots [the largest of CLIENTS]; its context is
#                        CTX_PER_SLOT (512) x N, so every slot holds a prompt and its reply
#   ROUNDS=1             repeat the whole set of implementations this many times, interleaved
#   GGUF=FILE            [../shared/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf]
#   TRANSLATION=DIR      also load-test this translation model (ours, online and offline) with
#                        the sentences of SRC [../shared/data/de-en/ding.test.tsv]
#   SOAK_SECONDS=0       then keep CLIENTS_SOAK (16) clients busy on our server (first precision)
#                        for this long, sampling its resident memory every 10 s
#   VENV=DIR             Python environment with llama-cpp-python[server] [benches/compare/.venv]
#   OUT=DIR              outputs [benches/compare/out/serve]
#   BIN=PATH             our binary [target/release/transformer]; SKIP_BUILD=1 uses it as it is
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"

THREADS=${THREADS:-2}
CLIENTS=${CLIENTS:-1,4,16,64}
REQUESTS=${REQUESTS:-2}
MAX_TOKENS=${MAX_TOKENS:-32}
PRECISIONS=${PRECISIONS:-"f32 ggml"}
IMPLS=${IMPLS:-"ours llama.cpp offline"}
GGUF=${GGUF:-$ROOT/../shared/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf}
TRANSLATION=${TRANSLATION:-}
SRC=${SRC:-$ROOT/../shared/data/de-en/ding.test.tsv}
SOAK_SECONDS=${SOAK_SECONDS:-0}
CLIENTS_SOAK=${CLIENTS_SOAK:-16}
VENV=${VENV:-$HERE/.venv}
OUT=${OUT:-$HERE/out/serve}
BIN=${BIN:-$ROOT/target/release/transformer}
PORT=${PORT:-18080}
LLAMA_SERVER=${LLAMA_SERVER:-/work/llama-cpp/build/bin/llama-server}
NP=${NP:-$(echo "$CLIENTS" | tr , '\n' | sort -n | tail -1)}
CTX_PER_SLOT=${CTX_PER_SLOT:-512}
ROUNDS=${ROUNDS:-1}
mkdir -p "$OUT"
REPORT=$OUT/report.md
: >"$REPORT"

say() { echo "$@" | tee -a "$REPORT"; }
has_impl() { [[ " $IMPLS " == *" $1 "* ]]; }
[[ -f "$GGUF" ]] || { echo "error: $GGUF not found (set GGUF=...)" >&2; exit 2; }
if [[ -z "${SKIP_BUILD:-}" ]]; then cargo build --release --bin transformer; fi

SERVER_PID=
stop_server() {
    if [[ -n "$SERVER_PID" ]]; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=
    fi
}
trap stop_server EXIT

# wait_for URL: until it answers 200 (at most 300 s).
wait_for() {
    for _ in $(seq 3000); do
        if curl -sf "$1" >/dev/null 2>&1; then return 0; fi
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then echo "error: the server exited" >&2; return 1; fi
        sleep 0.1
    done
    echo "error: $1 did not answer" >&2
    return 1
}

load() { "$BIN" loadtest --addr "127.0.0.1:$PORT" --clients "$CLIENTS" --requests "$REQUESTS" "$@"; }

say "# Serving load test ($(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"
say
say "\`$GGUF\`, $THREADS threads, max_tokens $MAX_TOKENS, $REQUESTS requests per client."

for round in $(seq "$ROUNDS"); do
    say
    say "# round $round"
    if has_impl ours; then
        for p in $PRECISIONS; do
            "$BIN" serve --model "$GGUF" --addr "127.0.0.1:$PORT" --threads "$THREADS" --precision "$p" \
                >"$OUT/ours-$p.log" 2>&1 &
            SERVER_PID=$!
            wait_for "http://127.0.0.1:$PORT/health"
            say
            say "## ours, --precision $p"
            say
            load --max-tokens "$MAX_TOKENS" | tee -a "$REPORT"
            stop_server
        done
    fi

    if has_impl llama.cpp; then
        PY=$VENV/bin/python
        if ! "$PY" -c "import llama_cpp.server" 2>/dev/null; then
            echo "error: $PY lacks llama-cpp-python[server] (pip install 'llama-cpp-python[server]';" \
                "on a CPU with AMX build it with CMAKE_ARGS='-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF')" >&2
            exit 2
        fi
        # One request at a time is what llama-cpp-python serves; --interrupt_requests False keeps a
        # new request from cutting the running stream short.
        "$PY" -m llama_cpp.server --model "$GGUF" --n_threads "$THREADS" --n_threads_batch "$THREADS" \
            --n_ctx 2048 --interrupt_requests False --port "$PORT" >"$OUT/llama.log" 2>&1 &
        SERVER_PID=$!
        wait_for "http://127.0.0.1:$PORT/v1/models"
        say
        say "## llama.cpp server (llama-cpp-python $("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)'))"
        say
        load --max-tokens "$MAX_TOKENS" | tee -a "$REPORT"
        stop_server
    fi

    if has_impl llama-server; then
        [[ -x "$LLAMA_SERVER" ]] || { echo "error: $LLAMA_SERVER not found (set LLAMA_SERVER=...)" >&2; exit 2; }
        # llama.cpp's C++ server: continuous batching over NP slots, the same file and threads.
        "$LLAMA_SERVER" -m "$GGUF" --host 127.0.0.1 --port "$PORT" -t "$THREADS" -tb "$THREADS" \
            -np "$NP" -c $((NP * CTX_PER_SLOT)) >"$OUT/llama-server.log" 2>&1 &
        SERVER_PID=$!
        wait_for "http://127.0.0.1:$PORT/health"
        say
        say "## llama-server (llama.cpp's C++ server, -np $NP -c $((NP * CTX_PER_SLOT)) -t $THREADS)"
        say
        load --max-tokens "$MAX_TOKENS" | tee -a "$REPORT"
        stop_server
    fi

    if has_impl offline; then
        for p in $PRECISIONS; do
            say
            say "## our engine offline (no HTTP), --precision $p"
            say
            "$BIN" loadtest --offline "$GGUF" --clients "$CLIENTS" --requests "$REQUESTS" \
                --max-tokens "$MAX_TOKENS" --threads "$THREADS" --precision "$p" | tee -a "$REPORT"
        done
    fi

done

if [[ -n "$TRANSLATION" ]]; then
    "$BIN" serve --model "$TRANSLATION" --addr "127.0.0.1:$PORT" --threads "$THREADS" \
        >"$OUT/ours-translation.log" 2>&1 &
    SERVER_PID=$!
    wait_for "http://127.0.0.1:$PORT/health"
    say
    say "## translation: ours, \`$TRANSLATION\`, one sentence of \`$SRC\` per request"
    say
    load --translate "$SRC" | tee -a "$REPORT"
    stop_server
    say
    say "## translation offline (batched greedy \`translate\`)"
    say
    "$BIN" loadtest --offline "$TRANSLATION" --translate "$SRC" --clients "$CLIENTS" \
        --requests "$REQUESTS" --threads "$THREADS" | tee -a "$REPORT"
fi

if [[ "$SOAK_SECONDS" -gt 0 ]]; then
    p=${PRECISIONS%% *}
    "$BIN" serve --model "$GGUF" --addr "127.0.0.1:$PORT" --threads "$THREADS" --precision "$p" \
        >"$OUT/soak.log" 2>&1 &
    SERVER_PID=$!
    wait_for "http://127.0.0.1:$PORT/health"
    rss() { awk '/VmRSS/ {print $2}' "/proc/$SERVER_PID/status"; }
    samples=$OUT/soak-rss.txt
    : >"$samples"
    end=$((SECONDS + SOAK_SECONDS))
    rounds=0
    errors=0
    while ((SECONDS < end)); do
        out=$("$BIN" loadtest --addr "127.0.0.1:$PORT" --clients "$CLIENTS_SOAK" --requests 1 \
            --max-tokens "$MAX_TOKENS")
        errors=$((errors + $(echo "$out" | awk -F'|' 'NR==3 {gsub(/ /, "", $4); print $4}')))
        rounds=$((rounds + 1))
        echo "$((SECONDS)) $(rss)" >>"$samples"
    done
    used=$(curl -sf "http://127.0.0.1:$PORT/metrics" | awk '/^transformer_kv_blocks_used / {print $2}')
    say
    say "## soak: $SOAK_SECONDS s of $CLIENTS_SOAK clients on ours (--precision $p)"
    say
    say "$rounds rounds, $errors errors; resident memory (KiB) after round 1 / median / last / max:" \
        "$(head -1 "$samples" | cut -d' ' -f2) / $(cut -d' ' -f2 "$samples" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')" \
        "/ $(tail -1 "$samples" | cut -d' ' -f2) / $(cut -d' ' -f2 "$samples" | sort -n | tail -1);" \
        "KV blocks in use afterwards: ${used:-?}"
    stop_server
fi
echo "report: $REPORT"
