"""Minimal inline-SVG charts for the run report: line charts and grouped bars, no plotting dependency.

The report must render on an air-gapped cluster and inside Airflow's UI without JavaScript or a CDN, so the
charts are plain SVG strings built here (a few dozen lines instead of matplotlib in every worker image).
"""

from __future__ import annotations

import html
import math

PALETTE = ("#3b6ea8", "#d9822b", "#3a9b5c", "#b5443c", "#7d5ba6", "#8c6d4f", "#c76fa8", "#6b6b6b")


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 5, 10) if m * mag >= raw), default=mag * 10)
    start = math.floor(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step) + 2) if start + i * step <= hi + 1e-12]


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e4 or abs(v) < 1e-2:
        return f"{v:.1e}"
    return f"{v:.3g}"


def line_chart(series: dict[str, list[tuple[float, float]]], title: str, x_label: str = "", y_label: str = "",
               width: int = 520, height: int = 260) -> str:
    """One polyline per series of (x, y) points."""
    pts = [p for s in series.values() for p in s if all(math.isfinite(v) for v in p)]
    if not pts:
        return f"<p><em>{html.escape(title)}: no data</em></p>"
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y1 = y0 + abs(y0) * 0.1 + 1e-9
    ml, mr, mt, mb = 58, 12, 26, 36
    pw, ph = width - ml - mr, height - mt - mb

    def sx(x):
        return ml + (x - x0) / (x1 - x0) * pw

    def sy(y):
        return mt + ph - (y - y0) / (y1 - y0) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="11"><text x="{width / 2}" y="16" text-anchor="middle" font-weight="bold">'
           f"{html.escape(title)}</text>"]
    for t in _nice_ticks(y0, y1):
        if y0 <= t <= y1:
            out.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#e4e4e4"/>'
                       f'<text x="{ml - 4}" y="{sy(t) + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    for t in _nice_ticks(x0, x1):
        if x0 <= t <= x1:
            out.append(f'<text x="{sx(t):.1f}" y="{mt + ph + 14}" text-anchor="middle">{_fmt(t)}</text>')
    out.append(f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    for i, (name, s) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s if math.isfinite(x) and math.isfinite(y))
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{path}"/>')
        out.append(f'<text x="{ml + 8 + 110 * i}" y="{mt + ph + 30}" fill="{color}">■ {html.escape(name)}</text>')
    out.append(f'<text x="{ml + pw}" y="{mt + ph + 30}" text-anchor="end">{html.escape(x_label)}</text>')
    out.append(f'<text x="12" y="{mt + ph / 2}" transform="rotate(-90 12 {mt + ph / 2})" text-anchor="middle">'
               f"{html.escape(y_label)}</text></svg>")
    return "".join(out)


def bar_chart(groups: dict[str, dict[str, float]], title: str, y_label: str = "", width: int = 520,
              height: int = 260) -> str:
    """Grouped bars: one group per key of ``groups``, one bar per inner key (same colour across groups)."""
    series = sorted({k for g in groups.values() for k in g})
    values = [v for g in groups.values() for v in g.values()]
    if not groups or not series:
        return f"<p><em>{html.escape(title)}: no data</em></p>"
    top = max(max(values), 1e-12)
    ml, mr, mt, mb = 58, 12, 26, 52
    pw, ph = width - ml - mr, height - mt - mb
    gw = pw / len(groups)
    bw = max(gw * 0.8 / len(series), 1.0)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="11"><text x="{width / 2}" y="16" text-anchor="middle" font-weight="bold">'
           f"{html.escape(title)}</text>"]
    for t in _nice_ticks(0, top):
        y = mt + ph - t / top * ph
        if t <= top:
            out.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e4e4"/>'
                       f'<text x="{ml - 4}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    for gi, (gname, g) in enumerate(groups.items()):
        gx = ml + gi * gw + gw * 0.1
        for si, sname in enumerate(series):
            v = g.get(sname, 0.0)
            h = v / top * ph
            out.append(f'<rect x="{gx + si * bw:.1f}" y="{mt + ph - h:.1f}" width="{bw - 1:.1f}" height="{h:.1f}" '
                       f'fill="{PALETTE[si % len(PALETTE)]}"><title>{html.escape(gname)} / '
                       f"{html.escape(sname)}: {_fmt(v)}</title></rect>")
        out.append(f'<text x="{ml + gi * gw + gw / 2:.1f}" y="{mt + ph + 14}" text-anchor="middle">'
                   f"{html.escape(gname)}</text>")
    for si, sname in enumerate(series):
        out.append(f'<text x="{ml + 8 + 120 * si}" y="{mt + ph + 34}" fill="{PALETTE[si % len(PALETTE)]}">■ '
                   f"{html.escape(sname)}</text>")
    out.append(f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>'
               f'<text x="12" y="{mt + ph / 2}" transform="rotate(-90 12 {mt + ph / 2})" text-anchor="middle">'
               f"{html.escape(y_label)}</text></svg>")
    return "".join(out)
