#!/usr/bin/env bash
# Peak resident memory of one decoder-only training step (forward, backward, Adam) at sequence
# lengths 512 .. 8192 with the tokens per batch held fixed (batch = TOKENS / length), one
# process per length so each peak is its own. Attention runs tiled (FlashAttention) from 128
# keys on, so no [length x length] matrix is kept and memory should stay flat in the length.
#
#   bash benches/memory.sh            # PRESET=tiny TOKENS=8192 THREADS=2 VOCAB=1000
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PRESET=${PRESET:-tiny}
TOKENS=${TOKENS:-8192}
THREADS=${THREADS:-2}
VOCAB=${VOCAB:-1000}
LENGTHS=${LENGTHS:-"512 1024 2048 4096 8192"}
cargo build --release --quiet
printf '| sequence length | batch | step (s) | tokens/s | peak RSS (MiB) |\n|---|---|---|---|---|\n'
for L in $LENGTHS; do
    out=$(target/release/transformer bench --lm --preset "$PRESET" --seq-len "$L" --tokens "$TOKENS" \
        --vocab "$VOCAB" --threads "$THREADS" --warmup-steps 1 --steps 2 2>/dev/null)
    step=$(awk '/^step:/ { print $2 }' <<<"$out")
    tps=$(awk '/^train-lm:/ { print $2 }' <<<"$out")
    rss=$(awk '/^peak resident memory:/ { print $4 }' <<<"$out")
    printf '| %s | %s | %s | %s | %s |\n' "$L" "$((TOKENS / L))" "$step" "$tps" "$rss"
done
