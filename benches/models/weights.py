#!/usr/bin/env python3
"""Random-weight Hugging Face checkpoints of real model shapes, written tensor by tensor.

usage: weights.py MODEL HFDIR [--seed N]     (MODEL: see SHAPES; HFDIR holds the tokenizer)

Writes HFDIR/config.json (the real model's config) and bfloat16 safetensors shards of at most
4 GiB with their index, streaming: each tensor is drawn, rounded to bfloat16 and written before
the next, in chunks of rows, so an 8B model needs well under 1 GiB of memory. numpy only (no
torch): the safetensors format is an 8-byte little-endian header length, a JSON header of
{name: {dtype, shape, data_offsets}}, then the raw bytes. Each tensor's numbers come from its own
generator, seeded by (seed, crc32(name)), so every run gives the same files.

Scales (as ../shared/tools/fixtures/make_models.py, so activations and logits stay O(1..10)):
  linears N(0, 1/fan_in); q/k projections x1.3; RMSNorm weights 1 + N(0, 0.1^2);
  untied: embeddings N(0, 1), lm_head N(0, (6/sqrt(hidden))^2), logit std ~6;
  tied: embeddings N(0, 0.02^2) and the final norm multiplied by 6 / (0.02 sqrt(hidden)), so the
  tied head's logit std is also ~6 (a random tied model otherwise repeats its input token).
"""
import argparse
import json
import math
import struct
import zlib
from pathlib import Path

import numpy as np

LLAMA3_ROPE = dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=8192, rope_type="llama3")

# name -> real config.json (values checked against the published configs)
SHAPES = {
    "llama-3.2-1b": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=2048,
                         intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, vocab_size=128256,
                         tie_word_embeddings=True, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE,
                         max_position_embeddings=131072, rms_norm_eps=1e-5, hidden_act="silu",
                         attention_bias=False, mlp_bias=False, bos_token_id=128000,
                         eos_token_id=128001),
    "llama-3.2-3b": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=3072,
                         intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
                         num_key_value_heads=8, head_dim=128, vocab_size=128256,
                         tie_word_embeddings=True, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE,
                         max_position_embeddings=131072, rms_norm_eps=1e-5, hidden_act="silu",
                         attention_bias=False, mlp_bias=False, bos_token_id=128000,
                         eos_token_id=128001),
    "llama-3.1-8b": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096,
                         intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, vocab_size=128256,
                         tie_word_embeddings=False, rope_theta=500000.0,
                         rope_scaling=dict(LLAMA3_ROPE, factor=8.0),
                         max_position_embeddings=131072, rms_norm_eps=1e-5, hidden_act="silu",
                         attention_bias=False, mlp_bias=False, bos_token_id=128000,
                         eos_token_id=128001),
    "qwen3-4b": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=2560,
                     intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936,
                     tie_word_embeddings=True, rope_theta=1000000.0, rope_scaling=None,
                     max_position_embeddings=40960, rms_norm_eps=1e-6, hidden_act="silu",
                     attention_bias=False, use_sliding_window=False, sliding_window=None,
                     max_window_layers=36, bos_token_id=151643, eos_token_id=151645),
    "olmoe-1b-7b": dict(architectures=["OlmoeForCausalLM"], model_type="olmoe", hidden_size=2048,
                        intermediate_size=1024, num_hidden_layers=16, num_attention_heads=16,
                        num_key_value_heads=16, vocab_size=50304, tie_word_embeddings=False,
                        rope_theta=10000.0, rope_scaling=None, max_position_embeddings=4096,
                        rms_norm_eps=1e-5, hidden_act="silu", attention_bias=False,
                        clip_qkv=None, num_experts=64, num_experts_per_tok=8,
                        norm_topk_prob=False, output_router_logits=False,
                        router_aux_loss_coef=0.01, bos_token_id=None, eos_token_id=50279,
                        pad_token_id=1),
}
FAMILY = {"llama-3.2-1b": "llama3", "llama-3.2-3b": "llama3", "llama-3.1-8b": "llama3",
          "qwen3-4b": "qwen3", "olmoe-1b-7b": "olmoe"}
SHARD_BYTES = 4 << 30
CHUNK = 1 << 24  # numbers drawn at a time


