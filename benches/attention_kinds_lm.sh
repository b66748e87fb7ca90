#!/usr/bin/env bash
# Bits per character of a small byte-level Shakespeare language model for each attention kind
# at the same budget: train-lm on ../shared/data/en/shakespeare.en.txt, the last 5% held out
# (validation over all of it at the end), vocabulary 257 (bytes), context 128, batch 8,
# 2 pre-LN rotary layers of d_model 64 (4 heads, d_ff 256), no dropout, STEPS updates.
#
#   bash benches/attention_kinds_lm.sh    # STEPS=300 KINDS="exact window:16 ..." OUT=/tmp/lm-kinds SEED=1
#
# BUDGET=readme trains the README's 28-minute model instead (byte-level BPE of 4096, context 128,
# batch 16, 4 pre-LN rotary layers of d_model 256, 4 heads, d_ff 1024, GELU, dropout 0.1, lr 1e-3
# with 200 warm-up steps, 2600 updates, THREADS threads; no time limit, so every kind sees the same
# 2600 updates whatever the load).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
STEPS=${STEPS:-300}
KINDS=${KINDS:-"exact window:16 window:64 sparse:8:16 global:16:4 linear"}
OUT=${OUT:-/tmp/lm-kinds}
TEXT=${TEXT:-../shared/data/en/shakespeare.en.txt}
BUDGET=${BUDGET:-small}
THREADS=${THREADS:-2}
case "$BUDGET" in
small) model=(--vocab-size 257 --context 128 --batch 8 --d-model 64 --n-heads 4 --d-ff 256 --layers 2
    --dropout 0 --pre-ln --positions rotary --warmup 30 --lr 2e-3 --eval-every 0) ;;
readme) STEPS=${STEPS_README:-2600}
    model=(--vocab-size 4096 --context 128 --batch 16 --d-model 256 --n-heads 4 --d-ff 1024 --layers 4
        --dropout 0.1 --pre-ln --activation gelu-erf --positions rotary --lr 1e-3 --warmup 200
        --eval-every 500 --threads "$THREADS") ;;
*) echo "BUDGET must be small or readme, not '$BUDGET'" >&2; exit 2 ;;
esac
bin=${BIN:-target/release/transformer}
[ -x "$bin" ] || cargo build --release --quiet
printf '| attention | steps | train time (s) | valid nats/token | bits/char |\n|---|---|---|---|---|\n'
for K in $KINDS; do
    dir="$OUT/${K//:/-}"
    rm -rf "$dir"
    start=$(date +%s.%N)
    log=$("$bin" train-lm --text "$TEXT" --out "$dir" "${model[@]}" \
        --max-steps "$STEPS" --log-every 0 --seed "${SEED:-1}" --attention "$K" 2>&1)
    end=$(date +%s.%N)
    line=$(grep -E 'valid loss .* bits/char' <<<"$log" | tail -1)
    nats=$(sed -E 's/.*valid loss ([0-9.]+) nats.*/\1/' <<<"$line")
    bpc=$(sed -E 's/.* ([0-9.]+) bits\/char.*/\1/' <<<"$line")
    printf '| %s | %s | %.0f | %s | %s |\n' "$K" "$STEPS" "$(echo "$end - $start" | bc)" "$nats" "$bpc"
done
