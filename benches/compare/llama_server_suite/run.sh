#!/usr/bin/env bash
# llama.cpp's own server test suite (tools/server/tests/unit of the llama.cpp sources vendored in
# the llama-cpp-python 0.3.36 source distribution), run unchanged against `transformer serve`
# through shim.py, which stands in for the llama-server binary. Prints pass/fail/skip counts per
# file, the applicable files first (NOT_APPLICABLE below says why the others are not).
#
#   bash benches/compare/llama_server_suite/run.sh [LLAMA_CPP_DIR] [pytest args...]
#
# LLAMA_CPP_DIR: where ../shared/tools/llama-cpp.sh unpacked the sources (default
# $TMPDIR/llama-cpp, as that script). A venv with the suite's requirements is made once under
# LLAMA_CPP_DIR/suite/venv (PyPI). TRANSFORMER_BIN picks the binary (default target/debug/
# transformer). FILES="test_basic.py ..." runs those files only; ALL=1 runs the not applicable
# files too; FAILURES=1 lists each failure's first line. Results (junit XML, the log) go to LLAMA_CPP_DIR/suite/results.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
D=${1:-${TMPDIR:-/tmp}/llama-cpp}; shift || true
TESTS=$D/llama_cpp_python-0.3.36/vendor/llama.cpp/tools/server/tests
[ -d "$TESTS/unit" ] || { echo "no suite at $TESTS (run ../shared/tools/llama-cpp.sh $D first)" >&2; exit 1; }
export TRANSFORMER_BIN=${TRANSFORMER_BIN:-$ROOT/target/debug/transformer}
[ -x "$TRANSFORMER_BIN" ] || { echo "no binary at $TRANSFORMER_BIN (cargo build first)" >&2; exit 1; }

V=$D/suite/venv
if [ ! -x "$V/bin/pytest" ]; then
  python3 -m venv "$V"
  "$V/bin/pip" install -q -r "$TESTS/requirements.txt"
fi

# Files whose subject this server does not offer (a model kind, a mode or an API it lacks).
declare -A NOT_APPLICABLE=(
  [test_infill.py]="fill-in-the-middle (/infill) needs an infill model"
  [test_lora.py]="LoRA adapters"
  [test_rerank.py]="a reranking model (/rerank)"
  [test_speculative.py]="speculative decoding with a draft model"
  [test_vision_api.py]="multimodal (images) input"
  [test_router.py]="router mode: several models loaded and unloaded on demand"
  [test_mcp_servers.py]="MCP servers behind the router"
  [test_tools_builtin.py]="built-in server-side tools (--tools)"
  [test_stream.py]="resumable conversation streams of the router"
  [test_proxy.py]="the web UI's CORS proxy for MCP (--ui-mcp-proxy)"
  [test_slot_save.py]="saving and restoring slots' KV cache to files"
  [test_sleep.py]="unloading the model when idle (--sleep-idle-seconds)"
  [test_kv_keep_only_active.py]="moving idle slots' KV cache to host memory (--cache-ram)"
  [test_compat_gcp.py]="Vertex AI's prediction routes (AIP_MODE)"
)

cd "$TESTS"
files=()
if [ -n "${FILES:-}" ]; then
  for f in $FILES; do files+=("unit/$f"); done
else
  for f in unit/test_*.py; do
    name=$(basename "$f")
    if [ -n "${NOT_APPLICABLE[$name]:-}" ] && [ "${ALL:-0}" != 1 ]; then continue; fi
    files+=("$f")
  done
fi

OUT=${RESULTS:-$D/suite/results}; mkdir -p "$OUT"
# A port of its own (the suite's default 8080 is the usual one), slow tests off as in CI.
export PORT=${PORT:-18080} LLAMA_SERVER_BIN_PATH=$HERE/shim.py
echo "binary: $TRANSFORMER_BIN ($(stat -c %y "$TRANSFORMER_BIN" | cut -d. -f1)); files: ${#files[@]}; load: $(uptime | sed 's/.*load/load/')"
start=$(date +%s)
"$V/bin/pytest" -q -p no:cacheprovider -m "not slow" "${files[@]}" "$@" \
  --junitxml="$OUT/junit.xml" >"$OUT/log.txt" 2>&1 || true
echo "ran in $(( $(date +%s) - start )) s; log: $OUT/log.txt"
"$V/bin/python" "$HERE/summarize.py" "$OUT/junit.xml" \
  "$(for k in "${!NOT_APPLICABLE[@]}"; do echo "$k=${NOT_APPLICABLE[$k]}"; done)" ${FAILURES:+--failures}
if [ "${ALL:-0}" != 1 ] && [ -z "${FILES:-}" ]; then
  echo "not applicable, not run:"
  for k in $(printf '%s\n' "${!NOT_APPLICABLE[@]}" | sort); do printf '  %-28s %s\n' "$k" "${NOT_APPLICABLE[$k]}"; done
fi
