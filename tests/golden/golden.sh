#!/usr/bin/env bash
# Golden outputs of the `transformer` CLI, for checking that a refactor is bit-identical.
#
#   tests/golden/golden.sh BIN OUTDIR         run the fixed command set below with binary BIN,
#                                             write every output under OUTDIR and OUTDIR/SHA256SUMS
#   tests/golden/golden.sh --compare A B      compare two such OUTDIRs (exit 1 when any
#                                             deterministic output differs); see compare.py
#
# Environment: SHARED (default: the repository's ../shared) holds the corpora and MiniLM.
#
# What is written to OUTDIR:
#   NAME.out          stdout of command NAME (see the list below)
#   NAME.err          its raw stderr (timings: not hashed)
#   NAME.cmd          the command line (paths as <OUT>, <SHARED>, <BIN>)
#   filtered/...      timing-free copies of files that contain timings, hashed instead of them:
#                     every NAME.err, demo*.out (its last line prints seconds) and every
#                     metrics.jsonl (without the fields elapsed_s and tokens_per_s). OUTDIR and
#                     SHARED are replaced by <OUT> and <SHARED> there.
#   deen/, lm/, ...   the model directories the commands write (weights, optimizer, configs,
#                     metrics, curves.png), attn-*.png/svg, inputs (test-src.txt, lm-text.txt, ...)
#   timings.tsv       wall seconds and exit status of every command (not hashed)
#   SHA256SUMS        sha256 of every deterministic file (`cd OUTDIR && sha256sum -c SHA256SUMS`)
#
# Everything runs with an explicit --threads (1 or 2), so results do not depend on the core
# count. Bit-exact results are only expected on the same machine (CPU features select the matrix
# multiply kernels); tests/training/golden.rs is the tolerance-based check for other CPUs.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"