def tensors(c: dict):
    """(name, shape, kind) in the order Hugging Face names them."""
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    yield "model.embed_tokens.weight", (v, h), "embed"
    for b in range(c["num_hidden_layers"]):
        p = f"model.layers.{b}."
        yield p + "input_layernorm.weight", (h,), "norm"
        yield p + "self_attn.q_proj.weight", (q, h), "qk"
        yield p + "self_attn.k_proj.weight", (kv, h), "qk"
        yield p + "self_attn.v_proj.weight", (kv, h), "linear"
        yield p + "self_attn.o_proj.weight", (h, q), "linear"
        if c["model_type"] == "qwen3":
            yield p + "self_attn.q_norm.weight", (hd,), "norm"
            yield p + "self_attn.k_norm.weight", (hd,), "norm"
        if c["model_type"] == "olmoe":  # OLMoE normalises the whole q and k rows
            yield p + "self_attn.q_norm.weight", (q,), "norm"
            yield p + "self_attn.k_norm.weight", (kv,), "norm"
        yield p + "post_attention_layernorm.weight", (h,), "norm"
        if c["model_type"] == "olmoe":
            yield p + "mlp.gate.weight", (c["num_experts"], h), "linear"
            for e in range(c["num_experts"]):
                x = f"{p}mlp.experts.{e}."
                yield x + "gate_proj.weight", (i, h), "linear"
                yield x + "up_proj.weight", (i, h), "linear"
                yield x + "down_proj.weight", (h, i), "linear"
        else:
            yield p + "mlp.gate_proj.weight", (i, h), "linear"
            yield p + "mlp.up_proj.weight", (i, h), "linear"
            yield p + "mlp.down_proj.weight", (h, i), "linear"
    yield "model.norm.weight", (h,), "final_norm"
    if not c["tie_word_embeddings"]:
        yield "lm_head.weight", (v, h), "lm_head"


def scale(c: dict, kind: str, shape) -> tuple[float, float]:
    """(mean, std) of the tensor's numbers."""
    h, tied = c["hidden_size"], c["tie_word_embeddings"]
    if kind == "embed":
        return 0.0, 0.02 if tied else 1.0
    if kind == "lm_head":
        return 0.0, 6.0 / math.sqrt(h)
    if kind == "norm":
        return 1.0, 0.1
    if kind == "final_norm":
        mult = 6.0 / (0.02 * math.sqrt(h)) if tied else 1.0
        return mult, 0.1 * mult
    gain = 1.3 if kind == "qk" else 1.0
    return 0.0, gain / math.sqrt(shape[1])


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, rounded to nearest even (as torch's .to(bfloat16))."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write(name: str, out: Path, seed: int) -> None:
    c = dict(SHAPES[name])
    info = json.loads((out / "tokenizer_info.json").read_text())
    assert info["tokens"] <= c["vocab_size"], (info["tokens"], c["vocab_size"])
    specs = list(tensors(c))
    shards, cur, size = [], [], 0
    for t in specs:
        nbytes = math.prod(t[1]) * 2
        if cur and size + nbytes > SHARD_BYTES:
            shards.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += nbytes
    shards.append(cur)
    weight_map, total = {}, 0
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for tname, shape, _ in shard:
            n = math.prod(shape) * 2
            header[tname] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
            off += n
            weight_map[tname] = fname
        hjson = json.dumps(header, separators=(",", ":")).encode()
        hjson += b" " * (-len(hjson) % 8)
        with open(out / fname, "wb") as f:
            f.write(struct.pack("<Q", len(hjson)))
            f.write(hjson)
            for tname, shape, kind in shard:
                mean, std = scale(c, kind, shape)
                rng = np.random.default_rng([seed, zlib.crc32(tname.encode())])
                left = math.prod(shape)
                while left:
                    n = min(left, CHUNK)
                    x = rng.standard_normal(n, dtype=np.float32) * np.float32(std) + np.float32(mean)
                    f.write(bf16_bits(x).tobytes())
                    left -= n
        total += off
        print(f"  {fname}: {len(shard)} tensors, {off / 2**30:.2f} GiB", flush=True)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    c.update(torch_dtype="bfloat16", initializer_range=0.02, use_cache=True,
             transformers_version="4.45.0")
    if info.get("pad_token_id") is not None and "pad_token_id" not in c:
        c["pad_token_id"] = info["pad_token_id"]
    (out / "config.json").write_text(json.dumps(c, indent=1) + "\n")
    params = sum(math.prod(s) for _, s, _ in specs)
    print(f"{name}: {params / 1e9:.3f} B parameters, {len(shards)} shard(s) -> {out}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", choices=sorted(SHAPES))
    ap.add_argument("hfdir", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--family", action="store_true", help="print the tokenizer family and exit")
    a = ap.parse_args()
    if a.family:
        print(FAMILY[a.model])
    else:
        write(a.model, a.hfdir, a.seed)
