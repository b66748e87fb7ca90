#!/usr/bin/env bash
# One long scoring request against a small chat, two builds of `transformer serve` side by side
# (issue 44: "one long prompt starves everyone"). Each round starts A, runs
# prefill_fair.py against it (a LONG-token /v1/completions with echo + logprobs, then DELAY s
# later a small streamed chat), stops it, then the same for B; rounds alternate which goes
# first. Prints every round's figures and, per build, the medians over the rounds.
#
#   BIN_A=old/transformer BIN_B=new/transformer bash benches/compare/prefill_fair.sh
#
# Environment: MODEL [../shared/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf],
# ROUNDS (5), THREADS (1), PRECISION (f32), LONG (3000), DELAY (1.0), ARGS_A / ARGS_B (more
# serve flags for A / B, e.g. "--prefill-budget 512"), OUT (default: a new temporary directory).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${BIN_A:?BIN_A: the first binary}" "${BIN_B:?BIN_B: the second binary}"
MODEL=${MODEL:-$HERE/../../../shared/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
uptime | tee "$OUT/load.txt"
for round in $(seq 1 "${ROUNDS:-5}"); do
    order="A B"; (( round % 2 == 0 )) && order="B A"
    for who in $order; do
        bin=$BIN_A; args=${ARGS_A:-}
        [[ $who = B ]] && { bin=$BIN_B; args=${ARGS_B:-}; }
        port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
        # shellcheck disable=SC2086
        "$bin" serve --model "$MODEL" --precision "${PRECISION:-f32}" --threads "${THREADS:-1}" \
            --addr "127.0.0.1:$port" $args > "$OUT/serve-$who-$round.log" 2>&1 &
        pid=$!
        for _ in $(seq 1 600); do
            curl -sf "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break
            sleep 0.2
        done
        line=$(python3 "$HERE/prefill_fair.py" --port "$port" --long "${LONG:-3000}" \
            --delay "${DELAY:-1.0}")
        kill "$pid"; wait "$pid" 2>/dev/null || true
        echo "$who $round $line" | tee -a "$OUT/rounds.txt"
    done
done
python3 - "$OUT/rounds.txt" <<'EOF'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    who, _, js = line.split(" ", 2)
    runs.setdefault(who, []).append(json.loads(js))
print("| build | rounds | chat TTFT median (s) | chat total median (s) | long scoring median (s) |")
print("|---|---:|---:|---:|---:|")
for who in sorted(runs):
    r = runs[who]
    med = lambda k: statistics.median(x[k] for x in r)
    print(f"| {who} | {len(r)} | {med('chat_ttft_s'):.2f} | {med('chat_s'):.2f} | {med('long_s'):.2f} |")
EOF
echo "outputs in $OUT" >&2
