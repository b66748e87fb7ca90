#!/usr/bin/env python3
"""Compares two output directories of tests/golden/golden.sh (usually: the base binary's and a
refactored binary's). Usage: compare.py DIR_A DIR_B (or golden.sh --compare DIR_A DIR_B).

Every file listed in either SHA256SUMS is reported as identical, DIFFERENT, MISSING in B or NEW
in B (written only by the second binary: reported, not a failure); a difference is explained
where the format allows:
  metrics.jsonl   which fields differ, at which steps, by how much (timing fields elapsed_s and
                  tokens_per_s are ignored: the hashed copies under filtered/ have none)
  *.safetensors   which tensors differ and the largest absolute difference
  text files      a unified diff (first 12 lines)
Raw stderr (NAME.err) and raw metrics.jsonl hold timings and are not hashed; their filtered
copies under filtered/ are. Exit status: 0 when every hashed file of A is identical in B, 1
otherwise.
Python 3 standard library only.
"""

import array
import difflib
import hashlib
import json
import os
import struct
import sys

TIMING_FIELDS = {"elapsed_s", "tokens_per_s"}
TEXT_SUFFIXES = (".out", ".err", ".txt", ".tsv", ".json", ".jsonl", ".svg", ".cmd")


def read_sums(d):
    """The files listed in d/SHA256SUMS with the sha256 of their current contents (a file
    changed after golden.sh wrote the list is compared as it is now, with a warning)."""
    path = os.path.join(d, "SHA256SUMS")
    sums = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            digest, name = line.rstrip("\n").split(None, 1)
            name = name.lstrip("*")
            p = os.path.join(d, name)
            if not os.path.exists(p):
                print(f"warning: {p} is listed in SHA256SUMS but absent")
                continue
            with open(p, "rb") as g:
                now = hashlib.sha256(g.read()).hexdigest()
            if now != digest:
                print(f"warning: {p} changed since SHA256SUMS was written")
            sums[name] = now
    return sums


def rel_diff(a, b):
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def explain_metrics(pa, pb):
    def records(p):
        with open(p, encoding="utf-8") as f:
            return [json.loads(l) for l in f if l.strip()]

    ra, rb = records(pa), records(pb)
    out = []
    if len(ra) != len(rb):
        out.append(f"{len(ra)} vs {len(rb)} records")
    fields = {}  # field -> [first step, count, max relative difference]
    for a, b in zip(ra, rb):
        step = a.get("step", "?")
        for k in sorted(set(a) | set(b)):
            if k in TIMING_FIELDS:
                continue
            va, vb = a.get(k), b.get(k)
            if va != vb:
                e = fields.setdefault(k, [step, 0, 0.0])
                e[1] += 1
                if isinstance(va, (int, float)) and isinstance(vb, (int, float)):
                    e[2] = max(e[2], rel_diff(float(va), float(vb)))
                else:
                    e[2] = float("inf")
    for k, (first, n, rd) in fields.items():
        out.append(f"field {k}: differs in {n} records, first at step {first}, "
                   f"max relative difference {rd:.3g}")
    if not out:
        out.append("no difference outside the timing fields")
    return out


