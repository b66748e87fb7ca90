#!/usr/bin/env bash
# De-En BLEU of the README's translation recipe for each attention kind at the same budget:
# configs/deen.json with every encoder and decoder self-attention layer set to KIND
# (`encoder_layer_attention` / `layer_attention`; cross-attention stays exact), trained on
# ../shared/data/de-en/ding.train.tsv with the README's flags for STEPS updates (the last
# quarter a linear cool-down; linear attention without attention dropout, which it has no
# weights for), the last 5 checkpoints averaged, ding.test translated with
# beam 4 (α 0.6) and scored by `transformer bleu`. One TSV row per kind on stdout.
#
#   bash benches/attention_kinds_deen.sh   # STEPS=4800 KINDS="exact window:4 ..." OUT=/tmp/deen-kinds
#   ATTENTION_DROPOUT=0 KINDS=exact ...    # the control for linear attention (no attention dropout)
#   SEED=2 ...                             # another seed (initialisation, batch order, dropout)
#
# ding's sentences are short (source median 7 words, 99% at most 18), so windows of 16 or more
# are exact attention on nearly every sentence: the default windows are 4 and 8.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
STEPS=${STEPS:-4800}
KINDS=${KINDS:-"exact window:4 window:8 sparse:2:4 linear"}
OUT=${OUT:-/tmp/deen-kinds}
THREADS=${THREADS:-2}
SEED=${SEED:-1}
D=${DATA:-../shared/data/de-en}
bin=${BIN:-$(pwd)/target/release/transformer}
[ -x "$bin" ] || cargo build --release --quiet
mkdir -p "$OUT"

# "window:4" → {"kind":"window","window":4}, and so on (the forms of `train-lm --attention`).
kind_json() {
    IFS=: read -r name a b <<<"$1"
    case "$name" in
        exact | linear) printf '{"kind":"%s"}' "$name" ;;
        window) printf '{"kind":"window","window":%s}' "$a" ;;
        sparse) printf '{"kind":"sparse","local":%s,"stride":%s}' "$a" "$b" ;;
        global) printf '{"kind":"global","local":%s,"global_tokens":%s}' "$a" "$b" ;;
        *) echo "unknown attention kind $1" >&2; exit 1 ;;
    esac
}

cooldown=$((STEPS / 4))
save_every=$((STEPS / 20))
printf 'attention\tsteps\ttrain_s\tvalid_nll\ttest_bleu\n'
for K in $KINDS; do
    dir="$OUT/${K//:/-}"
    rm -rf "$dir"
    mkdir -p "$dir"
    k=$(kind_json "$K")
    python3 - "$k" >"$dir/config.json" <<'EOF'
import json, sys
c = json.load(open("configs/deen.json"))
kind = json.loads(sys.argv[1])
c["encoder_layer_attention"] = [kind] * c["n_encoder_layers"]
c["layer_attention"] = [kind] * c["n_decoder_layers"]
print(json.dumps(c))
EOF
    # Linear attention has no attention weights to drop (the config refuses a dropout there);
    # ATTENTION_DROPOUT=0 gives the other kinds the same (exact attention's control for it).
    attn_dropout=${ATTENTION_DROPOUT:-0.1}
    [ "$K" = linear ] && attn_dropout=0
    start=$(date +%s.%N)
    "$bin" train --train "$D/ding.train.tsv" --valid "$D/ding.valid.tsv" --config "$dir/config.json" \
        --vocab-level bpe --vocab-size 2000 --tokens-per-batch 2000 --warmup 400 --lr-factor 0.5 \
        --dropout 0.2 --attention-dropout "$attn_dropout" --activation-dropout 0.1 --word-dropout 0.1 \
        --max-steps "$STEPS" --cooldown "$cooldown" --save-every "$save_every" --keep-last 5 \
        --valid-every "$STEPS" --valid-bleu-lines 0 --threads "$THREADS" --seed "$SEED" \
        --out "$dir/run" >"$dir/train.log" 2>&1
    end=$(date +%s.%N)
    "$bin" average --out "$dir/avg" $(ls -d "$dir"/run/checkpoints/step-* | tail -5) >/dev/null 2>&1
    cut -f1 "$D/ding.test.tsv" | "$bin" translate --model "$dir/avg" --beam 4 --alpha 0.6 >"$dir/hyp.txt"
    cut -f2 "$D/ding.test.tsv" >"$dir/ref.txt"
    bleu=$("$bin" bleu --ref "$dir/ref.txt" "$dir/hyp.txt" | grep -oE 'BLEU = [0-9.]+' | cut -d' ' -f3)
    nll=$(grep '"valid_nll"' "$dir/run/metrics.jsonl" | tail -1 | grep -oE '"valid_nll":[0-9.]+' | cut -d: -f2)
    printf '%s\t%s\t%.0f\t%s\t%s\n' "$K" "$STEPS" "$(echo "$end - $start" | bc)" "$nll" "$bleu"
done
