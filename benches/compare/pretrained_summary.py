"""Table of benches/compare/pretrained.sh's results (results.jsonl, one JSON line per run).

For each thread count and implementation: the median prompt and decode tokens/s over every timed
repetition of every round, the peak resident memory (the largest over the rounds); the ratios
ours / transformers and ours / llama.cpp are the medians over the rounds of the ratio of the
two runs' medians in the same round (runs of one round are back to back, so they share the
machine's load). Also: how many of the greedy ids agree with ours from the start. Then the
same per CPU-second (tokens / the CPU time all of a process's threads spent, where reported):
steadier than wall time on a machine shared with other work, but it counts threads that spin
while they wait as busy.
"""

import json
import statistics
import sys
from collections import defaultdict


def main():
    runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    by = defaultdict(list)  # (threads, impl) -> runs
    for r in runs:
        by[(r["threads"], r["impl"])].append(r)
    impls = [i for i in ("ours", "transformers", "llama.cpp") if any(k[1] == i for k in by)]
    threads = sorted({k[0] for k in by})
    first = runs[0]
    print(f"{first['prompt_tokens']}-token prompt, {first['new_tokens']} greedy new tokens; "
          f"medians over {len(runs[0]['prefill_tps'])} repetitions x "
          f"{len({r['round'] for r in runs})} rounds; load averages before the runs: "
          f"{min(r['load_before'] for r in runs):.2f} to {max(r['load_before'] for r in runs):.2f}")
    print()
    print("| threads | implementation | prompt tokens/s | decode tokens/s | ours / it (prompt) "
          "| ours / it (decode) | peak memory (MiB) | greedy ids equal to ours |")
    print("|---|---|---|---|---|---|---|---|")
    for t in threads:
        ours_rounds = {r["round"]: r for r in by.get((t, "ours"), [])}
        for impl in impls:
            rs = by.get((t, impl), [])
            if not rs:
                continue
            pre = statistics.median(x for r in rs for x in r["prefill_tps"])
            dec = statistics.median(x for r in rs for x in r["decode_tps"])
            mem = max(r["peak_rss_mib"] or 0 for r in rs)
            ratio_p, ratio_d, agree = "", "", ""
            if impl != "ours" and ours_rounds:
                rp, rd = [], []
                for r in rs:
                    o = ours_rounds.get(r["round"])
                    if o:
                        rp.append(statistics.median(o["prefill_tps"])
                                  / statistics.median(r["prefill_tps"]))
                        rd.append(statistics.median(o["decode_tps"])
                                  / statistics.median(r["decode_tps"]))
                        a, b = o["new_ids"], r["new_ids"]
                        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                                 min(len(a), len(b)))
                        agree = f"{n} / {len(a)}"
                if rp:
                    ratio_p = f"{statistics.median(rp):.2f}"
                    ratio_d = f"{statistics.median(rd):.2f}"
            print(f"| {t} | {impl} | {pre:.1f} | {dec:.1f} | {ratio_p} | {ratio_d} | {mem:.0f} "
                  f"| {agree} |")
    print()
    if all("decode_cpu_s" in r for r in runs):
        print("Per CPU-second (tokens / CPU seconds of all the process's threads):")
        print()
        print("| threads | implementation | prompt tokens per CPU-s | decode tokens per CPU-s "
              "| ours / it (prompt) | ours / it (decode) |")
        print("|---|---|---|---|---|---|")
        for t in threads:
            rows = {}
            for impl in impls:
                rs = by.get((t, impl), [])
                if not rs:
                    continue
                p = statistics.median(
                    r["prompt_tokens"] / c for r in rs for c in r["prefill_cpu_s"] if c > 0)
                d = statistics.median(
                    r["new_tokens"] / c for r in rs for c in r["decode_cpu_s"] if c > 0)
                rows[impl] = (p, d)
            for impl, (p, d) in rows.items():
                o = rows.get("ours")
                rp = f"{o[0] / p:.2f}" if o and impl != "ours" else ""
                rd = f"{o[1] / d:.2f}" if o and impl != "ours" else ""
                print(f"| {t} | {impl} | {p:.1f} | {d:.1f} | {rp} | {rd} |")
        print()
    for impl in impls:
        v = next(r for r in runs if r["impl"] == impl).get("version", "")
        print(f"- {impl}: {v}")


if __name__ == "__main__":
    main()
