"""Per-shard stages in a fixed number of Airflow tasks: the plan lives in files, XCom carries small batch handles.

Why: Airflow refuses to map a task over more than ``[core] max_map_length`` (1024) items, and every mapped item's
argument is an XCom row in the metadata DB.  Mapping one task per shard stopped the chain at about 1,024 shards
(1.2 GB of text with the default shard size).  Instead the plan (``plan.json``: one spec per shard) stays in the run
folder, split into one file per batch (``plan/batch-<k>.json``, so a task reads only its own specs), and each
per-shard stage is mapped over ``parallelism`` batches, each a contiguous range of shard indices.  A batch task runs
its shards in order (or, for stages that use one process per shard, in a pool of ``task_workers`` processes);
every shard's output has its completion marker, so a retry redoes only the shards that are missing.  The handle of
a batch is a few numbers, so the XCom payload does not grow with the corpus.  The sink's writer tasks are mapped the
same way over the output files (``kind: files``).

Fan-in (global) tasks never parse ``plan.json`` either: they need the shard names in plan order, which
:func:`write_index` stores run-length encoded in ``plan/shards.json`` (``academic-00000`` .. ``academic-01234`` is
one entry), so its size grows with the number of sources, not of shards.  Only the plan task holds the whole plan.

For 1e9 documents in 50,000 shards (``docs_per_shard: 20000``): the plan task holds about 20 MB of specs (about
400 bytes per shard), each of the 64 batch files is about 300 KB, and ``shards.json`` is a few hundred bytes per
source; every per-shard stage is 64 tasks whatever the shard count.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from pipeline.io import read_json, write_json
from pipeline.pools import task_executor

PLAN = "plan.json"
PLAN_DIR = "plan"
INDEX = "shards.json"
_NUMBERED = re.compile(r"^(.*)-(\d+)$")


def plan_batches(run_dir: str | Path, n_items: int, parallelism: int, kind: str = "shards") -> list[dict]:
    """``min(parallelism, n_items)`` handles ``{run_dir, task, of, first, last[, kind]}``; ranges differ by <= 1.

    For shard batches, :func:`split_plan` then writes each batch's own plan file.
    """
    tasks = max(1, min(parallelism, n_items))
    bounds = [k * n_items // tasks for k in range(tasks + 1)]
    handles = [{"run_dir": str(run_dir), "task": k, "of": tasks, "first": bounds[k], "last": bounds[k + 1] - 1,
                **({"kind": kind} if kind != "shards" else {})} for k in range(tasks) if bounds[k + 1] > bounds[k]]
    return handles


def split_plan(specs: list[dict], handles: list[dict]) -> None:
    """Write ``plan/batch-<k>-of-<n>.json`` for every shard batch, so a task reads only its own specs."""
    for h in handles:
        write_json(_batch_file(h), specs[h["first"]: h["last"] + 1])


def _batch_file(batch: dict) -> Path:
    return Path(batch["run_dir"]) / PLAN_DIR / f"batch-{batch['task']:05d}-of-{batch['of']:05d}.json"


def batch_label(batch: dict) -> str:
    """The mapped task's label in the UI: ``task 3/64: shards 120-159``."""
    return f"task {batch['task'] + 1}/{batch['of']}: {batch.get('kind', 'shards')} {batch['first']}-{batch['last']}"


def batch_unit(batch: dict) -> str:
    """The batch's name in profiles and logs: ``task-0003-of-0064``."""
    return f"task-{batch['task']:04d}-of-{batch['of']:04d}"


def batch_specs(batch: dict) -> list[dict]:
    """The shard specs of one batch, from its own plan file (never the whole plan)."""
    path = _batch_file(batch)
    if not path.exists():
        raise FileNotFoundError(f"{path}: the batch plan file is missing; rerun the run's plan task")
    return read_json(path)


def write_index(run_dir: str | Path, shards: list[str]) -> None:
    """``plan/shards.json``: every shard name in plan order as runs ``[prefix, first, count, width]`` of numbered
    names (``[name, null, 1, 0]`` for a name without a number)."""
    runs: list[list] = []
    for name in shards:
        m = _NUMBERED.match(name)
        prefix, num, width = (m.group(1), int(m.group(2)), len(m.group(2))) if m else (name, None, 0)
        last = runs[-1] if runs else None
        if (last and num is not None and last[0] == prefix and last[1] is not None and last[3] == width
                and last[1] + last[2] == num):
            last[2] += 1
        else:
            runs.append([prefix, num, 1, width])
    write_json(Path(run_dir) / PLAN_DIR / INDEX, {"shards": len(shards), "runs": runs})


def shard_names(run_dir: str | Path) -> list[str]:
    """Every shard of the run in plan order, from the compact index :func:`write_index` wrote."""
    path = Path(run_dir) / PLAN_DIR / INDEX
    if not path.exists():
        raise FileNotFoundError(f"{path}: the run's shard index is missing; rerun the run's plan task")
    index = read_json(path)
    names = [prefix if first is None else f"{prefix}-{k:0{width}d}"
             for prefix, first, count, width in index["runs"] for k in range(first or 0, (first or 0) + count)]
    if len(names) != index["shards"]:
        raise ValueError(f"{path}: {len(names)} shard names in the runs, the index says {index['shards']}")
    return names


def worker_cores() -> int:
    """Cores this worker may use (its CPU affinity, which containers and cgroup cpusets set)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:       # not Linux
        return os.cpu_count() or 1


def pool_size(configured: int, items: int) -> int:
    """``configured`` processes (0: every core of the worker), never more than there are items."""
    return max(1, min(configured or worker_cores(), items))


def run_batch(fn: Callable[[dict], dict], batch: dict, workers: int = 1,
              expand: Callable[[list[dict]], list[dict]] | None = None, min_pool_bytes: int = 0) -> dict:
    """Run a per-shard stage over the batch's shards in order; with ``workers`` > 1 in a pool of forkserver
    processes (:func:`pipeline.pools.task_executor`: shared within the task; results in shard order).  A batch of
    one shard, or one worker, or less input than ``min_pool_bytes`` (where starting the pool costs more than it
    saves), runs in this process.  ``expand`` turns the batch's plan specs into the specs the
    stage runs over (after ingest: one per output shard, ``pipeline.ingest.output.output_specs``).  Returns counts,
    not the per-shard stats (those are in each shard's marker and ``stats/``)."""
    plan = batch_specs(batch)
    specs = expand(plan) if expand else plan
    if workers > 1 and len(specs) > 1 and sum(s.get("bytes", 0) for s in plan) >= min_pool_bytes:
        pool, owned = task_executor(min(workers, len(specs)), fn.__module__)
        try:
            done = list(pool.map(fn, specs))
        finally:
            if owned:
                pool.shutdown()
    else:
        done = [fn(spec) for spec in specs]
    return _counts(batch, plan, len(done))


def run_whole_batch(fn: Callable[[dict, list[dict]], object], batch: dict,
                    expand: Callable[[list[dict]], list[dict]]) -> dict:
    """Run a stage that makes one output for the whole batch: ``fn(batch, specs)`` in this process (the same
    counts as :func:`run_batch`)."""
    plan = batch_specs(batch)
    specs = expand(plan)
    fn(batch, specs)
    return _counts(batch, plan, len(specs))


def _counts(batch: dict, plan: list[dict], shards: int) -> dict:
    return {"task": batch["task"], "of": batch["of"], "first": batch["first"], "last": batch["last"],
            "shards": shards, "input_bytes": sum(s.get("bytes", 0) for s in plan)}
