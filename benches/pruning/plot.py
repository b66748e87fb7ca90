#!/usr/bin/env python3
"""results.tsv of smollm2.sh -> a markdown table (stdout) and an SVG plot: perplexity against
query heads removed, by importance, random (each seed and the mean), and fine-tuned.
Usage: plot.py results.tsv out.svg TOTAL_HEADS"""
import sys
from collections import defaultdict

from svg_plot import series

rows = [l.rstrip('\n').split('\t') for l in open(sys.argv[1])][1:]
total = int(sys.argv[3])
imp, ft, rnd = {}, {}, defaultdict(dict)
for removed, order, seed, steps, ppl, *_ in rows:
    n, p = int(removed), float(ppl)
    if order == 'importance' and steps == '0':
        imp[n] = p
    elif order == 'importance':
        ft[n] = (p, int(steps))
    else:
        rnd[n][int(seed)] = p
base = imp[0]
pct = lambda p: f'{100 * (p / base - 1):+.1f}%'
print('| heads removed | by importance | random, seeds 1 / 2 / 3 | random, mean | importance + fine-tune |')
print('|---|---|---|---|---|')
for n in sorted(imp):
    r = rnd.get(n, {})
    mean = sum(r.values()) / len(r) if r else None
    seeds = ' / '.join(f'{r[s]:.2f}' for s in sorted(r)) if r else '—'
    f = f'{ft[n][0]:.2f} ({pct(ft[n][0])}, {ft[n][1]} steps)' if n in ft else '—'
    m = f'{mean:.2f} ({pct(mean)})' if mean else '—'
    print(f'| {n} ({100 * n / total:.0f}%) | **{imp[n]:.2f}** ({pct(imp[n])}) | {seeds} | {m} | {f} |')

# The plot: x = fraction removed, y = log perplexity.
import math
W, H, L, R, T, B = 640, 400, 70, 170, 40, 50
xs = lambda n: L + (W - L - R) * n / total
allp = [p for p in imp.values()] + [p for d in rnd.values() for p in d.values()] + [p for p, _ in ft.values()]
lo, hi = math.log(min(allp)) - 0.05, math.log(max(allp)) + 0.05
ys = lambda p: T + (H - T - B) * (1 - (math.log(p) - lo) / (hi - lo))
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="{W / 2 - 60}" y="20" font-size="14">SmolLM2-135M-Instruct: heads pruned vs held-out perplexity</text>',
       f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
       f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
       f'<text x="{(L + W - R) / 2 - 80}" y="{H - 12}">query heads removed (of {total})</text>',
       f'<text x="14" y="{T - 10}">perplexity (log scale)</text>']
for n in sorted(imp):
    out.append(f'<text x="{xs(n) - 8}" y="{H - B + 16}">{n}</text>')
    out.append(f'<line x1="{xs(n)}" y1="{H - B}" x2="{xs(n)}" y2="{H - B + 4}" stroke="black"/>')
k = math.exp(lo)
ticks = [t for t in [10, 15, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000, 2000, 5000, 10000, 30000] if lo <= math.log(t) <= hi]
for t in ticks:
    out.append(f'<text x="{L - 45}" y="{ys(t) + 4}">{t}</text>')
    out.append(f'<line x1="{L}" y1="{ys(t)}" x2="{W - R}" y2="{ys(t)}" stroke="#ddd"/>')
def line(pts, color, label, i, dash=''):
    series(out, xs, ys, W - R + 10, T + 20 * i, pts, color, label, dash)
line(sorted(imp.items()), '#1f77b4', 'importance', 0)
for s, c in zip([1, 2, 3], ['#ff7f0e', '#ffaa55', '#ffcc99']):
    pts = [(0, base)] + sorted((n, d[s]) for n, d in rnd.items() if s in d)
    line(pts, c, f'random, seed {s}', s, 'stroke-dasharray="4 3"')
if ft:
    line([(0, base)] + sorted((n, p) for n, (p, _) in ft.items()), '#2ca02c', 'importance + fine-tune', 4)
out.append('</svg>')
open(sys.argv[2], 'w').write('\n'.join(out))
