#!/usr/bin/env python3
"""Translate with a CTranslate2 export of our model and compare with our own outputs.

    python ct2_translate.py prepare --model MODEL_DIR --input FILE [--n N] --out SRC.txt
    python ct2_translate.py run --model MODEL_DIR --ct2 CT2_DIR --src SRC.txt \
        [--threads "1 2"] [--batch 32] [--beam 4] [--alpha 0.6] [--max-extra 50] \
        [--ours-greedy FILE] [--ours-beam FILE] [--out-dir DIR]

`prepare` writes the source sentences both systems translate: the first tab-separated column of
each input line (the whole line when there is no tab), trimmed, without empty lines and without
sentences longer than the model's max_len - 1 tokens (which `transformer translate` refuses),
at most N of them.

`run` tokenises every sentence exactly as `src/text/vocab.rs` does (the model directory's
tokenizer.json, no specials added, text that spells a special token encoded as plain bytes),
turns our ids into CTranslate2 token strings and appends "</s>" (our encoder input ends with
EOS; the decoder starts from <s>). Every call uses min_decoding_length 0 (ours may emit EOS
first), max_input_length 0 (no truncation), return_end_token (to count EOS like ours) and, for
greedy search, length_penalty 0 (the score is then the summed log-probability).

Timing, for each thread count: one greedy pass and one beam pass over all sentences (after an
untimed warm-up on one chunk per translator); at more than one thread both of CTranslate2's
layouts (one translator on all threads, or one single-threaded translator per thread taking
whole chunks side by side, as ours does) and the faster one reported, the sentences sorted by length and cut into chunks of --batch like
our `length_sorted_chunks`, one `translate_batch` call per chunk with max_decoding_length =
min(longest source in the chunk + max_extra, max_len) (EOS counted, like ours). It prints
sentences/s and target tokens/s counting the emitted tokens with the final EOS, as
`transformer bench --translate` does. (A translation that never emits EOS runs to its chunk's
limit rather than its own; all generated tokens are counted.)

Comparison, with --ours-greedy / --ours-beam (the output of `transformer translate --nbest 1`,
lines `i<TAB>score<TAB>text`; greedy with --alpha 0 so the score is the summed
log-probability): one more pass (at --compare-threads, default the last of --threads) with the sentences grouped by their own
limit min(length + max_extra, max_len), so each is decoded under exactly our limit; CTranslate2's
ids are decoded with the same tokenizer.json as `Vocab::decode` does and compared as text. It
prints how many outputs are identical, for greedy the largest difference of the summed
log-probabilities over the identical ones, and for beam search which side's pick scores higher
under our length penalty where they differ. The texts go to OUT_DIR/ct2.greedy.txt and
ct2.beamK.txt.
"""

import argparse
import json
import os
import re
import sys
import time

PAD, BOS, EOS, UNK = 0, 1, 2, 3


def load_config(model_dir):
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        return json.load(f)


class OurVocab:
    """The id <-> text mapping of `src/text/vocab.rs` for a BPE model directory."""

    def __init__(self, model_dir, vocab_size):
        import tokenizers

        with open(os.path.join(model_dir, "vocab.json"), encoding="utf-8") as f:
            vocab_file = json.load(f)
        if vocab_file.get("level") != "bpe":
            sys.exit("only byte-level BPE model directories are supported (vocab.json level 'bpe')")
        path = os.path.join(model_dir, vocab_file.get("tokenizer") or "tokenizer.json")
        self.tokenizer = tokenizers.Tokenizer.from_file(path)
        # As Vocab::from_tokenizer: text that spells a special is encoded as plain bytes.
        self.tokenizer.encode_special_tokens = True
        self.tokens = [self.tokenizer.id_to_token(i) for i in range(vocab_size)]
        if self.tokens[:4] != ["<pad>", "<s>", "</s>", "<unk>"]:
            sys.exit(f"ids 0-3 are {self.tokens[:4]}, expected <pad> <s> </s> <unk>")
        self.ids = {t: i for i, t in enumerate(self.tokens)}

    def encode(self, text):
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids):
        """Vocab::decode: stop at the first EOS, drop the specials and unknown ids."""
        kept = []
        for i in ids:
            if i == EOS:
                break
            if UNK < i < len(self.tokens):
                kept.append(i)
        return self.tokenizer.decode(kept, skip_special_tokens=True)


