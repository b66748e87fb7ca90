#!/usr/bin/env bash
# Side-by-side comparison with PyTorch (training) and CTranslate2 (translation), on the CPU.
#
#   MODEL=runs/deen/checkpoints/step-00001200 bash benches/compare/run.sh
#
# Environment (all optional):
#   THREADS="1 2"        thread counts to compare at
#   PRESET=base          model size of the training comparison: tiny, base or big (our presets)
#   TRAIN_BATCHES="16"   training batch sizes in sentence pairs of 32 + 32 tokens ("16 64" adds
#                        the ~4000-token batch)
#   TRAIN_PRECISIONS="f32 bf16"  training precisions: f32 (PyTorch float32 eager vs ours f32)
#                        and bf16 (PyTorch bf16 autocast vs ours --precision bf16; the bf16
#                        rows also give ours bf16 / PyTorch float32)
#   MODEL=DIR            one of our translation model directories; without it the translation
#                        part is skipped
#   SRC=FILE             sentences to translate (TSV: first column) [../shared/data/de-en/ding.test.tsv]
#   N=0                  translate only the first N sentences (0: all)
#   BEAM_STOP=exact      our beam search's stopping rule: exact (our default) or first-k (stop at
#                        k finished hypotheses, as CTranslate2 does with its default patience 1)
#   TRANSLATE_PRECISIONS="f32 int8"  translation: ours --precision P against CTranslate2's
#                        compute_type float32 (f32) or int8 (int8)
#   PARTS="train translate"  which parts to run
#   VENV=DIR             Python virtual environment [benches/compare/.venv], created if missing
#   OUT=DIR              outputs and logs [benches/compare/out]
#   SKIP_BUILD=1         use the binary as it is
#   BIN=PATH             our binary [target/release/transformer]
#   TORCH_INDEX_URL=URL  install torch from this index (e.g. a CPU-only wheel index) instead of PyPI
#
# See benches/compare/README.md.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"

THREADS=${THREADS:-"1 2"}
PRESET=${PRESET:-base}
TRAIN_BATCHES=${TRAIN_BATCHES:-16}
TRAIN_PRECISIONS=${TRAIN_PRECISIONS:-"f32 bf16"}
MODEL=${MODEL:-}
SRC=${SRC:-../shared/data/de-en/ding.test.tsv}
N=${N:-0}
BEAM_STOP=${BEAM_STOP:-exact}
TRANSLATE_PRECISIONS=${TRANSLATE_PRECISIONS:-"f32 int8"}
PARTS=${PARTS:-"train translate"}
VENV=${VENV:-$HERE/.venv}
OUT=${OUT:-$HERE/out}
BIN=${BIN:-$ROOT/target/release/transformer}
PY=$VENV/bin/python
BEAM=4
BATCH=32
mkdir -p "$OUT"
LOG=$OUT/run.log
: >"$LOG"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"

say() { echo "$@" | tee -a "$LOG"; }
has_part() { [[ " $PARTS " == *" $1 "* ]]; }

# --- Python environment -------------------------------------------------------------------
if [[ ! -x "$PY" ]]; then
    say "creating the virtual environment $VENV"
    python3 -m venv "$VENV"
fi
# The translation part's modules (the training part needs torch alone).
if has_part translate && ! "$PY" -c "import numpy, safetensors, tokenizers, ctranslate2" 2>/dev/null; then
    say "installing numpy safetensors tokenizers ctranslate2 into $VENV"
    "$PY" -m pip install --quiet numpy safetensors tokenizers ctranslate2
