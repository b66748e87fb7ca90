"""Shared helpers: where ../shared is (skipping with a reason when it is absent) and a reader
of safetensors files in plain NumPy (the reference logits)."""

import json
import struct
from pathlib import Path

import numpy as np
import pytest

# The repository root is two levels up (python/tests/); the reference data sits beside it, as
# the Rust tests read it.
ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"


def shared_path(*parts: str) -> Path:
    """A path inside ../shared, or a skip naming what is missing."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"skipped: {path} is absent (../shared holds the reference models and data)")
    return path


def read_safetensors(path: Path) -> dict:
    """Every float32 tensor of a safetensors file, as NumPy arrays of their shapes."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    body = data[8 + n :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", f"{name}: {info['dtype']}"
        start, end = info["data_offsets"]
        tensors[name] = np.frombuffer(body[start:end], dtype="<f4").reshape(info["shape"])
    return tensors


def read_json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))
