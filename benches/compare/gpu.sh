#!/usr/bin/env bash
# Our GPU kernels (gpu/examples/kernels.rs) and llama.cpp's (test-backend-ops perf) on the same
# shapes and the same adapter, side by side with the ratio; then (guarded) whole-model llama-bench.
#
#   bash benches/compare/gpu.sh [deps|build|run|all|pack]   (default: all = deps, build, run)
#
#   deps   Vulkan headers, glslc and SPIRV-Headers for llama.cpp's Vulkan backend: Debian's
#          libvulkan-dev, glslc, spirv-headers, installed with apt-get when missing (as root or
#          through sudo, as .ci/vulkan.sh installs lavapipe); Vulkan headers newer than Debian
#          12's are unpacked under target/ at build time (see headers() below). Debian 12's
#          glslc (2023.2) lacks GL_KHR_cooperative_matrix, GL_EXT_integer_dot_product and
#          bfloat16: llama.cpp's Vulkan shaders are then built without cooperative matrices
#          (tensor cores) and integer dot products, which slows its prefill products on an H100;
#          the configure step prints which extensions glslc has. A machine without a network (the
#          lent GPU machines) cannot install them: build here (`build`) and carry the binaries
#          (see "On a lent GPU machine" below).
#   build  llama.cpp from the sources that ../shared/tools/llama-cpp.sh unpacks (llama-cpp-python's
#          source distribution, the same version; unpacked here the same way when missing),
#          configured with -DGGML_VULKAN=ON in $BUILD-vulkan and, when nvcc exists, with
#          -DGGML_CUDA=ON in $BUILD-cuda; only the targets test-backend-ops and llama-bench.
#          Portable CPU flags (AVX2, no -march=native), so binaries built here run on the lent
#          machines. Then our example: cargo build --release --example kernels.
#   run    (a) ours: `kernels --json` at $SHAPES; (b) llama.cpp: one test-backend-ops case per
#          kernel we timed, at our exact shapes (a --test-file written by gpu_compare.py: MUL_MAT
#          per format at n = 1 and 512, RMS_NORM, ROPE, GLU swiglu, ARGMAX, FLASH_ATTN_EXT for
#          prefill 512 and decode at 1k/8k/32k), on each built backend; (c) the table:
#          µs per call, ours, theirs, ours / theirs (below 1: ours faster). Everything lands in
#          $OUT_DIR (ours.json, cases.txt, <backend>.log, table.txt).
#
# Variables (defaults in brackets):
#   SHAPES     our example's --shapes [smol on a software adapter (lavapipe), 1b,8b on a GPU]
#   ADAPTER    our example's --adapter index [first adapter]; llama.cpp's device: VK_DEVICE
#   VK_DEVICE  test-backend-ops -b for the Vulkan build [Vulkan0]
#   CASES      regex (test-backend-ops -p) picking cases, e.g. 'n1$|argmax' [all]. On lavapipe
#              test-backend-ops is very slow (it repeats an op up to 8192 times per graph and
#              for at least a second): pick a few.
#   BUILD      llama.cpp build folders: $BUILD-vulkan, $BUILD-cuda [target/llama]
#   LLAMA_DIR  where ../shared/tools/llama-cpp.sh unpacks [${TMPDIR:-/tmp}/llama-cpp]
#   LLAMA_SRC  llama.cpp sources [$LLAMA_DIR/llama_cpp_python-VERSION/vendor/llama.cpp]
#   CUDA_ARCH  CMAKE_CUDA_ARCHITECTURES [90: H100 / H200]
#   KERNELS    our example's binary [target/release/examples/kernels, built by `build`]
#   OUT_DIR    results [target/gpu-compare]
#   BACKENDS   llama.cpp builds to make [vulkan cuda] (cuda only where nvcc is)
#   GGML_H     ggml.h of the llama.cpp built [$LLAMA_SRC/ggml/include/ggml.h]
#   JOBS       build jobs [nproc]
#   MODEL      a GGUF file for part (d), whole models [none: skipped]
#   OURS       our binary for part (d) [target/release/transformer]
#   ROUNDS     interleaved rounds of part (d) [3]
#   PROMPT_TOKENS, NEW_TOKENS  part (d)'s prompt and decode lengths [512, 128]
#
# On a lent GPU machine (no network, no glslc; /work/.library/device/README.md): build here,
# `gpu.sh pack` (copies the binaries, stripped, into .gpu-carry/, ignored by git, and prints the
# command), fetch the Vulkan loader debs into .gl as the README says, then one `run` call carrying
# .gl and .gpu-carry with that command: it unpacks the loader, points Vulkan at NVIDIA's driver
# when no ICD file is found, and runs `gpu.sh run` with $OUT as OUT_DIR so the table comes back.
# The CUDA build needs nvcc, which is there and not here: `BACKENDS=cuda JOBS=16 gpu.sh build`
# there, with the llama.cpp sources carried (LLAMA_SRC; ggml/, src/, common/, tests/, tools/,
# vendor/, cmake/ and the top CMakeLists.txt suffice), costs minutes of device time (ggml-cuda
# compiles slowly): worth it only with the budget to spare.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
HERE=benches/compare
STEP=${1:-all}
SHARED_SCRIPT=${SHARED_SCRIPT:-$ROOT/../shared/tools/llama-cpp.sh}
LLAMA_DIR=${LLAMA_DIR:-${TMPDIR:-/tmp}/llama-cpp}
BUILD=${BUILD:-target/llama}
OUT_DIR=${OUT_DIR:-target/gpu-compare}
KERNELS=${KERNELS:-target/release/examples/kernels}
VK_DEVICE=${VK_DEVICE:-Vulkan0}
CUDA_ARCH=${CUDA_ARCH:-90}
JOBS=${JOBS:-$(nproc)}
CASES=${CASES:-}
BACKENDS=${BACKENDS:-vulkan cuda}
say() { echo "gpu.sh: $*" >&2; }

