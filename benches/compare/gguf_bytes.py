#!/usr/bin/env python3
"""The bytes of a GGUF file's tensors, and the bytes a decode step reads: every tensor but the
token embedding when the file has a separate output head (an untied embedding is only gathered,
one row a token; a tied one is the head and is read whole). Standard library only.

usage: gguf_bytes.py FILE.gguf   -> {"file", "tensor_bytes", "read_per_token", "tensors"}
"""
import json
import os
import struct
import sys

SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def main(path):
    with open(path, "rb") as f:
        def read(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]

        def string():
            return f.read(read("Q")).decode("utf-8", "replace")

        def value(kind):
            if kind in SCALARS:
                return read(SCALARS[kind])
            if kind == 8:
                return string()
            if kind == 9:
                inner, n = read("I"), read("Q")
                if inner in SCALARS:  # skip a scalar array without decoding it
                    f.seek(n * struct.calcsize("<" + SCALARS[inner]), 1)
                    return None
                return [value(inner) for _ in range(n)]
            raise SystemExit(f"{path}: unknown GGUF value type {kind}")

        if f.read(4) != b"GGUF":
            raise SystemExit(f"{path}: not a GGUF file")
        version, n_tensors, n_kv = read("I"), read("Q"), read("Q")
        if version < 2:
            raise SystemExit(f"{path}: GGUF version {version} is not supported")
        alignment = 32
        for _ in range(n_kv):
            key = string()
            v = value(read("I"))
            if key == "general.alignment":
                alignment = v
        tensors = []
        for _ in range(n_tensors):
            name = string()
            dims = [read("Q") for _ in range(read("I"))]
            read("I")  # ggml type
            tensors.append((read("Q"), name))
        start = f.tell()
        start += -start % alignment
    data = os.path.getsize(path) - start
    tensors.sort()
    sizes = {name: (tensors[i + 1][0] if i + 1 < len(tensors) else data) - off
             for i, (off, name) in enumerate(tensors)}
    total = sum(sizes.values())
    read_per_token = total - (sizes.get("token_embd.weight", 0) if "output.weight" in sizes else 0)
    print(json.dumps({"file": os.path.basename(path), "tensor_bytes": total,
                      "read_per_token": read_per_token, "tensors": len(sizes)}))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: gguf_bytes.py FILE.gguf")
    main(sys.argv[1])
