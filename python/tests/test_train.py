"""Short training runs from Python (a tiny language model and a tiny translation model): the
progress callback sees every update, the loss falls, and the saved directory loads in the
Generator / Translator."""

import math

import pytest

import transformer
from conftest import shared_path


def test_train_lm_tiny(tmp_path):
    text = shared_path("data", "en", "shakespeare.en.txt").read_text(encoding="utf-8")[:60_000]
    corpus = tmp_path / "text.txt"
    corpus.write_text(text, encoding="utf-8")
    out = tmp_path / "lm"
    events = []
    summary = transformer.train_lm(
        corpus, out, vocab_size=300, context=32, batch=8, d_model=32, n_heads=2, d_ff=64,
        layers=1, max_steps=30, warmup=5, lr=3e-3, eval_every=0, log_every=0, threads=1,
        progress=events.append,
    )
    steps = [e for e in events if e["event"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 31))
    assert summary["step"] == 30 and summary["valid_nll"] is not None
    first, last = steps[0]["loss"], sum(e["loss"] for e in steps[-5:]) / 5
    assert math.isfinite(last) and last < first - 0.5, (first, last)
    # The saved run is a model directory the Generator loads; an existing run is not
    # overwritten unless asked.
    g = transformer.Generator(out)
    assert g.vocab_size == 300
    assert isinstance(g.generate("ROMEO.", max_tokens=10, seed=3), str)
    with pytest.raises(ValueError, match="already holds a run"):
        transformer.train_lm(corpus, out, max_steps=1)


def test_train_translation_tiny(tmp_path):
    lines = shared_path("data", "de-en", "ding.train.tsv").read_text(encoding="utf-8").splitlines()
    data = tmp_path / "train.tsv"
    data.write_text("\n".join(lines[:300]) + "\n", encoding="utf-8")
    valid = tmp_path / "valid.tsv"
    valid.write_text("\n".join(lines[300:320]) + "\n", encoding="utf-8")
    out = tmp_path / "mt"
    losses = []
    summary = transformer.train(
        out, data, valid=valid, max_steps=4, tokens_per_batch=1000, warmup=2, threads=1,
        progress=lambda e: losses.append(e["loss"]) if e["event"] == "step" else None,
    )
    assert summary["step"] == 4 and len(losses) == 4
    assert summary["valid_loss"] is not None and math.isfinite(summary["valid_loss"])
    t = transformer.Translator(out, threads=1)
    sources = [lines[0].split("\t")[0], "", lines[1].split("\t")[0]]
    hyps = t.translate(sources, max_extra=5)
    assert len(hyps) == 3 and hyps[1] == "" and all(isinstance(h, str) for h in hyps)
    nbest = t.translate(sources[:1], beam=2, nbest=2, max_extra=5)
    assert len(nbest) == 1 and 1 <= len(nbest[0]) <= 2
    assert all(isinstance(score, float) and isinstance(text, str) for score, text in nbest[0])
    scores = t.score([sources[0]], [lines[0].split("\t")[1]])
    assert len(scores) == 1 and scores[0] < 0
    with pytest.raises(ValueError, match="nbest=3"):
        t.translate(sources, beam=2, nbest=3)


def test_progress_exception_is_raised_after_the_run(tmp_path):
    corpus = tmp_path / "t.txt"
    corpus.write_text("to be or not to be, that is the question. " * 200, encoding="utf-8")

    def fail(event):
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        transformer.train_lm(
            corpus, tmp_path / "out", vocab_size=260, context=16, batch=2, d_model=16,
            n_heads=2, d_ff=32, layers=1, max_steps=2, warmup=1, threads=1, progress=fail,
        )
