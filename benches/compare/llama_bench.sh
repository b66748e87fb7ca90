#!/usr/bin/env bash
# Prompt and single-stream decode tokens/s of `transformer bench --generate --precision ggml`
# against llama.cpp's `llama-bench` on the same GGUF files and threads, interleaved: each round
# runs, file by file, ours under every kernel in KERNELS, then each llama-bench in LLAMA_BENCH.
# Prints one JSON line per measurement, then a table of the medians over the rounds.
#
#   LLAMA_BENCH="/path/llama-bench [/path/avx2/llama-bench]" ROUNDS=3 THREADS=1 \
#       bash benches/compare/llama_bench.sh target/release/transformer FILE.gguf [FILE.gguf ...]
#
# KERNELS (default "avx512 avx2"): our kernel paths (`--kernel`); a path the CPU lacks is
# skipped. PROMPT / NEW (default 128 / 64): llama-bench's -p / -n and our --prompt-tokens /
# --new-tokens. llama.cpp's columns are named after the folder its llama-bench lives in.
# Ours decodes after its prompt, so llama.cpp's decode is its `tg NEW @ d PROMPT` (`-d`); its
# decode from an empty cache (plain `tg NEW`) is kept in the JSON lines as decode_empty_cache.
#
# Bandwidth: each file's decode also as the weight bytes it reads per token (every tensor, less
# an untied token embedding, which is only gathered: `gguf_bytes.py`) x decode tokens/s, in
# GB/s, and as a share of the machine's read bandwidth, measured by `TRANSFORMER bench
# --bandwidth --threads THREADS` before the first round and after the last (the median of the
# two; BANDWIDTH=0 skips it).
set -euo pipefail
BIN=${1:?usage: llama_bench.sh TRANSFORMER FILE.gguf [FILE.gguf ...]}
shift
[ $# -gt 0 ] || { echo "error: no GGUF file given" >&2; exit 2; }
: "${LLAMA_BENCH:?set LLAMA_BENCH to one or more llama-bench binaries}"
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-1}
KERNELS=${KERNELS:-avx512 avx2}
PROMPT=${PROMPT:-128}
NEW=${NEW:-64}
BANDWIDTH=${BANDWIDTH:-1}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT

bandwidth() {
  [ "$BANDWIDTH" = 0 ] && return 0
  if json=$("$BIN" bench --bandwidth --threads "$THREADS" --json 2>/dev/null); then
    echo "{\"bandwidth\": $json}" | tee -a "$OUT"
  else
    echo "# $BIN has no bench --bandwidth: no bandwidth figure" >&2
  fi
}
for file in "$@"; do
  python3 "$HERE/gguf_bytes.py" "$file" | python3 -c 'import json,sys; print(json.dumps({"weights": json.load(sys.stdin)}))' | tee -a "$OUT"
done
bandwidth

for round in $(seq 1 "$ROUNDS"); do
  for file in "$@"; do
    name=$(basename "$file")
    for kernel in $KERNELS; do
      if ! json=$("$BIN" bench --generate "$file" --threads "$THREADS" --prompt-tokens "$PROMPT" \
          --new-tokens "$NEW" --precision ggml --kernel "$kernel" --steps 1 --warmup-steps 1 \
          --json 2>/dev/null); then
        echo "# ours $kernel skipped on $name (not on this CPU, or it failed)" >&2
        continue
      fi
      python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print(json.dumps({"round": int(sys.argv[2]), "file": sys.argv[3], "impl": "ours " + sys.argv[4], "prompt": j["prefill_tps"][0], "decode": j["decode_tps"][0], "load": float(open("/proc/loadavg").read().split()[0])}))' \
        "$json" "$round" "$name" "$kernel" | tee -a "$OUT"
    done
    for lb in $LLAMA_BENCH; do
      label="llama.cpp $(basename "$(dirname "$(dirname "$lb")")")"
      # Decode at depth PROMPT (`-d`: after a prompt's worth of cache, as ours decodes after
      # its prompt) and, for reference, from an empty cache (llama-bench's plain tg).
      "$lb" -m "$file" -t "$THREADS" -p "$PROMPT" -n "$NEW" -d "0,$PROMPT" -r 1 -o json 2>/dev/null \
        | python3 -c 'import json,sys; rows=json.load(sys.stdin); r={("prompt" if x["n_prompt"] else "decode", x["n_depth"]): x["avg_ts"] for x in rows}; d=int(sys.argv[4]); print(json.dumps({"round": int(sys.argv[1]), "file": sys.argv[2], "impl": sys.argv[3], "prompt": r[("prompt", 0)], "decode": r[("decode", d)], "decode_empty_cache": r[("decode", 0)], "load": float(open("/proc/loadavg").read().split()[0])}))' \
          "$round" "$name" "$label" "$PROMPT" | tee -a "$OUT"
    done
  done
done

bandwidth

python3 - "$OUT" "$THREADS" <<'EOF'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
rows = [r for r in lines if "impl" in r]
weights = {r["weights"]["file"]: r["weights"] for r in lines if "weights" in r}
machine = [r["bandwidth"]["bandwidth_gbs"] for r in lines if "bandwidth" in r]
bw = statistics.median(machine) if machine else None
files = list(dict.fromkeys(r["file"] for r in rows))
impls = list(dict.fromkeys(r["impl"] for r in rows))
peer = next((i for i in impls if i.startswith("llama.cpp")), None)
print("\n| file | threads | implementation | prompt tokens/s | decode tokens/s | prompt ratio | decode ratio | weights read a token (MB) | decode GB/s | % of bandwidth |")
print("|---|---|---|---|---|---|---|---|---|---|")
for f in files:
    med = {}
    for i in impls:
        sel = [r for r in rows if r["file"] == f and r["impl"] == i]
        if sel:
            med[i] = (statistics.median(r["prompt"] for r in sel), statistics.median(r["decode"] for r in sel))
    for i, (p, d) in med.items():
        rp = f"{p / med[peer][0]:.2f}" if peer in med else "-"
        rd = f"{d / med[peer][1]:.2f}" if peer in med else "-"
        w = weights.get(f, {}).get("read_per_token")
        gbs = w * d / 1e9 if w else None
        share = f"{100 * gbs / bw:.0f}%" if gbs and bw else "-"
        mb = f"{w / 1e6:,.0f}" if w else "-"
        rate = f"{gbs:.1f}" if gbs else "-"
        print(f"| {f} | {sys.argv[2]} | {i} | {p:.1f} | {d:.1f} | {rp} | {rd} | {mb} | {rate} | {share} |")
loads = [r["load"] for r in rows]
print(f"\nrounds: {max(r['round'] for r in rows)}; load average 1 min: {min(loads):.2f}-{max(loads):.2f}; ratios against {peer}")
if machine:
    print(f"read bandwidth (bench --bandwidth, {sys.argv[2]} thread(s), before and after): "
          + ", ".join(f"{x:.1f}" for x in machine) + f" GB/s; median {bw:.1f}")
EOF
