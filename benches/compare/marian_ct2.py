#!/usr/bin/env python3
"""Marian (OPUS-MT's base shape) translation speed: ours against CTranslate2 on the same weights.

    python marian_ct2.py --bin target/release/transformer --dir /tmp/marian-base \
        [--threads "1 2"] [--precisions "f32 int8"] [--rounds 3] [--n 64] [--ours-from ct2]

Makes (once, in --dir) a random `MarianMTModel` of Helsinki-NLP/opus-mt-de-en's shape (vocab
58,101, d_model 512, 6 + 6 layers, 8 heads, FFN 2,048, swish) with the SentencePiece models of
tests/fixtures/marian and a vocab.json padded to that size, and CTranslate2 exports of it
(`ct2-transformers-converter`, float32 and int8). Its EOS logit is biased by -10^4, so neither
side ever ends a translation: both emit exactly `source length + 50` tokens per sentence (our
`translate` limit; CTranslate2's max_decoding_length), the same work. The sources are the first
--n German sentences of ../shared/data/de-en/ding.train.tsv of exactly 16 source pieces.

With `--ours-from ct2` ours loads CTranslate2's own export (`ct2-float32` / `ct2-int8`, the
SentencePiece models copied beside `model.bin`): the same file on both sides, int8 weights
multiplied as stored.

Per round, interleaved: for each precision and thread count, `transformer bench --translate`
(greedy, then beam 4, 32 sentences a batch) and CTranslate2's translate_batch on chunks of 32
(one translator, intra_threads = threads; beam 4, patience 1). Prints target tokens/s for each
and the medians with ours / CTranslate2.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "marian")
SOURCES = os.path.join(ROOT, "..", "shared", "data", "de-en", "ding.train.tsv")
VOCAB = 58101
SRC_PIECES = 16
EXTRA = 50
BATCH = 32


def make(dir):
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    os.makedirs(dir, exist_ok=True)
    for f in ["source.spm", "target.spm"]:
        shutil.copy(os.path.join(FIXTURE, f), dir)
    with open(os.path.join(FIXTURE, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    pad = vocab.pop("<pad>")
    assert pad == len(vocab)
    while len(vocab) < VOCAB - 1:
        vocab[f"\u2581w{len(vocab)}"] = len(vocab)
    vocab["<pad>"] = VOCAB - 1
    with open(os.path.join(dir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    MarianTokenizer(
        source_spm=os.path.join(dir, "source.spm"),
        target_spm=os.path.join(dir, "target.spm"),
        vocab=os.path.join(dir, "vocab.json"),
    ).save_pretrained(dir)
    torch.manual_seed(0)
    config = MarianConfig(
        vocab_size=VOCAB, d_model=512, encoder_layers=6, decoder_layers=6,
        encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
        decoder_ffn_dim=2048, activation_function="swish", max_position_embeddings=512,
        scale_embedding=True, pad_token_id=VOCAB - 1, eos_token_id=0,
        decoder_start_token_id=VOCAB - 1, forced_eos_token_id=None,
    )
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        model.final_logits_bias[0, 0] = -1e4
    model.save_pretrained(dir, safe_serialization=True)
    for q, name in [(None, "ct2-float32"), ("int8", "ct2-int8")]:
        cmd = ["ct2-transformers-converter", "--model", dir, "--output_dir",
               os.path.join(dir, name), "--force"]
        if q:
            cmd += ["--quantization", q]
        subprocess.run(cmd, check=True, env={**os.environ, "PATH": os.path.dirname(sys.executable) + ":" + os.environ["PATH"]})


def sources(dir, n):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=os.path.join(dir, "source.spm"))
    lines, pieces = [], []
    for line in open(SOURCES, encoding="utf-8"):
        text = line.split("\t")[0].strip()
        p = sp.encode(text, out_type=str)
        if len(p) == SRC_PIECES:
            lines.append(text)
            pieces.append(p + ["</s>"])
        if len(lines) == n:
            break
    with open(os.path.join(dir, "src.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return pieces


def ours(bin, dir, threads, precision, source="hf"):
    model = dir
    if source == "ct2":
        model = os.path.join(dir, "ct2-" + {"f32": "float32", "int8": "int8"}[precision])
        for name in ["source.spm", "target.spm"]:
            if not os.path.exists(os.path.join(model, name)):
                shutil.copy(os.path.join(dir, name), os.path.join(model, name))
    out = subprocess.run(
        [bin, "bench", "--translate", model, "--src", os.path.join(dir, "src.txt"),
         "--threads", str(threads), "--precision", precision, "--beam", "4",
         "--beam-stop", "first-k", "--sentences-per-batch", str(BATCH)],
        check=True, capture_output=True, text=True,
    ).stdout
    rates = {}
    for line in out.splitlines():
        for name in ["greedy", "beam 4"]:
            if line.startswith(name + ":"):
                words = line.split()
                rates[name] = float(words[words.index("target") - 1])
    return rates


def ct2(translator, pieces):
    rates = {}
    limit = SRC_PIECES + EXTRA
    for name, beam in [("greedy", 1), ("beam 4", 4)]:
        tokens = 0
        start = time.perf_counter()
        for i in range(0, len(pieces), BATCH):
            results = translator.translate_batch(
                pieces[i : i + BATCH], beam_size=beam, patience=1, max_decoding_length=limit,
                min_decoding_length=0, return_end_token=True, max_input_length=0,
            )
            tokens += sum(len(r.hypotheses[0]) for r in results)
        rates[name] = tokens / (time.perf_counter() - start)
        assert tokens == limit * len(pieces), f"CTranslate2 emitted {tokens} tokens"
    return rates


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--threads", default="1 2")
    ap.add_argument("--precisions", default="f32 int8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--ours-from", choices=["hf", "ct2"], default="hf")
    a = ap.parse_args()
    import ctranslate2

    if not os.path.exists(os.path.join(a.dir, "ct2-int8", "model.bin")):
        make(a.dir)
    pieces = sources(a.dir, a.n)
    print(f"{len(pieces)} sentences of {SRC_PIECES} pieces, {SRC_PIECES + EXTRA} target tokens each")
    results = {}
    for r in range(a.rounds):
        for p in a.precisions.split():
            ct2_type = {"f32": "float32", "int8": "int8"}[p]
            for t in map(int, a.threads.split()):
                o = ours(a.bin, a.dir, t, p, a.ours_from)
                tr = ctranslate2.Translator(
                    os.path.join(a.dir, f"ct2-{ct2_type}"), device="cpu", inter_threads=1,
                    intra_threads=t, compute_type=ct2_type,
                )
                ct2(tr, pieces[:BATCH])  # warm-up
                c = ct2(tr, pieces)
                del tr
                for s in ["greedy", "beam 4"]:
                    results.setdefault((p, t, s), []).append((o[s], c[s]))
                print(f"round {r + 1} {p} threads {t}: ours {o}, CTranslate2 "
                      f"{ {k: round(v, 1) for k, v in c.items()} }", flush=True)
    print("\nprecision threads search  ours tok/s  CTranslate2 tok/s  ours/CTranslate2 (medians)")
    for (p, t, s), runs in sorted(results.items()):
        o = statistics.median(x for x, _ in runs)
        c = statistics.median(y for _, y in runs)
        print(f"{p:9} {t:7} {s:7} {o:11.1f} {c:18.1f} {o / c:8.2f}")


if __name__ == "__main__":
    main()
