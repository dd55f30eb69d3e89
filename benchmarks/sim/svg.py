"""Line charts as SVG, with no plotting library: the report's plots over time."""

from __future__ import annotations

from html import escape

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#7f7f7f")
W, H, LEFT, RIGHT, TOP, BOTTOM = 760, 320, 56, 190, 30, 40


def line_chart(
    title: str,
    series: dict[str, list[tuple[float, float]]],
    x_label: str,
    y_label: str,
    y_max: float | None = None,
) -> str:
    """``series``: name -> [(x, y), ...]. The y axis starts at 0."""
    points = [p for pts in series.values() for p in pts]
    x_max = max((x for x, _ in points), default=1.0) or 1.0
    top = y_max if y_max is not None else max((y for _, y in points), default=1.0) or 1.0
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + pw * x / x_max

    def sy(y: float) -> float:
        return TOP + ph * (1 - min(y, top) / top)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="{LEFT}" y="18" font-size="13">{escape(title)}</text>',
        f'<line x1="{LEFT}" y1="{TOP + ph}" x2="{LEFT + pw}" y2="{TOP + ph}" stroke="black"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + ph}" stroke="black"/>',
        f'<text x="{LEFT + pw / 2}" y="{H - 8}" text-anchor="middle">{escape(x_label)}</text>',
        f'<text x="14" y="{TOP + ph / 2}" transform="rotate(-90 14 {TOP + ph / 2})" '
        f'text-anchor="middle">{escape(y_label)}</text>',
    ]
    for i in range(5):
        y = top * i / 4
        out.append(f'<text x="{LEFT - 6}" y="{sy(y) + 4}" text-anchor="end">{y:.3g}</text>')
        out.append(f'<line x1="{LEFT}" y1="{sy(y)}" x2="{LEFT + pw}" y2="{sy(y)}" stroke="#ddd"/>')
        x = x_max * i / 4
        out.append(f'<text x="{sx(x)}" y="{TOP + ph + 14}" text-anchor="middle">{x:.3g}</text>')
    for n, (name, pts) in enumerate(series.items()):
        color = COLORS[n % len(COLORS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.3" points="{path}"/>')
        ly = TOP + 14 * n + 6
        out.append(
            f'<line x1="{W - RIGHT + 10}" y1="{ly}" x2="{W - RIGHT + 30}" y2="{ly}" '
            f'stroke="{color}" stroke-width="2"/>'
        )
        out.append(f'<text x="{W - RIGHT + 34}" y="{ly + 4}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)
