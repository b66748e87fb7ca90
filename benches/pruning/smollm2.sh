#!/usr/bin/env bash
# Head pruning of SmolLM2-135M-Instruct (Michel et al. 2019; issue 28): perplexity on a fixed
# prefix of the held-out last 5% of shakespeare.en.txt against query heads removed (whole
# key/value groups of 3), least important first (importance on text from the first 95%) or in a
# random order (3 seeds), some levels with a short fine-tune; decode tokens/s of some pruned
# models. Writes results.tsv and the logs into $OUT (default /tmp/pruning_meas).
# Usage: benches/pruning/smollm2.sh [path/to/transformer]   (a release build)
set -euo pipefail
BIN=${1:-target/release/transformer}
OUT=${OUT:-/tmp/pruning_meas}
GGUF=../shared/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf
TEXT=../shared/data/en/shakespeare.en.txt
mkdir -p "$OUT"
# The split: the first line break at or after 95% of the bytes. Held out: its first 16,000
# bytes (to the next line break); importance and fine-tune text: 200,000 bytes from byte
# 1,000,000 of the first 95% (to line breaks).
python3 - "$TEXT" "$OUT" <<'PY'
import sys
b = open(sys.argv[1], 'rb').read(); out = sys.argv[2]
cut = b.index(b'\n', int(len(b) * 0.95)) + 1
held = b[cut:]; held = held[:held.index(b'\n', 16000) + 1]
s = b.index(b'\n', 1000000) + 1; t = b[s:b.index(b'\n', s + 200000) + 1]
assert s + len(t) <= cut
open(f'{out}/heldout.txt', 'wb').write(held); open(f'{out}/train_slice.txt', 'wb').write(t)
PY
RES=$OUT/results.tsv
[ -f "$RES" ] || echo -e "removed\torder\tseed\tfine_tune_steps\tperplexity\tprune_s\tppl_s" > "$RES"
IMP="--data $OUT/train_slice.txt --batches 8 --batch 4 --context 128"
ppl() { # model dir -> perplexity
  "$BIN" perplexity --model "$1" --context 256 --batch 4 < "$OUT/heldout.txt" 2>>"$OUT/log.txt" \
    | tee -a "$OUT/log.txt" | sed -E 's/.*perplexity ([0-9.]+).*/\1/'
}
row() { # removed order seed steps dir prune_seconds
  local t0=$(date +%s.%N) p; p=$(ppl "$5"); local t1=$(date +%s.%N)
  echo -e "$1\t$2\t$3\t$4\t$p\t$6\t$(echo "$t1 - $t0" | bc)" | tee -a "$RES"
}
prune() { # out args...
  local out=$1; shift; local t0=$(date +%s.%N)
  "$BIN" prune --model "$GGUF" --out "$out" "$@" 2>>"$OUT/log.txt"
  echo "$(date +%s.%N) - $t0" | bc
}
uptime | tee -a "$OUT/log.txt"
for n in ${LEVELS:-0 27 66 135 162 180}; do
  s=$(prune "$OUT/imp-$n" --heads "$n" --by importance $IMP)
  row "$n" importance - 0 "$OUT/imp-$n" "$s"
  [ "$n" = 0 ] && continue
  for seed in 1 2 3; do
    s=$(prune "$OUT/rnd-$n-$seed" --heads "$n" --by random --seed "$seed")
    row "$n" random "$seed" 0 "$OUT/rnd-$n-$seed" "$s"
    rm -r "$OUT/rnd-$n-$seed"
  done
done
for n in ${FT_LEVELS:-135 180}; do
  s=$(prune "$OUT/ft-$n" --heads "$n" --by importance $IMP --fine-tune-steps ${FT_STEPS:-40} --lr ${FT_LR:-1e-4})
  row "$n" importance - ${FT_STEPS:-40} "$OUT/ft-$n" "$s"
done
uptime | tee -a "$OUT/log.txt"
for n in ${BENCH_LEVELS:-0 135 180}; do
  "$BIN" bench --generate "$OUT/imp-$n" --prompt-tokens 128 --new-tokens 64 --steps 3 --threads 2 \
    2>&1 | tee -a "$OUT/bench-$n.txt"
done
uptime | tee -a "$OUT/log.txt"
