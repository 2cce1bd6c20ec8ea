"""Per-shard stages in a fixed number of Airflow tasks: the plan lives in a file, XCom carries small batch handles.

Why: Airflow refuses to map a task over more than ``[core] max_map_length`` (1024) items, and every mapped item's
argument is an XCom row in the metadata DB.  Mapping one task per shard stopped the chain at about 1,024 shards
(1.2 GB of text with the default shard size).  Instead the plan (``plan.json``: one spec per shard) stays in the run
folder, and each per-shard stage is mapped over ``parallelism`` batches, each a contiguous range of shard indices.
A batch task runs its shards in order; every shard's output has its completion marker, so a retry redoes only the
shards that are missing.  The handle of a batch is a few numbers, so the XCom payload does not grow with the corpus.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pipeline.io import read_json

PLAN = "plan.json"


def plan_batches(run_dir: str | Path, n_shards: int, parallelism: int) -> list[dict]:
    """``min(parallelism, n_shards)`` handles ``{run_dir, task, of, first, last}``; shard ranges differ by at most 1."""
    tasks = max(1, min(parallelism, n_shards))
    bounds = [k * n_shards // tasks for k in range(tasks + 1)]
    return [{"run_dir": str(run_dir), "task": k, "of": tasks, "first": bounds[k], "last": bounds[k + 1] - 1}
            for k in range(tasks) if bounds[k + 1] > bounds[k]]


def batch_label(batch: dict) -> str:
    """The mapped task's label in the UI: ``task 3/64: shards 120-159``."""
    return f"task {batch['task'] + 1}/{batch['of']}: shards {batch['first']}-{batch['last']}"


def batch_specs(batch: dict) -> list[dict]:
    """The shard specs of one batch, read from the run's plan file."""
    specs = read_json(Path(batch["run_dir"]) / PLAN)
    return specs[batch["first"]: batch["last"] + 1]


def run_batch(fn: Callable[[dict], dict], batch: dict) -> dict:
    """Run a per-shard stage over the batch's shards in order; returns counts, not the per-shard stats (those are
    in each shard's marker and ``stats/``)."""
    done = [fn(spec) for spec in batch_specs(batch)]
    return {"task": batch["task"], "of": batch["of"], "first": batch["first"], "last": batch["last"],
            "shards": len(done)}
