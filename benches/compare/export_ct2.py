#!/usr/bin/env python3
"""Export one of our translation checkpoints to a CTranslate2 model directory.

    python export_ct2.py MODEL_DIR OUT_DIR [--force]

MODEL_DIR is a model directory written by `transformer train` (config.json, model.safetensors,
tokenizer.json, vocab.json). The export is built with CTranslate2's model-spec API
(`ctranslate2.specs.TransformerSpec`), float32, our weights as they are:

- embeddings: our one shared table `embedding.weight` is the encoder's and the decoder's
  embedding, scaled by sqrt(d_model) (CTranslate2's `scale_embeddings`, on by default);
- positions: our sinusoid table, interleaved (`PE(pos, 2i) = sin`, `PE(pos, 2i+1) = cos`) and
  computed in float64 then rounded once, like `src/model/embedding.rs`, is written to
  `position_encodings.encodings` explicitly (CTranslate2's built-in table is sin|cos
  concatenated, which is a different model); learned positions (`embedding.positions`) go to the
  same slot; rotary positions are refused;
- attention: q/k/v projections fused ([3d, d] for self-attention; q and [k; v] for
  cross-attention), `out_proj` last;
- layer norms: `self_attn_norm`, `cross_attn_norm`, `ffn_norm` go to the sublayers' `layer_norm`
  slots (CTranslate2 applies them after the residual add when `pre_norm` is false, before the
  sublayer when true); pre-LN also has `encoder.final_norm` / `decoder.final_norm`;
  `layer_norm_epsilon` is set in the model's config.json from ours;
- output: tied to `embedding.weight` (an alias in model.bin) unless `tie_embeddings` is false
  (`output_proj.weight`); no bias, like ours;
- vocabulary: the token strings of ids 0..vocab_size-1 of our tokenizer.json (ids 0-3:
  <pad> <s> </s> <unk>), one shared vocabulary; CTranslate2 adds no source specials
  (add_source_eos is false), so callers append "</s>" to each source themselves, as we do.
"""

import argparse
import json
import os
import shutil
import sys

import numpy as np


def sinusoid_table(max_len, d_model):
    """Our interleaved sinusoid table (src/model/embedding.rs `sinusoid`), float64 -> float32."""
    pos = np.arange(max_len, dtype=np.float64)[:, None]
    dim = np.arange(d_model)
    i2 = (dim - dim % 2).astype(np.float64)
    angle = pos / np.power(10000.0, i2 / d_model)
    table = np.where(dim % 2 == 0, np.sin(angle), np.cos(angle))
    return table.astype(np.float32)


def load_vocabulary(model_dir, vocab_size):
    """Token strings in id order from the model directory's tokenizer.json."""
    with open(os.path.join(model_dir, "vocab.json"), encoding="utf-8") as f:
        vocab_file = json.load(f)
    if vocab_file.get("level") != "bpe":
        # Char/word vocabularies list their tokens directly.
        tokens = list(vocab_file["tokens"])
    else:
        name = vocab_file.get("tokenizer") or "tokenizer.json"
        with open(os.path.join(model_dir, name), encoding="utf-8") as f:
            tokenizer = json.load(f)
        by_id = {}
        for token, i in tokenizer["model"]["vocab"].items():
            by_id[i] = token
        for added in tokenizer.get("added_tokens", []):
            by_id[added["id"]] = added["content"]
        tokens = [by_id.get(i) for i in range(vocab_size)]
        missing = [i for i, t in enumerate(tokens) if t is None]
        if missing:
            sys.exit(f"tokenizer.json has no token for ids {missing[:10]}")
    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    if tokens[:4] != specials:
        sys.exit(f"ids 0-3 are {tokens[:4]}, expected {specials}")
    if len(tokens) != vocab_size:
        sys.exit(f"vocabulary has {len(tokens)} tokens, config.json says {vocab_size}")
    if len(set(tokens)) != len(tokens):
        sys.exit("vocabulary has duplicate token strings")
    return tokens


