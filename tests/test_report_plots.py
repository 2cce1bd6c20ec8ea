"""Report charts by matplotlib: deterministic inline SVG, nothing clipped, legends clear of the axes, one global
step axis across training stages, and near-duplicate pairs shown with their similarity."""

from __future__ import annotations

import json
import re

import matplotlib

from pipeline.report.dedup import near_duplicate_section
from pipeline.report.html import training_section
from pipeline.report.plots import RC, bar_chart, bar_figure, line_chart, line_figure, stage_offsets

LOSS = {"warmup": [(1, 8.34), (2, 8.1), (3, 7.6), (4, 7.2)], "main": [(1, 7.1), (2, 6.8), (3, 6.5), (4, 6.3)],
        "long_context": [(1, 6.9), (2, 6.6)]}


def test_svg_is_deterministic_and_dateless():
    a, b = line_chart(LOSS, "Training loss", "step", "loss"), line_chart(dict(LOSS), "Training loss", "step", "loss")
    assert a == b and a.startswith("<svg") and a.endswith("</svg>")
    assert "<dc:date>" not in a and "Matplotlib" not in a          # no date, no creator string
    assert ">Training loss<" in a and ">long_context<" in a        # text kept as text (svg.fonttype none)
    assert bar_chart({"code": {"a": 1.0}}, "t") == bar_chart({"code": {"a": 1.0}}, "t")
    assert line_chart({"x": [(1, float("nan"))]}, "Empty <chart>") == "<p><em>Empty &lt;chart&gt;: no data</em></p>"


def test_no_series_is_clipped_and_legends_sit_beside_the_axes():
    with matplotlib.rc_context(RC):
        for fig in (line_figure(LOSS, "Training loss", "step", "loss"),
                    bar_figure({"code": {"length": 3.0, "gopher": 12.0}, "zh": {"fineweb": 40.0}}, "Removed")):
            fig.draw_without_rendering()
            ax = fig.axes[0]
            lo, hi = ax.get_ylim()
            values = [y for line in ax.get_lines() for y in line.get_ydata()] + [p.get_height() for p in ax.patches]
            assert lo <= min(values) and max(values) <= hi         # 8.34 is inside, not above the axis
            box, legend = ax.get_window_extent(), ax.get_legend().get_window_extent()
            assert legend.x0 >= box.x1                              # legend right of the plot area
            texts = [t.get_window_extent() for t in ax.get_legend().get_texts()]
            assert all(a.y0 >= b.y1 or b.y0 >= a.y1 for a, b in zip(texts, texts[1:], strict=False))


def test_training_stages_share_one_global_step_axis(tmp_path):
    assert stage_offsets(LOSS) == {"warmup": 0.0, "main": 4.0, "long_context": 8.0}
    dirs = {}
    for name, pts in LOSS.items():
        d = tmp_path / name
        d.mkdir()
        d.joinpath("metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": v, "lr": 1e-3}) + "\n"
                                                       for s, v in pts))
        dirs[name] = d
    html = training_section(dirs)
    assert html.count("global step (all stages)") == 2                # loss and learning rate
    with matplotlib.rc_context(RC):
        fig = line_figure({n: [(x + stage_offsets(LOSS)[n], y) for x, y in v] for n, v in LOSS.items()}, "t")
        xs = {line.get_label(): list(line.get_xdata()) for line in fig.axes[0].get_lines()}
    assert xs == {"warmup": [1, 2, 3, 4], "main": [5, 6, 7, 8], "long_context": [9, 10]}


def test_near_duplicate_section_shows_pairs_with_similarity():
    rep = {"docs": 120, "clusters": 2, "docs_in_clusters": 5, "largest_cluster": 3, "distinct_pairs": 9,
           "false_positives_rejected": 1, "member_pairs": 2, "removed": {"near_duplicate": 3},
           "config": {"threshold": 0.8}, "cluster_sizes": {"2": 1, "3": 1},
           "examples": [{"cluster": 4, "kept": "docs/3.2/intro.txt", "removed": ["docs/4.2/intro.txt"],
                         "removed_count": 2, "compared": "docs/4.2/intro.txt", "similarity": 0.91234,
                         "differing_spans": [{"op": "replace", "kept": "Django 3.2", "removed": "Django 4.2",
                                              "context": "This document is for"}]},
                        {"cluster": 9, "kept": "<script>x</script>", "removed": ["y"], "removed_count": 1,
                         "similarity": None, "note": "kept document belongs to an earlier release"}]}
    html = near_duplicate_section(rep)
    assert "<pre>" not in html and '"examples"' not in html             # no raw JSON dump
    rows = re.findall(r"<tr><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td>", html)
    assert rows == [("docs/3.2/intro.txt", "docs/4.2/intro.txt", "0.912", "3"),
                    ("&lt;script&gt;x&lt;/script&gt;", "y", "–", "2")]
    assert "…This document is for <del>Django 3.2</del> → <ins>Django 4.2</ins>" in html
    assert "<th>false positives rejected</th><td>1</td>" in html and "Clusters by size" in html


def test_bar_chart_legend_lists_every_series_once():
    svg = bar_chart({"d": {f"rule_{i:02d}": float(i + 1) for i in range(12)}}, "Removed", "documents")
    assert [svg.count(f">rule_{i:02d}<") for i in range(12)] == [1] * 12
    single = bar_chart({"d": {"only": 1.0}}, "Removed", "documents")
    assert ">only<" not in single                    # one series: no legend, the title says what it is
