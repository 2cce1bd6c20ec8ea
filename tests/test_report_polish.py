"""Report details a reader trips over: every series of a chart its own colour (or the top ones plus "other"), one
number format per column, loss bars zoomed onto their differences, and an Asset-triggered report titled with the
name of the corpus run it trained on."""

from __future__ import annotations

import json

import matplotlib
import yaml

from pipeline.report.html import training_section
from pipeline.report.plots import OTHER, RC, bar_figure, fold_small_series


def _bar_colours(fig) -> dict[str, str]:
    from matplotlib.colors import to_hex

    return {c.get_label(): to_hex(c.patches[0].get_facecolor()) for c in fig.axes[0].containers}


def test_the_14_series_removal_chart_gives_every_series_its_own_colour():
    rules = [f"quality:rule{i}" for i in range(14)]
    groups = {"code": {r: float(i + 1) for i, r in enumerate(rules)}, "prose": {rules[0]: 5.0}}
    with matplotlib.rc_context(RC):
        colours = _bar_colours(bar_figure(groups, "Documents removed per rule and domain"))
    assert list(colours) == rules and len(set(colours.values())) == 14


def test_past_20_series_the_smallest_are_folded_into_other():
    groups = {"code": {f"r{i:02d}": float(i) for i in range(25)}, "zh": {"r00": 7.0, "r03": 2.0}}
    folded = fold_small_series(groups)
    assert len({k for g in folded.values() for k in g}) == 20
    # totals: r00 = 0 + 7, r03 = 3 + 2; the 19 largest are r08..r24, r00 and r07 (ties keep the first seen)
    assert folded["code"][OTHER] == 1 + 2 + 3 + 4 + 5 + 6 and folded["zh"] == {"r00": 7.0, OTHER: 2.0}
    assert sum(folded["code"].values()) == sum(groups["code"].values())
    with matplotlib.rc_context(RC):
        colours = _bar_colours(bar_figure(groups, "t"))
    assert len(colours) == 20 and len(set(colours.values())) == 20 and OTHER in colours


def test_loss_bars_zoom_onto_their_range_and_counts_start_at_zero():
    evals = {"code": {"main": 5.41, "long_context": 5.38}, "prose": {"main": 6.02, "long_context": 5.97}}
    with matplotlib.rc_context(RC):
        lo, hi = bar_figure(evals, "Held-out loss per domain", from_zero=False).axes[0].get_ylim()
        counts_lo, _ = bar_figure({"code": {"a": 3.0}}, "removed").axes[0].get_ylim()
    assert 5.0 < lo < 5.38 and 6.02 < hi < 6.4
    assert counts_lo == 0.0


def test_training_table_has_one_number_format_per_column(tmp_path):
    for name, tps, loss in (("warmup", 709.24, 8.31234), ("main", 1604.4, 6.946409702)):
        d = tmp_path / name
        d.mkdir()
        (d / "summary.json").write_text(json.dumps({"state": "SUCCEEDED", "steps": 12, "first_loss": loss + 1,
                                                    "final_loss": loss, "tokens_per_s": tps, "params": 123456}))
        (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": loss, "lr": 1e-3}) + "\n")
    page = training_section({"warmup": tmp_path / "warmup", "main": tmp_path / "main"})
    assert "<td>709</td>" in page and "<td>1,604</td>" in page and "709.2" not in page
    assert "<td>6.9464</td>" in page and "<td>9.3123</td>" in page and "<td>123,456</td>" in page


def test_an_asset_triggered_report_is_titled_with_the_corpus_run_name(tmp_path, monkeypatch):
    from conftest import tiny_config

    from pipeline.tasks.pretrain import report_run_name

    cfg_path = tiny_config(tmp_path)
    monkeypatch.setenv("MINDLOOM_CONFIG", str(cfg_path))
    default = yaml.safe_load(cfg_path.read_text())["run_name"]
    corpus_dir = tmp_path / "data" / "runs" / "manual__1"
    corpus_dir.mkdir(parents=True)
    (corpus_dir / "config.json").write_text(json.dumps({"run_name": "walkthrough"}))
    corpus = {"run_dir": str(corpus_dir)}
    assert report_run_name({"run_name": default}, corpus) == "walkthrough"       # Asset run: the form's defaults
    assert report_run_name({}, corpus) == "walkthrough"
    assert report_run_name({"run_name": "fail-demo"}, corpus) == "fail-demo"      # typed into the form
    assert report_run_name({"run_name": default}, None) == default