fi
if has_part train && ! "$PY" -c "import torch" 2>/dev/null; then
    if ! "$PY" -m pip show --quiet torch >/dev/null 2>&1; then
        if [[ -n "${TORCH_INDEX_URL:-}" ]]; then
            say "installing torch from $TORCH_INDEX_URL"
            "$PY" -m pip install --quiet torch --index-url "$TORCH_INDEX_URL"
        else
            # torch alone, without the GPU packages pip would pull in with it; its pure-Python
            # dependencies by hand.
            say "installing torch (--no-deps) and its pure-Python dependencies"
            "$PY" -m pip install --quiet --no-deps torch
            "$PY" -m pip install --quiet filelock typing-extensions sympy networkx jinja2 fsspec
        fi
    fi
    if ! "$PY" -c "import torch" 2>/dev/null; then
        # PyPI's Linux torch wheels are CUDA builds: libtorch is linked against the CUDA
        # runtime libraries and does not load without them, even to run on the CPU. Install
        # the library wheels torch declares (about 3 GB), not triton or cuda-bindings.
        mapfile -t CUDA_LIBS < <("$PY" - <<'EOF'
import importlib.metadata as md
for req in md.requires("torch") or []:
    spec = req.split(";")[0].strip()
    if spec.startswith(("nvidia-", "cuda-toolkit")):
        print(spec)
EOF
        )
        if [[ ${#CUDA_LIBS[@]} -gt 0 ]]; then
            say "torch does not load without its CUDA libraries; installing ${CUDA_LIBS[*]}"
            "$PY" -m pip install --quiet "${CUDA_LIBS[@]}"
        fi
        "$PY" -c "import torch" || { say "torch still does not import"; exit 1; }
    fi
fi

# --- Our binary -------------------------------------------------------------------------
if [[ -z "${SKIP_BUILD:-}" ]]; then
    say "cargo build --release"
    cargo build --release 2>>"$LOG"
fi
[[ -x "$BIN" ]] || { say "$BIN is missing (build it, or unset SKIP_BUILD)"; exit 1; }

# The number before "target" on the first line starting with $1 ("... Y target tokens/s ...").
target_tps() {
    awk -v p="$1" 'index($0, p) == 1 { for (i = 2; i <= NF; i++) if ($i == "target") { print $(i - 1); exit } }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }

# --- (a) training throughput: PyTorch eager vs ours -----------------------------------------
if has_part train; then
    say ""
    case $PRESET in  # the shapes of ModelConfig::preset (src/model/config.rs)
        tiny) SHAPE=(--d-model 128 --heads 4 --d-ff 512 --layers 2 --dropout 0.1) ;;
        base) SHAPE=(--d-model 512 --heads 8 --d-ff 2048 --layers 6 --dropout 0.1) ;;
        big) SHAPE=(--d-model 1024 --heads 16 --d-ff 4096 --layers 6 --dropout 0.3) ;;
        *) say "unknown PRESET $PRESET (tiny, base or big)"; exit 1 ;;
    esac
    say "== training, preset $PRESET (${SHAPE[*]}, vocab 8000)"
    printf '%-8s %-6s %-10s %-18s %-18s %-14s %s\n' threads batch precision "PyTorch tokens/s" \
        "ours tokens/s" "ours/PyTorch" "ours/PyTorch-f32" >>"$SUMMARY"
    for B in $TRAIN_BATCHES; do
        for T in $THREADS; do
            pt_f32=""
            for P in $TRAIN_PRECISIONS; do
                say "-- batch $B x (32 + 32) tokens, $T threads, $P"
                autocast=()
                [[ $P == bf16 ]] && autocast=(--autocast-bf16)
                torch_out=$("$PY" "$HERE/torch_train.py" "${SHAPE[@]}" --threads "$T" --batch "$B" \
                    --src-len 32 --tgt-len 32 --vocab 8000 --warmup-steps 2 --steps 5 "${autocast[@]}" \
                    2>&1 | tee -a "$LOG")
                pt=$(awk '/^pytorch:/ { print $2 }' <<<"$torch_out")
                [[ $P == f32 ]] && pt_f32=$pt
                ours_out=$("$BIN" bench --preset "$PRESET" --threads "$T" --batch "$B" --src-len 32 \
                    --tgt-len 32 --vocab 8000 --precision "$P" 2>&1 | tee -a "$LOG")
                ot=$(awk '/^train:/ { print $2 }' <<<"$ours_out")
                say "PyTorch $pt tokens/s, ours $ot tokens/s, ours/PyTorch $(ratio "$ot" "$pt") ($P; load: $(cut -d' ' -f1-3 /proc/loadavg))"
                vs_f32=$([[ -n $pt_f32 ]] && ratio "$ot" "$pt_f32" || echo "-")
                printf '%-8s %-6s %-10s %-18s %-18s %-14s %s\n' "$T" "$B" "$P" "$pt" "$ot" \
                    "$(ratio "$ot" "$pt")" "$vs_f32" >>"$SUMMARY"
            done
        done
    done
fi

