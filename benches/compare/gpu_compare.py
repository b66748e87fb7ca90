#!/usr/bin/env python3
"""The two halves of benches/compare/gpu.sh that need a language: llama.cpp cases at our shapes,
and the side-by-side table.

  gpu_compare.py cases OURS.json GGML_H > cases.txt
      One `test-backend-ops --test-file` line per kernel that `kernels --json` timed (the format
      that test-backend-ops' make_test_cases_from_file reads: op, type, ne[4], op params, sources
      with type, ne[4], nb[4] (zeros: contiguous), name). The op and type numbers are read from
      the ggml.h of the sources being built, so they follow the version. Each case is named after
      our row (model/kernel/format/m/k/n), which test-backend-ops prints back as `name=...`.

  gpu_compare.py table OURS.json LABEL=LOG [LABEL=LOG ...]
      Joins our rows with the `test-backend-ops perf` console logs by that name and prints
      µs/call side by side with ours / theirs (below 1: ours is faster).

What is compared (the same shapes; where the work differs, the note column says how):
  mul_mat   GGML_OP_MUL_MAT of the weight in its type by f32 activations [k, n] (llama.cpp
            quantizes the activations to q8_1 for its integer-dot paths inside the op).
  rms_norm  GGML_OP_RMS_NORM of [d, n]: without the weight multiply our kernel also does.
  rope      GGML_OP_ROPE, NEOX mode (our half-split pairs), theta of the model.
  swiglu    GGML_OP_GLU SWIGLU with split gate and up.
  argmax    GGML_OP_ARGMAX of one row of the vocabulary.
  flash_attn prefill full   GGML_OP_FLASH_ATTN_EXT, 512 queries x 512 keys, f16 K and V with an f16
            mask (random: hides nothing), against ours unmasked (f32 K and V).
  paged_attn decode   GGML_OP_FLASH_ATTN_EXT of 1 query against ctx keys (f16 K/V, contiguous
            cache) against our paged attention (f32 K/V in blocks of 16): ours reads twice the
            bytes.
"""
import json
import re
import struct
import sys

MODELS = {
    # key: (d, ffn, vocab, heads, kv_heads, d_head, rope theta)
    "smol": (576, 1536, 49152, 9, 3, 64, 100000.0),
    "1b": (2048, 8192, 128256, 32, 8, 64, 500000.0),
    "8b": (4096, 14336, 128256, 32, 8, 128, 500000.0),
}


def enums(header):
    """ggml_type (explicit values), ggml_op and ggml_glu_op (sequential) from ggml.h."""
    text = open(header, encoding="utf-8").read()

    def block(name):
        m = re.search(r"enum\s+" + name + r"\s*\{(.*?)\};", text, re.S)
        if not m:
            sys.exit(f"gpu_compare: enum {name} not found in {header}")
        return re.sub(r"//[^\n]*", "", m.group(1))

    types = {k: int(v) for k, v in re.findall(r"GGML_TYPE_(\w+)\s*=\s*(\d+)", block("ggml_type"))}
    ops, i = {}, 0
    for name, value in re.findall(r"GGML_OP_(\w+)\s*(?:=\s*(\d+))?\s*,", block("ggml_op")):
        i = int(value) if value else i
        ops[name] = i
        i += 1
    glu = {}
    for i, name in enumerate(re.findall(r"GGML_GLU_OP_(\w+)\s*,", block("ggml_glu_op"))):
        glu[name] = i
    return types, ops, glu


def f32_bits(x):
    return struct.unpack("<i", struct.pack("<f", x))[0]


def key(row):
    kernel = row["kernel"].replace(" ", "_")
    return f"{row['model']}/{kernel}/{row['format']}/m{row['m']}/k{row['k']}/n{row['n']}"


def cases(ours_path, header):
    types, ops, glu = enums(header)
    ours = json.load(open(ours_path, encoding="utf-8"))
    fmt = {"Q4_K": "Q4_K", "Q6_K": "Q6_K", "Q8_0": "Q8_0", "Q4_0": "Q4_0", "F16": "F16", "F32": "F32"}

    def src(t, ne):
        return [types[t], *ne, 0, 0, 0, 0]

    out = []
    for r in ours["kernels"]:
        if r["skipped"] is not None:
            continue
        d, ffn, vocab, heads, kv_heads, d_head, theta = MODELS[r["model"]]
        kernel, m, k, n = r["kernel"], r["m"], r["k"], r["n"]
        if kernel.startswith("mul_mat"):
            line = [ops["MUL_MAT"], types["F32"], m, n, 1, 1, 0, 2]
            line += src(fmt[r["format"]], [k, m, 1, 1]) + src("F32", [k, n, 1, 1])
        elif kernel == "rms_norm":
            line = [ops["RMS_NORM"], types["F32"], d, n, 1, 1, 1, f32_bits(1e-5), 1]
            line += src("F32", [d, n, 1, 1])
        elif kernel == "rope":
            params = [0, d_head, 2, 0, 0, f32_bits(theta), f32_bits(1.0), f32_bits(0.0),
                      f32_bits(1.0), f32_bits(32.0), f32_bits(1.0), 0, 0, 0, 0, 0]
            line = [ops["ROPE"], types["F32"], d_head, heads, n, 1, len(params), *params, 2]
            line += src("F32", [d_head, heads, n, 1]) + src("I32", [n, 1, 1, 1])
        elif kernel == "swiglu":
            line = [ops["GLU"], types["F32"], ffn, n, 1, 1, 2, glu["SWIGLU"], 0, 2]
            line += src("F32", [ffn, n, 1, 1]) + src("F32", [ffn, n, 1, 1])
        elif kernel == "argmax":
            line = [ops["ARGMAX"], types["I32"], 1, 1, 1, 1, 0, 1] + src("F32", [vocab, 1, 1, 1])
        elif kernel in ("flash_attn prefill full", "paged_attn decode"):
            q = 512 if kernel.startswith("flash") else 1
            kv = 512 if kernel.startswith("flash") else m
            params = [f32_bits(1.0 / d_head ** 0.5), f32_bits(0.0), f32_bits(0.0), 0]
            line = [ops["FLASH_ATTN_EXT"], types["F32"], d_head, heads, q, 1, len(params), *params, 4]
            line += src("F32", [d_head, q, heads, 1])
            line += src("F16", [d_head, kv, kv_heads, 1]) + src("F16", [d_head, kv, kv_heads, 1])
            line += src("F16", [kv, q, 1, 1])
        else:
            continue
        out.append(" ".join(str(v) for v in line) + " " + key(r))
    print("\n".join(out))


