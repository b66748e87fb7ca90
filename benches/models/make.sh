#!/usr/bin/env bash
# The benchmark model set: random weights of real model shapes, converted by llama.cpp's
# convert_hf_to_gguf.py (bf16) and quantised by llama-quantize, as ../shared/tools/fixtures does.
#
#   bash benches/models/make.sh                                  # Llama-3.2-1B, all types
#   MODELS="llama-3.2-1b llama-3.2-3b qwen3-4b" bash benches/models/make.sh
#
# Models (real configs: hidden size, layers, heads, vocabulary, RoPE, tied head):
#   llama-3.2-1b   2.5 GB bf16   llama-3.2-3b   6.4 GB    qwen3-4b   8.0 GB
#   llama-3.1-8b  16.1 GB bf16 (untied, streamed shard by shard)
#   olmoe-1b-7b   13.8 GB bf16 (mixture of experts, 64 experts, 8 a token)
# Output, outside the repository (never commit it): $MODELS_DIR/NAME/NAME.TYPE.gguf, with
# NAME/hf/ holding config.json and the tokenizer (its safetensors are deleted after conversion
# unless KEEP_HF=1) and NAME/MANIFEST.txt (sizes, sha256, the tools' versions).
#
# Variables (defaults):
#   MODELS_DIR  /work/models          where the models go (plus .venv and .tokenizers)
#   MODELS      llama-3.2-1b          which models
#   TYPES       "BF16 Q8_0 Q4_K_M Q6_K Q4_0"   GGUF types (BF16 is the converter's output)
#   SEED        0                     weight seed (same seed, same files)
#   LLAMA_CPP   /work/llama-cpp       llama.cpp sources and build (../shared/tools/llama-cpp.sh
#                                     builds it there when llama-quantize is missing)
#   VENV        $MODELS_DIR/.venv     Python for the scripts: numpy, safetensors, tokenizers, and
#                                     torch + transformers for the converter (it imports torch)
#   KEEP_HF     0                     1 keeps the bf16 safetensors
#   FORCE       0                     1 remakes files that exist
# Needs ../shared/data (the tokenizer's training text). Disk: about 2.6x the bf16 size of each
# model while it is made (safetensors + bf16 GGUF + the quantised files).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
MODELS_DIR=${MODELS_DIR:-/work/models}
MODELS=${MODELS:-llama-3.2-1b}
TYPES=${TYPES:-BF16 Q8_0 Q4_K_M Q6_K Q4_0}
SEED=${SEED:-0}
LLAMA_CPP=${LLAMA_CPP:-/work/llama-cpp}
VENV=${VENV:-$MODELS_DIR/.venv}
KEEP_HF=${KEEP_HF:-0}
FORCE=${FORCE:-0}
SRC=$LLAMA_CPP/llama_cpp_python-0.3.36/vendor/llama.cpp
QUANTIZE=$LLAMA_CPP/build/bin/llama-quantize
PY=$VENV/bin/python

mkdir -p "$MODELS_DIR"
if [ ! -x "$QUANTIZE" ]; then
  echo "== llama.cpp tools: building in $LLAMA_CPP (about 10 minutes)"
  bash "$HERE/../../../shared/tools/llama-cpp.sh" "$LLAMA_CPP"
fi
if ! "$PY" -c 'import numpy, safetensors, tokenizers, torch, transformers' 2>/dev/null; then
  echo "== Python environment: $VENV (torch is for convert_hf_to_gguf.py, which imports it)"
  [ -x "$PY" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q numpy safetensors tokenizers transformers sentencepiece torch
fi

for name in $MODELS; do
  family=$("$PY" "$HERE/weights.py" "$name" /dev/null --family) || {
    echo "error: unknown model '$name'" >&2; exit 2; }
  dir=$MODELS_DIR/$name
  bf16=$dir/$name.BF16.gguf
  mkdir -p "$dir/hf"
  echo "== $name ($family tokenizer) -> $dir"
  if [ "$FORCE" = 1 ] || [ ! -f "$bf16" ]; then
    tok=$MODELS_DIR/.tokenizers/$family
    if [ "$FORCE" = 1 ] || [ ! -f "$tok/tokenizer_info.json" ]; then
      echo "   tokenizer: training a byte-level BPE on ../shared/data"
      "$PY" "$HERE/tokenizer.py" "$family" "$tok"
    fi
    cp "$tok"/*.json "$dir/hf/"
    echo "   weights: random, seed $SEED, bf16"
    "$PY" "$HERE/weights.py" "$name" "$dir/hf" --seed "$SEED"
    pre=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['llama_cpp_pre'])" "$dir/hf/tokenizer_info.json")
    echo "   convert_hf_to_gguf.py --outtype bf16 (pre-tokenizer $pre)"
    LLAMACPP=$SRC LLAMACPP_PRE=$pre PYTHONPATH=$SRC/gguf-py "$PY" "$HERE/convert.py" "$dir/hf" \
      --outtype bf16 --model-name "random-$name" --outfile "$bf16.part" > "$dir/convert.log" 2>&1 \
      || { echo "   convert FAILED (see $dir/convert.log)"; tail -5 "$dir/convert.log"; exit 1; }
    mv "$bf16.part" "$bf16"
  fi
  if [ "$KEEP_HF" != 1 ]; then rm -f "$dir"/hf/*.safetensors; fi
  for t in $TYPES; do
    [ "$t" = BF16 ] && continue
    out=$dir/$name.$t.gguf
    if [ "$FORCE" = 1 ] || [ ! -f "$out" ]; then
      echo "   llama-quantize $t"
      "$QUANTIZE" "$bf16" "$out.part" "$t" "$(nproc)" > "$dir/quantize-$t.log" 2>&1 \
        || { echo "   quantize $t FAILED (see $dir/quantize-$t.log)"; exit 1; }
      mv "$out.part" "$out"
    fi
  done
  case " $TYPES " in *" BF16 "*) ;; *) rm -f "$bf16" ;; esac
  {
    echo "# $name: random weights (seed $SEED) of the real shape, made by benches/models/make.sh"
    echo "# llama.cpp: $(cd "$SRC" && git rev-parse --short HEAD 2>/dev/null || echo "llama_cpp_python-0.3.36 vendor"); $("$PY" -c 'import torch, transformers, tokenizers, numpy; print(f"torch {torch.__version__}, transformers {transformers.__version__}, tokenizers {tokenizers.__version__}, numpy {numpy.__version__}")')"
    "$PY" -c "import json; i=json.load(open('$dir/hf/tokenizer_info.json')); print(f\"# tokenizer: {i['tokens']} tokens ({i['learned']} learned from ../shared/data, {i['fillers']} unreachable fillers), pre-tokenizer {i['llama_cpp_pre']}\")"
    for f in "$dir"/*.gguf; do echo "$(stat -c %s "$f") $(sha256sum "$f" | cut -c1-16) $(basename "$f")"; done
  } > "$dir/MANIFEST.txt"
  sed 's/^/   /' "$dir/MANIFEST.txt"
done
