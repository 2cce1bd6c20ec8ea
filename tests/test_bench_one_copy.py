"""Every benchmark figure is kept once (issue 52).

``benchmarks/results/<file>.json`` is the one copy of a topic's results; ``benchmarks/results.json`` names those
files (``results_files``, ``reference_files``) and keeps the metric rows computed from them, plus the figures of a
topic's earlier runs that its metrics span (``all_results``), never a copy of the files themselves. No two results
files share a section of figures: a run that skipped a part (``bench_scale.py --skip side``) points to the file
that holds it instead of carrying a copy. What a run ran on and aimed at (the machine, the targets) may repeat.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import common  # noqa: E402
import topics  # noqa: E402

RESULTS = REPO / "benchmarks" / "results.json"
FILES = REPO / "benchmarks" / "results"
DESCRIPTORS = {"machine", "target_values", "carried", "merged_from", "command"}   # not figures


def _files() -> dict[str, object]:
    return {p.name: json.loads(p.read_text(encoding="utf-8")) for p in sorted(FILES.glob("*.json"))}


def test_results_json_names_each_results_file_and_embeds_none():
    raw = json.loads(RESULTS.read_text(encoding="utf-8"))
    files, owner = _files(), {}
    for name, rec in raw["topics"].items():
        assert name in topics.TOPICS, f"results.json holds topic {name!r}, which the harness does not know"
        assert not set(common.FILE_KEYS) & set(rec), f"topic {name!r} embeds its results instead of naming them"
        for key in common.FILE_KEYS:
            for f in rec.get(f"{key}_files", []):
                assert f in files, f"topic {name!r} names {f}, which is not under benchmarks/results/"
                assert f not in owner, f"{f} is named by topics {owner[f]!r} and {name!r}"
                owner[f] = name
        for i, run in enumerate(rec.get("all_results", [])):
            for f, content in run.items():
                assert content != files.get(f), f"topic {name!r}: earlier run {i} keeps a copy of {f}"
    rows = [(m["topic"], m["name"]) for m in raw["metrics"]]
    assert len(rows) == len(set(rows)), sorted(r for r in rows if rows.count(r) > 1)


def test_no_two_results_files_share_a_section_of_figures():
    shared = [(a, b, k) for (a, x), (b, y) in itertools.combinations(_files().items(), 2)
              if isinstance(x, dict) and isinstance(y, dict)
              for k in x.keys() & y.keys() - DESCRIPTORS if x[k] == y[k] and len(json.dumps(x[k])) >= 100]
    assert not shared, f"sections kept twice (file, file, section): {shared}"


def test_a_rerun_keeps_no_copy_of_a_file_run_once(tmp_path):
    """run_all.merge_topic: the ingest topic runs ``--extractors`` once; its file is the last run's only."""
    import run_all

    ext, first, last = {"f1": 0.9}, {"docs": 10}, {"docs": 11}
    results = {"topics": {}, "metrics": []}
    record = {"status": "ok"}
    runs = [{"ingest.json": first, "html_extractors.json": ext}, {"ingest.json": last, "html_extractors.json": ext}]
    run_all.merge_topic(results, "ingest", record, runs, [])
    assert record["results"] == runs[-1]
    assert record["all_results"] == [{"ingest.json": first}]
