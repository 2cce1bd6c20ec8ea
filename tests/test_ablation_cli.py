"""#51: ``mindloom ablation`` runs the DAG's task functions in order; a rerun reuses every finished step and writes
the same report byte for byte."""

from __future__ import annotations

import hashlib
import json

import pytest
import yaml
from conftest import LONG_FIXTURE, tiny_config

pytestmark = [pytest.mark.slow, LONG_FIXTURE]


def test_mindloom_ablation_reports_and_a_rerun_is_byte_identical(tmp_path, capsys):
    pytest.importorskip("mindspore")
    from pipeline.cli import main

    path = tiny_config(tmp_path, ablation={"seeds": 1, "steps": 4, "total_tokens": 6000, "reference_docs": 4,
                                           "piece_bytes": 1024, "replicates": 200,
                                           "arms": {"raw": {"quality.enabled": False}, "shipped": {}}},
                       mixture={"matched_tolerance": 0.2})         # tiny targets: one piece is a large share
    argv = ["ablation", "--config", str(path), "--run-id", "a1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| shipped | all |" in out and "Noise floor (A/A):" in out
    root = tmp_path / "data" / "ablation" / "a1"
    first = hashlib.sha256((root / "report.json").read_bytes()).hexdigest()
    scores = {p.name: p.stat().st_mtime_ns for p in (root / "scores").glob("*.json")}
    assert sorted(scores) == ["raw-seed7.json", "raw_aa-seed1007.json", "raw_control-seed7.json",
                              "shipped-seed7.json", "shipped_control-seed7.json"]
    report = json.loads((root / "report.json").read_text())
    planted = json.loads((root / "split.json").read_text())["control"]
    assert planted["share"] == 0.25 and planted["domains"]["prose"]["documents"] > 0
    assert report["control"]["seeds"] == 1 and isinstance(report["control_detected"], bool)
    cloze = report["cloze"]                  # the same items for every arm, whatever its tokenizer
    assert sorted(cloze) == ["raw", "raw_aa", "raw_control", "shipped", "shipped_control"]
    assert len({c["items"] for c in cloze.values()}) == 1 and cloze["raw"]["items"] > 0
    assert "Last-word cloze" in out
    if not report["control_detected"]:                  # an underpowered design says so and decides nothing
        assert all(r["verdict"] == "inconclusive" for r in report["differences"]["shipped"].values())
    print(report["control_note"])
    assert main(argv) == 0                           # every step finished: nothing is trained or scored again
    assert hashlib.sha256((root / "report.json").read_bytes()).hexdigest() == first
    assert {p.name: p.stat().st_mtime_ns for p in (root / "scores").glob("*.json")} == scores
    bad = yaml.safe_load(path.read_text())
    bad["ablation"]["arms"] = {"raw": {}}
    path.write_text(yaml.safe_dump(bad))
    assert main(argv) == 2
    assert "ablation.arms: at least two arms" in capsys.readouterr().err
