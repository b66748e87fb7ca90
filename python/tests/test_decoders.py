"""Decoders against transformers' references, as tests/models/pretrained.rs checks them: the
small random Hugging Face Llama and GPT-2 (ids identical, logits at every position within
1e-4, greedy ids identical wherever the reference's margin exceeds 0.01), SmolLM2-135M from its
GGUF (last logits within 1e-3, its chat template), the tiny Llama family GGUF; streaming and
stop strings."""

import numpy as np
import pytest

import transformer
from conftest import read_json, read_safetensors, shared_path


def greedy_steps(ours, prompt):
    """Our greedy ids against the reference's, up to the first step of margin <= 0.01;
    returns how many steps were compared."""
    for i, (want, margin) in enumerate(zip(prompt["greedy_ids"], prompt["greedy_step_margins"])):
        if margin <= 0.01:
            return i
        assert i < len(ours) and ours[i] == want, f"greedy step {i} (margin {margin})"
    return len(prompt["greedy_ids"])


@pytest.mark.parametrize("name", ["llama-tiny", "gpt2-tiny"])
def test_hugging_face_decoder_matches_transformers(name):
    directory = shared_path("reference", "hf-decoders", name)
    g = transformer.Generator(directory)
    reference = read_json(directory / "reference.json")
    logits = read_safetensors(directory / "logits.safetensors")
    compared = 0
    worst = 0.0
    for i, p in enumerate(reference["prompts"]):
        ids = g.tokenize(p["text"])
        assert ids == p["input_ids"], f"prompt {i}: token ids"
        ours = g.logits(ids)
        want = logits[f"logits.{i}"].reshape(len(ids), -1)
        assert ours.shape == want.shape and ours.dtype == np.float32
        d = float(np.abs(ours.astype(np.float64) - want).max())
        assert d < 1e-4, f"{name} prompt {i}: logits differ by {d:e}"
        worst = max(worst, d)
        new = g.generate_tokens(ids, max_tokens=len(p["greedy_ids"]), temperature=0.0)
        compared += greedy_steps(new, p)
    print(f"{name}: largest logit difference {worst:.2e}, {compared} greedy steps compared")
    assert compared >= 8


def test_smollm2_gguf_matches_transformers():
    gguf = shared_path("models", "SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
    refs = shared_path("reference", "smollm2")
    g = transformer.Generator(gguf)
    reference = read_json(refs / "reference.json")
    logits = read_safetensors(refs / "logits.safetensors")
    assert g.has_chat_template
    for i, p in enumerate(reference["prompts"]):
        ids = g.tokenize(p["text"], add_special=False)
        assert ids == p["input_ids"], f"prompt {i}: token ids"
        last = g.logits(ids)[-1]
        d = float(np.abs(last.astype(np.float64) - logits[f"last_logits.{i}"]).max())
        assert d < 1e-3, f"prompt {i}: last logits differ by {d:e}"
    # The first chat prompt: the template renders the reference's text, and the greedy reply
    # has the reference's ids wherever its margin is above 0.01.
    chat = next(p for p in reference["prompts"] if p["chat"])
    question = next(q for q in read_json(refs / "prompts.json") if q["chat"])["text"]
    messages = [{"role": "user", "content": question}]
    assert g.chat_prompt(messages) == chat["text"]
    n = 8
    new = g.generate_tokens(chat["input_ids"], max_tokens=n, temperature=0.0)
    assert greedy_steps(new, {**chat, "greedy_ids": chat["greedy_ids"][:n]}) >= 4
    reply = g.chat(messages, max_tokens=n)
    assert reply == g.detokenize([t for t in new if t != 2])


@pytest.mark.parametrize("form,tol", [("hf", 1e-4), ("llama.f16.gguf", 1e-3)])
def test_tiny_llama_family_matches_transformers(form, tol):
    # tests/models/families.rs's check: the same random Llama as a Hugging Face directory
    # (bf16 safetensors) and as an F16 GGUF, against transformers' float32 logits.
    directory = shared_path("reference", "families", "llama")
    g = transformer.Generator(directory / form)
    reference = read_json(directory / "reference-hf" / "reference.json")
    logits = read_safetensors(directory / "reference-hf" / "logits.safetensors")
    for s in reference["sequences"]:
        ours = g.logits(s["input_ids"])
        d = float(np.abs(ours.astype(np.float64) - logits[s["name"]]).max())
        assert d < tol, f"{form} {s['name']}: logits differ by {d:e}"


def test_stream_is_generate_in_pieces():
    directory = shared_path("reference", "hf-decoders", "llama-tiny")
    g = transformer.Generator(directory, threads=1)
    whole = g.generate("ROMEO. What light", max_tokens=24, temperature=0.8, seed=7)
    pieces = list(g.stream("ROMEO. What light", max_tokens=24, temperature=0.8, seed=7))
    assert len(pieces) > 1
    assert "".join(pieces) == whole
    # The same seed samples the same text; another seed (almost surely) another.
    assert g.generate("ROMEO. What light", max_tokens=24, temperature=0.8, seed=7) == whole
    # A stop string cuts the text before it, in both forms.
    stop = whole[len(whole) // 2 : len(whole) // 2 + 2]
    if stop.strip():
        cut = g.generate("ROMEO. What light", max_tokens=24, temperature=0.8, seed=7, stop=[stop])
        assert cut == whole[: whole.find(stop)]
        streamed = g.stream("ROMEO. What light", max_tokens=24, temperature=0.8, seed=7, stop=[stop])
        assert "".join(streamed) == cut
    # A stream dropped half-way stops its generation without harm.
    s = g.stream("ROMEO.", max_tokens=200, temperature=1.0)
    next(s)
    del s


def test_tokenize_round_trip():
    directory = shared_path("reference", "hf-decoders", "gpt2-tiny")
    g = transformer.Generator(directory)
    text = "First Citizen:\nBefore we proceed any further, hear me speak."
    assert g.detokenize(g.tokenize(text, add_special=False)) == text
    with pytest.raises(ValueError, match="outside the vocabulary"):
        g.detokenize([g.vocab_size])
    with pytest.raises(ValueError, match="at least one"):
        g.logits([])


@pytest.mark.parametrize("context", [131072, 1 << 20])
def test_long_context_directory_loads_and_ctx_size_limits_it(tmp_path, context):
    """A Llama directory whose context is 128k or 1M loads (a limit, not an allocation) and
    gives the logits of the 256-context original; `ctx_size` lowers the limit, and one above
    the model's context is lowered to it."""
    import json
    import shutil

    source = shared_path("reference", "families", "llama", "hf")
    for f in source.iterdir():
        shutil.copy(f, tmp_path / f.name)
    config = json.loads((tmp_path / "config.json").read_text())
    config["max_position_embeddings"] = context
    (tmp_path / "config.json").write_text(json.dumps(config))
    long = transformer.Generator(tmp_path)
    assert long.max_len == context
    original = transformer.Generator(source)
    ids = original.tokenize("To be, or not")
    assert np.array_equal(long.logits(ids), original.logits(ids))
    assert transformer.Generator(tmp_path, ctx_size=64).max_len == 64
    assert transformer.Generator(tmp_path, ctx_size=context * 2).max_len == context
