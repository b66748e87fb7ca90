#!/usr/bin/env bash
# Head pruning of the README's De-En translation model (Michel et al. 2019; issue 28): BLEU on
# ding.test (sacreBLEU-exact, beam 4, alpha 0.6, all 1,000 sentences) against heads removed over
# all three attention kinds at once (encoder self, decoder self, cross: 3 layers x 4 heads each,
# 36 heads; at least one head stays in each of the 9 attentions, so at most 27 can go), least
# important first (importance on the first 256 pairs of ding.valid.tsv) or in a random order
# (3 seeds), each without and with a short fine-tune on ding.train.tsv; then decode tokens/s of
# the importance-pruned models (`bench --translate`, one thread, 32 sentences a batch).
# Writes results.tsv, speed.tsv and the logs into $OUT (default /tmp/deen_pruning).
# Usage: MODEL=runs/deen-avg benches/pruning/deen.sh [path/to/transformer]   (a release build)
set -euo pipefail
BIN=${1:-target/release/transformer}
MODEL=${MODEL:?set MODEL to the averaged De-En model directory}
OUT=${OUT:-/tmp/deen_pruning}
D=${DATA:-../shared/data/de-en}
LEVELS=${LEVELS:-"0 4 9 18 27"}
SEEDS=${SEEDS:-"1 2 3"}
FT_STEPS=${FT_STEPS:-200}
FT_LR=${FT_LR:-1e-4}
THREADS=${THREADS:-2}
mkdir -p "$OUT"
head -n 256 "$D/ding.valid.tsv" > "$OUT/importance.tsv"
cut -f1 "$D/ding.test.tsv" > "$OUT/src.txt"
cut -f2 "$D/ding.test.tsv" > "$OUT/ref.txt"
RES=$OUT/results.tsv
[ -f "$RES" ] || echo -e "removed\torder\tseed\tfine_tune_steps\tbleu\tper_layer" > "$RES"
bleu() { # model dir -> BLEU
  "$BIN" translate --model "$1" --beam 4 --alpha 0.6 --threads "$THREADS" < "$OUT/src.txt" \
    > "$1.hyp" 2>>"$OUT/log.txt"
  "$BIN" bleu --ref "$OUT/ref.txt" "$1.hyp" | tee -a "$OUT/log.txt" | sed -E 's/^BLEU = ([0-9.]+).*/\1/'
}
run() { # removed order seed steps
  local dir=$OUT/p-$1-$2-$3-$4 args=(--heads "$1" --threads "$THREADS" --batch 32)
  rm -rf "$dir"
  if [ "$2" = importance ]; then
    args+=(--by importance --data "$OUT/importance.tsv" --batches 8)
  else
    args+=(--by random --seed "$3")
  fi
  if [ "$4" -gt 0 ]; then
    args+=(--fine-tune-steps "$4" --fine-tune-data "$D/ding.train.tsv" --lr "$FT_LR")
  fi
  "$BIN" prune --model "$MODEL" --out "$dir" "${args[@]}" 2>&1 | tee -a "$OUT/log.txt" \
    | grep -E "^removed|^fine-tuned" | tr '\n' ' ' > "$dir.summary"
  local per_layer; per_layer=$(grep -o "per layer: .*; wrote" "$dir.summary" | sed 's/per layer: //; s/; wrote$//')
  echo -e "$1\t$2\t$3\t$4\t$(bleu "$dir")\t$per_layer" | tee -a "$RES"
}
for n in $LEVELS; do
  for steps in 0 "$FT_STEPS"; do
    # Nothing removed, fine-tuned: the control (what the fine-tune alone gains).
    run "$n" importance 1 "$steps"
    [ "$n" = 0 ] && continue
    for s in $SEEDS; do run "$n" random "$s" "$steps"; done
  done
done
# Decode speed of the importance-pruned models (no fine-tune), one thread.
SPEED=$OUT/speed.tsv
echo -e "removed\tgreedy_tokens_per_s\tbeam4_tokens_per_s" > "$SPEED"
for n in $LEVELS; do
  out=$("$BIN" bench --translate "$OUT/p-$n-importance-1-0" --src "$OUT/src.txt" --threads 1 \
    --sentences-per-batch 32 --beam 4 2>&1 | tee -a "$OUT/log.txt")
  g=$(grep -E "^greedy:" <<<"$out" | grep -oE "[0-9.]+ target tokens/s" | head -1 | cut -d' ' -f1)
  b=$(grep -E "^beam 4:" <<<"$out" | grep -oE "[0-9.]+ target tokens/s" | head -1 | cut -d' ' -f1)
  echo -e "$n\t$g\t$b" | tee -a "$SPEED"
done
