"""A small inline-SVG line chart for the job report: no scripts, no external files."""

from __future__ import annotations

import html
from typing import Sequence

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def line_chart(title: str, series: Sequence[tuple[str, Sequence[tuple[float, float]]]], *,
               marks: Sequence[float] = (), width: int = 900, height: int = 300) -> str:
    """A titled chart: one polyline per (label, points) series, dotted vertical lines at ``marks``."""
    points = [p for _, pts in series for p in pts]
    head = f"<h2>{html.escape(title)}</h2>"
    if not points:
        return head + "<p>no data recorded</p>"
    left, right, top, bottom = 70, 20, 10, 40
    w, h = width - left - right, height - top - bottom
    x_lo, x_hi = min(p[0] for p in points), max(p[0] for p in points)
    y_lo, y_hi = min(0.0, min(p[1] for p in points)), max(p[1] for p in points)
    x_span = (x_hi - x_lo) or 1.0
    y_span = (y_hi - y_lo) or 1.0

    def x(v: float) -> float:
        return left + w * (v - x_lo) / x_span

    def y(v: float) -> float:
        return top + h - h * (v - y_lo) / y_span

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'style="background:#fff;border:1px solid #ccc">',
             f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" stroke="#333"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + h}" stroke="#333"/>']
    for frac in (0.0, 0.5, 1.0):
        yv, xv = y_lo + frac * y_span, x_lo + frac * x_span
        parts.append(f'<text x="{left - 6}" y="{y(yv) + 4:.1f}" font-size="11" text-anchor="end">{yv:.4g}</text>')
        parts.append(f'<text x="{x(xv):.1f}" y="{top + h + 16}" font-size="11" text-anchor="middle">{xv:.4g}</text>')
    for mark in marks:
        if x_lo <= mark <= x_hi:
            parts.append(f'<line x1="{x(mark):.1f}" y1="{top}" x2="{x(mark):.1f}" y2="{top + h}" '
                         'stroke="#999" stroke-dasharray="3,3"/>')
    for i, (label, pts) in enumerate(series):
        if not pts:
            continue
        colour = COLOURS[i % len(COLOURS)]
        path = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in pts)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{path}"/>')
        parts.append(f'<text x="{left + 10 + 90 * i}" y="{top + h + 34}" font-size="12" fill="{colour}">'
                     f'{html.escape(label)}</text>')
    parts.append("</svg>")
    return head + "".join(parts)
