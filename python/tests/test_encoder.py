"""all-MiniLM-L6-v2's sentence embeddings against sentence-transformers' (the reference of
tests/models/minilm.rs): cosine similarity > 0.99999 and every component within 1e-4."""

import numpy as np

import transformer
from conftest import read_json, shared_path


def test_minilm_embeddings_match_sentence_transformers():
    model = shared_path("models", "all-MiniLM-L6-v2")
    reference = read_json(shared_path("reference", "minilm", "reference.json"))
    sentences = [s["text"] for s in reference["sentences"]]
    want = np.array([s["embedding"] for s in reference["sentences"]], dtype=np.float64)
    encoder = transformer.Encoder(model)
    got = encoder.embed(sentences, batch_size=3)
    assert got.shape == (len(sentences), encoder.dim) == want.shape
    assert got.dtype == np.float32
    got = got.astype(np.float64)
    cosine = (got * want).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() > 0.99999, cosine
    assert float(np.abs(got - want).max()) < 1e-4
    # Empty input: an empty [0, d] array.
    assert encoder.embed([]).shape == (0, encoder.dim)
