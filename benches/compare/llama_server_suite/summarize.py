#!/usr/bin/env python3
"""Pass/fail/skip counts per file of a pytest junit XML (llama.cpp's server suite), the
applicable files and the not applicable ones (given as `file=reason` lines) apart.

    summarize.py junit.xml "test_x.py=why\ntest_y.py=why" [--failures]
"""
import collections
import sys
import xml.etree.ElementTree as ET


def main():
    junit, not_applicable = sys.argv[1], {}
    for line in sys.argv[2].splitlines() if len(sys.argv) > 2 else []:
        if "=" in line:
            name, why = line.split("=", 1)
            not_applicable[name] = why
    counts = collections.defaultdict(collections.Counter)
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
