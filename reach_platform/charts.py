"""Server-side SVG for the operations dashboard (no JavaScript, no CDN), in the manner of ledger/charts.py."""

from __future__ import annotations

from django.utils.html import escape

OK, FAILED, OTHER, LINE = "#2e7d32", "#c62828", "#9e9e9e", "#417690"


def _svg(width: int, height: int, label: str, parts: list[str]) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
            f'aria-label="{escape(label)}">' + "".join(parts) + "</svg>")


def hourly_svg(points: list[tuple[str, int, int, int]], width: int = 720, height: int = 140) -> str:
    """Invokes per hour, oldest first, as stacked columns: succeeded (green), failed (red), the rest (grey)."""
    top = max((ok + failed + other for _, ok, failed, other in points), default=0) or 1
    bottom, plot_h = height - 18, height - 30
    step = width / max(1, len(points))
    parts = []
    for i, (label, ok, failed, other) in enumerate(points):
        x, y = i * step + 1, float(bottom)
        for value, colour in ((ok, OK), (failed, FAILED), (other, OTHER)):
            h = value / top * plot_h
            if h:
                parts.append(f'<rect x="{x:.1f}" y="{y - h:.1f}" width="{step - 2:.1f}" height="{h:.1f}" '
                             f'fill="{colour}"/>')
                y -= h
        parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{step - 2:.1f}" height="{bottom - y:.1f}" '
                     f'fill="transparent"><title>{escape(label)}: {ok} ok, {failed} failed, {other} other</title>'
                     f'</rect>')
        if i % 4 == 0:
            parts.append(f'<text x="{x:.1f}" y="{height - 4}" font-size="10">{escape(label)}</text>')
    parts.append(f'<text x="{width - 4}" y="10" font-size="10" text-anchor="end">max {top}/h</text>')
    return _svg(width, height, "invokes per hour", parts)


def share_bar_svg(ok: int, failed: int, other: int, width: int = 160, height: int = 12) -> str:
    """One agent's invokes as a stacked bar: succeeded, failed, the rest."""
    total = ok + failed + other
    if not total:
        return _svg(width, height, "no invokes", [f'<rect width="{width}" height="{height}" fill="#eee"/>'])
    parts, x = [], 0.0
    for value, colour in ((ok, OK), (failed, FAILED), (other, OTHER)):
        w = value / total * width
        if w:
            parts.append(f'<rect x="{x:.1f}" width="{w:.1f}" height="{height}" fill="{colour}"/>')
            x += w
    return _svg(width, height, f"{ok} ok, {failed} failed, {other} other", parts)


def gauge_svg(ratio: float, warn: float, width: int = 160, height: int = 12) -> str:
    """Spend against a budget: the filled share, red past the warn ratio, with the warn ratio as a mark."""
    fill = FAILED if ratio >= warn else LINE
    w = min(1.0, max(0.0, ratio)) * width
    mark = warn * width
    return _svg(width, height, f"{ratio:.0%} of the budget", [
        f'<rect width="{width}" height="{height}" fill="#eee"/>',
        f'<rect width="{w:.1f}" height="{height}" fill="{fill}"/>',
        f'<line x1="{mark:.1f}" y1="0" x2="{mark:.1f}" y2="{height}" stroke="#000" stroke-width="1"/>'])
