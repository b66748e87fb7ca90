#!/usr/bin/env python3
"""A stand-in for llama.cpp's `llama-server` binary: reads llama-server's command line, as
llama.cpp's own server test suite (tools/server/tests/utils.py) builds it, and runs
`transformer serve` in its place (exec, so the suite's SIGTERM reaches the server).

Any model argument (-m/--model, --hf-repo, --hf-file, --model-url, or none at all) serves
SmolLM2-135M-Instruct (../shared/models/...), except --embedding, which serves the sentence
encoder all-MiniLM-L6-v2 (our embeddings model). Flags with no counterpart are ignored, each
named on stderr. Where llama-server's defaults differ from ours (/metrics off without --metrics,
CORS open to any origin with credentials), the shim passes our flags for llama-server's
defaults. Environment:
  TRANSFORMER_BIN   the binary (default: target/debug/transformer of this checkout)
  SHIM_LM, SHIM_EMBEDDER   the models served (defaults above)
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
SHARED = os.path.normpath(os.path.join(ROOT, "..", "shared"))
LM = os.environ.get(
    "SHIM_LM",
    os.path.join(SHARED, "models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf"),
)
EMBEDDER = os.environ.get("SHIM_EMBEDDER", os.path.join(SHARED, "models/all-MiniLM-L6-v2"))
BIN = os.environ.get("TRANSFORMER_BIN", os.path.join(ROOT, "target/debug/transformer"))

# llama-server flag -> our flag (the value carried over).
WITH_VALUE = {
    "--port": "--port",
    "--host": "--host",
    "--api-key": "--api-key",
    "-t": "--threads",
    "--threads": "--threads",
    "-np": "--max-batch",
    "--parallel": "--max-batch",
    "-c": "--ctx-size",
    "--ctx-size": "--ctx-size",
    "-n": "--n-predict",
    "--n-predict": "--n-predict",
    "--alias": "--served-model-name",
    "--cors-origins": "--cors-origin",
    "--seed": "--seed",
    "--temp": "--temp",
}
# Model arguments: all replaced by the one model served.
MODEL_FLAGS = {"-m", "--model", "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-mu", "--model-url"}
# Switches we map.
SWITCHES = {
    "--no-slots": ["--no-slots"],
    "--slots": [],
    "--metrics": [],
    "--no-ui": ["--no-webui"],
    "--no-webui": ["--no-webui"],
    "--context-shift": ["--context-shift"],
    "--no-context-shift": [],
    "--cors-credentials": [],
    "--no-cors-credentials": [],
}
# Flags that take a value, ignored (named on stderr).
IGNORED_WITH_VALUE = {
    "-b", "--batch-size", "-ub", "--ubatch-size", "-ngl", "--n-gpu-layers", "--gpu-layers",
    "--pooling", "--tags", "-ctk", "--cache-type-k", "-ctv", "--cache-type-v", "-fa",
    "--flash-attn", "--slot-save-path", "--grp-attn-n", "--grp-attn-w", "--lora", "--spec-type",
    "--spec-draft-n-max", "--spec-draft-n-min", "--spec-synth-len", "--spec-synth-rates",
    "--reasoning-format", "--reasoning", "--chat-template", "--chat-template-file",
    "--mmproj-url", "--media-path", "--sleep-idle-seconds", "--cache-ram", "--tools",
    "--tools-runtime", "--mcp-servers-config", "--mcp-servers-json", "--models-dir",
    "--models-max", "--models-preset", "--model-draft", "-md",
}


def main(argv):
    out, ignored, embedding, ctx, parallel = [], [], False, None, None
    i = 0
    while i < len(argv):
        flag = argv[i]
        value = argv[i + 1] if i + 1 < len(argv) else None
        if flag in MODEL_FLAGS:
            i += 2
            continue
        if flag in WITH_VALUE and value is not None:
            if flag == "--host" and "," in value:
                ignored.append(f"{flag} {value} (one address: {value.split(',')[0]})")
                value = value.split(",")[0]
            if flag in ("-c", "--ctx-size"):
                ctx = int(value)
            if flag in ("-np", "--parallel"):
                parallel = int(value)
            if flag in ("-n", "--n-predict") and int(value) < 0:
                i += 2  # -1: until the end, our default
                continue
            if flag == "--alias":
                # llama.cpp takes a comma-separated list of aliases; we serve one name.
                value = value.split(",")[0]
            out += [WITH_VALUE[flag], value]
            i += 2
            continue
        if flag in SWITCHES:
            out += SWITCHES[flag]
            i += 1
            continue
        if flag == "--embedding" or flag == "--embeddings":
            embedding = True
            i += 1
            continue
        if flag in IGNORED_WITH_VALUE:
            ignored.append(f"{flag} {value}")
            i += 2
            continue
        ignored.append(flag)
        i += 1
    # llama-server's defaults where ours differ: /metrics only with --metrics; CORS open to
    # any origin (`*`), with credentials (the origin reflected) unless --no-cors-credentials.
    if "--metrics" not in argv:
        out.append("--no-metrics")
    if "--cors-origin" not in out:
        out += ["--cors-origin", "*"]
    if "--no-cors-credentials" not in argv:
        out.append("--cors-credentials")
    if ctx is not None:
        # llama.cpp's -c is the whole KV cache, split between the -np slots (1 by default):
        # what one sequence gets is our --ctx-size. With --kv-unified the slots share it, and
        # one sequence may use all of it.
        per_slot = ctx if "--kv-unified" in argv else ctx // (parallel or 1)
        out = strip(out, {"--ctx-size"}) + ["--ctx-size", str(per_slot)]
    model = EMBEDDER if embedding else LM
    args = [BIN, "serve", "--model", model]
    if not embedding and model.endswith(".gguf"):
        # The GGUF file's 4-bit blocks multiplied as stored, as llama-server does.
        args += ["--precision", "ggml"]
    known = our_flags()
    i = 0
    while i < len(out):
        flag, n = out[i], 1 if not out[i + 1:] or out[i + 1].startswith("--") else 2
        if flag not in known or (embedding and flag in ("--n-predict", "--seed", "--temp", "--ctx-size")):
            ignored.append(" ".join(out[i:i + n]) + " (not a flag of this build)")
        else:
            args += out[i:i + n]
        i += n
    if ignored:
        print("llama-server shim: ignored " + ", ".join(ignored), file=sys.stderr)
    print("llama-server shim: " + " ".join(args), file=sys.stderr)
    sys.stderr.flush()
    os.execv(BIN, args)


def our_flags():
    """The flags `transformer serve` of this build takes (from its --help)."""
    import re
    import subprocess

    text = subprocess.run([BIN, "serve", "--help"], capture_output=True, text=True).stdout
    return set(re.findall(r"--[a-z][a-z0-9-]*", text))


def strip(args, flags):
    kept, i = [], 0
    while i < len(args):
        if args[i] in flags:
            i += 2
            continue
        kept.append(args[i])
        i += 1
    return kept


if __name__ == "__main__":
    main(sys.argv[1:])
