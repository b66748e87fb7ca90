#!/usr/bin/env bash
# Side-by-side speed of a pretrained decoder: SmolLM2-135M-Instruct (the Q4_1 GGUF of
# ../shared) in this crate, in transformers (the GGUF dequantised to float32, as ours) and in
# llama.cpp (llama-cpp-python, on the quantised blocks): prompt (prefill) tokens/s and
# single-stream greedy decode tokens/s at each thread count, and each process's peak memory.
#
#   bash benches/compare/pretrained.sh
#
# Environment (all optional):
#   THREADS="1 2"        thread counts
#   ROUNDS=3             interleaved rounds: each runs every implementation at every thread count
#                        once, so machine noise hits all of them alike
#   REPS=3               timed repetitions inside each run (after one untimed warm-up)
#   PROMPT_TOKENS=128    prompt length (the same ids for all three)
#   NEW_TOKENS=128       greedy steps after the prompt (end-of-text does not stop them)
#   IMPLS="ours transformers llama.cpp"
#   PRECISION=f32        ours: --precision f32 (the GGUF dequantised, as transformers) or ggml
#                        (the file's blocks times 8-bit activations, as llama.cpp)
#   GGUF=FILE            [../shared/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf]
#   VENV=DIR             Python virtual environment [benches/compare/.venv], created if missing
#   OUT=DIR              outputs [benches/compare/out/pretrained]
#   SKIP_BUILD=1         use the binary as it is
#   BIN=PATH             our binary [target/release/transformer]
#   OMP_WAIT_POLICY      passed on to torch and llama.cpp (both OpenMP); PASSIVE keeps their
#                        idle threads from spinning on a machine shared with other work
#
# See benches/compare/README.md.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"

THREADS=${THREADS:-"1 2"}
ROUNDS=${ROUNDS:-3}
REPS=${REPS:-3}
PROMPT_TOKENS=${PROMPT_TOKENS:-128}
NEW_TOKENS=${NEW_TOKENS:-128}
IMPLS=${IMPLS:-"ours transformers llama.cpp"}
PRECISION=${PRECISION:-f32}
GGUF=${GGUF:-$ROOT/../shared/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf}
VENV=${VENV:-$HERE/.venv}
OUT=${OUT:-$HERE/out/pretrained}
BIN=${BIN:-$ROOT/target/release/transformer}
PY=$VENV/bin/python
mkdir -p "$OUT"
LOG=$OUT/run.log
: >"$LOG"
RESULTS=$OUT/results.jsonl
: >"$RESULTS"

say() { echo "$@" | tee -a "$LOG"; }
has_impl() { [[ " $IMPLS " == *" $1 "* ]]; }

[[ -f "$GGUF" ]] || { echo "error: $GGUF not found (set GGUF=...)" >&2; exit 2; }

# --- Python environment -------------------------------------------------------------------
if [[ ! -x "$PY" ]]; then
    say "creating the virtual environment $VENV"
    python3 -m venv "$VENV"
fi
if has_impl transformers && ! "$PY" -c "import torch, transformers, gguf, accelerate" 2>/dev/null; then
    # PyPI's Linux torch wheel is a CUDA build that loads its CUDA libraries even on the CPU.
    say "installing torch transformers gguf accelerate numpy into $VENV"
    "$PY" -m pip install --quiet torch transformers gguf accelerate numpy
fi
if has_impl llama.cpp && ! "$PY" -c "import llama_cpp" 2>/dev/null; then
    # Built from source for this CPU. ggml's AMX kernels crash on some CPUs that have AMX, so
    # they are off (this build never uses them; the comparison is with the AVX2/AVX-512 paths).
    say "building llama-cpp-python from source into $VENV (several minutes)"
    CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \
        "$PY" -m pip install --quiet --no-cache-dir 'llama-cpp-python[server]'
fi

# --- our binary ---------------------------------------------------------------------------
if [[ -z "${SKIP_BUILD:-}" ]]; then
    say "cargo build --release"
    cargo build --release 2>>"$LOG"
fi

# --- the prompt: the first PROMPT_TOKENS ids of Genesis 1 (World English Bible) -----------
TEXT=$(sed -n '2,30p' "$ROOT/../shared/data/en/bible-web.en.txt" | tr '\n' ' ')
IDS=$OUT/prompt_ids.json
"$BIN" generate --model "$GGUF" --prompt "$TEXT" --max-tokens 0 --format json --threads 1 \
    | "$PY" -c "import json,sys; ids=json.load(sys.stdin)['prompt_ids'][:$PROMPT_TOKENS]; \
assert len(ids)==$PROMPT_TOKENS, f'the text has only {len(ids)} tokens'; print(json.dumps(ids))" \
    >"$IDS"
say "prompt: $PROMPT_TOKENS ids in $IDS; $NEW_TOKENS new tokens; $REPS repetitions x $ROUNDS rounds; ours at --precision $PRECISION"
say "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-unset}"

# --- interleaved rounds -------------------------------------------------------------------
run_one() { # impl threads -> one JSON line on stdout
    case $1 in
        ours) "$BIN" bench --generate "$GGUF" --prompt-ids "$IDS" --new-tokens "$NEW_TOKENS" \
                  --threads "$2" --warmup-steps 1 --steps "$REPS" --precision "$PRECISION" --json ;;
        transformers) OMP_NUM_THREADS=$2 "$PY" "$HERE/hf_generate.py" "$GGUF" "$IDS" "$2" \
                  "$NEW_TOKENS" "$REPS" ;;
        llama.cpp) OMP_NUM_THREADS=$2 "$PY" "$HERE/llama_generate.py" "$GGUF" "$IDS" "$2" \
                  "$NEW_TOKENS" "$REPS" ;;
    esac
}
for round in $(seq 1 "$ROUNDS"); do
    for t in $THREADS; do
        for impl in $IMPLS; do
            load=$(cut -d' ' -f1 /proc/loadavg)
            line=$(run_one "$impl" "$t" 2>>"$LOG" | tail -n 1)
            [[ -n "$line" ]] || { say "error: $impl at $t threads printed nothing (see $LOG)"; exit 1; }
            echo "$line" | "$PY" -c "import json,sys; r=json.load(sys.stdin); \
r.update(round=$round, load_before=$load); print(json.dumps(r))" >>"$RESULTS"
            say "round $round, $t threads, $impl (load $load): $(echo "$line" | cut -c1-200)"
        done
    done
done

"$PY" "$HERE/pretrained_summary.py" "$RESULTS" | tee "$OUT/summary.md" | tee -a "$LOG"
