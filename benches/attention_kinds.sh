#!/usr/bin/env bash
# Attention beyond O(N²), measured: one causal self-attention layer (d_model 256, 4 heads of
# 64, f32, batch 1, random rows) of each kind at each length, one process per measurement so
# each peak RSS (VmHWM) is its own:
#   train:  one forward + backward over the N positions (exact: tiled FlashAttention kernel);
#   decode: N positions fed one at a time through the layer's cache.
#
#   bash benches/attention_kinds.sh      # KINDS="exact window:64 ..." LENGTHS="512 2048 8192"
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
KINDS=${KINDS:-"exact window:64 window:256 sparse:64:64 global:64:4 linear"}
LENGTHS=${LENGTHS:-"512 2048 8192"}
bin=target/release/examples/attention_kinds
[ -x "$bin" ] || cargo build --release --quiet --example attention_kinds
printf '| kind | N | train fwd+bwd (s) | train tokens/s | train peak RSS (MiB) | decode (s) | decode tokens/s | decode peak RSS (MiB) |\n'
printf '|---|---|---|---|---|---|---|---|\n'
for N in $LENGTHS; do
    for K in $KINDS; do
        read -r label _ _ ts ttps trss < <("$bin" "$K" "$N" train)
        read -r _ _ _ ds dtps drss < <("$bin" "$K" "$N" decode)
        printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$label" "$N" "$ts" "$ttps" "$trss" "$ds" "$dtps" "$drss"
    done
done