def cmd_prepare(args):
    config = load_config(args.model)
    vocab = OurVocab(args.model, config["vocab_size"])
    limit = config["max_len"] - 1
    kept, too_long, empty = [], 0, 0
    with open(args.input, "rb") as f:
        data = f.read()
    data = data.removeprefix(b"\xef\xbb\xbf")
    for raw in data.decode("utf-8").split("\n"):
        text = raw.removesuffix("\r").split("\t", 1)[0].strip()
        if not text:
            empty += 1
            continue
        if len(vocab.encode(text)) > limit:
            too_long += 1
            continue
        kept.append(text)
        if args.n and len(kept) >= args.n:
            break
    with open(args.out, "w", encoding="utf-8") as f:
        for text in kept:
            f.write(text + "\n")
    print(
        f"prepared {len(kept)} source sentences from {args.input} -> {args.out}"
        + (f" ({too_long} longer than {limit} tokens skipped)" if too_long else "")
    )


def read_ours(path, n):
    """Lines `i<TAB>score<TAB>text` of `transformer translate --nbest 1` -> [(score, text)]."""
    head = re.compile(r"^(\d+)\t([^\t]*)\t(.*)$")
    out = [None] * n
    last = None
    with open(path, encoding="utf-8") as f:
        for line in f.read().split("\n"):
            m = head.match(line)
            if m and int(m.group(1)) < n and out[int(m.group(1))] is None:
                last = int(m.group(1))
                out[last] = [float(m.group(2)), m.group(3)]
            elif last is not None and line:
                # A translation that contains a newline byte continues on the next line.
                out[last][1] += "\n" + line
    missing = sum(1 for o in out if o is None)
    if missing:
        sys.exit(f"{path}: {missing} of {n} sentences have no output line")
    return out


def chunks_by_length(lengths, batch):
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])  # stable, like Rust
    return [order[k : k + batch] for k in range(0, len(order), batch)]


def translate(translator, batch, args, beam, limit, asynchronous=False):
    """One translate_batch call with our settings: at most `limit` tokens (EOS included, which
    is returned), our α for beam search and none for greedy, no input truncation."""
    return translator.translate_batch(
        batch,
        asynchronous=asynchronous,
        max_batch_size=args.batch,
        beam_size=beam,
        length_penalty=args.alpha if beam > 1 else 0.0,
        max_decoding_length=limit,
        min_decoding_length=0,
        max_input_length=0,
        return_end_token=True,
        return_scores=True,
    )


def ct2_pass(translator, sources, src_ids, chunks, config, args, beam, parallel=False):
    """One pass over all sentences; returns (seconds, results by sentence). With `parallel`,
    every chunk is submitted at once (`asynchronous=True`) so a translator with several
    `inter_threads` works on as many chunks side by side; then the results are collected."""
    results = [None] * len(sources)
    t0 = time.perf_counter()
    pending = []
    for chunk in chunks:
        longest = max(len(src_ids[i]) for i in chunk)
        limit = min(longest + args.max_extra, config["max_len"])
        out = translate(translator, [sources[i] for i in chunk], args, beam, limit, parallel)
        pending.append((chunk, out))
    for chunk, out in pending:
        for i, r in zip(chunk, out):
            results[i] = r.result() if parallel else r
    return time.perf_counter() - t0, results


def hypothesis(vocab, result, limit):
    """(ids with the final EOS if any, at most `limit` of them; score)."""
    ids = [vocab.ids[t] for t in result.hypotheses[0]]
    if EOS in ids:
        ids = ids[: ids.index(EOS) + 1]
    return ids[:limit], result.scores[0]


