"""A server-side SVG bar chart (no JavaScript, no CDN): cost per agent for a week, with last week's as a marker."""

from __future__ import annotations

from django.utils.html import escape


def cost_bars_svg(rows: list[dict], width: int = 760, bar_height: int = 22) -> str:
    if not rows:
        return '<svg xmlns="http://www.w3.org/2000/svg" width="300" height="30"><text x="0" y="20">no entries</text></svg>'
    label_w, gap = 190, 6
    top = max(max(r["cost"] for r in rows), max((r["cost"] - (r["cost_change"] or 0)) for r in rows), 1e-9)
    plot_w = width - label_w - 110
    height = len(rows) * (bar_height + gap) + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="cost per agent">']
    for i, row in enumerate(sorted(rows, key=lambda r: -r["cost"])):
        y = i * (bar_height + gap) + 10
        w = row["cost"] / top * plot_w
        prev = row["cost"] - (row["cost_change"] or 0) if row["cost_change"] is not None else None
        parts.append(f'<text x="0" y="{y + 15}" font-size="12">{escape(row.get("agent", row["team"]))}</text>')
        parts.append(f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_height}" fill="#417690"/>')
        if prev is not None:
            px = label_w + prev / top * plot_w
            parts.append(f'<line x1="{px:.1f}" y1="{y - 2}" x2="{px:.1f}" y2="{y + bar_height + 2}" '
                         f'stroke="#ba2121" stroke-width="2"><title>last week {prev:.4f}</title></line>')
        parts.append(f'<text x="{label_w + w + 6:.1f}" y="{y + 15}" font-size="12">{row["cost"]:.4f}</text>')
    parts.append("</svg>")
    return "".join(parts)


def trend_svg(points: list[tuple[str, float]], width: int = 760, height: int = 160) -> str:
    """Total cost per ISO week as a line, oldest first."""
    if not points:
        return ""
    top = max(v for _, v in points) or 1e-9
    left, bottom, plot_w, plot_h = 10, height - 24, width - 120, height - 40
    step = plot_w / max(1, len(points) - 1)
    coords = [(left + i * step, bottom - v / top * plot_h) for i, (_, v) in enumerate(points)]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="cost per week">',
             '<polyline fill="none" stroke="#417690" stroke-width="2" points="'
             + " ".join(f"{x:.1f},{y:.1f}" for x, y in coords) + '"/>']
    for (x, y), (week, value) in zip(coords, points, strict=True):
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="#417690"><title>{escape(week)}: '
                     f'{value:.4f}</title></circle>')
        parts.append(f'<text x="{x:.1f}" y="{height - 6}" font-size="10" text-anchor="middle">{escape(week[5:])}</text>')
    parts.append("</svg>")
    return "".join(parts)
