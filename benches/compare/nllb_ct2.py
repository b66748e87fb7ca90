#!/usr/bin/env python3
"""NLLB-200 (distilled-600M's shape) translation speed: ours against CTranslate2 on the same
weights.

    python nllb_ct2.py --bin target/release/transformer --dir /tmp/nllb-600m \
        [--threads "1 2"] [--precisions "f32 int8"] [--rounds 3] [--n 16]

Makes (once, in --dir) a random `M2M100ForConditionalGeneration` of
facebook/nllb-200-distilled-600M's shape (vocab 256,206, d_model 1,024, 12 + 12 pre-LN layers,
16 heads, FFN 4,096, ReLU) with the SentencePiece model of tests/fixtures/nllb and an NLLB
tokenizer padded to that vocabulary, and CTranslate2 exports of it (`ct2-transformers-converter`,
float32 and int8). The decoder's last norm leans 10^4 away from the EOS row, so neither side
ever ends a translation: both emit exactly 67 tokens per sentence, the forced target code
included (our `translate` limit, source length (code and pieces) + 50; CTranslate2's
max_decoding_length), the same work. The sources
are the first --n English sentences of ../shared/data/en-es/bible.train.tsv of exactly 16
pieces, translated eng_Latn -> fra_Latn (source code first; the target code forced on ours,
CTranslate2's `target_prefix` on theirs).

Per round, interleaved: for each precision and thread count, `transformer bench --translate`
(greedy, then beam 4, 32 sentences a batch) and CTranslate2's translate_batch on chunks of 32
(one translator, intra_threads = threads; beam 4, patience 1). Prints target tokens/s of each
(the forced code included on both sides) and the medians with ours / CTranslate2.
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
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "nllb")
SOURCES = os.path.join(ROOT, "..", "shared", "data", "en-es", "bible.train.tsv")
VOCAB = 256206
SRC_PIECES = 16
EXTRA = 50
BATCH = 32
SOURCE, TARGET = "eng_Latn", "fra_Latn"


def make(dir):
    import torch
    from transformers import M2M100Config, M2M100ForConditionalGeneration, NllbTokenizer

    os.makedirs(dir, exist_ok=True)
    sp_path = os.path.join(dir, "sentencepiece.bpe.model")
    shutil.copy(os.path.join(FIXTURE, "sentencepiece.bpe.model"), sp_path)
    converted = NllbTokenizer._convert_from_sentencepiece(sp_path, {})
    converted.pop("additional_special_tokens", None)
    vocab = converted["vocab"]
    # Padded with pieces no text makes, so that the codes and <mask> end the table at VOCAB.
    while len(vocab) < VOCAB - 203:
        vocab[f"\u2581w{len(vocab)}"] = len(vocab)
    tok = NllbTokenizer(**converted, src_lang=SOURCE, tgt_lang=TARGET)
    assert len(tok) == VOCAB, len(tok)
    tok.save_pretrained(dir)
    torch.manual_seed(0)
    config = M2M100Config(
        vocab_size=VOCAB, d_model=1024, encoder_layers=12, decoder_layers=12,
        encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=4096,
        decoder_ffn_dim=4096, activation_function="relu", max_position_embeddings=1024,
        scale_embedding=True, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2, dropout=0.1,
    )
    model = M2M100ForConditionalGeneration(config).eval()
    with torch.no_grad():
        eos_row = model.model.shared.weight[2]
        model.model.decoder.layer_norm.bias.sub_(1e4 * eos_row / eos_row.dot(eos_row))
    model.save_pretrained(dir, safe_serialization=True)
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + ":" + os.environ["PATH"]}
    for q, name in [(None, "ct2-float32"), ("int8", "ct2-int8")]:
        cmd = ["ct2-transformers-converter", "--model", dir, "--output_dir",
               os.path.join(dir, name), "--force"]
        if q:
            cmd += ["--quantization", q]
        subprocess.run(cmd, check=True, env=env)


def sources(dir, n):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=os.path.join(dir, "sentencepiece.bpe.model"))
    lines, pieces = [], []
    for line in open(SOURCES, encoding="utf-8"):
        text = line.split("\t")[0].strip()
        p = sp.encode(text, out_type=str)
        if len(p) == SRC_PIECES:
            lines.append(text)
            pieces.append([SOURCE] + p + ["</s>"])
        if len(lines) == n:
            break
    with open(os.path.join(dir, "src.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return pieces


def ours(bin, dir, threads, precision):
    out = subprocess.run(
        [bin, "bench", "--translate", dir, "--src", os.path.join(dir, "src.txt"),
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
    # Ours: the source's code and pieces + 50 tokens, the forced target code among them.
    limit = 1 + SRC_PIECES + EXTRA
    for name, beam in [("greedy", 1), ("beam 4", 4)]:
        tokens = 0
        start = time.perf_counter()
        for i in range(0, len(pieces), BATCH):
            chunk = pieces[i : i + BATCH]
            results = translator.translate_batch(
                chunk, target_prefix=[[TARGET]] * len(chunk), beam_size=beam, patience=1,
                max_decoding_length=limit, min_decoding_length=0, return_end_token=True,
                max_input_length=0,
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
    ap.add_argument("--n", type=int, default=16)
    a = ap.parse_args()
    import ctranslate2

    if not os.path.exists(os.path.join(a.dir, "ct2-int8", "model.bin")):
        make(a.dir)
    pieces = sources(a.dir, a.n)
    print(f"{len(pieces)} sentences of {SRC_PIECES} pieces, {1 + SRC_PIECES + EXTRA} target "
          "tokens each")
    results = {}
    for r in range(a.rounds):
        for p in a.precisions.split():
            ct2_type = {"f32": "float32", "int8": "int8"}[p]
            for t in map(int, a.threads.split()):
                o = ours(a.bin, a.dir, t, p)
                tr = ctranslate2.Translator(
                    os.path.join(a.dir, f"ct2-{ct2_type}"), device="cpu", inter_threads=1,
                    intra_threads=t, compute_type=ct2_type,
                )
                ct2(tr, pieces[:2])  # warm-up
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
