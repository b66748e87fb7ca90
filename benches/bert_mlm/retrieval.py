#!/usr/bin/env python3
"""A small retrieval check of sentence embeddings (no numpy needed).

Usage: retrieval.py SENTENCES QUERIES EMB_SENTENCES EMB_QUERIES

SENTENCES and QUERIES are text files of one sentence a line (QUERIES[i] a perturbed copy of
SENTENCES[i], see make_queries.py); EMB_* are `transformer embed` outputs for them (one JSON
line {"embedding": [...]} per input line, L2-normalised). For each query, the sentences are
ranked by cosine similarity (a dot product of unit vectors); printed: top-1 accuracy (the
query's own sentence ranks first), top-5 accuracy and the mean reciprocal rank, as JSON.
"""
import json
import sys


def read_embeddings(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["embedding"] for line in f if line.strip()]


def main():
    sentences, queries, emb_s, emb_q = sys.argv[1:5]
    n = sum(1 for _ in open(sentences, encoding="utf-8"))
    s = read_embeddings(emb_s)
    q = read_embeddings(emb_q)
    assert len(s) == len(q) == n, (len(s), len(q), n)
    top1 = top5 = 0
    rr = 0.0
    for i, qi in enumerate(q):
        scores = [sum(a * b for a, b in zip(qi, sj)) for sj in s]
        own = scores[i]
        rank = 1 + sum(1 for j, x in enumerate(scores) if j != i and x >= own)
        top1 += rank == 1
        top5 += rank <= 5
        rr += 1.0 / rank
    print(json.dumps({"n": n, "top1": top1 / n, "top5": top5 / n, "mrr": rr / n}))


if __name__ == "__main__":
    main()
