"""#51 through Airflow (``dag.test``): the ``ablation`` DAG with two arms (raw, shipped) and one seed on the tiny
two-domain corpus; the shipped arm's training crashes once after a checkpoint and its retry resumes there.

What it checks: the references are held out before the arms, both arms train on matched mixtures (the same target
tokens per domain), every run is scored on every reference document, and the report carries the differences,
their intervals, each arm's shares and epochs, and the verdict ``inconclusive`` (no positive control was run).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import REPO, tiny_config

pytestmark = pytest.mark.slow


def test_the_ablation_dag_trains_and_scores_two_arms_and_a_failed_run_resumes(own_assets, tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState

    path = tiny_config(tmp_path, ablation={"seeds": 1, "aa": False, "control_share": 0, "steps": 8,
                                           "piece_bytes": 1024, "total_tokens": 16000, "reference_docs": 4,
                                           "replicates": 200},
                       mixture={"matched_tolerance": 0.2})         # tiny targets: one piece is a large share
    monkeypatch.setenv("MINDLOOM_CONFIG", str(path))
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}, bag.import_errors
    run = bag.get_dag("ablation").test(logical_date=None, run_conf={"fail_at_step": 4, "fail_arm": "shipped"})
    assert run.state == DagRunState.SUCCESS
    tis = {(ti.task_id, ti.map_index): ti for ti in run.get_task_instances()}
    assert sorted(k for k in tis if k[0] in ("build_arm", "train", "score")) == [
        ("build_arm", 0), ("build_arm", 1), ("score", 0), ("score", 1), ("train", 0), ("train", 1)]
    trained = {ti.xcom_pull(task_ids="train", map_indexes=i)["checkpoint"]: (ti.try_number,
               ti.xcom_pull(task_ids="train", map_indexes=i)) for (t, i), ti in tis.items() if t == "train"}
    shipped = next(v for k, v in trained.items() if "/shipped/" in k)
    raw = next(v for k, v in trained.items() if "/raw/" in k)
    assert shipped[0] == 2 and shipped[1]["resumed_from"] == 4 and shipped[1]["steps"] == 8   # crashed, resumed
    assert raw[0] == 1 and raw[1]["resumed_from"] is None

    root = Path(yaml.safe_load(path.read_text())["data_root"]) / "ablation"
    root = next(root.iterdir())
    report = json.loads((root / "report.json").read_text())
    split = json.loads((root / "split.json").read_text())
    assert {d: v["references"] for d, v in split["domains"].items()} == {"code": 4, "prose": 4}
    assert report["baseline"] == "raw" and set(report["differences"]) == {"shipped"}
    rows = report["differences"]["shipped"]
    assert set(rows) == {"all", "code", "prose"} and all(r["verdict"] == "inconclusive" for r in rows.values())
    assert rows["all"]["docs"] == 8 and rows["all"]["seeds"] == 1
    for arm in ("raw", "shipped"):               # matched: the same target tokens per domain in both arms
        rep = json.loads((root / "arms" / arm / "runs" / arm / "mixture" / "report.json").read_text())
        assert {d: v["target"] for d, v in rep["domains"].items()} == {"code": 8000, "prose": 8000}
        assert set(report["mixtures"][arm]) == {"code", "prose"}
    scores = [json.loads(p.read_text()) for p in sorted((root / "scores").glob("*.json"))]
    assert len(scores) == 2 and all(len(s["docs"]) == 8 and all(d["nats"] > 0 for d in s["docs"]) for s in scores)
    assert "| shipped | all |" in (root / "report.md").read_text()
    print((root / "report.md").read_text())
