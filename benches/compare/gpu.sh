#!/usr/bin/env bash
# Our GPU kernels (gpu/examples/kernels.rs) and llama.cpp's (test-backend-ops perf) on the same
# shapes and the same adapter, side by side with the ratio; then (guarded) whole-model llama-bench.
#
#   bash benches/compare/gpu.sh [deps|build|run|all]        (default: all = deps, build, run)
#
#   deps   Vulkan headers, glslc and SPIRV-Headers for llama.cpp's Vulkan backend: Debian's
#          libvulkan-dev, glslc, spirv-headers, installed with apt-get when missing (as root or
#          through sudo, as .ci/vulkan.sh installs lavapipe). A machine without a network (the
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
#   JOBS       build jobs [nproc]
#   MODEL      a GGUF file for part (d) [none: skipped]
#
# On a lent GPU machine (no network; see /work/.library/device/README.md): build here, carry
# `target/llama-vulkan/bin` (binaries and libggml*.so; RPATH points to the build folder, so
# LD_LIBRARY_PATH is set below), `target/release/examples/kernels` and the Vulkan loader debs
# (.gl, per the README), then run `for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig;
# bash benches/compare/gpu.sh run`. If no driver is found there, export
# VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json. The CUDA build needs
# nvcc, which is there and not here: build it there (`JOBS=16 bash benches/compare/gpu.sh build`
# takes minutes of device time: ggml-cuda compiles slowly) or skip it.
set -euo pipefail
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
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
  configure_build "$BUILD-vulkan" -DGGML_VULKAN=ON
  if command -v nvcc > /dev/null; then
    configure_build "$BUILD-cuda" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH"
  else
    say "no nvcc: no CUDA build"
  fi
  cargo build --release -p transformer-gpu --example kernels
}

run() {
  mkdir -p "$OUT_DIR"
  [ -x "$KERNELS" ] || { say "no $KERNELS: run 'gpu.sh build' (or set KERNELS)"; exit 1; }
  local args=(--json)
  [ -n "${SHAPES:-}" ] && args+=(--shapes "$SHAPES")
  [ -n "${ADAPTER:-}" ] && args+=(--adapter "$ADAPTER")
  say "ours: $KERNELS ${args[*]}"
  "$KERNELS" "${args[@]}" > "$OUT_DIR/ours.json"
  local header=$LLAMA_SRC/ggml/include/ggml.h
  [ -f "$header" ] || { say "no ggml.h (looked in $LLAMA_SRC): set LLAMA_SRC"; exit 1; }
  python3 "$HERE/gpu_compare.py" cases "$OUT_DIR/ours.json" "$header" > "$OUT_DIR/cases.txt"
  local logs=() filter=()
  [ -n "$CASES" ] && filter=(-p "$CASES")
  for b in vulkan cuda; do
    local bin=$BUILD-$b/bin/test-backend-ops
    [ -x "$bin" ] || continue
    local dev=$VK_DEVICE
    [ "$b" = cuda ] && dev=CUDA0
    say "llama.cpp $b ($dev): test-backend-ops perf on $(wc -l < "$OUT_DIR/cases.txt") cases"
    LD_LIBRARY_PATH="$BUILD-$b/bin:$BUILD-$b:${LD_LIBRARY_PATH:-}" "$bin" perf -b "$dev" \
      --test-file "$OUT_DIR/cases.txt" "${filter[@]}" > "$OUT_DIR/$b.log" 2>&1 \
      || say "test-backend-ops ($b) failed: $OUT_DIR/$b.log"
    logs+=("$b=$OUT_DIR/$b.log")
  done
  [ ${#logs[@]} -gt 0 ] || say "no llama.cpp build in $BUILD: ours alone"
  python3 "$HERE/gpu_compare.py" table "$OUT_DIR/ours.json" "${logs[@]}" | tee "$OUT_DIR/table.txt"
  models
}

# (d) Whole models: when `--device gpu` runs models, `transformer bench --generate --device gpu`
# against `llama-bench -p 512 -n 128 -ngl 99` on the same GGUF. Guarded: exits with a message
# until the CLI has it.
models() {
  [ -n "${MODEL:-}" ] || { say "MODEL unset: no whole-model comparison"; return 0; }
  local ours=target/release/transformer
  if ! { [ -x "$ours" ] && "$ours" bench --help 2>&1 | grep -q -- '--device'; }; then
    say "whole models: \`transformer bench --device gpu\` does not run models yet (only the kernels" \
      "exist); llama-bench -p 512 -n 128 alone would compare nothing. Skipped."
    return 0
  fi
  for b in vulkan cuda; do
    local bench=$BUILD-$b/bin/llama-bench
    [ -x "$bench" ] || continue
    LD_LIBRARY_PATH="$BUILD-$b/bin:$BUILD-$b:${LD_LIBRARY_PATH:-}" "$bench" -m "$MODEL" -p 512 -n 128 -ngl 99 -o md \
      | tee "$OUT_DIR/llama-bench-$b.md"
  done
  "$ours" bench --generate --device gpu --model "$MODEL" --prompt-tokens 512 --new-tokens 128 \
    | tee "$OUT_DIR/ours-model.txt"
}

case $STEP in
  deps) deps ;;
  build) deps && build ;;
  run) run ;;
  all) deps && build && run ;;
  *) echo "usage: gpu.sh [deps|build|run|all]" >&2; exit 2 ;;
esac
