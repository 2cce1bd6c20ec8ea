"""Charts of the run report, drawn by matplotlib as inline SVG (replaces the hand-written svgplot).

Why matplotlib: it autoscales every axis to its data (no series is clipped), lays legends out beside the axes
(they never cover each other or the data), and is maintained.  No global state is touched: figures are built with
the object API on the SVG canvas (no pyplot, no backend switch), under an ``rc_context`` that makes the output
deterministic — a fixed ``svg.hashsalt`` for element ids, no date in the metadata, text kept as text.
Every function returns an ``<svg>`` string, or a short ``<p>`` when there is nothing to draw.
"""

from __future__ import annotations

import html
import io
import math

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
RC = {"svg.hashsalt": "mindloom-report", "svg.fonttype": "none", "font.family": "sans-serif", "font.size": 9,
      "axes.titlesize": 10, "axes.titleweight": "bold", "axes.grid": True, "grid.color": "#e4e4e4",
      "axes.spines.top": False, "axes.spines.right": False, "legend.frameon": False}
PX = 96.0     # CSS pixels per inch: ``width``/``height`` are the size on the page


def _no_data(title: str) -> str:
    return f"<p><em>{html.escape(title)}: no data</em></p>"


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None}, bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg"):].strip()


def _figure(width: int, height: int):
    from matplotlib.figure import Figure

    return Figure(figsize=(width / PX, height / PX), dpi=PX)


def _legend(ax, n: int) -> None:
    if n > 1:   # beside the axes, one column: entries never overlap each other or the data
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, handlelength=1.5)


def line_chart(series: dict[str, list[tuple[float, float]]], title: str, x_label: str = "", y_label: str = "",
               width: int = 560, height: int = 260, marks: list[tuple[float, str]] | None = None) -> str:
    """One line per series of (x, y) points; ``marks`` draws labelled vertical lines (e.g. stage starts)."""
    import matplotlib

    with matplotlib.rc_context(RC):
        fig = line_figure(series, title, x_label, y_label, width, height, marks)
        return _svg(fig) if fig is not None else _no_data(title)


def line_figure(series, title, x_label="", y_label="", width=560, height=260, marks=None):
    """The matplotlib Figure of :func:`line_chart` (None without finite points); call inside ``rc_context(RC)``."""
    clean = {k: [(x, y) for x, y in v if math.isfinite(x) and math.isfinite(y)] for k, v in series.items()}
    clean = {k: v for k, v in clean.items() if v}
    if not clean:
        return None
    fig = _figure(width, height)
    ax = fig.add_subplot()
    for i, (name, pts) in enumerate(clean.items()):
        xs, ys = zip(*pts, strict=True)
        ax.plot(xs, ys, color=PALETTE[i % len(PALETTE)], linewidth=1.4, label=name,
                marker="o" if len(pts) == 1 else None, markersize=3)
    for x, label in marks or []:
        ax.axvline(x, color="#999999", linestyle="--", linewidth=0.8)
        ax.annotate(label, (x, 1.0), xycoords=("data", "axes fraction"), xytext=(2, 2),
                    textcoords="offset points", va="bottom", fontsize=8, color="#555555")
    ax.margins(x=0.02, y=0.08)
    ax.set(xlabel=x_label, ylabel=y_label)
    ax.set_title(title, pad=16 if marks else 6)       # stage labels sit between the title and the axes
    _legend(ax, len(clean))
    return fig


def bar_chart(groups: dict[str, dict[str, float]], title: str, y_label: str = "", width: int = 560,
              height: int = 260) -> str:
    """Grouped bars: one group per key of ``groups``, one bar per inner key (same colour across groups)."""
    import matplotlib

    with matplotlib.rc_context(RC):
        fig = bar_figure(groups, title, y_label, width, height)
        return _svg(fig) if fig is not None else _no_data(title)


def bar_figure(groups, title, y_label="", width=560, height=260):
    """The matplotlib Figure of :func:`bar_chart` (None without bars); call inside ``rc_context(RC)``."""
    series = list(dict.fromkeys(k for g in groups.values() for k in g))     # first-seen order (stage order)
    if not groups or not series:
        return None
    fig = _figure(width, height)
    ax = fig.add_subplot()
    step = 0.8 / len(series)
    for si, name in enumerate(series):
        xs = [gi - 0.4 + step * (si + 0.5) for gi in range(len(groups))]
        ax.bar(xs, [g.get(name, 0.0) for g in groups.values()], width=step * 0.95,
               color=PALETTE[si % len(PALETTE)], label=name)
    ax.set_xticks(range(len(groups)), list(groups), rotation=30 if len(groups) > 6 else 0,
                  ha="right" if len(groups) > 6 else "center")
    ax.grid(axis="x", visible=False)
    ax.set_axisbelow(True)                            # grid lines behind the bars
    if all(float(v).is_integer() for g in groups.values() for v in g.values()):
        from matplotlib.ticker import MaxNLocator

        ax.yaxis.set_major_locator(MaxNLocator(integer=True))    # counts: no 0.2-document ticks
    ax.margins(y=0.08)
    ax.set(title=title, ylabel=y_label)
    _legend(ax, len(series))
    return fig


def stage_offsets(stages: dict[str, list[tuple[float, float]]]) -> dict[str, float]:
    """Global step of each stage's step 0: the steps of the stages before it, in order (their last step)."""
    out, total = {}, 0.0
    for name, pts in stages.items():
        out[name] = total
        total += max((p[0] for p in pts), default=0.0)
    return out
