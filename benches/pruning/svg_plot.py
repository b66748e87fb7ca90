"""What plot.py and plot_bleu.py draw alike: one series of an SVG line plot with its legend entry."""


def series(out, xs, ys, legend_x, legend_y, pts, color, label, dash=''):
    """Appends to `out` the polyline and dots of `pts` ((x, y) data points, placed by `xs` and
    `ys`) and, at (`legend_x`, `legend_y`), a legend entry: a short line and `label`."""
    d = ' '.join(f'{xs(x):.1f},{ys(y):.1f}' for x, y in pts)
    out.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="2" {dash}/>')
    for x, y in pts:
        out.append(f'<circle cx="{xs(x):.1f}" cy="{ys(y):.1f}" r="3" fill="{color}"/>')
    out.append(f'<line x1="{legend_x}" y1="{legend_y}" x2="{legend_x + 20}" y2="{legend_y}" stroke="{color}" stroke-width="2" {dash}/>')
    out.append(f'<text x="{legend_x + 25}" y="{legend_y + 4}">{label}</text>')
