#!/bin/sh
# BERT trained here: masked-LM pre-training of a small encoder on the English side of
# ding.train.tsv under a time limit, its held-out masked-token accuracy, and a retrieval check
# (make_queries.py, retrieval.py) of its embeddings beside all-MiniLM-L6-v2's and an untrained
# encoder's. Usage: benches/bert_mlm/run.sh [BINARY] [WORKDIR] [SECONDS]
set -eu
BIN=${1:-target/release/transformer}
W=${2:-/tmp/bert_mlm}
SECONDS_BUDGET=${3:-240}
SHARED=${SHARED:-../shared}
HERE=$(dirname "$0")
mkdir -p "$W"
cut -f2 "$SHARED/data/de-en/ding.train.tsv" > "$W/ding.en.txt"
SIZE="--vocab-size 4000 --context 64 --batch 32 --d-model 128 --n-heads 4 --d-ff 512 --layers 2"
echo "load before: $(uptime)"
# shellcheck disable=SC2086
nice -n 5 "$BIN" train-mlm --text "$W/ding.en.txt" --out "$W/model" $SIZE --lr 1e-3 \
    --warmup 100 --max-steps 3000 --time-limit "$SECONDS_BUDGET" --eval-every 250 \
    --log-every 50 --threads 2 --overwrite
echo "load after: $(uptime)"
# The same shape after one update at a negligible rate: what the check gives untrained.
# shellcheck disable=SC2086
nice -n 5 "$BIN" train-mlm --text "$W/ding.en.txt" --out "$W/untrained" $SIZE --lr 1e-12 \
    --warmup 0 --max-steps 1 --threads 2 --overwrite
python3 "$HERE/make_queries.py" "$SHARED/data/de-en/ding.test.tsv" 300 "$W/sentences.txt" "$W/queries.txt"
for m in "$W/model" "$W/untrained" "$SHARED/models/all-MiniLM-L6-v2"; do
    name=$(basename "$m")
    "$BIN" embed --model "$m" --threads 2 < "$W/sentences.txt" > "$W/$name.s.jsonl"
    "$BIN" embed --model "$m" --threads 2 < "$W/queries.txt" > "$W/$name.q.jsonl"
    printf '%s ' "$name"
    python3 "$HERE/retrieval.py" "$W/sentences.txt" "$W/queries.txt" "$W/$name.s.jsonl" "$W/$name.q.jsonl"
done