def read_safetensors(p):
    with open(p, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return header, data


def explain_safetensors(pa, pb):
    ha, da = read_safetensors(pa)
    hb, db = read_safetensors(pb)
    out = []
    only = sorted(set(ha) ^ set(hb))
    if only:
        out.append(f"tensors on one side only: {', '.join(only[:10])}")
    n_diff, worst = 0, (0.0, None)
    for name in sorted(set(ha) & set(hb)):
        ta, tb = ha[name], hb[name]
        if ta["dtype"] != tb["dtype"] or ta["shape"] != tb["shape"]:
            out.append(f"{name}: {ta['dtype']}{ta['shape']} vs {tb['dtype']}{tb['shape']}")
            n_diff += 1
            continue
        ba = da[ta["data_offsets"][0]:ta["data_offsets"][1]]
        bb = db[tb["data_offsets"][0]:tb["data_offsets"][1]]
        if ba == bb:
            continue
        n_diff += 1
        if ta["dtype"] == "F32":
            xa, xb = array.array("f", ba), array.array("f", bb)
            m = max(abs(x - y) for x, y in zip(xa, xb))
            k = sum(1 for x, y in zip(xa, xb) if x != y)
            if m >= worst[0]:
                worst = (m, name)
            if n_diff <= 8:
                out.append(f"{name}: {k}/{len(xa)} values differ, max |diff| {m:.3g}")
        elif n_diff <= 8:
            out.append(f"{name}: bytes differ")
    out.append(f"{n_diff} of {len(set(ha) & set(hb))} tensors differ"
               + (f" (largest |diff| {worst[0]:.3g} in {worst[1]})" if worst[1] else ""))
    if set(ha) == set(hb) and n_diff == 0:
        out.append("same tensors, the header or layout differs")
    return out


def explain_text(pa, pb):
    with open(pa, encoding="utf-8", errors="replace") as f:
        la = f.read().split("\n")
    with open(pb, encoding="utf-8", errors="replace") as f:
        lb = f.read().split("\n")
    changed = sum(1 for op in difflib.SequenceMatcher(None, la, lb, autojunk=False).get_opcodes()
                  if op[0] != "equal")
    out = [f"{len(la)} vs {len(lb)} lines, {changed} changed region(s); diff (A -, B +):"]
    diff = [l[:200] for l in difflib.unified_diff(la, lb, "A", "B", n=0, lineterm="")][2:]
    out += ["  " + l for l in diff[:12]]
    if len(diff) > 12:
        out.append(f"  ... {len(diff) - 12} more diff lines")
    return out


def explain(pa, pb, name):
    try:
        if name.endswith("metrics.jsonl"):
            return explain_metrics(pa, pb)
        if name.endswith(".safetensors"):
            return explain_safetensors(pa, pb)
        if name.endswith(TEXT_SUFFIXES):
            return explain_text(pa, pb)
        return [f"{os.path.getsize(pa)} vs {os.path.getsize(pb)} bytes"]
    except Exception as e:  # an explanation must never hide the verdict
        return [f"(no details: {e})"]


def same_file(p, q):
    with open(p, "rb") as f, open(q, "rb") as g:
        return f.read() == g.read()


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    a, b = sys.argv[1], sys.argv[2]
    sa, sb = read_sums(a), read_sums(b)
    n_same, bad, new = 0, [], []
    for name in sorted(set(sa) | set(sb)):
        if name not in sb:
            print(f"MISSING in B  {name}")
            bad.append(name)
        elif name not in sa:
            # An output the first binary did not write (e.g. a new metrics file): reported, but
            # not a difference of an existing output.
            print(f"NEW in B   {name}")
            new.append(name)
        elif sa[name] == sb[name]:
            print(f"identical  {name}")
            n_same += 1
        else:
            print(f"DIFFERENT  {name}")
            for line in explain(os.path.join(a, name), os.path.join(b, name), name):
                print(f"           {line}")
            bad.append(name)

    # Not hashed (timings): the raw metrics are still compared without their timing fields.
    for root, _, files in os.walk(a):
        if "metrics.jsonl" in files and "/filtered" not in root.replace(a, "", 1):
            rel = os.path.relpath(os.path.join(root, "metrics.jsonl"), a)
            pb = os.path.join(b, rel)
            if os.path.exists(pb):
                diff = explain_metrics(os.path.join(a, rel), pb)
                if diff != ["no difference outside the timing fields"]:
                    print(f"DIFFERENT  {rel} (raw, timing fields ignored): " + "; ".join(diff))
                    bad.append(rel)

    # Resuming from the step-200 checkpoint should end where the uninterrupted run ended.
    for d, label in ((a, "A"), (b, "B")):
        p, q = (os.path.join(d, x, "model.safetensors") for x in ("deen", "deen-resumed"))
        if os.path.exists(p) and os.path.exists(q):
            verdict = "bit-identical" if same_file(p, q) else "DIFFERENT"
            print(f"note: {label}: deen-resumed/model.safetensors vs deen/: {verdict}")

    print(f"\n{n_same} identical, {len(bad)} different or missing, {len(new)} new in B "
          f"({len(set(sa) | set(sb))} hashed files)")
    if bad:
        print("FAIL: " + ", ".join(bad[:20]) + (" ..." if len(bad) > 20 else ""))
        return 1
    print("OK: every deterministic output is bit-identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