LINE = re.compile(r"^\s+(\w+)\((.*)\):\s+(?:(\d+) runs - \s*([\d.]+) us/run|(not supported))")


def parse_log(path):
    """name -> µs/run (None: not supported) from a test-backend-ops perf console log."""
    found = {}
    for raw in open(path, encoding="utf-8", errors="replace"):
        m = LINE.match(re.sub(r"\x1b\[[0-9;]*m", "", raw))
        if not m:
            continue
        name = re.search(r"name=([^,)]+)", m.group(2))
        if name:
            found[name.group(1)] = None if m.group(5) else float(m.group(4))
    return found


NOTES = {
    "rms_norm": "theirs without the weight multiply",
    "flash_attn prefill full": "theirs f16 K/V",
    "paged_attn decode": "theirs f16 K/V, contiguous",
}


def table(ours_path, logs):
    ours = json.load(open(ours_path, encoding="utf-8"))
    theirs = []
    for spec in logs:
        label, _, path = spec.partition("=")
        theirs.append((label, parse_log(path)))
    print(f"adapter (ours): {ours['adapter']['name']} ({ours['adapter']['kind']}); ours timed by "
          f"{ours['timing']}; theirs by test-backend-ops perf (wall time of a graph of repeats)")
    head = f"{'model':<5} {'kernel':<24} {'format':<5} {'m':>7} {'k':>6} {'n':>4} {'ours µs':>10}"
    for label, _ in theirs:
        head += f" {label + ' µs':>14} {'ours/' + label:>12}"
    print(head + "  note")
    for r in ours["kernels"]:
        line = (f"{r['model']:<5} {r['kernel']:<24} {r['format']:<5} {r['m']:>7} {r['k']:>6} "
                f"{r['n']:>4} ")
        if r["skipped"] is not None:
            print(line + f"{'-':>10}  {r['skipped']}")
            continue
        line += f"{r['us']:>10.1f}"
        for _, found in theirs:
            t = found.get(key(r), "absent")
            if t == "absent":
                line += f" {'-':>14} {'-':>12}"
            elif t is None:
                line += f" {'unsupported':>14} {'-':>12}"
            else:
                line += f" {t:>14.1f} {r['us'] / t:>12.2f}"
        print(line + "  " + NOTES.get(r["kernel"], ""))
    for s in ours.get("decode_steps", []):
        print(f"decode step {s['model']}: {s['dispatches_per_layer']} dispatches per layer, "
              f"{s['dispatches_per_step']} per step, {s['submissions_per_step']} submission(s), "
              f"{s['bytes_up_per_step']} B up / {s['bytes_down_per_step']} B down, "
              f"{s['step_ms']:.3f} ms; device memory "
              f"{(s['weight_bytes'] + s['kv_bytes'] + s['other_bytes']) / 1e6:.1f} MB for "
              f"{s['weight_bytes'] / 1e6:.1f} MB of weights")


def models(out_dir):
    """Whole models: ours (`bench --generate --device gpu --json`, one line a round) against
    llama-bench (`-o json`, one file a backend and round): medians of prompt and decode tokens/s
    and ours / theirs (above 1: ours faster)."""
    import glob
    import statistics

    ours = [json.loads(l) for l in open(f"{out_dir}/ours-model.jsonl") if l.strip()]
    rows = [("ours", statistics.median(o["prefill_tps"][0] for o in ours),
             statistics.median(o["decode_tps"][0] for o in ours))]
    for backend in ("vulkan", "cuda"):
        runs = sorted(glob.glob(f"{out_dir}/llama-bench-{backend}-*.json"))
        if not runs:
            continue
        pp, tg = [], []
        for path in runs:
            for entry in json.load(open(path)):
                if entry.get("n_prompt", 0) > 0 and entry.get("n_gen", 0) == 0:
                    pp.append(entry["avg_ts"])
                elif entry.get("n_gen", 0) > 0 and entry.get("n_prompt", 0) == 0:
                    tg.append(entry["avg_ts"])
        if pp and tg:
            rows.append((f"llama.cpp {backend}", statistics.median(pp), statistics.median(tg)))
    device = ours[0].get("gpu", {}).get("adapter", "?") if ours else "?"
    print(f"device: {device}; {len(ours)} rounds, medians")
    print(f"{'impl':<18} {'prompt tok/s':>13} {'decode tok/s':>13} {'ours/theirs prompt':>19} {'ours/theirs decode':>19}")
    for name, p, d in rows:
        ratio = ("", "") if name == "ours" else (f"{rows[0][1] / p:.2f}", f"{rows[0][2] / d:.2f}")
        print(f"{name:<18} {p:>13.1f} {d:>13.1f} {ratio[0]:>19} {ratio[1]:>19}")


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "cases":
        cases(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 3 and sys.argv[1] == "table":
        table(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) == 3 and sys.argv[1] == "models":
        models(sys.argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
