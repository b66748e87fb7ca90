#!/usr/bin/env bash
# What an AVX2-only CPU (AMD Zen 2/3, most laptops) runs, measured on a machine with AVX-512:
#
# 1. this checkout built in its own folder (AVX2_ONLY_DIR) with the `x86-v4` feature of the
#    `gemm` and `pulp` crates removed, so that our float32 parts (GEMM, norms) stop at AVX2 + FMA
#    as they would there;
# 2. run with TRANSFORMER_KERNEL=avx2 and TRANSFORMER_AVX_VNNI=0 (our low-precision kernels),
#    and glibc's AVX-512 string functions turned off (GLIBC_TUNABLES) for ours and llama.cpp's
#    AVX2 build alike.
#
#   LLAMA_BENCH=/path/build-avx2/bin/llama-bench ROUNDS=3 \
#       bash benches/compare/avx2_only.sh FILE.gguf [FILE.gguf ...]
#
# Prints llama_bench.sh's table (prompt 128 and decode at depth 128 against llama-bench), decode
# from an empty cache against `llama-bench -p 0`, and `ggml` against `f32` prefill (128 tokens)
# on the first file. With MODEL=DIR (one of our translation models; VENV as run.sh's), also the
# int8 comparison with CTranslate2 capped to AVX2 (benches/compare/run.sh, ROUNDS times).
# What it cannot show: the microarchitecture of a real Zen 3 (this is the instruction set only).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
[ $# -gt 0 ] || { echo "usage: avx2_only.sh FILE.gguf [FILE.gguf ...]" >&2; exit 2; }
: "${LLAMA_BENCH:?set LLAMA_BENCH to the llama-bench of an AVX2-only llama.cpp build}"
ROUNDS=${ROUNDS:-3}
DIR=${AVX2_ONLY_DIR:-$ROOT/target/avx2-only}

# The copy of the sources, Cargo.toml without x86-v4, built in its own target folder.
rm -rf "$DIR/src-tree"
mkdir -p "$DIR/src-tree"
git -C "$ROOT" ls-files -z | (cd "$ROOT" && xargs -0 cp --parents -t "$DIR/src-tree")
sed -i -e 's/"rayon", "x86-v4"\]/"rayon"]/' -e 's/^pulp = { version = "\([0-9.]*\)", features = \["x86-v4"\] }/pulp = "\1"/' \
    "$DIR/src-tree/Cargo.toml"
if grep -v '^#' "$DIR/src-tree/Cargo.toml" | grep -q 'x86-v4'; then
  echo "error: Cargo.toml still asks for x86-v4 (its dependency lines changed?)" >&2
  exit 1
fi
cp "$ROOT/Cargo.lock" "$DIR/src-tree/" 2>/dev/null || true
(cd "$DIR/src-tree" && CARGO_TARGET_DIR="$DIR/target" cargo build --release --quiet)
BIN="$DIR/target/release/transformer"

export GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD,-AVX512_VNNI
export TRANSFORMER_KERNEL=avx2 TRANSFORMER_AVX_VNNI=0
median() { python3 -c 'import json,sys,statistics; j=json.load(sys.stdin); print("%.1f" % statistics.median(j[sys.argv[1]]))' "$1"; }

echo "## prompt 128 / decode at depth 128, against $LLAMA_BENCH"
KERNELS=avx2 ROUNDS=$ROUNDS THREADS=1 bash "$HERE/llama_bench.sh" "$BIN" "$@" | sed -n '/^| file/,$p'

echo "## decode from an empty cache, one thread (ours: a one-token prompt), tokens/s"
for round in $(seq 1 "$ROUNDS"); do
  for file in "$@"; do
    ours=$("$BIN" bench --generate "$file" --threads 1 --prompt-tokens 1 --new-tokens 64 \
        --precision ggml --kernel avx2 --steps 3 --warmup-steps 1 --json 2>/dev/null | median decode_tps)
    theirs=$("$LLAMA_BENCH" -m "$file" -t 1 -p 0 -n 64 -r 3 -o json 2>/dev/null \
        | python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)[0]["avg_ts"])')
    echo "round $round $(basename "$file"): ours $ours, llama.cpp $theirs"
  done
done

echo "## prefill of 128 tokens, ggml against f32, one thread, $(basename "$1"), tokens/s"
for round in $(seq 1 "$ROUNDS"); do
  for precision in ggml f32; do
    t=$("$BIN" bench --generate "$1" --threads 1 --prompt-tokens 128 --new-tokens 1 \
        --precision "$precision" --kernel avx2 --steps 3 --warmup-steps 1 --json 2>/dev/null | median prefill_tps)
    echo "round $round $precision: $t"
  done
done

if [ -n "${MODEL:-}" ]; then
  echo "## int8 translation against CTranslate2 capped to AVX2"
  for round in $(seq 1 "$ROUNDS"); do
    BIN="$BIN" MODEL="$MODEL" PARTS=translate THREADS="1 2" BEAM_STOP=first-k \
        TRANSLATE_PRECISIONS=int8 SKIP_BUILD=1 CT2_FORCE_CPU_ISA=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 \
        OUT="$DIR/translate" bash "$HERE/run.sh" | grep -E '^(threads|[12] )' | sed "s/^/round $round: /"
  done
fi