# The llama-cpp-python version ../shared/tools/llama-cpp.sh pins (its sources vendor llama.cpp).
version() {
  if [ -f "$SHARED_SCRIPT" ]; then
    grep -o 'llama-cpp-python==[0-9.]*' "$SHARED_SCRIPT" | head -1 | cut -d= -f3
  else
    echo 0.3.36
  fi
}
VERSION=$(version)
LLAMA_SRC=${LLAMA_SRC:-$LLAMA_DIR/llama_cpp_python-$VERSION/vendor/llama.cpp}
VENV=$LLAMA_DIR/venv

deps() {
  local missing=()
  command -v glslc > /dev/null || missing+=(glslc)
  [ -f /usr/include/vulkan/vulkan.h ] || missing+=(libvulkan-dev)
  ls /usr/share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake > /dev/null 2>&1 \
    || ls /usr/lib/*/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake > /dev/null 2>&1 \
    || missing+=(spirv-headers)
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing ${missing[*]} (llama.cpp's Vulkan backend needs them to build)"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null \
    || { $sudo apt-get update -qq > /dev/null \
      && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null; } \
    || { say "could not install ${missing[*]}: without a network, build elsewhere and carry $BUILD-vulkan/bin"; return 1; }
}

# This llama.cpp needs Vulkan headers 1.3.261 or newer (VK_EXT_layer_settings); Debian 12 has
# 1.3.239. Then Debian 13's libvulkan-dev is downloaded with apt-get (its own package lists under
# target/, the system's sources untouched) and unpacked into target/vulkan-sdk, nothing installed:
# VULKAN_INCLUDE (an include folder holding vulkan/vulkan.hpp) names other headers.
headers() {
  VULKAN_INCLUDE=${VULKAN_INCLUDE:-}
  [ -n "$VULKAN_INCLUDE" ] && return 0
  local v
  v=$(grep -m1 -o 'VK_HEADER_VERSION [0-9]*' /usr/include/vulkan/vulkan_core.h 2> /dev/null | cut -d' ' -f2)
  [ "${v:-0}" -ge 261 ] && return 0
  local sdk=$ROOT/target/vulkan-sdk apt=$ROOT/target/vulkan-sdk-apt
  if [ ! -f "$sdk/usr/include/vulkan/vulkan.hpp" ]; then
    say "Vulkan headers 1.3.${v:-?} are older than llama.cpp needs (1.3.261): Debian 13's libvulkan-dev into $sdk"
    mkdir -p "$apt/lists/partial" "$apt/debs" "$sdk"
    echo "deb http://deb.debian.org/debian trixie main" > "$apt/sources.list"
    local o=(-oDir::Etc::SourceList="$apt/sources.list" -oDir::Etc::SourceParts=/dev/null -oDir::State::Lists="$apt/lists")
    apt-get "${o[@]}" update -qq > /dev/null
    (cd "$apt/debs" && apt-get "${o[@]}" download libvulkan-dev > /dev/null 2>&1)
    dpkg -x "$apt"/debs/libvulkan-dev_*.deb "$sdk"
  fi
  VULKAN_INCLUDE=$sdk/usr/include
}

# The sources, unpacked as ../shared/tools/llama-cpp.sh does (venv with cmake and ninja, the
# source distribution from the package registry).
sources() {
  mkdir -p "$LLAMA_DIR"
  [ -x "$VENV/bin/pip" ] || python3 -m venv "$VENV"
  [ -x "$VENV/bin/cmake" ] && [ -x "$VENV/bin/ninja" ] || "$VENV/bin/pip" install -q cmake ninja
  if [ ! -d "$LLAMA_SRC" ]; then
    (cd "$LLAMA_DIR" && "$VENV/bin/pip" download -q --no-deps --no-binary :all: --no-build-isolation \
      "llama-cpp-python==$VERSION" -d . && tar xzf "llama_cpp_python-$VERSION.tar.gz")
  fi
  [ -f "$LLAMA_SRC/CMakeLists.txt" ] || { say "no llama.cpp sources in $LLAMA_SRC"; exit 1; }
}

# configure_build DIR FLAGS...: test-backend-ops and llama-bench only.
configure_build() {
  local dir=$1
  shift
  PATH="$VENV/bin:$PATH" cmake -S "$LLAMA_SRC" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "$@" > "$dir.configure.log" 2>&1 \
    || { say "configure failed: $dir.configure.log"; tail -20 "$dir.configure.log" >&2; exit 1; }
  grep -E "glslc|cooperative|bfloat16|integer_dot" "$dir.configure.log" | sed 's/^/  /' >&2 || true
  say "building $dir (test-backend-ops, llama-bench; log $dir.build.log)"
  PATH="$VENV/bin:$PATH" cmake --build "$dir" -j"$JOBS" --target test-backend-ops llama-bench \
    > "$dir.build.log" 2>&1 || { say "build failed: $dir.build.log"; tail -20 "$dir.build.log" >&2; exit 1; }
}

build() {
  sources
  mkdir -p "$(dirname "$BUILD")"
  if [[ " $BACKENDS " == *" vulkan "* ]]; then
    headers
    configure_build "$BUILD-vulkan" -DGGML_VULKAN=ON ${VULKAN_INCLUDE:+-DVulkan_INCLUDE_DIR="$VULKAN_INCLUDE"}
  fi
  if [[ " $BACKENDS " == *" cuda "* ]]; then
    if command -v nvcc > /dev/null; then
      configure_build "$BUILD-cuda" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH"
    else
      say "no nvcc: no CUDA build"
    fi
  fi
  if command -v cargo > /dev/null; then
    cargo build --release -p transformer-gpu --example kernels
  else
    say "no cargo: our example must be carried ($KERNELS)"
  fi
}

run() {
  mkdir -p "$OUT_DIR"
  [ -x "$KERNELS" ] || { say "no $KERNELS: run 'gpu.sh build' (or set KERNELS)"; exit 1; }
  local args=(--json)
  [ -n "${SHAPES:-}" ] && args+=(--shapes "$SHAPES")
  [ -n "${ADAPTER:-}" ] && args+=(--adapter "$ADAPTER")
  say "ours: $KERNELS ${args[*]}"
  "$KERNELS" "${args[@]}" > "$OUT_DIR/ours.json"
  local header=${GGML_H:-$LLAMA_SRC/ggml/include/ggml.h}
  [ -f "$header" ] || { say "no ggml.h (looked in $LLAMA_SRC): set LLAMA_SRC or GGML_H"; exit 1; }
  python3 "$HERE/gpu_compare.py" cases "$OUT_DIR/ours.json" "$header" > "$OUT_DIR/cases.txt"
  # llama.cpp's Vulkan backend passes over software devices (lavapipe) unless named.
  if [ -z "${GGML_VK_VISIBLE_DEVICES:-}" ] && python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["adapter"]["kind"] != "cpu")' "$OUT_DIR/ours.json"; then
    say "a software adapter: GGML_VK_VISIBLE_DEVICES=0 so that llama.cpp uses it too"
    export GGML_VK_VISIBLE_DEVICES=0
  fi
  local logs=() filter=()
  [ -n "$CASES" ] && filter=(-p "$CASES")
  for b in vulkan cuda; do
    local bin=$BUILD-$b/bin/test-backend-ops
    [ -x "$bin" ] || continue
    local dev=$VK_DEVICE
    [ "$b" = cuda ] && dev=CUDA0
    say "llama.cpp $b ($dev): test-backend-ops perf on $(wc -l < "$OUT_DIR/cases.txt") cases"
    : > "$OUT_DIR/$b.log"
    # Attention apart: its cases crashed test-backend-ops on lavapipe (heap corruption), which
    # must not take the other results with it; line-buffered so a crash keeps what was printed.
    for part in other attn; do
      local file=$OUT_DIR/cases-$part.txt
      if [ $part = attn ]; then
        grep -E ' [^ ]+/(flash_attn|paged_attn)[^ ]*$' "$OUT_DIR/cases.txt" > "$file" || true
      else
        grep -vE ' [^ ]+/(flash_attn|paged_attn)[^ ]*$' "$OUT_DIR/cases.txt" > "$file" || true
      fi
      [ -s "$file" ] || continue
      LD_LIBRARY_PATH="$BUILD-$b/bin:$BUILD-$b:${LD_LIBRARY_PATH:-}" stdbuf -oL "$bin" perf -b "$dev" \
        --test-file "$file" "${filter[@]}" >> "$OUT_DIR/$b.log" 2>&1 \
        || say "test-backend-ops ($b, $part cases) failed: $OUT_DIR/$b.log"
    done
    logs+=("$b=$OUT_DIR/$b.log")
  done
  [ ${#logs[@]} -gt 0 ] || say "no llama.cpp build in $BUILD: ours alone"
  python3 "$HERE/gpu_compare.py" table "$OUT_DIR/ours.json" "${logs[@]}" | tee "$OUT_DIR/table.txt"
  models
}

# (d) Whole models: `transformer bench --generate MODEL --device gpu` (prompt 512, decode 128,
# greedy, the arg-max on the device) against `llama-bench -p 512 -n 128 -ngl 99` of each built
# backend on the same GGUF, ROUNDS interleaved rounds, medians and ratios (gpu_compare.py models).
# The server at 1/16/64 clients is not compared: `serve` does not run on a GPU yet.
models() {
  [ -n "${MODEL:-}" ] || { say "MODEL unset: no whole-model comparison"; return 0; }
  local ours=${OURS:-target/release/transformer}
  [ -x "$ours" ] || { say "no $ours (cargo build --release, or set OURS): no whole-model comparison"; return 0; }
  local rounds=${ROUNDS:-3}
  : > "$OUT_DIR/ours-model.jsonl"
  rm -f "$OUT_DIR"/llama-bench-*.json
  for r in $(seq 1 "$rounds"); do
    "$ours" bench --generate "$MODEL" --device gpu${ADAPTER:+:$ADAPTER} --prompt-tokens "${PROMPT_TOKENS:-512}" \
      --new-tokens "${NEW_TOKENS:-128}" --warmup-steps 1 --steps 1 --json >> "$OUT_DIR/ours-model.jsonl"
    for b in vulkan cuda; do
      local bench=$BUILD-$b/bin/llama-bench
      [ -x "$bench" ] || continue
      LD_LIBRARY_PATH="$BUILD-$b/bin:$BUILD-$b:${LD_LIBRARY_PATH:-}" "$bench" -m "$MODEL" -p "${PROMPT_TOKENS:-512}" -n "${NEW_TOKENS:-128}" \
        -ngl 99 -r 1 -o json > "$OUT_DIR/llama-bench-$b-$r.json" || say "llama-bench ($b) failed"
    done
  done
  python3 "$HERE/gpu_compare.py" models "$OUT_DIR" | tee "$OUT_DIR/models.txt"
}

# Copies what a lent GPU machine needs into .gpu-carry/ (ignored through .git/info/exclude):
# test-backend-ops, llama-bench and the ggml libraries of each build, our example, ggml.h; all
# stripped. Then name .gpu-carry (and .gl, the Vulkan loader: /work/.library/device/README.md)
# in the run's carry and run the command it prints.
pack() {
  local dir=$ROOT/.gpu-carry
  rm -rf "$dir"
  mkdir -p "$dir"
  for b in vulkan cuda; do
    [ -x "$BUILD-$b/bin/test-backend-ops" ] || continue
    mkdir -p "$dir/llama-$b/bin"
    cp "$BUILD-$b/bin/test-backend-ops" "$dir/llama-$b/bin/"
    if [ -x "$BUILD-$b/bin/llama-bench" ]; then cp "$BUILD-$b/bin/llama-bench" "$dir/llama-$b/bin/"; fi
    find "$BUILD-$b" -maxdepth 2 -name 'lib*.so*' -exec cp -a {} "$dir/llama-$b/bin/" \;
  done
  if [ -x "$KERNELS" ]; then cp "$KERNELS" "$dir/kernels"; fi
  # Our binary for the whole-model comparison (a GGUF must be carried too, within the carry's
  # 64 MiB: a small model, or one written on the machine).
  if [ -x "${OURS:-target/release/transformer}" ]; then cp "${OURS:-target/release/transformer}" "$dir/transformer"; fi
  cp "${GGML_H:-$LLAMA_SRC/ggml/include/ggml.h}" "$dir/ggml.h"
  find "$dir" -type f \( -name 'lib*.so*' -o -perm -u+x \) -exec strip --strip-unneeded {} \; 2> /dev/null || true
  local exclude
  exclude=$(git -C "$ROOT" rev-parse --git-path info/exclude 2> /dev/null || true)
  if [ -n "$exclude" ] && ! grep -qx '/.gpu-carry/' "$exclude" 2> /dev/null; then
    echo '/.gpu-carry/' >> "$exclude"
  fi
  du -sh "$dir" >&2
  cat >&2 << 'EOF'
gpu.sh: on the lent machine (carry: .gl .gpu-carry), one call:
  for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig;
  ls /usr/share/vulkan/icd.d/*nvidia* /etc/vulkan/icd.d/*nvidia* > /dev/null 2>&1 || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json;
  KERNELS=.gpu-carry/kernels OURS=.gpu-carry/transformer BUILD=.gpu-carry/llama GGML_H=.gpu-carry/ggml.h OUT_DIR=$OUT bash benches/compare/gpu.sh run   # MODEL=... for (d)
EOF
}

case $STEP in
  deps) deps ;;
  pack) pack ;;
  build) deps && build ;;
  run) run ;;
  all) deps && build && run ;;
  *) echo "usage: gpu.sh [deps|build|run|all|pack]" >&2; exit 2 ;;
esac
