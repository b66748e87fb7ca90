#!/usr/bin/env bash
# The official `openai` Python client and `langchain-openai` against `transformer serve`
# (tests/clients/openai_client.py, langchain_client.py): installs them into target/clients-venv
# once (cached), starts three servers on loopback
# (the tiny Llama of ../shared; the same with Qwen 2.5's chat template, for tools;
# all-MiniLM-L6-v2), runs the checks, stops the servers. Needs the binary built
# (target/debug/transformer, or $TRANSFORMER). Skips with a message when ../shared is absent.
set -euo pipefail
cd "$(dirname "$0")/../.."
shared=../shared
if [ ! -d "$shared/reference/hf-decoders/llama-tiny" ]; then
  echo "skipped: $shared/reference/hf-decoders/llama-tiny is absent"; exit 0
fi
bin=${TRANSFORMER:-target/debug/transformer}
venv=target/clients-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import langchain_openai" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet "openai>=1.50" "langchain-openai>=1.0"
fi
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
tiny=$(cd "$shared/reference/hf-decoders/llama-tiny" && pwd)
mkdir "$tmp/templated"
for f in generation_config.json model.safetensors tokenizer.json; do ln -s "$tiny/$f" "$tmp/templated/$f"; done
# Qwen's tool instructions need more than the tiny model's 256 positions (rotary: any length runs).
python3 - "$shared/reference/chat-templates/Qwen-Qwen2.5-7B-Instruct.jinja" "$tiny/config.json" "$tmp/templated" <<'PY'
import json, sys
template = open(sys.argv[1]).read()
json.dump({"chat_template": template, "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
          open(sys.argv[3] + "/tokenizer_config.json", "w"))
config = json.load(open(sys.argv[2]))
config["max_position_embeddings"] = 2048
json.dump(config, open(sys.argv[3] + "/config.json", "w"))
PY
start() { # model port
  # Every request names the model "m" (a name that is not served is a 404).
  "$bin" serve --model "$1" --addr "127.0.0.1:$2" --served-model-name m >"$tmp/$2.log" 2>&1 &
  pids+=($!)
}
start "$tiny" 18731
start "$tmp/templated" 18732
start "$shared/models/all-MiniLM-L6-v2" 18733
for port in 18731 18732 18733; do
  for _ in $(seq 1 300); do
    if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then break; fi
    sleep 0.2
  done
done
"$venv/bin/python" tests/clients/openai_client.py \
  http://127.0.0.1:18731/v1 http://127.0.0.1:18732/v1 http://127.0.0.1:18733/v1
"$venv/bin/python" tests/clients/langchain_client.py \
  http://127.0.0.1:18731/v1 http://127.0.0.1:18732/v1 http://127.0.0.1:18733/v1
