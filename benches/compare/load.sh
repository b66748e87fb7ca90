#!/usr/bin/env bash
# Load-and-one-token time and peak resident memory: `transformer generate --precision ggml
# --max-tokens 1` against llama.cpp's `llama-cli -n 1` (or `llama-simple`) on the same GGUF files
# and threads (or `llama-bench -p 2 -n 1 -r 1 --no-warmup`: load, a 2-token prompt, one
# token; the chat `llama-cli` of recent llama.cpp starts a server and fits the model twice),
# interleaved: each round runs, file by file, ours under every way of holding the
# file in MEMORIES (TRANSFORMER_GGUF_MEMORY), then llama.cpp. Wall time and peak RSS come from
# GNU time (`/usr/bin/time -f '%e %M'`); prints one JSON line per run, then the medians.
#
#   LLAMA_CLI=/path/llama-bench ROUNDS=5 THREADS=2 \
#       bash benches/compare/load.sh target/release/transformer FILE.gguf [FILE.gguf ...]
#
# MEMORIES (default "map hugepages"). COLD=1 evicts each file from the page cache before every
# run (`posix_fadvise(POSIX_FADV_DONTNEED)` on that file only, through python3; the cache of other
# files is left alone); without it the cache is warm: every file is read once before round 1.
# LLAMA_CLI may be left unset (ours only). The prompt is "hi"; both stop after one new token.
# CTX (default 4096): llama.cpp's context (`-c`); its default, the model's whole context (128k
# for Llama 3.2), allocates a 4 GiB KV cache at load. Ours sizes its cache to the prompt and
# the tokens asked for.
set -euo pipefail
BIN=${1:?usage: load.sh TRANSFORMER FILE.gguf [FILE.gguf ...]}
shift
[ $# -gt 0 ] || { echo "error: no GGUF file given" >&2; exit 2; }
ROUNDS=${ROUNDS:-5}
THREADS=${THREADS:-2}
MEMORIES=${MEMORIES:-map hugepages}
COLD=${COLD:-0}
LLAMA_CLI=${LLAMA_CLI:-}
CTX=${CTX:-4096}
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT

evict() {
  python3 -c 'import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$1"
}

# One run of the command: prints "seconds peak_kib cpu_seconds" (wall, peak RSS, user + system).
timed() {
  local t
  t=$(mktemp)
  /usr/bin/time -f '%e %M %U %S' -o "$t" "$@" >/dev/null 2>&1 || { echo "# failed: $*" >&2; rm -f "$t"; return 1; }
  awk 'END { printf "%s %s %.2f\n", $1, $2, $3 + $4 }' "$t"
  rm -f "$t"
}

record() { # round file impl "seconds kib cpu_seconds"
  python3 -c 'import json,sys; s,k,c=sys.argv[4].split(); print(json.dumps({"round": int(sys.argv[1]), "file": sys.argv[2], "impl": sys.argv[3], "seconds": float(s), "cpu_seconds": float(c), "peak_mib": round(int(k)/1024,1), "cold": sys.argv[5]=="1", "load": float(open("/proc/loadavg").read().split()[0])}))' \
    "$1" "$2" "$3" "$4" "$COLD" | tee -a "$OUT"
}

if [ "$COLD" != 1 ]; then
  for file in "$@"; do cat "$file" >/dev/null; done
fi
for round in $(seq 1 "$ROUNDS"); do
  for file in "$@"; do
    name=$(basename "$file")
    for memory in $MEMORIES; do
      [ "$COLD" = 1 ] && evict "$file"
      r=$(TRANSFORMER_GGUF_MEMORY=$memory timed "$BIN" generate --model "$file" --prompt hi \
        --max-tokens 1 --temperature 0 --precision ggml --threads "$THREADS") || continue
      record "$round" "$name" "ours $memory" "$r"
    done
    if [ -n "$LLAMA_CLI" ]; then
      [ "$COLD" = 1 ] && evict "$file"
      case "$(basename "$LLAMA_CLI")" in
        # One prompt token batch of 2 and one generated token, no warm-up, one repetition.
        llama-bench) r=$(timed "$LLAMA_CLI" -m "$file" -p 2 -n 1 -r 1 --no-warmup -t "$THREADS") \
             || continue ;;
        llama-simple) r=$(timed "$LLAMA_CLI" -m "$file" -n 1 -c "$CTX" hi) || continue ;;
        # The chat CLI: one turn (`-st`), the prompt through the chat template, its warm-up run.
        *) r=$(timed "$LLAMA_CLI" -m "$file" -n 1 -p hi -st -c "$CTX" -t "$THREADS" --temp 0 \
             </dev/null) || continue ;;
      esac
      record "$round" "$name" "llama.cpp" "$r"
    fi
  done
done

python3 - "$OUT" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
groups = {}
for r in rows:
    groups.setdefault((r["file"], r["impl"]), []).append(r)
print(f"| file | impl | runs | load-and-one-token s (median) | CPU s, user + system (median) | peak RSS MiB (median) | loadavg |")
print("|---|---|---:|---:|---:|---:|---|")
for (f, impl), rs in groups.items():
    loads = [r["load"] for r in rs]
    print(f"| {f} | {impl} | {len(rs)} | {statistics.median(r['seconds'] for r in rs):.2f} | "
          f"{statistics.median(r['cpu_seconds'] for r in rs):.2f} | "
          f"{statistics.median(r['peak_mib'] for r in rs):.0f} | {min(loads):.1f}–{max(loads):.1f} |")
EOF
