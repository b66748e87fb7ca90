#!/usr/bin/env python3
"""The retrieval check's data: the English side of the first N lines of a parallel TSV
(German<TAB>English), and for each a lightly perturbed copy: one word (chosen with a seeded
generator, among sentences of at least 4 words) deleted, and another pair of neighbouring
words swapped. Writes SENTENCES and QUERIES, one line each.

Usage: make_queries.py TSV N SENTENCES QUERIES
"""
import random
import sys


def perturb(sentence, rng):
    words = sentence.split()
    if len(words) >= 4:
        del words[rng.randrange(len(words))]
        i = rng.randrange(len(words) - 1)
        words[i], words[i + 1] = words[i + 1], words[i]
    return " ".join(words)


def main():
    tsv, n, out_s, out_q = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    rng = random.Random(28)
    english = []
    with open(tsv, encoding="utf-8") as f:
        for line in f:
            en = line.rstrip("\n").split("\t")[1].strip()
            if en and en not in english:
                english.append(en)
            if len(english) == n:
                break
    with open(out_s, "w", encoding="utf-8") as fs, open(out_q, "w", encoding="utf-8") as fq:
        for en in english:
            fs.write(en + "\n")
            fq.write(perturb(en, rng) + "\n")


if __name__ == "__main__":
    main()
