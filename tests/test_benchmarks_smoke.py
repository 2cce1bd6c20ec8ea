"""The benchmark suite end to end on a tiny input: ``benchmarks/run_all.py --quick`` writes results.json with one
entry per metric in the documented schema, and BENCHMARKS.md is rendered from exactly that file.

Peers are never installed here (``--no-install``): a topic whose peer venv is absent is skipped and says so.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import common  # noqa: E402
import report  # noqa: E402
import scaling  # noqa: E402
from common import metric  # noqa: E402

KEYS = {"name", "topic", "unit", "median", "min", "max", "runs", "compared", "target", "target_value", "target_op",
        "issue", "met", "note", "headline"}


@pytest.mark.slow
def test_run_all_quick_writes_results_and_renders_markdown_from_them(tmp_path):
    if common.source_corpus() is None:
        pytest.skip("no corpus: ../shared/corpora absent and data/demo-corpus not built (make corpus)")
    topics = ["tokenize"] + (["filters"] if common.peer_ready("datatrove") else [])
    repo_results = common.RESULTS_JSON.read_bytes() if common.RESULTS_JSON.exists() else None
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "run_all.py"), "--quick", "--no-install",
                        "--topics", ",".join(topics), "--out", str(tmp_path)], capture_output=True, text=True,
                       timeout=300, cwd=REPO, env={**os.environ, "PYTHONHASHSEED": "0"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    on_disk = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    for name in topics:              # one copy of every figure: results.json names the files under results/
        assert "results" not in on_disk["topics"][name]
        assert on_disk["topics"][name]["results_files"] and all(
            (tmp_path / "results" / f).is_file() for f in on_disk["topics"][name]["results_files"])
    res = common.read_results(tmp_path / "results.json")
    assert res["topics"]["tokenize"]["results"]["tokenize.json"] == json.loads(
        (tmp_path / "results" / "tokenize.json").read_text(encoding="utf-8"))
    assert res["mode"] == "quick" and res["repeats"] == 1
    assert {"cpu", "cores", "ram_gb", "load_avg_start"} <= set(res["machine"])
    assert set(res["topics"]) == set(topics)
    for name in topics:
        rec = res["topics"][name]
        assert rec["status"] == "ok" and rec["wall_s"] and rec["peak_rss_mb"][0] > 0 and rec["commands"]
    by_name = {m["name"]: m for m in res["metrics"]}
    assert len(by_name) == len(res["metrics"])
    for m in res["metrics"]:
        assert set(m) == KEYS, m["name"]
        assert m["min"] <= m["median"] <= m["max"] and len(m["runs"]) >= 1
        if m["target_value"] is None:
            assert m["met"] is None
        else:
            assert m["met"] == {">=": m["median"] >= m["target_value"], "<": m["median"] < m["target_value"],
                                "<=": m["median"] <= m["target_value"]}[m["target_op"]]
    scale = by_name["tokenize.scaling_1_to_2_processes"]
    assert scale["target_value"] == 1.8 and scale["issue"] == 6 and scale["unit"] == "×"
    if "filters" in topics:
        assert "filters.gopher_quality_vs_datatrove" in by_name

    md = (tmp_path / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert md == report.render(res)                        # the page is a pure function of results.json
    row = next(line for line in md.splitlines() if line.startswith("| `tokenize.scaling_1_to_2_processes` | #6"))
    assert f"| {report.fmt(scale['median'], '×')} |" in row and "| ≥ 1.8× |" in row
    assert res["machine"]["cpu"] in md and "Load average at start" in md
    # quick runs work in a staged copy: the repository's own results are untouched
    assert (common.RESULTS_JSON.read_bytes() if common.RESULTS_JSON.exists() else None) == repo_results


def test_metric_met_follows_target_direction():
    up = metric("minhash", "x", "×", [3.0, 5.0, 4.5], target=4.0)
    assert (up["median"], up["min"], up["max"], up["met"], up["target"]) == (4.5, 3.0, 5.0, True, "≥ 4×")
    down = metric("minhash", "y", "exponent", [1.2], target=1.0, op="<")
    assert down["met"] is False and down["target"] == "< 1"
    none = metric("ingest", "z", "MB/s", [1.0, 2.0])
    assert none["met"] is None and none["median"] == 1.5 and none["issue"] == 3


def test_loglog_slope_is_the_growth_exponent():
    assert common.loglog_slope([1, 2, 4, 8], [3, 6, 12, 24]) == 1.0
    assert common.loglog_slope([1, 2, 4, 8], [5, 20, 80, 320]) == 2.0
    assert common.loglog_slope([1], [1]) is None


def test_scaling_replicas_plant_exact_and_edited_copies(tmp_path):
    words = ("the quick brown fox jumps over the lazy dog and then some more words follow here " * 20).split()
    base = {"web": [{"id": f"d{i}", "text": " ".join(random.Random(i).sample(words, 60)), "source": "t"}
                    for i in range(40)],
            "zh": [{"id": "z0", "text": "天地玄黄宇宙洪荒日月盈昃辰宿列张" * 10, "source": "t"}]}
    planted = scaling.replicate(base, 3, tmp_path)
    assert sum(planted.values()) == 2 * 41
    recs = [json.loads(x) for x in (tmp_path / "web.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(recs) == 120 and len({r["id"] for r in recs}) == 120
    originals = {r["id"]: r["text"] for r in recs[:40]}
    copies = [(r, originals[r["id"].split("#")[0]]) for r in recs[40:]]
    classes = [scaling._edit_class(random.Random(r["id"].replace("#copy", "#")).random())[0] for r, _ in copies]
    assert {"exact", "near", "new"} == set(classes)
    zh = [scaling._edit_class(random.Random(f"z0#{k}").random())[0] for k in (1, 2)]
    assert {c: classes.count(c) + zh.count(c) for c in planted} == planted
    for (r, orig), cls in zip(copies, classes, strict=True):
        if cls == "exact":
            assert r["text"] == orig
        if cls == "new":                                   # 30 % of 60 words replaced: never the same text
            assert r["text"] != orig and len(r["text"].split()) == len(orig.split())
    again = tmp_path / "again"
    assert scaling.replicate(base, 3, again) == planted
    assert (again / "web.jsonl").read_bytes() == (tmp_path / "web.jsonl").read_bytes()
