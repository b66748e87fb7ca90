#!/usr/bin/env python3
"""Pass/fail/skip counts per file of a pytest junit XML (llama.cpp's server suite), the
applicable files and the not applicable ones (given as `file=reason` lines) apart.

    summarize.py junit.xml "test_x.py=why\ntest_y.py=why" [--failures]

model_bound.txt (beside this script) lists tests whose assertions are properties of the suite's
own models, which the models served here cannot have (see that file for the rule): each line
`file.py::test_name  reason`, the name matching a test and its parameter sets. They are counted
in the per-file table as always, and the percentage is also given over the rest.
"""
import collections
import os
import sys
import xml.etree.ElementTree as ET


def main():
    junit, not_applicable = sys.argv[1], {}
    for line in sys.argv[2].splitlines() if len(sys.argv) > 2 else []:
        if "=" in line:
            name, why = line.split("=", 1)
            not_applicable[name] = why
    bound = {}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model_bound.txt")
    for line in open(path) if os.path.exists(path) else []:
        if line.strip() and not line.startswith("#"):
            test, _, why = line.strip().partition(" ")
            bound[test] = why.strip()
    counts = collections.defaultdict(collections.Counter)
    unbound = collections.Counter()
    failures = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        # classname "unit.test_basic" (or "unit.test_basic.Class")
        module = case.get("classname", "").split(".")
        name = (module[1] if len(module) > 1 else module[0]) + ".py"
        if case.find("skipped") is not None:
            outcome = "skip"
        elif case.find("failure") is not None or case.find("error") is not None:
            outcome = "fail"
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            first = (bad.get("message") or "").splitlines()
            failures.append(f"{name}::{case.get('name')}: {first[0][:160] if first else ''}")
        else:
            outcome = "pass"
        counts[name][outcome] += 1
        test = f"{name}::{case.get('name')}"
        is_bound = any(test == b or test.startswith(b + "[") for b in bound)
        if name not in not_applicable and not is_bound:
            unbound[outcome] += 1
    total = collections.Counter()
    print(f"{'file':32} {'pass':>5} {'fail':>5} {'skip':>5}")
    for name in sorted(counts):
        if name in not_applicable:
            continue
        c = counts[name]
        total.update(c)
        print(f"{name:32} {c['pass']:5} {c['fail']:5} {c['skip']:5}")
    print(f"{'applicable, total':32} {total['pass']:5} {total['fail']:5} {total['skip']:5}"
          f"   ({total['pass']} of {sum(total.values())} pass)")
    n = sum(unbound.values())
    if bound and n:
        print(f"{'without the model-bound tests':32} {unbound['pass']:5} {unbound['fail']:5} "
              f"{unbound['skip']:5}   ({unbound['pass']} of {n} pass, "
              f"{100 * unbound['pass'] / n:.0f}%; {sum(total.values()) - n} set apart: "
              f"model_bound.txt)")
    shown = [n for n in sorted(counts) if n in not_applicable]
    if shown:
        print("not applicable (run with ALL=1):")
        for name in shown:
            c = counts[name]
            print(f"{name:32} {c['pass']:5} {c['fail']:5} {c['skip']:5}   {not_applicable[name]}")
    if "--failures" in sys.argv:
        print("\n".join(failures))


if __name__ == "__main__":
    main()
