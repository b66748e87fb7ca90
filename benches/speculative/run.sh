#!/usr/bin/env bash
# Speculative decoding against plain decoding on SmolLM2-135M-Instruct (../shared), greedy, on
# the code-editing / summarising prompts of prompts.json (through the chat template):
#   plain   the model alone (--precision f32: the GGUF dequantised to float32)
#   lookup  prompt lookup (--lookup, n-grams of 3..1, --draft-max 8, adaptive)
#   draft   the same file multiplied in its Q4_1 blocks (--precision ggml) drafting
#           (--draft, --draft-max 8, adaptive): the only second model with this tokenizer here.
# Rounds are interleaved (every mode on every prompt, then the next round); each run is one
# process whose JSON reports decode seconds (first token to last) and the draft counts; the
# table gives medians over rounds of decode tokens/s per prompt and mode, and the acceptance.
# Greedy output is asserted identical across the modes.
#
# Usage: benches/speculative/run.sh [BIN] [ROUNDS] [THREADS] [MAX_TOKENS]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
BIN="${1:-$root/target/release/transformer}"
ROUNDS="${2:-3}"
THREADS="${3:-1}"
MAX_TOKENS="${4:-160}"
SMOL="$root/../shared/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$SMOL" ] || { echo "skipped: $SMOL is absent" >&2; exit 0; }
echo "load before: $(cat /proc/loadavg)" >&2
python3 - "$BIN" "$ROUNDS" "$THREADS" "$MAX_TOKENS" "$SMOL" "$here/prompts.json" <<'PY'
import json, statistics, subprocess, sys
bin_, rounds, threads, max_tokens, smol, prompts_path = sys.argv[1:]
prompts = json.load(open(prompts_path))
modes = {
    "plain": [],
    "lookup": ["--lookup"],
    "draft": ["--draft", smol, "--draft-precision", "ggml"],
}
rates = {}   # (prompt, mode) -> [tok/s]
counts = {}  # (prompt, mode) -> (drafted, accepted)
ids = {}
for r in range(int(rounds)):
    for p in prompts:
        for mode, extra in modes.items():
            cmd = [bin_, "generate", "--model", smol, "--chat", "--prompt", p["text"],
                   "--temperature", "0", "--max-tokens", max_tokens, "--format", "json",
                   "--threads", threads] + extra
            out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            n = len(out["new_ids"])
            rate = (n - 1) / out["decode_seconds"] if n > 1 else float("nan")
            rates.setdefault((p["name"], mode), []).append(rate)
            s = out.get("speculative", {})
            counts[(p["name"], mode)] = (s.get("drafted", 0), s.get("accepted", 0), n)
            key = p["name"]
            if key in ids and ids[key] != out["new_ids"]:
                sys.exit(f"{mode} on {key}: output differs from plain decoding")
            ids[key] = out["new_ids"]
print(f"| prompt | kind | tokens | plain tok/s | lookup tok/s (x) | lookup accepted/drafted | draft tok/s (x) | draft accepted/drafted |")
print("|---|---|---|---|---|---|---|---|")
speed = {"lookup": [], "draft": []}
for p in prompts:
    med = {m: statistics.median(rates[(p["name"], m)]) for m in modes}
    row = [p["name"], p["kind"], str(counts[(p["name"], "plain")][2]), f"{med['plain']:.1f}"]
    for m in ("lookup", "draft"):
        d, a, _ = counts[(p["name"], m)]
        speed[m].append(med[m] / med["plain"])
        row += [f"{med[m]:.1f} ({med[m] / med['plain']:.2f}x)", f"{a}/{d} ({100 * a / max(d, 1):.0f}%)"]
    print("| " + " | ".join(row) + " |")
for m in ("lookup", "draft"):
    print(f"{m}: median speed-up over the prompts {statistics.median(speed[m]):.2f}x")
PY
echo "load after: $(cat /proc/loadavg)" >&2
