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
#: 20 distinct colours (matplotlib's tab20, dark and light of each hue) for charts with more than 10 series.
PALETTE20 = ("#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a", "#d62728", "#ff9896", "#9467bd",
             "#c5b0d5", "#8c564b", "#c49c94", "#e377c2", "#f7b6d2", "#7f7f7f", "#c7c7c7", "#bcbd22", "#dbdb8d",
             "#17becf", "#9edae5")
OTHER = "other"


def colours(n: int) -> tuple[str, ...]:
    """``n`` colours, distinct up to 20: the 10-colour palette while it suffices, else tab20 (bar charts fold
    series past 20 into ``other``; a line chart with more than 20 lines repeats colours)."""
    base = PALETTE if n <= len(PALETTE) else PALETTE20
    return tuple(base[i % len(base)] for i in range(n))


def fold_small_series(groups: dict[str, dict[str, float]], keep: int = len(PALETTE20) - 1) -> dict[str, dict]:
    """At most ``keep`` + 1 series: the ``keep`` largest by total, the rest summed into ``other`` per group."""
    series = list(dict.fromkeys(k for g in groups.values() for k in g))
    if len(series) <= keep + 1:
        return groups
    totals = {k: sum(g.get(k, 0.0) for g in groups.values()) for k in series}
    top = set(sorted(series, key=lambda k: (-totals[k], series.index(k)))[:keep])
    out = {}
    for name, g in groups.items():
        out[name] = {k: v for k, v in g.items() if k in top}
        rest = sum(v for k, v in g.items() if k not in top)
        if rest:
            out[name][OTHER] = rest
    return out
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
    palette = colours(len(clean))
    for i, (name, pts) in enumerate(clean.items()):
        xs, ys = zip(*pts, strict=True)
        ax.plot(xs, ys, color=palette[i], linewidth=1.4, label=name,
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
              height: int = 260, from_zero: bool = True) -> str:
    """Grouped bars: one group per key of ``groups``, one bar per inner key (same colour across groups, every
    series its own colour; past 20 series the smallest are summed into ``other``).  ``from_zero=False`` (losses)
    zooms the value axis onto the bars' range so that differences show; each bar is then labelled with its value."""
    import matplotlib

    with matplotlib.rc_context(RC):
        fig = bar_figure(groups, title, y_label, width, height, from_zero)
        return _svg(fig) if fig is not None else _no_data(title)


def bar_figure(groups, title, y_label="", width=560, height=260, from_zero=True):
    """The matplotlib Figure of :func:`bar_chart` (None without bars); call inside ``rc_context(RC)``."""
    groups = fold_small_series(groups)
    series = list(dict.fromkeys(k for g in groups.values() for k in g))     # first-seen order (stage order)
    if not groups or not series:
        return None
    fig = _figure(width, height)
    ax = fig.add_subplot()
    step = 0.8 / len(series)
    palette = colours(len(series))
    for si, name in enumerate(series):
        xs = [gi - 0.4 + step * (si + 0.5) for gi in range(len(groups))]
        ys = [g.get(name, 0.0) for g in groups.values()]
        bars = ax.bar(xs, ys, width=step * 0.95, color=palette[si], label=name)
        if not from_zero:
            ax.bar_label(bars, fmt="%.3f", fontsize=7, padding=1)
    if not from_zero:
        values = [v for g in groups.values() for v in g.values()]
        lo, hi = min(values), max(values)
        pad = (hi - lo) * 0.25 or abs(hi) * 0.05 or 1.0
        ax.set_ylim(lo - pad, hi + pad)
    ax.set_xticks(range(len(groups)), list(groups), rotation=30 if len(groups) > 6 else 0,
                  ha="right" if len(groups) > 6 else "center")
    ax.grid(axis="x", visible=False)
    ax.set_axisbelow(True)                            # grid lines behind the bars
    if all(float(v).is_integer() for g in groups.values() for v in g.values()):
        from matplotlib.ticker import MaxNLocator

        ax.yaxis.set_major_locator(MaxNLocator(integer=True))    # counts: no 0.2-document ticks
    if from_zero:
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