# --- (b) translation: CTranslate2 export of our model vs ours --------------------------------
if has_part translate; then
    if [[ -z "$MODEL" ]]; then
        say ""
        say "MODEL is not set: skipping the CTranslate2 comparison"
    else
        for f in config.json model.safetensors vocab.json; do
            [[ -f "$MODEL/$f" ]] || { say "$MODEL/$f is missing"; exit 1; }
        done
        say ""
        say "== translation, $MODEL (our beam stop: $BEAM_STOP)"
        "$PY" "$HERE/export_ct2.py" "$MODEL" "$OUT/ct2" --force | tee -a "$LOG"
        "$PY" "$HERE/ct2_translate.py" prepare --model "$MODEL" --input "$SRC" --n "$N" \
            --out "$OUT/src.txt" | tee -a "$LOG"
        TMAX=$(tr ' ' '\n' <<<"$THREADS" | sort -n | tail -1)
        for P in $TRANSLATE_PRECISIONS; do
            case $P in
            f32) CT2_TYPE=float32 ;;
            int8) CT2_TYPE=int8 ;;
            *) say "TRANSLATE_PRECISIONS: $P is not f32 or int8"; exit 1 ;;
            esac
            say ""
            say "-- precision $P (CTranslate2 compute_type $CT2_TYPE)"
            # Our outputs to compare against (greedy scored with alpha 0: raw log-probabilities).
            "$BIN" translate --model "$MODEL" --threads "$TMAX" --batch-size "$BATCH" --nbest 1 \
                --alpha 0 --precision "$P" <"$OUT/src.txt" >"$OUT/ours.$P.greedy.tsv" 2>>"$LOG"
            "$BIN" translate --model "$MODEL" --threads "$TMAX" --batch-size "$BATCH" --beam "$BEAM" \
                --beam-stop "$BEAM_STOP" --alpha 0.6 --nbest 1 --precision "$P" \
                <"$OUT/src.txt" >"$OUT/ours.$P.beam$BEAM.tsv" 2>>"$LOG"
            declare -A OURS
            for T in $THREADS; do
                bench_out=$("$BIN" bench --translate "$MODEL" --src "$OUT/src.txt" --threads "$T" \
                    --sentences-per-batch "$BATCH" --beam "$BEAM" --beam-stop "$BEAM_STOP" \
                    --precision "$P" 2>&1 | tee -a "$LOG")
                OURS[$T,greedy]=$(target_tps "greedy:" <<<"$bench_out")
                OURS[$T,beam]=$(target_tps "beam $BEAM:" <<<"$bench_out")
                say "ours $P threads $T: greedy ${OURS[$T,greedy]}, beam $BEAM ${OURS[$T,beam]} target tokens/s"
            done
            mkdir -p "$OUT/$P"
            ct2_out=$("$PY" "$HERE/ct2_translate.py" run --model "$MODEL" --ct2 "$OUT/ct2" \
                --src "$OUT/src.txt" --threads "$THREADS" --compare-threads "$TMAX" --batch "$BATCH" \
                --beam "$BEAM" --alpha 0.6 --max-extra 50 --compute-type "$CT2_TYPE" \
                --ours-greedy "$OUT/ours.$P.greedy.tsv" --ours-beam "$OUT/ours.$P.beam$BEAM.tsv" \
                --out-dir "$OUT/$P" 2>&1 | tee -a "$LOG")
            {
                echo ""
                echo "translation of $(wc -l <"$OUT/src.txt") sentences, $BATCH per batch, ours --precision $P," \
                    "CTranslate2 compute_type $CT2_TYPE, target tokens/s (EOS counted)"
                printf '%-8s %-8s %-16s %-16s %s\n' threads search "ours" "CTranslate2" "ours/CTranslate2"
                for T in $THREADS; do
                    for S in greedy beam; do
                        if [[ $S == greedy ]]; then name=greedy; else name="beam $BEAM"; fi
                        c=$(target_tps "ct2 threads $T $name:" <<<"$ct2_out")
                        o=${OURS[$T,$S]}
                        printf '%-8s %-8s %-16s %-16s %s\n' "$T" "$name" "$o" "$c" "$(ratio "$o" "$c")"
                    done
                done
                grep -E '^identical|^  (summed|of the|note)' <<<"$ct2_out" || true
            } >>"$SUMMARY"
        done
    fi
fi

say ""
say "== summary (also in $SUMMARY; full log in $LOG)"
tee -a "$LOG" <"$SUMMARY"