if [[ "${1:-}" == "--compare" ]]; then
    [[ $# -eq 3 ]] || { echo "usage: $0 --compare DIR_A DIR_B" >&2; exit 2; }
    exec python3 "$HERE/compare.py" "$2" "$3"
fi
if [[ $# -ne 2 ]]; then
    echo "usage: $0 BIN OUTDIR | $0 --compare DIR_A DIR_B" >&2
    exit 2
fi

BIN="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
[[ -x "$BIN" ]] || { echo "error: $1 is not an executable" >&2; exit 2; }
mkdir -p "$2"
OUT="$(cd "$2" && pwd)"
if [[ -n "$(ls -A "$OUT")" ]]; then
    echo "error: $OUT is not empty (the commands must start from scratch)" >&2
    exit 2
fi
SHARED="$(cd "${SHARED:-$REPO/../shared}" && pwd)"
DATA="$SHARED/data"
export OUT SHARED BIN
cd "$REPO" # configs/deen.json is relative to the repository root

# Outputs that are not reproducible run to run with the same binary (found by recording twice
# and comparing): listed here, kept in OUTDIR, but left out of SHA256SUMS. Paths relative to OUT.
NONDETERMINISTIC=(
    # (none found: see tests/golden/README.md)
)

START=$SECONDS
printf 'name\tseconds\texit\n' > "$OUT/timings.tsv"

# run NAME STDIN_FILE ARGS...: runs BIN ARGS with stdin from STDIN_FILE (- for none), stdout to
# OUT/NAME.out, stderr to OUT/NAME.err; stops the script when the command fails.
run() {
    local name=$1 input=$2
    shift 2
    printf '%s\n' "$*" | perl -pe 's/\Q$ENV{OUT}\E/<OUT>/g; s/\Q$ENV{SHARED}\E/<SHARED>/g' \
        > "$OUT/$name.cmd"
    local t0=$SECONDS rc=0
    if [[ "$input" == - ]]; then
        "$BIN" "$@" < /dev/null > "$OUT/$name.out" 2> "$OUT/$name.err" || rc=$?
    else
        "$BIN" "$@" < "$input" > "$OUT/$name.out" 2> "$OUT/$name.err" || rc=$?
    fi
    printf '%s\t%s\t%s\n' "$name" $((SECONDS - t0)) "$rc" >> "$OUT/timings.tsv"
    printf '%-28s %4d s  exit %d\n' "$name" $((SECONDS - t0)) "$rc" >&2
    if [[ $rc -ne 0 ]]; then
        echo "error: $name failed (exit $rc); stderr:" >&2
        tail -n 20 "$OUT/$name.err" >&2
        exit 1
    fi
}

# ---- inputs -------------------------------------------------------------------------------
head -n 200 "$DATA/de-en/ding.test.tsv" > "$OUT/test-pairs.tsv"
cut -f1 "$OUT/test-pairs.tsv" > "$OUT/test-src.txt"
cut -f2 "$OUT/test-pairs.tsv" > "$OUT/test-ref.txt"
FIRST_SRC="$(head -n 1 "$OUT/test-src.txt")"

# The language model's text: the first 300000 bytes of Shakespeare, cut back to a line end;
# held out: the next ~20000 bytes, also cut back to a line end.
SHAKES="$DATA/en/shakespeare.en.txt"
cut_to_line() { perl -0777 -pe 's/[^\n]*\z//'; }
head -c 300000 "$SHAKES" | cut_to_line > "$OUT/lm-text.txt"
N=$(wc -c < "$OUT/lm-text.txt")
perl -e 'open(my $f, "<", $ARGV[0]) or die; seek($f, $ARGV[1], 0); read($f, my $b, 20000); print $b' \
    "$SHAKES" "$N" | cut_to_line > "$OUT/lm-heldout.txt"

# Sentences to embed: short, long (well beyond 256 word pieces: truncated), empty, non-ASCII,
# punctuation only, repeated, mixed case, digits, an unknown script.
LONG="$(for i in $(seq 1 60); do printf 'the quick brown fox number %d jumps over the lazy dog; ' "$i"; done)"
cat > "$OUT/embed-input.txt" <<EOF
A man is eating food.
A man is eating a piece of bread.

The girl is carrying a baby.
$LONG
Ein Mann isst Brot.
The new movie is awesome!!!
???
Paris is the capital of France.
PARIS IS THE CAPITAL OF FRANCE.
3.14159 is approximately pi, and 2 + 2 = 4.
naïve café résumé façade
東京は日本の首都です。
a
A man is eating food.
Transformers replace recurrence with attention.
   leading and trailing spaces   
The cat sat on the mat while the dog slept by the fire, and nobody said a word all evening.
email@example.com https://example.org/path?q=1
Good morning.
EOF

# ---- a. demo ------------------------------------------------------------------------------
run demo2 - demo --steps 200 --time-limit 0 --threads 2 --samples 4 --out "$OUT/demo2"
run demo1 - demo --steps 100 --time-limit 0 --threads 1 --samples 4 --pre-ln --out "$OUT/demo1"

# ---- b. De-En training and a resume from its step-200 checkpoint ----------------------------
DEEN_ARGS=(--train "$DATA/de-en/ding.train.tsv" --valid "$DATA/de-en/ding.valid.tsv"
    --config configs/deen.json --vocab-level bpe --vocab-size 2000 --tokens-per-batch 2000
    --warmup 400 --lr-factor 0.5 --dropout 0.2 --attention-dropout 0.1 --activation-dropout 0.1
    --word-dropout 0.1 --max-steps 300 --cooldown 100 --log-every 1 --valid-every 100
    --valid-bleu-lines 100 --save-every 100 --keep-last 2 --threads 2 --seed 1)
run deen - train "${DEEN_ARGS[@]}" --out "$OUT/deen"
# The model, recipe and vocabulary come from the checkpoint (the model flags are ignored); the
# same data, valid options and thread count are given so the run should end bit-identical to
# deen/ (compare.py also checks deen/model.safetensors == deen-resumed/model.safetensors).
run deen-resumed - train "${DEEN_ARGS[@]}" --resume "$OUT/deen/checkpoints/step-00000200" \
    --out "$OUT/deen-resumed"

# ---- c. translate, score, bleu, attention with the De-En model ------------------------------
M="$OUT/deen"
run tr-greedy "$OUT/test-src.txt" translate --model "$M" --threads 2
run tr-greedy-t1 "$OUT/test-src.txt" translate --model "$M" --threads 1
run tr-beam4 "$OUT/test-src.txt" translate --model "$M" --threads 2 --beam 4
run tr-beam4-nbest3 "$OUT/test-src.txt" translate --model "$M" --threads 2 --beam 4 --nbest 3
run tr-beam4-firstk "$OUT/test-src.txt" translate --model "$M" --threads 2 --beam 4 --beam-stop first-k
run score "$OUT/test-pairs.tsv" score --model "$M" --threads 2
run bleu-greedy - bleu --ref "$OUT/test-ref.txt" "$OUT/tr-greedy.out"
run bleu-beam4 - bleu --ref "$OUT/test-ref.txt" "$OUT/tr-beam4.out"
run attn-png - attention --model "$M" --src "$FIRST_SRC" --out "$OUT/attn.png" --threads 2
run attn-svg - attention --model "$M" --src "$FIRST_SRC" --out "$OUT/attn.svg" --threads 2

# ---- d. language models ---------------------------------------------------------------------
LM_ARGS=(--text "$OUT/lm-text.txt" --vocab-size 400 --context 64 --batch 8 --d-model 64
    --n-heads 4 --d-ff 256 --layers 2 --eval-every 40 --seed 1)
run lm - train-lm "${LM_ARGS[@]}" --max-steps 120 --threads 2 --out "$OUT/lm"
run lm2 - train-lm "${LM_ARGS[@]}" --pre-ln --positions rotary --untied --activation relu \
    --max-steps 60 --threads 1 --out "$OUT/lm2"
run gen-lm - generate --model "$OUT/lm" --prompt "ROMEO:" --max-tokens 80 --seed 3 --threads 2
run gen-lm-greedy - generate --model "$OUT/lm" --prompt "ROMEO:" --max-tokens 80 --seed 3 \
    --temperature 0 --threads 2
run gen-lm-topk - generate --model "$OUT/lm" --prompt "ROMEO:" --max-tokens 80 --seed 3 \
    --top-k 5 --top-p 0.9 --threads 2
# 100 new tokens > context 64: the KV cache is rebuilt from the last half of the context.
run gen-lm2 - generate --model "$OUT/lm2" --prompt "ROMEO:" --max-tokens 100 --seed 3 --threads 2
run gen-lm2-greedy - generate --model "$OUT/lm2" --prompt "ROMEO:" --max-tokens 100 \
    --temperature 0 --threads 1
run ppl-lm "$OUT/lm-heldout.txt" perplexity --model "$OUT/lm" --threads 2
run ppl-lm-s16 "$OUT/lm-heldout.txt" perplexity --model "$OUT/lm" --stride 16 --threads 2
run ppl-lm2 "$OUT/lm-heldout.txt" perplexity --model "$OUT/lm2" --threads 2
run ppl-lm2-s16 "$OUT/lm-heldout.txt" perplexity --model "$OUT/lm2" --stride 16 --threads 2

# ---- e. sentence embeddings -----------------------------------------------------------------
run embed "$OUT/embed-input.txt" embed --model "$SHARED/models/all-MiniLM-L6-v2" --threads 2
run embed-b4 "$OUT/embed-input.txt" embed --model "$SHARED/models/all-MiniLM-L6-v2" \
    --batch-size 4 --max-len 32 --threads 1

# ---- f. checkpoint averaging ----------------------------------------------------------------
run average - average --out "$OUT/avg" "$OUT/deen/checkpoints/step-00000200" \
    "$OUT/deen/checkpoints/step-00000300"
run tr-avg "$OUT/test-src.txt" translate --model "$OUT/avg" --threads 2
run tr-avg-beam4 "$OUT/test-src.txt" translate --model "$OUT/avg" --threads 2 --beam 4

# ---- g. pretrained decoders and the low-precision paths ---------------------------------------
SMOL="$SHARED/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
HFD="$SHARED/reference/hf-decoders"
head -c 3000 "$OUT/lm-heldout.txt" | cut_to_line > "$OUT/ppl-short.txt"
for prec in f32 bf16 int8 ggml; do
    run "gen-smol-$prec" - generate --model "$SMOL" --prompt "The capital of France is" \
        --max-tokens 24 --temperature 0 --precision "$prec" --threads 2
done
run gen-smol-chat - generate --model "$SMOL" --chat --prompt "What is 2 + 2?" --max-tokens 24 \
    --temperature 0 --precision ggml --threads 2
run gen-smol-sampled - generate --model "$SMOL" --prompt "Once upon a time" --max-tokens 24 \
    --seed 5 --top-k 40 --top-p 0.9 --precision ggml --threads 1
run ppl-smol-ggml "$OUT/ppl-short.txt" perplexity --model "$SMOL" --context 128 --precision ggml \
    --threads 2
for fam in llama-tiny gpt2-tiny; do
    run "gen-$fam" - generate --model "$HFD/$fam" --prompt "ROMEO:" --max-tokens 40 \
        --temperature 0 --threads 2
    run "ppl-$fam" "$OUT/ppl-short.txt" perplexity --model "$HFD/$fam" --threads 2
done
for prec in bf16 int8; do
    run "tr-$prec" "$OUT/test-src.txt" translate --model "$M" --threads 2 --precision "$prec"
    run "tr-$prec-beam4" "$OUT/test-src.txt" translate --model "$M" --threads 2 --beam 4 \
        --precision "$prec"
done

# ---- h. the server: a fixed request set, alone and all at once (tests/golden/serve_requests.py)
# serve_one NAME KIND ARGS...: starts `serve ARGS` on a free port, sends the requests, stops it.
serve_one() {
    local name=$1 kind=$2
    shift 2
    local port
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    printf '%s\n' "serve $* --addr 127.0.0.1:$port" | perl -pe 's/\Q$ENV{OUT}\E/<OUT>/g; s/\Q$ENV{SHARED}\E/<SHARED>/g; s/:\d+$/:<port>/' > "$OUT/$name.cmd"
    local t0=$SECONDS
    "$BIN" serve "$@" --addr "127.0.0.1:$port" > "$OUT/$name.log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 600); do
        curl -sf "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break
        kill -0 "$pid" 2>/dev/null || { echo "error: $name: server exited" >&2; tail "$OUT/$name.log" >&2; exit 1; }
        sleep 0.2
    done
    local rc=0
    python3 "$HERE/serve_requests.py" "http://127.0.0.1:$port" "$kind" "$OUT/$name.json" || rc=$?
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
    printf '%s\t%s\t%s\n' "$name" $((SECONDS - t0)) "$rc" >> "$OUT/timings.tsv"
    printf '%-28s %4d s  exit %d\n' "$name" $((SECONDS - t0)) "$rc" >&2
    [[ $rc -eq 0 ]] || { echo "error: $name failed" >&2; exit 1; }
}
serve_one serve-lm lm --model "$OUT/lm" --threads 2
serve_one serve-llama-tiny lm --model "$HFD/llama-tiny" --threads 2 --block-size 8
serve_one serve-smol chat --model "$SMOL" --precision ggml --threads 2
serve_one serve-deen mt --model "$M" --threads 2
serve_one serve-minilm embed --model "$SHARED/models/all-MiniLM-L6-v2" --threads 2

# ---- timing-free copies and checksums ---------------------------------------------------------
# Replaces OUT and SHARED by placeholders and every timing or rate by <t>.
filter_text() {
    perl -pe '
        s/\Q$ENV{OUT}\E/<OUT>/g; s/\Q$ENV{SHARED}\E/<SHARED>/g;
        s/\(\d+(\.\d+)? s\b[^)]*\)/(<t>)/g;           # (8.1 s), (1 s training, 1 s in all), (0.3 s to prepare)
        s/\d+(\.\d+)? (tok\/s|tokens\/s|sentences\/s)/<t> $2/g;
        s/ in \d+(\.\d+)? s\b/ in <t> s/g;             # embedded N sentences in 0.12 s
        s/^(step\s+\d+\s+loss .*\s)\d+ s$/$1<t> s/;    # demo: step   100  loss 2.345  lr 1e-4  12 s
    '
}
mkdir -p "$OUT/filtered"
for f in "$OUT"/*.err "$OUT"/demo*.out; do
    filter_text < "$f" > "$OUT/filtered/$(basename "$f")"
done
while IFS= read -r -d '' f; do
    rel="${f#"$OUT"/}"
    mkdir -p "$OUT/filtered/$(dirname "$rel")"
    # serde_json writes the keys sorted: elapsed_s first, tokens_per_s last.
    perl -pe 's/"elapsed_s":[^,}]*,?//; s/,?"tokens_per_s":[^,}]*//' < "$f" > "$OUT/filtered/$rel"
done < <(find "$OUT" -path "$OUT/filtered" -prune -o -name metrics.jsonl -print0)

# Hashed: every file but the raw ones that hold timings (their filtered copies are hashed),
# timings.tsv, the command lines and NONDETERMINISTIC.
(
    cd "$OUT"
    find . -type f ! -name SHA256SUMS ! -name timings.tsv ! -name '*.cmd' ! -name '*.log' \
        ! -path './*.err' ! -path './demo*.out' ! -name metrics.jsonl ! -path './filtered/*' \
        -printf '%P\n'
    find filtered -type f
) | LC_ALL=C sort | while IFS= read -r rel; do
    skip=
    for nd in "${NONDETERMINISTIC[@]}"; do [[ "$rel" == $nd ]] && skip=1; done
    [[ -z "$skip" ]] && printf '%s\n' "$rel"
done | (cd "$OUT" && xargs -d '\n' sha256sum) > "$OUT/SHA256SUMS"

echo "golden.sh: $(wc -l < "$OUT/SHA256SUMS") files hashed in $OUT/SHA256SUMS, $((SECONDS - START)) s in all" >&2