def build_spec(model_dir):
    import ctranslate2
    from ctranslate2.specs import common_spec, transformer_spec
    from safetensors.numpy import load_file

    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    weights = load_file(os.path.join(model_dir, "model.safetensors"))
    used = set()

    def w(name):
        if name not in weights:
            sys.exit(f"model.safetensors has no tensor {name!r}")
        used.add(name)
        array = weights[name]
        if array.dtype != np.float32:
            array = array.astype(np.float32)
        return np.ascontiguousarray(array)

    norm = config.get("norm", "post-ln")
    if norm not in ("post-ln", "pre-ln"):
        sys.exit(f"unsupported norm {norm!r}")
    pre_norm = norm == "pre-ln"
    activations = {
        "relu": common_spec.Activation.RELU,
        "gelu-erf": common_spec.Activation.GELU,
        "gelu-tanh": common_spec.Activation.GELUTanh,
    }
    activation = config.get("activation", "relu")
    if activation not in activations:
        sys.exit(f"unsupported activation {activation!r}")
    positions = config.get("positions", "sinusoidal")
    if positions not in ("sinusoidal", "learned"):
        sys.exit(f"positions {positions!r} cannot be exported (CTranslate2 needs an additive table)")
    d_model = config["d_model"]
    n_heads = config["n_heads"]
    max_len = config["max_len"]

    spec = transformer_spec.TransformerSpec.from_config(
        (config["n_encoder_layers"], config["n_decoder_layers"]),
        n_heads,
        pre_norm=pre_norm,
        activation=activations[activation],
    )
    spec.config.layer_norm_epsilon = float(config["layer_norm_eps"])

    embedding = w("embedding.weight")
    if positions == "sinusoidal":
        table = sinusoid_table(max_len, d_model)
    else:
        table = w("embedding.positions")

    def set_linear(linear, prefix, bias=True):
        linear.weight = w(prefix + ".weight")
        if bias:
            linear.bias = w(prefix + ".bias")

    def set_norm(layer_norm, prefix):
        layer_norm.gamma = w(prefix + ".weight")
        layer_norm.beta = w(prefix + ".bias")

    def set_self_attention(attention, prefix, norm_prefix):
        attention.linear[0].weight = np.concatenate(
            [w(f"{prefix}.{p}_proj.weight") for p in ("q", "k", "v")]
        )
        attention.linear[0].bias = np.concatenate(
            [w(f"{prefix}.{p}_proj.bias") for p in ("q", "k", "v")]
        )
        set_linear(attention.linear[1], prefix + ".out_proj")
        set_norm(attention.layer_norm, norm_prefix)

    def set_cross_attention(attention, prefix, norm_prefix):
        set_linear(attention.linear[0], prefix + ".q_proj")
        attention.linear[1].weight = np.concatenate(
            [w(f"{prefix}.{p}_proj.weight") for p in ("k", "v")]
        )
        attention.linear[1].bias = np.concatenate(
            [w(f"{prefix}.{p}_proj.bias") for p in ("k", "v")]
        )
        set_linear(attention.linear[2], prefix + ".out_proj")
        set_norm(attention.layer_norm, norm_prefix)

    def set_ffn(ffn, prefix, norm_prefix):
        set_linear(ffn.linear_0, prefix + ".linear1")
        set_linear(ffn.linear_1, prefix + ".linear2")
        set_norm(ffn.layer_norm, norm_prefix)

    encoder = spec.encoder
    encoder.embeddings[0].weight = embedding
    encoder.scale_embeddings = True
    encoder.position_encodings.encodings = table
    for i, layer in enumerate(encoder.layer):
        p = f"encoder.layers.{i}"
        set_self_attention(layer.self_attention, p + ".self_attn", p + ".self_attn_norm")
        set_ffn(layer.ffn, p + ".ffn", p + ".ffn_norm")
    if pre_norm:
        set_norm(encoder.layer_norm, "encoder.final_norm")

    decoder = spec.decoder
    decoder.embeddings.weight = embedding
    decoder.scale_embeddings = True
    decoder.position_encodings.encodings = table
    for i, layer in enumerate(decoder.layer):
        p = f"decoder.layers.{i}"
        set_self_attention(layer.self_attention, p + ".self_attn", p + ".self_attn_norm")
        set_cross_attention(layer.attention, p + ".cross_attn", p + ".cross_attn_norm")
        set_ffn(layer.ffn, p + ".ffn", p + ".ffn_norm")
    if pre_norm:
        set_norm(decoder.layer_norm, "decoder.final_norm")
    if config.get("tie_embeddings", True):
        # The same array object: CTranslate2 stores it once and aliases the other names.
        decoder.projection.weight = embedding
    else:
        decoder.projection.weight = w("output_proj.weight")

    unused = sorted(set(weights) - used)
    if unused:
        sys.exit(f"tensors not exported (unexpected for this architecture): {unused[:10]}")

    tokens = load_vocabulary(model_dir, config["vocab_size"])
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    spec.validate()
    # Aliases duplicated tensors (the tied embedding/projection, the shared position table) and
    # keeps float32, as CTranslate2's own converters do before saving.
    spec.optimize(quantization="float32")
    return spec, config, ctranslate2.__version__


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", help="our model directory (config.json, model.safetensors, ...)")
    parser.add_argument("out_dir", help="CTranslate2 model directory to write")
    parser.add_argument("--force", action="store_true", help="replace out_dir if it exists")
    args = parser.parse_args()
    if os.path.exists(args.out_dir):
        if not args.force:
            sys.exit(f"{args.out_dir} exists (use --force to replace it)")
        shutil.rmtree(args.out_dir)
    spec, config, version = build_spec(args.model_dir)
    os.makedirs(args.out_dir)
    spec.save(args.out_dir)
    print(
        f"exported {args.model_dir} -> {args.out_dir} (CTranslate2 {version}, float32, "
        f"{config['norm']}, {config['n_encoder_layers']}+{config['n_decoder_layers']} layers, "
        f"d_model {config['d_model']}, {config['n_heads']} heads, vocab {config['vocab_size']}, "
        f"layer_norm_epsilon {config['layer_norm_eps']})"
    )


if __name__ == "__main__":
    main()
