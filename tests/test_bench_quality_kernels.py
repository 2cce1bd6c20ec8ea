"""The ``quality_kernels`` benchmark topic (issue 34): heuristic chains, the classifier's score and the
decontamination lookup on the same documents, as ``run_all.py --quick`` runs it, and its results.json rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import common  # noqa: E402
import topics  # noqa: E402

PER_DOMAIN = 24        # the within-domain classifier trains a domain with 10+ examples of each class
NEW_ROWS = {"quality_kernels.classifier_score_mb_per_cpu_s", "quality_kernels.classifier_over_heuristics_cpu",
            "quality_kernels.decontamination_mb_per_cpu_s", "quality_kernels.decontamination_over_heuristics_cpu"}


def _spread(*runs: float) -> dict:
    return common.spread(list(runs))


def _result() -> dict:
    return {"scoring": {"mb": 10.0, "docs": 100, "reference": _spread(5.0, 6.0), "kernels": _spread(2.0, 2.5),
                        "kernels_mb_per_cpu_s": _spread(5.0, 4.0), "reference_over_kernels": _spread(2.5, 2.4)},
            "classifier": {"cpu": _spread(1.0, 1.5), "load_cpu": _spread(0.1, 0.1),
                           "mb_per_cpu_s": _spread(10.0, 6.67), "over_heuristics": _spread(0.5, 0.6), "mb_read": 4.0,
                           "train_cpu": 3.0,
                           "train": {"docs": 400}, "held_out": {"docs": 40, "accuracy": 0.9},
                           "settings": {"max_chars": 20000}},
            "decontamination": {"cpu": _spread(0.5, 0.5), "load_cpu": _spread(0.1, 0.1),
                                "mb_per_cpu_s": _spread(20.0, 20.0), "over_heuristics": _spread(0.25, 0.2),
                                "docs_hit": 30, "items": 2000, "item_words": 30, "source_docs": 30, "ngrams": 36000,
                                "n": 13}}


def test_metrics_rows_per_repeat():
    by = {m["name"]: m for m in topics.quality_kernels_metrics([{"quality_kernels.json": _result()}])}
    assert NEW_ROWS | {"quality_kernels.heuristics_mb_per_cpu_s"} <= set(by)
    assert by["quality_kernels.classifier_over_heuristics_cpu"]["runs"] == [0.5, 0.6]
    assert by["quality_kernels.classifier_over_heuristics_cpu"]["unit"] == "share"
    assert by["quality_kernels.decontamination_mb_per_cpu_s"]["median"] == 20.0
    assert all(m["issue"] == 34 and m["topic"] == "quality_kernels" for m in by.values())
    # a corpus without the classifier's domains: its rows are left out, the others stay
    res = {**_result(), "classifier": {"skipped": "no negative training documents"}}
    names = {m["name"] for m in topics.quality_kernels_metrics([{"quality_kernels.json": res}])}
    assert "quality_kernels.classifier_over_heuristics_cpu" not in names
    assert "quality_kernels.decontamination_over_heuristics_cpu" in names
    assert topics.quality_kernels_metrics([{"quality_kernels.json": {"stages": {}}}]) == []


def test_run_without_run_dir_keeps_the_stage_figures(tmp_path):
    out = tmp_path / "quality_kernels.json"
    stages = {"quality": {"after": _spread(2.0, 2.1)}}
    out.write_text(json.dumps({"scoring": {}, "stages": stages}))
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_quality_kernels.py"), "--corpus",
                    str(tmp_path / "absent"), "--out", str(out)], check=True, cwd=REPO)
    res = json.loads(out.read_text())
    assert res["stages"] == stages and "not re-measured" in res["stages_kept"] and "scoring" not in res


@pytest.mark.slow
def test_quick_topic_measures_classifier_and_decontamination(tmp_path):
    """run_all's quick path for the topic (staged tree, --repeats 1) on a few documents per domain."""
    src = common.source_corpus()
    if src is None:
        pytest.skip("no corpus: ../shared/corpora absent and data/demo-corpus not built (make corpus)")
    import run_all

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for f in sorted(src.glob("*.jsonl")):
        with open(f, encoding="utf-8") as fh:
            rows = [json.loads(next(fh)) for _ in range(PER_DOMAIN)]
        (corpus / f.name).write_text("".join(json.dumps({**r, "text": r["text"][:4000]}) + "\n" for r in rows),
                                     encoding="utf-8")
    repo = common.stage_tree(tmp_path / "work", corpus)
    record, runs = run_all.run_topic("quality_kernels", repo, True, 1, {}, {}, corpus, tmp_path / "log")
    assert record["status"] == "ok", record["status"]
    res = runs[-1]["quality_kernels.json"]
    n_docs = PER_DOMAIN * len(list(corpus.glob("*.jsonl")))
    assert res["scoring"]["docs"] == n_docs and res["decontamination"]["docs_hit"] >= 1
    assert res["decontamination"]["items"] == 2000
    names = {m["name"] for m in run_all.topic_metrics("quality_kernels", runs)}
    assert res["classifier"]["train"]["docs"] > 0 and NEW_ROWS <= names      # within each domain: any corpus
    assert res["classifier"]["settings"]["training"] == "within_domain"
