#!/usr/bin/env bash
# Single-stream decode tokens/s after a long context, ours against llama.cpp's llama-bench, with
# the key/value memory per token: each round runs, for every depth and thread count, ours
# (`bench --generate --prompt-tokens DEPTH`, the cache types of CACHE) then llama-bench
# (`-d DEPTH -n NEW`, -ctk/-ctv CACHE, flash attention on as llama.cpp needs for a quantised V).
# One JSON line per measurement, then a table of medians. Interleaved rounds; the load is logged.
#
#   LLAMA_BENCH=/work/llama-cpp/build/bin/llama-bench ROUNDS=3 DEPTHS="1024 8192" THREADS="1 2" \
#       CACHE=f32 bash benches/compare/long_context.sh target/release/transformer FILE.gguf
#
# A depth beyond the file's context is refused by ours (SmolLM2-135M: 8192); llama.cpp runs it
# past its training context. 32k on SmolLM2 needs a copy of the file with a larger
# llama.context_length.
set -euo pipefail
BIN=${1:?usage: long_context.sh TRANSFORMER FILE.gguf}
FILE=${2:?usage: long_context.sh TRANSFORMER FILE.gguf}
: "${LLAMA_BENCH:?set LLAMA_BENCH to a llama-bench binary}"
ROUNDS=${ROUNDS:-3}
DEPTHS=${DEPTHS:-1024 8192}
THREADS=${THREADS:-1 2}
NEW=${NEW:-32}
CACHE=${CACHE:-f32}
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
load() { cut -d' ' -f1 /proc/loadavg; }
for round in $(seq 1 "$ROUNDS"); do
  for depth in $DEPTHS; do
    for t in $THREADS; do
      if json=$("$BIN" bench --generate "$FILE" --threads "$t" --prompt-tokens "$depth" \
          --new-tokens "$NEW" --precision ggml --steps 1 --warmup-steps 0 \
          --cache-type-k "$CACHE" --cache-type-v "$CACHE" --json 2>/dev/null); then
        python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print(json.dumps({"round": int(sys.argv[2]), "depth": int(sys.argv[3]), "threads": int(sys.argv[4]), "impl": "ours", "decode": j["decode_tps"][0], "kv_bytes_per_token": j["kv_bytes_per_token"], "peak_rss_mib": j["peak_rss_mib"], "load": float(sys.argv[5])}))' \
          "$json" "$round" "$depth" "$t" "$(load)" | tee -a "$OUT"
      else
        echo "# ours refused depth $depth (beyond the file's context?)" >&2
      fi
      "$LLAMA_BENCH" -m "$FILE" -t "$t" -p 0 -n "$NEW" -d "$depth" -fa 1 -ctk "$CACHE" -ctv "$CACHE" \
          -r 1 -o json 2>/dev/null \
        | python3 -c 'import json,sys; r=json.load(sys.stdin)[0]; print(json.dumps({"round": int(sys.argv[1]), "depth": int(sys.argv[2]), "threads": int(sys.argv[3]), "impl": "llama.cpp", "decode": r["avg_ts"], "load": float(sys.argv[4])}))' \
          "$round" "$depth" "$t" "$(load)" | tee -a "$OUT"
    done
  done
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = list(dict.fromkeys((r["depth"], r["threads"]) for r in rows))
print("\n| depth | threads | ours decode tok/s | llama.cpp decode tok/s | ratio | ours KV bytes/token | load |")
print("|---|---|---|---|---|---|---|")
for d, t in keys:
    med = lambda impl: statistics.median([r["decode"] for r in rows if (r["depth"], r["threads"], r["impl"]) == (d, t, impl)] or [float("nan")])
    kv = next((r["kv_bytes_per_token"] for r in rows if r["impl"] == "ours" and (r["depth"], r["threads"]) == (d, t)), float("nan"))
    loads = [r["load"] for r in rows if (r["depth"], r["threads"]) == (d, t)]
    print(f"| {d} | {t} | {med('ours'):.1f} | {med('llama.cpp'):.1f} | {med('ours') / med('llama.cpp'):.2f} | {kv:.0f} | {min(loads):.1f}-{max(loads):.1f} |")
PY
