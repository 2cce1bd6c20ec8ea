"""Bounded task count: a plan of 100,000 shards (line-aligned byte ranges of one JSONL file) maps onto
``parallelism`` tasks with a small XCom payload, and the batches cover every shard exactly once, in plan order."""

from __future__ import annotations

import json

import pytest
import yaml

from pipeline.config import load_config
from pipeline.tasks.batches import batch_label, batch_specs, plan_batches
from pipeline.tasks.corpus import plan_tasks

pytestmark = pytest.mark.slow


def test_a_plan_of_100k_units_maps_onto_parallelism_tasks(tmp_path):
    n = 100_000
    src = tmp_path / "in" / "lines.jsonl"
    src.parent.mkdir(parents=True)
    with open(src, "w", encoding="utf-8") as fh:  # lines of one width: byte ranges of exactly one line each
        for i in range(n):
            fh.write(json.dumps({"id": f"d{i:06d}", "text": f"document number {i:06d}"}) + "\n")
    cfg_path = tmp_path / "mindloom.yaml"
    cfg_path.write_text(yaml.safe_dump({
        "data_root": str(tmp_path / "data"), "parallelism": 64, "ingest": {"docs_per_shard": 1},
        "sources": [{"domain": "web", "paths": [str(src)]}]}), encoding="utf-8")
    handles = plan_tasks(load_config(cfg_path), "big", str(cfg_path))
    assert len(handles) == 64                                   # the mapped-task count of every per-shard stage
    assert len(json.dumps(handles)) < 10_000                    # what goes through XCom: not the plan
    plan = json.loads((tmp_path / "data" / "runs" / "big" / "plan.json").read_text())
    assert len(plan) == n and sum(len(u["units"]) for u in plan) == n
    width = src.stat().st_size // n                             # 100,000 line-aligned byte ranges of one file
    assert [(s["units"][0]["start"], s["units"][0]["end"]) for s in plan[:2]] == [(0, width), (width, 2 * width)]
    assert plan[-1]["units"][0]["end"] == src.stat().st_size
    covered = [s["shard"] for h in (handles[0], handles[-1]) for s in batch_specs(h)]
    assert covered[0] == plan[0]["shard"] and covered[-1] == plan[-1]["shard"]
    sizes = [h["last"] - h["first"] + 1 for h in handles]
    assert sum(sizes) == n and max(sizes) - min(sizes) <= 1
    assert [h["first"] for h in handles[1:]] == [h["last"] + 1 for h in handles[:-1]]
    assert batch_label(handles[3]) == "task 4/64: shards 4687-6249"


@pytest.mark.parametrize("shards,parallelism,expected", [(4, 2, [(0, 1), (2, 3)]), (3, 8, [(0, 0), (1, 1), (2, 2)]),
                                                          (5, 2, [(0, 1), (2, 4)]), (1, 64, [(0, 0)])])
def test_batches_are_contiguous_and_never_empty(tmp_path, shards, parallelism, expected):
    handles = plan_batches(tmp_path, shards, parallelism)
    assert [(h["first"], h["last"]) for h in handles] == expected
    assert all(h["of"] == len(handles) for h in handles)
