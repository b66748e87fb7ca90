#!/usr/bin/env python3
"""results.tsv of deen.sh -> a markdown table (stdout) and an SVG plot: ding.test BLEU against
heads removed, by importance and at random (mean of the seeds, each seed as a dot), without and
with the fine-tune.
Usage: plot_bleu.py results.tsv out.svg TOTAL_HEADS"""
import sys
from collections import defaultdict

from svg_plot import series

rows = [l.rstrip('\n').split('\t') for l in open(sys.argv[1])][1:]
total = int(sys.argv[3])
imp, rnd = defaultdict(dict), defaultdict(lambda: defaultdict(dict))
for removed, order, seed, steps, bleu, *_ in rows:
    n, s, b = int(removed), int(steps), float(bleu)
    if order == 'importance':
        imp[s][n] = b
    else:
        rnd[s][n][int(seed)] = b
mean = lambda d: sum(d.values()) / len(d)
steps = sorted(imp)
print('| heads removed | ' + ' | '.join(
    f'importance{", " + str(s) + " fine-tune updates" if s else ""} | random{", " + str(s) + " updates" if s else ""}: seeds 1 / 2 / 3 (mean)'
    for s in steps) + ' |')
print('|---' * (1 + 2 * len(steps)) + '|')
for n in sorted(imp[0]):
    cells = []
    for s in steps:
        cells.append(f'**{imp[s][n]:.2f}**' if n in imp[s] else '—')
        r = rnd[s].get(n)
        cells.append(' / '.join(f'{r[k]:.2f}' for k in sorted(r)) + f' ({mean(r):.2f})' if r else '—')
    print(f'| {n} ({100 * n / total:.0f}%) | ' + ' | '.join(cells) + ' |')

W, H, L, R, T, B = 640, 400, 60, 190, 40, 50
xs = lambda n: L + (W - L - R) * n / total
hi = max(b for d in imp.values() for b in d.values()) + 0.5
ys = lambda b: T + (H - T - B) * (1 - b / hi)
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="{W / 2 - 150}" y="20" font-size="14">De-En model (36 heads): heads pruned vs ding.test BLEU</text>',
       f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
       f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
       f'<text x="{(L + W - R) / 2 - 60}" y="{H - 12}">heads removed (of {total})</text>',
       f'<text x="10" y="{T - 10}">BLEU (beam 4)</text>']
for n in sorted(imp[0]):
    out.append(f'<text x="{xs(n) - 6}" y="{H - B + 16}">{n}</text>')
for t in range(0, int(hi) + 1):
    out.append(f'<text x="{L - 20}" y="{ys(t) + 4}">{t}</text>')
    out.append(f'<line x1="{L}" y1="{ys(t)}" x2="{W - R}" y2="{ys(t)}" stroke="#ddd"/>')
def line(pts, color, label, i, dash=''):
    series(out, xs, ys, W - R + 10, T + 20 * i, pts, color, label, dash)
colors = {0: ('#1f77b4', '#ff7f0e'), max(steps): ('#2ca02c', '#d62728')}
for i, s in enumerate(steps):
    ci, cr = colors[s] if s in colors else ('#555', '#999')
    tag = f', +{s} updates' if s else ''
    line(sorted(imp[s].items()), ci, f'importance{tag}', 2 * i)
    base = imp[s].get(0, imp[0][0])
    line([(0, base)] + sorted((n, mean(d)) for n, d in rnd[s].items()), cr, f'random mean{tag}', 2 * i + 1, 'stroke-dasharray="4 3"')
    for n, d in rnd[s].items():
        for b in d.values():
            out.append(f'<circle cx="{xs(n):.1f}" cy="{ys(b):.1f}" r="2" fill="none" stroke="{cr}"/>')
out.append('</svg>')
open(sys.argv[2], 'w').write('\n'.join(out))
