"""``report.svg``: every difference of the report as a dot and its 95 % interval against zero, with the A/A noise
floor shaded and the positive control on top, so a reader sees at a glance which differences clear the floor.
Plain SVG text (no plotting library), the same bytes for the same report."""

from __future__ import annotations

from html import escape

ROW, LEFT, WIDTH, PAD = 22, 190, 420, 12


def _rows(report: dict) -> list[tuple[str, dict]]:
    rows = []
    if report.get("control"):
        rows.append((f"control ({'detected' if report['control_detected'] else 'not detected'})", report["control"]))
    for arm, scopes in report["differences"].items():
        rows += [(f"{arm} - {report['baseline']}: {scope}", iv) for scope, iv in scopes.items()]
    return rows


def svg(report: dict) -> str:
    """The plot as SVG text; the axis spans every interval, zero and the floor."""
    rows = _rows(report)
    floor = report.get("noise_floor") or 0.0
    ends = [v for _, iv in rows for v in (iv["mean"], iv["lo"], iv["hi"]) if v is not None] + [floor, -floor, 0.0]
    lo, hi = min(ends), max(ends)
    span = (hi - lo) or 1.0
    lo, hi = lo - 0.05 * span, hi + 0.05 * span

    def x(v: float) -> float:
        return round(LEFT + (v - lo) / (hi - lo) * WIDTH, 2)

    height = PAD * 2 + ROW * (len(rows) + 1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + WIDTH + PAD}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect x="{x(-floor)}" y="{PAD}" width="{round(x(floor) - x(-floor), 2)}" '
           f'height="{ROW * len(rows)}" fill="#eeeeee"/>',
           f'<line x1="{x(0)}" y1="{PAD}" x2="{x(0)}" y2="{PAD + ROW * len(rows)}" stroke="#888888"/>']
    for i, (label, iv) in enumerate(rows):
        y = PAD + ROW * i + ROW / 2
        out.append(f'<text x="{LEFT - 6}" y="{y + 4}" text-anchor="end">{escape(label)}</text>')
        if iv["lo"] is not None:
            out.append(f'<line x1="{x(iv["lo"])}" y1="{y}" x2="{x(iv["hi"])}" y2="{y}" stroke="#1f77b4" '
                       f'stroke-width="2"/>')
        out.append(f'<circle cx="{x(iv["mean"])}" cy="{y}" r="3.5" fill="#1f77b4"/>')
    axis = PAD + ROW * len(rows) + 14
    out += [f'<text x="{x(lo)}" y="{axis}">{lo:+.3f}</text>',
            f'<text x="{x(0)}" y="{axis}" text-anchor="middle">0</text>',
            f'<text x="{x(hi)}" y="{axis}" text-anchor="end">{hi:+.3f} bits/byte</text>', "</svg>"]
    return "\n".join(out) + "\n"


__all__ = ["svg"]