def cmd_run(args):
    import ctranslate2

    config = load_config(args.model)
    vocab = OurVocab(args.model, config["vocab_size"])
    with open(args.src, encoding="utf-8") as f:
        lines = [l for l in f.read().split("\n") if l.strip()]
    if not lines:
        sys.exit(f"{args.src}: no source lines")
    src_ids = [vocab.encode(l) for l in lines]
    too_long = [i for i, s in enumerate(src_ids) if len(s) > config["max_len"] - 1]
    if too_long:
        sys.exit(f"{len(too_long)} sources longer than max_len - 1 (run `prepare` first)")
    roundtrip = sum(vocab.decode(s) != l for s, l in zip(src_ids, lines))
    sources = [[vocab.tokens[i] for i in s] + ["</s>"] for s in src_ids]
    limits = [min(len(s) + args.max_extra, config["max_len"]) for s in src_ids]
    chunks = chunks_by_length([len(s) for s in src_ids], args.batch)
    threads = [int(t) for t in args.threads.split()]
    compare_threads = args.compare_threads or (threads[-1] if threads else 1)
    print(
        f"CTranslate2 {ctranslate2.__version__} ({args.compute_type}): {len(lines)} sentences, "
        f"{sum(len(s) for s in src_ids)} source tokens (+1 EOS each), batch {args.batch}, "
        f"beam {args.beam} (length_penalty {args.alpha}), max length source + {args.max_extra}"
        + (f"; {roundtrip} sources do not round-trip through the tokenizer" if roundtrip else "")
    )

    for t in threads:
        # CTranslate2's two ways to use t threads: one translator whose products use all t
        # (intra_threads), or t translators of one thread each working on different chunks
        # (inter_threads, chunks submitted asynchronously). Both are timed; the faster one is
        # reported as "ct2 threads t".
        layouts = [("1 translator x %d threads" % t, 1, t, False)]
        if t > 1:
            layouts.append(("%d translators x 1 thread" % t, t, 1, True))
        best = {}
        for layout, inter, intra, parallel in layouts:
            translator = ctranslate2.Translator(
                args.ct2, device="cpu", compute_type=args.compute_type, inter_threads=inter,
                intra_threads=intra,
            )
            ct2_pass(translator, sources, src_ids, chunks[:inter], config, args, 1, parallel)  # warm-up
            for name, beam in (("greedy", 1), (f"beam {args.beam}", args.beam)):
                secs, results = ct2_pass(translator, sources, src_ids, chunks, config, args, beam, parallel)
                # Emitted tokens with the final EOS, as ours counts.
                tokens = sum(len(r.hypotheses[0]) for r in results)
                line = (
                    f"{len(lines) / secs:.1f} sentences/s, "
                    f"{tokens / secs:.0f} target tokens/s ({tokens} tokens in {secs:.2f} s)"
                )
                if len(layouts) > 1:
                    print(f"ct2 [{layout}] {name}: {line}")
                if name not in best or secs < best[name][0]:
                    best[name] = (secs, line, layout)
            del translator
        for name, (secs, line, layout) in best.items():
            print(f"ct2 threads {t} {name}: {line}" + (f" [{layout}]" if len(layouts) > 1 else ""))

    # The comparison pass: sentences grouped by their own output limit, so each one is decoded
    # under exactly our limit (greedy and beam alike).
    compare = (("greedy", 1, args.ours_greedy), (f"beam {args.beam}", args.beam, args.ours_beam))
    if not (args.ours_greedy or args.ours_beam):
        return
    translator = ctranslate2.Translator(
        args.ct2, device="cpu", compute_type=args.compute_type, inter_threads=1,
        intra_threads=compare_threads,
    )
    groups = {}
    for i in sorted(range(len(lines)), key=lambda i: limits[i]):
        groups.setdefault(limits[i], []).append(i)
    os.makedirs(args.out_dir, exist_ok=True)
    for name, beam, path in compare:
        if not path:
            continue
        results = [None] * len(lines)
        for limit, members in groups.items():
            out = translate(translator, [sources[i] for i in members], args, beam, limit)
            for i, r in zip(members, out):
                results[i] = r
        hyps = [hypothesis(vocab, r, l) for r, l in zip(results, limits)]
        texts = [vocab.decode(ids) for ids, _ in hyps]
        out_path = os.path.join(args.out_dir, "ct2." + name.replace(" ", "") + ".txt")
        with open(out_path, "w", encoding="utf-8") as f:
            for text in texts:
                f.write(text.replace("\n", "\\n") + "\n")
        ours = read_ours(path, len(lines))
        same = [text == o[1] for text, o in zip(texts, ours)]
        print(f"identical {name} outputs: {sum(same)}/{len(lines)}")
        odd = sum(any(i in (PAD, BOS) for i in ids) for ids, _ in hyps)
        if odd:
            print(f"  note: {odd} CTranslate2 outputs contain <pad> or <s> (ours never emits them)")
        if beam == 1:
            # Both scores are the summed log-probabilities, final EOS included.
            diffs = [abs(s - o[0]) for (_, s), o, ok in zip(hyps, ours, same) if ok]
            if diffs:
                print(
                    "  summed log-probability |ours - ct2| over the identical outputs: "
                    f"max {max(diffs):.2e}, mean {sum(diffs) / len(diffs):.2e}"
                )
        else:
            # CTranslate2 ranks by log p / |Y|^alpha (|Y| with the EOS here, as
            # return_end_token is on); ours by log p / ((5 + |Y|) / 6)^alpha. Rescore CT2's
            # pick under ours to see whose search found the better hypothesis by our measure.
            better = worse = 0
            for (ids, s), o, ok in zip(hyps, ours, same):
                if ok or not ids:
                    continue
                logp = s * len(ids) ** args.alpha
                ct2_ours = logp / ((5 + len(ids)) / 6) ** args.alpha
                if o[0] >= ct2_ours - 1e-4:
                    better += 1
                else:
                    worse += 1
            if better or worse:
                print(
                    f"  of the {better + worse} that differ, scored by our length penalty: "
                    f"ours scores higher or equal in {better}, CTranslate2's pick in {worse}"
                )
        shown = 0
        for i, ok in enumerate(same):
            if not ok and shown < args.show:
                print(f"  differs, sentence {i + 1}: {lines[i]!r}")
                print(f"    ours: {ours[i][1]!r} (score {ours[i][0]:.4f})")
                print(f"    ct2:  {texts[i]!r} (score {hyps[i][1]:.4f})")
                shown += 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="write the source sentences to translate")
    p.add_argument("--model", required=True)
    p.add_argument("--input", required=True, help="TSV (first column used) or plain text")
    p.add_argument("--n", type=int, default=0, help="at most N sentences (0: all)")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_prepare)
    r = sub.add_parser("run", help="time CTranslate2 and compare with our outputs")
    r.add_argument("--model", required=True, help="our model directory (tokenizer, config)")
    r.add_argument("--ct2", required=True, help="the CTranslate2 export of it")
    r.add_argument("--src", required=True, help="source sentences, one per line")
    r.add_argument("--threads", default="1 2", help='thread counts to time, e.g. "1 2" ("": none)')
    r.add_argument(
        "--compare-threads", type=int, default=0, help="threads of the comparison pass (default: the last of --threads)"
    )
    r.add_argument("--batch", type=int, default=32, help="sentences per batch")
    r.add_argument(
        "--compute-type",
        default="float32",
        help="CTranslate2's compute_type: float32, or int8 (weights per output row, "
        "activations quantised on the fly: the scheme of our --precision int8)",
    )
    r.add_argument("--beam", type=int, default=4)
    r.add_argument("--alpha", type=float, default=0.6, help="length penalty (beam only)")
    r.add_argument("--max-extra", type=int, default=50, help="output limit: source length + this")
    r.add_argument("--ours-greedy", help="`transformer translate --nbest 1 --alpha 0` output")
    r.add_argument("--ours-beam", help="`transformer translate --beam K --nbest 1` output")
    r.add_argument("--out-dir", default=".", help="where ct2.greedy.txt / ct2.beamK.txt go")
    r.add_argument("--show", type=int, default=3, help="differing sentences to print")
    r.set_defaults(fn=cmd_run)
    args = parser.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
